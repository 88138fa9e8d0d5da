"""Review 38, the controller's side of reaching a host:

- an IPv6 zone id (`[::1%25lo]`, `[fe80::1%eth0]`) passed the address parser but no transport
  dials one: "cannot resolve the host name", and with declared capacity a host was stored that
  never connected. It is 400 `invalid_argument` now, on every transport's form, before anything
  is stored or dialled;
- a host certificate `fuse host cert issue` makes named 127.0.0.1 and localhost but not ::1, so
  an agent listening on IPv6 loopback only, registered as `[::1]:PORT`, failed "IP address
  mismatch";
- a controller started with HTTP_PROXY / HTTPS_PROXY / ALL_PROXY in its environment sent its
  calls to agents through that proxy (httpx's trust_env): every host "refused ... is the host
  agent running?" while the proxy was down, and the agents' tokens went to it.

Real controllers and agents as processes, real certificates, real sockets."""

from __future__ import annotations

import ipaddress
import socket
import subprocess
import threading
import time

import pytest
from cryptography import x509

from fuse.transport import BadAddress, HostConnection, parse_address

from .conftest import FUSE, free_port, start_agent, start_controller
from .https_host import certificate, https_host

AGENT_TOKEN = "agent-token-review38"
DECLARED = {"vm_count": 4, "cpus": 2, "ram_mb": 2048, "storage_gb": 10}


def wait_connected(http, host_id: str, timeout: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        body = http.get(f"/v1/hosts/{host_id}").json()
        if body.get("connected") or time.monotonic() > deadline:
            return body
        time.sleep(0.2)


# ------------------------------------------------------------------ IPv6 zone ids

ZONED = {
    "http, RFC 6874's %25": "http://[::1%25lo]:{port}",
    "http, a bare %": "http://[::1%lo]:{port}",
    "https, link-local": "https://[fe80::1%eth0]:{port}",
    "mutual TLS": "[::1%lo]:{port}",
    "mutual TLS, link-local": "[fe80::1%25lo]:{port}",
    "ssh": "ssh://root@[::1%lo]:{port}",
    "ssh, link-local": "ssh://root@[fe80::1%eth0]",
}


@pytest.mark.parametrize("form", ZONED.values(), ids=list(ZONED))
def test_an_ipv6_zone_id_is_no_address_on_any_transport(form):
    addr = form.format(port=22201)
    with pytest.raises(BadAddress) as info:
        parse_address(addr)
    err = info.value
    assert (err.code, err.http_status) == ("invalid_argument", 400)
    assert "IPv6 zone ids (%" in err.message and "are not supported" in err.message, err.message
    if "fe80" in addr:  # (without its zone a link-local address reaches nothing: not offered)
        assert "link-local" in err.message and "[fe80" not in err.message.split("not valid:")[1], err.message
    else:
        assert "give the address without one ([::1])" in err.message, err.message


def test_an_ipv6_literal_without_a_zone_still_parses():
    assert parse_address("http://[::1]:22201").host == "::1"
    assert parse_address("[fe80::1]:22201").kind == "tls"


@pytest.fixture(scope="module")
def ctl(processes, tmp_path_factory, pki):
    """A controller with the suite's client identity (so a mutual-TLS address is dialled)."""
    c = start_controller(processes, tmp_path_factory.mktemp("ctl38"))
    cert, key, ca = pki.files(pki.controller, "controller")
    r = c.http().put("/v1/controller", json={"cert": cert, "key": key, "ca": ca, "placement": "best_fit"})
    assert r.status_code == 200, r.text
    yield c
    c.close()


@pytest.fixture(scope="module")
def v6_agent(processes, tmp_path_factory, pki):
    """An agent serving mutual TLS on IPv6 loopback only, with the suite's host certificate
    (issued by `fuse host cert issue --name 127.0.0.1`)."""
    return start_agent(processes, tmp_path_factory.mktemp("v6agent"), backend="fake", port=free_port(),
                       host="::1", tls=pki.files(pki.host, "127.0.0.1"))


@pytest.mark.parametrize("n", range(len(ZONED)), ids=list(ZONED))
def test_a_zone_id_is_refused_by_the_controller_before_anything_is_stored(ctl, v6_agent, n):
    http = ctl.http()
    addr = list(ZONED.values())[n].format(port=v6_agent.port)  # (an agent does listen on [::1] at that port)
    hid = f"zoned-{n}"
    r = http.post("/v1/hosts", json={"id": hid, "url": addr, "token": AGENT_TOKEN, "backend": "qemu",
                                     "capacity": DECLARED})
    # (it was 502 "cannot resolve the host name", or 201 with capacity declared: a host stored
    # that never connects)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_argument" and "IPv6 zone ids (%" in err["message"], err
    assert http.get(f"/v1/hosts/{hid}").status_code == 404


# ------------------------------------------------------------------ ::1 in the certificate

def test_a_host_certificate_names_ipv6_loopback_too(tmp_path):
    ca, out = tmp_path / "ca", tmp_path / "out"
    for args in (["host", "ca", "create", "--out", str(ca)],
                 ["host", "cert", "issue", "--ca", str(ca), "--name", "rack1.example", "--out", str(out)]):
        run = subprocess.run([FUSE, *args], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stdout + run.stderr
    cert = x509.load_pem_x509_certificate((out / "rack1.example.pem").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["rack1.example", "localhost"]
    assert set(san.get_values_for_type(x509.IPAddress)) == {ipaddress.ip_address("127.0.0.1"),
                                                            ipaddress.ip_address("::1")}


def test_an_agent_on_ipv6_loopback_is_reached_at_its_address_over_mutual_tls(ctl, v6_agent):
    http = ctl.http()
    r = http.post("/v1/hosts", json={"id": "v6-mtls", "url": f"[::1]:{v6_agent.port}", "backend": "qemu",
                                     "capacity": {"vm_count": 4}})
    # (it was 502 "... IP address mismatch, certificate is not valid for '::1'")
    assert r.status_code == 201, r.text
    assert r.json()["url"] == f"[::1]:{v6_agent.port}" and r.json()["capacity"]["cpus"] > 0  # probed over it
    assert wait_connected(http, "v6-mtls")["connected"], http.get("/v1/hosts/v6-mtls").text


# ------------------------------------------------------------------ proxies in the controller's environment

class Proxy:
    """A listener standing in for a proxy: it counts the connections made to it and hangs up
    on each (a proxy that is down, or one that would read what is sent to it)."""

    def __init__(self):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


@pytest.fixture(scope="module")
def proxied(processes, tmp_path_factory, pki):
    """A controller started with every proxy variable pointing at `Proxy`, with its client
    identity and an https:// host's CA trusted through SSL_CERT_FILE; an http:// agent with a
    token and a mutual-TLS agent for it to reach."""
    root = tmp_path_factory.mktemp("proxied")
    proxy = Proxy()
    cert = certificate("a certificate from an unknown CA", root / "https")
    at = f"http://127.0.0.1:{proxy.port}"
    env = {"HTTP_PROXY": at, "HTTPS_PROXY": at, "ALL_PROXY": at, "http_proxy": at, "https_proxy": at,
           "all_proxy": at, "NO_PROXY": "", "no_proxy": "", "SSL_CERT_FILE": str(cert.ca)}
    http_agent = start_agent(processes, root / "http", backend="fake", port=free_port(), token=AGENT_TOKEN)
    tls_agent = start_agent(processes, root / "tls", backend="fake", port=free_port(),
                            tls=pki.files(pki.host, "127.0.0.1"))
    c = start_controller(processes, root / "ctl", env=env)
    ident, key, ca = pki.files(pki.controller, "controller")
    r = c.http().put("/v1/controller", json={"cert": ident, "key": key, "ca": ca, "placement": "best_fit"})
    assert r.status_code == 200, r.text
    with https_host(cert) as https_url:
        yield c, proxy, {"http": (f"http://127.0.0.1:{http_agent.port}", AGENT_TOKEN),
                         "mutual TLS": (tls_agent.tls_addr, None), "https": (https_url, None)}
    c.close()
    proxy.close()


@pytest.mark.parametrize("transport", ["http", "mutual TLS", "https"])
def test_a_controller_with_proxies_in_its_environment_reaches_its_hosts_directly(proxied, transport):
    c, proxy, hosts = proxied
    http = c.http()
    url, token = hosts[transport]
    hid = "proxied-" + transport.replace(" ", "-").lower()
    r = http.post("/v1/hosts", json={"id": hid, "url": url, "token": token, "backend": "qemu",
                                     "capacity": {"vm_count": 4}})
    # (it was 502 "connection to http://127.0.0.1:P was refused: is the host agent running?" or
    # "was dropped", the proxy having been dialled in the agent's place)
    assert r.status_code == 201, r.text
    assert r.json()["capacity"]["cpus"] > 0
    if transport != "https":  # (the https:// stand-in answers the probe, not the polls)
        assert wait_connected(http, hid)["connected"], http.get(f"/v1/hosts/{hid}").text
    assert proxy.connections == 0  # nothing, an agent's token least of all, went to the proxy


def test_a_controller_with_proxies_in_its_environment_places_a_vm_on_an_http_host(proxied):
    c, proxy, hosts = proxied
    http = c.http()
    url, token = hosts["http"]
    r = http.post("/v1/hosts", json={"id": "proxied-place", "url": url, "token": token, "backend": "qemu",
                                     "capacity": {"vm_count": 4}})
    assert r.status_code in (200, 201), r.text
    cl = c.client()
    vm = cl.vms.create(shape={"vcpus": 1, "mem_mib": 128}, entry="echo hello", name="vm-proxied",
                       host="proxied-place")
    try:
        assert vm["host"] == "proxied-place"
    finally:
        cl.vms.delete("vm-proxied")
    assert proxy.connections == 0


async def test_a_socks_proxy_in_the_environment_does_not_stop_a_connection_being_made(proxied, monkeypatch):
    # (httpx without socksio raised ImportError making each client: every host's connection)
    _, proxy, hosts = proxied
    url, token = hosts["http"]
    for name in ("ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, f"socks5://127.0.0.1:{proxy.port}")
    conn = HostConnection(url, token)
    try:
        assert (await conn.request("GET", "/v1/host")).status_code == 200
    finally:
        await conn.close()
    assert proxy.connections == 0

"""Review 35, `fuse host ca create` / `fuse host cert issue` and PUT /v1/controller:

- F1: `cert issue` without --force replaced a ca.pem in --out that was another CA's (or
  a link) and exited 0: the certificates beside it no longer verified against it, and the
  host it served refused the controller its own CA had signed.
- F2: a refused `cert issue` / `ca create` had written the new key first: a key that
  matched no certificate was left behind.
- F4: a valid DNS name longer than a common name can be (64) got no certificate, only
  cryptography's words; the CA's `--name ""` the same. Such a host's certificate has no
  CN now (the full name is in the subjectAltName, which is what a TLS peer checks).
- F5: PUT /v1/controller said "no file at PATH" for a FIFO, a directory or /dev/null."""

from __future__ import annotations

import hashlib
import os
import socket
import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from support import FUSE, Proc, _spawn, fake_bundle, free_port, start_controller

LONG = "a" * 60 + ".bbbbbbbbbb.example.com"   # 83 characters: a valid DNS name, past the CN's 64
CLIENT = "c" * 50 + "." + "d" * 20 + ".example"  # 79: the controller's, as long


def fuse_cli(*args) -> tuple[int, str]:
    r = subprocess.run(FUSE + [str(a) for a in args], capture_output=True, text=True, timeout=120)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    return r.returncode, lines[0] if lines else r.stderr


def ok(*args) -> None:
    code, err = fuse_cli(*args)
    assert code == 0, err


def sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def verifies(ca: Path, cert: Path) -> bool:
    return subprocess.run(["openssl", "verify", "-CAfile", str(ca), str(cert)], capture_output=True,
                          timeout=30).returncode == 0


# ------------------------------------------------------------------ F1: the copy of the CA

@pytest.fixture
def two_cas(tmp_path) -> tuple[Path, Path]:
    ok("host", "ca", "create", "--out", tmp_path / "caA")
    ok("host", "ca", "create", "--out", tmp_path / "caB", "--name", "CA B")
    return tmp_path / "caA", tmp_path / "caB"


def test_cert_issue_refuses_another_cas_ca_pem_in_out_and_writes_nothing(tmp_path, two_cas):
    a, b = two_cas
    d = tmp_path / "hostdir"
    ok("host", "cert", "issue", "--ca", a, "--name", "127.0.0.1", "--out", d)
    before = sha(d / "ca.pem")
    code, line = fuse_cli("host", "cert", "issue", "--ca", b, "--name", "other.example", "--out", d)
    assert (code, line) == (1, f"error: io_error: {d / 'ca.pem'} exists and is not a copy of {b / 'ca.pem'}; "
                               "refusing to overwrite it (pass --force to replace)"), (code, line)
    assert sha(d / "ca.pem") == before == sha(a / "ca.pem")
    assert verifies(d / "ca.pem", d / "127.0.0.1.pem")
    # (refused: nothing of the new certificate's either, F2)
    assert sorted(p.name for p in d.iterdir()) == ["127.0.0.1.key", "127.0.0.1.pem", "ca.pem"]
    # The same CA again is no clash: a second host's certificate beside the first.
    ok("host", "cert", "issue", "--ca", a, "--name", "second.example", "--out", d)
    assert sha(d / "ca.pem") == before and verifies(d / "ca.pem", d / "second.example.pem")
    # --force replaces it, as it does the others.
    ok("host", "cert", "issue", "--ca", b, "--name", "other.example", "--out", d, "--force")
    assert sha(d / "ca.pem") == sha(b / "ca.pem") and verifies(d / "ca.pem", d / "other.example.pem")


def test_cert_issue_refuses_a_link_at_ca_pem_without_force(tmp_path, two_cas):
    a, b = two_cas
    d = tmp_path / "hostdir2"
    d.mkdir()
    (d / "ca.pem").symlink_to(a / "ca.pem")
    code, line = fuse_cli("host", "cert", "issue", "--ca", b, "--name", "x.example", "--out", d)
    assert code == 1 and line.startswith(f"error: io_error: {d / 'ca.pem'} exists and is not a copy of"), line
    assert (d / "ca.pem").is_symlink() and os.readlink(d / "ca.pem") == str(a / "ca.pem")
    assert sha(a / "ca.pem") != sha(b / "ca.pem")  # (the link's target untouched)
    assert sorted(p.name for p in d.iterdir()) == ["ca.pem"]
    # a link to the very CA being issued from holds the copy already: used, left as it is
    ok("host", "cert", "issue", "--ca", a, "--name", "y.example", "--out", d)
    assert (d / "ca.pem").is_symlink() and verifies(d / "ca.pem", d / "y.example.pem")


# ------------------------------------------------------------------ F2: refused means nothing written

def test_a_refused_cert_issue_leaves_no_stray_key(tmp_path, two_cas):
    a, _ = two_cas
    d = tmp_path / "d"
    ok("host", "cert", "issue", "--ca", a, "--name", "h.example", "--out", d)
    (d / "h.example.key").unlink()
    code, line = fuse_cli("host", "cert", "issue", "--ca", a, "--name", "h.example", "--out", d)
    assert (code, line) == (1, f"error: io_error: {d / 'h.example.pem'} exists; refusing to overwrite it "
                               "(pass --force to replace)"), (code, line)
    assert not os.path.lexists(d / "h.example.key"), "a refused issue wrote a key matching no certificate"


def test_a_refused_ca_create_leaves_no_stray_key(tmp_path, two_cas):
    a, _ = two_cas
    d = tmp_path / "d"
    ok("host", "cert", "issue", "--ca", a, "--name", "h.example", "--out", d)
    (d / "h.example.pem").unlink()
    (d / "h.example.key").unlink()   # (a host's directory holding only its ca.pem)
    code, line = fuse_cli("host", "ca", "create", "--out", d)
    assert (code, line) == (1, f"error: io_error: {d / 'ca.pem'} exists; refusing to overwrite it "
                               "(pass --force to replace)"), (code, line)
    assert sorted(p.name for p in d.iterdir()) == ["ca.pem"]


# ------------------------------------------------------------------ F4: long names

def _free_port() -> int:
    return free_port()


def _tls_agent(tmp: Path, cert: Path, key: Path, ca: Path) -> tuple[Proc, int]:
    state = tmp / "agent"
    fake_bundle(state)
    port = _free_port()
    args = ["host", "serve", "--listen", f"127.0.0.1:{port}", "--state-dir", str(state), "--backend", "fake",
            "--socket", str(tmp / "agent.sock"), "--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(ca)]
    p = Proc(_spawn(args, tmp / "agent.log"), tmp / "agent.log")
    deadline = time.monotonic() + 30
    while True:
        assert p.popen.poll() is None, p.logs()[-800:]
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return p, port
        assert time.monotonic() < deadline, p.logs()[-800:]
        time.sleep(0.1)


def ctl_http(ctl: Proc) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(uds=str(ctl.socket)), base_url="http://fuse", timeout=60)


def test_a_dns_name_past_64_characters_is_issued_with_the_whole_name_in_the_san_and_no_cn(tmp_path, procs):
    ca = tmp_path / "ca"
    ok("host", "ca", "create", "--out", ca)
    ok("host", "cert", "issue", "--ca", ca, "--name", LONG, "--out", tmp_path / "host")
    ok("host", "cert", "issue", "--ca", ca, "--name", CLIENT, "--client", "--out", tmp_path / "ctl")
    for cert, name in ((tmp_path / "host" / f"{LONG}.pem", LONG),
                       (tmp_path / "ctl" / f"{CLIENT}.pem", CLIENT)):
        c = x509.load_pem_x509_certificate(cert.read_bytes())
        assert name in c.extensions.get_extension_for_class(x509.SubjectAlternativeName).value \
            .get_values_for_type(x509.DNSName)
        # left out, not cut short (a truncated CN would read as another name)
        assert c.subject.get_attributes_for_oid(NameOID.COMMON_NAME) == []
        assert [a.value for a in c.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)] == ["fuse"]
        assert verifies(ca / "ca.pem", cert)
    # A name that fits keeps its CN.
    ok("host", "cert", "issue", "--ca", ca, "--name", "b" * 52 + ".example.com", "--out", tmp_path / "fits")
    c = x509.load_pem_x509_certificate((tmp_path / "fits" / f"{'b' * 52}.example.com.pem").read_bytes())
    assert [a.value for a in c.subject.get_attributes_for_oid(NameOID.COMMON_NAME)] == ["b" * 52 + ".example.com"]

    # The real thing: an agent serving the long-named certificate, the controller presenting the
    # long-named client certificate. The agent accepts the controller and the controller the agent
    # (registered by its IP, which every host certificate names too)...
    host = tmp_path / "host"
    agent, port = _tls_agent(tmp_path, host / f"{LONG}.pem", host / f"{LONG}.key", host / "ca.pem")
    procs.append(agent)
    ctl = start_controller(tmp_path)
    procs.append(ctl)
    cdir, cname = tmp_path / "ctl", CLIENT
    with ctl_http(ctl) as h:
        r = h.put("/v1/controller", json={"cert": str(cdir / f"{cname}.pem"), "key": str(cdir / f"{cname}.key"),
                                          "ca": str(cdir / "ca.pem"), "placement": "best_fit"})
        assert r.status_code == 200, r.text
        r = h.post("/v1/hosts", json={"id": "long", "url": f"127.0.0.1:{port}",
                                      "capacity": {"vm_count": 2}})
        assert r.status_code in (200, 201), r.text
        got = h.get("/v1/hosts/long").json()
        assert (got["state"], got["connected"]) == ("active", True), got
    # ...and the controller's own TLS context, dialling the agent by the long DNS name (no
    # resolver here knows it: the TCP connection goes to 127.0.0.1, the name is checked as
    # a dial by that name checks it), verifies the host's certificate by its SAN; by a name
    # the certificate does not hold, it is refused.
    from fuse.transport import TlsSettings
    tls = TlsSettings(str(cdir / f"{cname}.pem"), str(cdir / f"{cname}.key"), str(cdir / "ca.pem")).context()

    def handshake(server_name: str) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            with tls.wrap_socket(raw, server_hostname=server_name) as s:
                s.sendall(b"GET /v1/host HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                assert s.recv(64).startswith(b"HTTP/1.1 200"), "the agent refused the long-named client certificate"

    handshake(LONG)
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch|doesn't match"):
        handshake("c" + LONG[1:])


def test_the_cas_name_empty_or_past_64_is_refused_naming_the_flag_and_the_limit(tmp_path):
    code, line = fuse_cli("host", "ca", "create", "--out", tmp_path / "ca1", "--name", "")
    assert code == 2 and line.startswith("error: invalid_argument: --name is empty"), (code, line)
    code, line = fuse_cli("host", "ca", "create", "--out", tmp_path / "ca2", "--name", "x" * 65)
    assert (code, line) == (2, "error: invalid_argument: --name is 65 bytes long: the CA's name is its "
                               "certificate's common name, which X.509 bounds at 64 (bytes of UTF-8): give a "
                               "shorter one"), (code, line)
    assert not (tmp_path / "ca1").exists() and not (tmp_path / "ca2").exists()
    ok("host", "ca", "create", "--out", tmp_path / "ca3", "--name", "x" * 64)


# ------------------------------------------------------------------ F5: what a path is

def test_put_controller_says_what_a_path_that_is_no_regular_file_is(tmp_path, procs):
    from fuse.transport.tls import create_ca, issue_cert
    create_ca(tmp_path / "ca")
    f = issue_cert(tmp_path / "ca", "controller", tmp_path / "pki", client=True)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    ctl = start_controller(tmp_path)
    procs.append(ctl)
    body = {"cert": str(f.cert), "key": str(f.key), "ca": str(f.ca), "placement": "best_fit"}
    with ctl_http(ctl) as h:
        for path, what in ((fifo, "a named pipe (FIFO)"), (tmp_path / "pki", "a directory"),
                           ("/dev/null", "a device")):
            r = h.put("/v1/controller", json=body | {"key": str(path)}, timeout=10)
            assert (r.status_code, r.json()["error"]["code"], r.json()["error"]["message"]) == (
                400, "invalid_argument", f"key: {path} is {what}, not a regular file"), r.text
        r = h.put("/v1/controller", json=body | {"ca": str(tmp_path / "nope.pem")})
        assert (r.status_code, r.json()["error"]["message"]) == (400, f"ca: no file at {tmp_path / 'nope.pem'}"), r.text
        assert h.get("/v1/controller").json()["key_set"] is False  # (nothing changed)
        r = h.put("/v1/controller", json=body)
        assert r.status_code == 200 and r.json()["key_set"] is True, r.text

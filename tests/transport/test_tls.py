"""Mutual TLS between the controller and a host, with certificates made by
`fuse host ca create` and `fuse host cert issue`: who gets in, who does not,
and what the controller says when it cannot."""

from __future__ import annotations

import shutil
import ssl
import stat

import httpx
import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

import fuse
from fuse.transport import TlsSettings

from .conftest import free_port, start_agent, start_controller


@pytest.fixture(scope="module")
def agent(pki, processes, tmp_path_factory):
    """An agent serving mutual TLS with a host certificate from CA A,
    accepting only clients CA A signed."""
    return start_agent(processes, tmp_path_factory.mktemp("agent-tls"), port=free_port(),
                       tls=pki.files(pki.host, "127.0.0.1"))


@pytest.fixture(scope="module")
def impostor(pki, processes, tmp_path_factory):
    """An agent whose host certificate CA B signed (it still trusts A's clients)."""
    cert, key, _ = pki.files(pki.other_host, "127.0.0.1")
    return start_agent(processes, tmp_path_factory.mktemp("agent-impostor"), port=free_port(),
                       tls=(cert, key, str(pki.ca / "ca.pem")))


@pytest.fixture(scope="module")
def controller(processes, tmp_path_factory):
    ctl = start_controller(processes, tmp_path_factory.mktemp("ctl-tls"))
    yield ctl
    ctl.close()


def put_identity(ctl, cert_dir, name="controller", ca=None):
    cert, key, ca_default = (str(cert_dir / f"{name}.pem"), str(cert_dir / f"{name}.key"), str(cert_dir / "ca.pem"))
    r = ctl.http().put("/v1/controller", json={"cert": cert, "key": key, "ca": ca or ca_default,
                                               "placement": "best_fit"})
    assert r.status_code == 200, r.text
    return r.json()


def register_error(ctl, host_id, addr) -> fuse.ApiError:
    with pytest.raises(fuse.ApiError) as info:
        ctl.client().hosts.register(fuse.RegisterHostRequest(id=host_id, url=addr,
                                                             capacity=fuse.HostCapacity(vm_count=4)))
    # declared capacity registers around an outage, never around failed trust: the same 502
    full = fuse.HostCapacity(vm_count=4, cpus=2, ram_mb=1024, storage_gb=5)
    with pytest.raises(fuse.ApiError) as declared:
        ctl.client().hosts.register(fuse.RegisterHostRequest(id=host_id, url=addr, capacity=full))
    if "certificate" in info.value.message:
        assert declared.value.status == 502 and "declare capacity" not in declared.value.message
    return info.value


def direct(agent, cert_files=None) -> httpx.Response:
    """Call the agent's listener directly, verifying it against CA A."""
    ctx = ssl.create_default_context(cafile=None)
    ctx.load_verify_locations(str(agent_ca(agent)))
    ctx.check_hostname = False
    if cert_files:
        ctx.load_cert_chain(cert_files[0], cert_files[1])
    with httpx.Client(verify=ctx, timeout=10) as c:
        return c.get(f"https://{agent.tls_addr}/v1/host")


def agent_ca(agent):
    return agent._ca


@pytest.fixture(autouse=True)
def _remember_ca(agent, pki):
    agent._ca = pki.ca / "ca.pem"


# ------------------------------------------------------------------ the commands

def test_the_commands_make_a_ca_and_purpose_bound_certificates_with_private_keys(pki):
    ca = x509.load_pem_x509_certificate((pki.ca / "ca.pem").read_bytes())
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    host = x509.load_pem_x509_certificate((pki.host / "127.0.0.1.pem").read_bytes())
    assert list(host.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.SERVER_AUTH]
    sans = host.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(v) for v in sans.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    assert "localhost" in sans.get_values_for_type(x509.DNSName)
    client = x509.load_pem_x509_certificate((pki.controller / "controller.pem").read_bytes())
    assert list(client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [ExtendedKeyUsageOID.CLIENT_AUTH]
    assert client.issuer == ca.subject
    for key in (pki.ca / "ca.key", pki.host / "127.0.0.1.key", pki.controller / "controller.key"):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key
    assert stat.S_IMODE(pki.ca.stat().st_mode) == 0o700


def test_the_controller_side_context_requires_and_verifies_the_host_certificate(pki):
    ctx = TlsSettings(*pki.files(pki.controller, "controller")).context()
    assert ctx.verify_mode == ssl.CERT_REQUIRED
    assert ctx.check_hostname is True  # a host's certificate must name the address it is dialled at
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert [c["subject"] for c in ctx.get_ca_certs()] == [
        c["subject"] for c in ssl.create_default_context(cafile=str(pki.ca / "ca.pem")).get_ca_certs()]


# ------------------------------------------------------------------ the host's listener

def test_the_host_accepts_a_client_certificate_its_ca_signed(agent, pki):
    r = direct(agent, pki.files(pki.controller, "controller"))
    assert r.status_code == 200
    assert r.json()["cpus"] > 0


@pytest.mark.parametrize("which", ["another CA's client certificate", "an expired client certificate",
                                   "no client certificate", "a host (serverAuth) certificate as client"])
def test_the_host_listener_refuses(agent, pki, which):
    files = {"another CA's client certificate": pki.files(pki.other_controller, "controller"),
             "an expired client certificate": pki.files(pki.expired, "controller"),
             "no client certificate": None,
             "a host (serverAuth) certificate as client": pki.files(pki.host, "127.0.0.1")}[which]
    with pytest.raises((httpx.TransportError, ssl.SSLError)):
        direct(agent, files)


# ------------------------------------------------------------------ through the controller

def test_a_tls_host_cannot_be_added_before_the_controller_has_a_certificate(controller, agent):
    err = register_error(controller, "tls-early", agent.tls_addr)
    assert (err.status, err.code) == (502, "host_unreachable")
    assert "PUT /v1/controller" in err.message
    assert controller.client().hosts.list() == []


def test_register_over_mutual_tls_after_put_controller(controller, agent, pki):
    shown = put_identity(controller, pki.controller)
    assert "key" not in shown and shown["key_set"] is True
    assert controller.http().get("/v1/controller").json() == shown
    host = controller.client().hosts.register(fuse.RegisterHostRequest(
        id="tls-1", url=agent.tls_addr, capacity=fuse.HostCapacity(vm_count=4)))
    assert host.url == agent.tls_addr
    assert host.capacity.cpus > 0 and host.capacity.ram_mb > 0  # probed over mutual TLS
    assert host.agent_id


def test_a_host_certificate_from_another_ca_is_refused_by_the_controller(controller, impostor, pki):
    put_identity(controller, pki.controller)
    err = register_error(controller, "impostor", impostor.tls_addr)
    assert (err.status, err.code) == (502, "host_unreachable")
    assert "TLS" in err.message and "certificate" in err.message
    assert "not signed by the controller's CA" in err.message
    assert "impostor" not in [h.id for h in controller.client().hosts.list()]


@pytest.mark.parametrize("name, ok", [("127.0.0.2", True), ("evil.example", False)],
                         ids=["a certificate naming the address", "another host's certificate"])
def test_a_host_certificate_must_name_the_address_it_is_registered_at(controller, pki, processes, tmp_path, name, ok):
    # any certificate the CA signed was taken for any address: another host's certificate let a
    # machine stand in for it (placed VMs, moved VMs' memory)
    from fuse.transport.tls import issue_cert

    issue_cert(pki.ca, name, tmp_path / "cert")
    cert, key, _ = pki.files(tmp_path / "cert", name)
    at = start_agent(processes, tmp_path / "agent", port=free_port(), host="127.0.0.2",
                     tls=(cert, key, str(pki.ca / "ca.pem")))
    put_identity(controller, pki.controller)
    host_id = f"named-{ok}"
    if ok:
        host = controller.client().hosts.register(fuse.RegisterHostRequest(
            id=host_id, url=at.tls_addr, capacity=fuse.HostCapacity(vm_count=4)))
        assert host.url == "127.0.0.2:" + str(at.port)
        controller.client().hosts.deregister(host_id)
    else:
        err = register_error(controller, host_id, at.tls_addr)
        assert (err.status, err.code) == (502, "host_unreachable") and "127.0.0.2" in err.message, err.message
        assert host_id not in [h.id for h in controller.client().hosts.list()]


@pytest.mark.parametrize("identity", ["another CA's client certificate", "an expired client certificate"])
def test_the_host_refusing_the_controllers_certificate_is_a_clear_502(controller, agent, pki, identity, tmp_path):
    if identity.startswith("another"):
        put_identity(controller, pki.other_controller, ca=str(pki.ca / "ca.pem"))
    else:  # PUT refuses an expired one: this one expired after it was put (its files replaced, as time does)
        shutil.copytree(pki.controller, tmp_path / "ctl")
        put_identity(controller, tmp_path / "ctl")
        for f in ("controller.pem", "controller.key"):
            shutil.copyfile(pki.expired / f, tmp_path / "ctl" / f)
    try:
        err = register_error(controller, "refused", agent.tls_addr)
        assert (err.status, err.code) == (502, "host_unreachable")
        assert "refused the controller's certificate" in err.message, err.message
        assert "refused" not in [h.id for h in controller.client().hosts.list()]
    finally:
        put_identity(controller, pki.controller)


def test_put_controller_rejects_a_partial_or_broken_identity(controller, pki, tmp_path):
    r = controller.http().put("/v1/controller", json={"cert": str(pki.controller / "controller.pem")})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument"
    mismatched = {"cert": str(pki.controller / "controller.pem"), "key": str(pki.other_controller / "controller.key"),
                  "ca": str(pki.ca / "ca.pem")}
    r = controller.http().put("/v1/controller", json=mismatched)
    assert r.status_code == 400
    put_identity(controller, pki.controller)

"""Review 37: a host whose clock is behind the machine that issued the controller's certificate
(by more than the 5 minutes certificates are back-dated) refuses it as not valid yet, with the
same TLS alert as a certificate of another CA. The controller's 502 sent the operator to check
the CA, the expiry and `--client`, all fine; it now says, when the certificate's validity began
(or ends) within the hour, that the host's clock may be behind (or ahead)."""

from __future__ import annotations

import datetime as dt

import pytest

import fuse
from fuse.transport import clock_hint

from .conftest import free_port, start_agent, start_controller


@pytest.fixture(scope="module")
def agent(pki, processes, tmp_path_factory):
    return start_agent(processes, tmp_path_factory.mktemp("agent-tls"), port=free_port(),
                       tls=pki.files(pki.host, "127.0.0.1"))


@pytest.fixture(scope="module")
def controller(processes, tmp_path_factory):
    ctl = start_controller(processes, tmp_path_factory.mktemp("ctl-tls"))
    yield ctl
    ctl.close()


def put_identity(ctl, cert_dir, ca=None):
    r = ctl.http().put("/v1/controller", json={"cert": str(cert_dir / "controller.pem"),
                                               "key": str(cert_dir / "controller.key"),
                                               "ca": ca or str(cert_dir / "ca.pem"), "placement": "best_fit"})
    assert r.status_code == 200, r.text


def test_a_certificate_valid_only_from_minutes_ago_says_the_hosts_clock_may_be_behind(pki, tmp_path):
    path = str(pki.controller / "controller.pem")  # (issued as the session began: back-dated 5 min)
    now = dt.datetime.now(dt.timezone.utc)
    hint = clock_hint(path, now)
    assert hint.startswith("; or the host's clock is behind this machine's: the certificate is valid only from "), hint
    assert " ago here)" in hint, hint
    # an hour and more after its start, and long before its end: nothing to say
    assert clock_hint(path, now + dt.timedelta(hours=2)) == ""
    # near its end: the host's clock may be ahead
    from cryptography import x509

    with open(path, "rb") as f:
        cert_end = x509.load_pem_x509_certificate(f.read()).not_valid_after_utc
    hint = clock_hint(path, cert_end - dt.timedelta(minutes=20))
    assert hint.startswith("; or the host's clock is ahead of this machine's: the certificate expires at "), hint
    assert "(in 20 min 0 s here)" in hint, hint
    assert clock_hint(str(tmp_path / "missing.pem"), now) == ""  # (a file gone since: nothing, no error)


def test_a_refused_fresh_certificate_says_the_clock_may_be_why(controller, agent, pki, tmp_path):
    """The real refusal (another CA's certificate, issued minutes ago): the 502 names the CA,
    the expiry, `--client` and, now, the host's clock."""
    put_identity(controller, pki.other_controller, ca=str(pki.ca / "ca.pem"))
    try:
        with pytest.raises(fuse.ApiError) as info:
            controller.client().hosts.register(fuse.RegisterHostRequest(
                id="refused", url=agent.tls_addr, capacity=fuse.HostCapacity(vm_count=4)))
        err = info.value
        assert (err.status, err.code) == (502, "host_unreachable")
        assert "refused the controller's certificate" in err.message, err.message
        assert "or the host's clock is behind this machine's" in err.message, err.message
    finally:
        put_identity(controller, pki.controller)

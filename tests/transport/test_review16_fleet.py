"""Transports, from a sixteenth review of the fleet controller: each reason says
what happened, never "the relay ended without answering (exit status None)"
for a relay that did not end.

* A frozen SSH host that has the request (its TCP connection open, the shared
  SSH connection dropped when keepalive went unanswered) did not answer within
  the time the request waited, and the reason quotes it.
* A relay command that is not the agent's relay (``cat``) answered with
  something that is not HTTP: not a fuse agent, said so at once.
* A mutual-TLS (or https://) address at an sshd is an SSH server, pointing at
  ssh://USER@HOST:PORT, as an http:// one at an sshd already was.
* ``PUT /v1/controller`` refuses a certificate that is not valid now (every
  mutual-TLS host would refuse it), naming the file and its dates."""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import re
import signal
import time

import pytest
from cryptography import x509

from fuse.errors import HostUnreachable, NotAnAgent
from fuse.transport import HostConnection, IdentityError, TlsSettings, ssh
from support import unreachable
from .test_frozen_ssh import _signal_tree, own_sshd  # noqa: F401  (the fixture: an sshd of this test's own)
from .test_ssh import echo_socket, relay_to, ssh_env  # noqa: F401  (fixtures: an agent stand-in, sshd env)
from .test_tls import controller, put_identity, register_error  # noqa: F401  (the fixture: a controller)


# ------------------------------------------------------------------ a frozen SSH host

async def test_a_frozen_ssh_host_that_has_the_request_did_not_answer_within_the_time_waited(
        sshd, own_sshd, echo_socket, monkeypatch):
    proc, port, known = own_sshd
    for k, v in sshd.env(relay_to(echo_socket)).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FUSE_SSH_KNOWN_HOSTS", str(known))
    # The connection is dropped after 2 s of silence rather than 10: the same path, sooner.
    monkeypatch.setattr(ssh, "KEEPALIVE_S", 1.0)
    conn = HostConnection(f"ssh://root@127.0.0.1:{port}")
    frozen: list[int] = []
    try:
        assert (await conn.request("GET", "/v1/host")).status_code == 200  # leaves a channel for the next request
        _signal_tree(proc.proc.pid, signal.SIGSTOP, frozen)
        started = time.monotonic()
        with pytest.raises(HostUnreachable) as info:  # a create: not sent again on a new channel
            await conn.request("POST", "/echo", content=b"create", timeout=30)
        took = time.monotonic() - started
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await conn.close()
        await ssh.close_all()
    msg = info.value.message
    # (it was "the relay on 127.0.0.1:PORT ended without answering (exit status None)": the relay never ended)
    assert msg.startswith(f"ssh://root@127.0.0.1:{port} did not answer within "), msg
    waited = float(re.search(r"did not answer within ([0-9.]+) s", msg)[1])
    assert abs(waited - took) < 0.5, (waited, took)
    assert "said nothing for 2 s" in msg and "relay" not in msg, msg
    assert took < 5, took


# ------------------------------------------------------------------ a relay that is not the agent's

@pytest.mark.parametrize("relay", ["cat", "echo hello"], ids=["a relay echoing the request", "a relay saying hello"])
async def test_a_relay_that_answers_with_something_other_than_http_is_not_a_fuse_agent(ssh_env, monkeypatch, relay):
    monkeypatch.setenv("FUSE_SSH_RELAY", relay)
    err, took = await unreachable(HostConnection(ssh_env.addr))
    # (it was "the relay on 127.0.0.1:PORT ended without answering (exit status None)", after 4 s of waiting)
    assert isinstance(err, NotAnAgent), err
    assert err.message.startswith(f"the relay command `{relay}` on 127.0.0.1:{ssh_env.port} answered with "
                                  "something that is not HTTP ("), err.message
    assert "so it is not a fuse agent" in err.message and "`fuse host relay`" in err.message, err.message
    assert took < 3, took


# ------------------------------------------------------------------ a TLS address at an sshd

@pytest.mark.parametrize("scheme, listener", [("", "a host agent's mutual-TLS listener"),
                                              ("https://", "a host agent's HTTPS listener")],
                         ids=["a mutual-TLS address", "an https:// address"])
def test_a_tls_address_at_an_sshd_is_an_ssh_server_pointing_at_ssh(controller, pki, sshd, scheme, listener):
    put_identity(controller, pki.controller)
    addr = f"{scheme}127.0.0.1:{sshd.port}"
    err = register_error(controller, f"sshd-{bool(scheme)}", addr)
    # (it was "... does not speak TLS ... (an agent serving plain HTTP is registered as http://HOST:PORT ...)")
    assert (err.status, err.code) == (502, "host_unreachable"), err
    assert err.message == (f"{addr} is an SSH server, not {listener} (a host reached over SSH is registered "
                           "as ssh://USER@HOST:PORT)"), err.message
    assert f"sshd-{bool(scheme)}" not in [h.id for h in controller.client().hosts.list()]


# ------------------------------------------------------------------ the controller's certificate

def test_put_controller_refuses_an_expired_certificate_naming_the_file_and_its_dates(controller, pki):
    put_identity(controller, pki.controller)
    cert, key, _ = pki.files(pki.expired, "controller")
    r = controller.http().put("/v1/controller", json={"cert": cert, "key": key, "ca": str(pki.ca / "ca.pem")})
    # (it was 200, and every mutual-TLS host refused the controller from then on)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    c = x509.load_pem_x509_certificate(open(cert, "rb").read())
    assert err["code"] == "invalid_argument", err
    assert err["message"] == (f"cert: the controller's certificate {cert} has expired: it was valid from "
                              f"{c.not_valid_before_utc:%Y-%m-%d %H:%M:%S} UTC to {c.not_valid_after_utc:%Y-%m-%d %H:%M:%S} "
                              "UTC; issue a new one (fuse host cert issue --client)"), err
    assert controller.http().get("/v1/controller").json()["cert"] == str(pki.controller / "controller.pem")


def test_a_certificate_not_valid_yet_is_refused_naming_its_dates(pki):
    files = TlsSettings(*pki.files(pki.controller, "controller"))
    c = x509.load_pem_x509_certificate(open(files.cert, "rb").read())
    with pytest.raises(IdentityError) as info:
        files.check_dates(now=c.not_valid_before_utc - dt.timedelta(hours=1))
    assert str(info.value) == (f"the controller's certificate {files.cert} is not valid yet: it is valid from "
                               f"{c.not_valid_before_utc:%Y-%m-%d %H:%M:%S} UTC to "
                               f"{c.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC (is this machine's clock right?)")
    files.check_dates()  # valid now


def test_put_controller_refuses_a_hosts_server_certificate_as_the_controllers(controller, pki):
    """Found by a black-box review of issue 7: a host's serverAuth certificate was taken (200)
    and every mutual-TLS host refused the controller from then on."""
    put_identity(controller, pki.controller)
    cert, key, _ = pki.files(pki.host, "127.0.0.1")
    r = controller.http().put("/v1/controller", json={"cert": cert, "key": key, "ca": str(pki.ca / "ca.pem")})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["code"], err["message"]) == ("invalid_argument", (
        f"cert: {cert} is not a client certificate (its purposes: serverAuth), so every mutual-TLS host would "
        "refuse it; issue the controller's with `fuse host cert issue --client`")), err
    assert controller.http().get("/v1/controller").json()["cert"] == str(pki.controller / "controller.pem")


def test_put_controller_refuses_a_ca_file_holding_no_ca(controller, pki):
    """A leaf given as the CA was taken too: no host's certificate verifies against it."""
    put_identity(controller, pki.controller)
    cert, key, _ = pki.files(pki.controller, "controller")
    leaf = pki.host / "127.0.0.1.pem"
    r = controller.http().put("/v1/controller", json={"cert": cert, "key": key, "ca": str(leaf)})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_argument" and err["message"].startswith(
        f"ca: {leaf} holds a certificate that is not a CA's (O=fuse,CN=127.0.0.1)"), err
    assert controller.http().get("/v1/controller").json()["ca"] == str(pki.controller / "ca.pem")

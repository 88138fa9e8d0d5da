"""Twenty-seventh session: the controller's identity files are read as they are now (a
certificate renewed in place was never presented, even after a PUT), and an encrypted key is
refused in a sentence, never prompted for (a controller on a terminal froze at the prompt)."""

from __future__ import annotations

import shutil
import subprocess

import fuse
from cryptography.hazmat.primitives import serialization

from support import wait_until

from .conftest import FUSE, free_port, start_agent, start_controller


def _encrypted_copy(key_path, dest):
    key = serialization.load_pem_private_key(open(key_path, "rb").read(), password=None)
    dest.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.BestAvailableEncryption(b"pw")))
    return dest


def _tls_host(pki, processes, tmp_path):
    """A mutual-TLS agent registered as t1 with a controller whose identity files are a copy
    in ``tmp_path/ident`` (for a test to change in place): (agent, controller, ident, client)."""
    agent = start_agent(processes, tmp_path / "agent", port=free_port(), tls=pki.files(pki.host, "127.0.0.1"))
    ctl = start_controller(processes, tmp_path / "ctl")
    ident = tmp_path / "ident"
    shutil.copytree(pki.controller, ident)
    r = ctl.http().put("/v1/controller", json={"cert": str(ident / "controller.pem"),
                                               "key": str(ident / "controller.key"), "ca": str(ident / "ca.pem")})
    assert r.status_code == 200, r.text
    c = ctl.client()
    c.hosts.register(fuse.RegisterHostRequest(id="t1", url=agent.tls_addr, capacity=fuse.HostCapacity(vm_count=4)))
    return agent, ctl, ident, c


def test_a_certificate_replaced_in_place_is_presented_from_then_on(pki, processes, tmp_path):
    agent, ctl, ident, c = _tls_host(pki, processes, tmp_path)
    try:
        wait_until(lambda: c.hosts.get("t1").connected, timeout=30, what="connected")
        # renewed in place by someone's tooling: here with a certificate the host does not trust,
        # so that the host's refusal shows it is presented
        for f in ("controller.pem", "controller.key"):
            shutil.copyfile(pki.other_controller / f, ident / f)
        wait_until(lambda: not c.hosts.get("t1").connected, timeout=30, what="the new certificate presented")
        events = c.events.list(0, limit=500)["events"]
        said = [e.get("reason", "") for e in events if e["type"] == "host_disconnected" and e["host"] == "t1"]
        assert any("certificate" in why for why in said), said
        for f in ("controller.pem", "controller.key"):  # and the good one back, in place
            shutil.copyfile(pki.controller / f, ident / f)
        wait_until(lambda: c.hosts.get("t1").connected, timeout=30, what="connected again")
    finally:
        ctl.close()
        agent.proc.stop()


def test_an_encrypted_key_is_refused_in_a_sentence_not_prompted_for(pki, processes, tmp_path):
    enc = _encrypted_copy(pki.controller / "controller.key", tmp_path / "enc.key")
    ctl = start_controller(processes, tmp_path / "ctl")
    try:
        r = ctl.http().put("/v1/controller", json={"cert": str(pki.controller / "controller.pem"), "key": str(enc),
                                                   "ca": str(pki.controller / "ca.pem")}, timeout=20)
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_argument"), r.text
        assert "is encrypted (passphrase-protected)" in r.json()["error"]["message"], r.text
        assert ctl.http().get("/v1/healthz", timeout=10).status_code == 200
    finally:
        ctl.close()
    host_enc = _encrypted_copy(pki.host / "127.0.0.1.key", tmp_path / "host-enc.key")
    cert, _, ca = pki.files(pki.host, "127.0.0.1")
    run = subprocess.run([FUSE, "host", "serve", "--state-dir", str(tmp_path / "a"), "--listen",
                          f"127.0.0.1:{free_port()}", "--tls-cert", cert, "--tls-key", str(host_enc), "--tls-ca", ca],
                         capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert run.returncode == 3, (run.returncode, run.stderr[-2000:])
    assert "is encrypted (passphrase-protected)" in run.stderr and "Traceback" not in run.stderr, run.stderr



def test_a_renewal_half_done_keeps_the_connection_made_before(pki, processes, tmp_path):
    """(the diff review: with the new certificate beside the old key, every request to a
    mutual-TLS host failed 502 until the key was copied too)"""
    from fuse.transport.tls import issue_cert
    renewed = tmp_path / "renewed"
    issue_cert(pki.ca, "controller", renewed, client=True)
    agent, ctl, ident, c = _tls_host(pki, processes, tmp_path)
    try:
        shutil.copyfile(renewed / "controller.pem", ident / "controller.pem")  # the key not yet
        for _ in range(5):
            assert c.usage()["unreachable"] == [], "a renewal half done cut the host off"
        shutil.copyfile(renewed / "controller.key", ident / "controller.key")
        wait_until(lambda: c.usage()["unreachable"] == [] and c.hosts.get("t1").connected, timeout=30,
                   what="the renewed identity used")
    finally:
        ctl.close()
        agent.proc.stop()

"""Review 30: an expired CA is refused where it is given (a certificate issued from it, an
agent's --tls-ca, the controller's settings), not found out at the first connection as the
host's certificate "expired"; and a CA's own certificate is no agent's serving certificate."""

from __future__ import annotations

import subprocess

import httpx
import pytest

from fuse.transport.tls import create_ca, issue_cert
from support import FUSE


@pytest.fixture
def expired_ca(tmp_path):
    create_ca(tmp_path / "old", days=-1)
    return tmp_path / "old"


def test_no_certificate_is_issued_from_an_expired_ca(tmp_path, expired_ca):
    with pytest.raises(ValueError, match="has expired"):
        issue_cert(expired_ca, "127.0.0.1", tmp_path / "h")
    r = subprocess.run(FUSE + ["host", "cert", "issue", "--ca", str(expired_ca), "--name", "127.0.0.1",
                               "--out", str(tmp_path / "h2")], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "has expired" in r.stderr, (r.returncode, r.stderr)


def test_a_certificate_issued_ends_no_later_than_its_ca(tmp_path):
    create_ca(tmp_path / "ca", days=10)
    files = issue_cert(tmp_path / "ca", "127.0.0.1", tmp_path / "h", days=400)
    from cryptography import x509
    cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
    ca = x509.load_pem_x509_certificate((tmp_path / "ca" / "ca.pem").read_bytes())
    assert cert.not_valid_after_utc <= ca.not_valid_after_utc


def _serve(tmp_path, cert, key, ca) -> subprocess.CompletedProcess:
    return subprocess.run(FUSE + ["host", "serve", "--backend", "fake", "--state-dir", str(tmp_path / "st"),
                                  "--socket", str(tmp_path / "a.sock"), "--listen", "127.0.0.1:0",
                                  "--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(ca)],
                          capture_output=True, text=True, timeout=60)


def test_an_agent_refuses_an_expired_ca_and_the_cas_own_certificate(tmp_path, expired_ca):
    create_ca(tmp_path / "ca")
    files = issue_cert(tmp_path / "ca", "127.0.0.1", tmp_path / "h")
    r = _serve(tmp_path, files.cert, files.key, expired_ca / "ca.pem")
    assert r.returncode == 3 and "has expired" in r.stderr and "CA" in r.stderr, r.stderr
    r = _serve(tmp_path, tmp_path / "ca" / "ca.pem", tmp_path / "ca" / "ca.key", tmp_path / "ca" / "ca.pem")
    assert r.returncode == 3 and "cannot sign a TLS handshake" in r.stderr, r.stderr  # (it started, and listened)


def test_a_ca_file_with_an_expired_ca_beside_a_valid_one_is_taken(tmp_path, expired_ca):
    """(a CA being replaced: the old one expires while the file holds both)"""
    from fuse.transport import check_ca_file
    create_ca(tmp_path / "ca")
    both = tmp_path / "both.pem"
    both.write_bytes((expired_ca / "ca.pem").read_bytes() + (tmp_path / "ca" / "ca.pem").read_bytes())
    check_ca_file(str(both), "--tls-ca")


def test_the_controller_refuses_an_expired_ca_in_its_settings(tmp_path, expired_ca, controller):
    create_ca(tmp_path / "ca")
    files = issue_cert(tmp_path / "ca", "controller", tmp_path / "c", client=True)
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(controller.socket)), base_url="http://c") as c:
        r = c.put("/v1/controller", json={"cert": str(files.cert), "key": str(files.key),
                                          "ca": str(expired_ca / "ca.pem")}, timeout=30)
    assert r.status_code == 400 and "has expired" in r.json()["error"]["message"], r.text

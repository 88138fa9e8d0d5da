"""An https:// host whose certificate does not verify was reached, and trust
failed: `NotTrusted` naming OpenSSL's reason, as a mutual-TLS host's is, never a
plain outage. Real servers on loopback, real certificates."""

from __future__ import annotations

import pytest

from fuse.errors import HostUnreachable, NotTrusted
from fuse.transport import HostConnection

from .https_host import KINDS, VERIFY_MESSAGE, certificate, https_host


@pytest.mark.parametrize("kind", KINDS)
async def test_a_certificate_that_does_not_verify_is_failed_trust_naming_why(kind, tmp_path, monkeypatch):
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    cert = certificate(kind, tmp_path)
    if kind == "an expired certificate":  # trusted CA: the date alone is what fails
        monkeypatch.setenv("SSL_CERT_FILE", str(cert.ca))
    with https_host(cert) as url:
        conn = HostConnection(url)
        try:
            with pytest.raises(NotTrusted) as info:
                await conn.request("GET", "/v1/host")
        finally:
            await conn.close()
    assert info.value.message.startswith(f"TLS with {url} failed: the host's certificate is not trusted "
                                         f"({VERIFY_MESSAGE[kind]}); "), info.value.message
    assert (info.value.code, info.value.http_status, info.value.maybe_sent) == ("host_unreachable", 502, False)


async def test_the_same_host_is_reached_once_its_ca_is_trusted(tmp_path, monkeypatch):
    cert = certificate("a certificate from an unknown CA", tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert.ca))
    with https_host(cert) as url:
        conn = HostConnection(url)
        try:
            assert (await conn.request("GET", "/v1/host")).json()["cpus"] == 4
        finally:
            await conn.close()


async def test_an_https_host_that_is_not_there_is_still_an_outage(tmp_path):
    from .conftest import free_port
    conn = HostConnection(f"https://127.0.0.1:{free_port()}")
    try:
        with pytest.raises(HostUnreachable) as info:
            await conn.request("GET", "/v1/host")
    finally:
        await conn.close()
    assert not isinstance(info.value, NotTrusted) and "was refused" in info.value.message

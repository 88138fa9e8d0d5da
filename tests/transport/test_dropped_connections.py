"""A connection a host drops (an agent closes a kept-alive one after ~5 s
idle) is not a refused certificate: it is said to be dropped, and an
idempotent read sent again on a new connection gets through."""

from __future__ import annotations

import socket
import ssl
import threading

import pytest

from fuse.errors import HostUnreachable
from fuse.transport import HostConnection, TlsSettings

BODY = b'{"ok": true}'
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)


def read_request(conn: socket.socket) -> bytes:
    """The request head and its Content-Length body, or b"" once the peer is gone."""
    data = b""
    while b"\r\n\r\n" not in data:
        got = conn.recv(65536)
        if not got:
            return b""
        data += got
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        body += conn.recv(65536)
    return head


class Server:
    """A loopback HTTP server whose `answer(n, i)` says whether the i-th
    request on the n-th connection gets 200 (True) or a hang-up (False)."""

    def __init__(self, answer, tls: ssl.SSLContext | None = None):
        self.answer, self.tls = answer, tls
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.requests: list[bytes] = []
        self._conns = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._conns += 1
            threading.Thread(target=self._one, args=(conn, self._conns), daemon=True).start()

    def _one(self, conn: socket.socket, n: int) -> None:
        try:
            if self.tls:
                conn = self.tls.wrap_socket(conn, server_side=True)
            i = 0
            while head := read_request(conn):
                self.requests.append(head)
                i += 1
                if not self.answer(n, i):
                    return  # hang up without a word, as a closing keep-alive connection does
                conn.sendall(OK)
        except (OSError, ssl.SSLError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def first_connection_dropped():
    s = Server(lambda n, i: n > 1)
    yield s
    s.close()


async def test_a_read_that_meets_a_dropped_connection_is_sent_again(first_connection_dropped):
    conn = HostConnection(f"http://127.0.0.1:{first_connection_dropped.port}")
    try:
        r = await conn.request("GET", "/v1/host/vms/v/files/memory", retries=3)
        assert r.status_code == 200 and r.json() == {"ok": True}
        assert len(first_connection_dropped.requests) == 2
    finally:
        await conn.close()


async def test_without_retries_a_dropped_connection_is_said_to_be_dropped(first_connection_dropped):
    conn = HostConnection(f"http://127.0.0.1:{first_connection_dropped.port}")
    try:
        with pytest.raises(HostUnreachable) as info:
            await conn.request("GET", "/v1/host")
        assert "was dropped before the host answered" in info.value.message, info.value.message
    finally:
        await conn.close()


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE"])
async def test_a_call_that_changes_something_is_never_retried(first_connection_dropped, method):
    conn = HostConnection(f"http://127.0.0.1:{first_connection_dropped.port}")
    try:
        with pytest.raises(ValueError, match="never retried"):
            await conn.request(method, "/v1/host/vms", json={}, retries=3)
        with pytest.raises(HostUnreachable):
            await conn.request(method, "/v1/host/vms", json={})
        assert len(first_connection_dropped.requests) == 1
    finally:
        await conn.close()


def tls_server_context(pki) -> ssl.SSLContext:
    """The host side of mutual TLS, as `fuse host serve --tls-*` sets it up."""
    cert, key, ca = pki.files(pki.host, "127.0.0.1")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=ca)
    ctx.load_cert_chain(cert, key)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


async def test_a_tls_connection_dropped_after_it_answered_is_not_a_refused_certificate(pki):
    """The host accepted the controller's certificate and answered on this
    connection; hanging up on the next request is a dropped connection."""
    server = Server(lambda n, i: i == 1, tls=tls_server_context(pki))
    conn = HostConnection(f"127.0.0.1:{server.port}", tls=TlsSettings(*pki.files(pki.controller, "controller")))
    try:
        assert (await conn.request("GET", "/v1/host")).status_code == 200
        with pytest.raises(HostUnreachable) as info:
            await conn.request("GET", "/v1/host")  # the same kept-alive connection, dropped this time
        assert "certificate" not in info.value.message, info.value.message
        assert "was dropped before the host answered" in info.value.message, info.value.message
        # ...and a read sent again on a new connection gets through
        assert (await conn.request("GET", "/v1/host", retries=3)).status_code == 200
    finally:
        await conn.close()
        server.close()


async def test_a_host_refusing_the_certificate_at_the_handshake_is_still_said_so(pki):
    server = Server(lambda n, i: True, tls=tls_server_context(pki))
    cert, key, _ = pki.files(pki.other_controller, "controller")  # another CA's client certificate
    conn = HostConnection(f"127.0.0.1:{server.port}", tls=TlsSettings(cert, key, str(pki.ca / "ca.pem")))
    try:
        with pytest.raises(HostUnreachable) as info:
            await conn.request("GET", "/v1/host")
        assert "refused the controller's certificate" in info.value.message, info.value.message
    finally:
        await conn.close()
        server.close()


async def test_a_host_refusing_an_expired_certificate_is_said_to_refuse_it_for_its_dates(pki):
    """(review 22: the reason listed what a certificate must be, unexpired among them, and
    left the operator to find which: it says so when the controller's has expired)"""
    server = Server(lambda n, i: True, tls=tls_server_context(pki))
    cert, key, _ = pki.files(pki.expired, "controller")
    conn = HostConnection(f"127.0.0.1:{server.port}", tls=TlsSettings(cert, key, str(pki.ca / "ca.pem")))
    try:
        with pytest.raises(HostUnreachable) as info:
            await conn.request("GET", "/v1/host")
        assert "refused the controller's certificate" in info.value.message, info.value.message
        assert f"the controller's certificate {cert} has expired: it was valid from " in info.value.message
    finally:
        await conn.close()
        server.close()


async def test_local_with_no_agent_names_the_socket_it_looked_for(tmp_path, monkeypatch):
    # "local" means the default socket: the one-sentence reason names that path, not the word
    import fuse.transport as transport
    monkeypatch.setattr(transport, "default_agent_socket", lambda: tmp_path / "fuse-host.sock")
    conn = HostConnection("local")
    try:
        with pytest.raises(HostUnreachable) as info:
            await conn.request("GET", "/v1/host")
    finally:
        await conn.close()
    assert f"no host agent socket at {tmp_path / 'fuse-host.sock'}: is the host agent running?" in info.value.message

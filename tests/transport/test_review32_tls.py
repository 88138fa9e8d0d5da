"""Review 32: a mutual-TLS host refusing the controller's certificate is a connection
that never opened (a create may go to another host, and no name is held), named as a
refusal every time: with TLS 1.3 the host checks the certificate after the client's side
of the handshake is done, and the request going out may meet its hang-up as a broken
pipe before the alert is read ("cannot reach 127.0.0.1:PORT: [Errno 32] Broken pipe",
half the time). A host that took the certificate and then hung up is not a refusal: it
may have got the request. And a broken pipe mid-upload reads as the other hang-ups do.
Real agents and real certificates on loopback."""

from __future__ import annotations

import socket
import ssl
import threading

import pytest

from fuse.errors import HostUnreachable, NotTrusted
from fuse.transport import HostConnection, TlsSettings

from .conftest import free_port, start_agent
from .test_dropped_connections import Server, tls_server_context

BIG = b"x" * (4 << 20)  # a body still going out when the host hangs up: the broken pipe


@pytest.fixture(scope="module")
def tls_agent(pki, processes, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agent-tls-32")
    return start_agent(processes, tmp, port=free_port(), tls=pki.files(pki.host, "127.0.0.1"), backend="fake")


def identity(pki, which: str) -> TlsSettings:
    d = pki.expired if which == "an expired certificate" else pki.other_controller
    cert, key, _ = pki.files(d, "controller")
    return TlsSettings(cert, key, str(pki.ca / "ca.pem"))  # (the host's own certificate verifies)


@pytest.mark.parametrize("body", [b"{}", BIG], ids=["a small create", "a create with a large body"])
@pytest.mark.parametrize("which", ["an expired certificate", "another CA's certificate"])
async def test_a_refused_certificate_is_never_sent_and_said_so_every_time(tls_agent, pki, which, body):
    for _ in range(4):  # (the broken pipe came one time in two)
        conn = HostConnection(tls_agent.tls_addr, tls=identity(pki, which))
        try:
            with pytest.raises(NotTrusted) as info:
                await conn.request("POST", "/v1/host/vms", content=body)
        finally:
            await conn.close()
        msg = info.value.message
        assert "the host refused the controller's certificate" in msg, msg
        assert "Errno" not in msg and "Broken pipe" not in msg, msg
        if which == "an expired certificate":
            assert "has expired" in msg, msg
        # the agent's app never saw it: a create may go on to another host
        assert info.value.maybe_sent is False, msg


async def test_a_host_that_took_the_certificate_and_hung_up_may_have_got_the_request(pki):
    """(was: "the host refused the controller's certificate" for any hang-up after a fresh
    handshake; now that a refusal is never sent, a host that got the create and died must
    not read as one: its VM could land there and on the next host too)"""
    # reads the create and hangs up (it died on it); back, it answers the next connection
    server = Server(lambda n, i: n > 1, tls=tls_server_context(pki))
    conn = HostConnection(f"127.0.0.1:{server.port}", tls=TlsSettings(*pki.files(pki.controller, "controller")))
    try:
        with pytest.raises(HostUnreachable) as info:
            await conn.request("POST", "/v1/host/vms", json={"name": "v1"})
    finally:
        await conn.close()
        server.close()
    msg = info.value.message
    assert not isinstance(info.value, NotTrusted) and "certificate" not in msg, msg
    assert "was dropped before the host answered" in msg, msg
    assert info.value.maybe_sent is True


class _DropsMidUpload:
    """An http(s):// server that reads a request's head and a little of its body, then hangs
    up: with a reset (SO_LINGER 0), or closing with the rest unread (what a proxy or agent
    killed mid-copy leaves: the client's next writes meet a reset, then a broken pipe)."""

    def __init__(self, tls: ssl.SSLContext | None, reset: bool = True):
        self.tls, self.reset = tls, reset
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            if self.tls:
                conn = self.tls.wrap_socket(conn, server_side=True)  # (the plain socket is detached into it)
            got = 0
            while got < 256 << 10:
                data = conn.recv(65536)
                if not data:
                    break
                got += len(data)
        except OSError:
            pass
        finally:
            if self.reset:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            conn.close()

    def close(self) -> None:
        self.sock.close()


def _https_server_context(pki) -> ssl.SSLContext:
    cert, key, _ = pki.files(pki.host, "127.0.0.1")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    return ctx


@pytest.mark.parametrize("reset", [True, False], ids=["with a reset", "closing"])
@pytest.mark.parametrize("scheme", ["https", "http"])
async def test_a_host_hanging_up_mid_upload_is_a_dropped_connection_not_an_errno(pki, monkeypatch, scheme, reset):
    # (a move's copy to an https:// target whose proxy was killed: "target host hC: cannot reach
    # https://127.0.0.1:34004: [Errno 32] Broken pipe", where the ssh:// one says "was dropped")
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca / "ca.pem"))
    server = _DropsMidUpload(_https_server_context(pki) if scheme == "https" else None, reset=reset)
    try:
        for _ in range(4):
            conn = HostConnection(f"{scheme}://127.0.0.1:{server.port}")
            try:
                with pytest.raises(HostUnreachable) as info:
                    await conn.request("PUT", "/v1/host/incoming/v1/files/memory", content=BIG * 8)
            finally:
                await conn.close()
            msg = info.value.message
            assert f"the connection to {scheme}://127.0.0.1:{server.port} was dropped before the host answered" \
                in msg, msg
            assert "Errno" not in msg, msg
            assert info.value.maybe_sent is True
    finally:
        server.close()

"""Twenty-ninth session: a mutual-TLS listener closes a connection that sends no request
within FUSE_HTTP_HEAD_TIMEOUT_S of being accepted, the TLS handshake included (review: one
that never finished its handshake was held asyncio's 60 s, whatever the setting said)."""

from __future__ import annotations

import socket
import ssl
import time

from .conftest import free_port, start_agent


def _closed_after(sock: socket.socket, secs: float) -> float | None:
    """Seconds until the peer closed ``sock`` (None: still open after ``secs``)."""
    sock.settimeout(secs)
    t0 = time.monotonic()
    try:
        while True:
            if sock.recv(4096) == b"":
                return time.monotonic() - t0
    except (socket.timeout, TimeoutError):
        return None
    except (ConnectionResetError, ssl.SSLError):
        return time.monotonic() - t0


def test_a_tls_connection_that_sends_nothing_is_closed_on_time_handshake_or_not(pki, processes, tmp_path):
    port = free_port()
    start_agent(processes, tmp_path / "agent", port=port, backend="fake", tls=pki.files(pki.host, "127.0.0.1"),
                env={"FUSE_HTTP_HEAD_TIMEOUT_S": "2"})
    # nothing at all after the TCP connect; the first bytes of a ClientHello and no more
    for first in (b"", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"):
        s = socket.create_connection(("127.0.0.1", port))
        if first:
            s.sendall(first)
        took = _closed_after(s, 15)
        s.close()
        assert took is not None and took < 10, (first, took)  # (asyncio's own limit is 60 s)
    # a handshake done with a good client certificate, then nothing: 2 s from the connect
    ctx = ssl.create_default_context(cafile=pki.files(pki.host, "127.0.0.1")[2])
    cert, key, _ = pki.files(pki.controller, "controller")
    ctx.load_cert_chain(cert, key)
    raw = socket.create_connection(("127.0.0.1", port))
    t0 = time.monotonic()
    s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    took = _closed_after(s, 15)
    total = time.monotonic() - t0
    s.close()
    assert took is not None and 1.0 <= total < 10, (took, total)

"""Whether a host may have got a request that failed: a connection that never opened
(refused, no socket) sent nothing; one that timed out or was dropped after the request
went may have — and a create it got may still land (the controller then tries no
other host: the VM would run in two places)."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from fuse.errors import HostUnreachable
from fuse.transport import HostConnection
from support import free_port


def _server(answer):
    """A loopback TCP server that reads one request and then does ``answer(conn)``."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def run():
        conn, _ = srv.accept()
        conn.recv(65536)
        answer(conn)

    threading.Thread(target=run, daemon=True).start()
    return srv


async def _post(addr: str) -> HostUnreachable:
    c = HostConnection(addr, timeout=2.0)
    try:
        with pytest.raises(HostUnreachable) as info:
            await c.request("POST", "/v1/host/vms", json={"name": "job1"}, timeout=0.5)
    finally:
        await c.close()
    return info.value


def test_a_refused_connection_sent_nothing():
    err = asyncio.run(_post(f"http://127.0.0.1:{free_port()}"))
    assert err.maybe_sent is False and "refused" in err.message


def test_a_missing_socket_sent_nothing(tmp_path):
    err = asyncio.run(_post(f"unix://{tmp_path}/none.sock"))
    assert err.maybe_sent is False


def test_no_answer_in_time_may_have_been_sent():
    hold = []
    srv = _server(hold.append)  # reads the request and never answers
    try:
        err = asyncio.run(_post(f"http://127.0.0.1:{srv.getsockname()[1]}"))
        assert err.maybe_sent is True and "did not answer in time" in err.message
    finally:
        srv.close()


def test_a_connection_dropped_after_the_request_may_have_been_sent():
    srv = _server(lambda conn: conn.close())  # reads the request, hangs up
    try:
        err = asyncio.run(_post(f"http://127.0.0.1:{srv.getsockname()[1]}"))
        assert err.maybe_sent is True
    finally:
        srv.close()

"""Thirty-second session (review: scale): a healthy agent failed creates and deletes with 502
"may still create it". The controller's client kept an idle connection for httpx's default
5 s, the agent's own keep-alive: a request sent on one idle ~5 s met the agent closing it (a
broken pipe on a request the agent never read), which no other host was then asked to take.
The controller (and the SDK and MCP clients, against the controller's own 5 s) use a kept-alive
connection for 2 s at most; a plain host's client no longer builds a TLS context of its own."""

from __future__ import annotations

import asyncio

import fuse
from fuse.client import _core
from fuse.transport import KEEPALIVE_EXPIRY_S, HostConnection, _plain_context
from support import free_port, start_agent, start_controller


class Counting:
    """A TCP proxy on loopback that counts the connections it is asked to open."""

    def __init__(self, port: int):
        self.port, self.accepted = port, 0

    async def __aenter__(self):
        async def pipe(r, w):
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except OSError:
                pass
            finally:
                w.close()

        async def handle(r, w):
            self.accepted += 1
            ur, uw = await asyncio.open_connection("127.0.0.1", self.port)
            await asyncio.gather(pipe(r, uw), pipe(ur, w))

        self.server = await asyncio.start_server(handle, "127.0.0.1", free_port())
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc):
        self.server.close()


def test_the_expiry_is_well_below_the_servers_keep_alive():
    # (uvicorn's timeout_keep_alive, the agent's and the controller's: 5 s)
    assert KEEPALIVE_EXPIRY_S <= 2.5 and _core.LIMITS.keepalive_expiry <= 2.5


async def test_a_host_connection_does_not_use_a_connection_idle_near_the_agents_keep_alive(tmp_path):
    agent = start_agent(tmp_path, backend="fake")
    try:
        async with Counting(int(agent.url.rsplit(":", 1)[1])) as proxy:
            conn = HostConnection(proxy.url, agent.token)
            try:
                assert (await conn.request("GET", "/v1/host")).status_code == 200
                await asyncio.sleep(0.3)
                assert (await conn.request("GET", "/v1/host")).status_code == 200
                assert proxy.accepted == 1  # (kept alive while fresh)
                await asyncio.sleep(KEEPALIVE_EXPIRY_S + 0.5)
                # (was: the same connection, kept 5 s: a POST here near 5 s met the agent closing it)
                r = await conn.request("POST", "/v1/host/vms", json={"shape": "bad"})
                assert r.status_code == 400 and proxy.accepted == 2
            finally:
                await conn.close()
    finally:
        agent.stop()


def test_a_plain_host_client_shares_one_tls_context():
    a, b = HostConnection("http://127.0.0.1:1", "t"), HostConnection("http://127.0.0.1:2", "t")
    assert _plain_context() is _plain_context()
    for c in (a, b):  # (httpx loaded the system's CA file for each one)
        assert c._client._transport._pool._ssl_context is _plain_context()


async def test_the_sdk_does_not_use_a_connection_idle_near_the_controllers_keep_alive(tmp_path):
    ctl = start_controller(tmp_path, listen=True, token="ct")
    try:
        async with Counting(ctl.extra["port"]) as proxy:
            async with fuse.AsyncClient(proxy.url, "ct") as c:
                await c.hosts.list()
                await c.hosts.list()
                assert proxy.accepted == 1
                await asyncio.sleep(KEEPALIVE_EXPIRY_S + 0.5)
                await c.hosts.list()
                assert proxy.accepted == 2  # (was: the one kept 5 s, the controller's own keep-alive)
    finally:
        ctl.stop()

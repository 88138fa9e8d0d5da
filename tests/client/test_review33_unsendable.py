"""Review 33: an id or query too long for a URL raised httpx's own ``InvalidURL`` from the SDK
(neither ``fuse.ApiError`` nor the ``ValueError`` the README promises for what cannot be sent);
the MCP tool and the CLI already said it in one sentence. Both clients raise ValueError now,
before anything is sent, and the client goes on working."""

from __future__ import annotations

import asyncio

import pytest

import fuse


def test_an_id_too_long_for_a_url_is_a_value_error_on_the_sync_client(client):
    for call in (lambda: client.hosts.get("x" * 70000), lambda: client.vms.get("x" * 70000),
                 lambda: client.vms.list(host="x" * 70000)):
        with pytest.raises(ValueError, match="cannot be sent as a URL") as got:
            call()
        assert not isinstance(got.value, fuse.ApiError)
    assert client.hosts.list() == []  # (the client goes on)


def test_an_id_too_long_for_a_url_is_a_value_error_on_the_async_client(controller):
    async def run():
        async with fuse.AsyncClient(controller.url) as c:
            with pytest.raises(ValueError, match="cannot be sent as a URL"):
                await c.hosts.get("x" * 70000)
            assert await c.hosts.list() == []
    asyncio.run(run())

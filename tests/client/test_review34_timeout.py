"""The client's own ``timeout`` (review 34): any value was taken where the client was made,
and then every call with no wait of its own failed with the HTTP library's raw error (sync:
OverflowError for inf or 1e12, ValueError for -1; async: "did not answer in time" from a
controller never asked), sync and async differently. A ValueError where the client is made,
unless it is seconds above 0 and at most a year, None (no limit) or an ``httpx.Timeout``."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import fuse

BAD = [float("inf"), 1e12, -1, 0, float("nan"), "5", True, httpx.Timeout(1e12), (5.0, 60.0, -1, 5.0)]


@pytest.mark.parametrize("timeout", BAD)
def test_a_timeout_no_call_can_use_is_a_value_error_where_the_client_is_made(controller, timeout):
    for make in (fuse.Client, fuse.AsyncClient):
        with pytest.raises(ValueError, match="timeout must be"):
            make(controller.url, timeout=timeout)


def test_every_timeout_it_takes_answers_calls_sync_and_async(controller):
    good = [None, 0.5, 5, 365 * 24 * 3600, httpx.Timeout(10.0), httpx.Timeout(5.0, connect=None),
            (5.0, 60.0, 60.0, 5.0)]  # (the diff review: httpx's tuple form was a ValueError)
    for timeout in good:
        with fuse.Client(controller.url, timeout=timeout) as c:
            assert c.vms.list() == [] and c.health() == {"status": "ok"}

    async def main():
        for timeout in good:
            async with fuse.AsyncClient(controller.url, timeout=timeout) as c:
                assert await c.vms.list() == [] and await c.health() == {"status": "ok"}
    asyncio.run(main())

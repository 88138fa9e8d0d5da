"""`client.events.follow` on both clients, over a mock transport: the sync
client iterates it, the async client `async for`s it with the same
parameters (and `afollow` stays), each resuming from the page cursor."""

from __future__ import annotations

import httpx
import pytest

import fuse


def event(i: int) -> dict:
    """An event as the controller writes it (the SDK takes no other: review 35)."""
    return {"id": i, "time": 1.0 + i, "type": "placed", "host": "h1"}


PAGES = [{"events": [event(1)], "next_cursor": 1, "next": 1},
         {"events": [], "next_cursor": 1, "next": 1},
         {"events": [event(2), event(3)], "next_cursor": 3, "next": 3}]


def controller(asked: list[dict]):
    """A stand-in controller answering PAGES in turn and recording each query."""
    def handle(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/v1/events"
        asked.append(dict(request.url.params))
        return httpx.Response(200, json=PAGES[len(asked) - 1])
    return handle


def test_the_sync_client_follows_the_stream():
    asked: list[dict] = []
    with fuse.Client("http://c", transport=httpx.MockTransport(controller(asked))) as c:
        got = list(c.events.follow(0, wait_s=5, max_events=3))
    assert [e["id"] for e in got] == [1, 2, 3]
    assert [(q["since"], q["wait_s"]) for q in asked] == [("0", "5"), ("1", "5"), ("1", "5")]


def test_the_sync_client_offers_no_async_follow():
    # (review 17) it had the async client's `afollow`, which awaited the sync `list`'s
    # dict and raised TypeError on its first page
    with fuse.Client("http://c", transport=httpx.MockTransport(controller([]))) as c:
        assert not hasattr(c.events, "afollow")


@pytest.mark.parametrize("method", ["follow", "afollow"],
                         ids=["follow is an async iterator on the async client", "afollow stays as its old name"])
async def test_the_async_client_follows_the_stream(method):
    asked: list[dict] = []
    async with fuse.AsyncClient("http://c", transport=httpx.MockTransport(controller(asked))) as c:
        got = [e async for e in getattr(c.events, method)(0, wait_s=5, max_events=3)]
    assert [e["id"] for e in got] == [1, 2, 3]
    assert [(q["since"], q["wait_s"]) for q in asked] == [("0", "5"), ("1", "5"), ("1", "5")]


async def test_the_async_client_follows_with_keywords_and_without_a_limit():
    asked: list[dict] = []
    async with fuse.AsyncClient("http://c", transport=httpx.MockTransport(controller(asked))) as c:
        got = []
        async for e in c.events.follow(since=0, wait_s=1):
            got.append(e["id"])
            if len(got) == 3:
                break
    assert got == [1, 2, 3]

"""Review 31 of `client.events`: a wait_s longer than a socket's timeout takes (1e10) was a
bare OverflowError from `list` and `follow`, and a hung controller was waited on for wait_s +
30 s. The controller waits at most 60 s, so no answer is waited on for longer than that plus
the grace: 90 s for `list`, 70 s for `follow`'s long polls."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

import fuse

PAGE = {"events": [{"id": 1, "time": 1.0, "type": "placed", "host": "h1"}], "next_cursor": 1, "next": 1}


@pytest.fixture
def controller():
    """A stand-in controller on a real loopback socket (the overflow was the socket's) that
    answers every long poll with one event at once."""
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps(PAGE).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("wait_s", [1e10, 1e300], ids=["1e10", "1e300"])
def test_a_wait_longer_than_a_socket_takes_is_asked_for_as_given(controller, wait_s):
    with fuse.Client(controller) as c:
        assert c.events.list(since=0, wait_s=wait_s)["events"] == PAGE["events"]
        assert next(iter(c.events.follow(since=0, wait_s=wait_s))) == PAGE["events"][0]


async def test_the_async_client_too(controller):
    async with fuse.AsyncClient(controller) as c:
        assert (await c.events.list(since=0, wait_s=1e10))["events"] == PAGE["events"]
        async for e in c.events.follow(since=0, wait_s=1e10):
            assert e == PAGE["events"][0]
            break


def _timeouts(call) -> list[tuple[str, float]]:
    """(wait_s asked, read timeout) of each request ``call(client)`` makes."""
    seen: list[tuple[str, float]] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append((request.url.params["wait_s"], request.extensions["timeout"]["read"]))
        return httpx.Response(200, json=PAGE)

    with fuse.Client("http://c", transport=httpx.MockTransport(handle)) as c:
        call(c)
    return seen


@pytest.mark.parametrize("wait_s,timeout", [(1e10, 90), (600, 90), (60, 90), (5, 35), (0, 30)])
def test_list_waits_for_the_answer_at_most_the_controllers_wait_plus_30_s(wait_s, timeout):
    assert _timeouts(lambda c: c.events.list(0, wait_s)) == [(str(wait_s), timeout)]


@pytest.mark.parametrize("wait_s,timeout", [(1e10, 70), (600, 70), (5, 15)])
def test_follow_waits_for_a_long_poll_at_most_the_controllers_wait_plus_the_grace(wait_s, timeout):
    assert _timeouts(lambda c: list(c.events.follow(0, wait_s, max_events=1))) == [(str(wait_s), timeout)]

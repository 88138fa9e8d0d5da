"""GET /v1/events on the real controller app (not started: no pollers): a
page names its cursor `next_cursor`, as every listing does, and keeps `next`
(the same value) for the clients written against it; the SDK follows either."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from starlette.testclient import TestClient

from fuse.client.events import EventsAPI
from fuse.controller.app import create_app
from fuse.controller.service import Controller


@pytest.fixture
def ctl(tmp_path):
    c = Controller(tmp_path / "ctl")
    yield c
    c.store.close()


def page(ctl, **params) -> dict:
    r = TestClient(create_app(ctl)).get("/v1/events", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_page_carries_next_cursor_and_next_with_the_last_id(ctl):
    for i in range(3):
        ctl.store.add_event("host_added", {"id": f"h{i}"}, host=f"h{i}")
    first = page(ctl, since=0, limit=2)
    assert [e["host"] for e in first["events"]] == ["h0", "h1"]
    assert first["next_cursor"] == first["next"] == first["events"][-1]["id"]
    rest = page(ctl, since=first["next_cursor"])
    assert [e["host"] for e in rest["events"]] == ["h2"]


def test_an_empty_page_hands_the_cursor_back(ctl):
    ctl.store.add_event("host_added", {"id": "h0"}, host="h0")
    last = page(ctl)["next_cursor"]
    assert page(ctl, since=last) == {"events": [], "next_cursor": last, "next": last}


@pytest.mark.parametrize("pages", [
    [{"events": [{"id": 1}], "next_cursor": 1, "next": 1}, {"events": [{"id": 2}], "next_cursor": 2, "next": 2}],
    [{"events": [{"id": 1}], "next": 1}, {"events": [{"id": 2}], "next": 2}],
], ids=["a controller answering next_cursor", "a controller answering only next"])
def test_follow_resumes_from_the_page_cursor(pages):
    asked = []

    def send(call):
        asked.append(call.params["since"])
        return pages[len(asked) - 1]

    got = list(EventsAPI(send).follow(0, wait_s=0, max_events=2))
    assert [e["id"] for e in got] == [1, 2] and asked == [0, 1]


# a cursor beyond the newest event (one no page gave): no event is newer, so it waits
# as issue 4 says, and hands back the newest id, so a client resumes from real ids
# instead of missing every event until the ids reach its cursor
@pytest.mark.parametrize("events", [0, 3], ids=["on an empty stream", "past the newest of three events"])
def test_a_cursor_beyond_the_newest_event_waits_then_gets_the_newest_id_back(ctl, events):
    for i in range(events):
        ctl.store.add_event("host_added", {"id": f"h{i}"}, host=f"h{i}")
    newest = ctl.store.last_event_id()
    t0 = time.monotonic()
    got = page(ctl, since=newest + 1000, wait_s=1)
    assert 0.9 < time.monotonic() - t0 < 5  # a long poll: nothing newer came
    assert got == {"events": [], "next_cursor": newest, "next": newest}


def test_a_cursor_beyond_the_newest_event_gets_an_event_that_comes_while_it_waits(ctl):
    ctl.store.add_event("host_added", {"id": "h0"}, host="h0")
    # (2 s: the request reads "the newest" as it starts; on a loaded machine one that took over
    # half a second to start read the event as already there, and waited the whole 10 s)
    threading.Timer(2.0, lambda: ctl.store.add_event("host_added", {"id": "h1"}, host="h1")).start()
    t0 = time.monotonic()
    got = page(ctl, since=10_000, wait_s=10)
    assert 1.9 < time.monotonic() - t0 < 8
    assert [e["host"] for e in got["events"]] == ["h1"] and got["next_cursor"] == got["events"][0]["id"]


def test_resuming_from_the_cursor_handed_back_misses_nothing(ctl):
    ctl.store.add_event("host_added", {"id": "h0"}, host="h0")
    cursor = page(ctl, since=10_000)["next_cursor"]
    ctl.store.add_event("host_added", {"id": "h1"}, host="h1")
    assert [e["host"] for e in page(ctl, since=cursor)["events"]] == ["h1"]

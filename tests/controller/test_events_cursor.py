"""GET /v1/events with a cursor beyond the newest event (one no page gave):
the answer hands back the newest id at once, so a client resumes from real
ids instead of missing every event until the ids reach its cursor."""

from __future__ import annotations

import time

import pytest
from starlette.testclient import TestClient

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


@pytest.mark.parametrize("events", [0, 3], ids=["on an empty stream", "past the newest of three events"])
def test_a_cursor_beyond_the_newest_event_gets_the_newest_id_back_at_once(ctl, events):
    for i in range(events):
        ctl.store.add_event("host_added", {"id": f"h{i}"}, host=f"h{i}")
    newest = ctl.store.last_event_id()
    t0 = time.monotonic()
    got = page(ctl, since=newest + 1000, wait_s=5)
    assert time.monotonic() - t0 < 2  # no long poll for ids that do not exist yet
    assert got == {"events": [], "next_cursor": newest, "next": newest}


def test_resuming_from_the_cursor_handed_back_misses_nothing(ctl):
    ctl.store.add_event("host_added", {"id": "h0"}, host="h0")
    cursor = page(ctl, since=10_000)["next_cursor"]
    ctl.store.add_event("host_added", {"id": "h1"}, host="h1")
    assert [e["host"] for e in page(ctl, since=cursor)["events"]] == ["h1"]

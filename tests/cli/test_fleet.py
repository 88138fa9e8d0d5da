"""`fuse controller usage` and `events` over a stand-in client (no
controller): what they print and ask from the answers' shapes."""

from __future__ import annotations

import contextlib

import pytest

from fuse.cli import fleet
from fuse.client.events import EventsAPI

REPORT = {"from": 0.0, "to": 1761958800.0, "vms": [], "hosts": ["h1", "h2"], "aliases": {},
          "totals": {"cpu_seconds": 0.0, "mem_mib_seconds": 0.0, "wall_seconds": 0.0, "state_bytes_written": 0},
          "unreachable": ["h2"], "unreachable_reasons": {"h2": "connection refused"}}


class OutOfPages(Exception):
    pass


class StandIn:
    """`client.usage` answers REPORT; `client.events.list` answers `pages` in
    turn, then raises OutOfPages (which ends a follow)."""

    def __init__(self, pages=()):
        self.pages, self.asked = list(pages), []
        self.events = self

    def usage(self, from_, to):
        return REPORT

    def list(self, since, wait_s, limit=100, timeout=None):
        self.asked.append(since)
        if not self.pages:
            raise OutOfPages
        return self.pages.pop(0)


    def follow(self, since, wait_s, reconnect_s):  # the SDK's own follow, over these pages
        return EventsAPI.follow(self, since, wait_s, reconnect_s=reconnect_s)


def stand_in(monkeypatch, client):
    monkeypatch.setattr(fleet, "_client", lambda: contextlib.nullcontext(client))


def test_usage_prints_each_unreachable_host_with_its_reason(monkeypatch, capsys):
    stand_in(monkeypatch, StandIn())
    fleet.usage(from_=None, to=None, json_=False)
    assert "unreachable: h2: connection refused" in capsys.readouterr().out


def test_events_follow_from_next_cursor(monkeypatch, capsys):
    client = StandIn([{"events": [{"id": 7, "time": 0.0, "type": "placed", "host": "h1", "vm": "a"}],
                       "next_cursor": 7}])
    stand_in(monkeypatch, client)
    with pytest.raises(OutOfPages):
        fleet.events(since=0, follow=True, json_=True, wait_s=0, reconnect_s=fleet.RECONNECT_S)
    assert '"vm": "a"' in capsys.readouterr().out and client.asked == [0, 7]


def test_events_without_follow_prints_every_stored_event_page_by_page(monkeypatch, capsys):
    # it had printed the first page (500) and exited 0, saying nothing of the rest
    ev = [{"id": i, "time": 0.0, "type": "placed", "host": "h1", "vm": f"v{i}"} for i in range(1, 504)]
    client = StandIn([{"events": ev[:500], "next_cursor": 500}, {"events": ev[500:], "next_cursor": 503}])
    stand_in(monkeypatch, client)
    fleet.events(since=0, follow=False, json_=True, wait_s=30, reconnect_s=fleet.RECONNECT_S)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 503 and '"v503"' in lines[-1] and client.asked == [0, 500]


def test_events_refuses_a_wait_that_is_no_number_of_seconds(monkeypatch):
    import typer

    stand_in(monkeypatch, StandIn())
    with pytest.raises(typer.BadParameter):
        fleet.events(since=0, follow=False, json_=True, wait_s=float("nan"))

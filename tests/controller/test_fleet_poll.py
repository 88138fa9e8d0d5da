"""How the host poller reads a host's events (seed 004: "events up to 500 per
poll", "its events with backoff"): one read of at most 500 a poll, none while
the summary's last_event_id says nothing is new, and for an agent whose summary
does not say, reads that back off while they come back empty. The agent side
is a stand-in here; every end-to-end test reads real agents' events this way."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from fuse.controller.fleet import EVENT_BACKOFF_MAX, EVENT_BATCH, Fleet
from fuse.controller.service import Controller


class Agent:
    """The events route of a host agent holding ``n`` events."""

    def __init__(self, n: int):
        self.events = [{"id": i, "time": 1.0 + i, "type": "tick", "n": i} for i in range(1, n + 1)]
        self.reads: list[dict] = []

    async def request(self, method: str, path: str, params=None, **kw) -> httpx.Response:
        assert (method, path) == ("GET", "/v1/host/events")
        self.reads.append(dict(params))
        since, limit = int(params["since"]), int(params["limit"])
        return httpx.Response(200, json={"events": [e for e in self.events if e["id"] > since][:limit]})

    def summary(self) -> dict:
        return {"last_event_id": self.events[-1]["id"] if self.events else 0}


@pytest.fixture
def fleet(tmp_path):
    ctl = Controller(tmp_path / "ctl")
    yield Fleet(ctl)
    ctl.store.close()


def stored(fleet) -> list[int]:
    return [e["data"]["n"] for e in fleet.store.events_after(0, limit=10_000) if e["type"] == "tick"]


def test_a_backlog_is_read_500_a_poll_and_nothing_is_asked_once_caught_up(fleet):
    agent = Agent(1200)
    pull = lambda: asyncio.run(fleet._pull_events("h1", agent, "agent-1", agent.summary()))  # noqa: E731
    for want in (500, 1000, 1200):
        pull()
        assert stored(fleet) == list(range(1, want + 1))
    # (and one read of the event at the cursor, once: the log checked against the store, as
    # each time the agent answers again)
    assert [r["limit"] for r in agent.reads] == [EVENT_BATCH, 1, EVENT_BATCH, EVENT_BATCH] and EVENT_BATCH == 500
    pull()
    pull()
    assert len(agent.reads) == 4  # the summary says nothing is new: no read
    agent.events.append({"id": 1201, "time": 2000.0, "type": "tick", "n": 1201})
    pull()
    assert len(agent.reads) == 5 and stored(fleet)[-1] == 1201


def test_an_agent_that_does_not_report_its_last_event_is_read_with_backoff(fleet, monkeypatch):
    agent = Agent(0)
    now = [100.0]
    monkeypatch.setattr("fuse.controller.fleet.time.monotonic", lambda: now[0])

    def poll_for(seconds: float) -> int:
        """Poll once a second for ``seconds``: how many event reads were made."""
        before = len(agent.reads)
        for _ in range(int(seconds)):
            asyncio.run(fleet._pull_events("h1", agent, "agent-1", {}))
            now[0] += 1.0
        return len(agent.reads) - before

    assert poll_for(1) == 1
    # empty answers: waits of 1, 2, 4, 8, 8 ... s between reads, never more than EVENT_BACKOFF_MAX
    assert poll_for(60) < 12 and EVENT_BACKOFF_MAX == 8.0
    agent.events.append({"id": 1, "time": 1.0, "type": "tick", "n": 1})
    poll_for(EVENT_BACKOFF_MAX + 1)
    assert stored(fleet) == [1]  # seen within the longest wait
    # news resets the wait: after a read that found some, the next poll reads again
    agent.events.append({"id": 2, "time": 2.0, "type": "tick", "n": 2})
    for _ in range(int(EVENT_BACKOFF_MAX) + 1):
        poll_for(1)
        if stored(fleet) == [1, 2]:
            break
    assert stored(fleet) == [1, 2]
    reads = len(agent.reads)
    poll_for(1)
    assert len(agent.reads) == reads + 1


def test_the_poller_of_a_host_that_is_gone_ends_by_itself(fleet):
    # deregistered while its cancel was lost: it must not poll (and log) a missing host forever
    asyncio.run(asyncio.wait_for(fleet._poll("ghost"), timeout=5))

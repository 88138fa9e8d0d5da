"""The agent's event log, from review 31 (finding 3): a line damaged on disk (garbage in
place of an event's line) loses that event's id, and the next start says so with an
`events_lost` naming the ids and why, wherever the line stood: in the middle (said before,
but as a full disk's), first (said nowhere), every line (said nowhere), or as JSON that is
no event (the agent did not start). A torn last line stays the tail case it was."""

from __future__ import annotations

import json

import httpx
import pytest

from fuse.agent.events import EventLog
from support import start_agent

DAMAGED = "damaged on disk"


def written(tmp_path, n: int = 10) -> EventLog:
    log = EventLog(tmp_path / "events.jsonl")
    for i in range(n):
        log.emit("vm_state", vm=f"v{i + 1}")
    log.close()
    return log


def damage(tmp_path, *line_numbers: int, with_: bytes = b"\x00\x00garbage{{{") -> None:
    path = tmp_path / "events.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    for n in line_numbers:
        lines[n - 1] = with_ + b"\n"
    path.write_bytes(b"".join(lines))


def lost(log: EventLog) -> list[tuple]:
    return [(e["id"], e.get("lost_from"), e.get("lost_to"), e["reason"]) for e in log.list(0, 500)
            if e["type"] == "events_lost"]


def test_a_damaged_line_in_the_middle_of_a_real_agents_log_is_said_as_damaged(tmp_path):
    agent = start_agent(tmp_path, backend="fake", name="a1")
    auth = {"Authorization": f"Bearer {agent.token}"}
    for i in range(4):  # (two events each: creating, running)
        r = httpx.post(agent.url + "/v1/host/vms", headers=auth, timeout=30, json={
            "name": f"v{i}", "shape": {"vcpus": 1, "mem_mib": 128}, "entry": "sleep 1000"})
        assert r.status_code == 201, r.text
    agent.stop()
    state = tmp_path / "a1"
    top = max(json.loads(line)["id"] for line in (state / "events.jsonl").read_text().splitlines())
    damage(state, 6)
    agent = start_agent(tmp_path, backend="fake", name="a1")
    try:
        events = httpx.get(agent.url + "/v1/host/events", params={"since": 0, "limit": 500}, headers=auth,
                           timeout=10).json()["events"]
    finally:
        agent.stop()
    ids = [e["id"] for e in events]
    assert 6 not in ids and 5 in ids and 7 in ids
    said = [e for e in events if e["type"] == "events_lost"]
    assert len(said) == 1 and said[0]["id"] > top, said
    assert (said[0]["lost_from"], said[0]["lost_to"]) == (6, 6)
    # (was: "(a full disk, with an agent before this one)", which sends one looking at the wrong thing)
    assert DAMAGED in said[0]["reason"], said[0]


@pytest.mark.parametrize("lines, where, ids", [
    ((1,), "first", (1, 1)),
    ((1, 2, 3), "first three", (1, 3)),
    ((4, 5), "two in the middle", (4, 5)),
], ids=["the first line damaged loses id 1", "the first three lines damaged lose ids 1 to 3",
        "two lines in a row damaged lose both ids"])
def test_damaged_lines_are_said_with_their_ids(tmp_path, lines, where, ids):
    written(tmp_path)
    damage(tmp_path, *lines)
    log = EventLog(tmp_path / "events.jsonl")
    # (was: nothing said of the first lines; the middle ones as a full disk's)
    assert [(f, t) for _, f, t, _ in lost(log)] == [ids], (where, lost(log))
    assert DAMAGED in lost(log)[0][3]
    assert log.last_id == 11
    log.close()
    again = EventLog(tmp_path / "events.jsonl")  # (said once: the log keeps what it said)
    assert len(lost(again)) == 1 and again.last_id == 11
    again.close()


def test_a_log_whose_every_line_is_damaged_says_their_ids_are_lost(tmp_path):
    written(tmp_path, 3)
    damage(tmp_path, 1, 2, 3)
    log = EventLog(tmp_path / "events.jsonl")
    # (was: ids went on from 4 without a word: a controller that had not read 1-3 never learnt of them)
    assert [(i, f, t) for i, f, t, _ in lost(log)] == [(4, 1, 3)]
    log.close()


@pytest.mark.parametrize("garbage", [b"123", b'{"x": 1}', b'{"id": "6"}', b"[6]", b'{"id": true}'],
                         ids=["a number", "an object without an id", "an id that is text", "a list",
                              "an id that is true"])
def test_a_line_damaged_into_json_that_is_no_event_is_a_damaged_line(tmp_path, garbage):
    written(tmp_path)
    damage(tmp_path, 6, with_=garbage)
    # (was: TypeError or KeyError: the agent did not start)
    log = EventLog(tmp_path / "events.jsonl")
    assert [(f, t) for _, f, t, _ in lost(log)] == [(6, 6)]
    assert [e["id"] for e in log._from_disk(0, 500)][:7] == [1, 2, 3, 4, 5, 7, 8]  # (a read from disk skips it)
    log.close()


def test_a_torn_last_line_is_still_the_tail_case(tmp_path):
    written(tmp_path)
    path = tmp_path / "events.jsonl"
    path.write_bytes(path.read_bytes()[:-20])  # (a power loss cut the last line)
    log = EventLog(tmp_path / "events.jsonl")
    assert [(i, f) for i, f, _, _ in lost(log)] == [(10, None)]  # (id 10 comes back as events_lost, as before)
    log.close()

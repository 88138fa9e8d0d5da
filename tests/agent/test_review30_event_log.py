"""Review 30: the event log on a disk that fills and frees again. Lines the disk refused are
written with the next event once it has room (the file kept a hole in its ids, and after a
restart every read past it skipped the hole's width: a controller never got those events);
a log an older agent left with a hole is read by id and says what it lost; a new state dir
on a full disk refuses a create as host_full, not 500 (the next id's write failed)."""

from __future__ import annotations

import json

from fuse.agent.events import EventLog
from test_review22_agent import fill, tmpfs, unfill


def test_events_the_full_disk_refused_are_written_once_it_has_room_and_read_after_a_restart(tmp_path):
    with tmpfs(tmp_path / "disk", "2m") as disk:
        log = EventLog(disk / "events.jsonl")
        for i in range(5):
            log.emit("vm_state", vm=f"a{i}")
        fill(disk)
        for i in range(100):
            log.emit("vm_state", vm=f"b{i}")  # (the disk takes those that fit its last page, no more)
        assert log._unwritten, "the disk refused some"
        unfill(disk)
        for i in range(5):
            log.emit("vm_state", vm=f"c{i}")
        ids = [json.loads(line)["id"] for line in (disk / "events.jsonl").read_text().splitlines()]
        assert ids == list(range(1, 111)), ids
        log.close()
        again = EventLog(disk / "events.jsonl")  # (the agent restarted)
        got = [e["id"] for e in again.list(since=10, limit=500)]
        assert got == list(range(11, 111)), got  # (was: the hole's width skipped on every read)
        assert [e["vm"] for e in again.list(since=100, limit=3)] == ["b95", "b96", "b97"]


def test_a_log_with_a_hole_an_older_agent_left_is_read_by_id_and_says_what_it_lost(tmp_path):
    path = tmp_path / "events.jsonl"
    lines = [{"id": i, "time": 1.0, "type": "vm_state", "vm": f"v{i}"} for i in (*range(1, 6), *range(20, 25))]
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    (tmp_path / "events.jsonl.next").write_text(f"{25:020d}\n")
    log = EventLog(path)
    assert [e["id"] for e in log.list(since=5, limit=3)] == [20, 21, 22]  # (was: 25, 26... past the end)
    lost = [e for e in log.list(since=24, limit=10) if e["type"] == "events_lost"]
    assert [(e["lost_from"], e["lost_to"]) for e in lost] == [(6, 19)], lost
    log.close()
    again = EventLog(path)  # (restarted: said once, not at every start)
    assert again.last_id == log.last_id and again.list(since=log.last_id) == []


def test_a_new_event_log_on_a_full_disk_still_serves_its_events(tmp_path):
    with tmpfs(tmp_path / "disk", "1m") as disk:
        fill(disk)
        log = EventLog(disk / "events.jsonl")
        event = log.emit("admission_refused", vm="x", reason="no room")  # (was: OSError, a create's 500)
        assert log.list(since=0) == [event]
        unfill(disk)

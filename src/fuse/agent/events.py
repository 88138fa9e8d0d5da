"""The host's event log: every VM transition and host action, with
increasing ids, persisted as JSON lines so ids keep increasing across agent
restarts and a controller can resume with ``since``.

An id is never given twice, even when the log loses its tail: the next id is
also kept in ``events.jsonl.next`` (written before each line), so a log
rotated away, deleted or restored from an older copy starts at the next id,
not at 1, and ids a crash tore out of the log (a power loss cutting its last
line) come back as ``events_lost`` events: a controller that already read
them keeps what it read, and one that did not learns they are gone. (A
controller keys host events by their id: a reused id would never reach it.)
Ids lost before the last line are said at the next start by one new
``events_lost`` with ``lost_from`` and ``lost_to``, once (the log keeps it):
a line damaged on disk (garbage in its place, even JSON that is no event)
loses the ids between the events around it (one id a line before the first),
and a hole between two ids with no damaged line there is an older agent's full
disk's.

A page (``GET /v1/host/events``) is ``{"events": [...], "next": id,
"last_id": id}``; pass ``next`` as the next ``since``. As in the
controller's merged stream (``fuse.controller.events``), a ``since`` beyond
the newest id (one no page gave: another agent's log, or made up) is read as
the newest: the poll waits as any other for events after it, and the cursor
handed back is a real one.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument
from ..paths import private_dir, private_opener

MAX_LIMIT = 500
MAX_WAIT_S = 60.0  # a long poll's wait, at most (a longer one is cut to this, a negative one is none)
# The in-memory window; older events are served from the file on disk (a controller
# that was away while more than this many happened, or an agent restarted since,
# reads them from there), found through a byte offset kept every BLOCK ids.
KEEP = 20_000
BLOCK = 1_000
UNWRITTEN_MAX = 5_000  # lines kept for a disk that has no room, at most (each event tries them all)
LOST_MAX = 100_000  # ids a log may have lost and get back as events_lost (more: .next is not believed)

log = logging.getLogger("fuse.agent")


class EventLog:
    """Append-only events ``{id, time, type, vm?, ...}``; ``list(since)``
    returns those with a larger id."""

    def __init__(self, path: Path):
        self.path = path
        self._events: list[dict[str, Any]] = []
        self._next = 1
        private_dir(path.parent)
        self._next_file = os.open(path.with_name(path.name + ".next"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            kept_next = int(os.pread(self._next_file, 32, 0).split()[0])
        except (ValueError, IndexError):  # none yet (a new state dir, an older agent's)
            kept_next = 1
        self._marks: list[tuple[int, int]] = []  # (id, byte offset of its line), every BLOCK ids
        self._size = 0  # bytes in the file
        # Python >= 3.10 events bind to a loop only when awaited.
        self._changed = asyncio.Event()
        self._stopping = False
        self._unwritten: list[tuple[int, bytes]] = []  # lines the disk did not take yet, oldest first
        # ids missing between two lines: (first, last, whether damaged lines stood there) (an
        # older agent's full disk; a line damaged on disk, whose id is read from no line)
        holes: list[tuple[int, int, bool]] = []
        said: set[tuple[int, int]] = set()  # holes an events_lost in the log already names
        damaged = 0  # lines since the last event read that are none (torn, or damaged on disk)
        if path.exists():
            with open(path, "rb") as f:
                for line in f:
                    event = _parse(line)
                    if event is None:
                        damaged += line.strip() != b""
                    else:
                        # (damaged lines before the first event: one id each, as a line holds one)
                        last = self._events[-1]["id"] if self._events else max(0, event["id"] - 1 - damaged)
                        if event["id"] > last + 1:
                            holes.append((last + 1, event["id"] - 1, damaged > 0))
                        if event.get("type") == "events_lost" and "lost_from" in event:
                            said.add((event["lost_from"], event.get("lost_to")))
                        self._mark(event["id"])
                        self._events.append(event)
                        damaged = 0
                    self._size += len(line)
            if self._events:
                self._next = self._events[-1]["id"] + 1
            self._events = self._events[-KEEP:]
        self._file = open(path, "ab", buffering=0, opener=private_opener)  # 0600 whatever the umask
        if self._size and not _ends_line(path):
            self._file.write(b"\n")  # (after a torn last line: the next event starts a line of its own)
            self._size += 1
        if not self._events:
            self._next = max(self._next, kept_next)  # (the log is new, or lost: go on from its ids)
            if damaged and kept_next > 1:  # (every line damaged: those ids are lost, not a log never written)
                holes.append((max(1, kept_next - damaged), kept_next - 1, True))
        elif kept_next - self._next <= LOST_MAX:  # (the ids stay dense: each lost one is given back)
            for _ in range(self._next, kept_next):
                self.emit("events_lost", reason="the event log lost this id's line (torn by a crash, a full "
                                                "disk, or the log restored from an older copy)")
        for lo, hi, by_damage in holes:  # (their ids are past: said once each, with the ids, as new
            if (lo, hi) in said:  # events; not again at each restart: the log keeps what it said)
                continue
            why = ("damaged on disk: no event could be read from them" if by_damage else
                   "a full disk, with an agent before this one")
            self.emit("events_lost", reason=f"the event log lost the lines of ids {lo} to {hi} ({why})",
                      lost_from=lo, lost_to=hi)

    def _mark(self, event_id: int) -> None:
        if event_id % BLOCK == 0 or not self._marks:
            self._marks.append((event_id, self._size))

    @property
    def last_id(self) -> int:
        return self._next - 1

    def emit(self, type: str, vm: str | None = None, **data: Any) -> dict[str, Any]:
        """Record an event now and wake long-pollers."""
        event = {"id": self._next, "time": round(time.time(), 6), "type": type}
        if vm is not None:
            event["vm"] = vm
        event.update(data)
        self._next += 1
        try:  # before the line: never reused (the same 21 bytes rewritten: no new block on a full disk)
            os.pwrite(self._next_file, f"{self._next:020d}\n".encode(), 0)
        except OSError as exc:  # (a new state dir on a full disk: the event is still served)
            log.warning("event log %s: cannot keep the next id (%s)", self.path, exc)
        self._events.append(event)
        if len(self._events) > 2 * KEEP:
            del self._events[:-KEEP]
        self._unwritten.append((event["id"], (json.dumps(event, separators=(",", ":")) + "\n").encode()))
        if len(self._unwritten) > UNWRITTEN_MAX:  # (a disk full for long: the oldest become a hole in
            del self._unwritten[0]  # the file, read by id and said at the next start as events_lost)
        self._write_unwritten()
        self._changed.set()
        self._changed = asyncio.Event()
        return event

    def _write_unwritten(self) -> None:
        """Append the lines not on disk yet, oldest first: the file keeps its ids dense (lines
        the disk refused are written with the next event once it has room, not skipped — a
        hole in the file shifted every later read past it), and whole lines only."""
        data = b"".join(line for _, line in self._unwritten)
        try:
            if self._file.write(data) != len(data):  # (unbuffered: a full disk takes part of it)
                raise OSError(f"wrote part of the lines of events {self._unwritten[0][0]}-{self._unwritten[-1][0]}")
        except OSError as exc:
            # Served from memory all the same (their ids stay taken: .next was written); the
            # log keeps whole lines only, so the next line does not land on a torn one.
            with contextlib.suppress(OSError):
                os.ftruncate(self._file.fileno(), self._size)
            if len(self._unwritten) == 1:
                log.warning("event log %s: cannot write event %d (%s); events are served from "
                            "memory until it can", self.path, self._unwritten[0][0], exc)
            return
        for event_id, line in self._unwritten:
            self._mark(event_id)
            self._size += len(line)
        self._unwritten.clear()

    def list(self, since: int = 0, limit: int = 100) -> list[dict[str, Any]]:
        """Events with ``id > since``, oldest first, at most ``limit`` (≤ 500)."""
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT}")
        if since < 0:
            raise InvalidArgument("since must be >= 0")
        first = self._events[0]["id"] if self._events else self._next
        if since + 1 < first:
            return self._from_disk(since, limit)
        # (by search, not by offset: a log an older agent wrote may have a hole in its ids)
        start = bisect.bisect_right(self._events, since, key=lambda e: e["id"])
        return self._events[start:start + limit]

    def _from_disk(self, since: int, limit: int) -> list[dict[str, Any]]:
        """Events older than the in-memory window, read from the file: from the last mark
        at or before ``since + 1``, at most ``limit``."""
        at = 0
        for event_id, offset in self._marks:
            if event_id > since + 1:
                break
            at = offset
        out: list[dict[str, Any]] = []
        with open(self.path, "rb") as f:
            f.seek(at)
            for line in f:
                if (event := _parse(line)) is None:
                    continue
                if event["id"] > since:
                    out.append(event)
                    if len(out) == limit:
                        break
        return out

    async def wait(self, since: int, timeout: float) -> None:
        """Return when an event newer than ``since`` exists, or after
        ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while self.last_id <= since and not self._stopping and (left := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return

    async def page(self, since: int = 0, limit: int = 100, wait_s: float = 0) -> dict[str, Any]:
        """Events after ``since`` (waiting up to ``wait_s`` seconds for one
        when there are none, at most MAX_WAIT_S) and the cursor to pass next;
        see the module doc. A wait that is no number of seconds (NaN,
        infinity) is refused, as the controller's merged stream refuses it."""
        if not 1 <= limit <= MAX_LIMIT:
            raise InvalidArgument(f"limit must be between 1 and {MAX_LIMIT}")
        if since < 0:
            raise InvalidArgument("since must be >= 0")
        if not math.isfinite(wait_s):
            raise InvalidArgument("wait_s must be a number of seconds")
        wait_s = min(max(wait_s, 0.0), MAX_WAIT_S)
        since = min(since, self.last_id)  # a cursor from beyond: the newest
        await self.wait(since, wait_s)
        items = self.list(since, limit)
        return {"events": items, "next": items[-1]["id"] if items else since, "last_id": self.last_id}

    def stop_waiting(self) -> None:
        """The agent is stopping: long polls answer with what they have now (the poller
        carries on from its cursor at the next agent) instead of holding the stop up for
        up to their wait_s (the state dir stays locked until the server ends)."""
        self._stopping = True
        self._changed.set()

    def close(self) -> None:
        self._file.close()
        os.close(self._next_file)


def _parse(line: bytes) -> dict[str, Any] | None:
    """The event a line of the log holds, or None: a line torn by a crash, or damaged on disk
    (even into JSON that is no event: a number, an object without a whole-number id)."""
    try:
        event = json.loads(line)
    except ValueError:  # (bytes that are not UTF-8 included)
        return None
    if not isinstance(event, dict) or type(event.get("id")) is not int or event["id"] < 1:
        return None
    return event


def _ends_line(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, 2)
        return f.read(1) == b"\n"


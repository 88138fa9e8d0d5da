"""Metering: what each VM used on this host.

A VM's usage is kept as *segments*, one per hypervisor process lifetime (a
boot, or a wake after a sleep): from the process's start (read from /proc, so
a VM an agent crash left unmetered is metered from its start once adopted) to
its end, memory held and the process's CPU seconds (utime + stime from
/proc/<pid>/stat). Sleeps add *writes*: bytes of state written. A query over
[from, to) clips every segment to the window:

    wall_seconds    = |segment ∩ window|, rounded to the microsecond
    mem_mib_seconds = mem_mib × wall_seconds (of the rounded figure: exact)
    cpu_seconds     = segment cpu × |segment ∩ window| / segment length,
                      rounded to the microsecond
                      (the kernel gives a process total, not a time series,
                      so CPU is spread evenly over the segment)
    state_bytes_written = Σ bytes of writes inside the window

A row is one VM: its name and its ``created_at`` (the VM record's, as
``GET /v1/host/vms`` shows it). A name alone does not tell VMs apart: a VM
deleted and another created under its name are two VMs and two rows, while
one VM's segments (sleeps and wakes, a claim renaming it, a move away and
back) are one row. Segments recorded before VMs carried ``created_at`` here
are keyed by name alone, as they were then, and their rows have no
``created_at``; the agent gives them the ``created_at`` of the VM still
holding the name when they began after its creation (``identify``).

Rows are the exact decimal sums of their segments' figures and totals the
exact sums of the rows (bytes are integers). They travel as exact JSON number
literals (``exact_json``): a float keeps about 16 significant digits, and two
16 GiB VMs held for a month already need 17, so totals turned into floats
would not be the sums of the rows. A controller adding hosts together gets
the same figures a person adding the rows would.

Agent crashes. CPU readings are taken twice a second (the monitor) and persisted at
most ``PERSIST_S`` after they change, and before a usage reply reports them,
together with the time the process was last seen alive (a segment never ends
before it): a figure once reported does not go down after a restart. A
process that ends while the agent is down has left /proc and was not the new
agent's child, so the CPU seconds it used after its last persisted reading
cannot be read any more: that reading is at most ``PERSIST_S`` (plus half a
second) older than the crash, and what the VM used while the agent was
down is not metered. Its wall seconds and MiB·s run to its end: the console's
last write when its guest reported an exit, else the last moment it is known
to have been alive — when an agent last saw it (persisted at least every
``SEEN_PERSIST_S``) or its console was last written, whichever is later — never
to the restart that found it gone (an agent down an hour billed the hour).

On disk. ``metering.json`` (``{"segments": [...], "writes": [...]}``, where
older agents kept every record: their files load as before) holds the records
that may still change: open segments, and records without ``created_at``, which
``identify`` may still key. A record that can no longer change (a segment that
has ended, a write, keyed by ``created_at``) goes once to ``metering.jsonl``
beside it, one JSON line each (``{"segment": {...}}`` or ``{"write": {...}}``):
appended, flushed and fsynced at the save after one that wrote it (fsynced) in
``metering.json`` as it is, and only then is ``metering.json`` rewritten without
it (while the disk refuses the append, it stays there). So a save, up to once a second while VMs run, writes what the running VMs
hold, however long the host's history; a start reads both files. A record in
both (an agent stopped between the append and the rewrite) is the same record
there, which counts once. A last line cut short (an agent stopped as it
appended) is skipped with a warning: its record is still in ``metering.json``.
A file that cannot be read otherwise is kept aside as ``<name>.damaged-<time>``
(``damaged`` says so) and the other file's figures count.

Clocks. A segment's length is measured on CLOCK_BOOTTIME, which nobody sets (it
counts from the boot, suspends included), and the wall clock only places it for
windows: an open segment keeps, beside its wall ``start``, the boottime of its start
(``boottime``, with the ``boot_id`` it counts in: VMs do not outlive a reboot, and
neither does that count), and its now — what ``seen``, its ``end`` and a usage reply
take — is ``start`` + the boottime since. So the wall clock stepped while a VM runs
(NTP correcting it, someone setting it) changes neither the segment's length nor
what a reply reports of it (the wall clock stepped back an hour hid every running VM
from usage and left a segment slept meanwhile 0 s long; the correction billed each VM
started meanwhile an extra hour). Once the two clocks disagree by more than ``STEP_S``
an open segment is placed anew, to end now on the wall clock as it is (its length
kept; the step is logged once): a running VM is in the window that ends now whatever
the wall clock did, and one started while the clock was off is placed where it ran
once it is right. An ended segment keeps the place it had as it ended, and loses
``boottime`` and ``boot_id`` (the archive's records are as they were). Times callers
give (a console's last write, a delete mark's mtime) are the wall clock's as it read
then, taken as they are but never past the segment's now. Records without ``boottime``
(an older agent's, one of an earlier boot) are measured on the wall clock, as before.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import re
import time
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument
from ..paths import private_opener, sync_dir
from .backends.base import cpu_seconds

_FIELDS = ("cpu_seconds", "mem_mib_seconds", "wall_seconds")
# At most one write of the metering file a second for CPU readings: a crash
# loses at most this much of them (see the module doc).
PERSIST_S = 1.0
# ...and at least every this many seconds while VMs run, the last time each was seen alive
# (the end of a VM whose process ends while the agent is down)
SEEN_PERSIST_S = 5.0
_MICROSECOND = Decimal("0.000001")
# The wall clock and CLOCK_BOOTTIME disagreeing by more than this since they were last
# compared is the wall clock stepped (NTP slews both alike; only a step parts them).
STEP_S = 1.0
log = logging.getLogger("fuse.agent")


class Metering:
    """Per-VM usage segments and writes (``segments``, ``writes``: all of them), persisted
    to ``path`` (JSON: the records that may still change) and ``archive`` beside it (the
    records that no longer can, appended: see the module doc)."""

    def __init__(self, path: Path):
        self.path = path
        self.archive = path.with_suffix(".jsonl")
        self.segments: list[dict[str, Any]] = []
        self.writes: list[dict[str, Any]] = []
        # What ``path`` holds: the records not in the archive, which a save writes. Every open
        # segment is among them, so a VM's is looked up here, not through the whole history.
        self._hot_segments: list[dict[str, Any]] = []
        self._hot_writes: list[dict[str, Any]] = []
        self._archive_end = 0  # bytes of whole lines in the archive: what an append goes after
        # (the id()s of) the records of `path` that can no longer change and are in it on disk as
        # they are now: the ones the next save appends to the archive
        self._settled: set[int] = set()
        self._append_failing: OSError | None = None  # why the last append failed, while it does
        self._dirty = False  # a CPU reading not on disk yet
        self._saved_at = -math.inf  # time.monotonic() of the last save
        self._unsaved: OSError | None = None  # why the last write failed, while it does
        self._boot = _boot_id()  # the boot CLOCK_BOOTTIME counts in (None: no boottime kept)
        # why a file on disk could not be read, when one could not (the archive first: a record
        # in both files is known as one by what the archive holds)
        damaged = [why for why in (self._load_archive(), self._load_hot()) if why]
        self.damaged: str | None = "; ".join(damaged) or None

    def _load_archive(self) -> str | None:
        """Read the archive; why it could not be read (it is kept aside) when it could not."""
        try:
            data = self.archive.read_bytes()
        except FileNotFoundError:
            return None
        whole = data.rfind(b"\n") + 1
        if whole < len(data):
            # An agent stopped as it appended. Its records are all still in `path`, which is
            # rewritten without them only once the whole append is on disk.
            log.warning("metering %s: its last line is cut short (%d bytes: an agent stopped as it wrote it); "
                        "skipped, its record is still in %s", self.archive, len(data) - whole, self.path.name)
        records: dict[str, list[dict[str, Any]]] = {"segment": [], "write": []}
        for n, line in enumerate(data[:whole].split(b"\n")[:-1], 1):
            try:
                rec = json.loads(line)
                kind, value = next(iter(rec.items())) if isinstance(rec, dict) and len(rec) == 1 else (None, None)
                if kind not in records or not isinstance(value, dict):
                    raise ValueError("not a segment or a write")
            except ValueError as exc:
                return self._put_aside(self.archive, f"line {n}: {exc}")
            records[kind].append(value)
        self.segments, self.writes, self._archive_end = records["segment"], records["write"], whole
        return None

    def _load_hot(self) -> str | None:
        """Read ``path``; why it could not be read (it is kept aside) when it could not."""
        if not self.path.exists():
            return None
        try:
            data = json.loads(self.path.read_text())
            segments, writes = list(data["segments"]), list(data["writes"])
            if not all(isinstance(rec, dict) for rec in segments + writes):
                raise TypeError("a record is not an object")
        except (ValueError, KeyError, TypeError) as exc:
            return self._put_aside(self.path, exc)
        # An agent stopped between an append and the rewrite of `path` left records in both, the
        # same in each: counted once. (Only records that can no longer change can be in both.)
        if any(_final(kind, rec) for kind, rec in _tagged(segments, writes)):
            archived = {_content(kind, rec) for kind, rec in _tagged(self.segments, self.writes)}
            segments = [s for s in segments if _content("segment", s) not in archived]
            writes = [w for w in writes if _content("write", w) not in archived]
        self._hot_segments, self._hot_writes = segments, writes
        self._settled = {id(rec) for kind, rec in _tagged(segments, writes) if _final(kind, rec)}
        self.segments += segments
        self.writes += writes
        return None

    def _put_aside(self, path: Path, why: object) -> str:
        # Kept aside, not read: the agent serves (its VMs run on) and meters on; the figures in
        # it are in the damaged file for whoever can mend it.
        aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
        os.replace(path, aside)
        damaged = f"{path.name} could not be read ({why}); kept as {aside.name}, metering goes on without its figures"
        log.warning("metering %s", damaged)
        return damaged

    def save(self) -> None:
        """Write the figures to disk (raises what the write raised: a usage reply
        reports only figures on disk): the records that can no longer change and
        are in ``path`` as they are are appended to the archive, then ``path`` is
        rewritten with the others."""
        self._dirty = True  # until the writes below are done
        hot = _tagged(self._hot_segments, self._hot_writes)
        if settled := [(kind, rec) for kind, rec in hot if id(rec) in self._settled]:
            # Only a record `path` holds as it is now: a copy left in both files (should this
            # process stop before the rewrite below) is the same record, which a load counts
            # once. (A segment appended as it ended would be there still open.)
            try:
                self._append(settled)
            except OSError as exc:  # (they stay in `path`, on disk all the same: appended at a later save)
                if self._append_failing is None:
                    log.warning("metering %s: cannot append (%s); its records stay in %s until it can",
                                self.archive, exc, self.path.name)
                self._append_failing = exc
            else:
                self._append_failing = None
                self._hot_segments = [s for s in self._hot_segments if id(s) not in self._settled]
                self._hot_writes = [w for w in self._hot_writes if id(w) not in self._settled]
                self._settled = set()
        final = {id(rec) for kind, rec in _tagged(self._hot_segments, self._hot_writes) if _final(kind, rec)}
        tmp = self.path.with_suffix(".tmp")
        try:
            with open(tmp, "w", opener=private_opener) as f:  # 0600 whatever the umask
                f.write(json.dumps({"segments": self._hot_segments, "writes": self._hot_writes}))
                if final:  # (on disk before the next save appends them: a power cut finds them ended here)
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        if final:
            sync_dir(self.path.parent)
        self._settled = final
        self._dirty, self._saved_at = False, time.monotonic()
        self._unsaved = None

    def _append(self, records: list[tuple[str, dict[str, Any]]]) -> None:
        """Append ``records`` to the archive, on disk (fsynced) when this returns."""
        data = memoryview("".join(json.dumps({kind: rec}) + "\n" for kind, rec in records).encode())
        # (os-level writes: a buffered file's close would retry a write the disk refused, after
        # the truncation below)
        fd = private_opener(str(self.archive), os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC)
        try:
            size = os.fstat(fd).st_size
            base = min(size, self._archive_end)
            try:
                if size > base:  # the part an append cut short left (its records are all written here)
                    os.ftruncate(fd, base)
                while data:
                    data = data[os.write(fd, data):]
                os.fsync(fd)
            except OSError:
                with contextlib.suppress(OSError):  # (else the next append drops it)
                    os.ftruncate(fd, base)
                raise
            self._archive_end = os.fstat(fd).st_size
        finally:
            os.close(fd)
        if base == 0:  # (a new file: its name on disk too, before `path` is rewritten without them)
            sync_dir(self.archive.parent)

    def persist(self) -> None:
        """``save``, or when the disk refuses (full, read-only) keep the figures in memory
        and write them at the next chance (the monitor's next reading): a VM's start, sleep
        or end is recorded all the same; only an agent crash before then loses them."""
        try:
            self.save()
        except OSError as exc:
            if self._unsaved is None:
                log.warning("metering %s: cannot write (%s); the figures are kept in memory "
                            "until it can", self.path, exc)
            self._unsaved = exc

    def _timed(self, seg: dict[str, Any]) -> bool:
        """Whether open segment ``seg`` is measured on CLOCK_BOOTTIME: it holds a boottime of this boot."""
        return seg.get("boottime") is not None and seg.get("boot_id") == self._boot

    def _now_in(self, seg: dict[str, Any], clock: tuple[float, float] | None = None) -> float:
        """Now on open segment ``seg``'s timeline: its wall ``start`` + the CLOCK_BOOTTIME since,
        placed anew first if the wall clock stepped since it was placed (the module doc); the
        wall clock for a segment without a boottime of this boot."""
        wall, boottime = clock or CLOCK.read()
        if not self._timed(seg):
            return wall
        at = seg["start"] + (boottime - seg["boottime"])
        if abs(wall - at) > STEP_S:
            shift = wall - at
            seg["start"] += shift
            if seg.get("seen") is not None:
                seg["seen"] += shift
            self._dirty = True
            CLOCK.stepped(shift)  # (a step while no agent looked: this is the first to see it)
            at = seg["start"] + (boottime - seg["boottime"])
        return at

    def _open_segment(self, vm: str) -> dict[str, Any] | None:
        for seg in reversed(self._hot_segments):
            if seg["vm"] == vm and seg["end"] is None:
                return seg
        return None

    def start(self, vm: str, mem_mib: int, pid: int | None, now: float | None = None,
              created_at: str | None = None) -> None:
        """A process for ``vm`` (the VM created at ``created_at``) started
        holding ``mem_mib``: its segment starts at ``now``, by default when the
        process started (the time of this call when /proc cannot say)."""
        _, boottime = CLOCK.read()
        if now is None:
            began = _started_boottime(pid)
            began = boottime if began is None else min(began, boottime)
            now = began + CLOCK.offset
        else:  # (a wall time as the clock reads now: that long ago on CLOCK_BOOTTIME)
            began = now - CLOCK.offset
        self.stop(vm, now=now)  # never two open segments for one VM
        seg = {"vm": vm, "created_at": created_at, "start": now, "end": None, "mem_mib": mem_mib, "pid": pid,
               "cpu_s": 0.0}
        if self._boot is not None:
            seg |= {"boottime": began, "boot_id": self._boot}
        self.segments.append(seg)
        self._hot_segments.append(seg)
        self.persist()

    def identify(self, vm: str, created_at: str, since: float) -> None:
        """Key the unkeyed segments and writes of name ``vm`` from ``since``
        on (the creation of the VM holding the name now) as that VM's: records
        from an agent that keyed them by name alone (all in ``path``: the archive
        holds keyed records only)."""
        changed = False
        for rec in self._hot_segments + self._hot_writes:
            if rec["vm"] == vm and rec.get("created_at") is None and rec.get("start", rec.get("time")) >= since:
                rec["created_at"], changed = created_at, True
        if changed:
            self.persist()

    def sample(self, vm: str) -> None:
        """Refresh the CPU reading of ``vm``'s live process (the last
        reading is what remains once the process is gone); a changed reading
        is persisted at most ``PERSIST_S`` later."""
        seg = self._open_segment(vm)
        if seg is None or (cpu := cpu_seconds(seg["pid"])) is None:
            return
        seg["seen"] = self._now_in(seg)
        if cpu > seg["cpu_s"]:
            seg["cpu_s"] = cpu
            self._dirty = True
        since = time.monotonic() - self._saved_at
        if (self._dirty and since >= PERSIST_S) or since >= SEEN_PERSIST_S:
            self.persist()

    def last_seen(self, vm: str) -> float | None:
        """When ``vm``'s open segment's process was last seen alive, as persisted, on the
        wall clock as it reads now (None when it never was)."""
        seg = self._open_segment(vm)
        if seg is None or seg.get("seen") is None:
            return None
        self._now_in(seg)  # (placed as the wall clock reads now, as the end it goes to: ``stop``)
        return seg["seen"]

    def stop(self, vm: str, now: float | None = None) -> None:
        """``vm``'s process ended (or is about to: call before killing it,
        so the final CPU reading is taken); at ``now``, but never before it
        was last seen alive."""
        seg = self._open_segment(vm)
        if seg:
            self.sample(vm)
            at = self._now_in(seg)  # (first: it places the segment anew after a step)
            end = at if now is None else now
            if now is not None and self._timed(seg):
                # a wall time read before the clock stepped back is ahead of the segment's own
                # now, and no process ends after now
                end = min(end, at)
            seg["end"] = max(seg["start"], seg.get("seen", seg["start"]), end)
            # ended, its length is fixed: what the archive gets is as it was
            seg.pop("boottime", None)
            seg.pop("boot_id", None)
            self.persist()

    def state_written(self, vm: str, nbytes: int, now: float | None = None, created_at: str | None = None) -> None:
        write = {"vm": vm, "created_at": created_at, "time": now or time.time(), "bytes": int(nbytes)}
        self.writes.append(write)
        self._hot_writes.append(write)
        self.persist()

    def state_written_once(self, vm: str, nbytes: int, at: float, created_at: str | None = None) -> None:
        """``state_written`` at ``at``, unless a write of the VM is metered at or after it already
        (an agent that died after it metered a sleep's write, before it recorded the VM asleep)."""
        if not any(w["vm"] == vm and w.get("created_at") == created_at and w["time"] >= at for w in self.writes):
            self.state_written(vm, nbytes, now=at, created_at=created_at)

    def usage(self, start: float = 0.0, end: float | None = None, now: float | None = None) -> dict[str, Any]:
        """Per-VM rows (one per VM: name and ``created_at``) and totals for
        the window [start, end), as exact decimals (serialise with
        ``exact_json``); open segments end at ``now`` when given, else at their
        own now (the module doc)."""
        clock = CLOCK.read()
        given, now = now is not None, now or clock[0]
        end = now if end is None else end
        rows: dict[tuple[str, str], dict[str, Decimal | int]] = {}

        def row(rec: dict[str, Any]) -> dict[str, Decimal | int]:
            key = (rec["vm"], rec.get("created_at") or "")  # "": keyed by name alone (older records)
            return rows.setdefault(key, {"cpu_seconds": Decimal(0), "mem_mib_seconds": Decimal(0),
                                         "wall_seconds": Decimal(0), "state_bytes_written": 0})

        live = False
        for seg in self.segments:
            if seg["end"] is None:
                live = True
                self.sample(seg["vm"])
            s_end = seg["end"] if seg["end"] is not None else now if given else self._now_in(seg, clock)
            overlap = min(end, s_end) - max(start, seg["start"])
            if overlap <= 0:
                continue
            length = max(s_end - seg["start"], 1e-9)
            r = row(seg)
            wall = _dec(overlap)
            r["wall_seconds"] += wall
            r["mem_mib_seconds"] += wall * int(seg["mem_mib"])
            r["cpu_seconds"] += _dec(seg["cpu_s"] * min(1.0, overlap / length))
        if live:
            self.save()  # what this reply reports is on disk before it is sent
        for w in self.writes:
            if start <= w["time"] < end:
                row(w)["state_bytes_written"] += w["bytes"]

        totals: dict[str, Decimal | int] = {f: Decimal(0) for f in _FIELDS} | {"state_bytes_written": 0}
        out_rows = []
        for (vm, created_at), r in sorted(rows.items()):
            for f in _FIELDS:
                totals[f] += r[f]
            totals["state_bytes_written"] += r["state_bytes_written"]
            out_rows.append({"vm": vm, **({"created_at": created_at} if created_at else {}), **r})
        return {"from": start, "to": end, "vms": out_rows, "totals": totals}


class Clock:
    """The wall clock and CLOCK_BOOTTIME as metering reads them. The wall clock is taken as
    CLOCK_BOOTTIME + the offset between them, which changes only when the wall clock steps (by
    more than ``STEP_S``; logged once a step): so every segment placed between two steps has
    the same offset, and one history (a record given its times) is the same record whichever
    ``Metering`` writes it. One for the process (the host has one wall clock)."""

    def __init__(self) -> None:
        self.offset = 0.0  # wall clock - CLOCK_BOOTTIME, from the first read on
        self._read = False
        self._told: float | None = None  # the offset a step was last logged at

    def read(self) -> tuple[float, float]:
        """The wall clock and CLOCK_BOOTTIME now."""
        wall, boottime = _clocks()
        if not self._read or abs(wall - boottime - self.offset) > STEP_S:
            was, self.offset = self.offset, wall - boottime
            if self._read:
                self.stepped(self.offset - was)
            self._read = True
        return boottime + self.offset, boottime

    def stepped(self, by: float) -> None:
        """Log a step of ``by`` seconds, once a step."""
        if self._told != self.offset:
            log.warning("metering: the wall clock stepped %+.3f s; segments are measured on CLOCK_BOOTTIME, "
                        "running VMs' are placed anew to end now on the wall clock", by)
        self._told = self.offset


CLOCK = Clock()


def _tagged(segments: list[dict[str, Any]], writes: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [("segment", s) for s in segments] + [("write", w) for w in writes]


def _final(kind: str, rec: dict[str, Any]) -> bool:
    """Whether a record can no longer change, so goes to the archive: keyed by its VM's
    ``created_at`` (``identify`` keys the others) and, a segment, ended."""
    return rec.get("created_at") is not None and (kind == "write" or rec.get("end") is not None)


def _content(kind: str, rec: dict[str, Any]) -> str:
    """A record's whole content, what tells it from any other (a record in both files is one)."""
    return json.dumps([kind, rec], sort_keys=True)




def _dec(x: float) -> Decimal:
    """``x`` rounded to the microsecond, exactly."""
    return Decimal(repr(x)).quantize(_MICROSECOND)


def exact_json(value: Any) -> bytes:
    """``value`` as JSON, each ``Decimal`` written as the exact number it is
    (``json`` knows only floats). Read it back exactly with
    ``json.loads(body, parse_float=Decimal)``."""
    return _encode(value).encode()


def _encode(value: Any) -> str:
    if isinstance(value, Decimal):
        if not value.is_finite():
            raise ValueError(f"{value} is no JSON number")
        text = format(value, "f")
        if "." in text:
            text = text.rstrip("0")
        # (a decimal reads back as one, never as an integer)
        return text + "0" if text.endswith(".") else text if "." in text else text + ".0"
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k), ensure_ascii=False)}:{_encode(v)}"
                              for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_encode(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def process_started(pid: int | None) -> float | None:
    """When process ``pid`` started, unix seconds (None when /proc cannot say).
    Its start is in clock ticks since boot; the clock it counts on is
    CLOCK_BOOTTIME, so the difference to now is taken there."""
    if (began := _started_boottime(pid)) is None:
        return None
    wall, boottime = _clocks()
    return wall - max(0.0, boottime - began)


def _started_boottime(pid: int | None) -> float | None:
    """When process ``pid`` started on CLOCK_BOOTTIME (None when /proc cannot say)."""
    if not pid:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime
    except (OSError, IndexError, ValueError):
        return None
    return ticks / os.sysconf("SC_CLK_TCK")


def _clocks() -> tuple[float, float]:
    """The wall clock and CLOCK_BOOTTIME, read together: boottime on each side of the wall
    clock, again if far apart (a thread preempted between two reads looked like a step)."""
    for _ in range(5):
        before = time.clock_gettime(time.CLOCK_BOOTTIME)
        wall = time.time()
        after = time.clock_gettime(time.CLOCK_BOOTTIME)
        if after - before < 0.001:
            break
    return wall, (before + after) / 2


def _boot_id() -> str | None:
    """This boot's id: what CLOCK_BOOTTIME readings are good in (None when Linux cannot say)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


_SECONDS = re.compile(r"-?[0-9]+(\.[0-9]+)?([eE][-+]?[0-9]+)?")


def instant(value: str | None, what: str) -> float | None:
    """A usage window's end as unix seconds, from unix seconds or an ISO 8601 time
    (what GET /v1/usage takes, on a host and on the controller); None when not given."""
    if value is None:
        return None
    if not value.strip():  # as an empty `since` is: a typo, not a request for the default
        raise InvalidArgument(f"{what} is empty: give unix seconds or an ISO 8601 time, or leave it out")
    if _SECONDS.fullmatch(value):  # (a plain number: not Python's `1_000`, ` 1`, `+1` or `٣`)
        t = float(value)
    else:
        try:
            at = datetime.fromisoformat(value.replace("Z", "+00:00"))
            # a time with no offset is UTC (as `Z`): read in the server's own time zone, one
            # window meant different hours on hosts in different zones, and year 1 failed
            t = (at if at.tzinfo else at.replace(tzinfo=timezone.utc)).timestamp()
        except ValueError:
            t = math.nan
    if not math.isfinite(t):
        raise InvalidArgument(f"{what} must be unix seconds or an ISO 8601 time")
    if not EARLIEST <= t < END:
        raise InvalidArgument(f"{what} must be a time in the years 1 to 9999 (unix seconds from {EARLIEST}, "
                              f"before {END})")
    return t


# The times ISO 8601 can write (years 1 to 9999), as unix seconds [EARLIEST, END): the
# window is echoed as given, and a time far beyond them would come back rounded through a float.
EARLIEST, END = -62135596800, 253402300800


def window(start: str | None, end: str | None, now: float | None = None) -> tuple[int | float, int | float]:
    """The [from, to) of a GET /v1/usage query (a host's and the controller's)
    as unix seconds, whole seconds as integers: from defaults to 0 and to to
    now, rounded up to the second (which leaves out nothing metered so far:
    a running VM's segment is clipped at now anyway). 400 when to is before
    from, a from in the future with no to included."""
    t0, t1 = instant(start, "from"), instant(end, "to")
    t0 = 0 if t0 is None else _whole(t0)
    now = time.time() if now is None else now
    if t1 is None and t0 > now:  # (not against now rounded up: a from up to 1 s ahead passed)
        raise InvalidArgument("from is in the future: to defaults to now and must not be before from")
    t1 = math.ceil(now) if t1 is None else _whole(t1)
    if t1 < t0:
        raise InvalidArgument("to must not be before from")
    return t0, t1


def _whole(t: float) -> int | float:
    return int(t) if t.is_integer() else t

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
"""

from __future__ import annotations

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
from ..paths import private_opener
from .backends.base import cpu_seconds

_FIELDS = ("cpu_seconds", "mem_mib_seconds", "wall_seconds")
# At most one write of the metering file a second for CPU readings: a crash
# loses at most this much of them (see the module doc).
PERSIST_S = 1.0
# ...and at least every this many seconds while VMs run, the last time each was seen alive
# (the end of a VM whose process ends while the agent is down)
SEEN_PERSIST_S = 5.0
_MICROSECOND = Decimal("0.000001")
log = logging.getLogger("fuse.agent")


class Metering:
    """Per-VM usage segments, persisted to ``path`` (JSON)."""

    def __init__(self, path: Path):
        self.path = path
        self.segments: list[dict[str, Any]] = []
        self.writes: list[dict[str, Any]] = []
        self._dirty = False  # a CPU reading not on disk yet
        self._saved_at = -math.inf  # time.monotonic() of the last save
        self._unsaved: OSError | None = None  # why the last write failed, while it does
        self.damaged: str | None = None  # why the file on disk could not be read, when it could not
        if path.exists():
            try:
                data = json.loads(path.read_text())
                self.segments, self.writes = list(data["segments"]), list(data["writes"])
            except (ValueError, KeyError, TypeError) as exc:
                # Kept aside, not read: the agent serves (its VMs run on) and meters anew; the
                # figures up to now are in the damaged file for whoever can mend it.
                aside = path.with_name(f"{path.name}.damaged-{int(time.time())}")
                os.replace(path, aside)
                self.damaged = f"{path.name} could not be read ({exc}); kept as {aside.name}, metering starts anew"
                log.warning("metering %s", self.damaged)

    def save(self) -> None:
        """Write the figures to disk (raises what the write raised: a usage reply
        reports only figures on disk)."""
        tmp = self.path.with_suffix(".tmp")
        self._dirty = True  # until the write below is done
        try:
            with open(tmp, "w", opener=private_opener) as f:  # 0600 whatever the umask
                f.write(json.dumps({"segments": self.segments, "writes": self.writes}))
            os.replace(tmp, self.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        self._dirty, self._saved_at = False, time.monotonic()
        self._unsaved = None

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

    def _open_segment(self, vm: str) -> dict[str, Any] | None:
        for seg in reversed(self.segments):
            if seg["vm"] == vm and seg["end"] is None:
                return seg
        return None

    def start(self, vm: str, mem_mib: int, pid: int | None, now: float | None = None,
              created_at: str | None = None) -> None:
        """A process for ``vm`` (the VM created at ``created_at``) started
        holding ``mem_mib``: its segment starts at ``now``, by default when the
        process started (the time of this call when /proc cannot say)."""
        if now is None:
            now = process_started(pid) or time.time()
        self.stop(vm, now=now)  # never two open segments for one VM
        self.segments.append({"vm": vm, "created_at": created_at, "start": now, "end": None,
                              "mem_mib": mem_mib, "pid": pid, "cpu_s": 0.0})
        self.persist()

    def identify(self, vm: str, created_at: str, since: float) -> None:
        """Key the unkeyed segments and writes of name ``vm`` from ``since``
        on (the creation of the VM holding the name now) as that VM's: records
        from an agent that keyed them by name alone."""
        changed = False
        for rec in self.segments + self.writes:
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
        seg["seen"] = time.time()
        if cpu > seg["cpu_s"]:
            seg["cpu_s"] = cpu
            self._dirty = True
        since = time.monotonic() - self._saved_at
        if (self._dirty and since >= PERSIST_S) or since >= SEEN_PERSIST_S:
            self.persist()

    def last_seen(self, vm: str) -> float | None:
        """When ``vm``'s open segment's process was last seen alive, as persisted
        (None when it never was)."""
        seg = self._open_segment(vm)
        return None if seg is None else seg.get("seen")

    def stop(self, vm: str, now: float | None = None) -> None:
        """``vm``'s process ended (or is about to: call before killing it,
        so the final CPU reading is taken); at ``now``, but never before it
        was last seen alive."""
        seg = self._open_segment(vm)
        if seg:
            self.sample(vm)
            end = time.time() if now is None else now
            seg["end"] = max(seg["start"], seg.get("seen", seg["start"]), end)
            self.persist()

    def state_written(self, vm: str, nbytes: int, now: float | None = None, created_at: str | None = None) -> None:
        self.writes.append({"vm": vm, "created_at": created_at, "time": now or time.time(), "bytes": int(nbytes)})
        self.persist()

    def state_written_once(self, vm: str, nbytes: int, at: float, created_at: str | None = None) -> None:
        """``state_written`` at ``at``, unless a write of the VM is metered at or after it already
        (an agent that died after it metered a sleep's write, before it recorded the VM asleep)."""
        if not any(w["vm"] == vm and w.get("created_at") == created_at and w["time"] >= at for w in self.writes):
            self.state_written(vm, nbytes, now=at, created_at=created_at)

    def usage(self, start: float = 0.0, end: float | None = None, now: float | None = None) -> dict[str, Any]:
        """Per-VM rows (one per VM: name and ``created_at``) and totals for
        the window [start, end), as exact decimals (serialise with
        ``exact_json``)."""
        now = now or time.time()
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
            s_end = now if seg["end"] is None else seg["end"]
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
    if not pid:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22, starttime
    except (OSError, IndexError, ValueError):
        return None
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - max(0.0, age)


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

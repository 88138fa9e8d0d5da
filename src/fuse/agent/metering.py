"""Metering: what each VM used on this host.

A VM's usage is kept as *segments*, one per hypervisor process lifetime (a
boot, or a wake after a sleep): start, end, memory held and the process's
CPU seconds (utime + stime from /proc/<pid>/stat). Sleeps add *writes*: bytes
of state written. A query over [from, to) clips every segment to the window:

    wall_seconds    = |segment ∩ window|
    mem_mib_seconds = mem_mib × wall_seconds
    cpu_seconds     = segment cpu × wall_seconds / segment length
                      (the kernel gives a process total, not a time series,
                      so CPU is spread evenly over the segment)
    state_bytes_written = Σ bytes of writes inside the window

Rows are rounded to microseconds first and totals are the exact decimal sums
of the rows (bytes are integers), so a controller adding hosts together gets
the same figures a person adding the rows would.
"""

from __future__ import annotations

import json
import math
import os
import time
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from ..errors import InvalidArgument
from .backends.base import cpu_seconds

_FIELDS = ("cpu_seconds", "mem_mib_seconds", "wall_seconds")


class Metering:
    """Per-VM usage segments, persisted to ``path`` (JSON)."""

    def __init__(self, path: Path):
        self.path = path
        self.segments: list[dict[str, Any]] = []
        self.writes: list[dict[str, Any]] = []
        if path.exists():
            data = json.loads(path.read_text())
            self.segments, self.writes = data["segments"], data["writes"]

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"segments": self.segments, "writes": self.writes}))
        os.replace(tmp, self.path)

    def _open_segment(self, vm: str) -> dict[str, Any] | None:
        for seg in reversed(self.segments):
            if seg["vm"] == vm and seg["end"] is None:
                return seg
        return None

    def start(self, vm: str, mem_mib: int, pid: int | None, now: float | None = None) -> None:
        """A process for ``vm`` started holding ``mem_mib``."""
        self.stop(vm, now=now)  # never two open segments for one VM
        self.segments.append({"vm": vm, "start": now or time.time(), "end": None, "mem_mib": mem_mib,
                              "pid": pid, "cpu_s": 0.0})
        self.save()

    def sample(self, vm: str) -> None:
        """Refresh the CPU reading of ``vm``'s live process (the last
        reading is what remains once the process is gone)."""
        seg = self._open_segment(vm)
        if seg and (cpu := cpu_seconds(seg["pid"])) is not None:
            seg["cpu_s"] = max(seg["cpu_s"], cpu)

    def stop(self, vm: str, now: float | None = None) -> None:
        """``vm``'s process ended (or is about to: call before killing it,
        so the final CPU reading is taken)."""
        seg = self._open_segment(vm)
        if seg:
            self.sample(vm)
            seg["end"] = max(seg["start"], now or time.time())
            self.save()

    def state_written(self, vm: str, nbytes: int, now: float | None = None) -> None:
        self.writes.append({"vm": vm, "time": now or time.time(), "bytes": int(nbytes)})
        self.save()

    def usage(self, start: float = 0.0, end: float | None = None, now: float | None = None) -> dict[str, Any]:
        """Per-VM rows and totals for the window [start, end)."""
        now = now or time.time()
        end = now if end is None else end
        rows: dict[str, dict[str, Decimal | int]] = {}

        def row(vm: str) -> dict[str, Decimal | int]:
            return rows.setdefault(vm, {"cpu_seconds": Decimal(0), "mem_mib_seconds": Decimal(0),
                                        "wall_seconds": Decimal(0), "state_bytes_written": 0})

        for seg in self.segments:
            if seg["end"] is None:
                self.sample(seg["vm"])
            s_end = now if seg["end"] is None else seg["end"]
            overlap = min(end, s_end) - max(start, seg["start"])
            if overlap <= 0:
                continue
            length = max(s_end - seg["start"], 1e-9)
            r = row(seg["vm"])
            r["wall_seconds"] += _dec(overlap)
            r["mem_mib_seconds"] += _dec(seg["mem_mib"] * overlap)
            r["cpu_seconds"] += _dec(seg["cpu_s"] * min(1.0, overlap / length))
        for w in self.writes:
            if start <= w["time"] < end:
                row(w["vm"])["state_bytes_written"] += w["bytes"]

        totals: dict[str, Decimal | int] = {f: Decimal(0) for f in _FIELDS} | {"state_bytes_written": 0}
        out_rows = []
        for vm in sorted(rows):
            r = rows[vm]
            for f in _FIELDS:
                totals[f] += r[f]
            totals["state_bytes_written"] += r["state_bytes_written"]
            out_rows.append({"vm": vm, **_plain(r)})
        return {"from": start, "to": end, "vms": out_rows, "totals": _plain(totals)}


def _dec(x: float) -> Decimal:
    return Decimal(repr(round(x, 6)))


def _plain(r: dict[str, Decimal | int]) -> dict[str, float | int]:
    return {k: (float(v) if isinstance(v, Decimal) else v) for k, v in r.items()}


def instant(value: str | None, what: str) -> float | None:
    """A usage window's end as unix seconds, from unix seconds or an ISO 8601 time
    (what GET /v1/usage takes, on a host and on the controller); None when not given."""
    if value in (None, ""):
        return None
    try:
        t = float(value)
    except ValueError:
        try:
            t = datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            t = math.nan
    if not math.isfinite(t):
        raise InvalidArgument(f"{what} must be unix seconds or an ISO 8601 time")
    return t


def window(start: str | None, end: str | None, now: float | None = None) -> tuple[int | float, int | float]:
    """The [from, to) of a GET /v1/usage query (a host's and the controller's)
    as unix seconds, whole seconds as integers: from defaults to 0 and to to
    now, rounded up to the second (which leaves out nothing metered so far:
    a running VM's segment is clipped at now anyway). 400 when to is before
    from, a from in the future with no to included."""
    t0, t1 = instant(start, "from"), instant(end, "to")
    t0 = 0 if t0 is None else _whole(t0)
    t1 = math.ceil(time.time() if now is None else now) if t1 is None else _whole(t1)
    if t1 < t0:
        raise InvalidArgument("to must not be before from")
    return t0, t1


def _whole(t: float) -> int | float:
    return int(t) if t.is_integer() else t

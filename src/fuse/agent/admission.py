"""Admission: the host's final word on whether a VM may take its room.

Rules, in the order a refusal is reported (first failing rule wins):

1. VM-count policy: ``max_vms`` VMs holding room (None = unlimited).
2. Memory is a hard limit: memory held by running, booting, incoming and
   reserved VMs, plus the host reserve, plus the ask, must fit the RAM.
3. Memory pressure: the kernel's PSI says tasks are stalling on memory, or
   MemAvailable cannot cover the ask plus the reserve (the book-keeping of
   rule 2 cannot see memory used outside fuse).

CPU is time-shared and never refuses; it only ranks hosts at the controller.
"""

from __future__ import annotations

from pathlib import Path

# States whose VM holds (or has reserved) its memory. A sleeping VM frees
# its memory unless it arrived by a move and is waiting to be woken.
HOLDS_MEMORY = frozenset({"creating", "running", "incoming"})
# PSI "some avg10": % of the last 10 s in which a task stalled on memory.
PRESSURE_AVG10 = 10.0


def admission_refusal(*, ask_mib: int, held_mib: int, ram_mb: int, reserve_mib: int, vm_count: int,
                      max_vms: int | None, pressure: str | None) -> str | None:
    """The reason to refuse, or None to admit. Pure: the caller supplies
    the figures (and holds the admission lock)."""
    if max_vms is not None and vm_count >= max_vms:
        return f"vm count limit reached ({vm_count} of {max_vms})"
    free = ram_mb - reserve_mib - held_mib
    if ask_mib > free:
        return (f"not enough memory: asked {ask_mib} MiB, {max(free, 0)} MiB free "
                f"({ram_mb} MiB RAM, {held_mib} MiB held by vms, {reserve_mib} MiB host reserve)")
    if pressure:
        return pressure
    return None


def memory_pressure(ask_mib: int, reserve_mib: int, proc: Path = Path("/proc")) -> str | None:
    """Why the real machine is too short of memory for ``ask_mib`` more,
    or None. ``ask_mib=0`` asks whether the host is under pressure at all."""
    try:
        for line in (proc / "pressure/memory").read_text().splitlines():
            if line.startswith("some"):
                avg10 = float(line.split()[1].split("=")[1])
                if avg10 >= PRESSURE_AVG10:
                    return f"host under memory pressure (PSI some avg10={avg10})"
    except (OSError, ValueError, IndexError):
        pass  # no PSI on this kernel: MemAvailable alone decides
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) // 1024
                if available < ask_mib + reserve_mib:
                    if ask_mib:  # (the machine has memory; not this much of it)
                        return (f"not enough memory available on the machine: {available} MiB available "
                                f"(MemAvailable), {ask_mib} MiB asked plus {reserve_mib} MiB host reserve")
                    return (f"host under memory pressure: {available} MiB available, "
                            f"less than its {reserve_mib} MiB host reserve")
    except (OSError, ValueError):
        pass
    return None

"""Admission: the host's final word on whether a VM may take its room.

Rules, in the order a refusal is reported (first failing rule wins):

1. VM-count policy: ``max_vms`` VMs holding room (None = unlimited).
2. Memory is a hard limit: memory held by running, booting, incoming and
   reserved VMs, plus the host reserve, plus the ask, must fit the RAM.
3. Memory pressure: the kernel's PSI says tasks are stalling on memory, or
   MemAvailable cannot cover the ask plus the reserve plus the memory already
   promised to this host's VMs that their guests have not touched yet (a guest
   takes its RAM as it uses it, so MemAvailable alone would offer it again);
   the book-keeping of rule 2 cannot see memory used outside fuse.

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


def memory_pressure(ask_mib: int, reserve_mib: int, proc: Path = Path("/proc"), promised_mib: int = 0) -> str | None:
    """Why the real machine is too short of memory for ``ask_mib`` more,
    or None. ``ask_mib=0`` asks whether the host is under pressure at all.
    ``promised_mib``: memory admitted VMs may still take (``untouched_mib``),
    counted against MemAvailable with the ask."""
    try:
        for line in (proc / "pressure/memory").read_text().splitlines():
            if line.startswith("some"):
                avg10 = float(line.split()[1].split("=")[1])
                if avg10 >= PRESSURE_AVG10:
                    return f"host under memory pressure (PSI some avg10={avg10}, at or above {PRESSURE_AVG10:g})"
    except (OSError, ValueError, IndexError):
        pass  # no PSI on this kernel: MemAvailable alone decides
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) // 1024
                promised = promised_mib if ask_mib else 0
                if available < ask_mib + reserve_mib + promised:
                    if ask_mib:  # (the machine has memory; not this much of it)
                        vms = f", {promised} MiB promised to this host's vms and not yet taken" if promised else ""
                        return (f"not enough memory available on the machine: {available} MiB available "
                                f"(MemAvailable), {ask_mib} MiB asked plus {reserve_mib} MiB host reserve{vms}")
                    return (f"host under memory pressure: {available} MiB available, "
                            f"less than its {reserve_mib} MiB host reserve")
    except (OSError, ValueError):
        pass
    return None


def untouched_mib(vms: list[tuple[int, int | None]], proc: Path = Path("/proc")) -> int:
    """Memory promised to VMs that their processes do not hold yet: Σ max(0, memory − what
    the process holds of its own) over (MiB given, pid or None) pairs; a VM with no process
    yet (creating, incoming, reserved) counts whole. What it holds is its anonymous and
    shared-memory resident pages (RssAnon + RssShmem), not VmRSS: its file pages (the
    hypervisor's binary and libraries, ~70 MiB a QEMU, shared by all of them) are page
    cache that MemAvailable counts as available. The hypervisor's own heap is in it, which
    the estimate errs by (towards admitting)."""
    total = 0
    for mem_mib, pid in vms:
        held = 0
        if pid:
            try:
                for line in (proc / str(pid) / "status").read_text().splitlines():
                    if line.startswith(("RssAnon:", "RssShmem:")):
                        held += int(line.split()[1]) // 1024
            except (OSError, ValueError, IndexError):
                held = 0  # (gone: its memory is not taken either)
        total += max(0, mem_mib - held)
    return total

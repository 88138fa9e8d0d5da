"""The VM manager: admission, lifecycle, sleep/wake and adoption on one host.

Every VM is a record ``<state-dir>/vms/<dir>/vm.json`` (the ``Vm`` wire
record) next to its console log, pid file and state files; the dir is the
VM's name, except for a VM created standby (``Vm.dir``, see ``claim``).
Each change of state goes through ``_transition``, which checks
``TRANSITIONS``, appends to the record's history, writes the record and
emits a ``vm_state`` event — so a restarted agent finds exactly what the
last one knew, and adopts the VMs still running (their QEMU processes are
daemons, not our children).

Admission is the host's final word: see ``admission_refusal``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import re
import secrets
import shutil
import signal
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ..errors import Conflict, FuseError, HostFull, InvalidArgument, NotFound, VmExists
from ..models.vm import MAX_ENTRY_BYTES, ClaimRequest, CreateVmRequest, StateFile, Vm
from ..paths import private_dir, private_file, private_opener, sync_dir
from ..tasks import cancel_and_wait
from . import bundle as bundles
from . import probe as probe_mod
from .admission import HOLDS_MEMORY, admission_refusal, memory_pressure, untouched_mib
from .backends.base import (MOVED_CONSOLE, STANDBY_MARK, STANDBY_PLATFORM, BackendError, BootSpec, EntryCutOff,
                            get_backend, hypervisors_naming, kill_and_wait, reap)
from .events import EventLog
from .incoming import IncomingMoves
from .metering import Metering, process_started

# state -> states it may move to, and what moves it there.
TRANSITIONS: dict[str, frozenset[str]] = {
    "creating": frozenset({
        "running",    # the hypervisor process is up
        "failed",     # it could not start (or the agent died mid-boot)
        "deleted",    # never reached: delete waits for the boot to finish
    }),
    "incoming": frozenset({
        "sleeping",   # a move's files arrived and verified (install)
        "deleted",    # the move was aborted
    }),
    "running": frozenset({
        "sleeping",   # sleep: state written to files, process gone
        "exited",     # the entry finished; the guest printed FUSE-EXIT
        "failed",     # the process died without the guest saying why
        "deleted",    # DELETE: process killed
    }),
    "sleeping": frozenset({
        "running",    # wake: same command line, state loaded, cont
        "deleted",    # DELETE, or a completed move removes the source copy
    }),
    "exited": frozenset({"deleted"}),
    "failed": frozenset({"deleted"}),
    "deleted": frozenset(),  # terminal
}
# Changes done before they are recorded: a sleep's hypervisor is gone and its state file complete
# when its record is written, so a record the disk refuses leaves the VM asleep all the same, in
# memory, its sleep's mark telling a restarted agent so (``_settle_interrupted``), and the monitor
# writes the record once the disk has room (``_write_unwritten``). Put back to running, it was
# recorded failed (no process), its memory lost. Any other change the disk refuses is not made.
DONE_BEFORE_RECORDED = frozenset({("running", "sleeping")})

# The guest's init ends the console with "FUSE-EXIT <status> <nonce>", the nonce its kernel
# command line carried (``platform["exit_nonce"]``, drawn when the VM is created): an entry
# that prints "FUSE-EXIT 0" itself (and then crashed the guest) was read as having exited 0.
# A VM created before nonces (none in its platform) is read as it was written.
_EXIT_MARK = re.compile(rb"^FUSE-EXIT (\d+)(?: [0-9a-f]+)?\r?$", re.M)
# Written in a VM's dir before a sleep or wake touches its process and removed
# once the record says how it ended: an agent killed in between left the record
# one state behind the process and state files, and the next agent settles it
# (``_settle_interrupted``). A delete's mark is written before its hypervisor is stopped
# and goes with the dir: an agent killed in between left a VM whose process it had killed,
# which the next agent read as failed; it finishes the delete (``_finish_delete``).
SLEEP_MARK, WAKE_MARK, DELETE_MARK = "sleep.pending", "wake.pending", "delete.pending"
# A record (vm.json) that cannot be read is kept aside under this name plus the time
# (``_put_aside``), its dir left as it is: the VM's files (a sleeping VM's memory) and
# hypervisor stay until someone who can tell whose they are mends or removes them.
DAMAGED = "vm.json.damaged-"
CONSOLE_CHUNK = 64 * 1024
DELIVERING = "entry.delivering"  # in a standby VM's dir while a claim delivers its entry
TRIMMING = "console.trimming"  # in a VM's dir while its hypervisor is stopped for a console cut
STOP_WAIT_S = 0.5  # how long a console cut waits for the hypervisor's threads to stop
CONSOLE_MAX_MB = 64  # FUSE_CONSOLE_MAX_MB's default: a VM's console.log is cut back to half past this
log = logging.getLogger("fuse.agent")
MONITOR_INTERVAL = 0.1


def now() -> datetime:
    return datetime.now(timezone.utc)


class VmManager:
    """Runs this host's VMs. ``await start()`` adopts what is on disk;
    ``await close()`` leaves VMs running (they outlive the agent)."""

    def __init__(self, state_dir: Path, backend: str = "qemu", *, ram_mb: int, cpus: int,
                 max_vms: int | None = None, reserve_mib: int = 256,
                 pressure: Callable[[int], str | None] | None = None):
        # absolute: QEMU runs daemonized (working dir /) and is handed paths under it;
        # resolved: its processes are known by those paths, whichever way the dir was named
        self.state_dir = Path(state_dir).resolve()
        self.root = self.state_dir / "vms"
        # Owner-only whatever the umask (README: every directory fuse creates is 0700): a VM's
        # dir holds its record, console, state files and QMP socket.
        private_dir(self.root)
        self.backend = get_backend(backend, state_dir=self.state_dir)
        self.ram_mb, self.cpus = ram_mb, cpus
        self.max_vms, self.reserve_mib = max_vms, reserve_mib
        self.pressure = pressure or (lambda ask: memory_pressure(ask, reserve_mib,
                                                                 promised_mib=self.untouched_mib() if ask else 0))
        self.events = EventLog(self.state_dir / "events.jsonl")
        self.metering = Metering(self.state_dir / "metering.json")
        if self.metering.damaged:
            self.events.emit("metering_damaged", reason=self.metering.damaged)
        self.incoming = IncomingMoves(self)
        private_dir(self.incoming.dir)  # (before it makes it: its mkdir follows the umask)
        # Whether /dev/kvm answers; whether a guest boots under it is the
        # backend's to settle (``_settle_accel``), and ``kvm`` reports that.
        self.kvm_device = probe_mod.kvm_device_answers()
        self.vms: dict[str, Vm] = {}
        self._unreadable: set[str] = set()  # dirs whose damaged vm.json could not even be put aside
        self._unreaped: set[int] = set()  # ended VM processes of ours not collectable yet
        # VMs whose record in memory is ahead of their vm.json, which the disk refused
        # (``DONE_BEFORE_RECORDED``): written by the monitor once it has room.
        self._unwritten: set[str] = set()
        self._locks: dict[str, asyncio.Lock] = {}
        # Old names of VMs a claim is renaming right now: claiming one again
        # is a conflict, not an unknown VM.
        self._claiming: set[str] = set()
        from ..envsettings import megabytes
        self.console_max = megabytes("FUSE_CONSOLE_MAX_MB", CONSOLE_MAX_MB) * 2**20
        # Held from the admission check to the reservation it makes, so two
        # concurrent asks can never both see the same free memory.
        self.admit_lock = asyncio.Lock()
        self._monitor: asyncio.Task | None = None

    # -- records ---------------------------------------------------------------

    def vm_dir(self, name: str) -> Path:
        """The directory of VM ``name``: ``vms/<name>``, or its record's
        ``dir`` (a VM created standby keeps the dir it booted in)."""
        vm = self.vms.get(name)
        return self.root / (vm.dir if vm is not None and vm.dir else name)

    def lock(self, name: str) -> asyncio.Lock:
        return self._locks.setdefault(name, asyncio.Lock())

    def save(self, vm: Vm) -> None:
        vm.updated_at = now()
        path = self.vm_dir(vm.name) / "vm.json"
        private_dir(path.parent)
        tmp = path.with_suffix(".tmp")
        try:
            with open(tmp, "w", opener=private_opener) as f:  # 0600 whatever the umask
                f.write(vm.model_dump_json(indent=1))
                # on disk before it replaces the last record: renamed unwritten, a power cut left
                # an empty or torn vm.json, the VM's only record (``start`` keeps it aside)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)  # (a full disk: no empty or partial record left beside it)
            raise
        sync_dir(path.parent)  # (the rename itself: the record the crash finds is this one)
        if vm.name in self._unwritten:  # written at last: the sleep's mark that stood for it is done
            self._unwritten.discard(vm.name)
            with contextlib.suppress(OSError):  # (left, it is dropped at the next start)
                self._clear_mark(vm, SLEEP_MARK)

    def transition(self, vm: Vm, to: str, reason: str | None = None) -> None:
        """Move ``vm`` to state ``to``: checked, recorded, persisted, announced. A record the
        disk refuses is an OSError and the VM stays as it was, unless the change was done
        before it is recorded (``DONE_BEFORE_RECORDED``): made, its record written later."""
        if to not in TRANSITIONS[vm.state]:
            raise Conflict(f"vm {vm.name} is {vm.state}; it cannot become {to}")
        entry: dict[str, Any] = {"state": to, "time": now().isoformat()}
        if reason:
            entry["reason"] = reason
        before, reason_before, vm.state = vm.state, vm.reason, to
        vm.history.append(entry)
        if to in ("failed",) and reason:
            vm.reason = reason
        if to == "deleted":
            shutil.rmtree(self.vm_dir(vm.name), ignore_errors=True)
            self.vms.pop(vm.name, None)
            self._unwritten.discard(vm.name)
        else:
            try:
                self.save(vm)
            except OSError as exc:
                if (before, to) not in DONE_BEFORE_RECORDED:
                    # not recorded, so not made: the record in memory stays what the disk says
                    # (the monitor tries an ended VM again on its next tick)
                    vm.state, vm.reason = before, reason_before
                    vm.history.pop()
                    raise
                self._unwritten.add(vm.name)
                log.warning("vm %s is %s, but its record could not be written (%s); it is kept in memory "
                            "and written once the disk has room", vm.name, to, exc)
        data = {"from": before, "to": to} | ({"reason": reason} if reason else {})
        if to == "exited":
            data["exit_status"] = vm.exit_status
        self.events.emit("vm_state", vm=vm.name, **data)

    def get(self, name: str) -> Vm:
        vm = self.vms.get(name)
        if vm is None:
            raise NotFound(f"no vm named {name} on this host")
        return vm

    def list(self) -> list[Vm]:
        return sorted(self.vms.values(), key=lambda v: (v.created_at, v.name))

    def bundle(self, name: str) -> bundles.Bundle | str:
        """Bundle ``name`` as this host's backend can boot it, or why not."""
        return bundles.load_bundle(self.state_dir, name, self.backend.bundle_files)

    def spec(self, vm: Vm) -> BootSpec:
        b = self.bundle(vm.bundle)
        if isinstance(b, str):
            raise FuseError(b, code="bundle_missing")
        return BootSpec(name=vm.name, vm_dir=self.vm_dir(vm.name), vcpus=vm.shape.vcpus,
                        mem_mib=vm.shape.mem_mib, entry=vm.entry, kernel=b.vmlinux, initrd=b.initrd,
                        platform=vm.platform)

    # -- admission -------------------------------------------------------------

    def held_mib(self) -> int:
        return sum(v.shape.mem_mib for v in self.vms.values() if _holds_memory(v))

    def untouched_mib(self) -> int:
        """Memory admitted VMs may still take from the machine (see ``admission.untouched_mib``);
        0 on a backend whose VMs do not take their guests' memory."""
        if not self.backend.guest_memory:
            return 0
        return untouched_mib([(v.shape.mem_mib, v.pid if v.state == "running" else None)
                              for v in self.vms.values() if _holds_memory(v)])

    def admission(self, mem_mib: int) -> str | None:
        """Why this host refuses ``mem_mib`` more, or None (call under
        ``admit_lock`` and reserve before releasing it)."""
        active = sum(1 for v in self.vms.values() if _holds_memory(v))
        return admission_refusal(ask_mib=mem_mib, held_mib=self.held_mib(), ram_mb=self.ram_mb,
                                 reserve_mib=self.reserve_mib, vm_count=active, max_vms=self.max_vms,
                                 pressure=self.pressure(mem_mib))

    def _available_mib(self) -> int:
        """The machine's MemAvailable, MiB (unbounded where it cannot be read)."""
        try:
            return probe_mod.mem_available_mb()
        except (OSError, RuntimeError, ValueError):
            return 2**62

    def refuse(self, reason: str, name: str | None) -> HostFull:
        self.events.emit("admission_refused", vm=name, reason=reason)
        return HostFull(reason)

    def summary(self) -> dict[str, Any]:
        """Live room for ``GET /v1/host``."""
        running = [v for v in self.vms.values() if v.state in ("creating", "running")]
        pressure = self.pressure(0)
        return {
            # vCPUs are time-shared and may be oversubscribed; free never reads below 0.
            "free_vcpus": max(0, self.cpus - sum(v.shape.vcpus for v in running)),
            # what admission takes: its own books, and what the real machine has
            # available beyond the reserve (other processes use memory too)
            "free_mem_mib": max(0, min(self.ram_mb - self.reserve_mib - self.held_mib(),
                                       self._available_mib() - self.reserve_mib - self.untouched_mib())),
            "vm_count": sum(1 for v in self.vms.values() if _holds_memory(v)),
            "vms_total": len(self.vms),
            "memory_pressure": pressure is not None,
            # why, in admission's words (PSI's avg10, or MemAvailable under the host reserve):
            # the controller quotes it where it passes the host by (review 38: an operator
            # who over-reserved read "memory pressure" and looked for stalls there were none of)
            "memory_pressure_reason": pressure,
            "accel": getattr(self.backend, "accel", None),
            # usable KVM: what the backend settled on, not just /dev/kvm answering
            "kvm": self.backend.kvm_usable(self.kvm_device),
            "kvm_device": self.kvm_device,
            # only those its backend boots: the controller places a VM only where its bundle is listed
            "bundles": bundles.list_bundles(self.state_dir, self.backend.bundle_files),
            # the newest event's id: a poller reads /v1/host/events only when it moved
            "last_event_id": self.events.last_id,
        }

    # -- lifecycle -------------------------------------------------------------

    async def create(self, req: CreateVmRequest) -> Vm:
        """Admit and boot a VM; returns it running (or raises). A bundle that
        is absent, damaged or not bootable by this host's backend is 400 with
        the reason, before any process starts (the accelerator probe included)."""
        b = self.bundle(req.bundle or "linux")
        if isinstance(b, str):  # (``bundle`` in details: this host's lack, another may have it)
            raise InvalidArgument(b, details={"bundle": req.bundle or "linux"})
        if req.standby and not self.backend.supports_standby:
            raise InvalidArgument(f"standby vms need the qemu backend; this host runs {self.backend.name}")
        _check_entry(req.entry or "")
        await self._settle_accel(b)
        async with self.admit_lock:
            name = req.name or f"vm-{secrets.token_hex(4)}"
            self.check_free(name)
            if reason := self.admission(req.shape.mem_mib):
                raise self.refuse(reason, name)
            platform = (self.backend.platform() | (STANDBY_PLATFORM if req.standby else {})
                        | {"exit_nonce": secrets.token_hex(8)})
            vm = Vm(name=name, state="creating", shape=req.shape, entry=req.entry or "", bundle=b.name,
                    bundle_fingerprint=b.fingerprint, created_at=now(), platform=platform,
                    standby=req.standby, dir=f"_sb-{secrets.token_hex(6)}" if req.standby else None,
                    history=[{"state": "creating", "time": now().isoformat()}])
            self.vms[name] = vm
            shutil.rmtree(self.vm_dir(name), ignore_errors=True)  # leftovers of a crashed delete
            try:
                self.save(vm)
            except OSError as exc:
                self._unmake(vm)
                raise unrecorded(name, exc) from exc
            self.events.emit("vm_state", vm=name, to="creating")
        async with self.lock(name):
            try:
                vm.pid = await self.backend.start(self.spec(vm))
            except (BackendError, OSError) as exc:
                try:
                    self.transition(vm, "failed", str(exc))
                except OSError as not_written:
                    # nothing runs and its failure cannot be recorded: it was never made
                    await self._unmake_stopped(vm)
                    raise unrecorded(name, not_written) from exc
                raise FuseError(f"vm {name} failed to boot: {exc}", code="boot_failed") from exc
            self.metering.start(name, vm.shape.mem_mib, vm.pid, created_at=_created(vm))
            try:
                self.transition(vm, "running")
            except OSError as exc:
                # it booted, but its record cannot say so: stopped and unmade, not left
                # running behind a record that says creating
                self.metering.stop(name)
                await self._unmake_stopped(vm)
                raise unrecorded(name, exc) from exc
        return vm

    def _unmake(self, vm: Vm) -> None:
        """Forget a VM whose creation could not be recorded (no process runs for it)."""
        self.vms.pop(vm.name, None)
        shutil.rmtree(self.vm_dir(vm.name) if vm.dir is None else self.root / vm.dir, ignore_errors=True)
        self.events.emit("vm_state", vm=vm.name, to="deleted", reason="its record could not be written")

    async def _unmake_stopped(self, vm: Vm) -> None:
        with contextlib.suppress(BackendError, OSError):
            await self.backend.stop(_bare_spec(self, vm))
        self._unmake(vm)

    async def delete(self, name: str, move_id: str | None = None) -> None:
        """Stop (no process left) and remove a VM and its files. A VM a move holds needs
        that move's id; a move's id names the copy that move holds (``_check_held``)."""
        vm = self.get(name)
        async with self.lock(name):
            _still_here(self, name, vm)  # (a concurrent delete got there first)
            _check_held(vm, move_id)
            if vm.state == "incoming":
                await self.incoming.abort_vm(vm)
                return
            try:  # (an agent killed from here on: the next one finishes the delete)
                self._set_mark(vm, DELETE_MARK)
            except OSError as exc:  # a full disk must not keep a VM (and its files) from going
                log.warning("vm %s: its delete mark could not be written (%s); it is deleted all the same",
                            name, exc)
            try:
                self.metering.stop(name)
                await self.backend.stop(_bare_spec(self, vm))
            except Exception:
                with contextlib.suppress(OSError):  # not deleted: it is as it was (the monitor sees it)
                    self._clear_mark(vm, DELETE_MARK)
                raise
            self.transition(vm, "deleted")  # (its dir, the mark with it, goes)
        self._locks.pop(name, None)

    async def claim(self, name: str, req: ClaimRequest) -> Vm:
        """Give a running standby VM its entry, under ``req.name`` if given.

        The VM is renamed before the entry goes in, so no create or other
        claim can take the new name meanwhile; its directory stays (its
        process's command line names it). Of concurrent claims one wins and
        the others are 409. If the guest does not take the entry, the VM is
        standby under its old name again."""
        _check_entry(req.entry)
        if name in self._claiming:
            raise Conflict(f"vm {name} is being claimed")
        vm = self.get(name)
        new = req.name or name
        async with self.lock(name):
            if self.vms.get(name) is not vm:
                raise Conflict(f"vm {name} was claimed or deleted meanwhile")
            if not (vm.standby and vm.state == "running"):
                raise Conflict(f"vm {name} is {vm.state}{'' if vm.standby else ', not standby'}; "
                               "only a running standby vm can be claimed")
            if new != name and new in self.vms:
                raise VmExists(f"a vm named {new} already exists on this host")
            if new != name:
                self._check_not_damaged(new)
            self._rename(vm, new)
            self._claiming.add(name)
            delivering = _bare_spec(self, vm).vm_dir / DELIVERING  # (an agent dying in the delivery: ``load``)
            with contextlib.suppress(OSError):
                delivering.touch()
            try:
                await self.backend.deliver_entry(_bare_spec(self, vm), req.entry)
            except (BackendError, OSError) as exc:
                self._rename(vm, name)
                if isinstance(exc, EntryCutOff):
                    await self._end_cut_off(vm, str(exc))
                    raise FuseError(f"vm {name} did not take its entry: {exc}; it may hold part of it, so it "
                                    "takes no other: it is stopped (failed)", code="claim_failed") from exc
                raise FuseError(f"vm {name} did not take its entry: {exc}", code="claim_failed") from exc
            finally:
                self._claiming.discard(name)
                with contextlib.suppress(OSError):
                    delivering.unlink(missing_ok=True)
            vm.standby, vm.ready, vm.entry = False, False, req.entry
            vm.history.append({"state": "running", "time": now().isoformat(), "claimed_from": name})
            self.save(vm)
            # Its process, and so its metering segment, carries on under the new name.
            if seg := self.metering._open_segment(name):
                seg["vm"] = new
                self.metering.persist()
            self.events.emit("vm_claimed", vm=new, previous_name=name)
        return vm

    async def _end_cut_off(self, vm: Vm, why: str) -> None:
        """Stop a standby VM whose entry's delivery was cut off (``EntryCutOff``): its guest may
        hold part of that line, which the next entry would be appended to. ``failed``, saying so
        (a prewarm's refill deletes it and boots another)."""
        self.metering.stop(vm.name)
        with contextlib.suppress(BackendError, OSError):
            await self.backend.stop(_bare_spec(self, vm))
        pid, vm.pid = vm.pid, None
        if pid is not None and not reap(pid):
            self._unreaped.add(pid)
        vm.standby = vm.ready = False
        with contextlib.suppress(OSError):
            self.transition(vm, "failed", f"its entry's delivery was cut off ({why}): a standby VM that may "
                                          "hold part of an entry takes no other")

    def check_free(self, name: str) -> None:
        """VmExists unless ``name`` is free here: no VM has it, and no claim in flight may give
        it back (a claim renames its standby VM before the entry goes in; one that fails puts
        it back under this name, over whatever took it meanwhile: a VM created there lost its
        record, its QEMU left running unlisted)."""
        if name in self.vms:
            raise VmExists(f"a vm named {name} already exists on this host")
        if name in self._claiming:
            raise VmExists(f"a vm named {name} is being claimed on this host (its name is free once "
                           "the claim has its entry in)")
        self._check_not_damaged(name)

    def _check_not_damaged(self, name: str) -> None:
        """Conflict while ``vms/<name>`` holds a damaged record: a VM made there would write over
        that VM's files (a sleeping one's memory), and a mended record would name two VMs."""
        if (kept := self._damaged_record(name)) is not None:
            raise Conflict(f"vms/{name} on this host holds the damaged record of a vm of that name "
                           f"({kept.name}) with whatever files it left (a sleeping vm's memory; a hypervisor "
                           f"may still run there): mend the record back to vm.json and restart the agent, "
                           f"or remove the dir (and stop its hypervisor), to free the name")

    def _damaged_record(self, d: str) -> Path | None:
        """The damaged record ``vms/<d>`` holds where no VM's record is (``_put_aside``), or None."""
        if any((v.dir or v.name) == d for v in self.vms.values()):
            return None
        path = self.root / d
        if d in self._unreadable and (path / "vm.json").exists():
            return path / "vm.json"
        return max(path.glob(DAMAGED + "*"), default=None)

    def _put_aside(self, path: Path, exc: Exception) -> None:
        """Keep aside a VM record ``start`` cannot read (torn by a crash, say), loudly and once:
        skipped without a word, its VM's running hypervisor was killed as an orphan and its dir
        (a sleeping VM's memory) was written over by the next create of its name."""
        d = path.parent.name
        why = f"its record could not be read ({' '.join(str(exc).split())[:300]})"
        aside = path.with_name(f"{DAMAGED}{int(time.time())}")
        try:
            os.replace(path, aside)
        except OSError as not_moved:
            self._unreadable.add(d)  # (found again by the next start, and reported again)
            aside, why = path, f"{why}; it could not be put aside ({not_moved})"
        log.error("vm %s: %s; kept as %s with its dir as it is (its hypervisor, if any, runs on); a vm of that "
                  "name cannot be made here until the record is mended or the dir removed", d, why, aside)
        self.events.emit("vm_record_damaged", vm=d, path=str(aside), reason=why)

    def _rename(self, vm: Vm, to: str) -> None:
        """Re-key ``vm`` and its lock under name ``to`` (``vm.dir`` keeps its files)."""
        self.vms[to] = self.vms.pop(vm.name)
        if (lock := self._locks.pop(vm.name, None)) is not None:
            self._locks[to] = lock
        vm.name = to

    async def sleep(self, name: str, move_id: str | None = None) -> Vm:
        """Write the VM's memory and device state to files and stop its
        process. sleeping -> sleeping is no transition, so sleeping a sleeping
        VM is 409 ``conflict`` -- except for a move (``move_id``): a sleeping
        VM's move starts by marking it this way, and a repeated call for the
        same move answers as the first did. A VM whose process ended before
        the monitor noticed (its guest powered off) is recorded as ended, as
        the monitor would, and the sleep is 409 as for any ended VM. A hypervisor
        that does not answer (stopped, hung) fails the sleep within the backend's
        deadlines, 500 ``sleep_failed``, and the VM stays running: a delete
        queued behind it on this VM's lock waits that long, not for ever."""
        vm = self.get(name)
        async with self.lock(name):
            _still_here(self, name, vm)
            _check_mark(vm, move_id)  # (an incoming VM is its move's, as a sleeping one is)
            if vm.state == "sleeping":
                if not move_id:
                    raise Conflict(f"vm {name} is already sleeping; only a running vm can sleep")
                if move_id != vm.move_id:
                    # It held no room asleep and a failed move leaves it asleep
                    # here, so marking reserves nothing.
                    moved = await asyncio.to_thread(_console_for_move, _bare_spec(self, vm))
                    vm.files = [f for f in vm.files if f.name != MOVED_CONSOLE] + moved
                    vm.move_id, vm.move_role = move_id, "source"
                    self.save(vm)
                    self.events.emit("vm_marked", vm=name, move_id=move_id)
                return vm
            # (not TRANSITIONS: incoming -> sleeping is an install's; a sleep of an incoming VM
            # went on to find no process and recorded a VM that never ran as ended)
            if vm.state != "running":
                raise Conflict(f"vm {name} is {vm.state}; only a running vm can sleep")
            if vm.standby:  # a move (it starts with a sleep) would land it as a vm with no entry
                raise Conflict(f"vm {name} is standby (waiting for its entry); claim or delete it")
            # A sleep reads no bundle file, but a wake does: a plain sleep of a VM whose bundle is
            # gone (or not this fuse's) is refused as before, as nothing could wake it here; a
            # move's goes on — its target wakes it with its own bundle (refused, a host could not be
            # drained to one with a good bundle; a move that fails after it leaves the VM asleep
            # here until the bundle is back)
            spec = self.spec(vm) if not move_id else _bare_spec(self, vm)
            self.metering.sample(name)
            try:
                self._set_mark(vm, SLEEP_MARK, {"move_id": move_id})
            except OSError as exc:  # (a full disk: the VM runs on, as after any failed sleep)
                raise FuseError(f"vm {name} could not sleep: {exc}", code="sleep_failed") from exc
            try:
                if self.backend.pid(spec) is None:
                    raise BackendError(f"vm {name} has no running process")
                names = await self.backend.sleep(spec)
            except BackendError as exc:
                self._clear_mark(vm, SLEEP_MARK)
                if self.backend.pid(spec) is None:
                    # Its guest powered off before the monitor noticed (or during the
                    # sleep): it ended as the monitor would record it, and an ended VM
                    # cannot sleep.
                    self._ended(vm)
                    raise Conflict(f"vm {name} is {vm.state}; only a running vm can sleep") from exc
                raise FuseError(f"vm {name} could not sleep: {exc}{_disk_short(spec.state_dir, vm.shape.mem_mib)}",
                                code="sleep_failed") from exc
            self.metering.stop(name)
            vm.files = await asyncio.to_thread(lambda: [_describe(spec.state_dir / f) for f in names])
            self.metering.state_written(name, sum(f.size for f in vm.files), created_at=_created(vm))
            if move_id:  # its serial log goes with it: the target's carries on from it
                vm.files += await asyncio.to_thread(_console_for_move, spec)
            vm.move_id, vm.pid = move_id, None
            vm.move_role, vm.return_room = ("source", True) if move_id else (None, False)
            self.transition(vm, "sleeping")  # (made even if the disk refuses it: ``DONE_BEFORE_RECORDED``)
            if name not in self._unwritten:  # (unwritten, its mark says it sleeps)
                self._clear_mark(vm, SLEEP_MARK)
        return vm

    async def wake(self, name: str, move_id: str | None = None, clear_mark: bool = False,
                   if_marked: bool = False) -> Vm:
        """Resume a sleeping VM from its files (a marked VM only for its own
        move); or, with ``clear_mark``, just drop the mark (a sleeping VM's: an incoming
        one is its move's to install or abort). ``if_marked``: only
        a VM ``move_id`` holds (a move bringing it home), else it stays as it is.
        running -> running is no transition: waking a running VM is 409
        ``conflict``, except for a move's call (``move_id``), which a retried
        wake of the move's target must find done, not refused."""
        vm = self.get(name)
        async with self.lock(name):
            _still_here(self, name, vm)
            if if_marked and (not move_id or vm.move_id != move_id):
                return vm
            _check_mark(vm, move_id)
            if clear_mark:
                if vm.move_id and vm.state != "sleeping":
                    # An incoming copy's mark is its move's entry: dropped, the move could no
                    # longer be aborted and its entry held its disk promise until a restart.
                    raise Conflict(f"vm {name} is {vm.state}; only a sleeping vm's mark can be cleared "
                                   f"(abort the move: DELETE /v1/host/incoming/{vm.move_id})")
                if vm.move_id:
                    vm.move_id = vm.move_role = None
                    # an ordinary sleeping vm again: its room is free (an arrived copy's too)
                    vm.return_room = vm.reserved = False
                    self.save(vm)
                    self.events.emit("vm_unmarked", vm=name, move_id=move_id)
                return vm
            if vm.state == "running":
                if move_id:
                    return vm
                raise Conflict(f"vm {name} is already running; only a sleeping vm can wake")
            if vm.state != "sleeping":
                raise Conflict(f"vm {name} is {vm.state}; only a sleeping vm can wake")
            if not (vm.reserved or vm.return_room):
                async with self.admit_lock:
                    if reason := self.admission(vm.shape.mem_mib):
                        raise self.refuse(reason, name)
                    vm.reserved = True  # counted from here, so no create takes the room
            asleep = vm.files, vm.move_id, vm.move_role, vm.return_room
            try:
                spec = self.spec(vm)  # (its bundle gone: 500 bundle_missing)
                self._set_mark(vm, WAKE_MARK)
                vm.pid = await self.backend.wake(spec)
                vm.files, vm.move_id, vm.move_role = [], None, None
                vm.reserved = vm.return_room = False
                try:
                    self.transition(vm, "running")
                except OSError as exc:
                    # Its record cannot say it runs (a full disk): its hypervisor goes, and it sleeps
                    # on as it was, its files, move and room kept. (Left running behind a record that
                    # said sleeping, the next wake ran its guest twice; a move's target, its move id
                    # dropped, could not be aborted, and the source's rollback ran it on both hosts.)
                    vm.files, vm.move_id, vm.move_role, vm.return_room = asleep
                    vm.pid = None
                    await self.backend.stop(spec)
                    raise FuseError(f"vm {name} could not wake: its record could not be written ({exc}); "
                                    "it sleeps on as it was", code="wake_failed") from exc
            except (BackendError, OSError, FuseError) as exc:
                with contextlib.suppress(OSError):
                    self._clear_mark(vm, WAKE_MARK)
                vm.reserved = vm.move_role == "target"  # an arrived copy keeps its room
                if isinstance(exc, FuseError):
                    raise
                raise FuseError(f"vm {name} could not wake: {exc}", code="wake_failed") from exc
            self.metering.start(name, vm.shape.mem_mib, vm.pid, created_at=_created(vm))
            # Stale once the record says the guest runs on, not before: an agent
            # killed until then leaves a VM the next one can still wake.
            shutil.rmtree(spec.state_dir, ignore_errors=True)
            self._clear_mark(vm, WAKE_MARK)
        return vm

    def _set_mark(self, vm: Vm, mark: str, data: dict[str, Any] | None = None) -> None:
        path = self.vm_dir(vm.name) / mark
        tmp = path.with_suffix(".tmp")
        try:
            with open(tmp, "w", opener=private_opener) as f:
                json.dump(data or {}, f)
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def _clear_mark(self, vm: Vm, mark: str) -> None:
        (self.vm_dir(vm.name) / mark).unlink(missing_ok=True)

    def _mark(self, vm: Vm, mark: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.vm_dir(vm.name) / mark).read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            return {}  # cut short by the crash: the mark stands, its details are lost

    def console(self, name: str, offset: int = 0, limit: int = CONSOLE_CHUNK) -> dict[str, Any]:
        """Serial output from byte ``offset``; ``next_offset`` continues it. Offsets count
        every byte the guest printed, the ones a cut dropped included (``_cap_console``), so
        they only grow: a reader continues at the same byte in the part kept, or at the cut's
        notice (``offset`` says where it starts then) when what it had still to read went."""
        vm = self.get(name)
        if offset < 0:
            raise InvalidArgument("offset must be >= 0")
        path = self.vm_dir(vm.name) / "console.log"
        shift, notice = _console_shift(path)  # (the file's byte p is the stream's byte p + shift)
        data = b""
        size = at = 0
        with contextlib.suppress(FileNotFoundError), open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            # an offset past the end (a stale one) continues from the end, not beyond it,
            # so the output still to come is not skipped
            at = min(max(offset - shift, 0), size) if offset - shift >= notice else 0
            f.seek(at)  # (seeking far past the end fails or overflows on some file systems)
            data = f.read(limit)
        offset = at + shift if size else min(offset, shift)
        # Never split a UTF-8 character across two reads.
        cut = len(data)
        while cut > 0 and cut > len(data) - 4:
            try:
                text = data[:cut].decode()
                break
            except UnicodeDecodeError:
                cut -= 1
        else:
            text, cut = data.decode(errors="replace"), len(data)
        return {"text": text, "offset": offset, "next_offset": offset + cut}

    def state_files(self, name: str) -> list[StateFile]:
        """A sleeping VM's state files (sizes and SHA-256 taken at sleep)."""
        vm = self.get(name)
        if vm.state != "sleeping":
            raise Conflict(f"vm {name} is {vm.state}; only a sleeping vm has state files")
        return vm.files

    def state_file(self, name: str, file: str) -> Path:
        if file not in {f.name for f in self.state_files(name)}:
            raise NotFound(f"vm {name} has no state file {file}")
        return self.vm_dir(name) / "state" / file

    # -- watching and adoption -------------------------------------------------

    async def start(self) -> None:
        """Load every record (one that cannot be read is kept aside: ``_put_aside``), finish
        a delete the last agent died in (``_finish_delete``) and adopt what still runs (side by
        side; a VM whose hypervisor does not answer in time is adopted with a
        ``vm_adopt_warning``); then watch."""
        for path in sorted(self.root.glob("*/vm.json")):
            try:
                vm = Vm.model_validate_json(path.read_text())
            except (OSError, ValueError) as exc:
                self._put_aside(path, exc)
                continue
            self.vms[vm.name] = vm
            # Usage rows are per VM, not per name: metering an older agent keyed by name alone
            # (a process's start is read in clock ticks: a second's slack)
            self.metering.identify(vm.name, _created(vm), since=vm.created_at.timestamp() - 1.0)
        for vm in list(self.vms.values()):
            if (self.vm_dir(vm.name) / DELETE_MARK).exists():
                await self._finish_delete(vm)
        self.incoming.load()
        for vm in list(self.vms.values()):
            self._settle_interrupted(vm)
        adopting: list[Vm] = []
        for vm in list(self.vms.values()):
            if vm.state in ("creating", "running"):
                if pid := self.backend.pid(_bare_spec(self, vm)):
                    vm.pid = pid
                    _resume_after_cut(pid, self.vm_dir(vm.name) / TRIMMING)  # (the last agent died in one)
                    adopting.append(vm)
                else:
                    self._ended(vm, while_down=True)
        # Side by side, each bounded by the backend (its QMP deadlines): a hung
        # hypervisor costs the agent's start that bound once, not the whole host
        # (it is adopted with a warning: its process is watched as any other).
        async def adopt(vm: Vm) -> None:
            if (take_over := getattr(self.backend, "adopt", None)) is not None:
                await take_over(_bare_spec(self, vm))
        for vm in list(adopting):  # (the last agent died while it delivered an entry to one: ``claim``)
            if vm.standby and (marker := _bare_spec(self, vm).vm_dir / DELIVERING).exists():
                adopting.remove(vm)
                await self._end_cut_off(vm, "the agent stopped during it")
                marker.unlink(missing_ok=True)
        outcomes = await asyncio.gather(*(adopt(vm) for vm in adopting), return_exceptions=True)
        for vm, outcome in zip(adopting, outcomes):
            if isinstance(outcome, (BackendError, OSError)):
                self.events.emit("vm_adopt_warning", vm=vm.name, reason=str(outcome))
            elif isinstance(outcome, BaseException):
                raise outcome
            if vm.state == "creating":
                self.transition(vm, "running", "adopted after agent restart")
            self.events.emit("vm_adopted", vm=vm.name, pid=vm.pid)
            if self.metering._open_segment(vm.name) is None:
                # The agent died before its segment opened (mid-boot): it is
                # metered from its process's start all the same.
                began = process_started(vm.pid) or vm.created_at.timestamp()
                self.metering.start(vm.name, vm.shape.mem_mib, vm.pid, now=began, created_at=_created(vm))
        await self._sweep_orphans()
        b = self.bundle("linux")
        if isinstance(b, bundles.Bundle):
            await self._settle_accel(b)
        self._monitor = asyncio.create_task(self._watch())

    async def _finish_delete(self, vm: Vm) -> None:
        """Finish the delete the last agent died in (its mark in the VM's dir): its hypervisor,
        if it still runs, stopped, the VM deleted as the delete would have (read as failed, it
        came back as a VM its owner had deleted). Metered to when the delete began, or later
        if its process was seen alive after (``Metering.stop``)."""
        mark = self.vm_dir(vm.name) / DELETE_MARK
        try:
            began: float | None = mark.stat().st_mtime
        except OSError:
            began = None
        self.metering.stop(vm.name, now=began)
        try:
            await self.backend.stop(_bare_spec(self, vm))
        except (BackendError, OSError) as exc:  # (not stopped: it stays, its mark with it, for a delete)
            log.warning("vm %s: the delete the last agent began could not stop it (%s)", vm.name, exc)
            return
        self.transition(vm, "deleted", "its delete finished when the agent restarted")
        self._locks.pop(vm.name, None)

    def _settle_interrupted(self, vm: Vm) -> None:
        """Finish, from what is on disk, a sleep or wake the last agent died in.

        A wake's QEMU still running is the VM woken: recorded running here and
        adopted as any running VM (not killed as an orphan); gone, the VM
        sleeps on, its state files kept until a running record existed. A
        sleep whose QEMU is gone and whose state files are complete (renamed
        from ``.partial`` once QEMU had written all of it) is the VM asleep; QEMU
        still running, it is adopted and runs on (any state written is dropped:
        the guest moves on from it); neither, it ended as any VM whose process is
        gone."""
        spec = _bare_spec(self, vm)
        if self._mark(vm, WAKE_MARK) is not None:
            if vm.state == "sleeping" and (pid := self.backend.pid(spec)):
                vm.pid, vm.files, vm.move_id, vm.move_role = pid, [], None, None
                vm.reserved = vm.return_room = False
                self.transition(vm, "running", "woken when the agent restarted")
            if vm.state == "running":
                shutil.rmtree(spec.state_dir, ignore_errors=True)
            self._clear_mark(vm, WAKE_MARK)
        if (sleeping := self._mark(vm, SLEEP_MARK)) is not None:
            if vm.state == "running" and self.backend.pid(spec) is not None:
                shutil.rmtree(spec.state_dir, ignore_errors=True)
            elif vm.state == "running":
                for partial in spec.state_dir.glob("*.partial"):
                    partial.unlink(missing_ok=True)
                saved = sorted(p for p in spec.state_dir.glob("*") if p.is_file()) \
                    if spec.state_dir.is_dir() else []
                if saved:
                    self._slept(vm, saved, sleeping.get("move_id"))
            if vm.name not in self._unwritten:  # (its record unwritten, the mark still says it sleeps)
                self._clear_mark(vm, SLEEP_MARK)

    def _slept(self, vm: Vm, saved: list[Path], move_id: str | None) -> None:
        """Record as asleep a VM whose sleep finished as its agent died."""
        saved = [p for p in saved if p.name != MOVED_CONSOLE] or saved  # (its state; the log is copied anew)
        written = max(p.stat().st_mtime for p in saved)  # (when the sleep ended: not this restart)
        self.metering.stop(vm.name, now=written)
        vm.files = [_describe(p) for p in saved]
        # metered at the time it was written, once (it was counted twice when the agent died after
        # it metered the write and before it recorded the VM asleep)
        self.metering.state_written_once(vm.name, sum(f.size for f in vm.files), written, _created(vm))
        if move_id:  # (as the sleep would have: its serial log goes with it)
            vm.files += _console_for_move(_bare_spec(self, vm))
        vm.move_id, vm.pid = move_id, None
        vm.move_role, vm.return_room = ("source", True) if move_id else (None, False)
        self.transition(vm, "sleeping", "its sleep finished as the agent died")

    async def _sweep_orphans(self) -> None:
        """Kill hypervisor processes under our VM dirs that no running
        record accounts for (e.g. a crash between killing a VM and writing
        its record): nothing may hold memory that admission cannot see. One
        under a dir whose record is damaged is left running (``_put_aside``).
        Ours only (`hypervisors_naming`): not another agent's whose dir's path
        ends with ours, nor a containerised agent's at the same path."""
        root = str(self.root)
        by_dir = {v.dir or v.name: v for v in self.vms.values()}
        for pid, paths in hypervisors_naming(root).items():
            dirs = [p[len(root) + 1:].split("/", 1)[0] for p in paths if p.startswith(root + "/")]
            dirs = [d for d in dirs if d not in ("", ".", "..")]
            if not dirs:
                continue  # (it names the vms dir itself, no VM's)
            d = dirs[0]
            vm = by_dir.get(d)
            if vm is None and (kept := self._damaged_record(d)) is not None:
                # no record accounts for it because its record is damaged, not gone: whose VM it
                # runs and whether to stop it is for whoever mends or removes the record
                log.warning("vm %s: hypervisor %s left running: its record is damaged (%s)", d, pid, kept)
                continue
            if vm is None or vm.state not in ("creating", "running") or vm.pid != pid:
                await kill_and_wait(pid, str(self.root / d))
                if vm is None:
                    self.metering.stop(d)  # its segment, if it had one, ends with it
                self.events.emit("orphan_killed", vm=vm.name if vm else d, pid=pid)

    async def close(self) -> None:
        """Stop watching. VMs keep running; the next agent adopts them."""
        if self._monitor:
            await cancel_and_wait([self._monitor])
        for vm in self.vms.values():
            if vm.state == "running":
                self.metering.sample(vm.name)
        self.metering.persist()
        self.events.close()

    async def _settle_accel(self, b: bundles.Bundle) -> None:
        probe = getattr(self.backend, "probe_accel", None)
        if probe is not None:
            self.kvm_device = probe_mod.kvm_device_answers()
            await probe(b, self.kvm_device)

    async def _watch(self) -> None:
        """Notice VMs whose process ended, standby VMs ready, and take CPU readings, every
        MONITOR_INTERVAL. A step that fails (a full disk refusing a record) is tried again
        on the next tick: the watch itself never ends but with the agent."""
        ticks = 0
        failing: set[str] = set()  # (logged once while a step keeps failing)
        while True:
            await asyncio.sleep(MONITOR_INTERVAL)
            ticks += 1
            self._unreaped = {pid for pid in self._unreaped if not reap(pid)}
            for vm in list(self.vms.values()):
                try:
                    self._watch_one(vm, ticks)
                    failing.discard(vm.name)
                except Exception as exc:  # noqa: BLE001 (one VM's failed step stops no watching)
                    if vm.name not in failing:
                        log.warning("vm %s: the monitor's step failed (%s: %s); it is tried again",
                                    vm.name, type(exc).__name__, exc)
                    failing.add(vm.name)
            if ticks % 10 == 0 and self.metering._dirty:
                self.metering.persist()  # (figures a full disk refused, with no VM running to save them)
            if ticks % 10 == 0:
                self._write_unwritten()

    def _write_unwritten(self) -> None:
        """Write the records the disk refused (``DONE_BEFORE_RECORDED``), where it has room."""
        for name in list(self._unwritten):
            vm = self.vms.get(name)
            if vm is None:
                self._unwritten.discard(name)
            elif not self.lock(name).locked():  # (a wake or delete under way writes or removes it)
                with contextlib.suppress(OSError):
                    self.save(vm)

    def _cap_console(self, vm: Vm) -> None:
        """Cut a running VM's ``console.log`` back to its last half of ``console_max`` once it
        is past it (one guest printing without pause filled the host's disk, and every other
        VM's sleep and create failed with it). QEMU appends (``append=on``), so it writes on at
        the new end; the cut starts at a line, says how much went, and is a ``console_trimmed``
        event. Offsets go on across it (``console``)."""
        path = self.vm_dir(vm.name) / "console.log"
        try:
            if path.stat().st_size <= self.console_max:
                return
            # The hypervisor is stopped (SIGSTOP, all its threads, the guest's vCPUs with them)
            # while the file is emptied and written: running, what it printed between the read and
            # the cut was lost, and what it printed between the cut and the notice came before the
            # notice. The tail is read first, running; stopped, only what it printed since.
            with open(path, "rb") as f:
                first = f.seek(0, os.SEEK_END)
                f.seek(first - self.console_max // 2)
                tail = f.read(first - f.tell())
            with _hypervisor_stopped(vm.pid, self.vm_dir(vm.name) / TRIMMING) as stopped:
                if not stopped:
                    return  # (a thread still in the kernel, or stopped by someone else: a later tick)
                with open(path, "rb") as f:
                    f.seek(first)
                    tail += f.read()
                size = path.stat().st_size
                if 0 <= (nl := tail.find(b"\n")) < len(tail) - 1:
                    tail = tail[nl + 1:]
                dropped = size - len(tail)
                # the stream's offsets go on: the kept part's first byte keeps its offset, which the
                # notice names (so the log carries it: a move or a restart keeps the offsets)
                start = _console_shift(path)[0] + dropped
                notice = (f"[fuse: {dropped} bytes of earlier console output dropped: past FUSE_CONSOLE_MAX_MB "
                          f"the log keeps its last {len(tail)} bytes, from byte {start} of the output]\r\n").encode()
                os.truncate(path, 0)
                with open(path, "ab") as f:
                    f.write(notice + tail)
        except OSError:
            return
        self.events.emit("console_trimmed", vm=vm.name, dropped_bytes=dropped)

    def _watch_one(self, vm: Vm, ticks: int) -> None:
        if vm.state != "running" or self.lock(vm.name).locked():
            return  # a sleep/delete in progress owns the process
        if self.backend.pid(_bare_spec(self, vm)) is None:
            self._ended(vm)
            return
        if vm.standby and not vm.ready:
            self._check_ready(vm)
        if ticks % 20 == 0:
            self._cap_console(vm)
        if ticks % 5 == 0:  # twice a second: the reading an exit leaves is at most
            # 0.5 s old, persisted at most PERSIST_S later (fuse.agent.metering)
            self.metering.sample(vm.name)

    def _check_ready(self, vm: Vm) -> None:
        """A standby VM is ready once its guest printed the standby mark (the
        controller counts only those as a prewarm's ready VMs)."""
        try:
            with open(self.vm_dir(vm.name) / "console.log", "rb") as fh:
                seen = STANDBY_MARK in fh.read(1 << 20)
        except OSError:
            return
        if seen:
            vm.ready = True
            self.save(vm)
            self.events.emit("vm_ready", vm=vm.name)

    def _ended(self, vm: Vm, while_down: bool = False) -> None:
        """The VM's process is gone without us stopping it: just now, or ``while_down``
        (found gone by an agent starting). A guest that reported its exit ended when its
        console was last written; one that did not, found gone, when it was last known
        alive (fuse.agent.metering), not when this agent came to see it gone."""
        console = self.vm_dir(vm.name) / "console.log"
        status = _exit_status(console, vm.platform.get("exit_nonce"))
        written = None
        with contextlib.suppress(OSError):
            written = min(console.stat().st_mtime, time.time())
        end = None
        if status is not None:
            end = written
        elif while_down:
            known = [t for t in (self.metering.last_seen(vm.name), written) if t is not None]
            end = max(known) if known else None
        self.metering.stop(vm.name, now=end)
        if not reap(vm.pid):  # (its last threads still ending: collected on a later tick)
            self._unreaped.add(vm.pid)
        pid, vm.pid = vm.pid, None
        with contextlib.suppress(OSError):
            self.backend.ended(_bare_spec(self, vm))
        try:
            if status is None:
                why = "agent restarted during boot" if vm.state == "creating" else \
                    "the hypervisor process ended without the guest reporting an exit status"
                self.transition(vm, "failed", why)
            else:
                vm.exit_status = status
                self.transition(vm, "exited")
        except OSError:
            vm.pid = pid  # not recorded (a full disk): the monitor finds it ended again
            raise


def unrecorded(name: str, exc: OSError) -> FuseError:
    """The refusal of a create whose record cannot be written: a full disk is the host
    full (409 ``host_full``: a controller tries another host), any other write error 500."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return HostFull(f"no room on this host's disk for vm {name}'s files ({exc.strerror})")
    return FuseError(f"vm {name} could not be recorded on this host's disk: {exc}", code="io_error")




def _created(vm: Vm) -> str:
    """``vm.created_at`` as its record shows it (``GET /v1/host/vms``): with
    the name, what tells a VM from an earlier one of the same name."""
    return vm.model_dump(mode="json", include={"created_at"})["created_at"]


def _disk_short(state_dir: Path, mem_mib: int) -> str:
    """Why a failed sleep may have failed, when the disk may be the cause: its state file
    (up to the VM's memory) may not have fit what is free. The hypervisor says only that its
    write failed ("Broken pipe")."""
    try:
        free = shutil.disk_usage(state_dir if state_dir.exists() else state_dir.parent).free // 2**20
    except OSError:
        return ""
    if free >= mem_mib:
        return ""
    return f" (the host's disk may be full: {free} MiB free, and its state takes up to its {mem_mib} MiB of memory)"


def _still_here(vms: VmManager, name: str, vm: Vm) -> None:
    """404 when a delete queued ahead on the VM's lock removed it (not 409 "vm is deleted":
    a state no caller can read, which said the VM still existed)."""
    if vms.vms.get(name) is not vm:
        raise NotFound(f"no vm named {name} on this host")


def _holds_memory(vm: Vm) -> bool:
    return vm.state in HOLDS_MEMORY or (vm.state == "sleeping" and (vm.reserved or vm.return_room))


def _console_for_move(spec: BootSpec) -> list[StateFile]:
    """A copy of the VM's serial log beside its state files, for a move to take along (a
    moved VM's console showed only what it printed on its new host), described as they
    are; none when it has no log or an empty one (a guest moved before it printed a byte:
    a target takes no empty file, and there is nothing to keep). The VM is asleep (its
    hypervisor has ended), so a copy the disk has no room for is left out (logged) rather
    than failing: a sleep's left the VM recorded running with no process (its move `failed`),
    an agent restart's ended the agent's start."""
    copy = spec.state_dir / MOVED_CONSOLE
    try:
        private_file(copy)  # (owner-only whatever the umask, as every agent state file: copyfile keeps its mode)
        shutil.copyfile(spec.console, copy)
    except FileNotFoundError:
        copy.unlink(missing_ok=True)
        return []
    except OSError as exc:
        copy.unlink(missing_ok=True)
        log.warning("vm %s: its console log is not taken along by its move (%s)", spec.name, exc)
        return []
    if copy.stat().st_size == 0:
        copy.unlink()
        return []
    return [_describe(copy)]


def _check_entry(entry: str) -> None:
    if len(entry.encode()) > MAX_ENTRY_BYTES:
        raise InvalidArgument(f"entry is longer than {MAX_ENTRY_BYTES} bytes")


def _check_mark(vm: Vm, move_id: str | None) -> None:
    if vm.move_id and vm.move_id != move_id:
        raise Conflict(f"vm {vm.name} is held by move {vm.move_id}", code="move_in_progress")


def _check_held(vm: Vm, move_id: str | None) -> None:
    """For a delete: ``_check_mark``, and a move's delete (``move_id``) of a VM no move holds is
    404: the copy that move held is gone (a controller's retried removal of a done move's source
    copy, its first reply lost, takes it as done), and the VM of that name here now (moved back
    since, say) is not that copy, so it stays."""
    _check_mark(vm, move_id)
    if move_id and not vm.move_id:
        raise NotFound(f"vm {vm.name} on this host is not held by move {move_id}: that move's copy is gone")


def _bare_spec(mgr: VmManager, vm: Vm) -> BootSpec:
    """A spec good enough to find (pid, sockets) a VM whose bundle may be gone."""
    return BootSpec(name=vm.name, vm_dir=mgr.vm_dir(vm.name), vcpus=vm.shape.vcpus,
                    mem_mib=vm.shape.mem_mib, entry=vm.entry, kernel=Path("/"), initrd=Path("/"),
                    platform=vm.platform)


def _describe(path: Path) -> StateFile:
    return StateFile(name=path.name, size=path.stat().st_size, sha256=bundles.sha256_file(path))


def _exit_status(console: Path, nonce: str | None = None) -> int | None:
    """The exit status the guest's init reported on ``console``: its mark with ``nonce``
    (the VM's own boot's), or any mark for a VM created before nonces."""
    try:
        with open(console, "rb") as f:
            f.seek(max(0, console.stat().st_size - 65536))
            tail = f.read()
    except OSError:
        return None
    mark = (re.compile(rb"^FUSE-EXIT (\d+) " + re.escape(nonce.encode()) + rb"\r?$", re.M)
            if nonce else _EXIT_MARK)
    marks = mark.findall(tail)
    return int(marks[-1]) if marks else None


@contextlib.contextmanager
def _hypervisor_stopped(pid: int | None, marker: Path):
    """Yield True once every thread of ``pid`` is stopped (SIGSTOP; SIGCONT after), so
    nothing it writes lands mid-way; False when it did not stop within ``STOP_WAIT_S`` (it
    is continued at once) or there is no process. ``marker`` stays in its dir while it is
    stopped, so an agent that died meanwhile has the next one continue it
    (``_resume_after_cut``)."""
    if not pid or _process_state(pid) in ("T", "t", ""):
        yield False  # (none, or stopped by someone else: theirs to continue, not this cut's)
        return
    marker.write_text(str(pid))
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        marker.unlink(missing_ok=True)
        yield False
        return
    try:
        yield _all_stopped(pid, time.monotonic() + STOP_WAIT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        marker.unlink(missing_ok=True)


def _process_state(pid: int) -> str:
    """The state letter of ``pid``'s main thread ("" when it is gone)."""
    return _state(Path(f"/proc/{pid}/stat"))


def _state(stat: Path) -> str:
    """The state letter in a /proc ``stat`` file (after the parenthesised name), "" when unread."""
    try:
        return stat.read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def _all_stopped(pid: int, until: float) -> bool:
    """Every thread of ``pid`` in the stopped state (a write in flight finishes first)."""
    tasks = Path(f"/proc/{pid}/task")
    while True:
        try:
            states = [_state(t / "stat") for t in tasks.iterdir()]
        except OSError:
            states = []
        if states and all(st in ("T", "t") for st in states):  # ("": a thread that ended: read again)
            return True
        if time.monotonic() >= until:
            return False
        time.sleep(0.001)


def _resume_after_cut(pid: int, marker: Path) -> None:
    """Continue a hypervisor the last agent stopped for a console cut and died before
    continuing (its marker names the pid)."""
    try:
        stopped = int(marker.read_text() or 0)
    except (OSError, ValueError):
        return
    if stopped == pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    marker.unlink(missing_ok=True)


_NOTICE = re.compile(rb"\[fuse: \d+ bytes of earlier console output dropped: [^\r\n]*? from byte (\d+) of the "
                     rb"output\]\r\n")


def _console_shift(console: Path) -> tuple[int, int]:
    """(shift, notice length) of a console log's last cut, read from its first line (the cut's
    notice names the output's byte the kept part starts at): the file's byte p is the output's
    byte p + shift, and its first ``notice`` bytes are the notice. (0, 0) for a log never cut."""
    try:
        with open(console, "rb") as f:
            head = f.read(512)
    except OSError:
        return 0, 0
    m = _NOTICE.match(head)
    return (int(m.group(1)) - m.end(), m.end()) if m else (0, 0)

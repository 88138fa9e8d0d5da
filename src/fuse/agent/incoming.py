"""The receiving side of a move: reserve room, take files by range, verify,
install as a sleeping VM.

    POST   /v1/host/incoming                    begin: admission (memory, disk) + reservation
    PUT    /v1/host/incoming/{move}/files/{f}   bytes at an offset (any order;
                                                or the bulk protocol, ``bulk``)
    POST   /v1/host/incoming/{move}/verify      sizes and SHA-256 as received
    POST   /v1/host/incoming/{move}/install     SHA-256 check -> sleeping VM
    DELETE /v1/host/incoming/{move}             abort (idempotent)

While receiving, the VM exists in state ``incoming`` and holds its memory,
so admission counts it. Installed, it is ``sleeping``, still marked with the
move id (only that move wakes it) and still ``reserved``, so the wake that
completes the move cannot be refused for room. Entries are persisted, so a
restarted agent (or controller, via ``GET /v1/host/incoming``) can finish or
abort what was in flight.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import re
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import Conflict, FuseError, HostFull, InvalidArgument, NotFound
from ..models.vm import IncomingRequest, StateFile, Vm
from ..paths import private_dir, private_opener
from . import bundle as bundles
from .backends.base import CONSOLE, MOVED_CONSOLE

if TYPE_CHECKING:
    from .vms import VmManager

_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")  # as bundles.sha256_file writes it, so a match is possible
MAX_CHUNK = 64 * 2**20


class IncomingMoves:
    """Incoming moves of one host; works on its ``VmManager``."""

    def __init__(self, mgr: VmManager):
        self.mgr = mgr
        self.dir = mgr.state_dir / "incoming"
        self.entries: dict[str, dict[str, Any]] = {}

    def load(self) -> None:
        """Take up the moves in flight when the last agent stopped. A copy whose move
        record cannot be read (an agent crash tearing it, from before these were written
        whole) or is missing is dropped: the VM is still at its source, whose move fails
        on this target and brings it home (or was failed already)."""
        private_dir(self.dir)
        for path in sorted(self.dir.glob("*.json")):
            try:
                entry = json.loads(path.read_text())
                name, move_id = entry["name"], entry["move_id"]
            except (OSError, ValueError, KeyError, TypeError):
                path.unlink(missing_ok=True)
                continue
            vm = self.mgr.vms.get(name)
            if vm is not None and vm.state == "incoming" and vm.move_id == move_id:
                self.entries[move_id] = entry
            else:
                path.unlink()  # its VM was installed or removed before a crash
        for vm in list(self.mgr.vms.values()):
            if vm.state == "incoming" and vm.move_id not in self.entries:
                move_id = vm.move_id
                self.mgr.transition(vm, "deleted", f"move {move_id}'s record on this host was lost in a crash")
                self.mgr.events.emit("incoming_aborted", vm=vm.name, move_id=move_id,
                                     reason="its record on this host was lost in a crash: the copy is dropped")

    def _persist(self, entry: dict[str, Any]) -> None:
        private_dir(self.dir)  # (owner-only whatever the umask, as every agent state file)
        path = self.dir / f"{entry['move_id']}.json"
        tmp = path.with_suffix(".tmp")
        try:  # whole or not at all: a crash mid-write leaves the last whole record
            with open(tmp, "w", opener=private_opener) as f:
                f.write(json.dumps(entry))
            os.replace(tmp, path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise

    def _entry(self, move_id: str) -> dict[str, Any]:
        entry = self.entries.get(move_id)
        if entry is None:
            raise NotFound(f"no incoming move {move_id} on this host")
        return entry

    def _state_path(self, entry: dict[str, Any], file: str) -> Path:
        if file not in {f["name"] for f in entry["files"]}:
            raise NotFound(f"move {entry['move_id']} declared no file {file}")
        return self._path_of(entry, file)

    async def begin(self, req: IncomingRequest) -> dict[str, Any]:
        """Admit the arriving VM and reserve its memory."""
        mgr, name = self.mgr, req.vm.name
        names = [f.name for f in req.files]
        if len(set(names)) != len(names) or not all(_FILE_NAME.fullmatch(n) for n in names):
            raise InvalidArgument("file names must be unique plain names")
        for f in req.files:
            # Every backend's sleep writes only non-empty files (QEMU: state.bin; Firecracker: the
            # snapshot and memory; the fake: counter and memory.bin), and a wake needs their bytes:
            # an empty one is a broken declaration, not a VM, and would install and fail at wake.
            # The serial log so far is no state (install sets it aside, the wake never reads it):
            # a guest that has printed nothing yet has an empty one, which a source before 1bfe855
            # declares, and refusing it failed every move of a VM in its first seconds from such
            # an agent (review 37). As empty it is as good as none; its SHA-256 is still checked.
            if f.size < 0 or (f.size == 0 and f.name != MOVED_CONSOLE):
                raise InvalidArgument(f"file {f.name} declares {f.size} bytes: a sleeping vm's state files "
                                      f"are never empty")
            if not _SHA256.fullmatch(f.sha256):
                raise InvalidArgument(f"file {f.name} declares sha256 {f.sha256[:80]!r}: not 64 lowercase "
                                      f"hex digits")
        async with mgr.admit_lock:
            if (entry := self.entries.get(req.move_id)) is not None:
                if entry["name"] != name:
                    raise Conflict(f"move {req.move_id} is already bringing vm {entry['name']}")
                if entry["files"] != [f.model_dump() for f in req.files]:
                    # (answered as the first was, the sender would send and install other files
                    # than those it declared, and be refused only at install)
                    raise Conflict(f"move {req.move_id} already declared other files: "
                                   + ", ".join(f"{f['name']} ({f['size']} bytes)" for f in entry["files"]))
                return self.describe(entry)
            mgr.check_free(name)
            b = mgr.bundle(req.vm.bundle)  # as this host's backend boots it (else the wake would fail)
            if isinstance(b, str) or b.fingerprint != req.vm.bundle_fingerprint:
                have = f"fingerprint {b.fingerprint[:12]}" if not isinstance(b, str) else f"none usable ({b})"
                raise Conflict(f"bundle {req.vm.bundle} here: {have}; the vm needs fingerprint "
                               f"{req.vm.bundle_fingerprint[:12]}", code="bundle_mismatch")
            if why := mgr.backend.incompatible(req.platform):
                raise Conflict(why, code="platform_mismatch")
            if reason := mgr.admission(req.vm.shape.mem_mib):
                raise mgr.refuse(reason, name)
            if reason := self._disk_refusal(sum(f.size for f in req.files)):
                raise mgr.refuse(reason, name)
            created = req.vm.created_at or _now()
            vm = Vm(name=name, state="incoming", shape=req.vm.shape, entry=req.vm.entry, bundle=b.name,
                    bundle_fingerprint=b.fingerprint, created_at=created, platform=req.platform,
                    move_id=req.move_id, move_role="target", files=req.files,
                    history=[{"state": "incoming", "time": _now().isoformat(), "move_id": req.move_id}])
            private_dir(mgr.vm_dir(name) / "state")
            mgr.vms[name] = vm
            mgr.save(vm)
            entry = {"move_id": req.move_id, "name": name, "created_at": _now().isoformat(),
                     "files": [f.model_dump() for f in req.files]}
            self.entries[req.move_id] = entry
            self._persist(entry)
            mgr.events.emit("vm_state", vm=name, to="incoming", move_id=req.move_id)
        return self.describe(entry)

    def _disk_refusal(self, need: int) -> str | None:
        """Why the state dir's disk has no room for ``need`` more bytes, or
        None. Other moves still receiving hold what they declared and have
        not written yet (call under ``admit_lock``, as begin does)."""
        free = shutil.disk_usage(self.mgr.state_dir).free
        owed = [sum(f["size"] - _received(self._path_of(e, f["name"]), f["size"]) for f in e["files"])
                for e in self.entries.values()]
        promised = sum(owed)
        if need + promised <= free:
            return None
        others = f", {promised} of them promised to {sum(1 for n in owed if n)} other incoming move(s)" \
            if promised else ""
        return (f"disk full: the move's files need {need} bytes; the disk of {self.mgr.state_dir} "
                f"has {free} bytes free{others}")

    def _path_of(self, entry: dict[str, Any], file: str) -> Path:
        return self.mgr.vm_dir(entry["name"]) / "state" / file

    def writable(self, move_id: str, file: str, offset: int, length: int) -> Path:
        """The path to write ``length`` bytes at ``offset`` of a declared
        file (checked against its size). Every write bumps the move's
        generation, which undoes an earlier verify and one under way (it
        marks only the generation it hashed)."""
        entry, path = self.check_write(move_id, file, offset, length)
        entry["generation"] = entry.get("generation", 0) + 1
        entry.pop("verified", None)
        return path

    def check_write(self, move_id: str, file: str, offset: int, length: int) -> tuple[dict[str, Any], Path]:
        """The move's entry and the file's path, if ``length`` bytes may go at ``offset``
        of it; else the error a write would get (asked before a body is read, with the
        length the request declares: nothing is read for a move that is not here). (An HTTP
        chunk's MAX_CHUNK is ``write``'s: a bulk write streams a whole file.)"""
        entry = self._entry(move_id)
        path = self._state_path(entry, file)
        size = next(f["size"] for f in entry["files"] if f["name"] == file)
        if offset < 0 or offset + length > size:
            raise InvalidArgument(f"bytes {offset}..{offset + length} fall outside {file} ({size} bytes)")
        return entry, path

    def writing(self, move_id: str, delta: int) -> None:
        """Count writes in flight (a verify or install waits for none)."""
        if (entry := self.entries.get(move_id)) is not None:
            entry["writing"] = entry.get("writing", 0) + delta

    def _settled(self, entry: dict[str, Any]) -> None:
        if entry.get("writing"):
            raise Conflict(f"move {entry['move_id']} still has {entry['writing']} write(s) in flight",
                           code="writes_in_flight")

    async def write(self, move_id: str, file: str, offset: int, data: bytes) -> dict[str, Any]:
        """Write ``data`` at ``offset`` of a declared file."""
        if len(data) > MAX_CHUNK:
            raise InvalidArgument(f"chunks are at most {MAX_CHUNK} bytes")
        path = self.writable(move_id, file, offset, len(data))

        def _write() -> None:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                # pwrite may write only part (a disk filling up): the rest goes on, so the
                # answer's "written" is what is on disk, or the disk's refusal is the answer
                view, at = memoryview(data), offset
                while view:
                    if not (put := os.pwrite(fd, view, at)):  # (never loop on a write that takes nothing)
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    view, at = view[put:], at + put
            finally:
                os.close(fd)
        self.writing(move_id, 1)
        try:
            await asyncio.to_thread(_write)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):  # (the sender tries another host)
                raise HostFull(f"no room on this host's disk for move {move_id}'s {file} "
                               f"({exc.strerror})") from exc
            raise FuseError(f"move {move_id}'s {file} could not be written on this host's disk: {exc}",
                            code="io_error") from exc
        finally:
            self.writing(move_id, -1)
        return {"file": file, "offset": offset, "written": len(data)}

    async def verify(self, move_id: str) -> dict[str, Any]:
        """Size and SHA-256 of every file as received, and whether each is
        what the move declared. A clean verify spares ``install`` hashing
        again (unless a write comes in between)."""
        entry = self._entry(move_id)
        self._settled(entry)
        generation = entry.get("generation", 0)
        out, good = [], True
        for f in entry["files"]:
            size, digest = await asyncio.to_thread(_size_and_hash, self._state_path(entry, f["name"]))
            match = size == f["size"] and digest == f["sha256"]
            good &= match
            out.append({"name": f["name"], "size": size, "sha256": digest, "match": match})
        # A write that came in while hashing may have changed bytes already hashed: no mark then.
        if good and self.entries.get(move_id) is entry and entry.get("generation", 0) == generation:
            entry["verified"] = generation
        return {"move_id": move_id, "verified": good, "files": out}

    async def install(self, move_id: str) -> Vm:
        """Verify every file's size and SHA-256; the VM becomes sleeping
        (marked with the move, memory still reserved)."""
        mgr = self.mgr
        if move_id not in self.entries:
            for vm in mgr.vms.values():  # installed already: idempotent
                if vm.move_id == move_id and vm.state == "sleeping":
                    return vm
        entry = self._entry(move_id)
        self._settled(entry)
        vm = mgr.get(entry["name"])
        async with mgr.lock(vm.name):
            if self.entries.get(move_id) is not entry:
                # An install (or an abort) that held the lock first settled the move meanwhile.
                if mgr.vms.get(vm.name) is vm and vm.move_id == move_id and vm.state == "sleeping":
                    return vm  # installed already: idempotent
                raise NotFound(f"no incoming move {move_id} on this host")
            generation = entry.get("generation", 0)
            for f in [] if entry.get("verified") == generation else entry["files"]:
                path = self._state_path(entry, f["name"])
                size, digest = await asyncio.to_thread(_size_and_hash, path)
                if size != f["size"] or digest != f["sha256"]:
                    raise Conflict(f"file {f['name']} does not match: {size} bytes sha256 {digest[:12]}, "
                                   f"expected {f['size']} bytes sha256 {f['sha256'][:12]}",
                                   code="checksum_mismatch")
            if entry.get("generation", 0) != generation:  # written to while hashed: not what was checked
                raise Conflict(f"move {move_id} was written to while its files were checked; install again",
                               code="writes_in_flight")
            before = vm.files, vm.reserved, vm.move_role
            vm.files = [StateFile(**f) for f in entry["files"] if f["name"] != MOVED_CONSOLE]
            vm.reserved, vm.move_role = True, "target"
            try:
                mgr.transition(vm, "sleeping", f"installed by move {move_id}")
            except OSError as exc:  # (its record cannot be written: still incoming, as the disk says)
                from .vms import unrecorded  # (vms imports this module)
                vm.files, vm.reserved, vm.move_role = before
                raise unrecorded(vm.name, exc) from exc
            log = self._path_of(entry, MOVED_CONSOLE)
            if any(f["name"] == MOVED_CONSOLE for f in entry["files"]) and log.exists():
                # the VM's serial log so far: its console here carries on from it (QEMU appends)
                os.replace(log, mgr.vm_dir(vm.name) / CONSOLE)
            self._forget(move_id)
        return vm

    async def abort(self, move_id: str) -> None:
        """Undo a move's incoming side, received or installed-but-not-woken:
        free the reservation and the files. Unknown ids are fine."""
        mgr = self.mgr
        name = self.entries[move_id]["name"] if move_id in self.entries else next(
            (v.name for v in mgr.vms.values() if v.move_id == move_id and v.state == "sleeping"
             and v.move_role == "target"), None)
        if name is None or name not in mgr.vms:
            return
        async with mgr.lock(name):
            vm = mgr.vms.get(name)
            if vm is not None and vm.move_id == move_id and (
                    vm.state == "incoming" or (vm.state == "sleeping" and vm.move_role == "target")):
                await self.abort_vm(vm)

    async def abort_vm(self, vm: Vm) -> None:
        """Remove an incoming (or installed, unwoken) VM. Caller holds its lock."""
        move_id = vm.move_id
        self.mgr.transition(vm, "deleted", f"move {move_id} aborted")
        if move_id:
            self._forget(move_id)
            self.mgr.events.emit("incoming_aborted", vm=vm.name, move_id=move_id)

    def _forget(self, move_id: str) -> None:
        self.entries.pop(move_id, None)
        (self.dir / f"{move_id}.json").unlink(missing_ok=True)

    def describe(self, entry: dict[str, Any]) -> dict[str, Any]:
        received = sum(_received(self._path_of(entry, f["name"]), f["size"]) for f in entry["files"])
        return {"move_id": entry["move_id"], "name": entry["name"], "state": "receiving",
                "files": entry["files"], "received_bytes": received,
                "total_bytes": sum(f["size"] for f in entry["files"]), "created_at": entry["created_at"]}

    def list(self) -> list[dict[str, Any]]:
        """Receiving moves, and installed VMs a move has not woken yet."""
        out = [self.describe(e) for e in self.entries.values()]
        for vm in self.mgr.vms.values():
            if vm.state == "sleeping" and vm.move_role == "target" and vm.move_id:
                total = sum(f.size for f in vm.files)
                out.append({"move_id": vm.move_id, "name": vm.name, "state": "installed",
                            "files": [f.model_dump() for f in vm.files], "received_bytes": total,
                            "total_bytes": total, "created_at": vm.created_at.isoformat()})
        return sorted(out, key=lambda e: e["created_at"])


def _size_and_hash(path: Path) -> tuple[int, str]:
    if not path.exists():
        return 0, hashlib.sha256().hexdigest()
    return path.stat().st_size, bundles.sha256_file(path)


def _received(path: Path, size: int) -> int:
    """Bytes of a file on disk (its allocated blocks, not a sparse length
    a write at a far offset gives it), at most its declared ``size``."""
    try:
        return min(path.stat().st_blocks * 512, size)
    except FileNotFoundError:
        return 0


def _now() -> datetime:
    return datetime.now(timezone.utc)

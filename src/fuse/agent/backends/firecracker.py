"""Firecracker backend, written against Firecracker's documented API
(``swagger/firecracker.yaml``, release pinned in ``fuse.agent.probe``).

One ``firecracker --api-sock SOCK`` process per VM; its serial console is the
process's stdout, appended to the VM's console log. The calls, in order:

    boot   PUT /machine-config, PUT /boot-source, PUT /drives/{id} (each
           extra drive), PUT /actions {InstanceStart}
    sleep  PATCH /vm {Paused}, PUT /snapshot/create {Full, snapshot, memory},
           then the process is killed
    wake   a fresh process, PUT /snapshot/load {resume_vm: true}

``FirecrackerApi`` holds the HTTP calls alone, so tests check them against
a recorded request/response contract without a Firecracker binary (none can
be had on the machines this was written on).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from ...paths import our_socket, private_dir, private_opener, private_runtime_dir, runtime_dir
from .base import Backend, BackendError, BootSpec, kill_and_wait, process_alive, read_pidfile

SNAPSHOT, MEMORY = "snapshot.bin", "mem.bin"
# Firecracker has no ACPI: the guest leaves by the i8042 reset (reboot=k),
# which Firecracker turns into a clean exit. fuse_halt tells fuse's init.
_BOOT_ARGS = "console=ttyS0 reboot=k panic=1 pci=off quiet loglevel=3 fuse_halt=reboot"


class FirecrackerApi:
    """Firecracker's API over its unix socket. Every call returns nothing on
    204 and raises ``BackendError`` with Firecracker's ``fault_message``
    otherwise."""

    def __init__(self, socket_path: Path, timeout: float = 10.0):
        self.socket_path = socket_path
        self._client = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=str(socket_path)),
                                         base_url="http://localhost", timeout=timeout)

    async def __aenter__(self) -> FirecrackerApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._client.aclose()

    async def _call(self, method: str, path: str, body: dict[str, Any]) -> None:
        try:
            r = await self._client.request(method, path, json=body)
        except httpx.TransportError as exc:
            raise BackendError(f"firecracker API unreachable at {self.socket_path}: {exc}") from exc
        if r.status_code != 204:
            try:
                fault = r.json().get("fault_message", r.text)
            except ValueError:
                fault = r.text
            raise BackendError(f"firecracker {method} {path}: {r.status_code} {fault}")

    async def put_machine_config(self, vcpus: int, mem_mib: int) -> None:
        await self._call("PUT", "/machine-config", {"vcpu_count": vcpus, "mem_size_mib": mem_mib, "smt": False})

    async def put_boot_source(self, kernel: Path, initrd: Path | None, boot_args: str) -> None:
        body: dict[str, Any] = {"kernel_image_path": str(kernel), "boot_args": boot_args}
        if initrd is not None:
            body["initrd_path"] = str(initrd)
        await self._call("PUT", "/boot-source", body)

    async def put_drive(self, drive_id: str, path: Path, read_only: bool = False) -> None:
        # The path id must match the body id (Firecracker checks).
        await self._call("PUT", f"/drives/{drive_id}", {"drive_id": drive_id, "path_on_host": str(path),
                                                        "is_root_device": False, "is_read_only": read_only})

    async def instance_start(self) -> None:
        await self._call("PUT", "/actions", {"action_type": "InstanceStart"})

    async def pause(self) -> None:
        await self._call("PATCH", "/vm", {"state": "Paused"})

    async def resume(self) -> None:
        await self._call("PATCH", "/vm", {"state": "Resumed"})

    async def snapshot_create(self, snapshot: Path, memory: Path) -> None:
        await self._call("PUT", "/snapshot/create", {"snapshot_type": "Full", "snapshot_path": str(snapshot),
                                                     "mem_file_path": str(memory)})

    async def snapshot_load(self, snapshot: Path, memory: Path) -> None:
        await self._call("PUT", "/snapshot/load", {
            "snapshot_path": str(snapshot),
            "mem_backend": {"backend_type": "File", "backend_path": str(memory)},
            "resume_vm": True})


def api_socket(vm_dir: Path) -> Path:
    """Short enough for a unix socket (108 bytes), deterministic for adoption: a deep
    state dir's goes in the agent's own runtime dir (as QEMU's sockets: see
    ``qemu._vm_socket``), never the shared temp dir, where another user could put
    something at that predictable name first."""
    path = vm_dir / "firecracker.sock"
    if len(str(path)) < 100:
        return path
    digest = hashlib.sha256(str(vm_dir).encode()).hexdigest()[:20]
    path = runtime_dir() / f"fc-{digest}.sock"
    old = Path(tempfile.gettempdir()) / f"fuse-fc-{digest}.sock"  # (an older agent's: see qemu._vm_socket)
    return old if not os.path.lexists(path) and our_socket(old) else path


def _discard(path: Path) -> None:
    """Remove whatever is at the API socket's path: it is in the agent's own dirs."""
    try:
        path.unlink(missing_ok=True)
    except IsADirectoryError:
        shutil.rmtree(path)


class FirecrackerBackend(Backend):
    """Runs VMs as ``firecracker`` processes configured over the API."""

    name = "firecracker"

    def __init__(self, state_dir: Path | None = None, binary: str | None = None):
        self.state_dir = state_dir
        self.binary = binary or shutil.which("firecracker") or "firecracker"
        self._children: dict[int, subprocess.Popen] = {}

    def platform(self) -> dict[str, Any]:
        return {"backend": "firecracker", "arch": "x86_64", "machine": "firecracker", "accel": "kvm"}

    def _marker(self, spec: BootSpec) -> str:
        return str(api_socket(spec.vm_dir))

    async def _spawn(self, spec: BootSpec) -> int:
        if shutil.which(self.binary) is None and not os.path.exists(self.binary):
            raise BackendError("no firecracker binary on PATH")
        private_dir(spec.vm_dir)
        sock = api_socket(spec.vm_dir)
        try:
            if sock.parent != spec.vm_dir:
                private_runtime_dir()  # (a deep state dir: see api_socket)
            _discard(sock)
        except OSError as exc:
            raise BackendError(f"cannot prepare the API socket of vm {spec.name}: {exc}") from exc
        with open(spec.console, "ab", opener=private_opener) as console, \
                open(spec.vm_dir / "firecracker.err", "ab", opener=private_opener) as err:
            # A new session: the VM must outlive the agent (adopted by pid). umask 077: its API
            # socket and the snapshot files it writes are owner-only (README), whatever ours is.
            proc = subprocess.Popen([self.binary, "--api-sock", str(sock), "--id", _fc_id(spec.name)],
                                    stdin=subprocess.DEVNULL, stdout=console, stderr=err,
                                    start_new_session=True, umask=0o077)
        self._children[proc.pid] = proc
        with open(spec.vm_dir / "firecracker.pid", "w", opener=private_opener) as f:
            f.write(f"{proc.pid}\n")
        deadline = time.monotonic() + 5
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                await kill_and_wait(proc.pid, self._marker(spec))
                raise BackendError(f"firecracker did not open its API socket {sock}")
            await asyncio.sleep(0.005)
        with contextlib.suppress(FileNotFoundError):
            if stat.S_ISSOCK(os.lstat(sock).st_mode):  # (chmod follows a link: only firecracker's socket)
                os.chmod(sock, 0o600)  # (umask 077 made it 0700: a socket needs no execute bit)
        return proc.pid

    async def start(self, spec: BootSpec) -> int:
        pid = await self._spawn(spec)
        entry = base64.b64encode(spec.entry.encode()).decode()
        try:
            async with FirecrackerApi(api_socket(spec.vm_dir)) as api:
                await api.put_machine_config(spec.vcpus, spec.mem_mib)
                nonce = spec.platform.get("exit_nonce")  # (the guest's exit mark carries it)
                await api.put_boot_source(spec.kernel, spec.initrd, f"{_BOOT_ARGS}"
                                          + (f" fuse_nonce={nonce}" if nonce else "") + f" fuse_entry={entry}")
                for i, drive in enumerate(spec.drives):
                    await api.put_drive(f"drive{i}", drive)
                await api.instance_start()
        except BaseException:
            await self.stop(spec)
            raise
        return pid

    def pid(self, spec: BootSpec) -> int | None:
        pid = read_pidfile(spec.vm_dir / "firecracker.pid")
        if pid in self._children:
            self._children[pid].poll()  # reap our own child so it is not a zombie
        return pid if process_alive(pid, self._marker(spec)) else None

    async def stop(self, spec: BootSpec) -> None:
        pid = read_pidfile(spec.vm_dir / "firecracker.pid")
        await kill_and_wait(pid, self._marker(spec))
        if pid in self._children:
            self._children.pop(pid).wait()
        with contextlib.suppress(OSError):  # (a delete goes on: the next spawn clears it, or says why not)
            _discard(api_socket(spec.vm_dir))

    async def sleep(self, spec: BootSpec) -> list[str]:
        if self.pid(spec) is None:
            raise BackendError(f"vm {spec.name} has no running firecracker process")
        private_dir(spec.state_dir)
        async with FirecrackerApi(api_socket(spec.vm_dir)) as api:
            await api.pause()
            try:
                await api.snapshot_create(spec.state_dir / SNAPSHOT, spec.state_dir / MEMORY)
            except BackendError:
                await api.resume()  # the guest carries on as if never asked
                raise
        await self.stop(spec)
        return [SNAPSHOT, MEMORY]

    async def wake(self, spec: BootSpec) -> int:
        pid = await self._spawn(spec)
        try:
            async with FirecrackerApi(api_socket(spec.vm_dir)) as api:
                await api.snapshot_load(spec.state_dir / SNAPSHOT, spec.state_dir / MEMORY)
        except BaseException:
            await self.stop(spec)
            raise
        return pid


def _fc_id(name: str) -> str:
    """Firecracker's --id allows alphanumerics and '-' (max 64)."""
    return "".join(c if c.isalnum() else "-" for c in f"fuse-{name}")[:64]

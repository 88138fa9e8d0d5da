"""QEMU backend: microvm + the bundle's uncompressed kernel, KVM or TCG.

Facts this relies on are measured in QEMU-NOTES.md:

- QEMU runs with ``-daemonize -pidfile``: the launching call returns only
  once the QMP socket listens (or with QEMU's own error), and the VM is
  never a child of the agent, so it outlives an agent restart and every VM
  (started here or adopted) is watched the same way, by pid.
- KVM is used only when a short boot probe proves it runs the bundle's
  kernel: nested PVM KVMs answer ``/dev/kvm`` yet cannot boot Debian kernels.
  Otherwise TCG, which needs ``tsc_early_khz`` on microvm.
- Sleep is an ``exec:`` migration to a file (QEMU 7.2 has no ``file:``);
  wake is the identical command line plus ``-incoming`` from that file,
  then ``cont``.
- A standby VM takes its entry on a second UART (COM2, the guest's ttyS1)
  whose chardev is a unix socket. The console stays on COM1 and a file: a
  socket chardev drops, and does not log, what the guest writes while no
  client is connected, and it drops what it has not yet passed to the guest
  when the client hangs up — so ``deliver_entry`` stays connected until the
  guest says it started the entry (both seen on QEMU 7.2 when standby was
  built).
- QEMU splits an option string (``-chardev file,path=...``) at every comma;
  a doubled comma is a literal one. Every path or name placed inside one goes
  through ``_opt``, so a state dir such as ``/srv/a,b`` boots.
- A guest may power off in the middle of a QMP exchange (its entry ended):
  qemu.qmp then raises its own errors (``ExecInterruptedError``, ``EOFError``,
  ...), which ``qmp_session`` turns into ``BackendError`` like every other
  hypervisor failure.
- A QEMU that is stopped (SIGSTOP) or wedged still has its QMP socket accept a
  connection, in the kernel, but it never greets nor answers. So every QMP step
  has a deadline (``QMP_TIMEOUT``): nothing the agent holds meanwhile (its own
  start, a VM's lock) waits on such a process for ever. What was sent before a
  step timed out still runs once the process runs again, in order; a session
  given ``settle`` commands sends them after it (see ``qmp_session``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qemu.qmp import QMPClient, QMPError

from ...paths import our_socket, private_dir, private_file, private_opener, private_runtime_dir, runtime_dir
from ...stalls import ran
from ..bundle import Bundle
from .base import (ENTRY_START_MARK, STANDBY_MARK, Backend, BackendError, BootSpec, EntryCutOff, follow_agent_affinity,
                   hypervisors_naming, kill_and_wait, process_alive, read_pidfile, reap_exited_children,
                   wait_console_line, wait_gone)

QEMU = "qemu-system-x86_64"
STATE_FILE = "state.bin"
log = logging.getLogger("fuse.agent")
_KERNEL_ARGS = "console=ttyS0 quiet loglevel=3 panic=-1 pci=off i8042.noaux i8042.nokbd"


def host_tsc_khz() -> int:
    """The host's TSC frequency in kHz, which TCG guests on microvm need
    (they hang calibrating it otherwise). The kernel log has the exact
    figure; /proc/cpuinfo's clock is the fallback."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        log = subprocess.run(["dmesg"], capture_output=True, text=True, timeout=5).stdout
        if m := re.search(r"tsc: (?:Refined TSC clocksource calibration|Detected): ([\d.]+) MHz", log):
            return int(float(m.group(1)) * 1000)
    with contextlib.suppress(OSError):
        if m := re.search(r"cpu MHz\s*:\s*([\d.]+)", Path("/proc/cpuinfo").read_text()):
            return int(float(m.group(1)) * 1000)
    return 2_000_000


def qemu_missing() -> str | None:
    """Why no VM can start here when QEMU is not installed, or None."""
    if shutil.which(QEMU) is None:
        return f"{QEMU} is not on PATH: install QEMU (Debian: apt-get install qemu-system-x86)"
    return None


def qemu_version() -> str:
    out = subprocess.run([QEMU, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"version (\S+)", out)
    return m.group(1) if m else "unknown"


def _opt(value: object) -> str:
    """``value`` as one value inside a QEMU option string: commas doubled."""
    return str(value).replace(",", ",,")


def _vm_socket(vm_dir: Path, name: str) -> Path:
    """``<vm_dir>/<name>.sock``. Unix socket paths are limited to 108 bytes,
    so a deep state dir gets a short, deterministic path (the same on adoption)
    in the agent's own runtime dir: never the shared temp dir, where another
    user could put a link or a dir at that predictable name first (the agent
    chmods and removes what is there). ``_launch`` makes that dir and checks it."""
    path = vm_dir / f"{name}.sock"
    if len(str(path)) < 100:
        return path
    digest = hashlib.sha256(str(vm_dir).encode()).hexdigest()[:20]
    path = runtime_dir() / f"{name}-{digest}.sock"
    # (a VM an agent before the runtime dir started listens at the temp dir's name: that one,
    # while it is a socket of ours and the new one is not there; a link or another user's
    # file at it never is)
    old = Path(tempfile.gettempdir()) / f"fuse-{name}-{digest}.sock"
    return old if not os.path.lexists(path) and our_socket(old) else path


def _discard(path: Path) -> None:
    """Remove whatever is at one of a VM's socket or pid file paths. They are in the
    agent's own dirs (the VM's, or its private runtime dir), so what is there is the
    agent's; a directory left at one would fail every boot and delete of the VM."""
    try:
        path.unlink(missing_ok=True)
    except IsADirectoryError:
        shutil.rmtree(path)


def qmp_path(vm_dir: Path) -> Path:
    """The VM's QMP socket."""
    return _vm_socket(vm_dir, "qmp")


def entry_path(vm_dir: Path) -> Path:
    """A standby VM's entry socket (its COM2)."""
    return _vm_socket(vm_dir, "entry")


# Seconds one QMP step may take: the greeting, or one command's answer. A live
# QEMU answers in milliseconds (it serves QMP from its main loop, not the vCPUs'
# threads); this bound is for one that does not answer at all.
QMP_TIMEOUT = 10.0
# Seconds a sleep's migration may go without writing a byte before it is given up.
# It may take as long as it needs while it moves (a large guest, a slow disk).
MIGRATION_STALL_S = 60.0
LOAD_TIMEOUT = 120.0  # seconds a wake may take to load the state
LOAD_PER_GIB = 30.0  # ... and this much more for each GiB of the guest's memory past 2 GiB


def load_timeout(mem_mib: int) -> float:
    """Seconds a wake of a guest of ``mem_mib`` MiB may take to load its state: the controller's
    wait for it grows the same way (``controller.vms.state_wait_s``), so a 16 GiB guest's load
    is not cut at 120 s while the controller waits 540 s for it (review 38)."""
    return LOAD_TIMEOUT + LOAD_PER_GIB * max(0.0, mem_mib / 1024 - 2)
# Seconds QEMU may take to set itself up and detach (-daemonize): a live one takes well under
# one; this bound is for one stopped (SIGSTOP) or hung before it detached.
LAUNCH_TIMEOUT = 60.0
_settling: set[asyncio.Task] = set()  # sessions handed to ``_settle_later``, until they end


class Qmp:
    """A connected QMP client whose every command has a deadline. Once QEMU
    missed one it is taken as hung: later commands fail at once, rather than
    queue behind the one it has not answered."""

    def __init__(self, client: QMPClient, path: Path, timeout: float):
        self.client, self.path, self.timeout = client, path, timeout
        self.hung: str | None = None  # the command QEMU did not answer in time

    async def execute(self, cmd: str, arguments: dict[str, Any] | None = None,
                      timeout: float | None = None) -> Any:
        if self.hung is not None:
            raise BackendError(f"QEMU at {self.path} is not answering (it never answered {self.hung})")
        limit = self.timeout if timeout is None else timeout
        try:
            return await asyncio.wait_for(self.client.execute(cmd, arguments), limit)
        except TimeoutError:
            self.hung = cmd
            raise BackendError(f"QEMU did not answer {cmd} within {limit:g} s (is its process stopped "
                               "or hung?)") from None


@contextlib.asynccontextmanager
async def qmp_session(path: Path, timeout: float | None = None, alive: Callable[[], bool] | None = None,
                      settle: tuple[str, ...] = ()):
    """A connected ``Qmp``; retries while QEMU is still creating the socket
    (giving up at once when ``alive()`` says the process is gone), and gives
    up when it has not greeted within ``timeout`` (default ``QMP_TIMEOUT``),
    which is also each command's deadline. A QMP failure inside the session,
    a hang-up or a missed deadline included, comes out as ``BackendError``.

    ``settle``: commands to send if a command's deadline was missed. QEMU
    still runs what it was sent once its process runs again (a stopped one
    continued), so the session is then not closed but handed to a task that
    sends these after it, with no deadline, and ends when QEMU has answered
    them or its process is gone (a delete's kill hangs the socket up)."""
    timeout = QMP_TIMEOUT if timeout is None else timeout
    client = QMPClient("fuse-agent")
    deadline = ran() + timeout  # (the loop's clock: time the agent ran, see fuse.stalls)
    while True:
        try:
            # Bounded: a stopped QEMU's socket accepts the connection but never greets.
            await asyncio.wait_for(client.connect(str(path)), max(0.01, deadline - ran()))
            break
        except Exception as exc:  # ConnectError wraps OSError; both mean "not yet"
            if ran() >= deadline or (alive is not None and not alive()):
                why = f"no greeting within {timeout:g} s (is its process stopped or hung?)" \
                    if isinstance(exc, TimeoutError) else exc
                raise BackendError(f"cannot reach QMP at {path}: {why}") from exc
            await asyncio.sleep(0.02)
    qmp = Qmp(client, path, timeout)
    try:
        yield qmp
    except (QMPError, EOFError, OSError) as exc:
        raise BackendError(f"QMP at {path} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        if qmp.hung is not None and settle:
            _settle_later(client, settle)
        else:
            # disconnect() may raise EOFError after `quit` (QEMU-NOTES pitfalls).
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.disconnect(), timeout)


def _settle_later(client: QMPClient, commands: tuple[str, ...]) -> None:
    """Send ``commands`` on ``client`` once QEMU answers again (see ``qmp_session``)."""
    async def settle() -> None:
        try:
            for command in commands:
                with contextlib.suppress(QMPError):  # refused (nothing to cancel): the next one still goes
                    await client.execute(command)
        except Exception:  # the process is gone: nothing left to settle
            pass
        finally:
            with contextlib.suppress(Exception):
                await client.disconnect()
    task = asyncio.get_running_loop().create_task(settle())
    _settling.add(task)
    task.add_done_callback(_settling.discard)


async def _await_migration(qmp: Qmp) -> None:
    """Poll a migration to its end: ``BackendError`` when it failed, or wrote
    nothing for ``MIGRATION_STALL_S``."""
    progress, moved_at = None, ran()
    while True:
        info = await qmp.execute("query-migrate")
        status = info.get("status")
        if status == "completed":
            return
        if status in ("failed", "cancelled"):
            raise BackendError(f"saving state failed: {info.get('error-desc', status)}")
        if (now := (status, (info.get("ram") or {}).get("transferred"))) != progress:
            progress, moved_at = now, ran()
        elif ran() - moved_at > MIGRATION_STALL_S:
            raise BackendError(f"saving state stalled: nothing written for {MIGRATION_STALL_S:g} s ({status})")
        await asyncio.sleep(0.005)


async def _loaded(qmp: Qmp, deadline: float) -> str:
    """Wait until QEMU has loaded an incoming state (``-incoming``) and answer its status
    then. QEMU loads in its main loop, which serves QMP too: it may answer only between
    reads of the state, so each ask gets what is left of ``deadline``."""
    while True:
        left = max(1.0, deadline - ran())
        if (status := (await qmp.execute("query-status", timeout=left))["status"]) != "inmigrate":
            return status
        if ran() > deadline:
            raise BackendError("loading state timed out")
        await asyncio.sleep(0.005)


def _launch_failure(err_path: Path, status: int, incoming: Path | None) -> str:
    """Why a QEMU launch left no process, as far as can be told: its own
    message if it wrote one; else, for a wake, what is wrong with the state it
    loads (a daemonized QEMU loads after it has detached, with its stderr on
    /dev/null, so a failed load says nothing); else its bare exit status."""
    detail = err_path.read_text(errors="replace").strip()[-500:] if err_path.exists() else ""
    if detail:
        return detail
    if incoming is not None and status == 0:
        return f"it detached, then ended while loading {incoming.name}: {_state_problem(incoming)}"
    return f"it exited with status {status} without a message"


def _state_problem(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            head = f.read(8)
        size = path.stat().st_size
    except OSError as exc:
        return f"it cannot be read ({exc.strerror})"
    if size == 0:
        return "the file is empty"
    # A migration stream opens with QEMU_VM_FILE_MAGIC "QEVM" and QEMU_VM_FILE_VERSION 3.
    if head[:4] != b"QEVM":
        return f"it is no QEMU state ({size} bytes starting {head[:4].hex()}, not the QEVM magic)"
    return (f"it is a QEMU state of {size} bytes that this QEMU rejected (truncated, corrupt, or from "
            f"another machine or QEMU version); QEMU's own message went to /dev/null")


def machine_accel_cache(key: dict[str, str]) -> Path | None:
    """This machine's cached KVM probe answer for ``key``: under
    ``$FUSE_CACHE_DIR`` (default ``$XDG_CACHE_HOME/fuse`` or ``~/.cache/fuse``);
    ``FUSE_CACHE_DIR=off`` turns it off."""
    root = os.environ.get("FUSE_CACHE_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fuse")
    if root == "off":
        return None
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return Path(root) / f"accel-{digest}.json"


class QemuBackend(Backend):
    """Runs VMs as daemonized ``qemu-system-x86_64`` processes."""

    name = "qemu"
    supports_standby = True

    def __init__(self, state_dir: Path | None = None, accel: str | None = None):
        self.state_dir = state_dir
        self._accel = accel or os.environ.get("FUSE_QEMU_ACCEL") or None
        self._tsc_khz = host_tsc_khz()
        self._version = qemu_version()

    # -- platform --------------------------------------------------------------

    @property
    def accel(self) -> str:
        return self._accel or "tcg"

    def platform(self) -> dict[str, Any]:
        return {"backend": "qemu", "arch": "x86_64", "machine": "microvm", "accel": self.accel,
                "tsc_khz": self._tsc_khz, "qemu": self._version}

    def kvm_usable(self, device_answers: bool) -> bool:
        """KVM only once ``probe_accel`` settled on it (or it was forced):
        a device that answers but cannot boot the bundle's kernel is not."""
        return device_answers and self.accel == "kvm"

    async def probe_accel(self, bundle: Bundle | None, kvm_answers: bool) -> str:
        """Settle the accelerator: KVM only if the bundle's kernel really
        boots under it (a probe of up to 10 s). The answer belongs to the
        machine, QEMU and bundle, not to one agent: it is cached in the state
        dir and in the machine's cache (``machine_accel_cache``), keyed by the
        QEMU version, the bundle and the host kernel release, so a second
        agent on the machine (or the next state dir) does not spin a core for
        10 s again."""
        if self._accel:
            return self._accel
        if not kvm_answers or bundle is None:
            return "tcg"  # not cached: a bundle may appear later
        key = {"qemu": self._version, "bundle": bundle.fingerprint, "kernel": os.uname().release}
        caches = [c for c in (self.state_dir / "accel.json" if self.state_dir else None,
                              machine_accel_cache(key)) if c is not None]
        for cache in caches:
            with contextlib.suppress(OSError, ValueError, KeyError):
                saved = json.loads(cache.read_text())
                if saved.get("key") == key and saved["accel"] in ("kvm", "tcg"):
                    self._accel = saved["accel"]
                    break
        if not self._accel:
            ok = await asyncio.to_thread(self._boot_probe, bundle)
            self._accel = "kvm" if ok else "tcg"
        for cache in caches:
            with contextlib.suppress(OSError):
                cache.parent.mkdir(parents=True, exist_ok=True)
                tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
                with open(tmp, "w", opener=private_opener) as f:
                    f.write(json.dumps({"key": key, "accel": self._accel}) + "\n")
                tmp.replace(cache)
        return self._accel

    def _boot_probe(self, bundle: Bundle) -> bool:
        with tempfile.TemporaryDirectory(prefix="fuse-kvm-probe-") as tmp:
            spec = BootSpec(name="kvm-probe", vm_dir=Path(tmp), vcpus=1, mem_mib=128, entry="true",
                            kernel=bundle.vmlinux, initrd=bundle.initrd,
                            platform={**self.platform(), "accel": "kvm"})
            argv = self.argv(spec, daemon=False)
            follow_agent_affinity()  # (run on a worker thread: see _launch)
            try:
                subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=10)
            except subprocess.TimeoutExpired:
                return False  # spinning in the decompressor: the PVM symptom
            return "FUSE-EXIT 0" in spec.console.read_text(errors="replace") if spec.console.exists() else False

    # -- command line ----------------------------------------------------------

    def argv(self, spec: BootSpec, *, daemon: bool = True, incoming: Path | None = None) -> list[str]:
        """The QEMU command line. Apart from ``-incoming`` it depends only on
        the spec, so a VM wakes on exactly the command line it slept with."""
        accel = spec.platform.get("accel", self.accel)
        entry = base64.b64encode(spec.entry.encode()).decode()
        append = _KERNEL_ARGS
        if accel == "tcg":
            append += f" tsc_early_khz={spec.platform.get('tsc_khz', self._tsc_khz)}"
        if nonce := spec.platform.get("exit_nonce"):  # (the guest's exit mark carries it: vms._EXIT_MARK)
            append += f" fuse_nonce={nonce}"
        append += " fuse_standby=1" if spec.standby else f" fuse_entry={entry}"
        # Named by its dir, not the VM's name: a claim renames a standby VM.
        # Paths inside an option string go through _opt (the module doc: commas).
        argv = [QEMU, "-name", _opt(f"fuse-{spec.vm_dir.name}"), "-M", "microvm", "-accel", accel]
        if accel == "kvm":
            argv += ["-cpu", "host"]
        argv += ["-m", str(spec.mem_mib), "-smp", str(spec.vcpus), "-nodefaults", "-no-user-config",
                 "-display", "none", "-no-reboot",
                 # append=on: a woken VM's console continues the same log.
                 "-chardev", f"file,id=ser0,path={_opt(spec.console)},append=on", "-serial", "chardev:ser0",
                 "-kernel", str(spec.kernel), "-initrd", str(spec.initrd), "-append", append]
        if spec.standby:
            argv += ["-chardev", f"socket,id=entry,path={_opt(entry_path(spec.vm_dir))},server=on,wait=off",
                     "-device", "isa-serial,chardev=entry,index=1"]
        if daemon:
            argv += ["-qmp", f"unix:{_opt(qmp_path(spec.vm_dir))},server=on,wait=off",
                     "-pidfile", str(spec.vm_dir / "qemu.pid"), "-daemonize"]
        if incoming is not None:
            argv += ["-incoming", f"exec:cat {shlex.quote(str(incoming))}"]
        return argv

    # -- lifecycle -------------------------------------------------------------

    async def _launch(self, spec: BootSpec, incoming: Path | None = None) -> int:
        private_dir(spec.vm_dir)
        sockets = (qmp_path(spec.vm_dir), entry_path(spec.vm_dir))
        try:
            if any(sock.parent != spec.vm_dir for sock in sockets):
                private_runtime_dir()  # (a deep state dir: see _vm_socket)
            for path in (spec.vm_dir / "qemu.pid", *sockets):
                _discard(path)
        except OSError as exc:
            raise BackendError(f"cannot prepare the sockets of vm {spec.name}: {exc}") from exc
        # QEMU daemonized sets its own umask (027), so what it creates is group-readable: the
        # console it appends to is made owner-only first, and its sockets are tightened below.
        private_file(spec.console)
        err_path = spec.vm_dir / "qemu.err"
        argv = self.argv(spec, incoming=incoming)
        try:
            with open(err_path, "wb", opener=private_opener) as err:
                def run() -> subprocess.CompletedProcess:
                    follow_agent_affinity()  # (a worker thread's mask may predate a pin of the agent)
                    # With -daemonize this returns once QEMU is set up (QMP listening).
                    try:
                        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err,
                                              timeout=LAUNCH_TIMEOUT)
                    except subprocess.TimeoutExpired:  # (run killed the launcher; its fork goes below)
                        raise BackendError(f"qemu did not finish starting within {LAUNCH_TIMEOUT:g} s (is its "
                                           "process stopped or hung?)") from None
                proc = await asyncio.to_thread(run)
            reap_exited_children(b"qemu")  # the daemonizing fork's middle process, re-parented to us
            pid = read_pidfile(spec.vm_dir / "qemu.pid")
            if proc.returncode != 0 or not process_alive(pid, str(spec.vm_dir)):
                raise BackendError(f"qemu failed to start (exit {proc.returncode}): "
                                   f"{_launch_failure(err_path, proc.returncode, incoming)}")
            for sock in sockets:
                with contextlib.suppress(FileNotFoundError):  # (the entry socket: standby VMs only)
                    if stat.S_ISSOCK(os.lstat(sock).st_mode):  # (chmod follows a link: only QEMU's socket)
                        os.chmod(sock, 0o600)  # sockets are owner-only (README); QEMU made them 0750
        except BaseException:
            # Whatever failed after QEMU may have started, its process goes too: a VM the
            # caller is told failed must not run on, unaccounted for, until its record goes.
            await kill_and_wait(read_pidfile(spec.vm_dir / "qemu.pid"), str(spec.vm_dir))
            # A launch that timed out may have a detached QEMU that never wrote its pid file
            # (stopped or hung first): found by that file's path on its command line.
            for stray in hypervisors_naming(spec.vm_dir / "qemu.pid", ("qemu-system",)):
                await kill_and_wait(stray, str(spec.vm_dir))
            reap_exited_children(b"qemu")  # (the daemonizing fork's middle process, as above)
            self.ended(spec)  # (a wake from a bad state file left its QMP socket behind)
            raise
        return pid

    async def start(self, spec: BootSpec) -> int:
        return await self._launch(spec)

    def pid(self, spec: BootSpec) -> int | None:
        pid = read_pidfile(spec.vm_dir / "qemu.pid")
        return pid if process_alive(pid, str(spec.vm_dir)) else None

    async def stop(self, spec: BootSpec) -> None:
        await kill_and_wait(read_pidfile(spec.vm_dir / "qemu.pid"), str(spec.vm_dir))
        self.ended(spec)

    def ended(self, spec: BootSpec) -> None:
        # (QEMU removes them itself on a clean exit; a killed one left a dead pid and
        # its QMP socket behind in a failed VM's dir)
        for path in (spec.vm_dir / "qemu.pid", qmp_path(spec.vm_dir), entry_path(spec.vm_dir)):
            try:
                _discard(path)
            except OSError as exc:  # (a delete goes on: the next launch clears it, or says why not)
                log.warning("could not remove %s after vm %s ended: %s", path, spec.name, exc)

    async def deliver_entry(self, spec: BootSpec, entry: str, timeout: float = 60.0) -> None:
        """Write the entry, one base64 line, to the guest's COM2 once it is
        waiting, and hang up only after it started the entry (see the
        module doc: QEMU drops unread input on hang-up)."""
        def alive() -> bool:
            return self.pid(spec) is not None
        ready = await wait_console_line(spec, STANDBY_MARK, alive, timeout)
        try:
            _, writer = await asyncio.open_unix_connection(str(entry_path(spec.vm_dir)))
        except OSError as exc:
            raise BackendError(f"cannot reach the entry socket of vm {spec.name}: {exc}") from exc
        try:
            writer.write(base64.b64encode(entry.encode()) + b"\n")
            await writer.drain()
            await wait_console_line(spec, ENTRY_START_MARK, alive, 15.0, ready)
        except (BackendError, OSError) as exc:
            raise EntryCutOff(str(exc)) from exc
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def adopt(self, spec: BootSpec) -> None:
        """Take over a VM a previous agent started. If that agent died in the
        middle of a sleep, the guest is paused (stopped for migration):
        resume it and drop the half-written state, so it runs on. Bounded by
        the QMP deadlines: a hung process is a ``BackendError``, not a hung
        agent start (what was sent to it is settled once it runs again)."""
        async with qmp_session(qmp_path(spec.vm_dir), alive=lambda: self.pid(spec) is not None,
                               settle=("migrate_cancel", "cont")) as qmp:
            with contextlib.suppress(Exception):
                await qmp.execute("migrate_cancel")
            status = (await qmp.execute("query-status"))["status"]
            if status == "inmigrate":  # (a wake's QEMU, still loading its state when that agent died)
                status = await _loaded(qmp, ran() + load_timeout(spec.mem_mib))
            if status in ("paused", "postmigrate", "finish-migrate"):
                await qmp.execute("cont")
        (spec.state_dir / (STATE_FILE + ".partial")).unlink(missing_ok=True)

    async def sleep(self, spec: BootSpec) -> list[str]:
        """Save the guest to ``state.bin`` and end its process. On failure the
        guest runs on as if never asked: at once where QEMU answers, else once
        it runs again (``settle``). Every QMP step is bounded (``QMP_TIMEOUT``,
        and the migration by ``MIGRATION_STALL_S`` without progress), so a hung
        process fails the sleep rather than holding the VM's lock for ever."""
        pid = self.pid(spec)
        if pid is None:
            raise BackendError(f"vm {spec.name} has no running qemu process")
        private_dir(spec.state_dir)
        partial, state = spec.state_dir / (STATE_FILE + ".partial"), spec.state_dir / STATE_FILE
        state.unlink(missing_ok=True)  # an earlier sleep's, stale while the guest ran: never the saved state
        private_file(partial)  # QEMU's `cat >` keeps this mode; it would create it 0640
        try:
            async with qmp_session(qmp_path(spec.vm_dir), alive=lambda: self.pid(spec) is not None,
                                   settle=("migrate_cancel", "cont")) as qmp:
                # The default bandwidth cap (~128 MiB/s) would make sleep crawl.
                await qmp.execute("migrate-set-parameters", {"max-bandwidth": 10_000_000_000})
                await qmp.execute("stop")
                try:
                    await qmp.execute("migrate", {"uri": f"exec:cat > {shlex.quote(str(partial))}"})
                    await _await_migration(qmp)
                except Exception:
                    # The guest carries on as if never asked (if it is still there and answers).
                    for command in ("migrate_cancel", "cont"):
                        with contextlib.suppress(Exception):
                            await qmp.execute(command)
                    raise
                # Complete (QEMU has handed all of it over): from here the VM is asleep
                # whatever becomes of this agent, so the file takes its name before QEMU
                # quits (an agent killed between the two found only a partial file and
                # lost the VM). The rename does not disturb `cat` writing the pipe's last
                # bytes: the same file. An agent killed before the quit finds the guest
                # still there and adopts it (``adopt``), dropping this file.
                os.replace(partial, state)
                with contextlib.suppress(Exception):
                    await qmp.execute("quit")
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        await wait_gone(pid, str(spec.vm_dir))
        with contextlib.suppress(OSError):  # (a leftover is cleared at the wake's launch)
            _discard(qmp_path(spec.vm_dir))
        return [STATE_FILE]

    async def wake(self, spec: BootSpec) -> int:
        state = spec.state_dir / STATE_FILE
        if not state.is_file():
            raise BackendError(f"vm {spec.name} has no state file to wake from")
        pid = await self._launch(spec, incoming=state)
        # QEMU loads in its main loop, which serves QMP too: it may greet and answer
        # only between reads of the state, so here every step gets the load's deadline.
        deadline = ran() + (load := load_timeout(spec.mem_mib))
        try:
            async with qmp_session(qmp_path(spec.vm_dir), timeout=load,
                                   alive=lambda: self.pid(spec) is not None) as qmp:
                status = await _loaded(qmp, deadline)
                if status not in ("paused", "postmigrate", "running"):
                    raise BackendError(f"loading state left the vm {status}")
                if status != "running":
                    await qmp.execute("cont")
        except BaseException as exc:
            ended = self.pid(spec) is None
            await kill_and_wait(pid, str(spec.vm_dir))
            self.ended(spec)  # (its QMP socket and pid file go with it)
            if ended and isinstance(exc, BackendError):
                # it detached, then ended in the load while QMP was greeting it (a hang-up, not
                # a reason): what is wrong with the state, as for a launch that ended so
                raise BackendError(f"QEMU ended while loading {state.name}: {_state_problem(state)}") from exc
            raise
        return pid

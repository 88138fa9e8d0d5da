"""The backend interface: how the VM manager runs one VM on some hypervisor.

A backend is stateless between calls. Everything it needs to find a VM
again (pid file, API/QMP socket, console log, state files) lives in the VM's
directory, named by ``BootSpec`` — that is what lets a restarted agent adopt
VMs it did not start in this process.

    start(spec)  -> pid        boot from the bundle
    pid(spec)    -> pid|None   the live process, checked against pid reuse
    stop(spec)                 kill; returns once no process is left
    sleep(spec)  -> files      write memory + device state, stop the process
    wake(spec)   -> pid        start from the state files, resume the guest
    deliver_entry(spec, entry) a standby VM's guest takes its entry (qemu, fake)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shlex
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..bundle import BOOT_FILES
from ..probe import agent_affinity

CONSOLE = "console.log"
STATE_DIR = "state"
MOVED_CONSOLE = "console.log"  # in STATE_DIR: a moving VM's serial log so far, copied with its state
# The platform of a VM booted standby: its guest waits for the entry on a
# serial line. It is part of the platform because a woken (or moved) VM
# must get the command line it booted with, claimed or not.
STANDBY_PLATFORM = {"entry_via": "serial"}
STANDBY_MARK = b"FUSE-STANDBY"  # the guest waits for its entry
ENTRY_START_MARK = b"FUSE-ENTRY-START"  # the guest runs it


class BackendError(RuntimeError):
    """A hypervisor operation failed (the message says how)."""


class EntryCutOff(BackendError):
    """An entry's delivery failed once some of it may have reached the guest: it may hold part
    of a line, which the next entry written would be appended to (it would run a command spliced
    from both). Such a standby VM takes no other entry."""


@dataclass(frozen=True)
class BootSpec:
    """Everything needed to (re)build a VM's process, identical on wake.

    ``platform`` is fixed when the VM is created (accelerator, machine, guest
    TSC frequency) and travels with the VM when it moves, because a VM must
    wake on the command line it slept with.
    """

    name: str
    vm_dir: Path
    vcpus: int
    mem_mib: int
    entry: str
    kernel: Path
    initrd: Path
    platform: dict[str, Any] = field(default_factory=dict)
    drives: tuple[Path, ...] = ()

    @property
    def console(self) -> Path:
        return self.vm_dir / CONSOLE

    @property
    def state_dir(self) -> Path:
        return self.vm_dir / STATE_DIR

    @property
    def standby(self) -> bool:
        """Booted standby: the entry comes by ``deliver_entry``, not on the
        kernel command line."""
        return self.platform.get("entry_via") == STANDBY_PLATFORM["entry_via"]


class Backend(ABC):
    """One hypervisor. Subclasses implement the lifecycle; see the module doc."""

    name: str = ""
    supports_standby: bool = False
    # The files a bundle must list for this backend to boot it (its kernel and
    # initramfs); the agent offers and accepts only bundles that list them.
    bundle_files: tuple[str, ...] = BOOT_FILES
    # Whether a VM's process takes its guest's memory as the guest touches it (a
    # hypervisor's): admission then counts what is promised but not resident yet
    # against the machine's MemAvailable. The fake backend's VMs never take theirs.
    guest_memory: bool = True

    @abstractmethod
    def platform(self) -> dict[str, Any]:
        """The platform a new VM gets on this host (``backend``, ``arch``,
        ``machine``, ``accel``, ...)."""

    def kvm_usable(self, device_answers: bool) -> bool:
        """Whether this backend's VMs run under KVM, given whether /dev/kvm
        answers. Firecracker has no other accelerator, so the device decides;
        a backend that may fall back (qemu) answers from what it settled on."""
        return device_answers

    def incompatible(self, platform: dict[str, Any]) -> str | None:
        """Why a VM that slept on ``platform`` cannot wake here, or None."""
        mine = self.platform()
        for key in ("backend", "arch", "machine", "accel"):
            if platform.get(key) != mine.get(key):
                return f"platform {key} is {platform.get(key)!r} there, {mine.get(key)!r} here"
        return None

    @abstractmethod
    async def start(self, spec: BootSpec) -> int: ...

    @abstractmethod
    def pid(self, spec: BootSpec) -> int | None: ...

    @abstractmethod
    async def stop(self, spec: BootSpec) -> None: ...

    def ended(self, spec: BootSpec) -> None:
        """The VM's process ended by itself (its guest powered off, or it was killed):
        remove what only a live process uses (pid file, sockets). Nothing by default."""

    @abstractmethod
    async def sleep(self, spec: BootSpec) -> list[str]:
        """Write state files into ``spec.state_dir``; return their names."""

    @abstractmethod
    async def wake(self, spec: BootSpec) -> int: ...

    async def deliver_entry(self, spec: BootSpec, entry: str, timeout: float = 60.0) -> None:
        """Give a standby VM's guest its entry, waiting (up to ``timeout``)
        for it to be ready; returns once the guest took it."""
        raise BackendError(f"{self.name} vms cannot boot standby")


# -- process helpers shared by backends --------------------------------------

def follow_agent_affinity() -> None:
    """Give the calling thread the agent's CPU mask (`probe.agent_affinity`); called right
    before it starts a hypervisor. A child runs on its spawning thread's mask, and a worker
    thread (``asyncio.to_thread``) made before the agent was pinned with `taskset -p PID`
    still has the old one: a VM started from it ran on CPUs the operator took away.
    (Not ``preexec_fn``: it is unsafe in a process with threads.)"""
    with contextlib.suppress(OSError):  # (the mask the thread has stands)
        if os.sched_getaffinity(0) != (mask := agent_affinity()):
            os.sched_setaffinity(0, mask)


# The programs of VM processes: what the agent may find running under its VM dirs.
HYPERVISORS = ("qemu-system", "firecracker")
# QEMU options whose value is a plain string (a path, a URI, the kernel's command line), not an
# option string: a comma in it is a literal one, not a separator.
_QEMU_PLAIN = frozenset({"-pidfile", "-kernel", "-initrd", "-append", "-incoming", "-dtb", "-bios", "-L", "-D"})
# The legacy chardev forms whose rest is a path (``-qmp unix:PATH,server=on``, ``-serial file:PATH``).
_CHARDEV_PATH = ("unix:", "file:", "pipe:")


def _argv(cmdline: bytes) -> list[str]:
    """A /proc/PID/cmdline as its arguments (file names as the OS gives them: ``os.fsdecode``)."""
    args = cmdline.split(b"\0")
    if args and args[-1] == b"":
        args.pop()
    return [os.fsdecode(a) for a in args]


def _option_values(arg: str) -> list[str]:
    """The values in a QEMU option string (``file,id=ser0,path=P,append=on``, ``unix:P,server=on``):
    the first part (an implied key's value, or what follows ``unix:``) and every ``key=``'s value,
    split at single commas as QEMU splits it (a doubled comma is a literal one: ``qemu._opt``)."""
    values = []
    for i, part in enumerate(arg.replace(",,", "\0").split(",")):
        part = part.replace("\0", ",")  # (no argument holds a NUL: a safe stand-in)
        _, eq, value = part.partition("=")
        if i == 0 and part.startswith(_CHARDEV_PATH):
            values.append(part.split(":", 1)[1])
        elif eq:
            values.append(value)
        elif i == 0:
            values.append(part)
    return values


def argv_paths(argv: list[str]) -> list[str]:
    """What a VM process's command line gives as file names, as the process reads them: each
    argument whole (``-pidfile P``, ``--api-sock P``, a fake VM's dir), the values of QEMU's option
    strings (``-chardev file,path=P``, ``-qmp unix:P,server=on``) and the words of an ``exec:``
    migration (``-incoming exec:cat P``). A path written inside a longer one (``/mnt/x/srv/fuse/vms/a``
    holds ``/srv/fuse/vms/a``) is none of them."""
    qemu = bool(argv) and os.path.basename(argv[0]).startswith("qemu-system")
    paths = []
    for prev, arg in zip(argv, argv[1:]):
        paths.append(arg)
        if qemu and arg.startswith("exec:"):
            with contextlib.suppress(ValueError):  # (unbalanced quotes: no words)
                paths += shlex.split(arg[len("exec:"):])
        elif qemu and prev.startswith("-") and prev not in _QEMU_PLAIN:
            paths += _option_values(arg)
    return paths


def _naming(paths: list[str], path: str) -> list[str]:
    """Those of ``paths`` that are ``path`` or under it (``vms/a/x``, not ``vms/a2/x``)."""
    return [p for p in paths if p == path or p.startswith(path.rstrip("/") + "/")]


def same_files(pid: int, path: str | Path) -> bool:
    """Whether ``pid`` sees ``path`` as this process does: the same file (device and inode) at
    that path through its root (``/proc/PID/root``, which resolves in its mount namespace), or,
    when ``path`` is gone for us (a VM dir just removed), at its nearest ancestor that is there.
    The paths on its command line are then files of ours. An agent in a container (``unshare -m``,
    a bind mount at the same path) names its VMs' files by our paths, yet they are not ours; an
    agent restarted in a namespace of its own that sees the same files (``ip netns exec``, a
    unit's ``PrivateTmp=``) still has its VMs, which a comparison of namespaces took for another's
    and let run untracked. False when that cannot be read (another user's process, or one made
    non-dumpable, while we are not root): whose files it names cannot be told, and a process killed
    on a guess may be another agent's running VM, lost; one of ours left running is only an orphan."""
    here = Path(os.path.abspath(path))
    for at in (here, *here.parents):
        try:
            ours = os.stat(at)
        except OSError:
            continue
        try:
            theirs = os.stat(f"/proc/{pid}/root{at}")
        except OSError:
            return False
        return (ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino)
    return False


def process_alive(pid: int | None, marker: str) -> bool:
    """True when ``pid`` is a live (non-zombie) process of ours for ``marker`` (a VM's directory
    or API socket): its command line names ``marker`` or a path under it (`argv_paths`) and it sees
    the same file there as we do (`same_files`) — so neither a recycled pid nor another agent's process (whose
    dir's path ends with ours, or a container's at the same path) is mistaken for our VM."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
    except OSError:
        return False
    # The state letter follows the parenthesised command name; the start time is the 20th field after it.
    after = stat[stat.rindex(")") + 2:].split()
    if after[0] in "ZX":
        return False
    key, began = (pid, str(marker)), after[19]
    if _OURS.get(key) == began:  # (judged ours already: the same process, its pid not reused since)
        return True
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    if not (_naming(argv_paths(_argv(cmdline)), str(marker)) and same_files(pid, marker)):
        return False
    if len(_OURS) >= 4096:  # (bounded: the pids of VMs long gone)
        _OURS.clear()
    _OURS[key] = began
    return True


# (pid, marker) -> the start time (in clock ticks since boot) of the process `process_alive`
# judged ours: a pid and its start time name one process, so a VM's monitor, asking ten times a
# second, reads one file a look, not its command line and two stats through its root (~50 µs)
_OURS: dict[tuple[int, str], str] = {}


def hypervisors_naming(path: str | Path, programs: tuple[str, ...] = HYPERVISORS) -> dict[int, list[str]]:
    """This agent's VM processes that name ``path`` or a path under it, by `process_alive`'s rule
    (a program whose name starts with one of ``programs``), each with the paths it names there:
    the processes the agent (or ``fuse up``) may kill as its own."""
    found, me = {}, os.getpid()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            argv = _argv((proc / "cmdline").read_bytes())
        except OSError:
            continue
        if not argv or not os.path.basename(argv[0]).startswith(programs):
            continue  # (a grep or an editor naming a VM's files is no hypervisor)
        if (named := _naming(argv_paths(argv), str(path))) and same_files(int(proc.name), path):
            found[int(proc.name)] = named
    return found


def pids_mentioning(marker: str | Path, program: bytes | None = None) -> list[int]:
    """Processes whose command line contains ``marker`` (a state or VM dir) anywhere, in any
    mount namespace, and, when given, whose program name contains ``program`` (e.g.
    b"qemu-system"): how tools and tests find what a dir started. Never what the agent kills
    by: another agent's dir may end with ours (`hypervisors_naming`)."""
    pids = []
    needle = str(marker).encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmd and (program is None or program in cmd.split(b"\0", 1)[0]):
            pids.append(int(proc.name))
    return pids


def read_pidfile(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


async def kill_and_wait(pid: int | None, marker: str, timeout: float = 10.0) -> None:
    """SIGKILL the process and wait until it is gone (or a zombie, which
    holds no memory and is reaped by its parent)."""
    if not process_alive(pid, marker):
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    await wait_gone(pid, marker, timeout)


async def wait_gone(pid: int | None, marker: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while process_alive(pid, marker):
        if time.monotonic() > deadline:
            raise BackendError(f"process {pid} did not exit within {timeout}s")
        await asyncio.sleep(0.01)
    # a killed multi-threaded process is reapable once its last thread is gone: moments later
    while not reap(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def reap(pid: int | None) -> bool:
    """Collect an exited process's status when it is this process's child, so no
    zombie is left for init to collect (a daemonized QEMU is the agent's child once
    ``fuse host serve`` made itself the child subreaper). Never blocks; False only
    while ``pid`` is our child and not collectable yet."""
    if not pid:
        return True
    try:
        return os.waitpid(pid, os.WNOHANG)[0] != 0
    except (ChildProcessError, OSError):
        return True  # not ours (init has it), or gone already


def reap_exited_children(prefix: bytes) -> int:
    """Collect this process's exited children whose name starts with ``prefix``; how
    many. QEMU's ``-daemonize`` forks twice: the middle process ends at once, and once
    the launcher is gone it is re-parented to the subreaper (the agent), where it stayed
    a zombie, one per launch, since nothing waits for it. Only such children are
    collected: a blanket ``waitpid(-1)`` would take exits asyncio's child watcher awaits."""
    me, n = os.getpid(), 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        close = stat.rfind(b")")  # the name is in parentheses and may hold anything
        name, rest = stat[stat.find(b"(") + 1:close], stat[close + 2:].split()
        if len(rest) > 1 and rest[0] == b"Z" and rest[1] == str(me).encode() and name.startswith(prefix):
            try:
                n += os.waitpid(int(d), os.WNOHANG)[0] != 0
            except (ChildProcessError, OSError):
                pass
    return n


def become_subreaper() -> bool:
    """Linux: orphaned descendants (QEMU daemonizes) are re-parented to this process
    instead of init, so ``reap`` can collect them the moment they end."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


async def wait_console_line(spec: BootSpec, line: bytes, alive: Callable[[], bool], timeout: float,
                            offset: int = 0) -> int:
    """Wait until the console log shows ``line`` on a line of its own past
    byte ``offset``; return the offset just after it. Gives up early when
    ``alive()`` says the VM's process is gone."""
    pattern = re.compile(rb"^" + re.escape(line) + rb"\r?$", re.M)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with open(spec.console, "rb") as f:
                f.seek(offset)
                if m := pattern.search(f.read()):
                    return offset + m.end()
        except FileNotFoundError:
            pass
        if not alive():
            raise BackendError(f"vm {spec.name} ended before its console showed {line.decode()}")
        if time.monotonic() > deadline:
            raise BackendError(f"vm {spec.name} did not show {line.decode()} within {timeout:g} s")
        await asyncio.sleep(0.005)


def cpu_seconds(pid: int | None) -> float | None:
    """utime + stime of a process, in seconds (None once it is gone)."""
    if not pid:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    # fields[0] is the state (field 3); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def get_backend(name: str, **kwargs: Any) -> Backend:
    """The backend registered under ``name`` (explicit registry, no discovery)."""
    if name == "qemu":
        from .qemu import QemuBackend
        return QemuBackend(**kwargs)
    if name == "firecracker":
        from .firecracker import FirecrackerBackend
        return FirecrackerBackend(**kwargs)
    if name == "fake":
        from .fake import FakeBackend
        return FakeBackend(**kwargs)
    raise ValueError(f"unknown backend {name!r} (qemu, firecracker, fake)")

"""The local provider: "machines" are real host agents on this machine.

For development, tests and demos. Each machine is a ``fuse host serve``
process on a free loopback port, in its own session so it survives a
controller restart like a real machine would. Its id is the host name; its
agent keeps its state in ``<state_dir>/<host name>/``, beside
``machine.json`` (pid, port, type) which is how a restarted controller finds
it again.

    describe   process alive, agent not answering yet   -> pending
               agent answers on its port                -> running, http://127.0.0.1:<port>
               process or dir gone                      -> terminated
    terminate  SIGTERM the agent (SIGKILL after a bounded wait), kill every
               process whose command line names the machine's dir (its VMs are
               daemonised QEMU processes that outlive the agent), remove the dir
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from fuse.agent.backends.base import hypervisors_naming
from fuse.agent.probe import arch
from fuse.controller.pool.model import Offer
from fuse.errors import Conflict, InvalidArgument
from fuse.paths import private_dir, private_opener

from .base import CAP_OPTIONS, NAME_RE, CloudError, Machine, OptionReader, Provider, check_name, number

AGENT = [sys.executable, "-m", "fuse.cli", "host", "serve"]
DEFAULT_TYPES = ({"name": "local.small", "vcpus": 1, "mem_mib": 1024, "usd_per_hour": 0.01},
                 {"name": "local.medium", "vcpus": 2, "mem_mib": 2048, "usd_per_hour": 0.02})
TYPE_FIELDS = {"name", "vcpus", "mem_mib", "usd_per_hour", "billing_step_secs", "billing_min_secs", "boot_secs",
               "quota_family"}
DEFAULT_FAMILY = "standard"  # the quota family of a type that names none
STOP_WAIT_SECS = 10.0  # SIGTERM grace before SIGKILL
GONE_WAIT_SECS = 10.0  # for killed VMs to leave the process table
FAKE_MANIFEST = {"name": "linux", "fingerprint": "fake-bundle-0001", "kernel": "fake", "files": {}}


def _types(reader: OptionReader) -> list[dict[str, Any]]:
    raw = reader.options.get("types")
    if raw is None:
        raw = [dict(t) for t in DEFAULT_TYPES]
    if not isinstance(raw, list) or not raw:
        raise reader.bad("types", "must be a non-empty list of {name, vcpus, mem_mib, usd_per_hour, ...}")
    out, seen = [], set()
    for i, t in enumerate(raw):
        where = f"types[{i}]"
        if not isinstance(t, dict):
            raise reader.bad(where, "must be an object")
        if unknown := sorted(set(t) - TYPE_FIELDS):
            raise reader.bad(f"{where}.{unknown[0]}", f"is unknown (fields: {', '.join(sorted(TYPE_FIELDS))})")
        for key in ("name", "vcpus", "mem_mib", "usd_per_hour"):
            if key not in t:
                raise reader.bad(f"{where}.{key}", "is required")
        name = check_name(f"option {where}.name", t["name"])
        if name in seen:
            raise reader.bad(f"{where}.name", f"repeats {name!r}")
        seen.add(name)
        out.append({"name": name, "vcpus": number(f"{where}.vcpus", t["vcpus"], minimum=1, integer=True),
                    "mem_mib": number(f"{where}.mem_mib", t["mem_mib"], minimum=64, integer=True),
                    "usd_per_hour": float(number(f"{where}.usd_per_hour", t["usd_per_hour"])),
                    "billing_step_secs": number(f"{where}.billing_step_secs", t.get("billing_step_secs", 1),
                                                minimum=1, integer=True),
                    "billing_min_secs": number(f"{where}.billing_min_secs", t.get("billing_min_secs", 0),
                                               integer=True),
                    "boot_secs": number(f"{where}.boot_secs", t.get("boot_secs", 5), integer=True),
                    "quota_family": check_name(f"option {where}.quota_family",
                                               t.get("quota_family", DEFAULT_FAMILY))})
    return out


MADE_HERE = ".fuse-local-machine"  # in each machine dir this provider made


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _pids_of(machine_dir: Path) -> set[int]:
    """Processes (its agent, its VMs' hypervisors) whose command line names ``machine_dir``
    itself or a path inside it, by the agent's own rule for what it may kill: not a sibling
    whose name merely starts the same (h1 vs h10), nor a dir whose path ends with this one's,
    nor a process in another mount namespace."""
    return set(hypervisors_naming(machine_dir, programs=("",)))  # ("": any program)


class LocalProvider(Provider):
    """Host agents on loopback, one per machine, started as separate processes."""

    kind = "local"
    OPTIONS = frozenset({"types", "region", "backend", "bundle_dir", "vm_count", "dir"}) | CAP_OPTIONS

    def __init__(self, name: str, options: dict[str, Any], state_dir: Path):
        r = OptionReader(self.kind, options, self.OPTIONS)
        self.name = name
        self.region = r.str("region", "local")
        self.backend = r.str("backend", "qemu", choices=("qemu", "fake"))
        self.vm_count = r.int("vm_count", minimum=1)
        self.bundle_dir = None
        if r.has("bundle_dir"):
            self.bundle_dir = Path(r.str("bundle_dir")).resolve()
            if not (self.bundle_dir / "manifest.json").is_file():
                raise r.bad("bundle_dir", f"must be a guest bundle directory (no manifest.json in {self.bundle_dir})")
        arch_ = arch()
        self._offers = self.capped(r, [
            Offer(provider=name, type_name=t["name"], region=self.region, arch=arch_, vcpus=t["vcpus"],
                  mem_mib=t["mem_mib"], kvm=True, metal=False, usd_per_hour=t["usd_per_hour"],
                  billing_step_secs=t["billing_step_secs"], billing_min_secs=t["billing_min_secs"],
                  boot_secs=t["boot_secs"], quota_family=t["quota_family"]) for t in _types(r)])
        # Absolute, so the dir matches the command lines of the processes it starts. ``dir``: where
        # the machines live whichever controller replica looks (the pool fixes it when it links).
        self.state_dir = Path(r.str("dir") if r.has("dir") else state_dir).resolve()
        self._children: dict[str, subprocess.Popen] = {}  # agents this process started (to reap them)
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()  # the lock table, and port choice across concurrent creates

    def offers(self) -> list[Offer]:
        return list(self._offers)

    def adopt(self, old: Provider) -> None:
        if isinstance(old, LocalProvider):  # the agents it started: this process reaps them
            self._children = old._children | self._children

    def capacity(self, type_name: str) -> dict[str, int]:
        # Declared from the type: every local machine shares one real machine,
        # so a probe would report the whole of it to each.
        return self.capacity_of(self.offer(type_name, None), self.vm_count, declare_size=True)

    async def create(self, *, host_name: str, type_name: str, region: str, agent_token: str) -> Machine:
        check_name("host name", host_name)
        offer = self.offer(type_name, region)
        if not isinstance(agent_token, str) or not agent_token.strip():
            raise InvalidArgument("agent_token must be a non-empty string")
        return await asyncio.to_thread(self._create, host_name, offer, agent_token)

    async def describe(self, ids: list[str]) -> dict[str, Machine]:
        found = await asyncio.to_thread(lambda: {i: self._read_live(i) for i in ids})
        # (never through a proxy named in the environment: the agents are on this machine)
        async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
            states = await asyncio.gather(*(self._probe(http, i, rec) for i, rec in found.items()))
        return dict(zip(found, states))

    async def find(self, host_name: str) -> list[Machine]:
        """The machine is its dir, named after the host (its id): one whose agent died
        still holds VMs or files there, which ``terminate`` removes."""
        check_name("host name", host_name)
        if not await asyncio.to_thread(self._dir(host_name).exists):
            return []
        live = await asyncio.to_thread(self._read_live, host_name)
        return [Machine(host_name, "pending" if live else "stopping")]

    async def terminate(self, machine_id: str) -> None:
        check_name("machine id", machine_id)
        await asyncio.to_thread(self._terminate, machine_id)

    # -- blocking parts, run in threads --------------------------------------

    def _lock(self, machine_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(machine_id, threading.Lock())

    def _dir(self, machine_id: str) -> Path:
        return self.state_dir / machine_id

    def _record(self, machine_id: str) -> dict[str, Any] | None:
        try:
            return json.loads((self._dir(machine_id) / "machine.json").read_text())
        except (OSError, ValueError):
            return None

    def _alive(self, machine_id: str, pid: int | None) -> bool:
        child = self._children.get(machine_id)
        if child is not None:
            # Our own child: alive until reaped (its pid cannot be recycled before), and its
            # command line may still be this process's own for a moment after the fork.
            return child.poll() is None
        # The command line check guards against a recycled pid after a restart.
        return bool(pid) and f"{self._dir(machine_id)}\0".encode() in _cmdline(pid)

    def _read_live(self, machine_id: str) -> dict[str, Any] | None:
        """The machine's record while its agent process lives, else None."""
        if not (isinstance(machine_id, str) and NAME_RE.fullmatch(machine_id)):
            return None
        rec = self._record(machine_id)
        return rec if rec and self._alive(machine_id, rec.get("pid")) else None

    def _free_port(self) -> int:
        # Ports of machines still starting are not bound yet: skip them too.
        taken = {rec.get("port") for d in self.state_dir.glob("*/machine.json")
                 if (rec := self._record(d.parent.name))}
        for _ in range(100):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            if port not in taken:
                return port
        raise RuntimeError("no free loopback port")

    def _create(self, host_name: str, offer: Offer, token: str) -> Machine:
        with self._lock(host_name):
            d = self._dir(host_name)
            rec = self._record(host_name)
            if rec and self._alive(host_name, rec.get("pid")):
                raise Conflict(f"machine {host_name!r} already runs in cloud {self.name!r}")
            if d.exists():
                if not ((d / "machine.json").is_file() or (d / MADE_HERE).is_file()):  # (``dir``: any path)
                    raise Conflict(f"{d} exists and is not a machine of cloud {self.name!r} (no machine.json "
                                   f"of its own): nothing there is removed; move it away, or link the cloud "
                                   f"with another dir")
                self._clean(host_name, rec)  # leftovers of a machine that died
            private_dir(d)
            (d / MADE_HERE).touch()  # (first: a create cut short before its record is still ours to clean)
            self._install_bundle(d)
            vm_count = self.capacity_of(offer, self.vm_count, declare_size=True)["vm_count"]
            with self._guard:
                port = self._free_port()
                argv = AGENT + ["--listen", f"127.0.0.1:{port}", "--state-dir", str(d), "--backend", self.backend,
                                "--max-vms", str(vm_count)]
                with open(d / "agent.log", "ab", opener=private_opener) as log:
                    # The token goes by environment (the CLI's FUSE_HOST_TOKEN),
                    # not argv, which any local user can read in ps.
                    child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                             cwd=d, start_new_session=True,
                                             env={**os.environ, "FUSE_HOST_TOKEN": token})
                self._children[host_name] = child
                tmp = d / "machine.json.tmp"
                with open(tmp, "w", opener=private_opener) as f:
                    f.write(json.dumps({"pid": child.pid, "port": port, "type_name": offer.type_name,
                                        "region": offer.region, "backend": self.backend,
                                        "created_at": time.time()}))
                tmp.replace(d / "machine.json")
            return Machine(host_name, "pending")

    def images(self) -> set[str]:
        """What ``_install_bundle`` gives each machine."""
        return ({"linux"} if self.backend == "fake" else set()) | (
            {self.bundle_dir.name} if self.bundle_dir is not None else set())

    def _install_bundle(self, d: Path) -> None:
        # Before the agent starts: it lists its bundles at boot.
        if self.backend == "fake":
            fake = d / "bundles" / "linux"
            fake.mkdir(parents=True)
            (fake / "manifest.json").write_text(json.dumps(FAKE_MANIFEST))
        if self.bundle_dir is not None:
            dest = d / "bundles" / self.bundle_dir.name
            dest.mkdir(parents=True, exist_ok=True)
            for f in self.bundle_dir.iterdir():
                if f.is_file():
                    try:
                        os.link(f, dest / f.name)  # instant, and no extra disk
                    except OSError:
                        shutil.copy2(f, dest / f.name)  # another file system

    def _terminate(self, machine_id: str) -> None:
        with self._lock(machine_id):
            if self._dir(machine_id).exists():
                self._clean(machine_id, self._record(machine_id))
            self._children.pop(machine_id, None)

    def _clean(self, machine_id: str, rec: dict[str, Any] | None) -> None:
        d = self._dir(machine_id)
        pid = (rec or {}).get("pid")
        if self._alive(machine_id, pid):
            self._signal(pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_WAIT_SECS
            while self._alive(machine_id, pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if self._alive(machine_id, pid):
                self._signal(pid, signal.SIGKILL)
        child = self._children.get(machine_id)
        if child is not None:
            try:
                child.wait(5)
            except subprocess.TimeoutExpired:
                pass
        # VMs outlive their agent by design; a terminated machine leaves none.
        deadline = time.monotonic() + GONE_WAIT_SECS
        while (left := _pids_of(d)) and time.monotonic() < deadline:
            for p in left:
                self._signal(p, signal.SIGKILL)
            time.sleep(0.05)
        if left:
            raise CloudError(f"processes of machine {machine_id} would not die: {sorted(left)}")
        shutil.rmtree(d, ignore_errors=True)

    @staticmethod
    def _signal(pid: int, sig: int) -> None:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    async def _probe(self, http: httpx.AsyncClient, machine_id: str, rec: dict[str, Any] | None) -> Machine:
        if rec is None:
            return Machine(machine_id, "terminated")
        url = f"http://127.0.0.1:{rec['port']}"
        try:
            # No token here: any answer of the agent (401 included) says it serves.
            r = await http.get(url + "/v1/host")
        except httpx.HTTPError:
            return Machine(machine_id, "pending")
        return Machine(machine_id, "running", url) if r.status_code in (200, 401) else Machine(machine_id, "pending")

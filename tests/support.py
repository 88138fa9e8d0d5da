"""Shared builders for tests: real agent and controller processes on
loopback, free ports, a throwaway PostgreSQL server."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

FUSE = [sys.executable, "-m", "fuse.cli"]


_GIVEN: set[int] = set()


def free_port() -> int:
    """A loopback port free now, drawn from below the kernel's ephemeral
    range (32768 up), so the outgoing connections of this or another test
    cannot take it between this call and the server's bind; not one this
    process has handed out before."""
    import random
    for _ in range(200):
        port = random.randint(10000, 20999)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(pred, timeout: float = 20.0, interval: float = 0.05, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = pred()
            if last:
                return last
        except Exception as exc:  # still starting
            last = exc
        time.sleep(interval)
    raise TimeoutError(f"timed out waiting for {what}: {last!r}")


@dataclass
class Proc:
    popen: "subprocess.Popen | Forked"
    log: Path
    url: str = ""
    socket: Path | None = None
    token: str | None = None
    state_dir: Path | None = None
    extra: dict = field(default_factory=dict)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)

    def kill(self) -> None:
        self.stop(signal.SIGKILL)

    def logs(self) -> str:
        return self.log.read_text() if self.log.exists() else ""


def _spawn(args: list[str], log: Path, env: dict | None = None) -> "subprocess.Popen | Forked":
    """``python -m fuse.cli ARGS`` in a session of its own, its output to ``log``: forked
    from the suite's fork server (``zygote.py``: the imports done once) unless
    ``FUSE_TEST_FORK=0``."""
    env = {**os.environ, **(env or {})}
    if os.environ.get("FUSE_TEST_FORK", "1") != "0":
        return _Zygote.get().spawn(args, log, env)
    fh = open(log, "ab")
    return subprocess.Popen(FUSE + args, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, start_new_session=True)


class _Zygote:
    """This test process's fork server (one per pytest worker, started at the first spawn)."""
    _one: "_Zygote | None" = None
    _lock = threading.Lock()

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("zygote.py"))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)

    @classmethod
    def get(cls) -> "_Zygote":
        with cls._lock:
            if cls._one is None or cls._one.proc.poll() is not None:
                cls._one = cls()
            return cls._one

    def ask(self, req: dict) -> dict:
        import json
        with self._lock:
            self.proc.stdin.write((json.dumps(req) + "\n").encode())
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the fork server ended (exit {self.proc.wait()})")
        return json.loads(line)

    def spawn(self, args: list[str], log: Path, env: dict) -> "Forked":
        mask = os.umask(0o22)
        os.umask(mask)
        got = self.ask({"args": args, "env": env, "log": str(log), "cwd": os.getcwd(), "umask": mask})
        return Forked(got["pid"], got["start"], self)


class Forked:
    """What tests use of ``subprocess.Popen`` for a process the fork server started."""

    def __init__(self, pid: int, start: int, zygote: _Zygote):
        self.pid, self._start, self._zygote, self.returncode = pid, start, zygote, None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self._zygote.ask({"status": self._start})["code"]
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        end = None if timeout is None else time.monotonic() + timeout
        delay = 0.002
        while self.poll() is None:
            if end is not None and time.monotonic() >= end:
                raise subprocess.TimeoutExpired(FUSE, timeout)
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fake_bundle(state: Path, name: str = "linux", fingerprint: str = "fake-bundle-0001") -> None:
    """A bundle manifest for agents on the fake backend (which boots nothing)."""
    import json
    d = state / "bundles" / name
    d.mkdir(parents=True, exist_ok=True)
    if (d / "manifest.json").exists() and fingerprint == "fake-bundle-0001":
        return  # keep a bundle a test swapped in
    (d / "manifest.json").write_text(json.dumps({"name": name, "fingerprint": fingerprint, "kernel": "fake",
                                                 "files": {}}))


def start_agent(tmp: Path, *, token: str | None = "agent-token", backend: str = "qemu", port: int | None = None,
                socket_path: Path | None = None, extra: list[str] | None = None, name: str = "agent",
                env: dict | None = None) -> Proc:
    state = tmp / name
    state.mkdir(parents=True, exist_ok=True)
    if backend == "fake":
        fake_bundle(state)
    sock = socket_path or (tmp / f"{name}.sock")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    for attempt in range(PORT_TRIES):
        at = port or free_port()
        args = ["host", "serve", "--listen", f"127.0.0.1:{at}", "--state-dir", str(state), "--backend", backend,
                "--socket", str(sock)] + (["--token", token] if token else []) + (extra or [])
        since = _log_size(tmp / f"{name}.log")
        p = Proc(_spawn(args, tmp / f"{name}.log", env), tmp / f"{name}.log", url=f"http://127.0.0.1:{at}",
                 socket=sock, token=token, state_dir=state)
        up = wait_until(lambda: _port_taken(p, since) or (
            p.popen.poll() is None and httpx.get(p.url + "/v1/host", headers=headers, timeout=2).status_code == 200),
            what=f"agent {name} ({p.logs()[-500:] if p.popen.poll() is not None else ''})")
        if up != PORT_TAKEN or port or attempt == PORT_TRIES - 1:
            break
    if up == PORT_TAKEN:
        raise RuntimeError(f"agent {name}: port {at} taken: {p.logs()[-500:]}")
    return p


PORT_TRIES = 3
PORT_TAKEN = "port taken"


def _log_size(log: Path) -> int:
    return log.stat().st_size if log.exists() else 0


def _port_taken(p: "Proc", since: int) -> str | None:
    """PORT_TAKEN when ``p`` exited for its port being taken meanwhile (``free_port`` picks a
    port another process may bind before the server does): the caller starts it on another."""
    if p.popen.poll() is None or not p.log.exists():
        return None
    with open(p.log, "rb") as fh:
        fh.seek(since)
        return PORT_TAKEN if b"address already in use" in fh.read().lower() else None


def start_controller(tmp: Path, *, db: str | None = None, name: str = "controller", token: str | None = None,
                     listen: bool = False, env: dict | None = None) -> Proc:
    state = tmp / name
    sock = tmp / f"{name}.sock"
    args = ["controller", "serve", "--state-dir", str(state), "--socket", str(sock)]
    port = None
    if db:
        args += ["--db", db]
    transport = httpx.HTTPTransport(uds=str(sock))
    for _ in range(PORT_TRIES):
        given = list(args)
        if listen:
            port = free_port()
            given += ["--listen", f"127.0.0.1:{port}", "--token", token or "controller-token"]
        since = _log_size(tmp / f"{name}.log")
        p = Proc(_spawn(given, tmp / f"{name}.log", env), tmp / f"{name}.log", url=f"unix://{sock}", socket=sock,
                 token=token, state_dir=state, extra={"port": port})
        with httpx.Client(transport=transport, base_url="http://c") as c:
            # (over TCP too: the socket may answer before a taken port ends the process)
            up = wait_until(lambda: _port_taken(p, since) or (
                p.popen.poll() is None and c.get("/v1/healthz", timeout=2).status_code == 200 and (
                    port is None or httpx.get(f"http://127.0.0.1:{port}/v1/healthz", timeout=2).status_code == 200)),
                what=f"controller ({p.logs()[-800:]})")
        if up != PORT_TAKEN:
            break
    if up == PORT_TAKEN:
        raise RuntimeError(f"controller {name}: its port was taken each time: {p.logs()[-800:]}")
    return p


class Postgres:
    """A throwaway PostgreSQL server (initdb + pg_ctl) on a free loopback port,
    run as the `postgres` user since initdb refuses root."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="fuse-pg-"))
        self.port = free_port()
        self.bin = self._bindir()

    @staticmethod
    def _bindir() -> Path:
        for cand in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
            if (cand / "initdb").exists():
                return cand
        found = shutil.which("initdb")
        if not found:
            raise FileNotFoundError("no initdb: install postgresql")
        return Path(found).resolve().parent

    def _run(self, *args: str) -> None:
        cmd = [str(a) for a in args]
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    def start(self) -> "Postgres":
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(self.bin / "initdb", "-D", self.dir / "data", "-U", "postgres", "-A", "trust", "--no-sync")
        self.up()
        return self

    def up(self) -> None:
        self._run(self.bin / "pg_ctl", "-D", self.dir / "data", "-l", self.dir / "pg.log", "-w", "-t", "60", "-o",
                  f"-p {self.port} -k {self.dir} -h 127.0.0.1 -F", "start")

    def down(self) -> None:
        """Stop the server, cutting every connection (``up`` starts it again, same port)."""
        self._run(self.bin / "pg_ctl", "-D", self.dir / "data", "-m", "fast", "-w", "stop")

    def restart(self) -> None:
        self.down()
        self.up()

    def create_db(self, name: str) -> str:
        self._run(self.bin / "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)
        return f"postgresql://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        try:
            self._run(self.bin / "pg_ctl", "-D", self.dir / "data", "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def reap(marker: Path | str) -> int:
    """Kill every process whose command line mentions `marker` (a test's
    state dir): VMs outlive their agent by design, tests must not."""
    from fuse.agent.backends.base import pids_mentioning
    n = 0
    for pid in pids_mentioning(marker):
        try:
            os.kill(pid, signal.SIGKILL)
            n += 1
        except ProcessLookupError:
            pass
    return n


BUNDLE_HOME = Path(os.environ.get("FUSE_TEST_BUNDLES", "/tmp/fuse-test-bundles"))


def real_bundle_dir() -> Path:
    """The real guest bundle (Debian kernel + busybox), built once and cached.
    Test workers running in parallel take turns (a file lock): one builds, the
    others then find it built."""
    import fcntl

    from fuse.agent.bundle import build_bundle
    BUNDLE_HOME.mkdir(parents=True, exist_ok=True)
    with open(BUNDLE_HOME / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        build_bundle(BUNDLE_HOME, "linux", progress=lambda _msg: None)
    return BUNDLE_HOME / "bundles" / "linux"


def install_bundle(bundle_dir: Path, state_dir: Path) -> None:
    """Give an agent state dir a bundle (hard links: instant)."""
    dest = state_dir / "bundles" / bundle_dir.name
    dest.mkdir(parents=True, exist_ok=True)
    for f in bundle_dir.iterdir():
        try:
            os.link(f, dest / f.name)
        except OSError:
            shutil.copy2(f, dest / f.name)


class Proxy:
    """A loopback TCP proxy in front of an agent, for what a test cannot ask an
    agent to do: ``hold[prefix] = secs`` holds each request whose first bytes
    start with ``prefix`` that long before passing it on (a slow answer), and
    ``switch(port)`` sends every connection from then on to another agent,
    cutting the open ones (an agent replaced at the same address)."""

    def __init__(self, upstream_port: int):
        import threading
        self.upstream_port = upstream_port
        self.hold: dict[bytes, float] = {}
        self.held = 0  # requests held so far
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._serve, daemon=True).start()

    def switch(self, upstream_port: int) -> None:
        with self._lock:
            self.upstream_port = upstream_port
            socks, self._open = self._open, []
        for s in socks:
            self._close(s)

    def _serve(self) -> None:
        import threading
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _forward(self, data: bytes) -> bool:
        """Whether a request's bytes go on (False: hang up); subclasses drop or delay more."""
        secs = next((t for p, t in self.hold.items() if data.startswith(p)), 0)
        if secs:
            self.held += 1
            time.sleep(secs)
        return True

    def _passes(self, src: socket.socket, dst: socket.socket, data: bytes, requests: bool) -> bool:
        """Whether ``data``, read from ``src``, goes on to ``dst`` (False: hang up both);
        ``requests``: it is the client's side. Requests go by ``_forward``."""
        return not requests or self._forward(data)

    def _pipe(self, src: socket.socket, dst: socket.socket, requests: bool) -> None:
        try:
            while data := src.recv(65536):
                if not self._passes(src, dst, data, requests):
                    break
                dst.sendall(data)
        except OSError:
            pass
        self._close(src)
        self._close(dst)

    @staticmethod
    def _close(s: socket.socket) -> None:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()

    def close(self) -> None:
        self.sock.close()
        self.switch(self.upstream_port)


def answers(client) -> bool:
    """Whether the controller of ``client`` (a ``fuse.Client``) reads its store: a host list comes back."""
    import fuse

    try:
        client.hosts.list()
        return True
    except (fuse.ApiError, httpx.HTTPError):
        return False


def error_while_db_away(call, proxy, postgres, what: str):
    """The ``fuse.ApiError`` (or None) of ``call()``, run in a thread while its host's answer is
    held at ``proxy`` and the database is taken away meanwhile (back once the call answered)."""
    import fuse

    out: dict = {}

    def run():
        try:
            call()
        except fuse.ApiError as err:
            out["err"] = err
    t = threading.Thread(target=run)
    t.start()
    try:
        wait_until(lambda: proxy.held >= 1, timeout=30, what=f"the {what} held at the proxy")
        postgres.down()
        t.join(60)
    finally:
        postgres.up()
    return out.get("err")


def api_error(fn, *a, **kw):
    """The ``fuse.ApiError`` that ``fn(*a, **kw)`` raises (the test fails when it raises none)."""
    import pytest

    import fuse

    with pytest.raises(fuse.ApiError) as info:
        fn(*a, **kw)
    return info.value


def agent_vms(agent) -> dict[str, dict]:
    """What the agent itself lists, past the controller: name -> its VM record."""
    r = httpx.get(agent.url + "/v1/host/vms", headers={"Authorization": f"Bearer {agent.token}"}, timeout=10)
    return {v["name"]: v for v in r.json()["vms"]}


def agent_states(agent) -> dict[str, str]:
    """What the agent itself says of its VMs: name -> state."""
    return {name: vm["state"] for name, vm in agent_vms(agent).items()}


def end_fake_vm(agent, name: str, exit_status: int | None) -> None:
    """End a fake-backend VM's process as a guest would: with ``FUSE-EXIT n`` on its
    console first (the entry finished: exited), or without (the process died: failed)."""
    vm_dir = Path(agent.state_dir) / "vms" / name
    if exit_status is not None:
        # (with the boot's nonce, as the guest's init writes it: fuse.agent.vms._EXIT_MARK)
        import json

        nonce = json.loads((vm_dir / "vm.json").read_text()).get("platform", {}).get("exit_nonce")
        with open(vm_dir / "console.log", "a") as f:
            f.write(f"FUSE-EXIT {exit_status}{' ' + nonce if nonce else ''}\n")
    os.kill(int((vm_dir / "fake.pid").read_text().split()[0]), signal.SIGKILL)


async def unreachable(conn) -> tuple:
    """(the ``HostUnreachable`` a ``GET /v1/host`` through ``conn`` raises, the seconds it
    took); the test fails when it raises none. ``conn`` is closed either way."""
    import pytest

    from fuse.errors import HostUnreachable

    started = time.monotonic()
    try:
        with pytest.raises(HostUnreachable) as info:
            await conn.request("GET", "/v1/host")
    finally:
        await conn.close()
    return info.value, time.monotonic() - started


def refused(r: httpx.Response) -> str:
    """The message of a 400 ``invalid_argument`` answer (asserting that it is one)."""
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_argument", r.text
    return r.json()["error"]["message"]


def fake_firecracker_env(tmp: Path) -> dict:
    """The environment with a stand-in ``firecracker`` (tests/agent/fake_firecracker.py) first
    on PATH: an agent of the firecracker backend starts only where its binary is."""
    bindir = tmp / "fake-firecracker-bin"
    bindir.mkdir(parents=True, exist_ok=True)
    script = bindir / "firecracker"
    script.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).parent / 'agent' / 'fake_firecracker.py'} "
                      "\"$@\"\n")
    script.chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ.get('PATH', '')}"}


def being_created(client, name: str) -> bool:
    """Whether the controller holds VM ``name`` as being created (409 conflict with
    ``being_created``: a create of it in flight, or one its host did not answer)."""
    import fuse

    try:
        client.vms.get(name)
    except fuse.ApiError as err:
        return bool(err.details.get("being_created"))
    return False


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def veth_netns(prefix: str):
    """A network namespace of the test's own, joined to this one by a veth pair on a /30 of
    10.200-249.x (a pytest generator fixture's body: ``yield from veth_netns("t")``): yields
    ``name``, ``host_if``, ``ns_if`` and ``addr`` (the namespace's end); both go afterwards.
    Skips without root or iproute2."""
    import pytest
    import secrets

    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to create a network namespace")
    name = f"fuse-{prefix}{secrets.token_hex(3)}"
    host_if, ns_if = f"{prefix}h{name[-6:]}", f"{prefix}n{name[-6:]}"
    net = f"10.{200 + int(name[-2:], 16) % 50}.{int(name[-4:-2], 16)}"
    ip("netns", "add", name)
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", name)
        ip("addr", "add", f"{net}.1/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("-n", name, "addr", "add", f"{net}.2/30", "dev", ns_if)
        ip("-n", name, "link", "set", ns_if, "up")
        ip("-n", name, "link", "set", "lo", "up")
        yield {"name": name, "host_if": host_if, "ns_if": ns_if, "addr": f"{net}.2"}
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)

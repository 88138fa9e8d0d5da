"""Builders for the transport suite: real certificates made by the `fuse host
ca create` / `cert issue` commands, real agents and controllers as
subprocesses (logs captured for the token greps), and a real sshd on
loopback. Every process is ended by its fixture, by its own pid."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import httpx
import pytest

import fuse
from fuse.transport.tls import issue_cert
from support import free_port  # noqa: F401 (the suite's modules import it from here)

FUSE = str(Path(sys.executable).parent / "fuse") if (Path(sys.executable).parent / "fuse").exists() \
    else shutil.which("fuse")
SSHD = "/usr/sbin/sshd"
START_TIMEOUT = 30.0




def wait_for(check: Callable[[], bool], proc: subprocess.Popen, log: Path, what: str,
             timeout: float = START_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        if check():
            return
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not start within {timeout} s:\n{log.read_text()[-3000:]}")


def tcp_open(port: int, host: str = "127.0.0.1") -> Callable[[], bool]:
    def check() -> bool:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            return False
    return check


def unix_open(path: Path) -> Callable[[], bool]:
    def check() -> bool:
        if not path.exists():
            return False
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(0.5)
                s.connect(str(path))
                return True
        except OSError:
            return False
    return check


@dataclass
class Proc:
    """A subprocess we started; `stop` ends it (and only it) by pid."""
    proc: subprocess.Popen
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> Proc:
    fh = open(log, "ab")
    full_env = dict(os.environ, **(env or {}))
    proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=full_env, stdin=subprocess.DEVNULL)
    fh.close()
    return Proc(proc, log)


@pytest.fixture(scope="session")
def processes():
    """Every process the suite starts, stopped at the end even if a test failed."""
    started: list[Proc] = []
    yield started
    for p in reversed(started):
        p.stop()


# ------------------------------------------------------------------ certificates

@dataclass(frozen=True)
class Pki:
    ca: Path                 # CA "A" (ca.pem, ca.key)
    host: Path               # host cert dir from A: 127.0.0.1.pem/.key, ca.pem
    controller: Path         # controller client cert dir from A
    other_ca: Path           # CA "B"
    other_host: Path         # host cert from B
    other_controller: Path   # client cert from B
    expired: Path            # client cert from A, already expired

    def files(self, d: Path, name: str) -> tuple[str, str, str]:
        return str(d / f"{name}.pem"), str(d / f"{name}.key"), str(d / "ca.pem")


def run_fuse_all(commands: list[tuple[str, ...]]) -> None:
    """Run `fuse ...` commands side by side (each is a Python start-up)."""
    procs = [subprocess.Popen([FUSE, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for args in commands]
    for args, proc in zip(commands, procs):
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"fuse {' '.join(args)} failed:\n{out}"


@pytest.fixture(scope="session")
def pki(tmp_path_factory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    p = Pki(ca=root / "ca", host=root / "host", controller=root / "ctl", other_ca=root / "ca-b",
            other_host=root / "host-b", other_controller=root / "ctl-b", expired=root / "expired")
    run_fuse_all([("host", "ca", "create", "--out", str(p.ca)),
                  ("host", "ca", "create", "--out", str(p.other_ca), "--name", "someone else's CA")])
    run_fuse_all([
        ("host", "cert", "issue", "--ca", str(p.ca), "--name", "127.0.0.1", "--out", str(p.host)),
        ("host", "cert", "issue", "--ca", str(p.ca), "--name", "controller", "--client", "--out", str(p.controller)),
        ("host", "cert", "issue", "--ca", str(p.other_ca), "--name", "127.0.0.1", "--out", str(p.other_host)),
        ("host", "cert", "issue", "--ca", str(p.other_ca), "--name", "controller", "--client",
         "--out", str(p.other_controller))])
    issue_cert(p.ca, "controller", p.expired, client=True, days=-1)
    return p


# ------------------------------------------------------------------ agents and controllers

@dataclass
class Agent:
    proc: Proc
    state_dir: Path
    port: int | None = None
    socket: Path | None = None
    token: str | None = None
    host: str = "127.0.0.1"

    @property
    def tls_addr(self) -> str:
        return f"{self.host}:{self.port}"


def start_agent(processes, tmp: Path, *, port: int | None = None, socket_path: Path | None = None,
                token: str | None = None, tls: tuple[str, str, str] | None = None, backend: str = "qemu",
                wait: bool = True, host: str = "127.0.0.1", env: dict[str, str] | None = None) -> Agent:
    tmp.mkdir(parents=True, exist_ok=True)
    state = tmp / "agent-state"
    if backend == "fake":
        from support import fake_bundle
        fake_bundle(state)
    args = [FUSE, "host", "serve", "--state-dir", str(state), "--backend", backend]
    if port:
        args += ["--listen", f"{host}:{port}"]
    if socket_path:
        args += ["--socket", str(socket_path)]
    if token:
        args += ["--token", token]
    if tls:
        args += ["--tls-cert", tls[0], "--tls-key", tls[1], "--tls-ca", tls[2]]
    log = tmp / "agent.log"
    proc = spawn(args, log, env)
    processes.append(proc)
    if wait:
        wait_for(tcp_open(port, host) if port else unix_open(socket_path), proc.proc, log, "fuse host serve")
    return Agent(proc, state, port, socket_path, token, host)


@dataclass
class Controller:
    proc: Proc
    socket: Path
    port: int | None = None
    token: str | None = None
    _clients: list = field(default_factory=list)

    def client(self) -> fuse.Client:
        c = fuse.Client(f"unix://{self.socket}", timeout=60)
        self._clients.append(c)
        return c

    def http(self) -> httpx.Client:
        c = httpx.Client(transport=httpx.HTTPTransport(uds=str(self.socket)), base_url="http://fuse", timeout=60)
        self._clients.append(c)
        return c

    def close(self) -> None:
        for c in self._clients:
            c.close()
        self.proc.stop()


def start_controller(processes, tmp: Path, *, env: dict[str, str] | None = None, port: int | None = None,
                     token: str | None = None) -> Controller:
    tmp.mkdir(parents=True, exist_ok=True)
    sock = tmp / "run" / "controller.sock"   # run/ does not exist: fuse makes it 0700
    args = [FUSE, "controller", "serve", "--state-dir", str(tmp / "ctl-state"), "--socket", str(sock)]
    if port:
        args += ["--listen", f"127.0.0.1:{port}", "--token", token or ""]
    log = tmp / "controller.log"
    proc = spawn(args, log, env)
    processes.append(proc)
    wait_for(unix_open(sock), proc.proc, log, "fuse controller serve")
    if port:
        wait_for(tcp_open(port), proc.proc, log, "fuse controller serve (TCP)")
    return Controller(proc, sock, port, token)


# ------------------------------------------------------------------ sshd

@dataclass
class Sshd:
    port: int
    proc: Proc
    key: Path           # authorised user key
    wrong_key: Path     # a key sshd does not know
    known_hosts: Path   # has sshd's host key for [127.0.0.1]:port
    wrong_known_hosts: Path  # has some other key for [127.0.0.1]:port

    @property
    def addr(self) -> str:
        return f"ssh://root@127.0.0.1:{self.port}"

    def env(self, relay: str) -> dict[str, str]:
        return {"FUSE_SSH_KEY": str(self.key), "FUSE_SSH_KNOWN_HOSTS": str(self.known_hosts),
                "FUSE_SSH_RELAY": relay, "FUSE_SSH_CONNECT_TIMEOUT": "10"}

    def sessions(self) -> int:
        return self.proc.text().count("Accepted publickey")


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)],
                   check=True, timeout=30)
    return path.with_suffix(".pub").read_text().strip()


@pytest.fixture(scope="session")
def sshd(tmp_path_factory, processes) -> Sshd:
    if os.geteuid() != 0 or not Path(SSHD).exists():
        pytest.skip("needs root and openssh-server to run a throwaway sshd")
    d = tmp_path_factory.mktemp("sshd")
    host_pub = _keygen(d / "host_key")
    other_host_pub = _keygen(d / "other_host_key")
    user_pub = _keygen(d / "user_key")
    _keygen(d / "wrong_key")
    (d / "authorized_keys").write_text(user_pub + "\n")
    port = free_port()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(host_pub.split()[:2])}\n")
    (d / "wrong_known_hosts").write_text(f"[127.0.0.1]:{port} {' '.join(other_host_pub.split()[:2])}\n")
    cfg = d / "sshd_config"
    cfg.write_text(f"""
ListenAddress 127.0.0.1
HostKey {d / 'host_key'}
PidFile {d / 'sshd.pid'}
AuthorizedKeysFile {d / 'authorized_keys'}
StrictModes no
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
# Offered on purpose: the client must still never prompt (batch mode).
PasswordAuthentication yes
KbdInteractiveAuthentication yes
MaxSessions 10
LogLevel INFO
""")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege-separation directory sshd insists on
    proc = spawn([SSHD, "-D", "-e", "-f", str(cfg), "-p", str(port)], d / "sshd.log")
    processes.append(proc)
    wait_for(tcp_open(port), proc.proc, proc.log, "sshd")
    return Sshd(port, proc, d / "user_key", d / "wrong_key", d / "known_hosts", d / "wrong_known_hosts")


@pytest.fixture
async def relay_env(sshd, monkeypatch):
    """The session's sshd, the controller's SSH settings pointed at it (the relay its own command)."""
    from fuse.transport import ssh

    for k, v in sshd.env("true").items():
        monkeypatch.setenv(k, v)
    yield sshd
    await ssh.close_all()


def second_sshd(sshd: Sshd, processes, tmp_path: Path, max_sessions: int = 10):
    """Another sshd on its own port, with the suite's host key and authorised key (and
    ``max_sessions`` sessions a connection): ``(proc, port, known_hosts)``."""
    d = sshd.key.parent
    port = free_port()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {' '.join((d / 'host_key.pub').read_text().split()[:2])}\n")
    cfg = tmp_path / "sshd_config"
    cfg.write_text(f"""
ListenAddress 127.0.0.1
HostKey {d / 'host_key'}
PidFile {tmp_path / 'sshd.pid'}
AuthorizedKeysFile {d / 'authorized_keys'}
StrictModes no
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
MaxSessions {max_sessions}
LogLevel INFO
""")
    proc = spawn([SSHD, "-D", "-e", "-f", str(cfg), "-p", str(port)], tmp_path / "sshd.log")
    processes.append(proc)
    wait_for(tcp_open(port), proc.proc, proc.log, "sshd")
    return proc, port, known

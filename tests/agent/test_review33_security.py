"""Review 33 (security).

- A VM whose dir is too deep for a unix socket path (108 bytes) had its QMP and
  entry sockets at a predictable name in the shared temp dir: another user could
  put a link there (the root agent chmodded its target), a link loop (the boot
  failed and left QEMU running) or a directory (every boot and delete failed, the
  delete with a 500). They are in the agent's own 0700 runtime dir now, at a path
  an agent started again finds (adoption), and a launch that fails after QEMU
  started kills it.
- The bulk protocol checks the token before anything else of the header: a caller
  without it gets 401 whatever it sent (a deeply nested header was a 500 and a
  traceback in the agent's log), and one with it still gets the 400s.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest

from agent_support import qemu_pids
from fuse.agent.backends.base import BootSpec
from fuse.agent.bulk import MAGIC
from support import FUSE, install_bundle, start_agent, wait_until

TOKEN = "agent-token"
LONG = "v" + "x" * 62  # the longest VM name the API takes


def _port() -> int:
    """A free port of this review's range (23600-23699)."""
    for port in range(23600, 23700):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 23600-23699")


def _qmp_arg(pid: int) -> Path:
    """The QMP socket path on QEMU's own command line."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    qmp = argv[argv.index(b"-qmp") + 1].decode()
    return Path(qmp.removeprefix("unix:").split(",server=")[0])


def _old_tmp_path(vm_dir: Path, name: str) -> Path:
    """Where the agent put a deep VM's socket before: the shared temp dir, a name anyone can work out."""
    return Path(tempfile.gettempdir()) / f"fuse-{name}-{hashlib.sha256(str(vm_dir).encode()).hexdigest()[:20]}.sock"


@pytest.fixture
def deep(tmp_path, bundle_dir):
    """A real agent (qemu) whose state dir is deep enough that a VM named LONG has no
    room for its sockets in its own dir; its VMs' processes killed after."""
    tmp = tmp_path / ("d" * 40)
    install_bundle(bundle_dir, tmp / "agent")
    agents = []

    def start():
        agents.append(a := start_agent(tmp, port=_port(), socket_path=tmp_path / "a.sock"))
        return a
    yield start
    for a in agents:
        a.stop()
    for pid in qemu_pids(str(tmp)):
        os.kill(pid, signal.SIGKILL)


def _client(agent) -> httpx.Client:
    return httpx.Client(base_url=agent.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)


@pytest.mark.qemu
def test_a_deep_vms_sockets_are_in_a_private_dir_no_other_user_can_plant_in(deep, tmp_path):
    agent = deep()
    vm_dir = agent.state_dir / "vms" / LONG
    assert len(str(vm_dir / "qmp.sock")) >= 100
    # What another user could do in the shared temp dir: a link at the entry socket's old
    # name to a file of root's (the agent chmodded it 0600).
    victim = tmp_path / "victim.txt"
    victim.write_text("root's\n")
    victim.chmod(0o644)
    planted = [_old_tmp_path(vm_dir, "entry")]
    try:
        planted[0].symlink_to(victim)
        with _client(agent) as c:
            r = c.post("/v1/host/vms", json={"name": LONG, "shape": {"vcpus": 1, "mem_mib": 128},
                                             "entry": "sleep 600"})
            assert r.status_code == 201, r.text
            pid = r.json()["pid"]
            assert stat.S_IMODE(victim.stat().st_mode) == 0o644, "the agent chmodded a file another user chose"
            qmp = _qmp_arg(pid)
            assert qmp.parent != Path(tempfile.gettempdir()), qmp
            st = os.lstat(qmp.parent)
            assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid(), qmp.parent
            assert stat.S_IMODE(st.st_mode) == 0o700, oct(st.st_mode)
            assert stat.S_ISSOCK(os.lstat(qmp).st_mode) and stat.S_IMODE(os.lstat(qmp).st_mode) == 0o600

        # An agent started again finds the running VM's QMP socket (the same path): it is
        # fully managed after adoption, sleep (QMP) and wake included.
        agent.stop(signal.SIGKILL)
        assert qemu_pids(str(vm_dir)) == [pid]
        agent = deep()
        with _client(agent) as c:
            vm = c.get(f"/v1/host/vms/{LONG}").json()
            assert (vm["state"], vm["pid"]) == ("running", pid)
            events = c.get("/v1/host/events").json()["events"]
            assert not [e for e in events if e["type"] == "vm_adopt_warning"], events
            r = c.post(f"/v1/host/vms/{LONG}/sleep")
            assert r.status_code == 200 and r.json()["state"] == "sleeping", r.text
            r = c.post(f"/v1/host/vms/{LONG}/wake")
            assert r.status_code == 200 and r.json()["state"] == "running", r.text
            assert _qmp_arg(r.json()["pid"]) == qmp
            assert c.delete(f"/v1/host/vms/{LONG}").status_code == 204
        assert not qemu_pids(str(vm_dir))
        assert not os.path.lexists(qmp)
    finally:
        for p in planted + [_old_tmp_path(vm_dir, "qmp")]:  # (the second: what the old code left)
            if p.is_symlink() or p.is_socket() or p.is_file():
                p.unlink()
            elif p.is_dir():
                shutil.rmtree(p)


@pytest.mark.qemu
def test_a_directory_at_a_deep_vms_socket_path_fails_neither_its_boot_nor_its_delete(deep):
    """What sits at the sockets' paths is cleared: a directory there failed every boot
    (``Is a directory``) and every delete (500 and a traceback)."""
    from fuse.agent.backends.qemu import entry_path, qmp_path
    agent = deep()
    vm_dir = agent.state_dir / "vms" / LONG
    made = [qmp_path(vm_dir), entry_path(vm_dir)]
    try:
        made[0].parent.mkdir(mode=0o700, exist_ok=True)
        made[0].mkdir()
        with _client(agent) as c:
            r = c.post("/v1/host/vms", json={"name": LONG, "shape": {"vcpus": 1, "mem_mib": 128},
                                             "entry": "sleep 600"})
            assert r.status_code == 201, r.text
            made[1].mkdir()  # (a VM that is not on standby has no entry socket: the path is free)
            r = c.delete(f"/v1/host/vms/{LONG}")
            assert r.status_code == 204, r.text
            assert c.get("/v1/host").json()["vm_count"] == 0
        assert not qemu_pids(str(vm_dir))
        assert "Traceback" not in agent.logs()
        assert not any(os.path.lexists(p) for p in made)
    finally:
        for p in made:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)


@pytest.mark.qemu
async def test_a_launch_that_fails_after_qemu_started_kills_it(tmp_path, bundle_dir, monkeypatch):
    from fuse.agent.backends import qemu
    from fuse.agent.backends.base import BackendError
    backend = qemu.QemuBackend(tmp_path, accel="tcg")
    vm_dir = tmp_path / "vms" / "v1"
    spec = BootSpec(name="v1", vm_dir=vm_dir, vcpus=1, mem_mib=128, entry="sleep 600",
                    kernel=bundle_dir / "vmlinux", initrd=bundle_dir / "initrd.cpio.gz", platform=backend.platform())
    chmod = os.chmod

    def failing(path, mode, *a, **kw):  # what a link loop at the socket's path did (ELOOP)
        if str(path).endswith(".sock"):
            raise OSError(40, "Too many levels of symbolic links", str(path))
        return chmod(path, mode, *a, **kw)
    monkeypatch.setattr(os, "chmod", failing)
    with pytest.raises((OSError, BackendError)):
        await backend._launch(spec)
    monkeypatch.undo()
    wait_until(lambda: not qemu_pids(str(vm_dir)), timeout=5, what="no QEMU left")
    assert not os.path.lexists(vm_dir / "qmp.sock")


async def test_a_deep_firecracker_vms_api_socket_is_in_the_private_dir_too(tmp_path):
    """(The same predictable temp dir name as QEMU's; a stand-in firecracker binary.)"""
    from fuse.agent.backends.firecracker import FirecrackerBackend, api_socket
    binary = tmp_path / "firecracker"
    binary.write_text(f"#!/bin/sh\nexec {sys.executable} {Path(__file__).parent / 'fake_firecracker.py'} \"$@\"\n")
    binary.chmod(0o755)
    vm_dir = tmp_path / ("d" * 40) / "vms" / LONG
    bundle = tmp_path / "bundle"
    spec = BootSpec(name=LONG, vm_dir=vm_dir, vcpus=1, mem_mib=128, entry="echo hi", kernel=bundle / "vmlinux",
                    initrd=bundle / "initrd.cpio.gz")
    victim = tmp_path / "victim.txt"
    victim.write_text("root's\n")
    victim.chmod(0o644)
    old = _old_tmp_path(vm_dir, "fc")
    sock = api_socket(vm_dir)
    backend = FirecrackerBackend(binary=str(binary))
    try:
        old.symlink_to(victim)
        await backend.start(spec)
        assert stat.S_IMODE(victim.stat().st_mode) == 0o644 and old.is_symlink()
        assert sock.parent != Path(tempfile.gettempdir()), sock
        st = os.lstat(sock.parent)
        assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) == 0o700
        assert stat.S_ISSOCK(os.lstat(sock).st_mode) and stat.S_IMODE(os.lstat(sock).st_mode) == 0o600
        await backend.stop(spec)
        assert backend.pid(spec) is None and not os.path.lexists(sock)
    finally:
        await backend.stop(spec)
        old.unlink(missing_ok=True)
        Path(f"{sock}.requests").unlink(missing_ok=True)  # (the stand-in's log of what it was asked)


# ---- the bulk protocol: the token before anything else ------------------------------------

def _ask(agent, raw: bytes) -> tuple[dict, bytes]:
    host, port = agent.url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(raw)
        data = b""
        while not data.endswith(b"\n"):
            got = s.recv(65536)
            assert got, f"connection closed after {data!r}"
            data += got
    return json.loads(data), data


HEADERS = {
    "deeply nested": MAGIC + b"[" * 3000 + b"\n",
    "deeply nested object": MAGIC + b'{"a":' * 3000 + b"\n",
    "not JSON": MAGIC + b"hello\n",
    "not an object": MAGIC + b"[]\n",
    "bad UTF-8": MAGIC + b'{"token": "\xff"}\n',
    "a lone surrogate as token": MAGIC + b'{"op": "read", "token": "\\ud800"}\n',
    "a token that is no string": MAGIC + b'{"op": "read", "token": [[[1]]]}\n',
    "extra bytes": MAGIC + b'{"op": "read"}\nEXTRA',
    "a wrong token and extra bytes": MAGIC + b'{"op": "read", "token": "nope"}\nEXTRA',
}


@pytest.fixture
def bulk_agent(tmp_path):
    a = start_agent(tmp_path, backend="fake", port=_port())
    yield a
    a.stop()


def test_a_bulk_header_without_the_token_is_401_whatever_it_holds(bulk_agent):
    before = len(bulk_agent.logs())
    for what, raw in HEADERS.items():
        reply, _ = _ask(bulk_agent, raw)
        assert (reply["ok"], reply["status"], reply["error"]["code"]) == (False, 401, "unauthorized"), (what, reply)
    log = bulk_agent.logs()[before:]
    assert "Traceback" not in log and "failed before its first reply" not in log, log


def test_with_the_token_a_bad_bulk_header_is_still_a_400(bulk_agent):
    for raw, said in [
            (MAGIC + f'{{"op": "read", "token": "{TOKEN}"}}\nEXTRA'.encode(), "bytes arrived before"),
            (MAGIC + f'{{"op": "nope", "token": "{TOKEN}", "length": 1}}\n'.encode(), "unknown bulk operation"),
            (MAGIC + f'{{"op": "read", "token": "{TOKEN}", "offset": -1, "length": 1}}\n'.encode(),
             "non-negative integers")]:
        reply, _ = _ask(bulk_agent, raw)
        assert (reply["status"], reply["error"]["code"]) == (400, "invalid_argument"), reply
        assert said in reply["error"]["message"], reply
    assert "Traceback" not in bulk_agent.logs()


def test_over_the_owner_only_socket_a_bad_header_is_a_400_not_a_500(bulk_agent):
    """No token is needed there, so what is wrong with the header is said: a nested one too."""
    for raw, said in [(MAGIC + b"[" * 3000 + b"\n", "nested too deeply"),
                      (MAGIC + b"hello\n", "not JSON"), (MAGIC + b"[]\n", "must be a JSON object")]:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(str(bulk_agent.socket))
            s.sendall(raw)
            data = b""
            while not data.endswith(b"\n"):
                got = s.recv(65536)
                assert got, data
                data += got
        reply = json.loads(data)
        assert (reply["status"], reply["error"]["code"]) == (400, "invalid_argument"), reply
        assert said in reply["error"]["message"], reply
    assert "Traceback" not in bulk_agent.logs()


# ---- the runtime dir and the socket dir's wording -------------------------------------------

NOBODY = 65534


def test_the_runtime_dir_is_made_owner_only_and_refused_when_it_is_not_ours(tmp_path, monkeypatch):
    from fuse import paths
    rt = tmp_path / "rt"
    monkeypatch.setattr(paths, "runtime_dir", lambda: rt)
    assert paths.private_runtime_dir() == rt and stat.S_IMODE(os.lstat(rt).st_mode) == 0o700
    rt.chmod(0o755)  # ours, made looser: tightened
    paths.private_runtime_dir()
    assert stat.S_IMODE(os.lstat(rt).st_mode) == 0o700
    os.chown(rt, NOBODY, -1)  # another user's: refused
    with pytest.raises(PermissionError, match="owned by another user"):
        paths.private_runtime_dir()
    rt.rmdir()
    (tmp_path / "mine").mkdir(mode=0o700)
    for target in (tmp_path / "mine", tmp_path / "nowhere"):  # a link, even to a dir of ours: refused
        rt.symlink_to(target)
        with pytest.raises(PermissionError, match="is a symbolic link"):
            paths.private_runtime_dir()
        rt.unlink()


def _serve_error(tmp_path, sock: Path) -> str:
    r = subprocess.run(FUSE + ["host", "serve", "--backend", "fake", "--state-dir", str(tmp_path / "st"),
                               "--listen", f"127.0.0.1:{_port()}", "--token", TOKEN, "--socket", str(sock)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0, r.stderr
    return r.stderr


def test_a_socket_dir_another_user_owns_is_called_a_link_only_when_it_is_one(tmp_path):
    nob = tmp_path / "nob"
    nob.mkdir()
    os.chown(nob, NOBODY, -1)
    said = " ".join(_serve_error(tmp_path, nob / "a.sock").split())
    assert f"{nob} belongs to another user (uid {NOBODY})" in said, said
    assert "symbolic link" not in said, said
    # A link of ours to their dir: theirs, said so; a link they made (to a dir of ours): a link.
    (tmp_path / "lnk").symlink_to(nob)
    said = " ".join(_serve_error(tmp_path, tmp_path / "lnk" / "a.sock").split())
    assert "belongs to another user" in said and "symbolic link" not in said, said
    (tmp_path / "mine").mkdir(mode=0o700)
    (tmp_path / "theirs").symlink_to(tmp_path / "mine")
    os.lchown(tmp_path / "theirs", NOBODY, -1)
    said = " ".join(_serve_error(tmp_path, tmp_path / "theirs" / "a.sock").split())
    assert "is a symbolic link that belongs to another user" in said, said


@pytest.mark.qemu
def test_a_vm_an_older_agent_started_keeps_its_socket_at_the_old_name_and_is_managed_after_an_upgrade(deep):
    """The diff review: a deep VM started by an agent before the runtime dir listens at the shared
    temp dir's name; the upgraded agent adopted it but could not reach its QMP socket (every sleep,
    move and drain of it failed). Its socket is used while it is a socket of ours there."""
    agent = deep()
    vm_dir = agent.state_dir / "vms" / LONG
    old = _old_tmp_path(vm_dir, "qmp")
    try:
        with _client(agent) as c:
            r = c.post("/v1/host/vms", json={"name": LONG, "shape": {"vcpus": 1, "mem_mib": 128},
                                             "entry": "sleep 600"})
            assert r.status_code == 201, r.text
            pid = r.json()["pid"]
        agent.stop(signal.SIGKILL)
        os.rename(_qmp_arg(pid), old)  # (where the older agent had QEMU listen: connectable there)
        agent = deep()
        with _client(agent) as c:
            r = c.post(f"/v1/host/vms/{LONG}/sleep")
            assert r.status_code == 200 and r.json()["state"] == "sleeping", r.text  # (was: sleep_failed)
            r = c.post(f"/v1/host/vms/{LONG}/wake")
            assert r.status_code == 200 and r.json()["state"] == "running", r.text
            assert _qmp_arg(r.json()["pid"]).parent != Path(tempfile.gettempdir())  # (woken: the new place)
            assert c.delete(f"/v1/host/vms/{LONG}").status_code == 204
    finally:
        if old.is_socket():
            old.unlink()

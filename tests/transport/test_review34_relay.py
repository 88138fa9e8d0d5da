"""Review 34: over ssh://, a create sent just after the host's agent died went out on a kept
(idle) channel whose relay had been connected to the agent: the relay ended with exit 0 when
the agent hung up, though it forwarded nothing of the request, so the create read as "may
still create it", no other host was tried and the name was held (over unix:// it passed on).
A relay whose agent hangs up with nothing sent to it since its last answer now exits 69, as
one that could not connect (README: "a relay that cannot connect to the agent exits 69
having forwarded nothing, so a create passes on"), and the request, which reached no agent,
is sent again on a channel of its own. A relay that did hand the agent the request still
reads as one that may have delivered it, and that request is never sent twice.

A real sshd on loopback and the real `fuse host relay`; a real agent, and a socket server
standing in for one where the test needs an agent that hangs up at a given moment."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from fuse.errors import HostUnreachable
from fuse.transport import HostConnection, ssh

from .conftest import FUSE, start_agent


class Agent:
    """A unix socket server speaking just enough of the agent's HTTP: GET answers 200 and keeps
    the connection; a POST is recorded and, with ``die_on_post``, hung up on unanswered.
    ``hang_up()`` closes every connection and stops listening (the agent died)."""

    def __init__(self, path, die_on_post: bool = False):
        self.path, self.die_on_post = str(path), die_on_post
        self.posts: list[bytes] = []
        self.conns: list[socket.socket] = []
        self.srv = socket.socket(socket.AF_UNIX)
        self.srv.bind(self.path)
        self.srv.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    got = conn.recv(65536)
                    if not got:
                        return
                    buf += got
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = next((int(ln.split(b":", 1)[1]) for ln in head.split(b"\r\n")
                               if ln.lower().startswith(b"content-length:")), 0)
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                if head.startswith(b"POST"):
                    self.posts.append(head)
                    if self.die_on_post:
                        conn.close()
                        return
                body = b'{"hello": "agent"}'
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                             % (len(body), body))
        except OSError:
            return

    def hang_up(self, listening: bool = False) -> None:
        """Close every connection; stop listening too unless ``listening`` (an agent that closed
        its idle keep-alive connections)."""
        if not listening:
            self.srv.close()
            os.unlink(self.path)
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()


def relay(path) -> subprocess.Popen:
    return subprocess.Popen([FUSE, "host", "relay", "--socket", str(path)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# ------------------------------------------------------------------ the relay on its own

def test_a_relay_whose_agent_hangs_up_before_it_got_anything_exits_69(tmp_path):
    agent = Agent(tmp_path / "agent.sock")
    r = relay(agent.path)
    try:
        r.stdin.write(b"GET /v1/host HTTP/1.1\r\nhost: agent\r\n\r\n")
        r.stdin.flush()
        assert r.stdout.read1(65536).startswith(b"HTTP/1.1 200")  # answered: nothing is pending
        agent.hang_up()
        assert r.wait(10) == 69, r.stderr.read()  # (it was 0: taken for a request the agent may have got)
        said = r.stderr.read().decode()
        assert f"the host agent at {agent.path} hung up before this relay handed it the request" in said, said
    finally:
        r.kill()
        r.wait()


def test_a_relay_that_handed_the_agent_a_request_it_did_not_answer_exits_0(tmp_path):
    agent = Agent(tmp_path / "agent.sock", die_on_post=True)
    r = relay(agent.path)
    try:
        r.stdin.write(b"POST /v1/host/vms HTTP/1.1\r\nhost: agent\r\ncontent-length: 2\r\n\r\n{}")
        r.stdin.flush()
        assert r.wait(10) == 0, r.stderr.read()  # the agent got it: it may act on it
        assert len(agent.posts) == 1
    finally:
        agent.srv.close()
        r.kill()
        r.wait()


def test_a_relay_the_controller_ends_exits_0(tmp_path):
    agent = Agent(tmp_path / "agent.sock")
    r = relay(agent.path)
    try:
        r.stdin.close()
        assert r.wait(10) == 0, r.stderr.read()
        assert r.stderr.read() == b""
    finally:
        agent.srv.close()
        r.kill()
        r.wait()


# ------------------------------------------------------------------ through sshd, as the controller sends


async def post_on_kept_channel(addr: str, before_post, wait_for_exit: bool) -> HostUnreachable:
    """A GET (its channel kept idle), ``before_post()``, then a create that must fail."""
    conn = HostConnection(addr, timeout=20)
    try:
        assert (await conn.request("GET", "/v1/host")).status_code == 200
        shared = ssh._shared_for(ssh.SshTarget.parse(addr))
        kept = list(shared.idle)
        assert len(kept) == 1
        before_post()
        if wait_for_exit:
            # the relay's exit has come, yet the channel is taken as usable: the create goes out
            # on it, as one sent in the moment before the exit reaches the controller does
            await kept[0].process.wait_closed()
            kept[0].usable = lambda now: True
        with pytest.raises(HostUnreachable) as info:
            await conn.request("POST", "/v1/host/vms", json={"name": "x1"})
        return info.value
    finally:
        await conn.close()


async def test_a_create_on_a_kept_channel_whose_agent_died_reached_no_agent(relay_env, monkeypatch, tmp_path):
    agent = Agent(tmp_path / "agent.sock")
    monkeypatch.setenv("FUSE_SSH_RELAY", f"{FUSE} host relay --socket {agent.path}")
    err = await post_on_kept_channel(relay_env.addr, agent.hang_up, wait_for_exit=True)
    # (it was True: "may still create it ..., so no other host was tried", and the name held)
    assert getattr(err, "maybe_sent", True) is False, err.message
    assert "(its relay ended, exit 0)" not in err.message, err.message
    assert agent.posts == []


async def test_a_create_on_a_kept_channel_the_agent_closed_idle_goes_on_a_new_one(relay_env, monkeypatch,
                                                                                  tmp_path):
    """(the agent alive: it closed the kept channel's connection as it idled, or restarted)"""
    agent = Agent(tmp_path / "agent.sock")
    monkeypatch.setenv("FUSE_SSH_RELAY", f"{FUSE} host relay --socket {agent.path}")
    conn = HostConnection(relay_env.addr, timeout=20)
    try:
        assert (await conn.request("GET", "/v1/host")).status_code == 200
        kept = list(ssh._shared_for(ssh.SshTarget.parse(relay_env.addr)).idle)
        agent.hang_up(listening=True)
        await kept[0].process.wait_closed()
        kept[0].usable = lambda now: True  # (as a create sent before the relay's exit has come)
        r = await conn.request("POST", "/v1/host/vms", json={"name": "x1"})
    finally:
        await conn.close()
        agent.srv.close()
    assert r.status_code == 200  # (it was 502: the create went on to another host)
    assert len(agent.posts) == 1, agent.posts  # sent once, on the new channel


async def test_a_create_the_agent_got_on_a_kept_channel_may_have_gone_and_is_not_sent_again(
        relay_env, monkeypatch, tmp_path):
    agent = Agent(tmp_path / "agent.sock", die_on_post=True)
    monkeypatch.setenv("FUSE_SSH_RELAY", f"{FUSE} host relay --socket {agent.path}")
    try:
        err = await post_on_kept_channel(relay_env.addr, lambda: None, wait_for_exit=False)
    finally:
        agent.srv.close()
    assert getattr(err, "maybe_sent", True) is True, err.message
    assert "was dropped before the host answered" in err.message, err.message
    assert len(agent.posts) == 1, agent.posts  # (never sent twice)


async def test_a_create_just_after_a_real_agent_was_killed_passes_on(relay_env, monkeypatch, tmp_path, processes):
    """The review's case: a real agent behind `fuse host relay` SIGKILLed, and a create as soon
    as it is gone (a create sent while it is still dying may be in its socket: that one may
    have gone, and reads so)."""
    for round in range(3):
        sock = tmp_path / f"agent{round}.sock"
        agent = start_agent(processes, tmp_path / f"a{round}", socket_path=sock, backend="fake")
        monkeypatch.setenv("FUSE_SSH_RELAY", f"{FUSE} host relay --socket {sock}")

        def killed() -> None:
            agent.proc.proc.send_signal(signal.SIGKILL)
            agent.proc.proc.wait(10)

        err = await post_on_kept_channel(relay_env.addr, killed, wait_for_exit=False)
        assert getattr(err, "maybe_sent", True) is False, err.message
        await ssh.close_all()
        time.sleep(0.1)


def test_a_relay_refuses_a_given_socket_in_a_directory_others_may_write_to(tmp_path):
    """(review 34: only the default socket's directory was checked; the servers refuse such a
    directory for --socket too, so whoever listened there got the controller's requests)"""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    agent = Agent(shared / "agent.sock")
    try:
        r = subprocess.run([FUSE, "host", "relay", "--socket", str(agent.path)], input=b"GET /v1/host HTTP/1.1\r\n"
                           b"host: agent\r\n\r\n", capture_output=True, timeout=30)
        assert r.returncode == 69 and b"is writable by others (mode 777)" in r.stderr, r
        assert r.stdout == b""
    finally:
        agent.srv.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the directory is given to another user")
def test_a_relay_takes_a_given_socket_in_another_users_own_directory(tmp_path):
    """(the diff review: a root relay to an agent that runs as its own user, in its own 0700
    directory, was refused as "belongs to another user"; only others writing there is a risk)"""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    agent = Agent(theirs / "agent.sock")
    os.chown(theirs, 65534, 65534)
    r = relay(agent.path)
    try:
        r.stdin.write(b"GET /v1/host HTTP/1.1\r\nhost: agent\r\n\r\n")
        r.stdin.flush()
        assert r.stdout.read1(65536).startswith(b"HTTP/1.1 200"), r.stderr.read()
    finally:
        agent.srv.close()
        r.kill()
        r.wait()

"""A frozen SSH host: its sshd (and every process under it, the relay
included) SIGSTOPped, so TCP stays open and nothing answers. Each request
fails within the time its reason quotes (FUSE_SSH_CONNECT_TIMEOUT's default,
the poller's own per-poll bound), every surface quotes that one time, and the
host shows disconnected after two such polls. The sshd here is this module's own: freezing the
suite's shared one would stall every other SSH test."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from pathlib import Path

import pytest

import fuse

from .conftest import FUSE, second_sshd, start_agent, start_controller

STALL_S = 5.0  # FUSE_SSH_CONNECT_TIMEOUT's documented default, and the poller's per-poll bound
# The poller marks a host disconnected after two failed polls in a row
# (fleet.DISCONNECT_AFTER), a poll interval (1 s) apart, each failing within
# STALL_S: about 12 s, and 1 s of slack. (It took 16 s: a channel that did not
# open in time was taken for a dead connection and dialled again, twice STALL_S.)
BOUND_S = 2 * (STALL_S + 1.0) + 1.0


def _tree(root: int) -> list[int]:
    """``root`` and every process under it (an sshd forks one child per
    connection, and that child the relay), read from /proc."""
    parents: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(parents.get(pid, []))
    return out


def _signal_tree(root: int, sig: int, done: list[int]) -> None:
    """Send ``sig`` to ``root`` and everything under it, walking again until no
    new process shows up (a relay may be starting as we go)."""
    while new := [p for p in _tree(root) if p not in done]:
        for pid in new:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            done.append(pid)


@pytest.fixture
def own_sshd(sshd, processes, tmp_path):
    """A second sshd on its own port, with the suite's host key and authorised key."""
    proc, port, known = second_sshd(sshd, processes, tmp_path)
    yield proc, port, known
    proc.stop()


@pytest.fixture
def ssh_host(sshd, own_sshd, processes, tmp_path):
    """A controller (SSH timeout at its default, as an operator runs it) with host "frozen"
    added over ``own_sshd`` and connected: ``(client, freeze)``, ``freeze()`` stopping the
    sshd and everything under it (thawed at the end)."""
    proc, port, known = own_sshd
    agent = start_agent(processes, tmp_path / "agent", socket_path=tmp_path / "agent" / "run" / "agent.sock",
                        backend="fake")
    env = {**sshd.env(f"{FUSE} host relay --socket {agent.socket}"), "FUSE_SSH_KNOWN_HOSTS": str(known)}
    del env["FUSE_SSH_CONNECT_TIMEOUT"]  # the default, as an operator runs it
    ctl = start_controller(processes, tmp_path / "ctl", env=env)
    c = ctl.client()
    frozen: list[int] = []
    try:
        c.hosts.add("frozen", f"ssh://root@127.0.0.1:{port}", capacity={"vm_count": 2})
        deadline = time.monotonic() + 20
        while not c.hosts.get("frozen").connected:
            assert time.monotonic() < deadline, "the host never showed connected"
            time.sleep(0.1)
        yield c, lambda: _signal_tree(proc.proc.pid, signal.SIGSTOP, frozen)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        ctl.close()
        agent.proc.stop()


def test_a_frozen_ssh_host_shows_disconnected_in_bounded_time_and_every_reason_quotes_one_time(ssh_host):
    c, freeze = ssh_host
    since = c.events.list(since=0)["next_cursor"]
    freeze()
    started = time.monotonic()
    while c.hosts.get("frozen").connected:
        assert time.monotonic() - started < 60, "the frozen host never showed disconnected"
        time.sleep(0.1)
    took = time.monotonic() - started
    assert took < BOUND_S, f"a frozen host took {took:.1f} s to show disconnected"

    # Why, as each surface says it: the event, placement's reasons, usage's reasons.
    events = [e for e in c.events.list(since=since)["events"] if e["type"] == "host_disconnected"]
    with pytest.raises(fuse.ApiError) as info:
        c.vms.create(shape={"vcpus": 1, "mem_mib": 128}, entry="true")
    asked = time.monotonic()
    usage = c.usage()
    usage_took = time.monotonic() - asked
    reasons = [events[-1]["reason"], info.value.details["hosts"]["frozen"], usage["unreachable_reasons"]["frozen"]]
    quoted = {float(t) for r in reasons for t in re.findall(r"within ([0-9.]+) s", r)}
    assert quoted == {STALL_S}, reasons
    assert usage_took < STALL_S + 1.5, f"usage waited {usage_took:.1f} s on a host it says took {STALL_S:g} s"


def test_the_first_request_to_a_host_that_just_froze_quotes_the_time_it_really_waited(ssh_host):
    """Found by a black-box review of issue 7: the first call after the freeze reused an
    idle channel, waited until SSH keepalive dropped the silent connection, then took
    that for the agent closing the idle channel and dialled again: 10.7 s, its reason
    quoting the redial's 5 s. A connection dropped as silent is not retried: the call
    ends there, and its reason says how long it waited."""
    c, freeze = ssh_host
    c.vms.create(name="v1", shape={"vcpus": 1, "mem_mib": 128}, entry="true", host="frozen")
    for _ in range(3):
        c.vms.console("v1")  # (channels to reuse: the poller's and these)
    freeze()
    asked = time.monotonic()
    with pytest.raises(fuse.ApiError) as info:
        c.vms.console("v1")
    took = time.monotonic() - asked
    quoted = [float(t) for t in re.findall(r"within ([0-9.]+) s", info.value.message)]
    assert len(quoted) == 1, (took, info.value.message)
    assert took - 1.5 < quoted[0] <= took + 0.2, (took, info.value.message)
    # (a request already on its way waits for the agent until the connection is found
    # silent: a channel another request could not open in STALL_S, or SSH keepalive
    # unanswered, 10 s after the server's last word; never a second dial on top)
    assert took < 2 * STALL_S + 1.5, (took, info.value.message)
    assert "relay" not in info.value.message, info.value.message  # (no relay ended: the host froze)

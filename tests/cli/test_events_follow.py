"""`fuse controller events` follows the merged stream across a controller
restart, from its last cursor, as `client.events.follow` does (issue 4: no
event delivered twice or skipped across reconnects and controller restarts),
and gives up only once the controller has not answered for --reconnect-s:
a real controller and agent (fake backend) on loopback, the CLI as a process."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest

import fuse
from support import FUSE, reap, start_agent, start_controller, wait_until


@pytest.fixture
def env(tmp_path):
    procs = {"ctl": start_controller(tmp_path), "agent": start_agent(tmp_path, backend="fake", name="a1")}
    yield procs
    procs["ctl"].stop()
    procs["agent"].stop()
    reap(tmp_path)


def register(ctl, host_id, agent):
    with fuse.Client(ctl.url) as c:
        c.hosts.register(fuse.RegisterHostRequest(id=host_id, url=agent.url, token=agent.token, backend="qemu",
                                                  capacity=fuse.HostCapacity(vm_count=4)))


def follow(ctl, tmp_path, *args) -> subprocess.Popen:
    return subprocess.Popen(FUSE + ["controller", "events", "--json", *args], stdout=subprocess.PIPE,
                            stderr=open(tmp_path / "cli.err", "wb"), text=True,
                            env={**os.environ, "FUSE_URL": ctl.url})


def test_events_follow_carries_on_from_its_cursor_across_a_controller_restart(env, tmp_path):
    register(env["ctl"], "h1", env["agent"])
    cli = follow(env["ctl"], tmp_path, "--wait-s", "2")
    lines: list[dict] = []

    def read():
        for line in cli.stdout:
            lines.append(json.loads(line))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_until(lambda: any(e["type"] == "host_added" and e["host"] == "h1" for e in lines),
                   what="h1's host_added")
        env["ctl"].stop()
        env["ctl"] = start_controller(tmp_path)  # same state dir and socket
        register(env["ctl"], "h2", env["agent"])  # news after the restart
        wait_until(lambda: any(e["type"] == "host_added" and e["host"] == "h2" for e in lines), timeout=30,
                   what=f"h2's host_added after the restart ({(tmp_path / 'cli.err').read_text()})")
        assert cli.poll() is None, (tmp_path / "cli.err").read_text()
        with fuse.Client(env["ctl"].url) as c:
            everything = [e["id"] for e in c.events.list(0, limit=500)["events"]]
        ids = [e["id"] for e in lines]
        assert ids == everything[:len(ids)], (ids, everything)  # none twice, none skipped, in order
    finally:
        cli.terminate()
        cli.wait(10)
        reader.join(5)


def test_events_follow_gives_up_once_the_controller_has_not_answered_for_reconnect_s(env, tmp_path):
    cli = follow(env["ctl"], tmp_path, "--wait-s", "1", "--reconnect-s", "1")
    try:
        wait_until(lambda: (tmp_path / "cli.err").exists(), what="the CLI")
        env["ctl"].stop()
        assert cli.wait(30) == 1
        assert json.loads((tmp_path / "cli.err").read_text().splitlines()[-1])["error"]["code"] == "unreachable"
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait(5)

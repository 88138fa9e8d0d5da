"""The `fuse` CLI against a real controller and agents: tables for people,
--json for programs, errors as code + message with a non-zero exit."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from support import FUSE, reap, start_agent, start_controller


@pytest.fixture
def env(tmp_path):
    ctl = start_controller(tmp_path)
    agents = [start_agent(tmp_path, backend="fake", name=f"a{i}") for i in (1, 2)]
    yield {"ctl": ctl, "agents": agents, "env": {**os.environ, "FUSE_URL": ctl.url}}
    ctl.stop()
    for a in agents:
        a.stop()
    reap(tmp_path)


def fuse_cli(env, *args, ok=True):
    r = subprocess.run(FUSE + list(args), capture_output=True, text=True, timeout=120, env=env["env"])
    if ok:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def test_hosts_vms_move_events_usage(env):
    a1, a2 = env["agents"]
    out = fuse_cli(env, "controller", "hosts", "add", "--name", "rack1", "--addr", a1.url, "--agent-token", a1.token,
                   "--vm-count", "4", "--json")
    assert json.loads(out.stdout)["capacity"]["vm_count"] == 4
    fuse_cli(env, "controller", "hosts", "add", "--name", "rack2", "--addr", a2.url, "--agent-token", a2.token)
    table = fuse_cli(env, "controller", "hosts", "list").stdout
    assert "rack1" in table and "rack2" in table and "active" in table
    assert [h["id"] for h in json.loads(fuse_cli(env, "controller", "hosts", "list", "--json").stdout)] == ["rack1", "rack2"]
    fuse_cli(env, "controller", "hosts", "cordon", "rack2")
    assert json.loads(fuse_cli(env, "controller", "hosts", "get", "rack2", "--json").stdout)["state"] == "cordoned"
    fuse_cli(env, "controller", "hosts", "uncordon", "rack2")

    vm = json.loads(fuse_cli(env, "controller", "vms", "create", "--vcpus", "1", "--mem-mib", "256", "--entry",
                             "python3 job.py", "--name", "job1", "--host", "rack1", "--json").stdout)
    assert (vm["name"], vm["host"], vm["state"]) == ("job1", "rack1", "running")
    assert "job1" in fuse_cli(env, "controller", "vms").stdout
    moved = json.loads(fuse_cli(env, "controller", "move", "job1", "--to", "rack2", "--json").stdout)
    assert moved["state"] == "done" and moved["to"] == "rack2"
    assert "done" in fuse_cli(env, "controller", "moves").stdout
    events = fuse_cli(env, "controller", "events", "--no-follow", "--json").stdout.splitlines()
    types = {json.loads(e)["type"] for e in events}
    assert {"host_added", "placed", "move_state"} <= types
    usage = json.loads(fuse_cli(env, "controller", "usage", "--json").stdout)
    assert {r["vm"] for r in usage["vms"]} == {"job1"}

    err = fuse_cli(env, "controller", "hosts", "remove", "rack2", ok=False)
    assert err.returncode != 0 and "conflict" in err.stderr and "host rack2 still has vm job1 assigned" in err.stderr
    err = fuse_cli(env, "controller", "vms", "create", "--vcpus", "1", "--mem-mib", "999999", "--entry", "x", ok=False)
    assert err.returncode != 0 and "fleet_full" in err.stderr and "rack1" in err.stderr
    fuse_cli(env, "controller", "vms", "delete", "job1")
    fuse_cli(env, "controller", "hosts", "drain", "rack2")
    fuse_cli(env, "controller", "hosts", "remove", "rack2")


def test_unreachable_controller_is_a_clear_error(tmp_path):
    r = subprocess.run(FUSE + ["controller", "hosts", "list"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "FUSE_URL": f"unix://{tmp_path}/nothing.sock"})
    assert r.returncode != 0 and "error" in r.stderr and "Traceback" not in r.stderr

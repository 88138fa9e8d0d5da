"""Review 31 of the CLI, against real processes (a controller and two fake-backend agents):
`vms --host h2 delete v5` deleted v5 on whatever host held the name (the group's --host and
--json were never read once a sub-command followed); `events --wait-s 1e10` was an
OverflowError traceback; a drain that left VMs stuck said "drain done"."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from support import FUSE, reap, start_agent, start_controller
from test_fuse_commands import fuse_cli


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("review31")
    ctl = start_controller(tmp)
    agents = [start_agent(tmp, backend="fake", name=f"a{i}") for i in (1, 2)]
    e = {"ctl": ctl, "env": {**os.environ, "FUSE_URL": ctl.url}}
    for i, a in enumerate(agents, 1):
        fuse_cli(e, "controller", "hosts", "add", "--name", f"h{i}", "--addr", a.url, "--agent-token", a.token)
    fuse_cli(e, "controller", "vms", "create", "--name", "v5", "--entry", "job", "--host", "h1")
    yield e
    ctl.stop()
    for a in agents:
        a.stop()
    reap(tmp)


def vms(env) -> dict[str, str]:
    return {v["name"]: v["host"] for v in json.loads(fuse_cli(env, "controller", "vms", "--json").stdout)}


def test_the_groups_host_applies_to_the_sub_command(env):
    r = fuse_cli(env, "controller", "vms", "--host", "h2", "delete", "v5", ok=False)
    assert r.returncode == 1 and "not_found" in r.stderr, r.stdout + r.stderr
    assert vms(env).get("v5") == "h1"  # (it was deleted from h1: the --host went unread)
    r = fuse_cli(env, "controller", "vms", "--host", "h2", "get", "v5", ok=False)
    assert r.returncode == 1 and "not_found" in r.stderr, r.stdout + r.stderr
    assert "v5" in fuse_cli(env, "controller", "vms", "--host", "h1", "get", "v5").stdout


@pytest.mark.parametrize("args", [["get", "v5"], ["sleep", "v5"], ["delete", "v5"], ["console", "v5"],
                                  ["create", "--entry", "job"]],
                         ids=["get", "sleep", "delete", "console", "create"])
def test_two_different_hosts_are_a_usage_error_naming_both(env, args):
    r = fuse_cli(env, "controller", "vms", "--host", "h2", *args, "--host", "h1", ok=False)
    assert r.returncode == 2 and "'h2'" in r.stderr and "'h1'" in r.stderr, r.stdout + r.stderr
    assert r.stderr.startswith("error: invalid_argument: ") and "Traceback" not in r.stderr, r.stderr
    assert vms(env).get("v5") == "h1"  # (nothing done)


def test_one_host_given_twice_is_that_host(env):
    got = json.loads(fuse_cli(env, "controller", "vms", "--host", "h1", "get", "v5", "--host", "h1",
                              "--json").stdout)
    assert (got["name"], got["host"]) == ("v5", "h1")


def test_the_groups_json_applies_to_the_sub_command(env):
    got = json.loads(fuse_cli(env, "controller", "vms", "--json", "get", "v5").stdout)  # (was a table)
    assert (got["name"], got["host"]) == ("v5", "h1")
    r = fuse_cli(env, "controller", "vms", "--json", "get", "nosuch", ok=False)
    assert r.returncode == 1 and json.loads(r.stderr)["error"]["code"] == "not_found", r.stderr
    r = fuse_cli(env, "controller", "vms", "--json", "--host", "h2", "get", "v5", "--host", "h1", ok=False)
    assert r.returncode == 2 and json.loads(r.stderr)["error"]["code"] == "invalid_argument", r.stderr


def test_the_groups_host_pins_a_create(env):
    made = json.loads(fuse_cli(env, "controller", "vms", "--host", "h2", "create", "--name", "v6", "--entry",
                               "job", "--json").stdout)
    assert made["host"] == "h2"
    fuse_cli(env, "controller", "vms", "--host", "h2", "delete", "v6")
    assert "v6" not in vms(env)


def test_events_with_a_wait_longer_than_a_socket_takes_follows(env):
    """(review 31: `--wait-s 1e10` was an OverflowError traceback at the first long poll;
    the controller waits at most 60 s whatever is asked)"""
    p = subprocess.Popen(FUSE + ["controller", "events", "--wait-s", "1e10", "--json"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env=env["env"])
    try:
        first = p.stdout.readline()  # (the events the fixture made: the first page answers at once)
        assert json.loads(first)["type"], first
        time.sleep(1)
        assert p.poll() is None  # (still following)
    finally:
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=30)
    assert "Traceback" not in err and "OverflowError" not in err, err


def test_a_drain_that_leaves_vms_stuck_says_so(env, tmp_path):
    fuse_cli(env, "controller", "vms", "create", "--name", "big", "--entry", "job", "--host", "h2",
             "--vcpus", "1", "--mem-mib", "256")
    fuse_cli(env, "controller", "hosts", "cordon", "h1")  # (nowhere to move it: it stays)
    try:
        r = fuse_cli(env, "controller", "hosts", "drain", "h2", ok=False)
        assert r.returncode == 1, r.stdout + r.stderr
        lines = r.stdout.splitlines()
        assert lines[0] == "host h2: drain finished, 1 VM stuck", r.stdout  # (was "host h2: drain done")
        assert lines[1].startswith("  stuck big: "), r.stdout
    finally:
        fuse_cli(env, "controller", "hosts", "uncordon", "h2")
        fuse_cli(env, "controller", "hosts", "uncordon", "h1")
        fuse_cli(env, "controller", "vms", "delete", "big")

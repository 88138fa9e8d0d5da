"""Review 29 of the CLI: `hosts cordon|uncordon|drain` offered a --force that was a TypeError
traceback; under `fuse pool`, $FUSE_URL / $FUSE_TOKEN won over a --url / --token given before
the subcommand (an exported production url took a staging purchase); `vms console` into a
closed pipe was an io_error, exit 1. Real processes: a controller and a fake-backend agent."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from support import FUSE, reap, start_agent, start_controller
from test_fuse_commands import fuse_cli


@pytest.fixture
def env(tmp_path):
    ctl = start_controller(tmp_path, listen=True, token="ctok")
    agent = start_agent(tmp_path, backend="fake", name="a1")
    e = {"ctl": ctl, "env": {**os.environ, "FUSE_URL": ctl.url}}
    fuse_cli(e, "controller", "hosts", "add", "--name", "h1", "--addr", agent.url, "--agent-token", agent.token)
    fuse_cli(e, "controller", "vms", "create", "--name", "v1", "--entry", "job", "--host", "h1")
    yield e
    ctl.stop()
    agent.stop()
    reap(tmp_path)


@pytest.mark.parametrize("verb", ["cordon", "uncordon", "drain"])
def test_only_remove_takes_force(env, verb):
    r = fuse_cli(env, "controller", "hosts", verb, "h1", "--force", "--json", ok=False)
    assert r.returncode == 2 and "Traceback" not in r.stderr + r.stdout, r.stderr
    assert "--force" in r.stderr + r.stdout  # (click's "No such option: --force")
    assert "--force" not in fuse_cli(env, "controller", "hosts", verb, "--help").stdout
    fuse_cli(env, "controller", "hosts", "uncordon", "h1")  # (and the verbs themselves still work)
    r = fuse_cli(env, "controller", "hosts", "remove", "h1", "--force", ok=False)  # (its agent answers: refused)
    assert r.returncode == 1 and "conflict" in r.stdout + r.stderr and "Traceback" not in r.stderr, r.stderr


def test_pool_flags_before_the_subcommand_win_over_the_environment(env):
    tcp = f"http://127.0.0.1:{env['ctl'].extra['port']}"
    wrong = {**env["env"], "FUSE_URL": "http://127.0.0.1:9", "FUSE_TOKEN": "wrong"}
    r = subprocess.run(FUSE + ["pool", "--url", tcp, "--token", "ctok", "budget", "--json"], capture_output=True,
                       text=True, timeout=60, env=wrong)
    assert r.returncode == 0 and "autoscale" in json.loads(r.stdout), r.stdout + r.stderr
    # a flag after the subcommand as before; the environment alone as before
    r = subprocess.run(FUSE + ["pool", "budget", "--url", tcp, "--token", "ctok", "--json"], capture_output=True,
                       text=True, timeout=60, env=wrong)
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(FUSE + ["pool", "budget", "--json"], capture_output=True, text=True, timeout=60,
                       env={**env["env"], "FUSE_URL": tcp, "FUSE_TOKEN": "ctok"})
    assert r.returncode == 0, r.stdout + r.stderr
    r = subprocess.run(FUSE + ["pool", "budget", "--json"], capture_output=True, text=True, timeout=60, env=wrong)
    assert r.returncode == 1, r.stdout + r.stderr  # (the environment's wrong controller: it is asked)


@pytest.mark.parametrize("args", [[], ["--json"], ["--follow"]], ids=["all of it", "json", "following"])
def test_the_console_ends_quietly_when_the_reader_closes_the_pipe(env, args):
    read, write = os.pipe()
    os.close(read)  # (as `| head` once it has its lines: the first write finds it gone)
    try:
        r = subprocess.run(FUSE + ["controller", "vms", "console", "v1"] + args, stdout=write,
                           stderr=subprocess.PIPE, text=True, timeout=60, env=env["env"])
    finally:
        os.close(write)
    assert (r.returncode, r.stderr) == (0, "")

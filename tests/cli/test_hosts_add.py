"""`fuse controller hosts add`: every field of seed 000's register request
has a flag, and an unset flag leaves the controller's default in charge."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from support import FUSE, start_agent, start_controller


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hosts-add")
    # Also on TCP with its own token, to tell it from the agent's token.
    ctl = start_controller(tmp, listen=True, token="controller-token")
    agent = start_agent(tmp)
    yield {"ctl": ctl, "agent": agent, "env": {**os.environ, "FUSE_URL": ctl.url}}
    ctl.stop()
    agent.stop()


def add(env, name, *flags):
    a = env["agent"]
    return subprocess.run(FUSE + ["controller", "hosts", "add", "--name", name, "--addr", a.url,
                                  "--agent-token", a.token, "--vm-count", "2", *flags],
                          capture_output=True, text=True, timeout=120, env=env["env"])


def test_backend_left_unset_is_the_one_the_agent_runs(env):
    # seed 004's `hosts add --name --addr` has no backend: the agent's own (qemu here), no warning
    r = add(env, "unset", "--json")
    assert r.returncode == 0, r.stderr
    assert (json.loads(r.stdout)["backend"], json.loads(r.stdout)["warnings"]) == ("qemu", [])
    r = add(env, "set", "--backend", "firecracker")
    assert r.returncode == 0 and "warning: backend: registered as firecracker but the host agent runs qemu" in r.stdout
    # MIG profiles are for qemu hosts: the agent's backend admits them when none is named
    r = add(env, "mig", "--mig-profiles", "1g.10gb=2", "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["capacity"]["mig_profiles"] == {"1g.10gb": 2}


def test_mig_profiles_and_labels_reach_the_controller(env):
    r = add(env, "gpu-box", "--backend", "qemu", "--mig-profiles", "1g.10gb=4", "--mig-profiles", "1g.10gb+me=1",
            "--labels", "zone=a", "--label", "note=k=v", "--json")
    assert r.returncode == 0, r.stderr
    host = json.loads(r.stdout)
    assert host["capacity"]["mig_profiles"] == {"1g.10gb": 4, "1g.10gb+me": 1}
    assert host["labels"] == {"zone": "a", "note": "k=v"}


@pytest.mark.parametrize("flags,code,exit_code", [
    (["--labels", "zone"], "invalid_argument", 2),
    (["--labels", "a=1", "--labels", "a=2"], "invalid_argument", 2),
    (["--mig-profiles", "1g.10gb"], "invalid_argument", 2),
    (["--backend", "qemu", "--mig-profiles", "1g.10gb=four"], "invalid_argument", 2),
    (["--backend", "qemu", "--mig-profiles", "big=1"], "invalid_argument", 1),
    (["--backend", "firecracker", "--mig-profiles", "1g.10gb=1"], "invalid_argument", 1),
], ids=["a label without =", "a label given twice (review 22: the last was kept)", "a MIG profile without a count", "a MIG count that is not a number",
        "a MIG name the controller refuses", "MIG profiles on a firecracker host"])
def test_bad_flags_print_the_code_and_exit_non_zero(env, flags, code, exit_code):
    r = add(env, "bad", *flags)
    assert r.returncode == exit_code and f"error: {code}" in r.stderr and "Traceback" not in r.stderr, r.stderr
    listed = subprocess.run(FUSE + ["controller", "hosts", "list", "--json"], capture_output=True, text=True,
                            timeout=60, env=env["env"])
    assert "bad" not in [h["id"] for h in json.loads(listed.stdout)]


@pytest.mark.parametrize("flag", ["--agent-token", "--token"],
                         ids=["the agent token as --agent-token", "the agent token as --token after hosts add"])
def test_the_agent_token_after_hosts_add_and_the_controller_token_before_it(env, flag):
    a, port = env["agent"], env["ctl"].extra["port"]

    def add_over_tcp(name, controller_token, agent_token):
        return subprocess.run(FUSE + ["controller", "--url", f"http://127.0.0.1:{port}", "--token", controller_token,
                                      "hosts", "add", "--name", name, "--addr", a.url, flag, agent_token,
                                      "--vm-count", "2", "--json"],
                              capture_output=True, text=True, timeout=120, env=env["env"])

    r = add_over_tcp(f"tcp{flag}", "controller-token", a.token)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["id"] == f"tcp{flag}" and "token" not in json.loads(r.stdout)
    # Each token goes where its place says: a wrong one is refused by its own side
    # (under --json the error is the API's error body on stderr).
    r = add_over_tcp("wrong-agent", "controller-token", "not-the-agent-token")
    assert r.returncode == 1 and json.loads(r.stderr)["error"]["code"] == "unauthorized", r.stderr
    assert "agent" in json.loads(r.stderr)["error"]["message"]
    r = add_over_tcp("wrong-controller", a.token, a.token)
    assert r.returncode == 1 and json.loads(r.stderr)["error"]["code"] == "unauthorized", r.stderr
    assert "agent" not in r.stderr

"""`fuse controller hosts cordon|uncordon|drain|remove` against a real
controller and agent: a line for people, `--json` for programs (the API's
answer, or `{"id", "action", "ok": true}` when it answers nothing)."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from support import FUSE, start_agent, start_controller


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("host-actions")
    ctl = start_controller(tmp)
    agent = start_agent(tmp, backend="fake")
    yield {"ctl": ctl, "agent": agent, "env": {**os.environ, "FUSE_URL": ctl.url}}
    ctl.stop()
    agent.stop()


def fuse_cli(env, *args):
    r = subprocess.run(FUSE + ["controller", "hosts", *args], capture_output=True, text=True, timeout=120,
                       env=env["env"])
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


@pytest.fixture
def host(env, request):
    a = env["agent"]
    name = re.sub(r"\W+", "-", request.node.name).strip("-")
    fuse_cli(env, "add", "--name", name, "--addr", a.url, "--agent-token", a.token, "--vm-count", "2")
    return name


def state(env, host):
    return json.loads(fuse_cli(env, "get", host, "--json"))["state"]


def test_each_action_answers_json_under_json(env, host):
    assert json.loads(fuse_cli(env, "cordon", host, "--json")) == {"id": host, "action": "cordon", "ok": True}
    assert state(env, host) == "cordoned"
    assert json.loads(fuse_cli(env, "uncordon", host, "--json")) == {"id": host, "action": "uncordon", "ok": True}
    assert state(env, host) == "active"
    assert json.loads(fuse_cli(env, "drain", host, "--json")) == {"host": host, "moved": [], "stuck": [], "finished": [],
                                                                  "prewarmed": []}
    assert state(env, host) == "draining"
    assert json.loads(fuse_cli(env, "remove", host, "--json")) == {"id": host, "action": "remove", "ok": True}
    assert host not in [h["id"] for h in json.loads(fuse_cli(env, "list", "--json"))]


@pytest.mark.parametrize("action", ["cordon", "uncordon", "drain", "remove"])
def test_without_json_each_action_prints_a_line_for_people(env, host, action):
    verb = "deregister" if action == "remove" else action
    assert fuse_cli(env, action, host).splitlines()[0] == f"host {host}: {verb} done"

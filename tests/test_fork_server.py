"""The suite's fork server (tests/zygote.py): a process it starts is what `python -m fuse.cli
ARGS` started fresh would be, as far as the tests and the tools that look at processes see."""

from __future__ import annotations

import os
import signal

from fuse.agent.backends.base import pids_mentioning
from support import _spawn, start_agent, wait_until


def test_a_started_agent_names_its_command_and_is_found_by_its_dir(tmp_path):
    """(the diff review: the title was set after the environment was replaced, so it was the
    server's, and reap() and pids_mentioning() did not find leftover agents)"""
    agent = start_agent(tmp_path, backend="fake")
    try:
        cmd = open(f"/proc/{agent.popen.pid}/cmdline", "rb").read().replace(b"\0", b" ")
        assert b"-m fuse.cli host serve" in cmd and str(tmp_path).encode() in cmd, cmd
        assert agent.popen.pid in pids_mentioning(tmp_path)
    finally:
        agent.stop()
    assert agent.popen.returncode == 0


def test_exit_codes_signals_and_settings_read_at_import_are_as_a_fresh_start(tmp_path):
    bad = _spawn(["host", "serve", "--backend", "nonsense", "--state-dir", str(tmp_path / "s")], tmp_path / "bad.log")
    assert bad.wait(60) == 2, (tmp_path / "bad.log").read_text()[-500:]
    assert "Usage:" in (tmp_path / "bad.log").read_text()
    # a setting fuse reads as its modules load, given to this start only: a bad one stops it (exit 2)
    env_bad = _spawn(["host", "serve", "--backend", "fake", "--state-dir", str(tmp_path / "e"),
                      "--socket", str(tmp_path / "e.sock")], tmp_path / "env.log", {"FUSE_HTTP_HEAD_TIMEOUT_S": "-1"})
    assert env_bad.wait(60) == 2, (tmp_path / "env.log").read_text()[-500:]
    agent = start_agent(tmp_path, backend="fake", name="k")
    os.kill(agent.popen.pid, signal.SIGKILL)
    wait_until(lambda: agent.popen.poll() is not None, timeout=20, what="the kill seen")
    assert agent.popen.returncode == -signal.SIGKILL

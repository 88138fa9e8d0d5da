"""Timings set in the environment (found by a black-box review of issue 7): one that is no
positive number of seconds stops `fuse controller serve` at once with a sentence naming it
(exit 2). FUSE_SSH_CONNECT_TIMEOUT=abc was a 500 on adding an SSH host; FUSE_MOVE_IO_TIMEOUT=0
a traceback at start; FUSE_SSH_CONNECT_TIMEOUT=0 accepted without a word."""

from __future__ import annotations

import os
import subprocess

import pytest

from fuse.envsettings import BadSetting, seconds
from support import FUSE


@pytest.mark.parametrize("name, value, why", [
    ("FUSE_SSH_CONNECT_TIMEOUT", "abc", "is not a number of seconds"),
    ("FUSE_SSH_CONNECT_TIMEOUT", "0", "must be a positive number of seconds"),
    ("FUSE_MOVE_IO_TIMEOUT", "0", "must be a positive number of seconds"),
    ("FUSE_MOVE_QUICK_TIMEOUT", "-3", "must be a positive number of seconds"),
    ("FUSE_PLACING_LEASE_S", "nan", "must be a positive number of seconds"),
    ("FUSE_POOL_CREATE_LEASE_S", "inf", "must be a positive number of seconds"),
])
def test_a_controller_given_a_timing_that_is_no_number_of_seconds_exits_2_naming_it(tmp_path, name, value, why):
    r = subprocess.run(FUSE + ["controller", "serve", "--state-dir", str(tmp_path / "ctl"),
                               "--socket", str(tmp_path / "ctl.sock")],
                       env={**os.environ, name: value}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr == f"error: invalid_argument: {name}={value!r} {why}\n"
    assert not (tmp_path / "ctl.sock").exists()


def test_an_unset_or_empty_timing_is_its_default_and_a_number_is_taken(monkeypatch):
    monkeypatch.delenv("FUSE_X_S", raising=False)
    assert seconds("FUSE_X_S", 5.0) == 5.0
    monkeypatch.setenv("FUSE_X_S", " ")
    assert seconds("FUSE_X_S", 5.0) == 5.0
    monkeypatch.setenv("FUSE_X_S", "2.5")
    assert seconds("FUSE_X_S", 5.0) == 2.5
    monkeypatch.setenv("FUSE_X_S", "2,5")
    with pytest.raises(BadSetting):
        seconds("FUSE_X_S", 5.0)


@pytest.mark.parametrize("command, name, value", [
    (["controller", "serve"], "FUSE_HTTP_HEAD_TIMEOUT_S", "abc"),
    (["controller", "serve"], "FUSE_DRAIN_STANDBY_WAIT_S", "0"),
    (["host", "serve", "--backend", "fake"], "FUSE_HTTP_HEAD_TIMEOUT_S", "inf"),
    (["host", "serve", "--backend", "fake"], "FUSE_FRESH_PROBE_S", "0"),
    (["up", "--once"], "FUSE_HTTP_HEAD_TIMEOUT_S", "nan"),
    (["up", "--once"], "FUSE_MOVE_IO_TIMEOUT", "-1"),
    # (review 28: `fuse up` built the bundle, then its controller refused these, exit 1)
    (["up", "--once"], "FUSE_MOVE_STOP_SETTLE_S", "0"),
    (["up", "--once"], "FUSE_PREWARM_AWAY_S", "-5"),
    (["controller", "serve"], "FUSE_PREWARM_AWAY_S", "0"),
    # (review 34: `fuse up` started its agent, then its controller died on this one, exit 1)
    (["up", "--once"], "FUSE_DRAIN_BOOT_WAIT_S", "abc"),
])
def test_a_timing_read_as_its_module_loads_is_one_sentence_and_exit_2_too(tmp_path, command, name, value):
    """(review 25: FUSE_HTTP_HEAD_TIMEOUT_S, read as fuse.serving loads, was a traceback and exit 1
    on the controller, the agent and `fuse up`; the agent's FUSE_FRESH_PROBE_S too)"""
    r = subprocess.run(FUSE + command + ["--state-dir", str(tmp_path / "s")]
                       + (["--socket", str(tmp_path / "s.sock")] if command[0] != "up" else []),
                       env={**os.environ, name: value}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.endswith(f"error: invalid_argument: {name}={value!r} "
                             f"{'is not a number of seconds' if value == 'abc' else 'must be a positive number of seconds'}\n"), r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "s.sock").exists()


def test_up_on_a_state_dir_that_is_a_file_is_one_io_error_line(tmp_path):
    """(review 25: a NotADirectoryError traceback; the servers said it in one line)"""
    (tmp_path / "file").write_text("x")
    r = subprocess.run(FUSE + ["up", "--once", "--state-dir", str(tmp_path / "file")], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.startswith(f"error: io_error: --state-dir {tmp_path / 'file'}: Not a directory")
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("value", ["0", "\u00b2"])  # (review 34: "²" passed isdigit, then int() raised: a traceback)
@pytest.mark.parametrize("command", [["up", "--once"], ["host", "serve", "--backend", "fake"]])
def test_a_console_cap_that_is_no_whole_number_of_mib_stops_up_before_it_builds_anything(tmp_path, command, value):
    """Review 28: `fuse up` built the guest bundle (a kernel download on a fresh dir), then its
    agent refused FUSE_CONSOLE_MAX_MB=0, exit 1."""
    r = subprocess.run(FUSE + command + ["--state-dir", str(tmp_path / "s")]
                       + (["--socket", str(tmp_path / "s.sock")] if command[0] != "up" else []),
                       env={**os.environ, "FUSE_CONSOLE_MAX_MB": value}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.endswith(f"error: invalid_argument: FUSE_CONSOLE_MAX_MB={value!r} must be a positive whole number "
                             "of MiB\n"), r.stderr
    assert not (tmp_path / "s" / "bundles").exists()


def test_every_timing_the_source_reads_is_checked_where_the_servers_start():
    """(review 34: FUSE_DRAIN_BOOT_WAIT_S was read as its module loaded and in no list: `fuse up`
    started its agent before its controller died on a bad value)"""
    import re
    from pathlib import Path

    import fuse
    from fuse.envsettings import AGENT_TIMINGS, CONTROLLER_TIMINGS

    src = Path(fuse.__file__).parent
    read = {name for f in src.rglob("*.py") for name in re.findall(r'seconds\(\s*"(FUSE_[A-Z0-9_]+)"', f.read_text())}
    assert read and read <= set(AGENT_TIMINGS) | set(CONTROLLER_TIMINGS), read - set(AGENT_TIMINGS + CONTROLLER_TIMINGS)

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

"""The controller's default address on each platform seed 004 names: Linux
as before (root's /run, else $XDG_RUNTIME_DIR, else a per-user /tmp
directory), macOS a per-user file, Windows a named pipe — and never a call to
os.geteuid where the platform has none."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuse.controller import service
from fuse.controller.service import default_controller_socket


def _no_geteuid():
    raise AssertionError("os.geteuid called off Unix")


@pytest.mark.parametrize("euid,runtime,want", [
    (0, "/run/user/0", "/run/fuse-controller.sock"),
    (1000, "/run/user/1000", "/run/user/1000/fuse-controller.sock"),
    (1000, None, "/tmp/fuse-1000/fuse-controller.sock"),
], ids=["root gets /run", "a user gets XDG_RUNTIME_DIR", "a user without XDG_RUNTIME_DIR gets /tmp/fuse-UID"])
def test_linux_is_unchanged(monkeypatch, euid, runtime, want):
    monkeypatch.setattr(service.sys, "platform", "linux")
    monkeypatch.setattr(service.os, "geteuid", lambda: euid, raising=False)
    monkeypatch.setattr(service.os, "getuid", lambda: euid, raising=False)
    if runtime is None:
        monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    else:
        monkeypatch.setenv("XDG_RUNTIME_DIR", runtime)
    assert default_controller_socket() == Path(want)


def test_macos_is_a_per_user_file(monkeypatch, tmp_path):
    monkeypatch.setattr(service.sys, "platform", "darwin")
    monkeypatch.setattr(service.os, "geteuid", _no_geteuid, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_controller_socket() == tmp_path / ".fuse" / "fuse-controller.sock"


def test_windows_is_a_named_pipe_without_geteuid(monkeypatch):
    monkeypatch.setattr(service.sys, "platform", "win32")
    monkeypatch.delattr(service.os, "geteuid", raising=False)
    monkeypatch.delattr(service.os, "getuid", raising=False)
    assert str(default_controller_socket()) == r"\\.\pipe\fuse-controller"

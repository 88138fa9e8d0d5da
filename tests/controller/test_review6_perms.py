"""Issue 7's owner-only stance on disk: the controller's state dir and its
SQLite files (which hold agent tokens), and every directory fuse makes for a
socket, are owner-only whatever the umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

from support import start_controller


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_controller_under_umask_000_keeps_its_state_dir_0700_and_its_database_0600(tmp_path):
    old = os.umask(0)  # the child inherits it: the loosest a user could run fuse under
    try:
        ctl = start_controller(tmp_path)
    finally:
        os.umask(old)
    try:
        state = tmp_path / "controller"
        assert mode(state) == 0o700
        files = [state / n for n in ("fuse.db", "fuse.db-wal", "fuse.db-shm") if (state / n).exists()]
        assert state / "fuse.db" in files and len(files) == 3, files  # WAL mode: all three while serving
        for f in files:
            assert mode(f) == 0o600, f
    finally:
        ctl.stop()


def test_a_database_an_older_fuse_left_world_readable_is_tightened_at_start(tmp_path):
    state = tmp_path / "controller"
    state.mkdir()
    for n in ("fuse.db", "fuse.db-wal"):
        (state / n).touch()
        os.chmod(state / n, 0o644)
    ctl = start_controller(tmp_path)
    try:
        for n in ("fuse.db", "fuse.db-wal"):
            assert mode(state / n) == 0o600, n
    finally:
        ctl.stop()


def test_every_directory_made_for_a_socket_is_0700_under_umask_000(tmp_path):
    before = mode(tmp_path)
    # In a subprocess: the umask is process-wide, and pytest's other threads must not see it.
    code = textwrap.dedent(f"""
        import os, stat
        from pathlib import Path
        from fuse.serving import owner_only_socket
        os.umask(0)
        sock = owner_only_socket(Path({str(tmp_path)!r}) / "new" / "sub" / "s.sock")
        sock.close()
        for p in ("new", "new/sub", "new/sub/s.sock"):
            print(p, oct(stat.S_IMODE((Path({str(tmp_path)!r}) / p).stat().st_mode)))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:3] == ["new 0o700", "new/sub 0o700", "new/sub/s.sock 0o600"], out
    assert mode(tmp_path) == before  # a directory that was there is not fuse's: left as it was

"""`fuse controller serve --db URL` with a URL it cannot use: one line on stderr
naming the URL (password masked) and the problem, and the CLI's exit codes (2 for
a bad flag, 1 for a failure), never a traceback."""

from __future__ import annotations

import subprocess

import pytest

from support import FUSE, free_port

SECRET = "s3cret-pw"


def serve(tmp_path, db: str) -> subprocess.CompletedProcess:
    return subprocess.run(FUSE + ["controller", "serve", "--state-dir", str(tmp_path / "ctl"),
                                  "--socket", str(tmp_path / "ctl.sock"), "--db", db],
                          capture_output=True, text=True, timeout=60)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert SECRET not in r.stderr and r.stdout == "", r.stderr + r.stdout
    return lines[0]


@pytest.mark.parametrize("db,shown,problem", [
    ("not a url", "--db not a url", "does not parse"),
    (f"postgresql://fuse:{SECRET}@127.0.0.1:notaport/fuse", "--db postgresql://fuse:***@127.0.0.1:notaport/fuse",
     "does not parse"),
    (f"mysql://fuse:{SECRET}@127.0.0.1/fuse", "--db mysql://fuse:***@127.0.0.1/fuse", "no driver for mysql://"),
], ids=["a string that is no url", "a port that is no number", "a database fuse has no driver for"])
def test_a_malformed_db_url_is_a_bad_flag_named_with_its_password_masked(tmp_path, db, shown, problem):
    r = serve(tmp_path, db)
    line = one_error_line(r)
    assert r.returncode == 2, line
    assert line.startswith("error: invalid_argument: ") and shown in line and problem in line, line


def test_a_database_nothing_listens_for_is_one_line_naming_it_and_exit_1(tmp_path):
    port = free_port()  # (on loopback, and nothing listens there)
    r = serve(tmp_path, f"postgresql://fuse:{SECRET}@127.0.0.1:{port}/fuse")
    line = one_error_line(r)
    assert r.returncode == 1, line
    assert line.startswith("error: db_unavailable: ") and f"postgresql://fuse:***@127.0.0.1:{port}/fuse" in line, line
    assert "refused" in line.lower(), line


def test_an_sqlite_file_in_a_dir_that_is_not_there_is_one_io_error_line(tmp_path):
    """Review 28: a traceback (FileNotFoundError from making the file owner-only)."""
    r = serve(tmp_path, f"sqlite:///{tmp_path}/no-such-dir/x.db")
    line = one_error_line(r)
    assert r.returncode == 1, line
    assert line.startswith("error: io_error: ") and "no-such-dir/x.db" in line and "No such file" in line, line

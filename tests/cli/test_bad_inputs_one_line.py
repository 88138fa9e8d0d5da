"""Inputs the CLI cannot use end with one error line, never a traceback: a flag
it refuses is a usage error, exit 2, before anything starts; a state dir it
cannot make is ``io_error``, exit 1. The real commands, as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fuse.cli.main import app
from support import FUSE

ENV = {**os.environ, "COLUMNS": "200"}  # (a usage error's box keeps its line whole)
LISTEN = "127.0.0.1:19400"  # (never bound: each command here ends before it listens)


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(FUSE + list(args), capture_output=True, text=True, timeout=timeout, env=ENV,
                          stdin=subprocess.DEVNULL)


def error_line(r: subprocess.CompletedProcess) -> str:
    """The error: stderr's last line (a progress line may come before it), with no traceback."""
    assert "Traceback" not in r.stderr and "Traceback" not in r.stdout, r.stderr
    return r.stderr.strip().splitlines()[-1]


# ---- bundle build --kernel-deb FILE that is no .deb -----------------------------------

@pytest.mark.parametrize("content", [os.urandom(100), Path("/etc/passwd").read_bytes()],
                         ids=["random bytes", "a text file"])
@pytest.mark.parametrize("as_json", [False, True], ids=["for people", "--json"])
def test_a_kernel_deb_that_is_no_debian_package_is_invalid_argument_and_exit_2(tmp_path, content, as_json):
    (deb := tmp_path / "k.deb").write_bytes(content)
    r = run("bundle", "build", "--state-dir", str(tmp_path / "state"), "--kernel-deb", str(deb),
            *(["--json"] if as_json else []))
    line = error_line(r)
    assert r.returncode == 2, r.stderr
    want = f"--kernel-deb {deb}: not a Debian package"
    if as_json:
        err = json.loads(line)["error"]
        assert err["code"] == "invalid_argument" and err["message"].startswith(want), line
    else:
        assert line.startswith(f"error: invalid_argument: {want}"), line
    assert "is not a Debian format archive" in line, line  # (dpkg-deb's own reason)
    assert r.stdout.strip() in ("", "extracting kernel from k.deb")


# ---- --listen without a port, or with one out of range ---------------------------------

SERVERS = {
    "host serve": ["host", "serve", "--token", "x"],
    "controller serve": ["controller", "serve", "--token", "x", "--no-socket"],
}


@pytest.mark.parametrize("listen,says", [
    ("nohostport", "'nohostport' is not HOST:PORT"),
    ("127.0.0.1:99999", "port 99999 is not 0-65535"),
    ("127.0.0.1:http", "'127.0.0.1:http' is not HOST:PORT"),
    (":8090", "':8090' is not HOST:PORT"),
], ids=["no port at all", "a port past 65535", "a port that is no number", "no host"])
@pytest.mark.parametrize("server", list(SERVERS))
def test_a_listen_address_that_is_not_host_port_is_a_usage_error_before_anything_starts(tmp_path, server,
                                                                                       listen, says):
    state = tmp_path / "state"
    r = run(*SERVERS[server], "--listen", listen, "--state-dir", str(state), timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert "Invalid value for '--listen'" in r.stderr and says in r.stderr, r.stderr
    assert r.stdout == "" and not state.exists()  # (nothing started: no state dir made, no banner)


# ---- a --state-dir that cannot be a directory ---------------------------------------------

def state_commands(state: Path) -> dict[str, list[str]]:
    return {
        "host serve": ["host", "serve", "--listen", LISTEN, "--token", "x", "--state-dir", str(state)],
        "controller serve": ["controller", "serve", "--listen", LISTEN, "--token", "x", "--no-socket",
                             "--state-dir", str(state)],
        "controller serve --db (no lock)": ["controller", "serve", "--listen", LISTEN, "--token", "x",
                                            "--no-socket", "--db", "postgresql://u:p@127.0.0.1:9/x",
                                            "--state-dir", str(state)],
        "host probe": ["host", "probe", "--state-dir", str(state)],
        "host probe --json": ["host", "probe", "--state-dir", str(state), "--json"],
        "bundle list": ["bundle", "list", "--state-dir", str(state)],
        "bundle list --json": ["bundle", "list", "--state-dir", str(state), "--json"],
    }


@pytest.mark.parametrize("under", [True, False], ids=["a path under a regular file", "a regular file"])
@pytest.mark.parametrize("command", list(state_commands(Path("."))))
def test_a_state_dir_that_cannot_be_a_directory_is_one_io_error_line_and_exit_1(tmp_path, command, under):
    (afile := tmp_path / "afile").write_text("not a dir")
    state = afile / "sub" if under else afile
    r = run(*state_commands(state)[command], timeout=60)
    assert r.returncode == 1, r.stderr
    [line] = r.stderr.strip().splitlines()
    want = f"--state-dir {state}: Not a directory"
    if command.endswith("--json"):
        err = json.loads(line)["error"]
        assert err["code"] == "io_error" and err["message"].startswith(want), line
    else:
        assert line.startswith(f"error: io_error: {want}"), line
    assert r.stdout == "" and afile.read_text() == "not a dir"


# ---- controller serve --no-socket -------------------------------------------------------------

def test_controller_serve_has_no_socket_and_no_automatic_negation():
    r = CliRunner().invoke(app, ["controller", "serve", "--help"], env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "--no-socket" in r.output, r.output
    assert "--no-no-socket" not in r.output, r.output
    r = CliRunner().invoke(app, ["controller", "serve", "--no-no-socket"])
    assert r.exit_code == 2 and "No such option" in r.output, r.output

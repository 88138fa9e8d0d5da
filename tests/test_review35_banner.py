"""Review 35: `--listen HOST:0` (any free port) is served, and the start-up line names the
port the system gave, not port 0, so the operator can register or reach it."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pytest

from support import fake_bundle


def _first_line(args: list[str], cwd) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen([sys.executable, "-m", "fuse.cli", *args], cwd=cwd, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    return p, p.stdout.readline().strip()


@pytest.mark.parametrize("what", ["agent", "controller"])
def test_port_zero_banner_names_the_bound_port(tmp_path, what):
    if what == "agent":
        fake_bundle(tmp_path / "state")
        args = ["host", "serve", "--backend", "fake", "--state-dir", str(tmp_path / "state"),
                "--listen", "127.0.0.1:0", "--token", "t0k"]
        path, prefix = "/v1/host/vms", "fuse host agent: "
    else:
        args = ["controller", "serve", "--state-dir", str(tmp_path / "state"), "--socket", str(tmp_path / "c.sock"),
                "--listen", "127.0.0.1:0", "--token", "t0k"]
        path, prefix = "/v1/hosts", "fuse controller: "
    p, line = _first_line(args, tmp_path)
    try:
        assert line.startswith(prefix), line
        m = re.search(r"listen 127\.0\.0\.1:(\d+)", line)
        assert m and int(m.group(1)) != 0, line
        r = httpx.get(f"http://127.0.0.1:{m.group(1)}{path}", headers={"Authorization": "Bearer t0k"}, timeout=10)
        assert r.status_code == 200, r.text
    finally:
        p.terminate()
        p.wait(timeout=30)

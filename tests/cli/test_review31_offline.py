"""Review 31 of the CLI's commands on files: `fuse pool plan --model` with a seed outside
int32 was a TypeError traceback and `--time-limit inf` was planned with (and written into the
plan's json as Infinity); `fuse host ca create` / `cert issue` printed raw errors
(`[Errno 2] ...`, cryptography's `MalformedFraming`); `fuse controller serve` served an SQLite
store damaged past the pages read at open. Real processes throughout."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from support import FUSE

GROUP = {"name": "a", "count": 1, "cpus": 1, "mem_mib": 1}
OFFLINE = {**os.environ, "FUSE_URL": "", "FUSE_TOKEN": ""}


def fuse(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(FUSE + list(args), capture_output=True, text=True, timeout=timeout, env=OFFLINE)


def one_error_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr and r.stdout == "", r.stdout + r.stderr
    return lines[0]


# ---- fuse pool plan --model ---------------------------------------------------------

@pytest.mark.parametrize("seed", [2**31, -2**31 - 1, 10**20], ids=["2^31", "-2^31 - 1", "10^20"])
def test_a_seed_outside_int32_is_a_usage_error_naming_it(tmp_path, seed):
    # (no machine to place it on: first fit leaves it unplaced, so the solver runs with the seed)
    model = {"groups": [GROUP], "seed": seed}
    (path := tmp_path / "m.json").write_text(json.dumps(model))
    r = fuse("pool", "plan", "--model", str(path), "--json")
    assert r.returncode == 2, r.stdout + r.stderr
    err = json.loads(one_error_line(r))["error"]
    assert err["code"] == "invalid_argument" and "seed" in err["message"], err


def test_a_seed_at_the_int32_bounds_plans(tmp_path):
    for seed in (2**31 - 1, -2**31):
        (path := tmp_path / "m.json").write_text(json.dumps({"groups": [GROUP], "seed": seed}))
        r = fuse("pool", "plan", "--model", str(path), "--json")
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("limit", ["inf", "-inf", "nan", "0"])
@pytest.mark.parametrize("with_model", [True, False], ids=["with --model", "from flags"])
def test_a_time_limit_that_is_not_finite_seconds_is_refused_by_name(tmp_path, limit, with_model):
    (path := tmp_path / "m.json").write_text(json.dumps({"groups": [GROUP]}))
    source = ["--model", str(path)] if with_model else ["--count", "1"]
    r = fuse("pool", "plan", *source, "--time-limit", limit)
    assert r.returncode == 2, r.stdout + r.stderr
    line = one_error_line(r)
    assert line.startswith("error: invalid_argument: --time-limit must be seconds above 0"), line
    assert "None" not in line, line


def test_a_plan_made_with_a_time_limit_re_solves(tmp_path):
    (path := tmp_path / "m.json").write_text(json.dumps({"groups": [GROUP]}))
    r = fuse("pool", "plan", "--model", str(path), "--time-limit", "2.5", "--json")
    assert r.returncode == 0, r.stderr
    (saved := tmp_path / "plan.json").write_text(r.stdout)
    assert json.loads(json.loads(r.stdout)["json"])["model"]["time_limit_secs"] == 2.5
    assert fuse("pool", "plan", "--model", str(saved), "--json").returncode == 0


# ---- fuse host ca create / cert issue -----------------------------------------------

def test_a_ca_out_that_cannot_be_made_names_it(tmp_path):
    line = one_error_line(r := fuse("host", "ca", "create", "--out", "/proc/nope"))
    assert r.returncode == 1 and line.startswith("error: io_error: ") and "/proc/nope" in line, line
    assert "[Errno" not in line and "No such file or directory" in line, line


def test_a_ca_out_that_is_a_file_says_so(tmp_path):
    (f := tmp_path / "afile").write_text("")
    line = one_error_line(r := fuse("host", "ca", "create", "--out", str(f)))
    assert r.returncode == 1 and line == f"error: io_error: --out {f}: it is a file, not a directory", line
    line = one_error_line(r := fuse("host", "cert", "issue", "--ca", str(_ca(tmp_path)), "--name", "h1", "--out",
                                    str(f)))
    assert r.returncode == 1 and line == f"error: io_error: --out {f}: it is a file, not a directory", line


def _ca(tmp_path: Path) -> Path:
    ca = tmp_path / "ca"
    if not ca.exists():
        assert fuse("host", "ca", "create", "--out", str(ca)).returncode == 0
    return ca


@pytest.mark.parametrize("junk", ["ca.pem", "ca.key", "both"])
def test_a_ca_dir_holding_junk_names_the_file(tmp_path, junk):
    good, bad = _ca(tmp_path), tmp_path / "bad"
    bad.mkdir()
    for name in ("ca.pem", "ca.key"):
        (bad / name).write_bytes(b"junk\n" if junk in (name, "both") else (good / name).read_bytes())
    r = fuse("host", "cert", "issue", "--ca", str(bad), "--name", "h1", "--out", str(tmp_path / "out"))
    line = one_error_line(r)
    named = "ca.key" if junk == "ca.key" else "ca.pem"
    assert r.returncode == 2 and line.startswith(f"error: invalid_argument: {bad / named} holds no "), line
    assert "MalformedFraming" not in line and not (tmp_path / "out").exists(), line


# ---- fuse controller serve on a damaged SQLite store ----------------------------------

def _damaged_store(state: Path) -> Path:
    """A controller's SQLite store with pages in its middle overwritten (disk damage past
    what opening it reads)."""
    from fuse.controller.store import Store, engine_url

    state.mkdir(mode=0o700)
    store = Store(engine_url(None, state))
    for i in range(3000):
        store.add_event("test", {"i": i, "pad": "x" * 100})
    store.close()
    db = state / "fuse.db"
    pages = db.stat().st_size // 4096
    with open(db, "r+b") as fh:
        fh.seek(pages // 2 * 4096)
        fh.write(b"\xa5" * 4096 * 5)
    return db


def test_serve_refuses_a_damaged_sqlite_store_in_one_line(tmp_path):
    db = _damaged_store(tmp_path / "ctl")
    try:
        r = subprocess.run(FUSE + ["controller", "serve", "--state-dir", str(tmp_path / "ctl"),
                                   "--socket", str(tmp_path / "ctl.sock")],
                           capture_output=True, text=True, timeout=30, env=OFFLINE)
    except subprocess.TimeoutExpired:
        pytest.fail("the controller served the damaged store")
    line = one_error_line(r)
    assert r.returncode == 1, line
    assert line.startswith(f"error: db_unavailable: the SQLite store in {tmp_path / 'ctl'}: "), line
    assert "damaged" in line and "backup" in line and f"sqlite3 {db} .recover" in line, line


def test_serve_starts_on_a_sound_sqlite_store(tmp_path):
    from support import start_controller

    ctl = start_controller(tmp_path)  # (made, stopped, and served again: quick_check finds it "ok")
    ctl.stop()
    ctl = start_controller(tmp_path)
    ctl.stop()

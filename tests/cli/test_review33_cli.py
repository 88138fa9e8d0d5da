"""Review 33 of the CLI: a bad FUSE_HTTP_HEAD_TIMEOUT_S with --listen, --days past the year 9999,
JSON nested too deeply for the parser, and `fuse pool plan` reading a controller's timing: each
was a traceback (or a message about "None"), where the README promises one sentence and exit 2."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess

import pytest

from support import FUSE


def _run(args: list[str], env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(FUSE + args, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def _one_line(r: subprocess.CompletedProcess, start: str) -> None:
    assert "Traceback" not in r.stderr, r.stderr[-2000:]
    assert r.stderr.startswith(start) and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]


@pytest.mark.parametrize("value", ["0", "abc", "nan", "inf", "-3"])
@pytest.mark.parametrize("command", [["host", "serve", "--backend", "fake", "--listen", "127.0.0.1:23150"],
                                     ["controller", "serve", "--listen", "127.0.0.1:23151", "--no-socket"]])
def test_a_bad_head_timeout_with_listen_is_one_sentence_and_exit_2(tmp_path, command, value):
    """(review 33: --listen's check imported fuse.serving, which read the setting as it loaded:
    a BadSetting traceback, exit 1, on the form the README documents; --socket said it)"""
    r = _run(command + ["--token", "T", "--state-dir", str(tmp_path / "s")], {"FUSE_HTTP_HEAD_TIMEOUT_S": value})
    assert r.returncode == 2, r.stdout + r.stderr[-2000:]
    why = "is not a number of seconds" if value == "abc" else "must be a positive number of seconds"
    assert r.stderr == f"error: invalid_argument: FUSE_HTTP_HEAD_TIMEOUT_S={value!r} {why}\n", r.stderr[-2000:]


def _largest_days() -> int:
    return (dt.datetime.max.replace(tzinfo=dt.timezone.utc) - dt.datetime.now(dt.timezone.utc)).days


@pytest.mark.parametrize("as_json", [False, True])
def test_days_past_the_year_9999_is_invalid_argument_naming_the_largest_and_writes_nothing(tmp_path, as_json):
    """(review 33: an OverflowError traceback, exit 1, from `host ca create` and `host cert issue`)"""
    flag = ["--json"] if as_json else []
    made = _run(["host", "ca", "create", "--out", str(tmp_path / "ok")])
    assert made.returncode == 0, made.stderr
    for args, out in ((["host", "ca", "create", "--out", str(tmp_path / "ca")], tmp_path / "ca"),
                      (["host", "cert", "issue", "--ca", str(tmp_path / "ok"), "--name", "h",
                        "--out", str(tmp_path / "h")], tmp_path / "h")):
        r = _run(args + ["--days", "3000000"] + flag)
        assert r.returncode == 2, r.stdout + r.stderr[-2000:]
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
        if as_json:
            err = json.loads(r.stderr)["error"]
            code, message = err["code"], err["message"]
        else:
            code, _, message = r.stderr.strip().removeprefix("error: ").partition(": ")
        assert code == "invalid_argument" and message.startswith("--days 3000000 ends after the year 9999"), r.stderr
        largest = int(message.rpartition(" ")[2])
        assert abs(largest - _largest_days()) <= 1, message
        assert not out.exists() or not any(out.iterdir())
    # the largest it names is taken
    r = _run(["host", "ca", "create", "--out", str(tmp_path / "max"), "--days", str(_largest_days() - 1), "--json"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads(r.stdout)["not_after"].startswith("9999-12-"), r.stdout


def _deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize("as_json", [False, True])
def test_a_model_file_of_json_nested_too_deeply_is_exit_2_saying_it_holds_no_model(tmp_path, as_json):
    """(review 33: a RecursionError traceback, exit 1)"""
    for name, text in (("deep.json", '{"model":' + _deep(100000) + "}"),
                       ("deep-plan.json", json.dumps({"json": '{"model":' + _deep(5000) + "}"}))):
        (tmp_path / name).write_text(text)
        r = _run(["pool", "plan", "--model", str(tmp_path / name)] + (["--json"] if as_json else []))
        assert r.returncode == 2, r.stdout + r.stderr[-2000:]
        message = f"{tmp_path / name}: holds no plan model: "
        if as_json:
            assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
            err = json.loads(r.stderr)["error"]
            assert err["code"] == "invalid_argument" and err["message"].startswith(message), r.stderr
            assert "nested too deeply" in err["message"]
        else:
            _one_line(r, f"error: invalid_argument: {message}")
            assert "nested too deeply" in r.stderr


@pytest.mark.parametrize("as_json", [False, True])
def test_cloud_options_of_json_nested_too_deeply_are_invalid_argument_before_anything_is_asked(
        tmp_path, controller, as_json):
    """(review 33: --options-json and a JSON --option value were a RecursionError traceback, exit 1)"""
    env = {"FUSE_URL": controller.url}
    flag = ["--json"] if as_json else []
    for given, named in ((["--options-json", _deep(5000)], "--options-json"),
                         (["--option", f"types={_deep(5000)}"], "--option types: the value")):
        r = _run(["pool", "cloud", "link", "x", "--kind", "local"] + given + flag, env)
        assert r.returncode == 2, r.stdout + r.stderr[-2000:]
        if as_json:
            assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr[-2000:]
            assert json.loads(r.stderr)["error"] == {"code": "invalid_argument",
                                                     "message": f"{named} is JSON nested too deeply to read"}
        else:
            assert r.stderr == f"error: invalid_argument: {named} is JSON nested too deeply to read\n", r.stderr
    listed = _run(["pool", "cloud", "list", "--json"], env)
    assert listed.returncode == 0 and json.loads(listed.stdout) == [], listed.stdout + listed.stderr


def test_pool_plan_reads_no_controller_timing_from_its_own_environment(tmp_path, controller):
    """(review 33: FUSE_POOL_CREATE_LEASE_S=0 stopped `fuse pool plan`, through a controller and
    offline, with "invalid_argument: None: ...": the CLI imported a module reading it as it loaded)"""
    env = {"FUSE_POOL_CREATE_LEASE_S": "0"}
    via = _run(["pool", "plan", "--count", "1", "--url", controller.url, "--json"], env)
    assert via.returncode == 0, via.stderr[-2000:]
    assert json.loads(via.stdout)["assignments"], via.stdout
    offline = subprocess.run(FUSE + ["pool", "plan", "--count", "1", "--json"], capture_output=True, text=True,
                             timeout=120, env={k: v for k, v in {**os.environ, **env}.items() if k != "FUSE_URL"})
    assert "None" not in offline.stderr, offline.stderr[-2000:]
    assert offline.returncode == 0, offline.stderr[-2000:]
    # the controller itself still refuses it at start, in one sentence
    r = _run(["controller", "serve", "--state-dir", str(tmp_path / "c2"), "--socket", str(tmp_path / "c2.sock")], env)
    assert r.returncode == 2 and r.stderr == ("error: invalid_argument: FUSE_POOL_CREATE_LEASE_S='0' must be a "
                                              "positive number of seconds\n"), r.stderr[-2000:]

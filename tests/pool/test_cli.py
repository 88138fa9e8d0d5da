"""``fuse pool plan`` on the offline path (no controller on the default socket, or
``--model``): table, --json (on stdout; the offline note goes to stderr), and --model what-if."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fuse.cli.pool import app
from fuse.models.pool import ElasticPlan

runner = CliRunner(env={"FUSE_URL": ""})


@pytest.fixture(autouse=True)
def no_default_controller(tmp_path, monkeypatch):
    """No controller listens on the default socket, whatever runs on this machine: offline."""
    monkeypatch.setattr("fuse.controller.service.default_controller_socket", lambda: tmp_path / "none.sock")


def test_plan_prints_a_table_for_people():
    r = runner.invoke(app, ["plan", "--count", "12", "--cpus", "2", "--memory-mb", "2048"])
    assert r.exit_code == 0, r.output
    assert "c6g.metal" in r.output and "exact" in r.output


def test_json_output_round_trips_and_model_resolves_a_what_if(tmp_path):
    r = runner.invoke(app, ["plan", "--count", "3", "--cpus", "2", "--memory-mb", "2048",
                            "--kind", "container", "--json"])
    assert r.exit_code == 0, r.output
    plan = ElasticPlan.model_validate_json(r.stdout)
    assert sum(a.count for a in plan.assignments) == 3
    assert list(json.loads(r.stdout)) == sorted(json.loads(r.stdout))  # (keys sorted, as every --json)
    body = json.loads(plan.json)
    body["model"]["constraints"]["max_new_hosts"] = 1  # what if only one machine may be added?
    f = tmp_path / "model.json"
    f.write_text(json.dumps(body))
    r = runner.invoke(app, ["plan", "--model", str(f), "--json"])
    again = ElasticPlan.model_validate_json(r.stdout)
    # one host; Modal sandboxes (one_space) are not hosts, so they take the rest
    assert len([h for h in again.new_hosts if not h.one_space]) == 1
    assert sum(a.count for a in again.assignments) == 3 and again.projected_usd > plan.projected_usd


def test_no_scale_places_nothing_on_an_empty_pool():
    r = runner.invoke(app, ["plan", "--count", "2", "--no-scale", "--json"])
    assert r.exit_code == 0
    assert ElasticPlan.model_validate_json(r.stdout).unplaced[0].count == 2


def test_bad_kind_exits_2():
    r = runner.invoke(app, ["plan", "--kind", "unikernel"])
    assert r.exit_code == 2 and "invalid_argument" in r.output


def _model(r) -> dict:
    assert r.exit_code == 0, r.output
    return json.loads(ElasticPlan.model_validate_json(r.stdout).json)["model"]


@pytest.mark.parametrize("args, says", [
    (["--count", "-1"], "error: invalid_argument: --count:"),
    (["--memory-mb", "0"], "error: invalid_argument: --memory-mb:"),
    (["--cpus", "0"], "error: invalid_argument: --cpus:"),
    (["--duration-secs", "-5"], "error: invalid_argument: --duration-secs:"),
    (["--caller", "robot"], "error: invalid_argument: caller must be one of"),
], ids=["a negative count", "no memory", "no vCPUs", "a negative duration", "an unknown caller"])
def test_bad_flags_print_an_error_and_exit_2_without_a_traceback(args, says):
    r = runner.invoke(app, ["plan", *args])
    assert r.exit_code == 2 and says in r.output, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)


@pytest.mark.parametrize("args, duration", [
    ([], 3600), (["--caller", "batch"], 14400), (["--caller", "persistent_agent"], 86400),
    (["--caller", "batch", "--duration-secs", "600"], 600), (["--duration-secs", "60"], 60),
], ids=["no caller: 3600", "batch: 14400", "persistent_agent: 86400", "a duration given wins over the caller's",
        "a duration alone"])
def test_duration_comes_from_the_flag_else_the_caller(args, duration):
    g = _model(runner.invoke(app, ["plan", "--kind", "container", "--json", *args]))["groups"][0]
    assert g["duration_secs"] == duration


def test_help_states_the_defaults():
    import re

    r = runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "200", "FUSE_URL": ""})
    text = re.sub(r"\s+", " ", r.output)
    assert "else 1)" in text and "else 1024)" in text
    assert "batch 14400" in text and "default none: 3600 s" in text


def test_model_takes_a_whole_plan_saved_with_json(tmp_path):
    r = runner.invoke(app, ["plan", "--count", "5", "--cpus", "2", "--memory-mb", "2048", "--kind", "container",
                            "--caller", "batch", "--json"])
    first = ElasticPlan.model_validate_json(r.stdout)
    saved = tmp_path / "plan.json"
    saved.write_text(r.stdout)  # the --json output as it is, not its json field
    again = ElasticPlan.model_validate_json(runner.invoke(app, ["plan", "--model", str(saved), "--json"]).stdout)
    assert again.model_dump(exclude={"json"}) == first.model_dump(exclude={"json"})
    assert json.loads(again.json)["model"]["groups"][0]["duration_secs"] == 14400


@pytest.mark.parametrize("flags", [["--count", "3"], ["--cpus", "2", "--no-scale"], ["--max-usd-per-hour", "1"]],
                         ids=["--count", "--cpus and --no-scale", "--max-usd-per-hour"])
def test_model_refuses_request_flags_it_would_ignore(tmp_path, flags):
    saved = tmp_path / "plan.json"
    saved.write_text(runner.invoke(app, ["plan", "--kind", "container", "--json"]).stdout)
    r = runner.invoke(app, ["plan", "--model", str(saved), *flags])
    assert r.exit_code == 2 and "error: invalid_argument: --model" in r.output, r.output
    assert all(f in r.output for f in flags if f.startswith("--"))

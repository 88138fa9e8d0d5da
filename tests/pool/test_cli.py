"""``fuse pool plan`` on the offline path: table, --json, and --model what-if."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fuse.cli.pool import app
from fuse.models.pool import ElasticPlan

runner = CliRunner(env={"FUSE_URL": ""})


def test_plan_prints_a_table_for_people():
    r = runner.invoke(app, ["plan", "--count", "12", "--cpus", "2", "--memory-mb", "2048"])
    assert r.exit_code == 0, r.output
    assert "c6g.metal" in r.output and "exact" in r.output


def test_json_output_round_trips_and_model_resolves_a_what_if(tmp_path):
    r = runner.invoke(app, ["plan", "--count", "3", "--cpus", "2", "--memory-mb", "2048",
                            "--kind", "container", "--json"])
    assert r.exit_code == 0, r.output
    plan = ElasticPlan.model_validate_json(r.output)
    assert sum(a.count for a in plan.assignments) == 3
    body = json.loads(plan.json)
    body["model"]["constraints"]["max_new_hosts"] = 1  # what if only one machine may be added?
    f = tmp_path / "model.json"
    f.write_text(json.dumps(body))
    r = runner.invoke(app, ["plan", "--model", str(f), "--json"])
    again = ElasticPlan.model_validate_json(r.output)
    # one host; Modal sandboxes (one_space) are not hosts, so they take the rest
    assert len([h for h in again.new_hosts if not h.one_space]) == 1
    assert sum(a.count for a in again.assignments) == 3 and again.projected_usd > plan.projected_usd


def test_no_scale_places_nothing_on_an_empty_pool():
    r = runner.invoke(app, ["plan", "--count", "2", "--no-scale", "--json"])
    assert r.exit_code == 0
    assert ElasticPlan.model_validate_json(r.output).unplaced[0].count == 2


def test_bad_kind_exits_2():
    r = runner.invoke(app, ["plan", "--kind", "unikernel"])
    assert r.exit_code == 2 and "invalid_argument" in r.output

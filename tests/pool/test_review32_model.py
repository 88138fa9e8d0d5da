"""Review 32: a plan's own ``json`` was refused by ``fuse pool plan --model`` whenever the plan
used a cloud machine still booting: its json has ``joining`` (and ``late`` once past the boot
time) beside the model and the plan, and the CLI refused any key but those two. They are what
the plan saw, not the model's input: read past as ``plan`` is; a key nobody writes is still
refused.

A real controller process with an aws cloud on a moto server (loopback subnet: its machines
never join, so they stay booting), and the ``fuse`` CLI as a process."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time

import pytest

import fuse
from support import start_controller

INSTANCE = "m7i.large"


@pytest.fixture
def aws_pool(tmp_path, link_aws):
    ctl = start_controller(tmp_path)
    client = fuse.Client(ctl.url)
    link_aws(client)
    yield client, ctl
    client.pool.cloud_remove_host([h.name for h in client.pool.cloud_hosts()])
    client.close()
    ctl.stop()


def age(ctl, name: str, secs: float) -> None:
    """Make elastic host ``name`` bought ``secs`` ago (in the controller's own store)."""
    with sqlite3.connect(ctl.state_dir / "fuse.db", timeout=30) as db:
        db.execute("UPDATE elastic_hosts SET started = ? WHERE name = ?", (time.time() - secs, name))


def resolve(path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "fuse.cli", "pool", "plan", "--model", str(path), "--json"],
                          capture_output=True, text=True, timeout=120)


def test_a_plan_on_a_machine_still_booting_or_late_re_solves_from_its_own_json(aws_pool, tmp_path):
    client, ctl = aws_pool
    (h,) = client.pool.cloud_add_host("aws1", INSTANCE, ttl_hours=1)
    assert h.state == "booting"
    req = fuse.ElasticPlanRequest(count=1, kind="container", memory_mb=256, provider="aws1", instance_type=INSTANCE)

    def round_trip(plan, key: str) -> None:
        body = json.loads(plan.json)
        assert set(body) >= {"model", "plan", key}, sorted(body)
        assert [(a.host, a.count) for a in plan.assignments] == [(h.name, 1)]
        for name, saved in (("json", plan.json), ("whole", json.dumps(plan.model_dump(mode="json")))):
            (f := tmp_path / f"{key}-{name}.json").write_text(saved)
            done = resolve(f)
            assert done.returncode == 0, (name, done.stdout, done.stderr)
            again = json.loads(done.stdout)
            assert [(a["host"], a["count"]) for a in again["assignments"]] == [(h.name, 1)] and not again["unplaced"]

    plan = client.pool.cloud_plan(req)
    round_trip(plan, "joining")
    boot = next(o["boot_secs"] for o in json.loads(plan.json)["model"]["offers"] if o["type_name"] == INSTANCE)
    age(ctl, h.name, boot + 30)  # past its boot time, not its join grace: late
    round_trip(client.pool.cloud_plan(req), "late")

    # a key no plan writes is still refused, naming it
    body = json.loads(client.pool.cloud_plan(req).json) | {"colour": "red"}
    (f := tmp_path / "colour.json").write_text(json.dumps(body))
    done = resolve(f)
    assert done.returncode == 2 and "unknown field 'colour' beside the model" in done.stdout + done.stderr, done

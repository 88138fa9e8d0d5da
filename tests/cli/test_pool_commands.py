"""``fuse pool ...`` against a real controller: the hosts it buys in a linked
cloud, the budget, scale-in and prewarm, as a table for people and ``--json``
for programs; errors as ``error: <code>: <message>``, exit 2 for a flag refused
before the controller is asked, exit 1 for the controller's own refusal or none
answering (as under ``fuse controller``) and for a partly-no answer (a host not
removed, no such prewarm)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fuse.cli.main import app
from support import reap, start_controller, wait_until


@pytest.fixture(scope="module")
def empty(tmp_path_factory):
    """A controller with no clouds, hosts or prewarms; the tests using it change nothing."""
    tmp = tmp_path_factory.mktemp("pool")
    ctl = start_controller(tmp)
    yield ctl
    ctl.stop()
    reap(tmp)


@pytest.fixture
def ctl(tmp_path):
    """A controller of the test's own (for tests that change the pool)."""
    c = start_controller(tmp_path)
    yield c
    c.stop()
    reap(tmp_path)  # the local cloud's agents run in sessions of their own, like real machines


def fuse(ctl, *args: str, code: int = 0):
    r = CliRunner().invoke(app, list(args), env={"FUSE_URL": ctl.url, "FUSE_TOKEN": ""})
    assert r.exit_code == code, f"exit {r.exit_code}: {r.output}{r.exception!r}"
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception  # no traceback
    return r


def as_json(ctl, *args: str):
    return json.loads(fuse(ctl, *args, "--json").stdout)


def test_an_empty_pool_lists_nothing_in_tables_and_json(empty):
    assert "no elastic hosts" in fuse(empty, "pool", "hosts").stdout
    assert as_json(empty, "pool", "hosts") == [] and as_json(empty, "pool", "hosts", "--all") == []
    assert "nothing to decide" in fuse(empty, "pool", "reconcile").stdout
    assert as_json(empty, "pool", "reconcile") == []
    assert "no prewarms" in fuse(empty, "pool", "prewarms").stdout
    assert as_json(empty, "pool", "prewarms") == []
    assert "no linked clouds" in fuse(empty, "pool", "cloud", "list").stdout
    assert as_json(empty, "pool", "cloud", "list") == []


def test_budget_shows_with_no_flags_sets_the_ones_given_and_refuses_a_negative_cap(ctl):
    shown = as_json(ctl, "pool", "budget")
    assert (shown["autoscale"], shown["max_usd_per_hour"], shown["hosts"]) == (False, 0.0, 0)
    assert "no cap" in fuse(ctl, "pool", "budget").stdout
    set_ = as_json(ctl, "pool", "budget", "--max-usd-per-hour", "2.5", "--max-new-hosts", "3", "--autoscale",
                   "--no-warm")
    assert (set_["max_usd_per_hour"], set_["max_new_hosts"], set_["autoscale"], set_["warm"]) == (2.5, 3, True, False)
    again = as_json(ctl, "pool", "budget", "--monthly-usd", "100")  # the others stay as they were
    assert (again["monthly_usd"], again["max_usd_per_hour"], again["autoscale"]) == (100.0, 2.5, True)
    table = fuse(ctl, "pool", "budget").stdout
    assert "$2.5000" in table and "on" in table

    r = fuse(ctl, "pool", "budget", "--max-usd-per-hour", "-1", code=2)
    assert "error: invalid_argument: --max-usd-per-hour: Input should be greater than or equal to 0" in r.stderr
    assert as_json(ctl, "pool", "budget")["max_usd_per_hour"] == 2.5  # nothing changed


@pytest.mark.parametrize("args, code, says", [
    (["pool", "unprewarm", "pw-nope"], 1, "error: not_found: no prewarm pw-nope"),
    (["pool", "add-host", "--provider", "aws", "--instance-type", "t3.small"], 1,
     "error: invalid_argument: no linked cloud 'aws'"),
    (["pool", "add-host", "--provider", "aws", "--instance-type", "t3.small", "--json"], 1,
     '{"error": {"code": "invalid_argument", "message": "no linked cloud \'aws\''),
    (["pool", "cloud", "link", "gce", "--kind", "gcp"], 1, "error: invalid_argument: unknown cloud kind 'gcp'"),
    (["pool", "cloud", "link", "dev", "--kind", "local", "--option", "backend"], 2,
     "error: invalid_argument: --option: 'backend' is not key=value"),
    (["pool", "cloud", "link", "dev", "--kind", "local", "--options-json", "[1]"], 2,
     "error: invalid_argument: --options-json: must be a JSON object"),
    (["pool", "cloud", "unlink", "dev"], 1, "error: not_found: no linked cloud 'dev'"),
    (["pool", "plan", "--count", "2", "--apply"], 1, "error: invalid_argument: apply buys machines in a linked cloud"),
    (["pool", "prewarm", "linux", "--count", "0"], 2, "error: invalid_argument: --count:"),
    (["pool", "prewarm", "linux", "--ttl-secs", "0"], 2, "error: invalid_argument: --ttl-secs:"),
    (["pool", "prewarm", "linux", "--on", "host:"], 1, "error: invalid_argument: on 'host:' names no host"),
    (["pool", "prewarm", "linux", "--on", "nowhere"], 1, "error: invalid_argument: no linked cloud 'nowhere'"),
    (["pool", "remove-host", "dev-9"], 1, "failed dev-9: not a host this pool added"),
    (["controller", "vms", "create", "--entry", "x", "--on", "nowhere"], 1,
     "error: invalid_argument: no linked cloud 'nowhere'"),
], ids=["unprewarm of no such prewarm exits 1", "add-host with no cloud linked",
        "add-host with no cloud linked, in --json mode too", "link with an unknown kind",
        "link with an option that is not key=value", "link with options that are not an object",
        "unlink of no such cloud", "plan --apply with no cloud linked", "prewarm of no VMs",
        "prewarm kept for no time", "prewarm on host: naming no machine", "prewarm on no such cloud",
        "remove-host of no such host exits 1 naming it", "vms create passes --on to the controller"])
def test_refusals_print_the_code_and_message(empty, args, code, says):
    r = fuse(empty, *args, code=code)
    assert says in r.stderr, r.output
    assert r.stdout == ""


@pytest.mark.parametrize("args, code, want", [
    (["pool", "unprewarm", "pw-nope"], 1, "not_found"),
    (["pool", "cloud", "unlink", "dev"], 1, "not_found"),
    (["pool", "budget", "--max-usd-per-hour", "-1"], 2, "invalid_argument"),
    (["pool", "prewarm", "linux", "--on", "nowhere"], 1, "invalid_argument"),
    (["pool", "plan", "--count", "2", "--apply"], 1, "invalid_argument"),
], ids=["unprewarm", "cloud unlink", "budget", "prewarm", "plan"])
def test_under_json_a_refusal_is_the_apis_error_body(empty, args, code, want):
    # as every `fuse controller` command: a program reading --json parses its error too
    r = fuse(empty, *args, "--json", code=code)
    err = json.loads(r.stderr.strip().splitlines()[-1])["error"]
    assert err["code"] == want and err["message"] and r.stdout == ""


def test_prewarm_help_names_every_kind_it_accepts():
    import re

    r = CliRunner().invoke(app, ["pool", "prewarm", "--help"], env={"COLUMNS": "200"})
    assert "container, vm or microvm" in re.sub(r"\s+", " ", r.output), r.output


def test_unprewarm_and_unlink_answer_json(ctl):
    fuse(ctl, "pool", "cloud", "link", "dev", "--kind", "local", "--option", "backend=fake")
    assert as_json(ctl, "pool", "cloud", "unlink", "dev") == {"name": "dev", "unlinked": True}
    fuse(ctl, "pool", "cloud", "link", "dev", "--kind", "local", "--option", "backend=fake")
    pw = as_json(ctl, "pool", "prewarm", "linux", "--count", "1", "--memory-mb", "256")
    assert as_json(ctl, "pool", "unprewarm", pw["id"]) == {"id": pw["id"], "ended": True}


def default_socket(monkeypatch, path) -> None:
    """Make ``path`` the controller's default socket (where the CLI looks with no --url or FUSE_URL)."""
    monkeypatch.setattr("fuse.controller.service.default_controller_socket", lambda: Path(path))


@pytest.fixture
def no_default_controller(tmp_path, monkeypatch):
    """No controller listens on the default socket (whatever runs on this machine)."""
    default_socket(monkeypatch, tmp_path / "no-controller.sock")
    return tmp_path / "no-controller.sock"


def test_plan_apply_needs_a_controller(no_default_controller):
    r = CliRunner().invoke(app, ["pool", "plan", "--count", "2", "--apply"], env={"FUSE_URL": ""})
    assert r.exit_code == 2 and "error: invalid_argument: --apply buys machines" in r.stderr, r.output
    assert "needs a controller" in r.stderr and f"unix://{no_default_controller}" in r.stderr
    assert "give --url or FUSE_URL" in r.stderr
    assert "applying" not in r.stderr  # (review 34: "applying: the controller buys ..." was said first)


def test_plan_with_no_url_asks_the_controller_on_its_default_socket(empty, monkeypatch):
    # as fuse.Client() and every other `fuse pool` command: the controller's default socket
    default_socket(monkeypatch, empty.socket)
    r = CliRunner().invoke(app, ["pool", "plan", "--count", "2", "--json"], env={"FUSE_URL": "", "FUSE_TOKEN": ""})
    assert r.exit_code == 0, r.output
    assert r.stderr == "" and json.loads(r.stdout)["new_hosts"]
    # --apply reaches it too: the controller's own answer (no cloud linked), not "needs a controller"
    r = CliRunner().invoke(app, ["pool", "plan", "--count", "2", "--apply"], env={"FUSE_URL": "", "FUSE_TOKEN": ""})
    assert r.exit_code == 1
    assert "error: invalid_argument: apply buys machines in a linked cloud and none is linked" in r.stderr, r.output


def test_plan_with_no_url_plans_on_the_default_controllers_clouds(ctl, monkeypatch):
    fuse(ctl, "pool", "cloud", "link", "dev", "--kind", "local", "--option", "backend=fake")
    default_socket(monkeypatch, ctl.socket)
    r = CliRunner().invoke(app, ["pool", "plan", "--count", "1", "--cpus", "1", "--memory-mb", "512", "--json"],
                           env={"FUSE_URL": "", "FUSE_TOKEN": ""})
    assert r.exit_code == 0, r.output
    assert {h["provider"] for h in json.loads(r.stdout)["new_hosts"]} == {"dev"}  # offline it would buy in aws


def test_plan_with_no_controller_on_the_default_socket_says_it_plans_offline(no_default_controller):
    r = CliRunner().invoke(app, ["pool", "plan", "--count", "2", "--json"], env={"FUSE_URL": ""})
    assert r.exit_code == 0, r.output
    assert r.stderr == f"no controller at {no_default_controller}: planning offline against the shipped catalogue\n"
    assert {h["provider"] for h in json.loads(r.stdout)["new_hosts"]} == {"aws"}


def test_the_url_may_come_before_the_subcommand_as_under_fuse_controller(empty, tmp_path):
    # (review 21: `fuse pool --url X hosts` was "No such option: --url", exit 2)
    r = CliRunner().invoke(app, ["pool", "--url", empty.url, "hosts", "--json"], env={"FUSE_URL": ""})
    assert r.exit_code == 0 and json.loads(r.stdout) == [], r.output
    r = CliRunner().invoke(app, ["pool", "--url", f"unix://{tmp_path}/nope.sock", "plan", "--count", "2"],
                           env={"FUSE_URL": ""})
    assert r.exit_code == 1 and "error: unreachable: cannot reach the controller" in r.stderr, r.output


def test_a_time_limit_the_controller_does_not_take_is_said_not_silently_dropped(empty):
    r = CliRunner().invoke(app, ["pool", "plan", "--count", "1", "--kind", "container", "--time-limit", "0.5"],
                           env={"FUSE_URL": empty.url})
    assert r.exit_code == 0, r.output
    assert "note: --time-limit is for offline plans: the controller planned with its own limit" in r.stderr


def test_plan_with_a_url_never_plans_offline(tmp_path):
    # the controller named is the one asked: no answer is an error, not a what-if
    r = CliRunner().invoke(app, ["pool", "plan", "--count", "2"], env={"FUSE_URL": f"unix://{tmp_path}/nope.sock"})
    assert r.exit_code == 1 and "error: unreachable: cannot reach the controller" in r.stderr, r.output
    assert r.stdout == ""


@pytest.mark.parametrize("args", [
    ["controller", "hosts", "list"], ["pool", "hosts"], ["pool", "prewarms"], ["pool", "unprewarm", "pw-1"],
    ["pool", "cloud", "list"], ["pool", "cloud", "unlink", "dev"], ["pool", "budget"], ["pool", "reconcile"],
    ["pool", "plan", "--count", "1"], ["pool", "add-host", "--provider", "dev", "--instance-type", "t"],
], ids=lambda a: " ".join(a))
@pytest.mark.parametrize("as_json", [False, True], ids=["for people", "--json"])
def test_an_unreachable_controller_exits_1_under_pool_as_under_controller(tmp_path, args, as_json):
    # the same failure, the same status: 2 is kept for a flag refused before the controller is asked
    r = CliRunner().invoke(app, [*args, *(["--json"] if as_json else [])],
                           env={"FUSE_URL": f"unix://{tmp_path}/nothing.sock", "FUSE_TOKEN": ""})
    assert r.exit_code == 1, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    line = r.stderr.strip()
    code = json.loads(line)["error"]["code"] if as_json else line.split(":")[1].strip()
    assert code == "unreachable" and r.stdout == "", r.output


def test_an_offline_plan_keeps_what_the_solvers_print_off_the_json(monkeypatch, capfd, no_default_controller):
    import importlib

    cli_pool = importlib.import_module("fuse.cli.pool")

    real = cli_pool._plan

    def chatty(model):  # as HiGHS's C++ does now and then: a debug line straight on fd 1
        os.write(1, b"HighsMipSolverData::debug line\n")
        return real(model)

    monkeypatch.setattr(cli_pool, "_plan", chatty)
    r = CliRunner().invoke(app, ["pool", "plan", "--count", "2", "--json"], env={"FUSE_URL": ""})
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["solver"] == "exact"
    out, err = capfd.readouterr()
    assert "debug line" not in out and "debug line" in err


def test_an_offline_plan_prints_no_solver_banner(tmp_path):
    # HiGHS prints a banner once per process, with no final newline: on stderr the CLI's
    # next line (an error, say) ran on after it. (--model: offline whatever listens on the default socket)
    import subprocess
    import sys

    from fuse.controller.pool.request import model_from_request
    from fuse.models.pool import ElasticPlanRequest

    (model := tmp_path / "model.json").write_text(model_from_request(ElasticPlanRequest(count=3), []).model_dump_json())
    r = subprocess.run([sys.executable, "-m", "fuse.cli", "pool", "plan", "--model", str(model), "--json"],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "FUSE_URL": ""})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["solver"] == "exact"
    assert "HiGHS" not in r.stderr and "HiGHS" not in r.stdout


def test_plan_through_a_controller_buys_nothing_without_apply(empty):
    plan = as_json(empty, "pool", "plan", "--count", "2", "--cpus", "2", "--memory-mb", "2048")
    assert plan["new_hosts"] and plan["added"] == []
    assert as_json(empty, "pool", "hosts") == []


def joined(ctl, name: str) -> dict:
    hosts = {h["name"]: h for h in as_json(ctl, "pool", "hosts")}
    assert hosts[name]["state"] not in ("gone", "offline"), hosts[name]
    return hosts[name] if hosts[name]["state"] == "joined" else None


def test_a_local_cloud_host_is_bought_joins_takes_a_vm_and_is_removed(ctl):
    cloud = as_json(ctl, "pool", "cloud", "link", "dev", "--kind", "local", "--option", "backend=fake",
                    "--option", "vm_count=4")
    # the pool fixes where its machines live when it links it (every replica then finds them)
    assert cloud == {"name": "dev", "kind": "local", "types": ["local.medium", "local.small"],
                     "options": {"backend": "fake", "vm_count": 4,
                                 "dir": str((ctl.state_dir / "clouds" / "dev").resolve())}}
    assert "local.small" in fuse(ctl, "pool", "cloud", "list").stdout

    [added] = as_json(ctl, "pool", "add-host", "--provider", "dev", "--instance-type", "local.small",
                      "--ttl-hours", "2")
    assert (added["provider"], added["type_name"], added["pinned"]) == ("dev", "local.small", True)
    assert added["expires"] - added["started"] == 2 * 3600
    name = added["name"]
    host = wait_until(lambda: joined(ctl, name), timeout=60, interval=0.5, what=f"{name} joined")
    assert host["machine"] == name
    assert name in fuse(ctl, "pool", "hosts").stdout
    assert as_json(ctl, "pool", "budget")["hosts"] == 1
    [keep] = as_json(ctl, "pool", "reconcile")
    assert (keep["host"], keep["action"]) == (name, "keep")  # added by hand: it ends at its TTL

    # --on picks the cloud's hosts, and local the operator's own (there are none)
    vm = as_json(ctl, "controller", "vms", "create", "--entry", "x", "--name", "job1", "--on", "dev")
    assert vm["host"] == name
    r = fuse(ctl, "controller", "vms", "create", "--entry", "x", "--on", "local", code=1)
    assert "fleet_full" in r.stderr

    # A host with a VM is refused, and so is unlinking its cloud; nothing is lost.
    r = fuse(ctl, "pool", "remove-host", name, code=1)
    assert f"failed {name}: 1 VM on it (job1)" in r.stderr
    r = fuse(ctl, "pool", "cloud", "unlink", "dev", code=1)
    assert "error: conflict: cloud dev still has hosts" in r.stderr
    fuse(ctl, "controller", "vms", "delete", "job1")

    removed = as_json(ctl, "pool", "remove-host", name)
    assert removed == {"removed": [name], "failed": []}
    assert as_json(ctl, "pool", "hosts") == []
    assert [h["state"] for h in as_json(ctl, "pool", "hosts", "--all")] == ["gone"]
    assert "cloud dev unlinked" in fuse(ctl, "pool", "cloud", "unlink", "dev").stdout
    assert as_json(ctl, "pool", "cloud", "list") == []


def test_plan_apply_buys_the_machines_the_plan_adds(ctl):
    fuse(ctl, "pool", "cloud", "link", "dev", "--kind", "local", "--options-json", '{"backend": "fake"}')
    r = fuse(ctl, "pool", "plan", "--count", "1", "--cpus", "1", "--memory-mb", "512", "--provider", "dev",
             "--apply")
    assert "added" in r.stdout and "dev-1" in r.stdout and "applying" in r.stderr
    [host] = as_json(ctl, "pool", "hosts")
    assert (host["name"], host["pinned"]) == ("dev-1", False)  # a plan's machine: scale-in may remove it
    wait_until(lambda: joined(ctl, "dev-1"), timeout=60, interval=0.5, what="dev-1 joined")
    started = time.time()
    assert as_json(ctl, "pool", "remove-host", "dev-1")["removed"] == ["dev-1"]
    assert time.time() - started < 60


def test_the_prewarms_table_says_when_a_refill_buys_again_and_why(capsys):
    """A prewarm in backoff (the cloud kept ending its machines) shows it in the table, not
    only in --json; one that may buy now shows "-"."""
    import time as _time

    from fuse.cli.pool import _prewarm_table
    from fuse.models.pool import Prewarm

    later = int(_time.time()) + 600
    _prewarm_table([Prewarm(id="pw-1", image="img", kind="vm", cpus=1, memory_mb=256, count=2,
                            backoff_until=later, backoff_reason="the cloud ended 2 machines in a row"),
                    Prewarm(id="pw-2", image="img", kind="vm", cpus=1, memory_mb=256, count=1)])
    out = capsys.readouterr().out
    assert "buys again" in out
    line1 = next(ln for ln in out.splitlines() if "pw-1" in ln)
    assert _time.strftime("%H:%M:%S", _time.localtime(later)) in line1 and "the cloud ended" in out
    line2 = next(ln for ln in out.splitlines() if "pw-2" in ln)
    assert line2.strip("│ ").split("│")[-1].strip() == "-"


def test_an_edited_model_with_a_nan_or_infinite_number_is_refused_with_the_field(tmp_path):
    """`fuse pool plan --model FILE.json` re-solves an edited model: a NaN price (JSON's
    NaN literal, which Python reads) would make every cost comparison false; it is an
    error naming the field, exit 2, not a plan."""
    from fuse.controller.pool.request import model_from_request
    from fuse.models.pool import ElasticPlanRequest

    data = json.loads(model_from_request(ElasticPlanRequest(count=3), []).model_dump_json())
    assert data["offers"], "the default model offers the shipped catalogue"
    for bad in ("NaN", "Infinity"):
        data["offers"][0]["usd_per_hour"] = "__BAD__"
        (model := tmp_path / "model.json").write_text(json.dumps(data).replace('"__BAD__"', bad))
        r = CliRunner().invoke(app, ["pool", "plan", "--model", str(model)], env={"FUSE_URL": ""})
        assert r.exit_code == 2, r.output
        assert "usd_per_hour" in r.output and "finite" in r.output, r.output


@pytest.mark.parametrize("edit,says", [
    (lambda m: m["groups"].append(dict(m["groups"][0])), "group names must be unique: request-0 given twice"),
    (lambda m: m["groups"][0].update(count=10_000_000), "10000000 VMs in all: a plan takes at most 100000"),
    # (planned as containers, below zero, and read as 2: a request refuses each)
    (lambda m: m["groups"][0].update(kind="banana"), "kind must be one of ['container', 'microvm', 'vm']"),
    (lambda m: m["constraints"].update(quotas={"aws:standard": -5}), "greater than or equal to 0"),
    (lambda m: m["groups"][0].update(cpus="2"), "groups.0.cpus: Input should be a valid integer"),
    # (review 17: a sparc offer or host was bought or used; an offer twice had its limit twice;
    # a 2^40-second duration planned a $610M plan)
    (lambda m: m["offers"][0].update(arch="sparc"), "offers.0: Value error, arch must be one of ['amd64', 'arm64']"),
    (lambda m: m["hosts"].append({"name": "h", "vcpus": 4, "mem_mib": 4096, "arch": "sparc"}),
     "hosts.0: Value error, arch must be one of ['amd64', 'arm64']"),
    (lambda m: m["offers"].append(dict(m["offers"][0])), "offer names must be unique"),
    (lambda m: m["groups"][0].update(duration_secs=2**40), "groups.0.duration_secs: Input should be less than or equal"),
], ids=["a group named twice", "past the 100,000-VM cap", "an unknown kind", "a negative quota", "a count as text",
        "an unknown offer arch", "an unknown host arch", "an offer twice", "a duration past u32"])
def test_an_edited_model_is_held_to_what_a_request_could_ask(tmp_path, edit, says):
    """A re-solved model answers by group and host name and is bounded as a request is: two
    groups of one name, or 10 million VMs (which ran on past a minute at 4 GB), are refused."""
    from fuse.controller.pool.request import model_from_request
    from fuse.models.pool import ElasticPlanRequest

    data = json.loads(model_from_request(ElasticPlanRequest(count=3), []).model_dump_json())
    edit(data)
    (model := tmp_path / "model.json").write_text(json.dumps(data))
    r = CliRunner().invoke(app, ["pool", "plan", "--model", str(model)], env={"FUSE_URL": ""})
    assert r.exit_code == 2, r.output
    assert says in r.output and "()" not in r.output, r.output


@pytest.mark.parametrize("limit", ["0", "-1", "nan"])
def test_a_bad_time_limit_names_the_option(limit):
    r = CliRunner().invoke(app, ["pool", "plan", "--count", "10", "--time-limit", limit], env={"FUSE_URL": ""})
    assert r.exit_code == 2, r.output
    assert "--time-limit must be seconds above 0" in r.output and "None" not in r.output, r.output


@pytest.mark.parametrize("content,says", [
    ({}, "holds no plan model: a model has groups"),
    ({"json": "{}"}, "its json field holds no model"),
    ("MODEL+colour", "unknown field 'colour' beside the model"),
    ({"modle": {}}, "modle: Extra inputs are not permitted"),
], ids=["an empty object", "a plan whose json is empty", "a key beside the model", "a misspelt model key"])
def test_a_model_file_that_holds_no_model_is_refused_not_planned_as_nothing(tmp_path, content, says):
    """Review 28: `{}` and `{"json": "{}"}` were planned as a model of nothing (`exact`,
    exit 0), and a key beside "model" was ignored."""
    from fuse.controller.pool.request import model_from_request
    from fuse.models.pool import ElasticPlanRequest

    if content == "MODEL+colour":
        content = {"model": json.loads(model_from_request(ElasticPlanRequest(count=3), []).model_dump_json()),
                   "colour": 1}
    (model := tmp_path / "model.json").write_text(json.dumps(content))
    r = CliRunner().invoke(app, ["pool", "plan", "--model", str(model)], env={"FUSE_URL": ""})
    assert r.exit_code == 2, r.output
    assert says in r.output, r.output


@pytest.mark.parametrize("edit", [
    # a group of u32 vCPUs beside a host where CPU only ranks, of 2^53 MiB: 2^85 vCPUs derived
    lambda m: (m["groups"][0].update(cpus=2**32 - 1, mem_mib=1, count=1),
               m["hosts"].append({"name": "own1", "vcpus": 8, "mem_mib": 2**53, "cpu_binds": False})),
    lambda m: m["constraints"].update(cpu_overcommit=1000.0),
], ids=["derived vCPUs past int64", "the largest overcommit"])
def test_an_edited_model_of_figures_within_their_bounds_is_planned_not_a_traceback(tmp_path, edit):
    """Review 28: figures each within the documented bounds overflowed first fit's int64
    arrays (an OverflowError traceback, exit 1): a machine's vCPUs are held at 2^53."""
    from fuse.controller.pool.request import model_from_request
    from fuse.models.pool import ElasticPlanRequest

    data = json.loads(model_from_request(ElasticPlanRequest(count=3), []).model_dump_json())
    edit(data)
    (model := tmp_path / "model.json").write_text(json.dumps(data))
    r = CliRunner().invoke(app, ["pool", "plan", "--model", str(model), "--json"], env={"FUSE_URL": ""})
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["solver"] in ("exact", "exact-incumbent"), r.output


def test_an_overcommit_past_its_bound_names_the_field(tmp_path):
    from fuse.controller.pool.request import model_from_request
    from fuse.models.pool import ElasticPlanRequest

    data = json.loads(model_from_request(ElasticPlanRequest(count=3), []).model_dump_json())
    data["constraints"]["cpu_overcommit"] = 1e300
    (model := tmp_path / "model.json").write_text(json.dumps(data))
    r = CliRunner().invoke(app, ["pool", "plan", "--model", str(model)], env={"FUSE_URL": ""})
    assert r.exit_code == 2, r.output
    assert "constraints.cpu_overcommit: Input should be less than or equal to 1000" in r.output, r.output

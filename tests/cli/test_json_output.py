"""`--json` on every `fuse controller` command that answers a record or a list,
and errors under `--json` as the REST API's error body, one line on stderr
(stdout stays empty; exit codes as without `--json`), against a real
controller and agent (fake backend), or no controller at all."""

from __future__ import annotations

import contextlib
import json

import pytest
import typer
from typer.testing import CliRunner

import fuse
from fuse.cli import fleet
from fuse.cli.main import app
from support import reap, start_agent, start_controller, wait_until


def run(url: str, *args: str, code: int = 0):
    r = CliRunner().invoke(app, list(args), env={"FUSE_URL": url, "FUSE_TOKEN": ""})
    assert r.exit_code == code, f"exit {r.exit_code}: {r.stdout}{r.stderr}{r.exception!r}"
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception  # no traceback
    return r


def json_error(r) -> dict:
    """The error a `--json` command printed: stdout empty, stderr's last line the API's error body."""
    assert r.stdout == "", r.stdout
    return json.loads(r.stderr.splitlines()[-1])["error"]


@pytest.fixture(scope="module")
def ctl(tmp_path_factory):
    """A controller with one connected host, rack1 (room for four VMs)."""
    tmp = tmp_path_factory.mktemp("json-output")
    ctl = start_controller(tmp)
    agent = start_agent(tmp, backend="fake")
    run(ctl.url, "controller", "hosts", "add", "--name", "rack1", "--addr", agent.url, "--agent-token", agent.token,
        "--vm-count", "4")
    with fuse.Client(ctl.url) as c:  # placement waits for the host's first summary
        wait_until(lambda: c.hosts.get("rack1").connected, what="rack1 connected")
    yield ctl
    ctl.stop()
    agent.stop()
    reap(tmp)


# ---- every command that answers a record or a list takes --json ---------------------------------

def test_sleep_wake_console_and_delete_print_the_api_answer_under_json(ctl):
    def as_json(*args):
        return json.loads(run(ctl.url, "controller", "vms", *args, "--json").stdout)

    assert as_json("create", "--entry", "x", "--name", "r1")["state"] == "running"
    # (the fake guest writes its first line a moment after it runs; slept before, it never would: seen
    # once in a loaded full run)
    wait_until(lambda: as_json("console", "r1")["text"].startswith("fake vm: entry x"), what="the guest's first line")
    slept = as_json("sleep", "r1")
    assert (slept["name"], slept["host"], slept["state"]) == ("r1", "rack1", "sleeping") and slept["files"]
    woken = as_json("wake", "r1")
    assert (woken["name"], woken["host"], woken["state"]) == ("r1", "rack1", "running")

    first = as_json("console", "r1")
    assert set(first) == {"text", "offset", "next_offset"} and first["offset"] == 0
    assert first["text"].startswith("fake vm: entry x") and first["next_offset"] == len(first["text"].encode())
    # an answer's next_offset, given as --offset, reads on from there
    assert as_json("console", "r1", "--offset", str(first["next_offset"]))["offset"] == first["next_offset"]

    assert as_json("delete", "r1") == {"name": "r1", "action": "delete", "ok": True}
    assert "r1" not in [v["name"] for v in json.loads(run(ctl.url, "controller", "vms", "--json").stdout)]


@pytest.mark.parametrize("act,state", [("sleep", "sleeping"), ("wake", "running")],
                         ids=["sleep without --json prints a line", "wake without --json prints a line"])
def test_without_json_sleep_and_wake_print_a_line_for_people(ctl, act, state):
    name = f"line-{act}"
    run(ctl.url, "controller", "vms", "create", "--entry", "x", "--name", name)
    if act == "wake":
        run(ctl.url, "controller", "vms", "sleep", name)
    assert run(ctl.url, "controller", "vms", act, name).stdout == f"vm {name} on rack1: {state}\n"
    assert run(ctl.url, "controller", "vms", "delete", name).stdout == f"vm {name} deleted\n"


class OutOfPages(Exception):
    pass


class ConsoleStandIn:
    """`vms.console` answers `pages` in turn, then raises OutOfPages (which ends a follow)."""

    def __init__(self, pages):
        self.pages, self.asked = list(pages), []
        self.vms = self

    def console(self, name, offset, host):
        self.asked.append(offset)
        if not self.pages:
            raise OutOfPages
        return self.pages.pop(0)

    def get(self, name, host):  # (a follow asks whether the run is over when a read finds nothing new)
        return {"state": "running"}


def test_console_follow_under_json_is_one_object_a_line_for_each_new_piece_of_text(monkeypatch, capsys):
    pages = [{"text": "a\n", "offset": 0, "next_offset": 2}, {"text": "", "offset": 2, "next_offset": 2},
             {"text": "b\n", "offset": 2, "next_offset": 4}]
    client = ConsoleStandIn(pages)
    monkeypatch.setattr(fleet, "_client", lambda: contextlib.nullcontext(client))
    monkeypatch.setattr(fleet.time, "sleep", lambda s: None)
    with pytest.raises(OutOfPages):
        fleet.vms_console("r1", host=None, follow=True, offset=0, json_=True)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert lines == [pages[0], pages[2]] and client.asked == [0, 2, 2, 4]  # a quiet poll prints nothing


def _controller_commands():
    """(path, args) for every `fuse controller` command that takes --json, with a value
    for each required argument and option (`serve` runs a server and takes none)."""
    group = typer.main.get_command(app).commands["controller"]

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            if getattr(cmd, "invoke_without_command", False) and any("--json" in p.opts for p in cmd.params):
                yield path, []
            for name, sub in cmd.commands.items():
                yield from walk(sub, path + [name])
        elif any("--json" in p.opts for p in cmd.params):
            yield path, [a for p in cmd.params if p.required
                         for a in ([p.opts[0], "x"] if p.param_type_name == "option" else ["x"])]

    return sorted(walk(group, ["controller"]))


def test_every_controller_command_but_serve_takes_json():
    every = {" ".join(path) for path, _ in _controller_commands()}
    group = typer.main.get_command(app).commands["controller"]
    assert {f"controller vms {n}" for n in group.commands["vms"].commands} | {"controller vms"} <= every
    assert {f"controller hosts {n}" for n in group.commands["hosts"].commands} <= every
    assert {"controller events", "controller usage", "controller move", "controller moves"} <= every


# ---- errors under --json --------------------------------------------------------------------------

@pytest.mark.parametrize("path,args", [pytest.param(path, args, id=" ".join(["fuse", *path]))
                                       for path, args in _controller_commands()])
def test_under_json_every_controller_command_prints_an_unreachable_controller_as_json(tmp_path, path, args):
    # (events tries again for --reconnect-s, 30 s by default, before it answers: test_events_follow)
    again = ["--reconnect-s", "1"] if path[-1] == "events" else []
    r = run(f"unix://{tmp_path}/nothing.sock", *path, *args, *again, "--json", code=1)
    err = json_error(r)
    assert err["code"] == "unreachable" and "nothing.sock" in err["message"]


def test_under_json_an_api_error_is_the_api_error_body_on_stderr(ctl):
    r = run(ctl.url, "controller", "hosts", "get", "nope", "--json", code=1)
    assert json_error(r) == {"code": "not_found", "message": "host nope not found"}
    # for people it stays a line
    r = run(ctl.url, "controller", "hosts", "get", "nope", code=1)
    assert (r.stdout, r.stderr) == ("", "error: not_found: host nope not found\n")


def test_under_json_an_error_keeps_its_details_where_the_api_puts_them(ctl):
    r = run(ctl.url, "controller", "vms", "create", "--entry", "x", "--mem-mib", "999999", "--json", code=1)
    err = json_error(r)
    assert err["code"] == "fleet_full" and "rack1" in err["hosts"] and err["details"] == {"hosts": err["hosts"]}


@pytest.mark.parametrize("args,code", [
    (["vms", "sleep", "nope"], "not_found"),
    (["vms", "wake", "nope"], "not_found"),
    (["vms", "console", "nope"], "not_found"),
    (["vms", "delete", "nope"], "not_found"),
    (["hosts", "remove", "nope"], "not_found"),
    (["move", "nope"], "not_movable"),
], ids=["sleeping no such vm", "waking no such vm", "the console of no such vm", "deleting no such vm",
        "removing no such host", "moving no such vm"])
def test_under_json_a_refusal_is_its_code_and_message_with_exit_1(ctl, args, code):
    err = json_error(run(ctl.url, "controller", *args, "--json", code=1))
    assert err["code"] == code and "nope" in err["message"]


@pytest.mark.parametrize("flags", [["--labels", "zone"], ["--mig-profiles", "1g.10gb=four"]],
                         ids=["a label without =", "a MIG count that is not a number"])
def test_under_json_a_bad_flag_is_invalid_argument_with_exit_2(tmp_path, flags):
    r = run(f"unix://{tmp_path}/nothing.sock", "controller", "hosts", "add", "--name", "h", "--addr", "local",
            *flags, "--json", code=2)
    assert json_error(r)["code"] == "invalid_argument"


def test_under_json_a_malformed_controller_url_is_invalid_argument():
    # (a bad flag, refused before anything is asked: exit 2, as under `fuse pool`; it was 1)
    err = json_error(run("ftp://nowhere", "controller", "hosts", "list", "--json", code=2))
    assert err["code"] == "invalid_argument" and "ftp://nowhere" in err["message"]


@pytest.mark.parametrize("url, says", [
    ("http://127.0.0.1:abc", "Invalid port: 'abc'"),
    ("http://999.1.1.1:80", "Invalid IPv4 address"),
    ("http://127.0.0.1:99999", "has port 99999: a port is 1-65535"),
    ("http://:8080", "names no host"),
    ("unix://", "names no socket"),
], ids=["a port that is no number", "an IPv4 address that is none", "a port past 65535", "no host", "no socket"])
@pytest.mark.parametrize("group", [["controller", "hosts", "list"], ["pool", "budget"]], ids=["controller", "pool"])
def test_a_controller_url_that_cannot_be_one_is_refused_as_a_bad_flag(url, says, group):
    # (a README audit: a traceback and exit 1 for the first two, a dial and "unreachable"
    # for the others; it is refused before anything is asked, exit 2, in one line)
    r = run(url, *group, code=2)
    assert "Traceback" not in r.stderr and says in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr

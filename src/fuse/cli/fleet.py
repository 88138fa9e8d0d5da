"""`fuse controller vms|events|usage|move|moves`."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from typing import Optional

import typer

from ..client import ApiError
from ..client.events import RECONNECT_S
from .output import api_errors, emit_json, fail, local_time, table

vms_app = typer.Typer(help="VMs placed by the controller (no sub-command: list them).")


def _client():
    from .controller import client
    return client()


VM_COLUMNS = ["name", "host", "state", "vcpus", "mem MiB", "exit status", "reason", "entry"]
FINISHED = ("exited", "failed")  # the VM's run is over: its console is final
POLL_S = 0.5  # following a console, between two reads that found nothing new


def _vm_rows(vms):
    """One row per VM; a finished one shows how its run ended (exit status or, failed, why)."""
    for v in vms:
        shape = v.get("shape", {})
        yield (v["name"], v.get("host", ""), v.get("state", ""), shape.get("vcpus", ""), shape.get("mem_mib", ""),
               v.get("exit_status"), v.get("reason"), (v.get("entry") or "")[:40])


@vms_app.callback(invoke_without_command=True)
def vms_main(ctx: typer.Context, json_: bool = typer.Option(False, "--json", help=(
                 "Print JSON (before a sub-command: its --json).")),
             host: Optional[str] = typer.Option(None, help=(
                 "Only this host's VMs (listing); before a sub-command, its --host."))) -> None:
    if ctx.invoked_subcommand is None:
        with api_errors(json_), _client() as c:
            vms = c.vms.list(host)
        emit_json(vms) if json_ else table(VM_COLUMNS, _vm_rows(vms))
        return
    # (`vms --host h2 delete v5` deleted v5 wherever it was: the group's flags went unread)
    sub = ctx.command.get_command(ctx, ctx.invoked_subcommand)
    takes = {p.name for p in sub.params} if sub is not None else set()
    for flag, name, value in (("--host", "host", host), ("--json", "json_", json_)):
        if value not in (None, False) and name not in takes:
            fail("invalid_argument", f"{flag} before `{ctx.invoked_subcommand}`: `vms {ctx.invoked_subcommand}` "
                 f"takes no {flag}", json_=json_, exit_code=2)


def _group_flags(ctx: Optional[typer.Context], host: Optional[str], json_: bool) -> tuple[Optional[str], bool]:
    """A `vms` sub-command's --host and --json with the group's (`vms --host h2 delete v5`)
    applied: the group's where the sub-command's own is not given; two different hosts
    are exit 2, naming both. (``ctx`` None: called as a function, no group.)"""
    group = ctx.parent.params if ctx is not None and ctx.parent is not None else {}
    json_ = json_ or bool(group.get("json_"))
    given = group.get("host")
    if given is not None and host is not None and given != host:
        fail("invalid_argument", f"--host {given!r} before the sub-command and --host {host!r} after it name "
             "different hosts: give one", json_=json_, exit_code=2)
    return (host if host is not None else given), json_


@vms_app.command("create")
def vms_create(
    vcpus: int = typer.Option(1), mem_mib: int = typer.Option(256), entry: str = typer.Option(...),
    name: Optional[str] = typer.Option(None), host: Optional[str] = typer.Option(None, help="Pin to this host."),
    bundle: str = typer.Option("linux"), json_: bool = typer.Option(False, "--json"),
    on: Optional[str] = typer.Option(None, "--on", help=(
        "auto (default: any host, a prewarmed VM first; with the budget's autoscale on, a machine the elastic "
        "pool buys) | local (your own hosts) | <linked cloud> | host:<machine>.")),
    ctx: typer.Context = None,
) -> None:
    """Place a VM on the best host."""
    host, json_ = _group_flags(ctx, host, json_)
    body = {"shape": {"vcpus": vcpus, "mem_mib": mem_mib}, "entry": entry, "bundle": bundle}
    # given, even empty, they go as given: the controller refuses an empty one, which names nothing
    # (an empty --host or --name was dropped, the VM placed anywhere under a name of its own)
    for key, value in (("name", name), ("host", host), ("on", on)):
        if value is not None:
            body[key] = value
    with api_errors(json_), _client() as c:
        vm = c.vms.create(body)
    emit_json(vm) if json_ else table(VM_COLUMNS, _vm_rows([vm]))


@vms_app.command("get")
def vms_get(name: str, host: Optional[str] = None,
            json_: bool = typer.Option(False, "--json"), ctx: typer.Context = None) -> None:
    """One VM: where it runs, its state and shape."""
    host, json_ = _group_flags(ctx, host, json_)
    with api_errors(json_), _client() as c:
        vm = c.vms.get(name, host)
    emit_json(vm) if json_ else table(VM_COLUMNS, _vm_rows([vm]))


@vms_app.command("delete")
def vms_delete(name: str, host: Optional[str] = None,
               json_: bool = typer.Option(False, "--json", help=(
        'Print {"name", "action": "delete", "ok": true}: the API answers 204, no body '
        '(as `hosts remove --json` prints {"id", "action", "ok"}).')), ctx: typer.Context = None) -> None:
    """Stop and remove a VM."""
    host, json_ = _group_flags(ctx, host, json_)
    with api_errors(json_), _client() as c:
        c.vms.delete(name, host)
    if json_:
        emit_json({"name": name, "action": "delete", "ok": True})
    else:
        typer.echo(f"vm {name} deleted")


@vms_app.command("console")
def vms_console(name: str, host: Optional[str] = None,
                follow: bool = typer.Option(False, "--follow", "-f", help=(
                    "Keep printing what the VM writes; ends once its run is over (exited or failed) and "
                    "all it wrote is printed, or when it is deleted.")),
                offset: int = typer.Option(0, help="Start at this byte of the serial log (a `next_offset`)."),
                json_: bool = typer.Option(False, "--json", help=(
                    'Print {"text", "offset", "next_offset"}: from --offset to the end of the log; with --follow, '
                    'the API\'s answers, one object per line for each new piece of text.')),
                ctx: typer.Context = None) -> None:
    """The VM's serial console, all of it. Pass an answer's next_offset as --offset to read on from there."""
    host, json_ = _group_flags(ctx, host, json_)
    with api_errors(json_), _client() as c:
        try:
            if follow:
                _follow(c, name, offset, host, json_)
            elif json_:
                pages = list(_to_end(c, name, offset, host))
                emit_json({"text": "".join(p.get("text", "") for p in pages), "offset": pages[0]["offset"],
                           "next_offset": pages[-1]["next_offset"]})
            else:
                for page in _to_end(c, name, offset, host):
                    typer.echo(page.get("text", ""), nl=False)
        except BrokenPipeError:  # (`console v1 -f | head -2`: was an io_error line, exit 1)
            _reader_left()


def _reader_left() -> None:
    """The reader (`| head`) has what it wanted: stop quietly, exit 0, not an io_error.
    stdout goes to /dev/null first, or Python's flush at exit fails on the pipe again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def _to_end(c, name: str, offset: int, host: Optional[str]):
    """The console's answers from ``offset`` to the log's end as it is now: the API answers
    a page (64 KiB) at a time, so read on until ``next_offset`` stops moving."""
    while True:
        page = c.vms.console(name, offset, host)
        yield page
        if page.get("next_offset", offset) <= offset:
            return
        offset = page["next_offset"]


def _follow(c, name: str, offset: int, host: Optional[str], json_: bool) -> None:
    """Print the console as it grows until the VM's run is over (its state, asked each time
    a read finds nothing new: a finished VM writes no more, so one more read to the end
    gets all of it) or the VM is deleted."""
    def show(page: dict) -> None:
        if not json_:
            typer.echo(page.get("text", ""), nl=False)
        elif page.get("text"):  # JSON Lines, as `events --json` prints: nothing for a quiet poll
            typer.echo(json.dumps(page, sort_keys=True))

    first = c.vms.console(name, offset, host)  # (a VM that is not there: the error, as without --follow)
    show(first)
    offset = first.get("next_offset", offset)
    try:
        while True:
            for page in _to_end(c, name, offset, host):
                show(page)
                offset = page.get("next_offset", offset)
            if c.vms.get(name, host).get("state") in FINISHED:
                for page in _to_end(c, name, offset, host):
                    show(page)
                return
            time.sleep(POLL_S)
    except ApiError as err:
        if err.code != "not_found":
            raise
        gone = f"is no longer on host {host} (deleted or moved)" if host else "was deleted"
        typer.echo(f"vm {name} {gone}: its console ends here", err=True)


for _act in ("sleep", "wake"):
    def _make(act: str):
        def run(name: str, host: Optional[str] = None, json_: bool = typer.Option(
                False, "--json", help="Print the VM record the API answers."), ctx: typer.Context = None) -> None:
            host, json_ = _group_flags(ctx, host, json_)
            with api_errors(json_), _client() as c:
                vm = getattr(c.vms, act)(name, host)
            if json_:
                emit_json(vm)
            else:
                typer.echo(f"vm {name} on {vm.get('host')}: {vm.get('state')}")
        run.__doc__ = {"sleep": "Write the VM's state to files and free its memory.",
                       "wake": "Carry on from where the VM slept."}[act]
        return run
    vms_app.command(_act)(_make(_act))


def events(since: int = typer.Option(0), follow: bool = typer.Option(True, help="Keep following the stream."),
           json_: bool = typer.Option(False, "--json"), wait_s: float = typer.Option(30),
           reconnect_s: float = typer.Option(RECONNECT_S, help=(
               "Following, keep trying a controller that does not answer (restarted, say) this many seconds "
               "in a row, from the last cursor, before giving up."))) -> None:
    """The merged event stream (follows by default; Ctrl-C stops). Following is
    `client.events.follow`: across a controller restart it tries again from the last
    cursor for `--reconnect-s` seconds, so no event is printed twice or skipped (issue 4)."""
    if not math.isfinite(wait_s) or wait_s < 0:  # (refused whether or not it is sent: not following, it is not)
        raise typer.BadParameter("must be a number of seconds, 0 or more", param_hint="'--wait-s'")
    if not math.isfinite(reconnect_s) or reconnect_s < 0:  # (nan retried a dead controller for good)
        raise typer.BadParameter("must be a number of seconds, 0 or more", param_hint="'--reconnect-s'")
    with api_errors(json_), _client() as c:
        stream = c.events.follow(since, wait_s, reconnect_s=reconnect_s) if follow else _caught_up(c, since)
        try:
            for e in stream:
                if json_:
                    typer.echo(json.dumps(e, sort_keys=True))
                else:
                    rest = {k: v for k, v in e.items() if k not in ("id", "time", "type", "host", "host_event_id")}
                    stamp = local_time(e["time"])  # (with its date and zone: a listing may span days)
                    typer.echo(f"{e['id']:>6} {stamp} {e['host'] or '-':<14} {e['type']:<18} "
                               f"{json.dumps(rest, sort_keys=True)}")
        except BrokenPipeError:
            _reader_left()


def _caught_up(c, since: int):
    """Every event after ``since`` stored now, page by page (a page holds at most 500)."""
    while True:
        page = c.events.list(since, 0, 500)
        yield from page["events"]
        if len(page["events"]) < 500:
            return
        since = page.get("next_cursor", page.get("next"))  # (`next` alone from an older controller)


def usage(from_: Optional[str] = typer.Option(None, "--from", help="Unix seconds or ISO time."),
          to: Optional[str] = typer.Option(None), json_: bool = typer.Option(False, "--json")) -> None:
    """Metering summed across the fleet."""
    with api_errors(json_), _client() as c:
        u = c.usage(from_, to)
    if json_:
        emit_json(u)
        return
    # created_at tells apart two VMs that used one name in the window (two rows)
    cols = ["host", "vm", "created_at", "cpu_seconds", "mem_mib_seconds", "wall_seconds", "state_bytes_written"]
    rows = [[r.get(k) or "" for k in cols[:3]] + [r.get(k, "") for k in cols[3:]] for r in u["vms"]]
    rows.append(["TOTAL", "", ""] + [u["totals"].get(k, "") for k in cols[3:]])
    table(cols, rows, title="usage")
    reasons = u.get("unreachable_reasons") or {}
    for h in u["unreachable"]:
        typer.echo(f"unreachable: {h}: {reasons.get(h, 'no answer')}")


def mount(app: typer.Typer) -> None:
    app.add_typer(vms_app, name="vms")
    app.command("events")(events)
    app.command("usage")(usage)
    from .moves import mount as mount_moves
    mount_moves(app)

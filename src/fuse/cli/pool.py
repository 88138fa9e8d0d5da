"""``fuse pool ...``: the elastic pool — plans, linked clouds, the hosts it buys,
the budget, scale-in and prewarm.

Every command talks to a controller through the SDK (``fuse.Client``):
``--url``/``FUSE_URL`` and ``--token``/``FUSE_TOKEN``, by default the
controller's own socket. ``plan`` alone can also answer without one: when no
``--url`` is given and no controller listens on the default socket, it says so
on stderr and plans offline against the shipped catalogue and an empty pool.
``--model FILE.json`` re-solves an edited model offline: the ``json`` field of
an earlier plan, a whole plan saved with ``--json``, or a bare model; it takes
no request flags (they would be ignored). ``--apply`` buys the machines the
plan adds, so it needs a controller. A table for people; ``--json`` prints what the SDK
call returns, for programs. Errors print ``error: <code>: <message>`` (under
``--json`` the API's error body) with the exit statuses of ``fuse controller``:
2 for what the command refuses before it asks (a bad flag, a ``--model`` file
it cannot use), 1 for an answer of the controller's (``invalid_argument``,
``not_found``, ``conflict``, ``unauthorized``...) or no answer (``unreachable``);
a command whose answer is "partly no" (``remove-host`` with failures,
``unprewarm`` of no such prewarm) exits 1 too.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from fuse.controller.pool.model import PlanModel
from fuse.controller.pool.providers import options_help
from fuse.controller.pool.request import model_from_request
from fuse.errors import FuseError, InvalidArgument
from fuse.models.pool import (ElasticBudget, ElasticBudgetUpdate, ElasticHost, ElasticPlan, ElasticPlanRequest,
                              Prewarm, PrewarmOptions)

from .output import emit_json, fail, local_time, table

app = typer.Typer(help="The elastic pool: plans, linked clouds, cloud hosts, budget, scale-in and prewarm.",
                  no_args_is_help=True)
cloud_app = typer.Typer(help="The clouds the pool buys machines in.", no_args_is_help=True)
app.add_typer(cloud_app, name="cloud")


# ``fuse pool --url X hosts`` as ``fuse controller --url X ...`` takes it (a subcommand's own wins)
_group: dict[str, Optional[str]] = {"url": None, "token": None}


@app.callback()
def _pool(
    url: Optional[str] = typer.Option(None, "--url", help="Controller: unix:///path or http(s)://host:port "
                                                          "(also after the subcommand; default: its socket)."),
    token: Optional[str] = typer.Option(None, "--token", help="Controller token (TCP)."),
) -> None:
    """The elastic pool: plans, linked clouds, cloud hosts, budget, scale-in and prewarm."""
    # (a callback also keeps ``plan`` a subcommand even if it were the only one)
    _group.update(url=url, token=token)


# ---- talking to a controller ------------------------------------------------

# (no envvar on the subcommands' own flags: filled from $FUSE_URL they won over a `fuse pool
# --url X` given before the subcommand, and an exported production url took a staging one's
# purchase. $FUSE_URL and $FUSE_TOKEN come last, through the client, as for `fuse controller`)
def _url_option(help: str = "Controller: unix:///path or http(s)://host:port (default: $FUSE_URL, else its "
                            "socket).") -> Any:
    return typer.Option(None, "--url", help=help)


def _token_option() -> Any:
    return typer.Option(None, "--token", help="Controller token (TCP; default: $FUSE_TOKEN).")


def _fail(code: str, message: str, details: dict | None = None, json_: bool = False) -> None:
    """End with exit 2, a usage error (a flag refused before the controller is asked):
    ``error: CODE: MESSAGE`` on stderr, or under ``--json`` the API's error body on one
    line (``output.fail``)."""
    fail(code, message, details, json_=json_, exit_code=2)


class _NoController(Exception):
    """Nothing listens on the socket: the request was never sent (``reason`` says why)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _never_sent(e: Exception) -> str | None:
    """Why a request got no answer when no controller listens (no socket file, or
    nothing accepting on it: the request never left); None for any other failure."""
    cause: BaseException | None = e
    while cause is not None:
        if isinstance(cause, FileNotFoundError):
            return "no such socket"
        if isinstance(cause, ConnectionRefusedError):
            return "nothing accepts on it"
        cause = cause.__cause__ or cause.__context__
    return None


@contextlib.contextmanager
def _controller(url: str | None, token: str | None, json_: bool = False, offline_ok: bool = False) -> Iterator[Any]:
    """A ``fuse.Client``; an API error (or no controller) ends the command with exit 1, as
    ``output.api_errors`` ends ``fuse controller``'s; a malformed ``--url`` is a usage
    error, exit 2. ``offline_ok``: no controller listening raises ``_NoController`` instead."""
    from fuse.client import ApiError, Client
    url, token = url or _group["url"], token or _group["token"]
    try:
        client = Client(url or None, token)
    except ValueError as e:  # a malformed --url or --token: the SDK's message says which (as `fuse controller`'s)
        _fail("invalid_argument", str(e), json_=json_)
    try:
        with client:
            yield client
    except ApiError as e:  # "unreachable" (status 0) when no controller answered
        why = _never_sent(e) if offline_ok and e.status == 0 else None
        if why is not None:
            raise _NoController(why) from e
        fail(e.code or str(e.status), e.message, e.details, json_=json_, exit_code=1)


def _valid(cls: type[BaseModel], **fields: Any) -> Any:
    """``cls(**fields)``, or ``invalid_argument`` naming the first bad flag (no traceback)."""
    try:
        return cls(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        flag = "--" + where.replace("_", "-") if where else "request"
        raise InvalidArgument(f"{flag}: {first['msg']}") from None


def _show(items: list, as_json: bool, render: Callable[[list], None], empty: str) -> None:
    """A list for programs (``--json``), a table for people, or a line saying there is none."""
    if as_json:
        emit_json(items)
    elif items:
        render(items)
    else:
        typer.echo(empty)


def _when(t: int | float) -> str:
    return local_time(t, seconds=False) if t else "-"  # (to the minute: a table's width)


# ---- plan ---------------------------------------------------------------------

# What a plan's json holds beside its model: what the plan saw, not the model's input, so a
# re-solve reads none of it (``plan``: the answer; ``joining``/``late``: the machines it used
# that were still booting, host -> seconds, which the model, having no clock, has as running)
BESIDE_MODEL = frozenset({"plan", "joining", "late"})


def _json(text: str, what: str) -> Any:
    """``json.loads(text)``; JSON nested deeper than Python's parser goes (RecursionError, which
    is no ValueError: a traceback, review 33) is ``invalid_argument`` naming ``what``."""
    try:
        return json.loads(text)
    except RecursionError:
        raise InvalidArgument(f"{what} is JSON nested too deeply to read") from None


def load_model(path: Path) -> PlanModel:
    """A model from FILE.json: a plan's ``json`` field ({"model", "plan"}, with ``joining`` and
    ``late`` when it used machines still booting), a whole plan, or a bare model."""
    data = _json(path.read_text(), f"{path}: holds no plan model: it")
    if isinstance(data, dict) and isinstance(data.get("json"), str) and data["json"]:
        data = _json(data["json"], f"{path}: holds no plan model: its json field")  # a whole ElasticPlan (--json)
        if not (isinstance(data, dict) and "model" in data):
            raise InvalidArgument(f"{path}: its json field holds no model (a plan's json is {{\"model\", \"plan\"}})")
    if isinstance(data, dict) and "model" in data:
        # (a misspelt key beside the model: refused, not ignored)
        if extra := sorted(set(data) - {"model"} - BESIDE_MODEL):
            raise InvalidArgument(f"{path}: unknown field {', '.join(map(repr, extra))} beside the model "
                                  "(a plan's json field holds model and plan, and joining and late when it "
                                  "used machines still booting)")
        data = data["model"]
    # ({} or a model whose groups were dropped would plan nothing, proven: an edit gone wrong)
    if isinstance(data, dict) and "groups" not in data and set(data) <= set(PlanModel.model_fields):
        raise InvalidArgument(f"{path}: holds no plan model: a model has groups (a plan's json field, a whole "
                              "plan saved with --json, or a bare model)")
    return PlanModel.model_validate(data, strict=True)  # ("2" is no count: an edit to name, not to guess)


def render(plan: ElasticPlan, console: Console) -> None:
    table_ = Table(title=f"plan ({plan.solver})")
    for col in ("group", "where", "VMs"):
        table_.add_column(col)
    for a in plan.assignments:
        where = a.host if a.host else f"new #{a.new_index} {plan.new_hosts[a.new_index].type_name}"
        table_.add_row(escape(a.group), escape(where), str(a.count))
    for u in plan.unplaced:  # (names and reasons as written: text, not rich's markup)
        table_.add_row(escape(u.group), f"[red]unplaced[/red]: {escape(u.reason)}", str(u.count))
    console.print(table_)
    console.print(f"new machines: {len(plan.new_hosts)}  added ${plan.added_usd_per_hour:.4f}/h  "
                  f"projected ${plan.projected_usd:.4f}  lower bound ${plan.lower_bound_usd:.4f}  "
                  f"ready in {plan.ready_in_secs} s")
    for line in plan.explain:
        console.print(f"  {escape(line)}", highlight=False)


REQUEST_FLAGS = {  # option -> parameter: what ``--model`` cannot take (the model holds it already)
    "--count": "count", "--image": "image", "--kind": "kind", "--cpus": "cpus", "--memory-mb": "memory_mb",
    "--duration-secs": "duration_secs", "--caller": "caller", "--together": "together", "--provider": "provider",
    "--region": "region", "--instance-type": "instance_type", "--hosts": "hosts", "--no-scale": "no_scale",
    "--devices-only": "devices_only", "--max-usd-per-hour": "max_usd_per_hour",
}


def _request(**fields) -> ElasticPlanRequest:
    """The request, or ``invalid_argument`` naming the first bad flag (no traceback)."""
    return _valid(ElasticPlanRequest, **fields)


@app.command("plan")
def plan_cmd(
    count: Optional[int] = typer.Option(None, help="How many VMs (default 1)."),
    image: Optional[str] = typer.Option(None, help="Image (default linux)."),
    kind: Optional[str] = typer.Option(None, help="container, vm or microvm (default: from the image)."),
    cpus: Optional[int] = typer.Option(None, help=(
        "vCPUs each (default: learned from earlier VMs of the image through a controller; else 1).")),
    memory_mb: Optional[int] = typer.Option(None, "--memory-mb", help=(
        "MiB each (default: learned from earlier VMs of the image through a controller; else 1024).")),
    duration_secs: Optional[int] = typer.Option(None, "--duration-secs", help=(
        "Expected lifetime, seconds (default by --caller: interactive 3600, batch 14400, compat 3600, "
        "persistent_agent 86400; none 3600).")),
    caller: Optional[str] = typer.Option(None, help=(
        "interactive, batch, compat or persistent_agent: sets the default --duration-secs (default none: 3600 s).")),
    together: bool = typer.Option(False, "--together", help="Keep them on one machine."),
    provider: Optional[str] = typer.Option(None, help="Only this cloud."),
    region: Optional[str] = typer.Option(None, help="Only this region."),
    instance_type: Optional[str] = typer.Option(None, "--instance-type", help="Only this machine type."),
    hosts: Optional[int] = typer.Option(None, "--hosts", help="Exactly this many new machines."),
    no_scale: bool = typer.Option(False, "--no-scale", help="Add no machines."),
    devices_only: bool = typer.Option(False, "--devices-only", help="Only your own devices."),
    max_usd_per_hour: Optional[float] = typer.Option(None, "--max-usd-per-hour", help="A $/hour cap."),
    apply: bool = typer.Option(False, "--apply", help=(
        "Buy the machines the plan adds in the linked clouds (through a controller only); "
        "then create the VMs with --on auto.")),
    model: Optional[Path] = typer.Option(None, "--model", exists=True, dir_okay=False, help=(
        "Re-solve an edited model (a plan's json field, or a whole plan saved with --json); "
        "takes no request flags: edit the file instead.")),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", help="Solver seconds (offline only)."),
    url: Optional[str] = _url_option("Controller: unix:///path or http(s)://host:port (default: $FUSE_URL, else "
                                     "its socket; offline when no controller listens there)."),
    token: Optional[str] = _token_option(),
    as_json: bool = typer.Option(False, "--json", help="Print the ElasticPlan as JSON."),
) -> None:
    """What the elastic pool would do for some VMs: where each goes and what it costs (--apply: do it)."""
    given = dict(count=count, image=image, kind=kind, cpus=cpus, memory_mb=memory_mb, duration_secs=duration_secs,
                 caller=caller, together=together or None, provider=provider, region=region,
                 instance_type=instance_type, hosts=hosts, no_scale=no_scale or None,
                 devices_only=devices_only or None, max_usd_per_hour=max_usd_per_hour)
    try:
        if time_limit is not None and not (math.isfinite(time_limit) and time_limit > 0):
            # (NaN and infinity too: an infinite limit was planned with, and written into the plan's
            # json as Infinity, which is no JSON and which --model then refused)
            raise InvalidArgument(f"--time-limit must be seconds above 0 (a finite number), not {time_limit}")
        if apply and model is not None:
            raise InvalidArgument("--apply buys machines in the linked clouds, so it needs a controller and the "
                                  "request flags, not --model; an offline plan only shows what it would do")
        if model is not None:
            flags = [flag for flag, name in REQUEST_FLAGS.items() if given[name] is not None]
            if flags:
                raise InvalidArgument(f"--model re-solves the model in the file as it is, so {', '.join(flags)} "
                                      "would be ignored: edit the model instead (its groups and constraints)")
            m = load_model(model)
            if time_limit is not None:  # (validated: model_copy checks nothing)
                m = PlanModel.model_validate({**m.model_dump(), "time_limit_secs": time_limit})
            result = solve_plan(m)
        else:
            req = _request(**given, apply=apply or None)
            result = _controller_plan(url, token, req, as_json)
            if result is None:  # no controller on the default socket: what if, offline
                kw = {} if time_limit is None else {"time_limit_secs": time_limit}
                result = solve_plan(model_from_request(_request(**given), [], **kw))
            elif time_limit is not None:  # (a request carries no limit: the controller's own was used)
                typer.echo("note: --time-limit is for offline plans: the controller planned with its own limit",
                           err=True)
    except FuseError as e:
        _fail(e.code, e.message, json_=as_json)
    except ValidationError as e:  # a --model file that is not a model, or a --time-limit no model takes
        where = ".".join(map(str, e.errors()[0]["loc"]))
        if where == "time_limit_secs" and time_limit is not None:  # (without --model: "None: not a plan model")
            _fail("invalid_argument", f"--time-limit: {e.errors()[0]['msg']}", json_=as_json)
        what = f"{model}: not a plan model" if model is not None else "the flags make no plan model"
        _fail("invalid_argument", f"{what}: {where + ': ' if where else ''}{e.errors()[0]['msg']}", json_=as_json)
    except (ValueError, OSError) as e:  # the --model file: not JSON, or unreadable
        # (named only when there is one: "None: ..." was said of a bad setting, review 33)
        _fail("invalid_argument" if isinstance(e, ValueError) else "io_error",
              f"{model}: {e}" if model is not None else str(e), json_=as_json)
    if as_json:
        emit_json(result.model_dump(mode="json"))  # (keys sorted, as every other --json)
        return
    render(result, Console())
    if result.added:
        _host_table(result.added, title="added")


def _controller_plan(url: str | None, token: str | None, req: ElasticPlanRequest,
                     as_json: bool) -> ElasticPlan | None:
    """The controller's plan: at ``--url``/``FUSE_URL``, else on its default socket, as every
    other command. None (said on stderr) when no URL was given and no controller listens on
    the default socket: the request never left, so an offline plan answers instead; but an
    ``apply`` needs the controller. A controller that answers, even with an error, is the answer."""
    from fuse.controller.service import default_controller_socket

    try:
        with _controller(url, token, as_json, offline_ok=not (url or _group["url"] or os.environ.get("FUSE_URL"))) as c:
            if req.apply and not as_json:  # (said once a controller answers: review 34)
                c.health()
                typer.echo("applying: the controller buys the machines the plan adds...", err=True)
            return c.pool.cloud_plan(req)
    except _NoController as e:
        sock = default_controller_socket()
        if req.apply:
            _fail("invalid_argument", f"--apply buys machines in the linked clouds, so it needs a controller, and "
                                      f"none listens at unix://{sock} ({e.reason}): give --url or FUSE_URL; "
                                      "an offline plan only shows what it would do", json_=as_json)
        typer.echo(f"no controller at {sock}: planning offline against the shipped catalogue", err=True)
        return None


def _plan(model: PlanModel) -> ElasticPlan:
    """The planner, imported on first use: it loads numpy and the solvers, which no other command needs."""
    from fuse.controller.pool.planner import plan
    return plan(model)


def solve_plan(model: PlanModel) -> ElasticPlan:
    """The planner, offline, with file descriptor 1 on stderr while it runs: the solvers'
    C++ code may print a debug line on stdout, where ``--json`` writes the answer."""
    from fuse.controller.pool.highs import stdout_to_stderr  # (HiGHS: only when a plan is solved here)

    with stdout_to_stderr():
        return _plan(model)


# ---- elastic hosts --------------------------------------------------------------

HOST_COLUMNS = ["name", "cloud", "type", "region", "state", "cloud id", "$/hour", "started", "ends", "by hand"]


def _host_table(hosts: list[ElasticHost], title: str | None = None) -> None:
    table(HOST_COLUMNS, ((h.name, h.provider, h.type_name, h.region, h.state, h.id or "-", f"{h.usd_per_hour:.4f}",
                          _when(h.started), _when(h.expires), "yes" if h.pinned else "no") for h in hosts),
          title=title)


@app.command("hosts")
def hosts_cmd(
    all_: bool = typer.Option(False, "--all", help="Also the hosts already gone."),
    url: Optional[str] = _url_option(), token: Optional[str] = _token_option(),
    as_json: bool = typer.Option(False, "--json", help="Print the ElasticHost records as JSON."),
) -> None:
    """The hosts the pool added in the linked clouds, with their state and cost."""
    with _controller(url, token, as_json) as c:
        _show(c.pool.cloud_hosts(include_gone=all_), as_json, _host_table,
              "no elastic hosts (fuse pool add-host adds one; autoscale and plan --apply buy them too)")


@app.command("add-host")
def add_host_cmd(
    provider: str = typer.Option(..., "--provider", help="The linked cloud (fuse pool cloud list)."),
    instance_type: str = typer.Option(..., "--instance-type", help="One of the cloud's machine types."),
    region: Optional[str] = typer.Option(None, "--region", help="Region (default: the type's first)."),
    count: Optional[int] = typer.Option(None, "--count", help="How many, 1 to 20 (default 1)."),
    ttl_hours: Optional[int] = typer.Option(None, "--ttl-hours", help="Hours until each ends on its own (default 24)."),
    url: Optional[str] = _url_option(), token: Optional[str] = _token_option(),
    as_json: bool = typer.Option(False, "--json", help="Print the ElasticHost records as JSON."),
) -> None:
    """Buy hosts by hand: the scaler never removes them; each ends at its TTL.

    They join the fleet as they boot: watch fuse pool hosts."""
    with _controller(url, token, as_json) as c:
        hosts = c.pool.cloud_add_host(provider, instance_type, region, count, ttl_hours)
    emit_json(hosts) if as_json else _host_table(hosts, title="added")


@app.command("remove-host")
def remove_host_cmd(
    names: list[str] = typer.Argument(..., help="Elastic host names (fuse pool hosts)."),
    url: Optional[str] = _url_option(), token: Optional[str] = _token_option(),
    as_json: bool = typer.Option(False, "--json", help="Print the ElasticRemoved record as JSON."),
) -> None:
    """Terminate hosts the pool added; exit 1 if any was refused.

    A host with VMs is refused: drain it first (fuse controller hosts drain)."""
    with _controller(url, token, as_json) as c:
        out = c.pool.cloud_remove_host(names)
    if as_json:
        emit_json(out)
    else:
        for name in out.removed:
            typer.echo(f"removed {name}")
        for line in out.failed:
            typer.echo(f"failed {line}", err=True)
    if out.failed:
        raise typer.Exit(1)


# ---- budget and scale-in ----------------------------------------------------------

def _budget_rows(b: ElasticBudget):
    cap = lambda v, fmt: fmt.format(v) if v else "no cap"  # noqa: E731 (0 means no cap)
    yield "autoscale", "on" if b.autoscale else "off"
    yield "max $/hour", cap(b.max_usd_per_hour, "${:.4f}")
    yield "monthly $", cap(b.monthly_usd, "${:.2f}")
    yield "max new hosts", cap(b.max_new_hosts, "{}")
    yield "warm (refill prewarms)", "on" if b.warm else "off"
    yield "allow metal", "yes" if b.allow_metal else "no"
    yield "spent this month", f"${b.month_usd:.4f}"
    yield "running $/hour", f"${b.running_usd_per_hour:.4f}"
    yield "hosts", b.hosts


@app.command("budget")
def budget_cmd(
    max_usd_per_hour: Optional[float] = typer.Option(None, "--max-usd-per-hour", help="$/hour cap (0: none)."),
    monthly_usd: Optional[float] = typer.Option(None, "--monthly-usd", help="$ per calendar month cap (0: none)."),
    max_new_hosts: Optional[int] = typer.Option(None, "--max-new-hosts", help="Cap on elastic hosts (0: none)."),
    autoscale: Optional[bool] = typer.Option(None, "--autoscale/--no-autoscale", help=(
        "Let creates on auto (or a cloud) buy a machine when no host has room.")),
    warm: Optional[bool] = typer.Option(None, "--warm/--no-warm", help="Refill prewarms in the background."),
    allow_metal: Optional[bool] = typer.Option(None, "--allow-metal/--no-allow-metal", help="Allow metal types."),
    url: Optional[str] = _url_option(), token: Optional[str] = _token_option(),
    as_json: bool = typer.Option(False, "--json", help="Print the ElasticBudget as JSON."),
) -> None:
    """The budget and what the clouds cost now, after setting the caps and switches given (none: show it)."""
    try:
        update = _valid(ElasticBudgetUpdate, max_usd_per_hour=max_usd_per_hour, monthly_usd=monthly_usd,
                        max_new_hosts=max_new_hosts, autoscale=autoscale, warm=warm, allow_metal=allow_metal)
    except FuseError as e:
        _fail(e.code, e.message, json_=as_json)
    with _controller(url, token, as_json) as c:
        b = c.pool.cloud_budget(update)
    emit_json(b) if as_json else table(["", "budget"], _budget_rows(b))


@app.command("reconcile")
def reconcile_cmd(
    url: Optional[str] = _url_option(), token: Optional[str] = _token_option(),
    as_json: bool = typer.Option(False, "--json", help="Print the ElasticDecision records as JSON."),
) -> None:
    """One scale-in pass now: idle hosts go at the end of their paid time.

    The least used host is cordoned when the others have room for its VMs."""
    with _controller(url, token, as_json) as c:
        decisions = c.pool.cloud_reconcile()
    if as_json:
        emit_json(decisions)
    elif decisions:
        table(["host", "action", "reason", "until", "saves $"],
              ((d.host, d.action, d.reason, _when(d.until), f"{d.saves_usd:.4f}") for d in decisions))
    else:
        typer.echo("no elastic hosts: nothing to decide")


# ---- prewarm ------------------------------------------------------------------------

PREWARM_COLUMNS = ["id", "image", "kind", "vcpus", "MiB", "ready", "where (ready/count)", "ends", "bought",
                   "buys again"]


def _prewarm_table(pws: list[Prewarm]) -> None:
    table(PREWARM_COLUMNS, ((p.id, p.image, p.kind, p.cpus, p.memory_mb, f"{p.ready}/{p.count}",
                             ", ".join(f"{pl.host} {pl.ready}/{pl.count}" for pl in p.placements),
                             _when(p.expires_at), ", ".join(p.new_hosts) or "-", _backoff(p)) for p in pws))


def _backoff(p: Prewarm) -> str:
    """When the refill may buy a machine again, and why it waits (the cloud kept ending
    the machines bought for it); "-" when it may buy now."""
    if not p.backoff_until or p.backoff_until <= time.time():
        return "-"
    at = local_time(p.backoff_until)
    return f"{at} ({p.backoff_reason})" if p.backoff_reason else at


@app.command("prewarm")
def prewarm_cmd(
    image: str = typer.Argument(..., help="Image (bundle) of the VMs kept ready."),
    count: Optional[int] = typer.Option(None, "--count", help="How many to keep ready, 1 to 256 (default 1)."),
    on: Optional[str] = typer.Option(None, "--on", help="auto (default) | local | <linked cloud> | host:<machine>."),
    kind: Optional[str] = typer.Option(None, "--kind", help=(
        "container, vm or microvm (default: from the image); each runs as a VM: microvm and vm need a KVM host "
        "(a bought machine: metal), container goes anywhere.")),
    cpus: Optional[int] = typer.Option(None, "--cpus", help="vCPUs each (default: learned from the image)."),
    memory_mb: Optional[int] = typer.Option(None, "--memory-mb", help="MiB each (default: learned from the image)."),
    ttl_secs: Optional[int] = typer.Option(None, "--ttl-secs", help="Seconds until it ends, at least 1 (default 3600)."),
    instance_type: Optional[str] = typer.Option(None, "--instance-type", help="Only this machine type."),
    region: Optional[str] = typer.Option(None, "--region", help="Only this region."),
    url: Optional[str] = _url_option(), token: Optional[str] = _token_option(),
    as_json: bool = typer.Option(False, "--json", help="Print the Prewarm as JSON."),
) -> None:
    """Keep VMs of IMAGE ready, so the next creates of that shape start at once.

    Refused, and nothing bought, when the budget or pins cannot fit them."""
    try:
        options = _valid(PrewarmOptions, count=count, on=on, kind=kind, cpus=cpus, memory_mb=memory_mb,
                         ttl_secs=ttl_secs, instance_type=instance_type, region=region)
    except FuseError as e:
        _fail(e.code, e.message, json_=as_json)
    with _controller(url, token, as_json) as c:
        pw = c.pool.prewarm(image, options)
    emit_json(pw) if as_json else _prewarm_table([pw])


@app.command("prewarms")
def prewarms_cmd(
    url: Optional[str] = _url_option(), token: Optional[str] = _token_option(),
    as_json: bool = typer.Option(False, "--json", help="Print the Prewarm records as JSON."),
) -> None:
    """The prewarms, with how many each keeps ready now."""
    with _controller(url, token, as_json) as c:
        _show(c.pool.prewarms(), as_json, _prewarm_table, "no prewarms")


@app.command("unprewarm")
def unprewarm_cmd(
    pw_id: str = typer.Argument(..., metavar="ID", help="The prewarm's id (fuse pool prewarms)."),
    url: Optional[str] = _url_option(), token: Optional[str] = _token_option(),
    as_json: bool = typer.Option(False, "--json", help='Print {"id", "ended": true} as JSON.'),
) -> None:
    """End a prewarm: its ready VMs go. Exit 1 when there is no such prewarm."""
    with _controller(url, token, as_json) as c:
        ended = c.pool.remove_prewarm(pw_id)
    if not ended:
        fail("not_found", f"no prewarm {pw_id}", json_=as_json, exit_code=1)
    if as_json:
        emit_json({"id": pw_id, "ended": True})
        return
    typer.echo(f"prewarm {pw_id} ended")


# ---- linked clouds ---------------------------------------------------------------------

def _option_value(key: str, text: str) -> Any:
    """A number, true/false, null, list or object when the text is JSON; else the text itself."""
    try:
        return _json(text, f"--option {key}: the value")
    except ValueError:
        return text


def _options(items: list[str], options_json: str | None) -> dict[str, Any]:
    """``--options-json`` with each ``--option key=value`` over it, or invalid_argument naming the bad one."""
    out: dict[str, Any] = {}
    if options_json is not None:
        try:
            out = _json(options_json, "--options-json")
        except ValueError as e:
            raise InvalidArgument(f"--options-json: not JSON: {e}") from None
        if not isinstance(out, dict):
            raise InvalidArgument("--options-json: must be a JSON object")
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise InvalidArgument(f"--option: {item!r} is not key=value")
        out[key] = _option_value(key, value)
    return out


def _cloud_table(clouds: list[dict]) -> None:
    table(["name", "kind", "types", "options"],
          ((c["name"], c["kind"], ", ".join(c.get("types", [])), json.dumps(c.get("options", {}), sort_keys=True))
           for c in clouds))


@cloud_app.command("link")
def cloud_link_cmd(
    name: str = typer.Argument(..., help="The cloud's name (lower-case letters, digits and '-')."),
    kind: str = typer.Option(..., "--kind", help="aws (EC2) or local (host agents started on this machine)."),
    option: list[str] = typer.Option([], "--option", metavar="KEY=VALUE", help=(
        "An option (repeat); a value that reads as JSON (a number, true, a list) is taken as JSON. "
        + options_help())),
    options_json: Optional[str] = typer.Option(None, "--options-json", metavar="JSON",
                                               help="All the options as one JSON object (--option wins)."),
    url: Optional[str] = _url_option(), token: Optional[str] = _token_option(),
    as_json: bool = typer.Option(False, "--json", help="Print the linked cloud as JSON."),
) -> None:
    """Link (or re-link) a cloud: its machine types join the plans."""
    try:
        options = _options(option, options_json)
    except FuseError as e:
        _fail(e.code, e.message, json_=as_json)
    with _controller(url, token, as_json) as c:
        cloud = c.pool.link_cloud(name, kind, options)
    emit_json(cloud) if as_json else _cloud_table([cloud])


@cloud_app.command("list")
def cloud_list_cmd(
    url: Optional[str] = _url_option(), token: Optional[str] = _token_option(),
    as_json: bool = typer.Option(False, "--json", help="Print the linked clouds as JSON."),
) -> None:
    """The linked clouds, their machine types and options (no secrets)."""
    with _controller(url, token, as_json) as c:
        _show(c.pool.clouds(), as_json, _cloud_table, "no linked clouds (fuse pool cloud link NAME --kind aws|local)")


@cloud_app.command("unlink")
def cloud_unlink_cmd(
    name: str = typer.Argument(..., help="The linked cloud."),
    url: Optional[str] = _url_option(), token: Optional[str] = _token_option(),
    as_json: bool = typer.Option(False, "--json", help='Print {"name", "unlinked": true} as JSON.'),
) -> None:
    """Forget a cloud; refused (conflict) while it has hosts: remove them first."""
    with _controller(url, token, as_json) as c:
        c.pool.unlink_cloud(name)
    if as_json:
        emit_json({"name": name, "unlinked": True})
        return
    typer.echo(f"cloud {name} unlinked")

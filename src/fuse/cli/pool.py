"""``fuse pool plan``: what the elastic pool would do for some VMs, and at what cost.

Without a controller (no ``--url`` and no ``FUSE_URL``) it plans offline
against the shipped catalogue and an empty pool. ``--model FILE.json`` re-solves
an edited model: the ``json`` field of an earlier plan, a whole plan saved
with ``--json``, or a bare model; it takes no request flags (they would be
ignored). A table for people; ``--json`` prints the ElasticPlan for programs.
Errors print ``error: <code>: <message>`` and exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from fuse.controller.pool.model import PlanModel
from fuse.controller.pool.planner import plan as solve_plan
from fuse.controller.pool.request import model_from_request
from fuse.errors import FuseError, InvalidArgument
from fuse.models.pool import ElasticPlan, ElasticPlanRequest

app = typer.Typer(help="The elastic pool: plan where VMs go and what it costs.", no_args_is_help=True)


@app.callback()
def _pool() -> None:
    """The elastic pool: plan where VMs go and what it costs."""
    # a callback keeps ``plan`` a subcommand even while it is the only one


def _plan_via_controller(url: str, token: str | None, req: ElasticPlanRequest) -> ElasticPlan:
    """POST the request to a controller's ``/v1/pool/plan`` (the seam the SDK replaces)."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if url.startswith("unix://"):
        transport, base = httpx.HTTPTransport(uds=url[len("unix://"):]), "http://fuse"
    else:
        transport, base = None, url.rstrip("/")
    with httpx.Client(base_url=base, transport=transport, headers=headers, timeout=60) as c:
        r = c.post("/v1/pool/plan", json=req.model_dump(exclude_none=True))
        if r.status_code >= 400:
            err = r.json().get("error", {}) if r.headers.get("content-type", "").startswith("application/json") else {}
            raise FuseError(err.get("message", r.text), code=err.get("code", "http_error"))
        return ElasticPlan.model_validate(r.json())


def load_model(path: Path) -> PlanModel:
    """A model from FILE.json: a plan's ``json`` field ({"model", "plan"}), a whole plan, or a bare model."""
    data = json.loads(path.read_text())
    if isinstance(data, dict) and isinstance(data.get("json"), str) and data["json"]:
        data = json.loads(data["json"])  # a whole ElasticPlan as printed by --json
    if isinstance(data, dict) and "model" in data:
        data = data["model"]
    return PlanModel.model_validate(data)


def render(plan: ElasticPlan, console: Console) -> None:
    table = Table(title=f"plan ({plan.solver})")
    for col in ("group", "where", "VMs"):
        table.add_column(col)
    for a in plan.assignments:
        where = a.host if a.host else f"new #{a.new_index} {plan.new_hosts[a.new_index].type_name}"
        table.add_row(a.group, where, str(a.count))
    for u in plan.unplaced:
        table.add_row(u.group, f"[red]unplaced[/red]: {u.reason}", str(u.count))
    console.print(table)
    console.print(f"new machines: {len(plan.new_hosts)}  added ${plan.added_usd_per_hour:.4f}/h  "
                  f"projected ${plan.projected_usd:.4f}  lower bound ${plan.lower_bound_usd:.4f}  "
                  f"ready in {plan.ready_in_secs} s")
    for line in plan.explain:
        console.print(f"  {line}", highlight=False)


REQUEST_FLAGS = {  # option -> parameter: what ``--model`` cannot take (the model holds it already)
    "--count": "count", "--image": "image", "--kind": "kind", "--cpus": "cpus", "--memory-mb": "memory_mb",
    "--duration-secs": "duration_secs", "--caller": "caller", "--together": "together", "--provider": "provider",
    "--region": "region", "--instance-type": "instance_type", "--hosts": "hosts", "--no-scale": "no_scale",
    "--devices-only": "devices_only", "--max-usd-per-hour": "max_usd_per_hour",
}


def _fail(code: str, message: str) -> None:
    typer.echo(f"error: {code}: {message}", err=True)
    raise typer.Exit(2)


def _request(**fields) -> ElasticPlanRequest:
    """The request, or ``invalid_argument`` naming the first bad flag (no traceback)."""
    try:
        return ElasticPlanRequest(**fields)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        flag = "--" + where.replace("_", "-") if where else "request"
        raise InvalidArgument(f"{flag}: {first['msg']}") from None


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
    model: Optional[Path] = typer.Option(None, "--model", exists=True, dir_okay=False, help=(
        "Re-solve an edited model (a plan's json field, or a whole plan saved with --json); "
        "takes no request flags: edit the file instead.")),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", help="Solver seconds (offline only)."),
    url: Optional[str] = typer.Option(None, "--url", envvar="FUSE_URL", help="Controller URL (else offline)."),
    token: Optional[str] = typer.Option(None, "--token", envvar="FUSE_TOKEN", help="Controller token."),
    as_json: bool = typer.Option(False, "--json", help="Print the ElasticPlan as JSON."),
) -> None:
    """What the elastic pool would do for some VMs: where each goes and what it costs."""
    given = dict(count=count, image=image, kind=kind, cpus=cpus, memory_mb=memory_mb, duration_secs=duration_secs,
                 caller=caller, together=together or None, provider=provider, region=region,
                 instance_type=instance_type, hosts=hosts, no_scale=no_scale or None,
                 devices_only=devices_only or None, max_usd_per_hour=max_usd_per_hour)
    try:
        if model is not None:
            flags = [flag for flag, name in REQUEST_FLAGS.items() if given[name] is not None]
            if flags:
                raise InvalidArgument(f"--model re-solves the model in the file as it is, so {', '.join(flags)} "
                                      "would be ignored: edit the model instead (its groups and constraints)")
            m = load_model(model)
            result = solve_plan(m if time_limit is None else m.model_copy(update={"time_limit_secs": time_limit}))
        elif url:
            result = _plan_via_controller(url, token, _request(**given))
        else:
            kw = {} if time_limit is None else {"time_limit_secs": time_limit}
            result = solve_plan(model_from_request(_request(**given), [], **kw))
    except FuseError as e:
        _fail(e.code, e.message)
    except ValidationError as e:  # a --model file that is not a model
        _fail("invalid_argument", f"{model}: not a plan model: {e.errors()[0]['loc']}: {e.errors()[0]['msg']}")
    except (ValueError, OSError) as e:  # the --model file: not JSON, or unreadable
        _fail("invalid_argument" if isinstance(e, ValueError) else "io_error", f"{model}: {e}")
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        render(result, Console())

"""``fuse pool plan``: what the elastic pool would do for some VMs, and at what cost.

Without a controller (no ``--url`` and no ``FUSE_URL``) it plans offline
against the shipped catalogue and an empty pool. ``--model FILE.json`` re-solves
an edited model: the ``json`` field of an earlier plan (or a bare model).
A table for people; ``--json`` prints the ElasticPlan for programs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from fuse.controller.pool.model import PlanModel
from fuse.controller.pool.planner import plan as solve_plan
from fuse.controller.pool.request import model_from_request
from fuse.errors import FuseError
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


@app.command("plan")
def plan_cmd(
    count: Optional[int] = typer.Option(None, help="How many VMs (default 1)."),
    image: Optional[str] = typer.Option(None, help="Image (default linux)."),
    kind: Optional[str] = typer.Option(None, help="container, vm or microvm (default: from the image)."),
    cpus: Optional[int] = typer.Option(None, help="vCPUs each."),
    memory_mb: Optional[int] = typer.Option(None, "--memory-mb", help="MiB each."),
    duration_secs: Optional[int] = typer.Option(None, "--duration-secs", help="Expected lifetime, seconds."),
    caller: Optional[str] = typer.Option(None, help="interactive, batch, compat or persistent_agent."),
    together: bool = typer.Option(False, "--together", help="Keep them on one machine."),
    provider: Optional[str] = typer.Option(None, help="Only this cloud."),
    region: Optional[str] = typer.Option(None, help="Only this region."),
    instance_type: Optional[str] = typer.Option(None, "--instance-type", help="Only this machine type."),
    hosts: Optional[int] = typer.Option(None, "--hosts", help="Exactly this many new machines."),
    no_scale: bool = typer.Option(False, "--no-scale", help="Add no machines."),
    devices_only: bool = typer.Option(False, "--devices-only", help="Only your own devices."),
    max_usd_per_hour: Optional[float] = typer.Option(None, "--max-usd-per-hour", help="A $/hour cap."),
    model: Optional[Path] = typer.Option(None, "--model", exists=True, dir_okay=False,
                                         help="Re-solve an edited model (a plan's json field)."),
    time_limit: Optional[float] = typer.Option(None, "--time-limit", help="Solver seconds (offline only)."),
    url: Optional[str] = typer.Option(None, "--url", envvar="FUSE_URL", help="Controller URL (else offline)."),
    token: Optional[str] = typer.Option(None, "--token", envvar="FUSE_TOKEN", help="Controller token."),
    as_json: bool = typer.Option(False, "--json", help="Print the ElasticPlan as JSON."),
) -> None:
    """What the elastic pool would do for some VMs: where each goes and what it costs."""
    req = ElasticPlanRequest(
        count=count, image=image, kind=kind, cpus=cpus, memory_mb=memory_mb, duration_secs=duration_secs,
        caller=caller, together=together or None, provider=provider, region=region,
        instance_type=instance_type, hosts=hosts, no_scale=no_scale or None,
        devices_only=devices_only or None, max_usd_per_hour=max_usd_per_hour)
    try:
        if model is not None:
            m = load_model(model)
            result = solve_plan(m if time_limit is None else m.model_copy(update={"time_limit_secs": time_limit}))
        elif url:
            result = _plan_via_controller(url, token, req)
        else:
            kw = {} if time_limit is None else {"time_limit_secs": time_limit}
            result = solve_plan(model_from_request(req, [], **kw))
    except FuseError as e:
        typer.echo(f"error: {e.code}: {e.message}", err=True)
        raise typer.Exit(2) from e
    except (ValueError, OSError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from e
    if as_json:
        typer.echo(result.model_dump_json(indent=2))
    else:
        render(result, Console())

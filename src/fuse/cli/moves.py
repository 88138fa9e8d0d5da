"""`fuse controller move VM [--to HOST]` and `fuse controller moves`."""

from __future__ import annotations

import time
from typing import Iterator, Optional

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from ..client.moves import TERMINAL
from .output import api_errors, console, emit_json, table

MOVE_COLUMNS = ["id", "vm", "from", "to", "state", "copied", "total", "reason"]


def _rows(moves):
    for m in moves:
        yield (m["id"], m["vm"], m["from"], m["to"], m["state"], m["copied_bytes"], m["total_bytes"], m["reason"])


def _until_ended(c, m: dict, timeout_s: float = 3600) -> Iterator[dict]:
    """Poll the move until it ends or `timeout_s` passes, yielding each answer."""
    deadline = time.monotonic() + timeout_s
    while m["state"] not in TERMINAL and time.monotonic() < deadline:
        time.sleep(0.2)
        m = c.moves.get(m["id"])
        yield m


def _progress_line(m: dict) -> str:
    """One plain line for a pipe or a log: the state, and the bytes while copying."""
    if m["state"] == "copying":
        return f"copying {m['copied_bytes']}/{m['total_bytes']} bytes"
    return m["state"] + (f": {m['reason']}" if m["state"] == "failed" and m.get("reason") else "")


def _wait(c, m: dict, vm: str, json_: bool) -> dict:
    """Wait for the move to end, showing its progress: a Rich bar of copied/total
    bytes on a terminal, else one plain line per change (on stderr under --json,
    so stdout stays one JSON document). Returns the last answer."""
    if console.is_terminal:
        with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                      console=console) as bar:
            task = bar.add_task(f"{vm} {m['from']} → {m['to']}: {m['state']}", total=None)
            for m in _until_ended(c, m):
                bar.update(task, completed=m["copied_bytes"], total=m["total_bytes"] or None,
                           description=f"{vm} {m['from']} → {m['to']}: {m['state']}")
        return m
    typer.echo(f"move {m['id']}: {vm} {m['from']} -> {m['to']}", err=json_)
    last = _progress_line(m)
    typer.echo(last, err=json_)
    for m in _until_ended(c, m):
        line = _progress_line(m)
        if line != last:
            typer.echo(line, err=json_)
            last = line
    return m


def move(vm: str, to: Optional[str] = typer.Option(None, help="Target host (default: best fit)."),
         host: Optional[str] = typer.Option(None, help="The VM's host, when its name is on several."),
         wait: bool = typer.Option(True, help="Show progress and wait for the move to end."),
         json_: bool = typer.Option(False, "--json")) -> None:
    """Move a running VM to another host (sleep, copy in 4 MiB chunks, wake)."""
    from .controller import client
    with api_errors(json_), client() as c:
        m = c.moves.create(vm, to, host)
        if wait:
            try:
                m = _wait(c, m, vm, json_)
            except KeyboardInterrupt:
                # the controller runs the move, not this command: stopping the wait stops only the wait
                typer.echo(f"\nstopped waiting; move {m['id']} goes on: follow it with "
                           f"`fuse controller moves {m['id']}`", err=True)
                raise typer.Exit(130)
    emit_json(m) if json_ else table(MOVE_COLUMNS, _rows([m]))
    # --json changes what is printed, not the exit code: a script tells a failed move by $?
    if m["state"] == "failed":
        raise typer.Exit(1)
    if wait and m["state"] != "done":
        typer.echo(f"move {m['id']} is still {m['state']} after an hour; follow it with `fuse controller moves`",
                   err=json_)
        raise typer.Exit(1)


def moves(move_id: Optional[str] = typer.Argument(None, metavar="[ID]", help="One move (default: every move)."),
          json_: bool = typer.Option(False, "--json")) -> None:
    """Every move, oldest first; or the move ID (404 not_found: exit 1)."""
    from .controller import client
    with api_errors(json_), client() as c:
        ms = c.moves.list() if move_id is None else c.moves.get(move_id)
    if json_:
        emit_json(ms)
        return
    table(MOVE_COLUMNS, _rows(ms if move_id is None else [ms]))


def mount(app: typer.Typer) -> None:
    app.command("move")(move)
    app.command("moves")(moves)

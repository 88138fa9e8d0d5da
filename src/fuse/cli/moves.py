"""`fuse controller move VM [--to HOST]` and `fuse controller moves`."""

from __future__ import annotations

import time
from typing import Optional

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

from .output import api_errors, console, emit_json, table

MOVE_COLUMNS = ["id", "vm", "from", "to", "state", "copied", "total", "reason"]


def _rows(moves):
    for m in moves:
        yield (m["id"], m["vm"], m["from"], m["to"], m["state"], m["copied_bytes"], m["total_bytes"], m["reason"])


def move(vm: str, to: Optional[str] = typer.Option(None, help="Target host (default: best fit)."),
         host: Optional[str] = typer.Option(None, help="The VM's host, when its name is on several."),
         wait: bool = typer.Option(True, help="Show progress and wait for the move to end."),
         json_: bool = typer.Option(False, "--json")) -> None:
    """Move a running VM to another host (sleep, copy in 4 MiB chunks, wake)."""
    from .controller import client
    with api_errors(), client() as c:
        m = c.moves.create(vm, to, host)
        if wait:
            with Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                          console=console, transient=not console.is_terminal) as bar:
                task = bar.add_task(f"{vm} {m['from']} → {m['to']}: {m['state']}", total=None)
                deadline = time.monotonic() + 3600
                while m["state"] not in ("done", "failed") and time.monotonic() < deadline:
                    time.sleep(0.2)
                    m = c.moves.get(m["id"])
                    bar.update(task, completed=m["copied_bytes"], total=m["total_bytes"] or None,
                               description=f"{vm} {m['from']} → {m['to']}: {m['state']}")
    if json_:
        emit_json(m)
        return
    table(MOVE_COLUMNS, _rows([m]))
    if m["state"] == "failed":
        raise typer.Exit(1)
    if wait and m["state"] != "done":
        console.print(f"move {m['id']} is still {m['state']} after an hour; follow it with `fuse controller moves`")
        raise typer.Exit(1)


def moves(json_: bool = typer.Option(False, "--json")) -> None:
    """Every move, oldest first."""
    from .controller import client
    with api_errors(), client() as c:
        ms = c.moves.list()
    emit_json(ms) if json_ else table(MOVE_COLUMNS, _rows(ms))


def mount(app: typer.Typer) -> None:
    app.command("move")(move)
    app.command("moves")(moves)

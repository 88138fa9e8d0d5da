"""CLI output: a table for people, JSON for programs, errors as code and
message with a non-zero exit."""

from __future__ import annotations

import contextlib
import json
import sys
from typing import Any, Iterable, Iterator

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from ..client import ApiError

# Wide enough for the host table when piped (rich assumes 80 columns then).
console = Console(width=None if sys.stdout.isatty() else 160)


def plain(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if isinstance(obj, (list, tuple)):
        return [plain(o) for o in obj]
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    return obj


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(plain(obj), indent=2, sort_keys=True) + "\n")


def table(columns: list[str], rows: Iterable[Iterable[Any]], title: str | None = None) -> None:
    t = Table(title=title)
    for c in columns:
        t.add_column(c)
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    console.print(t)


@contextlib.contextmanager
def api_errors() -> Iterator[None]:
    try:
        yield
    except ApiError as err:
        typer.echo(f"error: {err.code or err.status}: {err.message}", err=True)
        for k, v in err.details.items():
            typer.echo(f"  {k}: {json.dumps(v)}", err=True)
        raise typer.Exit(1)
    except (OSError, ValueError) as err:
        import httpx
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1)
    except Exception as err:
        import httpx
        if isinstance(err, httpx.TransportError):
            typer.echo(f"error: cannot reach the controller: {err}", err=True)
            raise typer.Exit(1)
        raise

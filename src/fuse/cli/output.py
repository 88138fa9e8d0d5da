"""CLI output: a table for people, JSON for programs, errors as code and
message with a non-zero exit.

Errors go to stderr either way, so stdout only ever holds an answer and the
exit code says whether it is one. For people an error is ``error: CODE:
MESSAGE`` plus a line per detail; under ``--json`` it is the REST API's own
error body on one line, ``{"error": {"code", "message", ...details}}``
(``fuse.errors.error_body``), which a program parses as it would the API's.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from datetime import datetime
from typing import Any, Iterable, Iterator, NoReturn

import httpx
import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..client import ApiError
from ..errors import error_body

# A stdout whose encoding cannot hold a host id or a VM's entry (a latin-1 or ASCII locale,
# PYTHONIOENCODING) shows "?" for what it cannot, one character each as rich measured the
# table, in tables and lines alike, rather than ending in a traceback (stderr does likewise,
# with backslash escapes: Python's default there).
if isinstance(sys.stdout, io.TextIOWrapper) and sys.stdout.errors == "strict":
    sys.stdout.reconfigure(errors="replace")

# Wide enough for the host table when piped (rich assumes 80 columns then).
console = Console(width=None if sys.stdout.isatty() else 160)


def local_time(t: float, *, seconds: bool = True) -> str:
    """``t`` (unix seconds) in this machine's zone, with the date and the zone's UTC offset
    then, ``2026-12-07 13:14:43 -05:00``: a listing across days, a DST change or machines in
    other zones still reads back to one instant. ``seconds=False``: to the minute."""
    try:
        at = datetime.fromtimestamp(t).astimezone()  # (the offset of that day, not today's)
    except (OverflowError, OSError, ValueError):  # (past year 9999, or no time at all: the number as sent)
        return f"{t:g}"
    minutes = round(at.utcoffset().total_seconds() / 60)
    sign, minutes = "-" if minutes < 0 else "+", abs(minutes)
    when = at.strftime("%Y-%m-%d %H:%M:%S" if seconds else "%Y-%m-%d %H:%M")
    return f"{when} {sign}{minutes // 60:02d}:{minutes % 60:02d}"


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
    """Rows as a table, every cell shown as written (a host id or label of ``[bold]x[/bold]``
    or ``[/]`` is text, not rich's markup)."""
    t = Table(title=None if title is None else escape(title))
    for c in columns:
        t.add_column(escape(c))
    for r in rows:
        t.add_row(*["" if v is None else escape(str(v)) for v in r])
    console.print(t)


def fail(code: str, message: str, details: dict[str, Any] | None = None, *, json_: bool = False,
         exit_code: int = 1) -> NoReturn:
    """End the command with an error on stderr: a line for people, or under
    ``--json`` the API's error body (one line, after any progress lines)."""
    if json_:
        typer.echo(json.dumps(error_body(code, message, **(details or {})), sort_keys=True), err=True)
    else:
        typer.echo(f"error: {code}: {message}", err=True)
        for k, v in (details or {}).items():  # fleet_full's hosts and the like
            typer.echo(f"  {k}: {json.dumps(v)}", err=True)
    raise typer.Exit(exit_code)


@contextlib.contextmanager
def api_errors(json_: bool = False) -> Iterator[None]:
    """Turn what talking to the controller may raise into `fail` (exit 1; a bad --url or --token, 2);
    pass the command's ``--json`` so a program gets its error as JSON."""
    try:
        yield
    except ApiError as err:  # "unreachable" (status 0) when no controller answered
        fail(err.code or str(err.status), err.message, err.details, json_=json_)
    except httpx.InvalidURL as err:  # (a name too long for a URL, say: the request is never made)
        fail("invalid_argument", f"cannot make the request: {err}", json_=json_, exit_code=2)
    except httpx.TransportError as err:  # (the SDK turns these into ApiError; kept for safety)
        fail("unreachable", f"cannot reach the controller: {err}", json_=json_)
    except ValueError as err:  # a malformed --url / $FUSE_URL or --token: a bad flag, refused before anything is asked
        fail("invalid_argument", str(err), json_=json_, exit_code=2)
    except OSError as err:
        fail("io_error", str(err), json_=json_)

"""The `fuse` command line."""

from __future__ import annotations

import sys


HELP = "fuse: a control plane for fleets of microVM hosts."


def _json_usage_errors() -> None:
    """Under ``--json``, a flag click itself refuses (a wrong type, an unknown option) is the
    API's error body on one stderr line, as every other error under ``--json`` is (exit 2
    as before), not click's usage box."""
    if "--json" not in sys.argv[1:]:
        return
    import json

    import click
    from typer import rich_utils

    def as_json(e) -> None:
        from ..http_errors import error_body
        code = "invalid_argument" if getattr(e, "exit_code", 1) == 2 else "error"  # (2: a usage error)
        sys.stderr.write(json.dumps(error_body(code, " ".join(e.format_message().split())), sort_keys=True) + "\n")

    rich_utils.rich_format_error = as_json
    click.ClickException.show = lambda self, file=None: as_json(self)


def entry() -> None:
    """The console script. `fuse host relay` is started once per SSH channel,
    so it skips loading the rest of the CLI; every other `fuse host` command (an
    agent's `serve` above all) loads only its own group: the pool's and the
    controller's commands, with the planner's numpy, were a quarter of an agent's
    start (0.66 s of CPU, 0.50 s without them)."""
    _json_usage_errors()
    if sys.argv[1:2] == ["host"] and sys.argv[2:3] != ["relay"]:
        import typer

        from .host import app as host_app
        app = typer.Typer(help=HELP, no_args_is_help=True)
        app.add_typer(host_app, name="host")
        app()
        return
    if sys.argv[1:3] == ["host", "relay"]:
        import typer

        from .relay import relay
        relay_app = typer.Typer(add_completion=False)
        relay_app.command()(relay)
        sys.argv = [sys.argv[0] + " host relay", *sys.argv[3:]]
        relay_app()
        return
    from .main import main
    main()

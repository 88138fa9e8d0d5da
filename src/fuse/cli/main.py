"""The `fuse` command."""

from __future__ import annotations

import typer

from . import HELP, bundle, controller, host, mcp, pool, up

app = typer.Typer(help=HELP, no_args_is_help=True)  # (`fuse host ...` builds its own: fuse.cli.entry)
app.add_typer(host.app, name="host")
app.add_typer(controller.app, name="controller")
app.add_typer(bundle.app, name="bundle")
app.add_typer(pool.app, name="pool")
up.mount(app)
mcp.mount(app)


def main() -> None:
    app()


"""The `fuse` command."""

from __future__ import annotations

import importlib

import typer

from . import controller, host

app = typer.Typer(help="fuse: a control plane for fleets of microVM hosts.", no_args_is_help=True)
app.add_typer(host.app, name="host")
app.add_typer(controller.app, name="controller")

# Sub-commands that live in their own modules: name -> module with `app`.
for _name, _mod in (("bundle", "fuse.cli.bundle"), ("pool", "fuse.cli.pool")):
    try:
        app.add_typer(importlib.import_module(_mod).app, name=_name)
    except ImportError:
        pass

for _mod in ("fuse.cli.up", "fuse.cli.mcp"):
    try:
        importlib.import_module(_mod).mount(app)
    except ImportError:
        pass


def main() -> None:
    app()

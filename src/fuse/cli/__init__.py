"""The `fuse` command line."""

from __future__ import annotations

import sys


def entry() -> None:
    """The console script. `fuse host relay` is started once per SSH channel,
    so it skips loading the rest of the CLI."""
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

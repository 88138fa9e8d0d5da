"""`fuse mcp`: serve the `fuse_controller` MCP tool on stdio."""

from __future__ import annotations

from typing import Optional

import typer


def mcp(
    url: Optional[str] = typer.Option(None, envvar="FUSE_URL", help="Controller: unix:///path or http(s)://host:port."),
    token: Optional[str] = typer.Option(None, envvar="FUSE_TOKEN", help="Controller token (TCP)."),
) -> None:
    """Run an MCP server on stdin/stdout exposing the fuse_controller tool."""
    # stdout is the MCP channel: nothing else may print to it.
    from ..mcp.server import build_server
    try:
        server = build_server(url, token)
    except ValueError as err:  # a malformed --url / $FUSE_URL: one line, as every command says it
        typer.echo(f"error: invalid_argument: {err}", err=True)
        raise typer.Exit(2) from None  # (a flag refused before anything is asked: README)
    server.run("stdio")


def mount(app: typer.Typer) -> None:
    app.command("mcp")(mcp)

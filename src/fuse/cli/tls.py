"""`fuse host ca create` and `fuse host cert issue`: the CA and certificates
for mutual TLS between the controller and its hosts (fuse.transport.tls)."""

from __future__ import annotations

from pathlib import Path

import typer

from .output import emit_json, table

ca_app = typer.Typer(help="The CA that signs host and controller certificates.", no_args_is_help=True)
cert_app = typer.Typer(help="Issue host and controller certificates.", no_args_is_help=True)


def _show(files, json_: bool) -> None:
    from ..transport.tls import describe

    info = describe(files.cert)
    info.update(cert=str(files.cert), key=str(files.key), ca=str(files.ca))
    if json_:
        emit_json(info)
    else:
        table(["field", "value"], [(k, ", ".join(v) if isinstance(v, list) else v) for k, v in info.items()])


@ca_app.command("create")
def ca_create(
    out: Path = typer.Option(..., help="Directory for ca.pem and ca.key (the key is written 0600)."),
    name: str = typer.Option("fuse CA", help="The CA's common name."),
    days: int = typer.Option(3650, help="Validity in days."),
    force: bool = typer.Option(False, help="Replace an existing CA in --out."),
    json_: bool = typer.Option(False, "--json"),
) -> None:
    """Make a CA. Keep ca.key private: whoever holds it can admit controllers to every host."""
    from ..transport.tls import create_ca

    try:
        files = create_ca(out, name=name, days=days, overwrite=force)
    except (OSError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1)
    _show(files, json_)


@cert_app.command("issue")
def cert_issue(
    ca: Path = typer.Option(..., help="The CA directory made by `fuse host ca create`."),
    name: str = typer.Option(..., help="Host name or IP (host certificates) or the controller's name."),
    out: Path = typer.Option(..., help="Directory for NAME.pem, NAME.key (0600) and a copy of ca.pem."),
    client: bool = typer.Option(False, "--client", help="A client certificate (the controller's), not a host's."),
    days: int = typer.Option(825, help="Validity in days."),
    force: bool = typer.Option(False, help="Replace an existing certificate and key."),
    json_: bool = typer.Option(False, "--json"),
) -> None:
    """Issue a host's serving certificate or, with --client, the controller's."""
    from ..transport.tls import issue_cert

    try:
        files = issue_cert(ca, name, out, client=client, days=days, overwrite=force)
    except (OSError, ValueError) as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(1)
    _show(files, json_)

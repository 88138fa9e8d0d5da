"""`fuse host ca create` and `fuse host cert issue`: the CA and certificates
for mutual TLS between the controller and its hosts (fuse.transport.tls)."""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import NoReturn

import typer

from .output import emit_json, fail, table

# A DNS name's label (RFC 1123): letters, digits and inner hyphens, 1-63 characters.
DNS_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")

ca_app = typer.Typer(help="The CA that signs host and controller certificates.", no_args_is_help=True)
cert_app = typer.Typer(help="Issue host and controller certificates.", no_args_is_help=True)


def name_problem(name: str) -> str | None:
    """Why ``name`` can be neither an IP address nor a DNS name, or None. A host's
    certificate must name the address it is registered at, and no address matches
    anything else: such a certificate would only fail later, at `hosts add`."""
    try:
        ipaddress.ip_address(name)
        return None
    except ValueError:
        pass
    labels = name.split(".")
    # (an all-digit last label is no top-level domain: 256.1.1.1 is a mistyped IP address)
    if len(name) <= 253 and all(DNS_LABEL.fullmatch(label) for label in labels) and not labels[-1].isdigit():
        return None
    return (f"{name!r} is neither an IP address nor a DNS name (labels of 1-63 letters, digits and "
            f"inner hyphens, joined by dots; 253 characters at most)")


def _show(files, json_: bool) -> None:
    from ..transport.tls import describe

    info = describe(files.cert)
    info.update(cert=str(files.cert), key=str(files.key), ca=str(files.ca))
    if json_:
        emit_json(info)
    else:
        table(["field", "value"], [(k, ", ".join(v) if isinstance(v, list) else v) for k, v in info.items()])


def _failed(err: OSError | ValueError, out: Path, json_: bool) -> NoReturn:
    """End with ``error: CODE: MESSAGE`` naming the file and what is wrong (it was the bare
    ``[Errno 2] No such file or directory: '/proc/nope'``): files that do not load (a junk
    ca.pem) are invalid_argument, exit 2, as a bad --name is; what cannot be written, io_error."""
    if isinstance(err, ValueError):
        fail("invalid_argument", str(err), json_=json_, exit_code=2)
    if isinstance(err, FileExistsError) and err.filename is not None and Path(err.filename) == out:
        fail("io_error", f"--out {out}: it is a file, not a directory", json_=json_)
    if err.strerror and err.filename is not None:  # (the OS's: name the file; ours say it all already)
        fail("io_error", f"--out {out}: cannot write there: {err.filename}: {err.strerror}", json_=json_)
    fail("io_error", str(err), json_=json_)


@ca_app.command("create")
def ca_create(
    out: Path = typer.Option(..., help="Directory for ca.pem and ca.key (the key is written 0600)."),
    name: str = typer.Option("fuse CA", help="The CA's common name."),
    days: int = typer.Option(3650, min=1, help="Validity in days."),
    force: bool = typer.Option(False, help="Replace an existing CA in --out."),
    json_: bool = typer.Option(False, "--json"),
) -> None:
    """Make a CA. Keep ca.key private: whoever holds it can admit controllers to every host."""
    from ..transport.tls import create_ca

    try:
        files = create_ca(out, name=name, days=days, overwrite=force)
    except (OSError, ValueError) as err:
        _failed(err, out, json_)
    _show(files, json_)


@cert_app.command("issue")
def cert_issue(
    ca: Path = typer.Option(..., help="The CA directory made by `fuse host ca create`."),
    name: str = typer.Option(..., help="Host name or IP (host certificates) or the controller's name."),
    out: Path = typer.Option(..., help="Directory for NAME.pem, NAME.key (0600) and a copy of ca.pem."),
    client: bool = typer.Option(False, "--client", help="A client certificate (the controller's), not a host's."),
    days: int = typer.Option(825, min=1, help="Validity in days."),
    force: bool = typer.Option(False, help="Replace an existing certificate and key."),
    json_: bool = typer.Option(False, "--json"),
) -> None:
    """Issue a host's serving certificate or, with --client, the controller's.

    A --name that is neither an IP address nor a DNS name, or is `ca` (its files would
    be the CA's own ca.pem and ca.key), is invalid_argument, exit 2, and nothing is written."""
    from ..transport.tls import clashes_with_ca, issue_cert

    if why := name_problem(name):
        fail("invalid_argument", f"--name: {why}", json_=json_, exit_code=2)
    if why := clashes_with_ca(name):
        fail("invalid_argument", why, json_=json_, exit_code=2)
    try:
        files = issue_cert(ca, name, out, client=client, days=days, overwrite=force)
    except (OSError, ValueError) as err:
        _failed(err, out, json_)
    _show(files, json_)

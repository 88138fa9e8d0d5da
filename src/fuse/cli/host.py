"""`fuse host ...`: run and inspect a host agent."""

from __future__ import annotations

import errno
import os
import ssl
from pathlib import Path
from typing import Optional

import typer

from .. import stalls
from ..tokens import token_problem
from .output import emit_json, fail, table

# The exit status of a listener that cannot start (uvicorn's, as for a port in use).
STARTUP_FAILURE = 3

app = typer.Typer(help="Run a host agent, probe this machine, and manage host certificates.", no_args_is_help=True)


def default_state_dir() -> Path:
    return Path("/var/lib/fuse-host") if os.geteuid() == 0 else Path.home() / ".local/share/fuse-host"


def listen_address(listen: Optional[str]) -> Optional[str]:
    """``--listen``'s callback: HOST:PORT with a port of 0-65535, else a usage error (exit 2)
    while the command line is read, before anything starts or a port is bound."""
    if listen is None:
        return None
    from ..serving import parse_listen

    try:
        _, port = parse_listen(listen)
    except ValueError:
        raise typer.BadParameter(f"{listen!r} is not HOST:PORT (e.g. 127.0.0.1:8090)") from None
    if port > 65535:
        raise typer.BadParameter(f"{listen!r}: port {port} is not 0-65535")
    return listen


def state_dir_problem(state_dir: Path, exc: OSError) -> str:
    """One line for an ``--state-dir`` that cannot be made or used, naming the file at fault
    when it is not the dir itself (its lock file, say)."""
    at_fault = Path(exc.filename).absolute() if exc.filename else None
    where = f" ({at_fault})" if at_fault and at_fault != Path(state_dir).absolute() else ""
    why = "Not a directory" if isinstance(exc, FileExistsError) else exc.strerror or str(exc)  # (mkdir on a file)
    return f"--state-dir {state_dir}: {why}{where}"


def hold_state_dir(state_dir: Path, what: str, *, lock: bool = True) -> None:
    """Lock ``state_dir`` for this server (making it 0700 if missing), or exit: 3 when another
    running ``what`` holds it, as a port in use; 1 (``io_error``, one line) when it cannot be
    made or locked (a path under a regular file, no permission), or when another user owns it
    or others may write to it, as for a ``--socket``'s directory (``state_dir_access_problem``:
    they could swap its ``vms/`` or store for their own). ``lock=False`` only makes and checks it."""
    from .. import statelock
    from ..paths import private_dir, state_dir_access_problem

    try:
        if not private_dir(state_dir).is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(state_dir))
        if why := state_dir_access_problem(state_dir, what):  # (before a lock file or anything is made in it)
            fail("io_error", why)
        if not lock:  # (nothing else looks at the dir before the controller uses it)
            return
        held = statelock.hold(state_dir)
    except OSError as exc:
        fail("io_error", state_dir_problem(state_dir, exc))
    if not held:
        typer.echo(f"error: state dir {state_dir} is in use by a running {what}", err=True)
        raise typer.Exit(STARTUP_FAILURE)


@app.command()
def serve(
    listen: Optional[str] = typer.Option(None, callback=listen_address,
                                         help="TCP address HOST:PORT for the host API."),
    token: Optional[str] = typer.Option(None, envvar="FUSE_HOST_TOKEN", help="Bearer token required on TCP."),
    state_dir: Path = typer.Option(None, help="Where VMs, bundles and records live."),
    backend: str = typer.Option("qemu", help="qemu or firecracker (fake: a test stand-in)."),
    socket: Optional[Path] = typer.Option(None, help="Owner-only unix socket for the local transport "
                                          "(default: the standard agent socket when --listen is not given)."),
    max_vms: Optional[int] = typer.Option(None, min=0, help="VM-count policy enforced by admission."),
    reserve_mib: int = typer.Option(256, min=0, help="Memory kept for the host itself."),
    tls_cert: Optional[Path] = typer.Option(None, help="Serve mutual TLS with this certificate..."),
    tls_key: Optional[Path] = typer.Option(None, help="...its key..."),
    tls_ca: Optional[Path] = typer.Option(None, help="...accepting only clients this CA signed."),
) -> None:
    """Serve the public host API."""
    from ..envsettings import AGENT_MEGABYTES, AGENT_TIMINGS, BadSetting, check_seconds
    try:  # (before the modules that read them as they load)
        check_seconds(AGENT_TIMINGS, AGENT_MEGABYTES)
    except BadSetting as err:
        fail("invalid_argument", str(err), exit_code=2)
    from ..agent.app import AgentConfig, create_app
    from ..serving import SocketInUse, serve as run, socket_in_use, socket_path_problem, tls_server_options
    from ..transport import default_agent_socket

    if backend not in ("qemu", "firecracker", "fake"):
        raise typer.BadParameter("backend must be qemu or firecracker")
    state_dir = (state_dir or default_state_dir()).absolute()  # (QEMU runs with / as its working dir)
    if listen is None and socket is None:
        socket = default_agent_socket()
    ssl_opts = None
    if tls_cert or tls_key or tls_ca:
        if not (tls_cert and tls_key and tls_ca):
            raise typer.BadParameter("--tls-cert, --tls-key and --tls-ca go together")
        from ..transport import IdentityError, check_ca_file, check_cert_dates, check_cert_purpose, tls_context
        try:  # before the banner: files that cannot serve TLS are an error, not a listener that never starts
            tls_context(ssl.Purpose.CLIENT_AUTH, str(tls_cert), str(tls_key), str(tls_ca),
                        names=("--tls-cert", "--tls-key", "--tls-ca"))
            # nor files that load but no controller could use: as PUT /v1/controller refuses them
            check_cert_dates(str(tls_cert), "--tls-cert", "fuse host cert issue")
            check_cert_purpose(str(tls_cert), "--tls-cert", client=False)
            check_ca_file(str(tls_ca), "--tls-ca")
        except IdentityError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(STARTUP_FAILURE)
        ssl_opts = tls_server_options(str(tls_cert), str(tls_key), str(tls_ca))
    elif listen and not token:  # (as the controller's: no open TCP listener)
        raise typer.BadParameter("--listen needs --token (or mutual TLS: --tls-cert, --tls-key, --tls-ca): "
                                 "the TCP listener requires it on every route")
    if why := token_problem(token):  # (no client could send it)
        raise typer.BadParameter(f"the token {why}", param_hint="'--token'")
    # One agent per state dir (two would boot its VMs twice and repeat event ids) and
    # per socket (the second would leave the first running unreachable): refuse, before
    # anything of the dir is read or the socket touched.
    if socket and (why := socket_path_problem(Path(socket))):  # (before anything is made or held)
        fail("io_error", why)
    hold_state_dir(state_dir, "host agent")
    if socket and socket_in_use(socket):
        exit_socket_in_use(socket, "host agent")
    from ..agent.app import startup_problem
    if problem := startup_problem(state_dir.resolve(), backend):  # (one line, not a traceback from its startup)
        fail(*problem)
    from ..agent.backends.base import become_subreaper
    become_subreaper()  # a deleted or finished VM's QEMU is reaped at once, not left a zombie for init
    app_ = create_app(AgentConfig(state_dir=state_dir, token=token, backend=backend, max_vms=max_vms,
                                  reserve_mib=reserve_mib))
    banner = "fuse host agent: " + " ".join(([f"listen {listen}"] if listen else []) +
                                            ([f"socket {socket}"] if socket else []))
    try:  # (the banner once it accepts: its startup settles the accelerator, up to ~10 s)
        stalls.run(run(app_, listen=listen, socket_path=socket, ssl_options=ssl_opts, banner=banner))
    except SocketInUse:  # (one bound it since the check above)
        exit_socket_in_use(socket, "host agent")


def exit_socket_in_use(path: Path, what: str) -> None:
    """Exit as a listener that cannot start (a port in use): a server answers on ``path``."""
    typer.echo(f"error: socket {path} is in use by a running process (another {what}?): "
               "stop it, or serve on another --socket", err=True)
    raise typer.Exit(STARTUP_FAILURE)


@app.command()
def probe(state_dir: Path = typer.Option(None, help="The agent's state dir (its bundles and KVM answer)."),
          backend: str = typer.Option("qemu", help="The backend whose accelerator to settle: qemu or firecracker."),
          json_: bool = typer.Option(False, "--json")) -> None:
    """Print this machine's hardware facts, as the agent would report them."""
    from ..agent.backends.qemu import qemu_missing
    from ..agent.probe import host_facts

    if backend not in ("qemu", "firecracker", "fake"):
        raise typer.BadParameter("backend must be qemu or firecracker")
    state_dir = (state_dir or default_state_dir()).absolute()
    from ..paths import private_dir
    try:  # (0700 whatever the umask, as the agent makes it: one it would refuse to serve is not made here)
        private_dir(state_dir)
        if not state_dir.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(state_dir))
    except OSError as exc:  # (a path under a regular file, no permission: one line, as bundle build says it)
        fail("io_error", state_dir_problem(state_dir, exc), json_=json_)
    if backend == "qemu" and (missing := qemu_missing()):
        fail("io_error", missing, json_=json_)
    facts = host_facts(state_dir, backend)
    if json_:
        emit_json(facts)
    else:
        shown = dict(facts, bundles=", ".join(f"{b['name']} ({b['fingerprint'][:12]}, {b['kernel']})"
                                              for b in facts["bundles"]) or "none (fuse bundle build)")
        table(["fact", "value"], sorted(shown.items()), title="host probe")



def _mount_subcommands() -> None:
    from .relay import relay
    from .tls import ca_app, cert_app
    app.add_typer(ca_app, name="ca")
    app.add_typer(cert_app, name="cert")
    app.command()(relay)


_mount_subcommands()

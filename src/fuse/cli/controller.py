"""`fuse controller ...`: run the controller and drive it."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

import typer

from .. import stalls
from ..tokens import token_problem
from .host import STARTUP_FAILURE, listen_address
from .output import api_errors, emit_json, fail, table

app = typer.Typer(help="Run the fleet controller and drive it.", no_args_is_help=True)
hosts_app = typer.Typer(help="Register and manage hosts.", no_args_is_help=True)
app.add_typer(hosts_app, name="hosts")

_conn: dict[str, Optional[str]] = {"url": None, "token": None}


@app.callback()
def _options(
    url: Optional[str] = typer.Option(None, envvar="FUSE_URL", help="Controller: unix:///path or http(s)://host:port."),
    token: Optional[str] = typer.Option(None, envvar="FUSE_TOKEN", help="Controller token (TCP)."),
) -> None:
    _conn.update(url=url, token=token)


def client():
    from ..client import Client
    return Client(_conn["url"], _conn["token"])


def default_state_dir() -> Path:
    return Path("/var/lib/fuse-controller") if os.geteuid() == 0 else Path.home() / ".local/share/fuse-controller"


@app.command()
def serve(
    state_dir: Path = typer.Option(None, help="Where the embedded SQLite store lives."),
    listen: Optional[str] = typer.Option(None, callback=listen_address,
                                         help="Also serve TCP on HOST:PORT (needs --token)."),
    token: Optional[str] = typer.Option(None, "--token", envvar="FUSE_CONTROLLER_TOKEN",
                                        help="Token required on TCP on every route but /v1/healthz."),
    db: Optional[str] = typer.Option(None, help="postgresql://... for a shared store (default: SQLite)."),
    socket: Optional[Path] = typer.Option(None, help="Owner-only unix socket (default: the standard one)."),
    no_socket: bool = typer.Option(False, "--no-socket", help="Serve TCP only."),  # (a flag: no --no-no-socket)
) -> None:
    """Serve the controller API."""
    from ..envsettings import CONTROLLER_TIMINGS, BadSetting, check_seconds

    try:  # (the moves', creates' and the pool's timings are read as their modules load; the SSH
        check_seconds(CONTROLLER_TIMINGS)  # connect timeout per connection: all checked before)
        import importlib

        from ..controller.app import create_app
        for module in ("moves", "vms", "pool.elastic_host"):
            importlib.import_module(f"fuse.controller.{module}")
    except BadSetting as err:
        fail("invalid_argument", str(err), exit_code=2)
    from ..controller.service import Controller, default_controller_socket
    from ..serving import SocketInUse, serve as run, socket_in_use, socket_path_problem
    from .host import exit_socket_in_use, hold_state_dir

    if listen and not token:
        raise typer.BadParameter("--listen needs --token: the TCP listener requires it on every route")
    if why := token_problem(token):  # (no client could send it)
        raise typer.BadParameter(f"the token {why}", param_hint="'--token'")
    if no_socket and not listen:
        raise typer.BadParameter("--no-socket needs --listen: there would be nothing to serve on")
    state_dir = state_dir or default_state_dir()
    sock = None if no_socket else (socket or default_controller_socket())
    if sock and (why := socket_path_problem(Path(sock))):  # (before anything is made or held)
        fail("io_error", why)
    # The embedded store is one process's: a second controller on it would place on the
    # same room twice. A shared --db is meant for several replicas, and what they keep in
    # the state dir then (linked clouds' machine dirs) is shared by design: no lock.
    hold_state_dir(state_dir, "controller", lock=not db)
    _hold_sqlite(db, state_dir)
    if sock and socket_in_use(sock):  # (taking it over would leave that one running unreachable)
        exit_socket_in_use(sock, "controller")
    ctl = _open(lambda: Controller(state_dir, db=db, token=token), db, state_dir)
    _sound(ctl.store, db, state_dir)
    banner = "fuse controller: " + " ".join(([f"socket {sock}"] if sock else []) +
                                            ([f"listen {listen}"] if listen else []))
    try:  # (the banner once it accepts)
        stalls.run(run(create_app(ctl), listen=listen, socket_path=sock, banner=banner))
    except SocketInUse:  # (one bound it since the check above)
        exit_socket_in_use(sock, "controller")


def _masked(url: str) -> str:
    """``url`` with its password shown as ``***`` (the authority's, and a ``password=``
    parameter's), for messages; also a URL that does not parse."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, after = rest.rpartition("@")  # (the last @: a password may hold one)
    if sep and at and ":" in userinfo:
        url = f"{scheme}://{userinfo.partition(':')[0]}:***@{after}"
    return re.sub(r"(?i)([?&]password=)[^&]*", r"\1***", url)


def _password(url: str) -> str:
    """The password ``_masked`` hides in ``url``, or ""."""
    userinfo, at, _ = url.partition("://")[2].rpartition("@")
    if "://" in url and at and ":" in userinfo:
        return userinfo.partition(":")[2]
    m = re.search(r"(?i)[?&]password=([^&]*)", url)
    return m.group(1) if m else ""


def _hold_sqlite(db: Optional[str], state_dir: Path) -> None:
    """Lock the SQLite file the controller will use (``<file>.lock``), or exit 3 when
    another running controller holds it: the state dir's lock alone let a second
    controller in through ``--db sqlite:///<the first one's file>`` from another state
    dir, and the two then placed on the same room twice. (PostgreSQL is for replicas.)"""
    from sqlalchemy.engine import make_url

    from .. import statelock
    from ..controller.store import engine_url

    url = engine_url(db, state_dir)
    if not url.startswith("sqlite"):
        return
    try:
        path = make_url(url).database
    except Exception:
        return  # (not a URL: _open says so)
    if not path or path == ":memory:" or path.startswith("file:"):
        return
    try:
        held = statelock.lock_file(f"{os.path.realpath(path)}.lock")  # (a symlink to it: the same lock)
    except OSError:
        return  # (a directory that is not there: opening the store says so)
    if held is None:
        typer.echo(f"error: the SQLite store {path} is in use by a running controller (one controller per SQLite "
                   "file; replicas share a PostgreSQL --db)", err=True)
        raise typer.Exit(STARTUP_FAILURE)
    _sqlite_locks.append(held)  # (held for the process's life)


_sqlite_locks: list[int] = []


def _open(make, db: Optional[str], state_dir: Path):
    """``make()`` (the controller, which opens its store), or exit with one line on
    stderr naming the database (password masked) and what is wrong: a ``--db`` that
    is not a URL fuse can open is ``invalid_argument`` (exit 2, like any bad flag);
    a database that does not let the controller in is ``db_unavailable`` (exit 1)."""
    from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

    def one_line(exc: BaseException) -> str:
        text = " ".join(str(exc).split()) or type(exc).__name__
        if db:  # a driver may quote the URL, or the password alone
            text = text.replace(db, _masked(db))
            if len(password := _password(db)) >= 4:  # (a shorter one matches anywhere, and hides little)
                text = text.replace(password, "***")
        return text

    try:
        return make()
    except (ArgumentError, ValueError, ImportError) as exc:
        if not db:
            raise  # (the built-in SQLite URL always parses: a bug, not the operator's)
        scheme = db.partition("://")[0] if "://" in db else ""
        if isinstance(exc, (NoSuchModuleError, ImportError)) and scheme:
            why = f"fuse has no driver for {scheme}:// databases"
        else:
            why = f"it does not parse as a database URL ({one_line(exc)})"
        fail("invalid_argument", f"--db {_masked(db)}: {why}; give postgresql://USER:PASSWORD@HOST:PORT/DATABASE",
             exit_code=2)
    except DBAPIError as exc:  # refused, no such host, a wrong password, no such database...
        where = f"--db {_masked(db)}" if db else f"the SQLite store in {state_dir}"
        fail("db_unavailable", f"{where}: cannot open the database: {one_line(exc.orig or exc)}")
    except OSError as exc:  # (an SQLite file in a dir that is not there: review 28, a traceback)
        where = f"--db {_masked(db)}" if db else f"the SQLite store in {state_dir}"
        fail("io_error", f"{where}: cannot open the database: {one_line(exc)}")


def _sound(store, db: Optional[str], state_dir: Path) -> None:
    """Exit 1 with one ``db_unavailable`` line when the SQLite file is damaged where opening it
    did not look (review 31: it was served, healthz 200 while routes answered 500)."""
    if (why := store.damage()) is None:
        return
    store.close()
    path = store.engine.url.database
    where = f"--db {_masked(db)}" if db else f"the SQLite store in {state_dir}"
    fail("db_unavailable", f"{where}: the database file is damaged (SQLite's quick_check: {why}): restore it "
                           f"from a backup, or rebuild it from what it still holds (`sqlite3 {path} .recover | "
                           f"sqlite3 {path}.recovered`, then that file in its place)")


def _host_rows(hosts):
    for h in hosts:
        c, a = h.capacity, h.allocated
        yield (h.id, h.url, h.state, h.backend, "yes" if h.connected else "no", c.arch,
               f"{a.cpus}/{c.cpus}", f"{a.ram_mb}/{c.ram_mb}", c.storage_gb, f"{a.vm_count}/{c.vm_count}",
               f"{c.gpus} {c.gpu_kind}".strip())


HOST_COLUMNS = ["id", "url", "state", "backend", "connected", "arch", "cpus", "ram MB", "disk GB", "vms", "gpus"]


def _pairs(flag: str, items: list[str], json_: bool = False) -> dict[str, str]:
    """Repeated KEY=VALUE flags as a dict, or exit 2 naming the bad one."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail("invalid_argument", f"{flag}: {item!r} is not KEY=VALUE", json_=json_, exit_code=2)
        if key in out and out[key] != value:  # (as a JSON key given twice is refused: not the last taken)
            fail("invalid_argument", f"{flag}: {key} is given twice ({out[key]!r} and {value!r})", json_=json_,
                 exit_code=2)
        out[key] = value
    return out


def _mig_counts(items: list[str], json_: bool = False) -> dict[str, int] | None:
    counts: dict[str, int] = {}
    for name, value in _pairs("--mig-profiles", items, json_).items():
        try:
            counts[name] = int(value)
        except ValueError:
            fail("invalid_argument", f"--mig-profiles: {name}={value!r}: the count is not an integer",
                 json_=json_, exit_code=2)
    # The controller judges names and counts (400 invalid_argument), one rule in one place.
    return counts or None


@hosts_app.command("add")
def hosts_add(
    name: str = typer.Option(..., help="The host's id."),
    addr: str = typer.Option(..., help="local | unix:///path | http(s)://h:p | ssh://user@h[:p] | h:p (mutual TLS)."),
    vm_count: int = typer.Option(16, help="VM-count policy (never probed)."),
    # `--token` here is the agent's; the controller's own is `fuse controller --token` (before `hosts`).
    agent_token: Optional[str] = typer.Option(None, "--agent-token", "--token", envvar="FUSE_HOST_TOKEN",
                                              help="The agent's bearer token."),
    region: Optional[str] = typer.Option(None),
    backend: Optional[str] = typer.Option(None, help="qemu or firecracker (unset: the one the host agent runs)."),
    cpus: int = typer.Option(0, help="0: probe."), ram_mb: int = typer.Option(0, help="0: probe."),
    storage_gb: int = typer.Option(0, help="0: probe."),
    gpus: int = typer.Option(0, help="0: probe (qemu hosts only)."),
    gpu_kind: str = typer.Option("", help="Empty: probe."),
    arch: str = typer.Option("", help="The CPU architecture, e.g. arm64 (empty: probe; a probed one wins)."),
    mig_profiles: list[str] = typer.Option([], "--mig-profiles", metavar="PROFILE=COUNT",
                                           help="MIG instances by profile, e.g. 1g.10gb=4 (repeat; qemu only; "
                                                "none: probe)."),
    labels: list[str] = typer.Option([], "--labels", "--label", metavar="KEY=VALUE", help="A label (repeat)."),
    json_: bool = typer.Option(False, "--json"),
) -> None:
    """Register a host, probing what is left at 0."""
    from pydantic import ValidationError

    from ..models.hosts import HostCapacity, RegisterHostRequest
    try:
        req = RegisterHostRequest(id=name, url=addr, token=agent_token, region=region, backend=backend,
                                  labels=_pairs("--labels", labels, json_) or None,
                                  capacity=HostCapacity(vm_count=vm_count, cpus=cpus, ram_mb=ram_mb,
                                                        storage_gb=storage_gb, gpus=gpus, gpu_kind=gpu_kind, arch=arch,
                                                        mig_profiles=_mig_counts(mig_profiles, json_)))
    except ValidationError as e:  # (a figure past 2^53, say: one line, not a traceback)
        first = e.errors()[0]
        flag = "--" + str(first["loc"][-1]).replace("_", "-") if first["loc"] else "host"
        fail("invalid_argument", f"{flag}: {first['msg']}", json_=json_, exit_code=2)
    with api_errors(json_), client() as c:
        if backend:
            host = c.hosts.register(req)
        else:  # seed 004's {name, addr} form: the backend is the one the agent runs
            body = req.model_dump(mode="json", exclude_none=True, exclude={"id", "url", "backend"})
            host = c.hosts.add(name, addr, **body)
    if json_:
        emit_json(host)
        return
    table(HOST_COLUMNS, _host_rows([host]))
    for w in host.warnings:
        typer.echo(f"warning: {w}")


@hosts_app.command("list")
def hosts_list(json_: bool = typer.Option(False, "--json")) -> None:
    """Every host with capacity and allocations."""
    with api_errors(json_), client() as c:
        hosts = c.hosts.list()
    emit_json(hosts) if json_ else table(HOST_COLUMNS, _host_rows(hosts))


@hosts_app.command("get")
def hosts_get(host_id: str, json_: bool = typer.Option(False, "--json")) -> None:
    """One host with capacity and allocations."""
    with api_errors(json_), client() as c:
        host = c.hosts.get(host_id)
    emit_json(host) if json_ else table(HOST_COLUMNS, _host_rows([host]))


def _host_action(verb: str, name: str, host_id: str, json_: bool, force: bool = False) -> None:
    """`client.hosts.<verb>` on ``host_id``; --json prints the API's answer (drain's report),
    or `{"id", "action", "ok": true}` for the calls that answer nothing (204)."""
    with api_errors(json_), client() as c:
        report = getattr(c.hosts, verb)(host_id, **({"force": True} if force else {}))
    if json_:
        emit_json(report if report is not None else {"id": host_id, "action": name, "ok": True})
    else:
        stuck = len(report["stuck"]) if verb == "drain" else 0
        # (a drain that left VMs behind said "drain done", then listed them and exited 1)
        typer.echo(f"host {host_id}: drain finished, {stuck} VM{'' if stuck == 1 else 's'} stuck" if stuck
                   else f"host {host_id}: {verb} done")
        if verb == "drain":
            for m in report["moved"]:
                typer.echo(f"  moved {m['vm']} to {m['to']} ({m['move']})")
            for s in report["stuck"]:
                typer.echo(f"  stuck {s['vm']}: {s['code']}: {s['reason']}")
            for f in report.get("finished") or []:
                typer.echo(f"  finished {f['vm']} ({f['state']}): nothing to move, it goes with the host")
            for vm in report.get("prewarmed") or []:
                typer.echo(f"  prewarmed {vm}: a standby VM, placed again elsewhere by its prewarm")
    if verb == "drain" and report["stuck"]:
        raise typer.Exit(1)


def _action(verb: str, name: str):
    """The `hosts NAME HOST` command (cordon, uncordon, drain: no --force, which only `hosts
    remove` takes; offered in their help, it was a TypeError traceback)."""
    def run(host_id: str, json_: bool = typer.Option(False, "--json")) -> None:
        _host_action(verb, name, host_id, json_)

    run.__name__ = f"hosts_{name}"
    run.__doc__ = {"cordon": "Stop new placements on a host.", "uncordon": "Resume placements (ends a drain).",
                   "drain": "Stop placements and move every VM away."}[verb]
    return run


for _verb, _name in (("cordon", "cordon"), ("uncordon", "uncordon"), ("drain", "drain")):
    hosts_app.command(_name)(_action(_verb, _name))


@hosts_app.command("remove")
def hosts_remove(host_id: str, json_: bool = typer.Option(False, "--json"),
                 force: bool = typer.Option(False, "--force", help=(
                     "The host's agent is gone for good: remove it with its VMs' records (each a vm_lost "
                     "event); refused while the agent answers."))) -> None:
    """Remove a host."""
    _host_action("deregister", "remove", host_id, json_, force)


@app.command()
def settings(cert: Optional[Path] = typer.Option(None, help="Client certificate (PEM) the controller presents to "
                                                 "mutual-TLS hosts; with --key and --ca."),
             key: Optional[Path] = typer.Option(None, help="Its private key (PEM)."),
             ca: Optional[Path] = typer.Option(None, help="The CA (PEM) the hosts' certificates are checked against."),
             placement: Optional[str] = typer.Option(None, help="Placement policy (best_fit)."),
             json_: bool = typer.Option(False, "--json")) -> None:
    """The controller's own settings (GET /v1/controller); with --cert/--key/--ca or --placement,
    replace them (PUT: the three files together, read by the controller, which must be able to
    read them; a certificate that does not load or is not valid now is 400, nothing changed)."""
    files = {"cert": cert, "key": key, "ca": ca}
    with api_errors(json_), client() as c:
        if any(v is not None for v in files.values()) or placement is not None:
            now = c.controller.get()
            if all(v is None for v in files.values()) and now.get("key_set"):
                # (a PUT replaces every setting, and the key's path is never shown: it would be dropped)
                fail("invalid_argument", "--placement alone would drop the controller's mutual-TLS identity: "
                     "give --cert, --key and --ca with it", json_=json_, exit_code=2)
            got = c.controller.configure(**{k: str(v.absolute()) if v is not None else None for k, v in files.items()},
                                         placement=placement or now.get("placement") or "best_fit")
        else:
            got = c.controller.get()
    if json_:
        emit_json(got)
        return
    table(["setting", "value"], [(k, "" if got.get(k) is None else got[k]) for k in sorted(got)])


def _mount_fleet() -> None:
    from . import fleet  # vms, events, usage, move, moves (it imports this module's client())
    fleet.mount(app)


_mount_fleet()

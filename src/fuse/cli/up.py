"""`fuse up`: the main job on one machine. Starts a controller (embedded
SQLite) and a local host agent, registers the host, builds the guest bundle,
places a VM through the controller and shows its console; then keeps
serving until Ctrl-C, when it removes the VM and stops both.

The VMs in the dir's agent are the run's own (it holds the dir's lock), whatever
their names: those an earlier run left (killed outright, its VM lives on and its
agent's next start adopts it) are deleted before the run creates its own, and at
the end every one is deleted through the agent, so none is left running or
recorded as running."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import typer

from .. import statelock
from ..agent.backends.base import hypervisors_naming

from .output import console, fail, table

ENTRY_START = "FUSE-ENTRY-START"  # what the guest's init prints before running the entry


def _spawn(args: list[str], log: Path) -> subprocess.Popen:
    parent = os.getpid()
    return subprocess.Popen([sys.executable, "-m", "fuse.cli", *args], stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=lambda: _die_with(parent))


def _die_with(parent: int) -> None:
    """In the child, before exec: SIGTERM when `fuse up` dies, however it dies. A run killed
    outright (SIGKILL, the OOM killer) had left its agent and controller serving on the
    dir's sockets, and every later run refused until they were stopped by hand; now they
    stop as on Ctrl-C (the VM stays, as VMs outlive their agent: the next run removes it)."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # (it died before the request took hold)
        os.kill(os.getpid(), signal.SIGTERM)


def _wait(pred, what: str, proc: subprocess.Popen, log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited: {log.read_text()[-2000:]}")
        try:
            if pred():
                return
        except Exception:
            pass
        time.sleep(0.1)
    raise SystemExit(f"{what} did not start in {timeout:.0f}s; see {log}")


def up(
    state_dir: Path = typer.Option(Path("fuse-state"), help="Where the controller, agent and bundles keep state."),
    entry: str = typer.Option("echo hello from a fuse VM; uname -sr; sleep 3600", help="The demo VM's command."),
    once: bool = typer.Option(False, help="Stop everything after showing the VM instead of serving."),
    vm_name: str = typer.Option("hello", help="The demo VM's name."),
    mem_mib: int = typer.Option(128), vcpus: int = typer.Option(1),
) -> None:
    """Run a controller with a local host agent and a VM, on this machine."""
    import httpx

    import fuse
    from ..envsettings import AGENT_MEGABYTES, AGENT_TIMINGS, CONTROLLER_TIMINGS, BadSetting, check_seconds
    try:  # (its agent's and controller's, said once here rather than as their start failing)
        check_seconds(AGENT_TIMINGS + CONTROLLER_TIMINGS, AGENT_MEGABYTES)
    except BadSetting as err:
        fail("invalid_argument", str(err), exit_code=2)
    from ..serving import socket_in_use
    from .host import default_state_dir  # noqa: F401  (documents the agent's own default)
    from .host import state_dir_problem

    state_dir = state_dir.resolve()
    # Ctrl-C's clean-up for SIGTERM too (`timeout N fuse up`, a service manager), from
    # the start: the agent, controller and QEMU run in their own sessions and would
    # outlive a plain kill.
    signal.signal(signal.SIGTERM, _interrupt)
    # One run per dir, before anything else: a second one would be answered by the first
    # one's sockets and its clean-up would remove the first one's VM.
    ctl_sock, agent_sock = state_dir / "run" / "controller.sock", state_dir / "run" / "agent.sock"
    try:  # (a path that cannot be a dir: one line, as the servers' --state-dir)
        if not statelock.hold(state_dir):
            raise SystemExit(f"error: fuse up is already running in {state_dir}")
        (state_dir / "run").mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        fail("io_error", state_dir_problem(state_dir, exc))
    for sock in (agent_sock, ctl_sock):
        if socket_in_use(sock):  # (an agent or controller of a run that was killed outright)
            raise SystemExit(f"error: {sock} is in use by a running process (left by an earlier fuse up?): "
                             "stop it first")
    agent_log, ctl_log = state_dir / "agent.log", state_dir / "controller.log"
    # The bundle first: it is the long step (a kernel download on first run), and the
    # agent then offers it from its first summary.
    from ..agent.bundle import build_bundle
    console.print("building the guest bundle (Debian kernel + busybox initramfs)...")
    b = build_bundle(state_dir / "agent", name="linux", progress=lambda msg: console.print(f"  {msg}"))
    console.print(f"bundle linux {b['fingerprint'][:16]}")
    procs: list[subprocess.Popen] = []
    client = None
    agent_ready = False  # then its VMs (all QEMUs under state_dir/agent/) are this run's to stop
    try:
        procs.append(agent := _spawn(["host", "serve", "--state-dir", str(state_dir / "agent"),
                                      "--socket", str(agent_sock)], agent_log))

        def ok(sock: Path, path: str) -> bool:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://x") as c:
                return c.get(path, timeout=2).status_code == 200
        _wait(lambda: ok(agent_sock, "/v1/host"), "host agent", agent, agent_log)
        agent_ready = True
        # Before the controller starts: it then adopts an agent with none of them, and
        # places on room they no longer hold.
        for problem in _remove_vms(agent_sock, "left by an earlier run"):
            console.print(f"warning: {problem}")
        procs.append(ctl := _spawn(["controller", "serve", "--state-dir", str(state_dir / "controller"),
                                    "--socket", str(ctl_sock)], ctl_log))
        _wait(lambda: ok(ctl_sock, "/v1/healthz"), "controller", ctl, ctl_log)
        console.print(f"controller on unix://{ctl_sock}, host agent on unix://{agent_sock}")
        client = fuse.Client(f"unix://{ctl_sock}")
        host = client.hosts.register(fuse.RegisterHostRequest(
            id="local", url=f"unix://{agent_sock}", backend="qemu", capacity=fuse.HostCapacity(vm_count=8)))
        for w in host.warnings:
            console.print(f"warning: {w}")
        # The controller places only on hosts its poller has read: wait for the first summary.
        _wait(lambda: client.hosts.get("local").connected, "host connection", ctl, ctl_log)
        from .controller import HOST_COLUMNS, _host_rows
        table(HOST_COLUMNS, _host_rows(client.hosts.list()), title="hosts")
        if hasattr(client, "vms"):
            _run_vm(client, vm_name, entry, vcpus, mem_mib)
        if once:
            return
        console.print("serving; Ctrl-C stops the VM, the agent and the controller")
        # Blocked, then waited for: SIGTERM as well as Ctrl-C runs the clean-up below.
        _block()
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        _block()  # a second Ctrl-C or SIGTERM does not cut the clean-up short
        if client is not None:
            if hasattr(client, "vms"):
                try:
                    client.vms.delete(vm_name)
                except Exception:
                    pass
            client.close()
        # VMs outlive their agent by design; `up` started them, so `up` makes sure none is
        # left: every VM of the agent (those made through the controller while it served
        # too) is deleted through it, which stops its QEMU and removes its record.
        # Only once its own agent answered: before, the dir's agent (and QEMUs) may be another's.
        if agent_ready and agent.poll() is None:
            try:  # (what the agent could not delete is killed below)
                for problem in _remove_vms(agent_sock, ""):
                    console.print(f"warning: {problem}")
            except Exception as exc:
                console.print(f"warning: the host agent did not remove its vms: {exc}")
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        if agent_ready:
            # What the agent did not stop (it died, or a delete failed) is killed; its record
            # still says running until the next run's agent finds it ended and that run
            # deletes it (above).
            killed = []
            # (this run's agent's: not another agent's whose dir's path ends with it, see hypervisors_naming)
            for pid in hypervisors_naming(state_dir / "agent" / "vms", ("qemu-system",)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            if killed:
                console.print(f"killed {len(killed)} QEMU process(es) the agent did not stop "
                              f"(pids {', '.join(map(str, killed))}); the next run in {state_dir} removes "
                              "their records")


def _interrupt(signum, frame) -> None:
    """SIGTERM handled as Ctrl-C: the same clean-up runs."""
    raise KeyboardInterrupt


def _block() -> None:
    """Hold SIGINT and SIGTERM back (pending, for `sigwait`) rather than handle them."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})


def _run_vm(client, name: str, entry: str, vcpus: int, mem_mib: int) -> None:
    import fuse
    # (a VM of that name an earlier run left is gone already: `_remove_vms`)
    try:
        vm = client.vms.create({"name": name, "shape": {"vcpus": vcpus, "mem_mib": mem_mib}, "entry": entry})
    except fuse.ApiError as err:
        reasons = err.details.get("hosts") or {}
        raise SystemExit(f"error: {err.code}: {err.message}" +
                         "".join(f"\n  {h}: {why}" for h, why in reasons.items())) from None
    console.print(f"vm {vm['name']} placed on {vm['host']}: {vm['state']}")
    # Show the console until the entry has printed and gone quiet for 2 s (or stopped).
    deadline, offset, seen, quiet_since = time.monotonic() + 120, 0, "", None
    while time.monotonic() < deadline:
        out = client.vms.console(name, offset=offset)
        text = out.get("text", "")
        seen += text
        offset = out.get("next_offset", offset)
        started = ENTRY_START in seen and seen.split(ENTRY_START, 1)[1].strip()
        if text or not started:
            quiet_since = time.monotonic()
        elif time.monotonic() - quiet_since > 2 or client.vms.get(name)["state"] != "running":
            break
        time.sleep(0.3)
    console.print("console:\n" + seen.strip())


def _remove_vms(agent_sock: Path, why: str) -> list[str]:
    """Delete every VM the dir's agent keeps, through the agent: its QEMU stops and its
    record and files go (a QEMU killed under the agent stayed recorded as running, and
    turned failed at its next start). The dir is this run's (its lock), and so is every
    VM in it, whatever its name. A VM a move holds is deleted with the move's id (one
    host: no move can still need it). ``why`` is said of each one removed, when given.
    Returns what could not be removed, one line each."""
    import httpx

    with httpx.Client(transport=httpx.HTTPTransport(uds=str(agent_sock)), base_url="http://agent") as c:
        resp = c.get("/v1/host/vms", timeout=10)
        if resp.status_code != 200:
            return [f"the host agent did not list its vms: {resp.status_code} {resp.text[:300]}"]
        problems = []
        for vm in resp.json()["vms"]:
            params = {"move_id": vm["move_id"]} if vm.get("move_id") else None
            # (as long as the controller's delete waits for the agent's)
            r = c.delete(f"/v1/host/vms/{quote(vm['name'], safe='')}", params=params, timeout=60)
            if r.status_code not in (204, 404):  # (404: gone meanwhile)
                problems.append(f"could not remove vm {vm['name']}: {r.status_code} {r.text[:300]}")
            elif why:
                console.print(f"removed vm {vm['name']} ({vm['state']}) {why}")
        return problems


def mount(app: typer.Typer) -> None:
    app.command("up")(up)

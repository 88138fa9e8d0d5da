"""The host agent's FastAPI app: the public host API."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import shutil
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Query, Request

from .. import http_errors
from ..models.errors import bearer_scheme, close_request_objects, document_400_not_422
from ..auth import BearerFirst
from ..controller.validation import install as install_validation
from ..controller.validation import LimitBody, RefuseBadPath, ServeHead, reject_unknown_query
from ..envsettings import seconds
from ..paths import private_dir, private_opener
from . import probe as probe_mod
from .bulk import FEATURE, BulkServer
from .incoming import MAX_CHUNK


@dataclass
class AgentConfig:
    state_dir: Path
    token: str | None = None
    backend: str = "qemu"
    max_vms: int | None = None
    reserve_mib: int = 256
    facts: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Absolute: QEMU runs daemonized (its working directory is /), and the paths
        # the agent hands it (state files to save and load) must still name this dir;
        # resolved: an agent started on it through a symlink finds its VMs' processes
        # (known by the paths in their command lines) as one started on the real path.
        self.state_dir = Path(self.state_dir).resolve()


# How long a registration's fresh probe may take before the answer goes with the facts
# probed at the agent's start (a controller waits 10 s for it; nvidia-smi alone can take
# seconds a call on a machine of many GPUs without its persistence daemon).
FRESH_PROBE_S = seconds("FUSE_FRESH_PROBE_S", 6.0)


async def fresh_probe(app: FastAPI) -> str:
    """Probe the machine again into the agent's facts, within ``FUSE_FRESH_PROBE_S``; "" when
    done, else a note saying which probe the facts are from. A probe that overruns still ends
    in the background and updates them then; one runs at a time (a second call waits on it).
    A vendor tool that fails or times out leaves its facts as they were (see `probe.probe`)."""
    cfg, vms = app.state.config, getattr(app.state, "vms", None)

    def apply(new: dict[str, Any]) -> None:
        for k in ("kvm", "kvm_device"):  # (what the backend settled on at start stands)
            new.pop(k, None)
        cfg.facts.update(new)
        app.state.probed_at = time.monotonic()
        if vms is not None:
            vms.ram_mb, vms.cpus = cfg.facts["ram_mb"], cfg.facts["cpus"]

    task = getattr(app.state, "fresh_probe", None)
    if task is None or task.done():
        task = app.state.fresh_probe = asyncio.ensure_future(
            asyncio.to_thread(probe_mod.probe, cfg.state_dir, dict(cfg.facts)))
        task.add_done_callback(lambda t: t.cancelled() or t.exception() is not None or apply(t.result()))

    def which() -> str:
        # (once an overrun probe has ended, the facts are no longer the start-up ones)
        probed_at = getattr(app.state, "probed_at", None)
        return ("the facts probed when the agent started" if probed_at is None else
                f"the facts of its last probe to finish, {time.monotonic() - probed_at:.0f} s ago")

    try:
        await asyncio.wait_for(asyncio.shield(task), FRESH_PROBE_S)
    except asyncio.TimeoutError:
        return (f"the fresh probe did not finish within {FRESH_PROBE_S:g} s (a slow nvidia-smi, qemu or firecracker "
                f"--version?): these are {which()}")
    except OSError as exc:
        if not probe_mod.transient(exc):
            raise
        # (an agent at its fd limit cannot read /proc now: the facts it has stand, as for a slow
        # probe, where a 500 failed the registration, review 37)
        return f"the fresh probe could not read the machine now ({exc.strerror or exc}): these are {which()}"
    return ""


def startup_problem(state_dir: Path, backend: str) -> tuple[str, str] | None:
    """Why an agent of ``backend`` cannot serve ``state_dir`` (an error code and a line), or
    None: its hypervisor (QEMU, Firecracker) is
    not installed, or the dir holds live VMs of another backend (serving them would find
    their processes gone and record them failed, then kill them as orphans)."""
    from .backends.qemu import qemu_missing

    if backend == "qemu" and (missing := qemu_missing()):
        return "io_error", missing
    others: dict[str, list[str]] = {}
    for path in sorted((state_dir / "vms").glob("*/vm.json")):
        try:
            vm = json.loads(path.read_text())
            theirs = (vm.get("platform") or {}).get("backend") or backend
            if vm.get("state") in ("creating", "running", "sleeping", "incoming") and theirs != backend:
                others.setdefault(str(theirs), []).append(str(vm.get("name")))
        except (OSError, ValueError, AttributeError):
            continue  # (a record the agent cannot read: kept aside by it, with an event, at its start)
    if others:
        theirs, names = next(iter(others.items()))
        return "invalid_argument", (f"state dir {state_dir} holds vms of the {theirs} backend ({', '.join(names[:5])}"
                f"{', ...' if len(names) > 5 else ''}): serve it with --backend {theirs}, "
                "or delete them with that backend first")
    if why := identity_problem(state_dir):
        return "io_error", why
    if backend == "firecracker" and shutil.which("firecracker") is None:
        # (it started and registered as an active host with no release, every VM then failing)
        return "io_error", ("firecracker is not on PATH: install a Firecracker release binary "
                            "(https://github.com/firecracker-microvm/firecracker/releases) as firecracker")
    return None


def identity_problem(state_dir: Path) -> str | None:
    """Why the agent must not take a new identity in ``state_dir``, or None: its ``agent-id``
    is missing or empty while the dir holds an agent's state (an event log with events, VMs).
    A new identity there would be another machine to the controller, which then reads the
    whole event log a second time and takes this agent's VMs for another's; a new state dir
    (or one whose first write of the file was torn, before anything else) gets one."""
    path = state_dir / "agent-id"
    try:
        if path.exists() and path.read_text().strip():
            return None
        log = state_dir / "events.jsonl"
        held = [what for what, there in (
            ("an event log", log.is_file() and log.stat().st_size > 0),
            ("VMs", (state_dir / "vms").is_dir() and any((state_dir / "vms").iterdir()))) if there]
    except OSError:
        return None  # (not readable: the agent's start says so in its own words)
    if not held:
        return None
    return (f"state dir {state_dir} holds an agent's state ({' and '.join(held)}) but its identity file {path} "
            f"is {'empty' if path.exists() else 'missing'}: restore it with the agent_id a controller lists for "
            f"this host (`fuse controller hosts list --json`), as `echo AGENT_ID > {path}` (on a machine copied "
            "from another, whose state is the other's, remove events.jsonl, events.jsonl.next and vms/ instead, "
            "to start as a new agent); a new identity taken here would be another machine to a controller, which "
            "would read this agent's events again")


def agent_id(state_dir: Path) -> str:
    """A stable identity for this agent, so a controller that reaches one
    machine under two names can tell (usage counts it once). A dir that holds an
    agent's state without one is refused before this (`identity_problem`)."""
    path = state_dir / "agent-id"
    if not path.exists() or not (ident := path.read_text().strip()):
        # (an empty one: torn by a crash as it was first written, so never handed out)
        tmp = path.with_suffix(".tmp")
        with open(tmp, "w", opener=private_opener) as f:  # owner-only, as every state file
            f.write(uuid.uuid4().hex + "\n")
        os.replace(tmp, path)
        ident = path.read_text().strip()
    return ident


def _vm_manager(cfg: AgentConfig):
    """The VM manager: it holds the live figures and runs the VMs."""
    from .vms import VmManager
    return VmManager(cfg.state_dir, backend=cfg.backend, ram_mb=cfg.facts["ram_mb"], cpus=cfg.facts["cpus"],
                     max_vms=cfg.max_vms, reserve_mib=cfg.reserve_mib)


def document_agent_errors(doc: dict[str, Any]) -> dict[str, Any]:
    """The agent's document as the agent answers (FastAPI's own says 422 with its
    ``detail`` list, which the agent never answers): a bad request is 400 with the error
    envelope, an unknown body field too, every route needs the token on TCP (401), a route
    naming a VM or an incoming move is 404 ``not_found`` when there is none, and one that
    changes something may be 409 (its code says why)."""
    doc = close_request_objects(document_400_not_422(doc))
    doc = bearer_scheme(doc, "The agent's token (`fuse host serve --token TOKEN`, or $FUSE_HOST_TOKEN): required "
                             "on its TCP listener by every route; requests over its owner-only unix socket need "
                             "none.", refused="over TCP, no `Authorization: Bearer <token>` or another token")
    envelope = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
    for path, ops in doc.get("paths", {}).items():
        for method, op in ops.items():
            rs = op.setdefault("responses", {})
            if "{" in path:
                rs.setdefault("404", {"description": "not_found: no such VM (or incoming move, or state file)",
                                      "content": envelope})
            if method in ("post", "put", "delete"):
                rs.setdefault("409", {"description": "conflict: the VM's state does not allow it (a sleep of a VM "
                                                     "not running, say); vm_exists: a create's name is taken; "
                                                     "host_full: admission refused (no room for it)",
                                      "content": envelope})
            elif "/files" in path and path.startswith("/v1/host/vms/"):
                rs.setdefault("409", {"description": "conflict: the VM is not sleeping (only a sleeping VM has "
                                                     "state files)", "content": envelope})
    return doc


def create_app(cfg: AgentConfig) -> FastAPI:
    private_dir(cfg.state_dir)  # the dirs made for it 0700, whatever the umask (README: owner-only)
    if not cfg.facts:
        cfg.facts = probe_mod.probe(cfg.state_dir)
    ident = agent_id(cfg.state_dir)
    # This process's own mark, new at each start: an agent-id file copied to another machine
    # (an image made after the agent ran) gives two agents one identity, and a controller that
    # finds that identity at two addresses tells one machine reached two ways (one instance)
    # from two machines by it.
    instance = secrets.token_hex(8)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        vms = _vm_manager(cfg)
        app.state.vms = vms
        app.state.events = getattr(vms, "events", None)
        if app.state.events is not None:  # (fuse.serving: a long poll answers at once on a stop)
            app.state.stopping = app.state.events.stop_waiting
        if vms is not None:
            await vms.start()
        try:
            yield
        finally:
            if vms is not None:
                await vms.close()

    # The OpenAPI document and docs page are our own routes below, so the
    # token every route needs guards them too (FastAPI's built-ins would be open).
    app = FastAPI(title="fuse host agent", version="0.1.0", lifespan=lifespan,
                  openapi_url=None, docs_url=None, redoc_url=None,
                  dependencies=[Depends(reject_unknown_query)])  # a parameter no route takes: 400
    # A path with an empty segment (`/v1/prewarms/` for an id of "") names nothing:
    # 404, not a redirect to the collection that a client would take for success.
    app.router.redirect_slashes = False
    http_errors.install(app)
    install_validation(app)  # after http_errors: a bad request is worded as the controller words it
    app.add_middleware(RefuseBadPath)  # (added first: the token is checked before it)
    # Bodies as the controller's: over 16 MiB is 413 unread; a move's raw file chunk may be 64 MiB.
    app.add_middleware(LimitBody, larger={r"/v1/host/incoming/[^/]+/files/[^/]+": MAX_CHUNK})
    app.add_middleware(BearerFirst, token=cfg.token)
    app.add_middleware(ServeHead)  # (last: HEAD wherever GET is, as the controller's)
    app.state.config = cfg
    app.state.bulk = BulkServer(lambda: getattr(app.state, "vms", None), cfg.token)

    @app.get("/v1/host", summary="Describe this host: probed hardware and live room.")
    async def get_host(request: Request, fresh: bool = Query(False, description=(
            "Probe the hardware again first (CPUs, RAM, GPUs and MIG, the Firecracker release), as a "
            "registration asks: the facts read at the agent's start may be stale."))) -> dict[str, Any]:
        vms = getattr(request.app.state, "vms", None)
        note = await fresh_probe(request.app) if fresh else ""
        facts = dict(cfg.facts)
        facts["storage_gb"] = probe_mod.storage_gb(cfg.state_dir)
        # (the VM manager's figures when there is one: /proc/meminfo read here as well, only to be
        # replaced, made every summary of an agent at its fd limit a 500, review 37)
        live = vms.summary() if vms is not None else {
            "free_vcpus": facts["cpus"], "free_mem_mib": max(0, probe_mod.mem_available_mb() - cfg.reserve_mib),
            "vm_count": 0, "memory_pressure": False, "bundles": []}
        return {"agent_id": ident, "instance": instance, "backend": cfg.backend, "features": [FEATURE],
                "platform": f"linux/{facts['arch']}/{cfg.backend}",
                "max_vms": cfg.max_vms, **facts, **live, **({"probe_note": note} if note else {})}

    plain_openapi = app.openapi

    def documented() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = document_agent_errors(plain_openapi())
        return app.openapi_schema

    app.openapi = documented  # type: ignore[method-assign]

    @app.get("/openapi.json", include_in_schema=False)
    async def openapi() -> dict[str, Any]:
        return app.openapi()

    @app.get("/docs", include_in_schema=False)
    async def docs():
        from fastapi.openapi.docs import get_swagger_ui_html
        return get_swagger_ui_html(openapi_url="/openapi.json", title="fuse host agent")

    from .api.vms import router as vms_router
    app.include_router(vms_router)
    return app

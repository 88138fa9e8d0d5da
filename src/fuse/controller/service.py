"""The controller's services, wired once and shared by the routes."""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import sys
import time
from pathlib import Path
from typing import Any

from ..errors import Conflict, HostUnreachable
from ..paths import private_dir
from ..transport import TlsSettings
from .hosts import HostRegistry, machine_names
from .pool.elastic_host import committed_until
from .store import Store, engine_url

log = logging.getLogger("fuse.controller.moves")

WINDOWS_PIPE = r"\\.\pipe\fuse-controller"
LAST_READ_S = 2.0  # a deregister reads the host's events once more, for at most this long
LAST_READ_ALL_S = 10.0  # ... and on, a page a poll, while there are more (a backlog), at most this long in all


def default_controller_socket() -> Path:
    r"""The controller's owner-only address (seed 004). Linux:
    /run/fuse-controller.sock for root, else $XDG_RUNTIME_DIR/fuse-controller.sock
    (or a per-user directory under /tmp). macOS: a per-user file,
    ~/.fuse/fuse-controller.sock (there is no XDG runtime dir, and $TMPDIR is
    swept of old files under a long-running controller). Windows: the named
    pipe \\.\pipe\fuse-controller. Only the Unix branch asks os.geteuid,
    which Windows lacks."""
    if sys.platform == "win32":
        return Path(WINDOWS_PIPE)
    if sys.platform == "darwin":
        return Path.home() / ".fuse" / "fuse-controller.sock"
    if os.geteuid() == 0:
        return Path("/run/fuse-controller.sock")
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    return Path(runtime) / "fuse-controller.sock" if runtime else Path(f"/tmp/fuse-{os.getuid()}/fuse-controller.sock")


class Controller:
    def __init__(self, state_dir: Path, db: str | None = None, token: str | None = None,
                 poll_interval: float = 1.0):
        self.state_dir = Path(state_dir)
        # owner-only: the database under it holds agent tokens (an existing dir is left as is)
        private_dir(self.state_dir)
        self.store = Store(engine_url(db, self.state_dir))
        self.instance = secrets.token_hex(6)  # this run of this replica (owns the moves it drives)
        self.token = token
        self.poll_interval = poll_interval
        self.fleet = None  # the pollers, once started (fuse.controller.fleet)
        self._strays: set[asyncio.Task] = set()  # settling what old moves left on a host registered again
        # a create waiting on a host's answer ties the host as an assigned VM does, and so
        # does one it did not answer until it says whether the VM landed: the registry
        # refuses to deregister it or re-point it meanwhile
        self.hosts = HostRegistry(self.store, tls=self.tls_settings, live=self._live,
                                  placing=lambda host_id: self.vms.placing_on(host_id),
                                  placing_names=lambda host_id: self.vms.placing_names(host_id))
        from .events import EventService
        from .usage import UsageService
        from .vms import VmService
        from .moves import MoveService
        self.vms = VmService(self)
        self.moves = MoveService(self)
        self.events = EventService(self)
        self.usage = UsageService(self)
        from .pool.elastic import ElasticPool
        from .pool.prewarm import PrewarmService
        self.pool = ElasticPool(self)
        self.prewarm = PrewarmService(self)

    async def pool_tick(self) -> None:
        """Each pass of the elastic pool's loop: refill the prewarms (and end expired ones)."""
        await self.prewarm.fill()

    # ---- controller settings (PUT /v1/controller) ---------------------------
    def settings(self) -> dict[str, Any]:
        return self.store.get_setting("controller", {"placement": "best_fit"})

    def tls_settings(self) -> TlsSettings | None:
        s = self.settings()
        if s.get("cert") and s.get("key") and s.get("ca"):
            return TlsSettings(cert=s["cert"], key=s["key"], ca=s["ca"])
        return None

    def _live(self, host_id: str) -> dict[str, Any]:
        return self.fleet.live(host_id) if self.fleet is not None else {}

    async def start(self) -> None:
        from .fleet import Fleet
        self.fleet = Fleet(self)
        await self.fleet.start()
        self.vms.start()  # (the creates the store records as unanswered: held, their hosts asked)
        await self.moves.resume()
        await self.pool.start()

    async def close(self) -> None:
        await self.pool.close()
        await self.moves.close()
        await self.vms.close()
        if self.fleet is not None:
            await self.fleet.close()
        self.store.close()

    def pool_snapshot(self) -> list[dict[str, Any]]:
        """The operator's own hosts with their free room, for the planner
        (own devices cost nothing; only active, connected hosts take work).
        ``free_vm_slots``: VMs its vm_count policy still admits (the policy less
        the VMs on it and those being placed). Own devices have no machine type.
        A host scale-in cordoned (``scaler_cordoned``: not an operator's cordon, nor
        its TTL's) is a running host with room, as it is for a create, which
        uncordons it before anything is bought: placed work uncordons it.
        Machines bought and not joined yet come last (``_joining_hosts``)."""
        from .pool.reconcile import scaler_cordoned
        fleet, reasons = self.vms.arrays()
        elastic = self.pool.live_rows()
        now = time.time()
        reopens = scaler_cordoned(self.pool, now)
        rows = {r["id"]: r for r in self.store.list_hosts()}
        # one machine registered under several names (one agent) is one room: it is offered
        # once, under its first name that takes work (else its first), not once per name
        machines = machine_names(list(rows.values()))
        index = {h: i for i, h in enumerate(fleet.ids)}

        def offered(host_id: str) -> str:
            names = sorted(h for h in machines.get(host_id, [host_id]) if h in index)
            return next((h for h in names if fleet.usable[index[h]]), names[0] if names else host_id)

        out = []
        for i, host_id in enumerate(fleet.ids):
            if offered(host_id) != host_id:
                continue
            row = rows.get(host_id) or {}
            cap = row.get("capacity", {})
            view = self.fleet.views.get(host_id) if self.fleet else None
            e = elastic.get(host_id)
            # only its cordon keeps it out: connected, not under memory pressure
            reopen = (not fleet.usable[i] and host_id in reopens and view is not None and view.connected
                      and not view.summary.get("memory_pressure"))
            cloud = {} if e is None else {
                "own": False, "provider": e["provider"], "type_name": e["type_name"],
                "usd_per_hour": e["usd_per_hour"], "billing_step_secs": e["billing_step_secs"],
                # work there costs nothing more until the host's committed end (a
                # hand-added host runs to its TTL whatever it holds): then it is chosen
                # before a new machine, as the seed's order says
                "paid_secs_left": max(0, int(committed_until(e, now) - now)), "scaler_cordoned": reopen}
            out.append({"name": host_id, "cpus": int(fleet.cap_vcpus[i]), "mem_mib": int(fleet.cap_mem[i]),
                        "free_vcpus": max(0, int(fleet.free_vcpus[i])), "free_mem_mib": max(0, int(fleet.free_mem[i])),
                        "free_vm_slots": max(0, int(fleet.vm_limit[i]) - int(fleet.vm_count[i])),
                        "arch": cap.get("arch", "amd64") or "amd64",
                        "kvm": self._runs_kvm_kinds(row, view, e),
                        "own": True,
                        # the guest bundles (images) it has, when its agent said: only those run there
                        "bundles": ([b.get("name") for b in view.summary.get("bundles") or [] if isinstance(b, dict)]
                                    if view is not None and "bundles" in view.summary else None),
                        "region": row.get("region", "") or "", "type_name": "",
                        "state": (row.get("state", "active") if fleet.usable[i] else
                                  "active" if reopen else "unavailable")} | cloud)
        return out + self._joining_hosts(set(fleet.ids), now)

    def _joining_hosts(self, registered: set[str], now: float) -> list[dict[str, Any]]:
        """Cloud machines bought and not joined yet (``creating``, ``booting``): already paid
        for, so hosts with room for the plans (seed 001: hosts with room before new machines),
        a plan no longer buys another beside one that boots. Each has its type's room and
        nothing used (its type's size, its cloud's vm_count policy and images, KVM as its
        cloud says of the type), is not own, and is paid until its committed end, less the
        rest of its boot time, when nothing can run there yet: work there ends that much
        later. ``joins_in_secs``: that rest (at least 1: it is not ready now), which the plan's
        ``ready_in_secs`` counts and a create on it waits for (``ElasticPool.host_for``).
        The paid time is counted from the join itself (its committed end less started + boot,
        whole seconds both: the model's are), not from now less a rounded-up rest: truncating
        the one and rounding the other up lost a second, so work ending at the paid end was
        billed one more step there and a plan bought a machine beside it."""
        import math

        from ..errors import FuseError
        out = []
        for r in self.pool.rows():
            if r["state"] not in ("creating", "booting") or r["name"] in registered:
                continue  # (a machine registering as its join completes is a host already)
            try:
                provider = self.pool.provider(r["provider"])
                offer = provider.offer(r["type_name"], r["region"])
                slots = int(provider.capacity(r["type_name"])["vm_count"])
                images = sorted(provider.images())
            except FuseError:  # (its cloud no longer offers the type: no room to promise)
                continue
            joined = max(r["started"] + r["boot_secs"], now + 1)  # (at least 1 s on: it is not ready now)
            joins = math.ceil(joined - now - 1e-6)
            # (1e-6: started + 3600 less started + 600 in floats is 2999.9999998 at today's epoch)
            paid = max(0, math.floor(committed_until(r, now) - joined + 1e-6))
            out.append({"name": r["name"], "cpus": offer.vcpus, "mem_mib": offer.mem_mib,
                        "free_vcpus": offer.vcpus, "free_mem_mib": offer.mem_mib, "free_vm_slots": slots,
                        "arch": offer.arch, "kvm": offer.kvm, "own": False, "bundles": images,
                        "region": r["region"], "type_name": r["type_name"], "provider": r["provider"],
                        "usd_per_hour": r["usd_per_hour"], "billing_step_secs": r["billing_step_secs"],
                        "paid_secs_left": paid,
                        "scaler_cordoned": False, "state": r["state"], "joins_in_secs": joins})
        return out

    def _runs_kvm_kinds(self, row: dict, view, e: dict | None) -> bool:
        """May the plan put work whose kind needs KVM (``microvm``) on this host? Its agent
        says it has KVM; or it is one of the operator's own qemu hosts (TCG runs every
        kind there, slower); or, bought from a cloud, its type is one the cloud says runs
        VMs (metal: a non-metal type hosts container work only, whatever backend its agent
        runs)."""
        if view is not None and view.summary.get("kvm"):
            return True
        if e is None:
            return row.get("backend") == "qemu"
        from ..errors import FuseError
        try:
            return self.pool.provider(e["provider"]).offer(e["type_name"], e["region"]).kvm
        except FuseError:  # (the cloud was unlinked, or no longer offers the type: its word is gone)
            return False

    async def register_host(self, req, backend_from_probe: bool = False):
        """Register, then poll the host at once so it is connected (and its
        VMs adopted) when the reply goes out. The reply is the host as this
        request wrote it (`HostRegistry.register`), never a concurrent one's."""
        async def poll(host_id: str) -> None:
            if self.fleet is None:
                return
            try:
                await self.fleet.refresh(host_id)
            except Exception:  # unreachable now: the poller keeps trying
                return
            self._settle_strays(host_id)

        return await self.hosts.register(req, backend_from_probe, then=poll)

    def _settle_strays(self, host_id: str) -> None:
        """What moves settled while ``host_id``'s agent was away for good (removed with force)
        left there, settled in the background: a registration's reply does not wait on it. A
        failure (the store away, say) is one line in the log; the next registration asks again."""
        async def settle() -> None:
            try:
                await self.moves.settle_strays(host_id)
            except Exception as exc:
                log.warning("what old moves left on host %s is not settled now (the next registration "
                            "of it asks again): %s", host_id, str(exc).splitlines()[0] if str(exc) else repr(exc))

        task = asyncio.get_running_loop().create_task(settle())
        self._strays.add(task)
        task.add_done_callback(self._strays.discard)

    async def deregister_host(self, host_id: str, force: bool = False) -> None:
        """Remove the host (``HostRegistry.deregister``). ``force``: a host whose agent is
        gone for good, its VMs' records dropped with it (each a ``vm_lost`` event); refused
        (409 conflict) while the agent answers, where they can be deleted or drained."""
        answers = ""
        if self.fleet is not None and host_id in self.fleet.views:
            # its events up to now join the stream first: once it is removed nothing reads them
            # (best effort, bounded: a host that does not answer is removed all the same)
            failed = False
            try:
                await self.fleet.read_out(host_id, LAST_READ_S, LAST_READ_ALL_S)
                answers = "its agent answers"
            except HostUnreachable as exc:
                if exc.code == "unauthorized":
                    answers = "its agent answers (it refuses the controller's token)"
                failed = True  # (refused, reset: not there now)
            except Exception:
                pass
            if force and not answers and not failed and self.fleet.views[host_id].connected:
                # (the read ran out of time: a busy agent that answered a moment ago is not gone)
                answers = "its agent answered within the last seconds"
        elif force and self.store.get_host(host_id) is not None:
            answers = "its agent has not been polled yet"
        if force and answers:
            raise Conflict(f"host {host_id} cannot be removed with force: {answers}; force is for a host "
                           "whose agent is gone for good: delete or drain its VMs instead")
        if force and self.store.get_host(host_id) is not None:
            # the moves that need it are settled first, as if it held nothing (its copies
            # went with it): a VM asleep on a live source for a move to it wakes there
            self.vms.forget_unanswered(host_id)  # (creates it never answered: they cannot land now)
            async with self.moves.forgetting(host_id):
                self.hosts.deregister(host_id, force=True)
        else:
            self.hosts.deregister(host_id, force=force)
        if self.fleet is not None:
            await self.fleet.sync_hosts()

    async def drain(self, host_id: str) -> dict[str, Any]:
        """Stop placements on the host and move every VM away (the moves
        service does the moving once present). The host stays ``draining``
        until an uncordon or its deregistration, and a controller that starts
        resumes the drain of every draining host (`MoveService.drain`)."""
        self.hosts.set_state(host_id, "draining")
        return await self.moves.drain(host_id)

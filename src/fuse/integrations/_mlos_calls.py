"""The fuse controller calls behind `FuseVMService`'s operations.

`ControllerCalls` is what an operation does at the controller: converge a VM
to a trial's spec (create, wake, move asleep, or delete and recreate it),
remove it, or sleep it, each once any move of the VM has ended, plus the
bounded reads (`lookup`, `moving`) that the service's own waits share. It
lives apart from the mlos_bench service so that the seed 002 surface
(statuses, handles, waits) and the fleet mechanics (moves, sleeping VMs,
ambiguous names) can be read and changed one at a time; nothing here needs
mlos_bench.

Steps run on the service's worker thread. Each checks its `Operation` before
a call (stopping at the deadline or an abandon) and marks `op.sent` before a
call that changes the VM, since such a call goes on at the controller even
if the service stops waiting for it. Reads are cut short at a deadline;
calls that change a VM never are.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any, Callable, Iterable

import httpx
from pydantic import ValidationError

import fuse
from fuse.client._core import Call
from fuse.client.hosts import HostsAPI
from fuse.client.moves import MovesAPI
from fuse.client.vms import VmsAPI
from fuse.models.hosts import Host
from fuse.models.vm import MAX_ENTRY_BYTES, CreateVmRequest

from ._mlos_operations import Operation, OperationFailed, OperationTimedOut
from ._mlos_params import VmSpec

# The service's logger, not this module's: its log lines are one stream that
# users filter on "fuse.integrations.mlos", wherever in the code they start.
_LOG = logging.getLogger("fuse.integrations.mlos")

_GONE_STATES = ("exited", "failed", "deleted")
_MOVE_ENDS = ("done", "failed")
_PASSING_STATES = ("creating", "incoming")  # a VM leaves these by itself


def controller_away(err: fuse.ApiError) -> bool:
    """The controller gave no answer (not running, restarting, hung) or said its store is
    away (503 db_unavailable): what comes back by itself, so an operation or a watch tries
    again within pollTimeout instead of failing the trial."""
    return err.code == "unreachable" or (err.status == 503 and err.code == "db_unavailable")


def _machines(hosts: Iterable[Host]) -> dict[str, list[str]]:
    """Host id -> every name its machine is registered under (itself included): the hosts
    whose records carry one agent identity, as the controller groups them for placement
    (`fuse.controller.hosts.machine_names`, which is not imported here: it would load the
    controller's store into an mlos_bench process)."""
    by_agent: dict[str, list[str]] = {}
    for h in hosts:
        if h.agent_id:
            by_agent.setdefault(h.agent_id, []).append(h.id)
    return {h.id: by_agent[h.agent_id] if h.agent_id else [h.id] for h in hosts}


def _passed_by(h: Host, hosts: dict[str, Host], machines: dict[str, list[str]], bundle: str) -> str | None:
    """Why the controller's placement passes host `h` by for a VM of guest bundle `bundle`
    (None: it weighs the host's room), by its own rules in its own order
    (`VmService.arrays`): a host not active; one machine cordoned or draining under any of
    its names, which takes no work under the others; not answering; under memory pressure
    (its agent says so, whatever room its figures show); without the bundle. A host record
    lists its agent's bundles as `[]` both when the agent has none and when it never said
    (an agent older than bundles); agents list them with every summary, so `[]` is read as
    none, as placement reads it: at worst a provision is FAILED with its VM kept."""
    if h.state != "active":
        return f"is {h.state}"
    alias = next((n for n in machines.get(h.id, [h.id]) if n in hosts and hosts[n].state != "active"), None)
    if alias is not None:
        return f"is {hosts[alias].state} as {alias} (the same machine, registered under another id)"
    if not h.connected:
        return "is not answering"
    if h.memory_pressure:
        return "is under memory pressure"
    if bundle not in {b.get("name") for b in h.bundles}:
        return f"has no bundle {bundle}"
    return None


def _reason(err: fuse.ApiError) -> str:
    """The controller's refusal in one line, with each host's reason when it gave them."""
    hosts = err.details.get("hosts")
    return f"{err.code}: {err.message}" + (f" (hosts: {hosts})" if hosts else "")


class ControllerCalls:
    """The controller calls one `FuseVMService` makes, on its client.

    `client` is the service's (built on first use, dropped at its exit), so
    it is asked for on each call rather than held. The times are the
    service config's pollInterval, pollTimeout and requestTimeout."""

    def __init__(self, client: Callable[[], fuse.Client], poll_interval: float, poll_timeout: float,
                 request_timeout: float):
        self._client = client
        self._poll_interval, self._poll_timeout, self._request_timeout = poll_interval, poll_timeout, request_timeout
        self.reached = False  # the controller has answered this service once: it exists at its url

    def away(self, err: fuse.ApiError) -> bool:
        """`controller_away`, once the controller has answered this service: a url where
        none ever answered is a mistake to say at once, not a restart to wait out."""
        return self.reached and controller_away(err)

    @property
    def client(self) -> fuse.Client:
        return self._client()

    # ---- reads (bounded by a deadline) ---------------------------------------
    def _reads(self, until: float) -> tuple[VmsAPI, MovesAPI, HostsAPI]:
        """The client's vms, moves and hosts, for reads whose answer must come by
        `until` (an operation's or a wait's deadline): a controller that hangs
        ends them there as OperationTimedOut, not requestTimeout later. Only
        reads: a call that changes a VM is never cut short by the deadline,
        since it would go on at the controller while the next operation acts."""

        def send(call: Call) -> Any:
            left = until - time.monotonic()
            if left <= 0:
                raise OperationTimedOut(f"no time left for {call.method} {call.path} before pollTimeout")
            limit = call.timeout if call.timeout is not None else self._request_timeout
            try:
                answer = self.client._send(replace(call, timeout=min(limit, left)))
                self.reached = True
                return answer
            except fuse.ApiError as err:
                if err.status:  # (an answer, though a refusal)
                    self.reached = True
                if left < limit and isinstance(err.__cause__, httpx.TimeoutException):
                    raise OperationTimedOut(f"the controller did not answer {call.method} {call.path} "
                                            f"within pollTimeout ({self._poll_timeout:g} s)") from err
                raise

        return VmsAPI(send), MovesAPI(send), HostsAPI(send)

    def _find(self, name: str, host: str | None, until: float) -> dict | None:
        """The VM `name` on `host` (None: wherever it is), None if there is none. A VM the
        controller has not recorded yet while a create of it waits on its host (or went
        unanswered: the host may still make it) is not none: it is `creating` there
        (`being_created`), and waited for like one."""
        try:
            return self._reads(until)[0].get(name, host=host)
        except fuse.ApiError as err:
            if err.code == "not_found":
                return None
            if err.code == "conflict" and err.details.get("being_created"):
                return {"name": name, "host": err.details.get("host") or host or "", "state": "creating",
                        "being_created": True}
            raise

    def lookup(self, name: str, host: str | None, until: float) -> dict | None:
        """The VM named `name`, looked up fleet-wide: the service keeps one VM
        per name, and a trial that changes vmHost must find the previous
        trial's VM on its old host (to replace it there), not miss it and
        leave it running. vmHost only picks one when the name is on several
        (none of them there: still ambiguous, never a third copy)."""
        try:
            return self._find(name, None, until)
        except fuse.ApiError as err:
            if err.code != "ambiguous_vm" or not host:
                raise
            vm = self._find(name, host, until)
            if vm is None:
                raise
            return vm

    def moving(self, name: str, until: float) -> bool:
        """A move of the VM is under way at the controller (it sleeps the VM
        on its way to another host, then wakes it there)."""
        return any(m.get("vm") == name and m.get("state") not in _MOVE_ENDS for m in self._reads(until)[1].list())

    def on_machine(self, host: str | None, vm: dict, until: float) -> bool:
        """The VM is where vmHost `host` asks (None: anywhere): on `host`, or on
        the same machine registered under another id (one agent identity, as
        the controller groups a machine's names). The controller counts it as
        there already (a move to `host` is 409 same_host, a create there 409
        vm_exists), so it is neither moved nor recreated for that: a sleeping
        one was FAILED on every provision, a running one restarted for
        nothing."""
        if not host or host == vm.get("host"):
            return True
        hosts = self._reads(until)[2]
        try:
            asked, its = hosts.get(host), hosts.get(vm["host"])
        except fuse.ApiError as err:
            if err.code == "not_found":
                return False  # (vmHost not registered: the recreate check says so)
            raise
        return bool(asked.agent_id) and asked.agent_id == its.agent_id

    def changes(self, spec: VmSpec, vm: dict, until: float) -> list[str]:
        """What about `vm` the trial's `spec` would change (`VmSpec.differs`);
        its host only when vmHost names another machine than the VM's."""
        return spec.differs(vm, host=not self.on_machine(spec.host, vm, until))

    def _settle(self, op: Operation, name: str, host: str | None, passing: bool = True) -> dict | None:
        """The VM once nothing else is changing it: no move of it under way
        and (with `passing`) out of a passing state (creating, incoming). A
        move holds the VM until it is done or home again; waking, deleting or
        recreating it meanwhile could lose it or leave it on two hosts."""
        op.check(f"looking up vm {name}")
        while True:
            # Moves first: a move that ends after this look shows in the VM found next.
            moving = self.moving(name, op.deadline)
            vm = self.lookup(name, host, op.deadline)
            if vm is not None:
                op.host = vm["host"]
            # (a create still in flight is waited out even by a delete: there is nothing to delete yet)
            if not moving and (vm is None or (not passing and not vm.get("being_created"))
                               or vm["state"] not in _PASSING_STATES):
                return vm
            op.pause(self._poll_interval)
            op.check(f"waiting for a move of vm {name} to end" if moving
                     else f"waiting for vm {name} to leave {vm['state']}")

    def _outwaiting_moves(self, op: Operation, name: str, host: str | None,
                          act: Callable[[dict | None], dict], passing: bool = True) -> dict:
        """`act` on the settled VM; when the controller answers that a move
        holds it (409 move_in_progress: one started since the look), wait for
        the move to end and act again on the VM as it is then. A controller
        that does not answer (a restart) is asked again, from a fresh look at
        the VM, until the deadline: every step converges from what it finds
        (a create that landed is found, one still in flight is waited for)."""
        while True:
            try:
                vm = self._settle(op, name, host, passing)
                return act(vm)
            except fuse.ApiError as err:
                if err.code == "move_in_progress":
                    _LOG.info("fuse: vm %s is held by a move (%s); waiting for it to end", name, err.message)
                elif self.away(err):
                    _LOG.info("fuse: the controller did not answer (%s); asking again within pollTimeout",
                              err.message)
                    op.pause(max(self._poll_interval, 0.5))
                    op.check(f"asking the controller again about vm {name}")
                    continue
                else:
                    raise
            op.pause(self._poll_interval)

    # ---- operations (on the worker thread) -----------------------------------
    def converge(self, op: Operation, spec: VmSpec) -> dict:
        """Make the VM `spec` names exist, running, with its shape (on
        spec.host when the trial pins one), once any move of it has ended."""
        return self._outwaiting_moves(op, spec.name, spec.host, lambda vm: self._converge_vm(op, spec, vm))

    def _converge_vm(self, op: Operation, spec: VmSpec, vm: dict | None) -> dict:
        if vm is not None:
            here = self.on_machine(spec.host, vm, op.deadline)
            changes = spec.differs(vm, host=not here)
            if vm["state"] == "sleeping" and not spec.differs(vm, host=False):
                # Asleep with the trial's shape: wake it, wherever that takes,
                # or fail keeping it: deleting it would lose its saved state.
                vm, changes = self._wake(op, spec, vm, here), []
            elif vm["state"] in _GONE_STATES:
                changes = [f"state {vm['state']}"]
            if changes:
                if vm["state"] not in _GONE_STATES:
                    why = self._no_room(op, spec, vm)
                    if why:  # the recreate would fail: the VM the last trial left is worth more
                        raise OperationFailed(f"vm {spec.name} is kept {vm['state']} on {vm['host']}, not "
                                              f"recreated ({'; '.join(changes)}): {why}")
                _LOG.info("fuse: recreating vm %s on %s: %s", spec.name, vm["host"], "; ".join(changes))
                op.check(f"deleting vm {spec.name} on {vm['host']} to recreate it")
                op.sent = True
                self._delete(spec.name, vm["host"])
                vm = None
        if vm is None:
            op.check(f"creating vm {spec.name}")
            op.sent = True
            vm = self.client.vms.create(spec.body())
            _LOG.info("fuse: created vm %s (%d vCPUs, %d MiB) on %s", spec.name, spec.vcpus, spec.mem_mib,
                      vm["host"])
        op.host = vm["host"]
        if vm["state"] != "running":
            raise OperationFailed(f"vm {spec.name} is {vm['state']} on {vm['host']}: {vm.get('reason') or ''}")
        return vm

    def _no_room(self, op: Operation, spec: VmSpec, vm: dict) -> str | None:
        """Why the recreated VM could not be created, read before the old one
        is deleted (None: it could). The new VM must be one the controller
        takes (its shape within the bounds and above the memory floor, its
        entry short enough: the create's own rules, checked here), and the
        controller's host records decide where: the pinned host must be
        registered and, like every candidate, one placement does not pass by
        (`_passed_by`: active under each of its machine's names, answering,
        not under memory pressure, with the trial's bundle); some candidate
        must have a VM slot under its vm_count policy and the memory (the
        hosts' hard limit; vCPUs are time-shared), counting what the old VM
        frees on its own machine, or a prewarmed VM of the new shape and
        bundle to take over. The host's admission still has the final word on
        the create itself."""
        body = {k: v for k, v in spec.body().items() if k != "host"}
        try:
            CreateVmRequest.model_validate(body)
        except ValidationError as exc:
            first = exc.errors()[0]
            return f"the controller would refuse the new vm ({'.'.join(map(str, first['loc']))}: {first['msg']})"
        if len(body["entry"].encode()) > MAX_ENTRY_BYTES:
            return f"the controller would refuse the new vm (entry is longer than {MAX_ENTRY_BYTES} bytes)"
        op.check(f"reading the hosts before recreating vm {spec.name}")
        hosts = {h.id: h for h in self.client.hosts.list()}
        machines = _machines(hosts.values())
        bundle = body.get("bundle") or "linux"
        if spec.host:
            if spec.host not in hosts:
                return f"vmHost {spec.host!r} is not a registered host"
            why = _passed_by(hosts[spec.host], hosts, machines, bundle)
            if why == f"has no bundle {bundle}":
                return f"bundle {bundle} is on no vmHost {spec.host}"
            if why:
                return f"vmHost {spec.host} {why}"
            cands = [hosts[spec.host]]
        else:
            passed = {h.id: _passed_by(h, hosts, machines, bundle) for h in hosts.values()}
            cands = [h for h in hosts.values() if passed[h.id] is None]
            if not cands:
                # (the bundle is the last rule: a host passed by for it passed every other one)
                lead = (f"bundle {bundle} is on no active host that placement may use"
                        if f"has no bundle {bundle}" in passed.values() else "no host takes new VMs now")
                said = [f"{h} {why}" for h, why in sorted(passed.items())[:5]]
                more = f"; {len(passed) - 5} more" if len(passed) > 5 else ""
                return f"{lead} ({'; '.join(said)}{more})" if said else "no host is registered"

        # A prewarmed VM of the new shape on a host is taken over by the create there: it needs
        # no room (a trial on a prewarmed shape was FAILED "at its vm_count policy" on a full
        # host whose standby VM the controller's own create would claim at once)
        op.check(f"reading the prewarmed vms before recreating vm {spec.name}")
        prewarmed = {v["host"] for v in self.client.vms.list()
                     if v.get("standby") and v.get("state") == "running"
                     and (v.get("shape") or {}).get("vcpus") == spec.vcpus
                     and (v.get("shape") or {}).get("mem_mib") == spec.mem_mib
                     and (v.get("bundle") or "linux") == bundle}
        if any(h.id in prewarmed for h in cands):
            return None

        def own(h) -> bool:
            # the old VM frees its room on its machine, under whichever of the machine's names
            # the new one asks for (a sleeping VM holds no slot and no memory)
            return vm["host"] in machines.get(h.id, [h.id]) and vm["state"] == "running"

        def slots_left(h) -> int:
            # the controller's own count: the machine's VMs under all its names, within its
            # agent's --max-vms too (the host's allocated alone counted neither)
            free = (h.capacity.vm_count - h.allocated.vm_count if h.free_vm_slots is None  # (an older controller)
                    else h.free_vm_slots)
            return free + (1 if own(h) else 0)

        cands = [h for h in cands if slots_left(h) > 0]
        if not cands:
            return (f"vmHost {spec.host} is at its VM limit (vm_count policy {hosts[spec.host].capacity.vm_count} "
                    "VMs, its agent's own --max-vms, the machine's VMs under each of its names counted)"
                    if spec.host else "every host with the bundle is at its VM limit (vm_count policy or its "
                                      "agent's own --max-vms)")

        def free_mem(h) -> int:
            return h.free_mem_mib + (int((vm.get("shape") or {}).get("mem_mib") or 0) if own(h) else 0)

        most = max(cands, key=free_mem)
        if free_mem(most) < spec.mem_mib:
            return (f"{spec.mem_mib} MiB asked, at most {free_mem(most)} MiB free "
                    f"({'on ' + spec.host if spec.host else 'on any host, on ' + most.id})")
        return None

    def _wake(self, op: Operation, spec: VmSpec, vm: dict, here: bool) -> dict:
        """Wake the sleeping VM: on its own host (`here`: the machine the
        trial pins, if any); on the pinned host when the trial pins another
        machine (moved there asleep first); unpinned with no room
        left on its host, on the best host with room (moved likewise). A VM
        that can wake nowhere is FAILED and kept asleep where it is, its saved
        state with it, for a later provision to wake once room frees."""
        if not here:
            return self._move_and_wake(op, spec, vm, spec.host)
        op.check(f"waking vm {spec.name} on {vm['host']}")
        op.sent = True
        try:
            woke = self.client.vms.wake(spec.name, host=vm["host"])
        except fuse.ApiError as err:
            if err.code in ("unreachable", "move_in_progress"):
                raise  # no answer: it may have woken; a move: waited out by the caller
            if err.code != "host_full" or spec.host:  # pinned: waking it elsewhere is not what was asked
                raise OperationFailed(f"vm {spec.name} did not wake on {vm['host']} ({_reason(err)}); "
                                      "it is kept asleep there") from err
            _LOG.info("fuse: vm %s cannot wake on %s (%s); moving it to a host with room", spec.name, vm["host"],
                      err.message)
            return self._move_and_wake(op, spec, vm, None)
        _LOG.info("fuse: woke vm %s on %s", spec.name, woke["host"])
        return woke

    def _move_and_wake(self, op: Operation, spec: VmSpec, vm: dict, to: str | None) -> dict:
        """Move the sleeping VM (it stays asleep) to `to`, or the best host
        with room, and wake it there. A refused or failed move leaves it
        asleep on its host: FAILED, never recreated."""
        op.check(f"moving sleeping vm {spec.name} off {vm['host']}")
        op.sent = True
        try:
            move = self.client.moves.create(spec.name, to=to, host=vm["host"])
        except fuse.ApiError as err:
            if err.code in ("unreachable", "move_in_progress"):
                raise
            raise OperationFailed(f"vm {spec.name} sleeps on {vm['host']} and cannot wake "
                                  f"{'on ' + to if to else 'anywhere'} ({_reason(err)}); it is kept asleep there, "
                                  "and a later provision wakes it once there is room") from err
        while move["state"] not in _MOVE_ENDS:
            op.pause(min(self._poll_interval, 1.0))
            op.check(f"moving vm {spec.name} ({move['id']}: {move['state']})")
            move = self._reads(op.deadline)[1].get(move["id"])
        if move["state"] != "done":
            raise OperationFailed(f"moving sleeping vm {spec.name} from {vm['host']} to {move['to']} failed "
                                  f"({move.get('reason') or 'no reason given'}); it is kept asleep on {vm['host']}")
        op.host = move["to"]
        op.check(f"waking vm {spec.name} on {move['to']}")
        woke = self.client.vms.wake(spec.name, host=move["to"])
        _LOG.info("fuse: vm %s woke on %s after moving from %s", spec.name, move["to"], vm["host"])
        return woke

    def _delete(self, name: str, host: str | None) -> None:
        try:
            self.client.vms.delete(name, host=host)
        except fuse.ApiError as err:
            if err.code != "not_found":
                raise

    def remove(self, op: Operation, name: str, host: str | None) -> dict:
        """Delete the VM wherever it is, once any move of it has ended."""

        def delete(vm: dict | None) -> dict:
            if vm is None:
                return {}  # already gone: what deprovision asks for
            op.check(f"deleting vm {name} on {vm['host']}")
            op.sent = True
            self._delete(name, vm["host"])
            op.check(f"checking vm {name} is gone")
            if self._find(name, vm["host"], op.deadline) is not None:
                raise OperationFailed(f"vm {name} still exists on {vm['host']} after delete")
            _LOG.info("fuse: deleted vm %s on %s", name, vm["host"])
            return {"host": vm["host"]}

        # A VM stuck creating is deleted, not waited for; a move is waited out.
        return self._outwaiting_moves(op, name, host, delete, passing=False)

    def sleep(self, op: Operation, name: str, host: str | None) -> dict:
        """Sleep the VM (asleep already is fine), once any move of it has ended."""

        def sleep(vm: dict | None) -> dict:
            if vm is None:
                raise OperationFailed(f"vm {name} not found")
            if vm["state"] == "running":
                op.check(f"sleeping vm {name} on {vm['host']}")
                op.sent = True
                vm = self.client.vms.sleep(name, host=vm["host"])
            if vm["state"] != "sleeping":
                raise OperationFailed(f"vm {name} is {vm['state']}, not sleeping")
            _LOG.info("fuse: vm %s sleeps on %s", name, vm["host"])
            return vm

        return self._outwaiting_moves(op, name, host, sleep)

"""`FuseVMService`: mlos_bench host provisioning on a fuse controller.

An mlos_bench `Service` implementing `SupportsHostProvisioning` (seed 002):
a `HostEnv` using it gets one fuse VM, placed by the controller's best fit,
shaped by the trial's tunables. Needs the `mlos` extra
(`pip install 'fuse-fleet[mlos]'`: mlos-bench and pytz).

Parameters read from `params` (the environment's const_args, required_args
and tunables; see docs/integrations.md):

    vmName   the VM's name (required)
    vcpus    vCPUs (required, a whole number: 2, 2.0 or "2"; 1.5 or true is FAILED)
    memMiB   memory in MiB (required, a whole number)
    vmEntry  the command the VM runs (default: keep running)
    vmBundle the guest bundle (default: the controller's default, "linux")
    vmHost   pin the VM to this host (default: best fit over the fleet)

`vmEntry`, `vmBundle` and `vmHost` may also be set in the service config.
The service config also takes `url` and `token` (default $FUSE_URL /
$FUSE_TOKEN, else the controller's local socket), `pollInterval` (s, 1),
`pollTimeout` (s, 300) and `requestTimeout` (s, 300): finite, pollInterval
at least 0 and the others above 0, else refused when the service is built.
mlos_bench fills a service config key from the global of the same name (a
globals file, or `--token T` on its command line) but expands no `$name` in
a service config, so a secret goes in as `"token": ""` here plus a global
`token`; a value still reading `$name` is refused when the service is built.

How the calls map onto the controller:

    provision_host    VM running with this shape: (SUCCEEDED, {}) at once.
                      Else PENDING with an operation handle (the params plus
                      "fuseOperation" and "fuseOperationKind") that converges
                      in the background: create it, wake it if it sleeps, or
                      delete and recreate it when its shape, or the entry or
                      bundle the params ask for, or its vmHost differ from
                      the trial's (mlos_bench calls provision on every trial
                      with no deprovision between; a VM whose entry the
                      params do not name keeps the one it runs). The VM is
                      found by name fleet-wide, so a trial that changes
                      vmHost replaces the last trial's VM. A sleeping VM is
                      woken, never deleted for want of room: moved asleep to
                      the pinned host, or (unpinned, its own host full) to
                      one with room; none: FAILED, kept asleep for a later
                      provision. A move of the VM under way is waited out.
    wait_host_deployment  waits for that operation: SUCCEEDED with info on its
                      runtime ({"operation", "vmName", "vmHost", "vmState",
                      "elapsedSecs"}), FAILED, or TIMED_OUT. is_setup must
                      match the handle (True for a provision, False for a
                      deprovision or deallocate), else FAILED with the reason
                      logged. Without a handle, or one this service no longer
                      holds (timed out, or issued before a restart), it
                      watches the VM for up to pollTimeout instead; but
                      when nothing is under way that could change the VM (no
                      operation of this service, no move of it), a VM that
                      is not what the wait leads to (gone or asleep for a
                      setup wait, say) is FAILED at once.
    deprovision_host  deletes the VM wherever it is (already gone is fine).
    deallocate_host   sleeps the VM: its memory and vCPUs go back to the
                      fleet, its state stays on disk, provision wakes it.
                      Both block up to pollTimeout: (SUCCEEDED|FAILED, {}). Seed
                      002 has no TIMED_OUT here, so a timeout is PENDING with
                      the handle when the call was already sent (it goes on
                      at the controller; wait with is_setup=False), FAILED
                      when it never was.

pollTimeout bounds a whole operation, counted from the call that started it
(queueing, polling, moves included): its steps stop there, waits answer
TIMED_OUT and the service forgets it. Reads made on the caller's thread
(provision's look, a wait watching the VM) end by then too, so a controller
that hangs is TIMED_OUT at pollTimeout, not FAILED at requestTimeout; a call
that changes a VM is never cut short by it (it would go on at the
controller). Operations run one at a time, in call order, on one daemon
thread per service, so a provision after a timed-out one cannot race it;
the service's exit cancels queued ones and waits at most EXIT_JOIN_S for a
controller call in flight. Expected outcomes (fleet_full, a
refusing host, a timeout) come back as FAILED or TIMED_OUT with the reason
logged, and so does anything unexpected (with its traceback): never an
exception into mlos_bench.
"""

from __future__ import annotations

import logging
import math
import numbers
import os
import queue
import re
import threading
import time
import uuid
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, replace
from typing import Any, Callable

try:
    from mlos_bench.environments.status import Status
    from mlos_bench.services.base_service import Service
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("fuse.integrations.mlos needs mlos_bench: pip install 'fuse-fleet[mlos]'") from exc

import httpx

import fuse
from fuse.client._core import Call
from fuse.client.moves import MovesAPI
from fuse.client.vms import VmsAPI

_LOG = logging.getLogger(__name__)

OP_KEY = "fuseOperation"  # the handle's operation id
OP_KIND_KEY = "fuseOperationKind"  # provision | deprovision | deallocate
# In a PENDING deprovision's or deallocate's handle: the host its call went to,
# so a wait that outlives this service can still say where the VM was.
OP_HOST_KEY = "fuseOperationHost"
# Which wait_host_deployment(is_setup=...) each kind of operation answers to.
KINDS: dict[str, bool] = {"provision": True, "deprovision": False, "deallocate": False}
# A config value mlos_bench left as written: it fills a service config key
# from the global of the same name, and expands no "$name" there.
_UNEXPANDED = re.compile(r"\$\{?\w+\}?")
# How long the service's exit waits for a controller call in flight before
# leaving it to finish on its own (daemon) thread.
EXIT_JOIN_S = 5.0
DEFAULT_ENTRY = "while true; do sleep 3600; done"
_GONE_STATES = ("exited", "failed", "deleted")
_MOVE_ENDS = ("done", "failed")
_PASSING_STATES = ("creating", "incoming")  # a VM leaves these by itself
# Failures with a reason to log in one line: the controller's "no", no
# answer, a bad url or bad params. Anything else is logged with its traceback;
# both come back as FAILED, never as an exception into mlos_bench.
_EXPECTED = (fuse.ApiError, httpx.HTTPError, OSError, ValueError)

CONFIG_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "class": {"enum": ["fuse.integrations.mlos.FuseVMService", "fuse.integrations.FuseVMService"]},
        "config": {
            "type": "object",
            "properties": {
                "url": {"type": "string"},
                "token": {"type": "string"},
                "pollInterval": {"type": ["number", "string"]},
                "pollTimeout": {"type": ["number", "string"]},
                "requestTimeout": {"type": ["number", "string"]},
                "vmEntry": {"type": "string"},
                "vmBundle": {"type": "string"},
                "vmHost": {"type": "string"},
            },
            "additionalProperties": False,
        },
    },
    "required": ["class"],
    "additionalProperties": False,
}


def _number(key: str, value: Any, what: str) -> float:
    """A number from params or config, which may arrive as a string ("2").
    A boolean is refused although float(True) is 1.0: `"vcpus": true` is a
    mistake, not a request for one vCPU (numpy's bool_ is no numbers.Real)."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise ValueError(f"{key} must be {what}, not {value!r}")
    try:
        return float(value)
    except ValueError:
        raise ValueError(f"{key} must be {what}, not {value!r}") from None


def _seconds(config: dict, key: str, default: float, *, zero: bool = False) -> float:
    """A time from the service config: finite and above 0 (at least 0 when
    `zero`). Refused when the service is built, not met as a wait that never
    starts (pollTimeout 0) or a negative sleep on the first poll."""
    value = _number(key, config.get(key, default), "a number of seconds")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise ValueError(f"{key} must be a finite number of seconds {'of at least 0' if zero else 'above 0'}, "
                         f"not {config.get(key)!r}")
    return value


def _whole(key: str, value: Any) -> int:
    """A count from params. Tunables and command-line overrides may arrive as
    strings or floats ("2", 2.0); a fraction is refused, not truncated: a
    trial asking for 1.5 vCPUs must not silently run on 1."""
    number = _number(key, value, "a whole number")
    if not number.is_integer() or number < 1:
        raise ValueError(f"{key} must be a whole number of at least 1, not {value!r}")
    return int(number)


class OperationFailed(Exception):
    """An operation reached an expected dead end (fleet_full, refused, ...)."""


_EXPECTED = (*_EXPECTED, OperationFailed)


@dataclass(frozen=True)
class VmSpec:
    """The VM a trial asks for, read from `params`."""

    name: str
    vcpus: int
    mem_mib: int
    entry: str | None = None  # None: not asked for (a VM created here runs DEFAULT_ENTRY)
    bundle: str | None = None
    host: str | None = None

    @classmethod
    def from_params(cls, params: dict, config: dict) -> "VmSpec":
        _vm_name(params)  # a dict naming its VM
        missing = [k for k in ("vmName", "vcpus", "memMiB") if params.get(k) in (None, "")]
        if missing:
            raise ValueError(f"params lack {', '.join(missing)}")

        def opt(key: str) -> str | None:
            value = params.get(key, config.get(key))
            return str(value) if value not in (None, "") else None

        return cls(name=str(params["vmName"]), vcpus=_whole("vcpus", params["vcpus"]),
                   mem_mib=_whole("memMiB", params["memMiB"]), entry=opt("vmEntry"),
                   bundle=opt("vmBundle"), host=opt("vmHost"))

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"name": self.name, "shape": {"vcpus": self.vcpus, "mem_mib": self.mem_mib},
                                "entry": self.entry or DEFAULT_ENTRY}
        if self.bundle:
            body["bundle"] = self.bundle
        if self.host:
            body["host"] = self.host
        return body

    def differs(self, vm: dict, host: bool = True) -> list[str]:
        """What about `vm` this spec would change (empty: it fits); with
        `host` False, what only a new VM could give (not where it runs)."""
        out = []
        shape = vm.get("shape") or {}
        if (shape.get("vcpus"), shape.get("mem_mib")) != (self.vcpus, self.mem_mib):
            out.append(f"shape {shape.get('vcpus')}x{shape.get('mem_mib')} MiB -> {self.vcpus}x{self.mem_mib} MiB")
        if self.entry is not None and vm.get("entry") != self.entry:  # asked for: a running job is kept
            out.append("entry")
        if self.bundle and vm.get("bundle") != self.bundle:
            out.append(f"bundle {vm.get('bundle')} -> {self.bundle}")
        if host and self.host and vm.get("host") != self.host:
            out.append(f"host {vm.get('host')} -> {self.host}")
        return out


def _opt(params: dict, config: dict, key: str) -> str | None:
    value = params.get(key, config.get(key))
    return str(value) if value not in (None, "") else None


def _reason(err: fuse.ApiError) -> str:
    """The controller's refusal in one line, with each host's reason when it gave them."""
    hosts = err.details.get("hosts")
    return f"{err.code}: {err.message}" + (f" (hosts: {hosts})" if hosts else "")


def _named(params: Any) -> Any:
    """The vmName of `params` for a log line, whatever `params` is."""
    return params.get("vmName") if isinstance(params, dict) else None


def _vm_name(params: dict) -> str:
    if not isinstance(params, dict):
        raise ValueError(f"params must be a dict, not {type(params).__name__}")
    name = params.get("vmName")
    if name in (None, ""):
        raise ValueError("params lack vmName")
    return str(name)


class OperationTimedOut(Exception):
    """An operation passed its deadline (pollTimeout after the call that
    started it) or was abandoned by the service's exit."""


class Operation:
    """One provision, deprovision or deallocate, run on the service's worker.

    Its deadline, pollTimeout after the call that started it, bounds the whole
    of it: queued behind another, polling a VM, moving it, however many steps.
    `check` stops it between steps once the deadline has passed or the
    operation was abandoned; a controller call already sent runs to its end at
    the controller, which is why `sent` is recorded."""

    def __init__(self, kind: str, vm: str, run: Callable[["Operation"], dict], timeout: float,
                 started: float | None = None):
        self.id = uuid.uuid4().hex[:12]
        self.kind, self.vm, self.run, self.timeout = kind, vm, run, timeout
        self.started = time.monotonic() if started is None else started
        self.deadline = self.started + timeout
        self.future: Future = Future()
        self.step = "queued"
        self.sent = False  # a call that changes the VM has gone to the controller
        self.host: str | None = None  # the host the VM was last seen on
        self._abandoned = threading.Event()

    def abandon(self) -> None:
        """A queued operation never starts; a running one stops before its next step."""
        self.future.cancel()
        self._abandoned.set()

    def check(self, step: str) -> None:
        """Before each step: stop here once abandoned or past the deadline."""
        if self._abandoned.is_set():
            raise OperationTimedOut(f"{self.kind} of vm {self.vm} was abandoned while {self.step}")
        if time.monotonic() >= self.deadline:
            raise OperationTimedOut(f"{self.kind} of vm {self.vm} did not finish within pollTimeout "
                                    f"({self.timeout:g} s); it was {self.step}")
        self.step = step

    def pause(self, interval: float) -> None:
        """Sleep between polls, never past the deadline; an abandon wakes it."""
        self._abandoned.wait(max(0.0, min(interval, self.deadline - time.monotonic())))


class _Worker:
    """One thread running operations in call order, so a provision issued
    after one that timed out never races it. A daemon thread: a controller
    call that hangs must not hold the interpreter's exit."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Operation | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._outstanding = 0
        self._thread = threading.Thread(target=self._loop, name="fuse-mlos", daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """An operation is queued or running (abandoned ones included: a call
        of theirs may still land)."""
        with self._lock:
            return self._outstanding > 0

    def submit(self, op: Operation) -> None:
        with self._lock:
            self._outstanding += 1
        self._queue.put(op)

    def _loop(self) -> None:
        while (op := self._queue.get()) is not None:
            try:
                if op.future.set_running_or_notify_cancel():
                    try:
                        op.check("starting")  # it may have waited past its deadline behind another
                        op.future.set_result(op.run(op))
                    except Exception as exc:  # for whoever waits on it
                        op.future.set_exception(exc)
            finally:
                with self._lock:
                    self._outstanding -= 1

    def stop(self, timeout: float) -> bool:
        """Let the current operation end and the thread exit, waiting at most
        `timeout` s; True when it did."""
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()


class FuseVMService(Service):
    """mlos_bench `SupportsHostProvisioning` on a fuse controller."""

    def __init__(self, config: dict[str, Any] | None = None, global_config: dict[str, Any] | None = None,
                 parent: Service | None = None,
                 methods: dict[str, Callable] | list[Callable] | None = None):
        # merge_methods registers these as the service's mix-in methods; without
        # it HostEnv's isinstance(service, SupportsHostProvisioning) fails.
        super().__init__(config, global_config, parent, self.merge_methods(methods, [
            self.provision_host,
            self.deprovision_host,
            self.deallocate_host,
            self.wait_host_deployment,
        ]))
        for key in ("url", "token"):
            value = self.config.get(key)
            if isinstance(value, str) and _UNEXPANDED.fullmatch(value):
                # Caught here, not as a 401 on every trial.
                raise ValueError(
                    f"config {key} is {value!r}, but mlos_bench expands no $names in a service config: write "
                    f'"{key}": "" here and give "{key}" in a globals file or as --{key} (mlos_bench fills a '
                    f"service config key from the global of the same name), or set $FUSE_{key.upper()}")
        # Values may come from the command line as strings. The schema refuses
        # a boolean, but a subclass skips the schema: refused here too.
        self._poll_interval = _seconds(self.config, "pollInterval", 1.0, zero=True)
        self._poll_timeout = _seconds(self.config, "pollTimeout", 300.0)
        self._request_timeout = _seconds(self.config, "requestTimeout", 300.0)
        self._lock = threading.Lock()
        self._client: fuse.Client | None = None
        self._worker: _Worker | None = None
        self._ops: dict[str, Operation] = {}  # pending: dropped when waited on, timed out or past due

    # mlos_bench checks every Service's config against its own schema, which
    # lists only its own classes; validate ours against ours instead (the
    # config *file* loader still needs MLOS_BENCH_SKIP_SCHEMA_VALIDATION).
    def _validate_json_config(self, config: dict) -> None:
        import jsonschema
        doc: dict[str, Any] = {"class": f"{type(self).__module__}.{type(self).__name__}"}
        if config:
            doc["config"] = config
        if type(self) is FuseVMService:
            jsonschema.validate(doc, CONFIG_SCHEMA)

    # ---- plumbing ------------------------------------------------------------
    @property
    def client(self) -> fuse.Client:
        with self._lock:
            if self._client is None:
                url = self.config.get("url") or os.environ.get("FUSE_URL") or None
                self._client = fuse.Client(url, self.config.get("token") or None, timeout=self._request_timeout)
            return self._client

    def _busy(self) -> bool:
        with self._lock:
            return self._worker is not None and self._worker.busy

    def _submit(self, kind: str, name: str, run: Callable[[Operation], dict], params: dict,
                started: float | None = None) -> tuple[Status, dict]:
        op = Operation(kind, name, run, self._poll_timeout, started)
        with self._lock:
            now = time.monotonic()
            for old in [o for o in self._ops.values() if o.deadline <= now]:  # nobody waited on them
                old.abandon()
                del self._ops[old.id]
            if self._worker is None:
                self._worker = _Worker()
            self._ops[op.id] = op
            self._worker.submit(op)
        return Status.PENDING, {**params, OP_KEY: op.id, OP_KIND_KEY: kind}

    def _exit_context(self, ex_type, ex_val, ex_tb):
        with self._lock:
            worker, self._worker = self._worker, None
            client, self._client = self._client, None
            ops, self._ops = list(self._ops.values()), {}
        for op in ops:
            op.abandon()
        stopped = worker is None or worker.stop(EXIT_JOIN_S)
        if not stopped:
            running = [op for op in ops if op.future.running()]
            _LOG.warning("fuse: leaving a controller call in flight (%s) rather than wait for it",
                         running[0].step if running else "an earlier operation")
        elif client is not None:
            client.close()  # not under a call still in flight: that thread ends it
        return super()._exit_context(ex_type, ex_val, ex_tb)

    def _reads(self, until: float) -> tuple[VmsAPI, MovesAPI]:
        """The client's vms and moves, for reads whose answer must come by
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
                return self.client._send(replace(call, timeout=min(limit, left)))
            except fuse.ApiError as err:
                if left < limit and isinstance(err.__cause__, httpx.TimeoutException):
                    raise OperationTimedOut(f"the controller did not answer {call.method} {call.path} "
                                            f"within pollTimeout ({self._poll_timeout:g} s)") from err
                raise

        return VmsAPI(send), MovesAPI(send)

    def _find(self, name: str, host: str | None, until: float) -> dict | None:
        """The VM `name` on `host` (None: wherever it is), None if there is none."""
        try:
            return self._reads(until)[0].get(name, host=host)
        except fuse.ApiError as err:
            if err.code == "not_found":
                return None
            raise

    def _lookup(self, name: str, host: str | None, until: float) -> dict | None:
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

    def _moving(self, name: str, until: float) -> bool:
        """A move of the VM is under way at the controller (it sleeps the VM
        on its way to another host, then wakes it there)."""
        return any(m.get("vm") == name and m.get("state") not in _MOVE_ENDS for m in self._reads(until)[1].list())

    def _settle(self, op: Operation, name: str, host: str | None, passing: bool = True) -> dict | None:
        """The VM once nothing else is changing it: no move of it under way
        and (with `passing`) out of a passing state (creating, incoming). A
        move holds the VM until it is done or home again; waking, deleting or
        recreating it meanwhile could lose it or leave it on two hosts."""
        op.check(f"looking up vm {name}")
        while True:
            # Moves first: a move that ends after this look shows in the VM found next.
            moving = self._moving(name, op.deadline)
            vm = self._lookup(name, host, op.deadline)
            if vm is not None:
                op.host = vm["host"]
            if not moving and (vm is None or not passing or vm["state"] not in _PASSING_STATES):
                return vm
            op.pause(self._poll_interval)
            op.check(f"waiting for a move of vm {name} to end" if moving
                     else f"waiting for vm {name} to leave {vm['state']}")

    def _outwaiting_moves(self, op: Operation, name: str, host: str | None,
                          act: Callable[[dict | None], dict], passing: bool = True) -> dict:
        """`act` on the settled VM; when the controller answers that a move
        holds it (409 move_in_progress: one started since the look), wait for
        the move to end and act again on the VM as it is then."""
        while True:
            vm = self._settle(op, name, host, passing)
            try:
                return act(vm)
            except fuse.ApiError as err:
                if err.code != "move_in_progress":
                    raise
                _LOG.info("fuse: vm %s is held by a move (%s); waiting for it to end", name, err.message)
            op.pause(self._poll_interval)

    @staticmethod
    def _failed(what: str, err: Exception) -> tuple[Status, dict]:
        """Log why `what` failed and answer FAILED: mlos_bench reads a status,
        an exception out of a service aborts its whole run."""
        if isinstance(err, _EXPECTED):
            reasons = (getattr(err, "details", None) or {}).get("hosts")
            _LOG.error("fuse: %s failed: %s%s", what, err, f" (hosts: {reasons})" if reasons else "")
        else:
            _LOG.exception("fuse: %s failed unexpectedly: %r", what, err)
        return Status.FAILED, {}

    @staticmethod
    def _info(kind: str, name: str, vm: dict | None, started: float, host: str | None = None) -> dict:
        """wait's SUCCEEDED result: info on the operation's runtime. `host`:
        where the VM was when `vm` does not say (a deprovision's, deleted)."""
        info: dict[str, Any] = {"operation": kind, "vmName": name,
                                "elapsedSecs": round(time.monotonic() - started, 3)}
        if (vm and vm.get("host")) or host:
            info["vmHost"] = (vm or {}).get("host") or host
        info["vmState"] = vm["state"] if vm and vm.get("state") else "deleted"
        return info

    # ---- operations (on the worker thread) -----------------------------------
    def _converge(self, op: Operation, spec: VmSpec) -> dict:
        """Make the VM `spec` names exist, running, with its shape (on
        spec.host when the trial pins one), once any move of it has ended."""
        return self._outwaiting_moves(op, spec.name, spec.host, lambda vm: self._converge_vm(op, spec, vm))

    def _converge_vm(self, op: Operation, spec: VmSpec, vm: dict | None) -> dict:
        if vm is not None:
            changes = spec.differs(vm)
            if vm["state"] == "sleeping" and not spec.differs(vm, host=False):
                # Asleep with the trial's shape: wake it, wherever that takes,
                # or fail keeping it: deleting it would lose its saved state.
                vm, changes = self._wake(op, spec, vm), []
            elif vm["state"] in _GONE_STATES:
                changes = [f"state {vm['state']}"]
            if changes:
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

    def _wake(self, op: Operation, spec: VmSpec, vm: dict) -> dict:
        """Wake the sleeping VM: on its own host; on the pinned host when the
        trial pins another (moved there asleep first); unpinned with no room
        left on its host, on the best host with room (moved likewise). A VM
        that can wake nowhere is FAILED and kept asleep where it is, its saved
        state with it, for a later provision to wake once room frees."""
        if spec.host and spec.host != vm["host"]:
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

    def _remove(self, op: Operation, name: str, host: str | None) -> dict:
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

    def _sleep(self, op: Operation, name: str, host: str | None) -> dict:
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

    # ---- SupportsHostProvisioning -------------------------------------------
    def provision_host(self, params: dict) -> tuple[Status, dict]:
        """Check the VM is running with the trial's shape (SUCCEEDED, {});
        create, wake or recreate it if not (PENDING with an operation handle).
        The look is bounded by pollTimeout like the rest: a controller that
        does not answer makes it PENDING, and its wait TIMED_OUT, by then."""
        try:
            started = time.monotonic()
            spec = VmSpec.from_params(params, self.config)
            if not self._busy():  # nothing queued or in flight could change the answer: look now
                try:
                    vm = self._lookup(spec.name, spec.host, started + self._poll_timeout)
                except OperationTimedOut as err:
                    _LOG.warning("fuse: provision of vm %s: %s", spec.name, err)
                else:
                    if vm is not None and vm["state"] == "running" and not spec.differs(vm):
                        _LOG.info("fuse: vm %s already running on %s", spec.name, vm["host"])
                        return Status.SUCCEEDED, {}  # seed 002: the result is always {}
            # The operation's pollTimeout counts from this call, the look included.
            return self._submit("provision", spec.name, lambda op: self._converge(op, spec), params, started)
        except Exception as err:
            return self._failed(f"provision of vm {_named(params)}", err)

    def deprovision_host(self, params: dict) -> tuple[Status, dict]:
        """Delete the VM (a VM already gone counts as deleted). Waits up to
        pollTimeout: SUCCEEDED or FAILED with {} (seed 002: the result is
        always {}), or PENDING with the operation handle when the delete it
        asked the controller for has not finished by then."""
        try:
            name, host = _vm_name(params), _opt(params, self.config, "vmHost")
            return self._blocking("deprovision", name, lambda op: self._remove(op, name, host), params)
        except Exception as err:
            return self._failed(f"deprovision of vm {_named(params)}", err)

    def deallocate_host(self, params: dict) -> tuple[Status, dict]:
        """Sleep the VM: free its compute, keep its state; the next provision
        wakes it. Waits up to pollTimeout, as deprovision_host does."""
        try:
            name, host = _vm_name(params), _opt(params, self.config, "vmHost")
            return self._blocking("deallocate", name, lambda op: self._sleep(op, name, host), params)
        except Exception as err:
            return self._failed(f"deallocate of vm {_named(params)}", err)

    def _blocking(self, kind: str, name: str, run: Callable[[Operation], dict], params: dict) -> tuple[Status, dict]:
        """Run an operation to its end, up to pollTimeout: (SUCCEEDED|FAILED, {}).
        Seed 002 has no TIMED_OUT for deprovision or deallocate: one whose
        controller call was already sent goes on at the controller, so it is
        PENDING with the handle (waiting on it with is_setup=False watches the
        VM); one that never asked the controller will not happen: FAILED."""
        _, handle = self._submit(kind, name, run, params)
        with self._lock:
            op = self._ops[handle[OP_KEY]]
        status, _ = self._await(op)
        if status != Status.TIMED_OUT:
            return status, {}
        if op.sent:  # where its call went, for a wait that no longer holds the operation
            return Status.PENDING, {**handle, **({OP_HOST_KEY: op.host} if op.host else {})}
        _LOG.error("fuse: %s of vm %s failed: it timed out before asking the controller", kind, name)
        return Status.FAILED, {}

    def wait_host_deployment(self, params: dict, *, is_setup: bool) -> tuple[Status, dict]:
        """Wait for the operation whose handle is `params` (from provision,
        deprovision or deallocate) to finish: SUCCEEDED with info on its
        runtime, FAILED, or TIMED_OUT once pollTimeout has passed since the
        call that started it. `is_setup` must match the operation (True for
        provision). Without a handle, or with one this service no longer
        holds, it watches the VM itself for up to pollTimeout, and answers
        FAILED at once when nothing under way could bring the VM there."""
        try:
            _vm_name(params)  # a dict naming its VM
            kind = params.get(OP_KIND_KEY) or ("provision" if is_setup else "deprovision")
            with self._lock:
                op = self._ops.get(params.get(OP_KEY) or "")
            if op is not None:
                kind = op.kind
            if KINDS.get(kind) is not is_setup:
                # The caller waits for the wrong thing: say so rather than answer
                # for an operation it did not mean. The operation is left alone.
                _LOG.error("fuse: wait_host_deployment(is_setup=%s) was given a %s handle for vm %s; %s", is_setup,
                           kind, params.get("vmName"), f"a {kind} is waited on with is_setup={KINDS[kind]}"
                           if kind in KINDS else f"{OP_KIND_KEY} must be one of {', '.join(KINDS)}")
                return Status.FAILED, {}
            if op is not None:
                return self._await(op)
            return self._watch_vm(params, kind)
        except Exception as err:
            return self._failed(f"waiting for vm {_named(params)}", err)

    # ---- waiting ---------------------------------------------------------------
    def _drop(self, op: Operation) -> None:
        with self._lock:
            self._ops.pop(op.id, None)

    def _await(self, op: Operation) -> tuple[Status, dict]:
        """The end of one of our operations, by its deadline."""
        while not op.future.done() and time.monotonic() < op.deadline:
            wait_futures([op.future], timeout=max(0.0, op.deadline - time.monotonic()))
        self._drop(op)
        if not op.future.done():
            op.abandon()
            _LOG.warning("fuse: %s of vm %s timed out after pollTimeout (%g s); it was %s", op.kind, op.vm,
                         op.timeout, op.step)
            return Status.TIMED_OUT, {}
        try:
            vm = op.future.result()
        except OperationTimedOut as err:
            _LOG.warning("fuse: %s", err)
            return Status.TIMED_OUT, {}
        except Exception as err:
            return self._failed(f"{op.kind} of vm {op.vm}", err)
        return Status.SUCCEEDED, self._info(op.kind, op.vm, vm, op.started)

    def _watch_vm(self, params: dict, kind: str) -> tuple[Status, dict]:
        """No operation of ours: watch the VM until it is what `kind` leads to
        (running with its shape, gone, sleeping), for up to pollTimeout.

        While nothing is under way that could change the VM (no operation of
        this service queued or running, no move of it at the controller), a
        VM that is not what `kind` leads to and not passing through creating
        or incoming stays as it is: FAILED at once rather than TIMED_OUT after
        pollTimeout, as mlos_bench would read it (a setup wait on a VM that
        is gone or asleep has failed)."""
        name, host = _vm_name(params), _opt(params, self.config, "vmHost")
        spec = None
        if kind == "provision" and all(params.get(k) not in (None, "") for k in ("vcpus", "memMiB")):
            spec = VmSpec.from_params(params, self.config)
        started = time.monotonic()
        deadline = started + self._poll_timeout
        seen = params.get(OP_HOST_KEY) or None  # where the VM was last seen, for a deprovision's vmHost
        looked, vm = False, None
        while True:
            try:
                # Looked at before the VM: whatever ends after this look has
                # already shown in the VM we then find.
                under_way = self._busy() or self._moving(name, deadline)
                vm = self._lookup(name, host, deadline)
            except OperationTimedOut as err:  # the deadline came during (or before) this look
                _LOG.warning("fuse: %s of vm %s timed out after pollTimeout (%g s); %s", kind, name,
                             self._poll_timeout, f"the vm is {self._described(vm, spec)}" if looked else err)
                return Status.TIMED_OUT, {}
            looked = True
            if vm is not None and vm.get("host"):
                seen = vm["host"]
            if kind == "provision" and vm is not None and vm["state"] == "running" and not (spec and spec.differs(vm)):
                return Status.SUCCEEDED, self._info(kind, name, vm, started)
            if kind == "deprovision" and (vm is None or vm["state"] == "deleted"):
                return Status.SUCCEEDED, self._info(kind, name, None, started, seen)
            if kind == "deallocate" and vm is not None and vm["state"] == "sleeping":
                return Status.SUCCEEDED, self._info(kind, name, vm, started)
            if not under_way and (vm is None or vm["state"] not in _PASSING_STATES):
                _LOG.error("fuse: %s of vm %s failed: the vm is %s, and nothing is under way to change that", kind,
                           name, self._described(vm, spec))
                return Status.FAILED, {}
            if time.monotonic() >= deadline:
                _LOG.warning("fuse: %s of vm %s timed out after pollTimeout (%g s); the vm is %s", kind, name,
                             self._poll_timeout, self._described(vm, spec))
                return Status.TIMED_OUT, {}
            time.sleep(min(self._poll_interval, max(0.0, deadline - time.monotonic())))

    @staticmethod
    def _described(vm: dict | None, spec: VmSpec | None) -> str:
        if vm is None:
            return "gone"
        changes = spec.differs(vm) if spec and vm["state"] == "running" else []
        return f"{vm['state']} on {vm['host']}" + (f" but not as asked ({'; '.join(changes)})" if changes else "")

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
                      params do not name keeps the one it runs); but never
                      deleted when the controller's hosts say the new one
                      could not land (vmHost unknown, not active or not
                      answering; no host with the memory): FAILED, kept. The VM is
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
                      operation of this service, no move of it, no handle
                      whose call reached the controller), a VM that
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

The service's parts, each in its own module:

    _mlos_params      the service config and a trial's params, checked (VmSpec)
    _mlos_operations  Operation, its deadline, and the worker thread running them
    _mlos_calls       the controller calls an operation makes (ControllerCalls)
    mlos (this one)   the mlos_bench Service: seed 002's calls, handles and waits

Every public name stays importable from here, where mlos_bench configs and
docs/integrations.md name the class.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import wait as wait_futures
from typing import Any, Callable

try:
    from mlos_bench.environments.status import Status
    from mlos_bench.services.base_service import Service
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("fuse.integrations.mlos needs mlos_bench: pip install 'fuse-fleet[mlos]'") from exc

import httpx

import fuse

from ._mlos_calls import _PASSING_STATES, ControllerCalls
from ._mlos_operations import Operation, OperationFailed, OperationTimedOut, _Worker
from ._mlos_params import _UNEXPANDED, CONFIG_SCHEMA, DEFAULT_ENTRY, VmSpec, _named, _opt, _seconds, _vm_name

__all__ = [
    "CONFIG_SCHEMA",
    "DEFAULT_ENTRY",
    "EXIT_JOIN_S",
    "KINDS",
    "OP_HOST_KEY",
    "OP_KEY",
    "OP_KIND_KEY",
    "FuseVMService",
    "Operation",
    "OperationFailed",
    "OperationTimedOut",
    "VmSpec",
]

_LOG = logging.getLogger(__name__)

OP_KEY = "fuseOperation"  # the handle's operation id
OP_KIND_KEY = "fuseOperationKind"  # provision | deprovision | deallocate
# In a PENDING deprovision's or deallocate's handle: the host its call went to,
# so a wait that outlives this service can still say where the VM was.
OP_HOST_KEY = "fuseOperationHost"
# Which wait_host_deployment(is_setup=...) each kind of operation answers to.
KINDS: dict[str, bool] = {"provision": True, "deprovision": False, "deallocate": False}
# How long the service's exit waits for a controller call in flight before
# leaving it to finish on its own (daemon) thread.
EXIT_JOIN_S = 5.0
# Failures with a reason to log in one line: the controller's "no", no
# answer, a bad url or bad params. Anything else is logged with its traceback;
# both come back as FAILED, never as an exception into mlos_bench.
_EXPECTED = (fuse.ApiError, httpx.HTTPError, OSError, ValueError, OperationFailed)


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
        # The controller calls of operations and waits, on the client built on first use.
        self._calls = ControllerCalls(lambda: self.client, self._poll_interval, self._poll_timeout,
                                      self._request_timeout)

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
                    # a move of the VM first (its VM still shows running on the source while the
                    # move puts it to sleep): the operation waits it out and takes the VM as left
                    moving = self._calls.moving(spec.name, started + self._poll_timeout)
                    vm = None if moving else self._calls.lookup(spec.name, spec.host, started + self._poll_timeout)
                    fits = vm is not None and vm["state"] == "running" and not self._calls.changes(
                        spec, vm, started + self._poll_timeout)
                except OperationTimedOut as err:
                    _LOG.warning("fuse: provision of vm %s: %s", spec.name, err)
                except fuse.ApiError as err:  # (away: the operation asks again within pollTimeout)
                    if not self._calls.away(err):
                        raise
                    _LOG.info("fuse: provision of vm %s: the controller did not answer (%s)", spec.name, err.message)
                else:
                    if fits:
                        _LOG.info("fuse: vm %s already running on %s", spec.name, vm["host"])
                        return Status.SUCCEEDED, {}  # seed 002: the result is always {}
            # The operation's pollTimeout counts from this call, the look included.
            return self._submit("provision", spec.name, lambda op: self._calls.converge(op, spec), params, started)
        except Exception as err:
            return self._failed(f"provision of vm {_named(params)}", err)

    def deprovision_host(self, params: dict) -> tuple[Status, dict]:
        """Delete the VM (a VM already gone counts as deleted). Waits up to
        pollTimeout: SUCCEEDED or FAILED with {} (seed 002: the result is
        always {}), or PENDING with the operation handle when the delete it
        asked the controller for has not finished by then."""
        try:
            name, host = _vm_name(params), _opt(params, self.config, "vmHost")
            return self._blocking("deprovision", name, lambda op: self._calls.remove(op, name, host), params)
        except Exception as err:
            return self._failed(f"deprovision of vm {_named(params)}", err)

    def deallocate_host(self, params: dict) -> tuple[Status, dict]:
        """Sleep the VM: free its compute, keep its state; the next provision
        wakes it. Waits up to pollTimeout, as deprovision_host does."""
        try:
            name, host = _vm_name(params), _opt(params, self.config, "vmHost")
            return self._blocking("deallocate", name, lambda op: self._calls.sleep(op, name, host), params)
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
        this service queued or running, no move of it at the controller, no
        handle saying its call reached the controller), a
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
        # a handle naming the host its call reached: that call may be under way at the controller still
        # (a service that never held the operation answered FAILED at once while it slept the VM)
        sent = bool(params.get(OP_KEY) and params.get(OP_HOST_KEY))
        looked, vm = False, None
        while True:
            try:
                # Looked at before the VM: whatever ends after this look has
                # already shown in the VM we then find.
                under_way = sent or self._busy() or self._calls.moving(name, deadline)
                vm = self._calls.lookup(name, host, deadline)
                fits = (kind == "provision" and vm is not None and vm["state"] == "running"
                        and not (spec and self._calls.changes(spec, vm, deadline)))
            except OperationTimedOut as err:  # the deadline came during (or before) this look
                _LOG.warning("fuse: %s of vm %s timed out after pollTimeout (%g s); %s", kind, name,
                             self._poll_timeout, f"the vm is {self._described(vm, spec)}" if looked else err)
                return Status.TIMED_OUT, {}
            except fuse.ApiError as err:
                if not self._calls.away(err) or time.monotonic() >= deadline:
                    raise
                _LOG.info("fuse: the controller did not answer (%s); asking again within pollTimeout", err.message)
                time.sleep(min(max(self._poll_interval, 0.5), max(0.0, deadline - time.monotonic())))
                continue
            looked = True
            if vm is not None and vm.get("host"):
                seen = vm["host"]
            if fits:
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

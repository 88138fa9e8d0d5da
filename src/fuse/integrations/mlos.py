"""`FuseVMService`: mlos_bench host provisioning on a fuse controller.

An mlos_bench `Service` implementing `SupportsHostProvisioning` (seed 002):
a `HostEnv` using it gets one fuse VM, placed by the controller's best fit,
shaped by the trial's tunables. Needs the `mlos` extra
(`pip install 'fuse-fleet[mlos]'`: mlos-bench and pytz).

Parameters read from `params` (the environment's const_args, required_args
and tunables; see docs/integrations.md):

    vmName   the VM's name (required)
    vcpus    vCPUs (required, a whole number: 2, 2.0 or "2"; 1.5 is FAILED)
    memMiB   memory in MiB (required, a whole number)
    vmEntry  the command the VM runs (default: keep running)
    vmBundle the guest bundle (default: the controller's default, "linux")
    vmHost   pin the VM to this host (default: best fit over the fleet)

`vmEntry`, `vmBundle` and `vmHost` may also be set in the service config.
The service config also takes `url` and `token` (default $FUSE_URL /
$FUSE_TOKEN, else the controller's local socket), `pollInterval` (s, 1),
`pollTimeout` (s, 300) and `requestTimeout` (s, 300).

How the calls map onto the controller:

    provision_host    VM running with this shape: SUCCEEDED at once. Else
                      PENDING with an operation handle ("fuseOperation") that
                      converges in the background: create it, wake it if it
                      sleeps, or delete and recreate it when its shape, entry
                      or bundle differ from the trial's (mlos_bench calls
                      provision on every trial with no deprovision between).
    wait_host_deployment  polls that operation every pollInterval; TIMED_OUT
                      after pollTimeout; without a handle it polls the VM.
    deprovision_host  deletes the VM (PENDING + handle; already gone is fine).
    deallocate_host   sleeps the VM: its memory and vCPUs go back to the
                      fleet, its state stays on disk, provision wakes it.

Operations run one at a time, in call order, on one worker thread per
service, so a provision after a timed-out one cannot race it. Expected
outcomes (fleet_full, a refusing host, a timeout) come back as FAILED or
TIMED_OUT with the reason logged, never as exceptions.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from typing import Any, Callable

try:
    from mlos_bench.environments.status import Status
    from mlos_bench.services.base_service import Service
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError("fuse.integrations.mlos needs mlos_bench: pip install 'fuse-fleet[mlos]'") from exc

import httpx

import fuse

_LOG = logging.getLogger(__name__)

OP_KEY = "fuseOperation"
DEFAULT_ENTRY = "while true; do sleep 3600; done"
_GONE_STATES = ("exited", "failed", "deleted")
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


def _whole(key: str, value: Any) -> int:
    """A count from params. Tunables and command-line overrides may arrive as
    strings or floats ("2", 2.0); a fraction is refused, not truncated: a
    trial asking for 1.5 vCPUs must not silently run on 1."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be a whole number, not {value!r}") from None
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
    entry: str
    bundle: str | None = None
    host: str | None = None

    @classmethod
    def from_params(cls, params: dict, config: dict) -> "VmSpec":
        missing = [k for k in ("vmName", "vcpus", "memMiB") if params.get(k) in (None, "")]
        if missing:
            raise ValueError(f"params lack {', '.join(missing)}")

        def opt(key: str) -> str | None:
            value = params.get(key, config.get(key))
            return str(value) if value not in (None, "") else None

        return cls(name=str(params["vmName"]), vcpus=_whole("vcpus", params["vcpus"]),
                   mem_mib=_whole("memMiB", params["memMiB"]), entry=opt("vmEntry") or DEFAULT_ENTRY,
                   bundle=opt("vmBundle"), host=opt("vmHost"))

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"name": self.name, "shape": {"vcpus": self.vcpus, "mem_mib": self.mem_mib},
                                "entry": self.entry}
        if self.bundle:
            body["bundle"] = self.bundle
        if self.host:
            body["host"] = self.host
        return body

    def differs(self, vm: dict) -> list[str]:
        """What about `vm` this spec would change (empty: it fits)."""
        out = []
        shape = vm.get("shape") or {}
        if (shape.get("vcpus"), shape.get("mem_mib")) != (self.vcpus, self.mem_mib):
            out.append(f"shape {shape.get('vcpus')}x{shape.get('mem_mib')} MiB -> {self.vcpus}x{self.mem_mib} MiB")
        if vm.get("entry") != self.entry:
            out.append("entry")
        if self.bundle and vm.get("bundle") != self.bundle:
            out.append(f"bundle {vm.get('bundle')} -> {self.bundle}")
        if self.host and vm.get("host") != self.host:
            out.append(f"host {vm.get('host')} -> {self.host}")
        return out


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
        # Values may come from the command line as strings.
        self._poll_interval = float(self.config.get("pollInterval", 1.0))
        self._poll_timeout = float(self.config.get("pollTimeout", 300.0))
        self._request_timeout = float(self.config.get("requestTimeout", 300.0))
        self._lock = threading.Lock()
        self._client: fuse.Client | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._ops: dict[str, Future] = {}

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

    def _submit(self, fn: Callable[[], dict], params: dict) -> tuple[Status, dict]:
        with self._lock:
            if self._worker is None:
                self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fuse-mlos")
            op_id = uuid.uuid4().hex[:12]
            self._ops[op_id] = self._worker.submit(fn)
        return Status.PENDING, {**params, OP_KEY: op_id}

    def _exit_context(self, ex_type, ex_val, ex_tb):
        with self._lock:
            worker, self._worker = self._worker, None
            client, self._client = self._client, None
        if worker is not None:
            worker.shutdown(wait=True)
        if client is not None:
            client.close()
        return super()._exit_context(ex_type, ex_val, ex_tb)

    def _find(self, name: str, host: str | None) -> dict | None:
        try:
            return self.client.vms.get(name, host=host)
        except fuse.ApiError as err:
            if err.code == "not_found":
                return None
            raise

    def _settle(self, name: str, host: str | None) -> dict | None:
        """The VM once it is out of a passing state (creating, incoming)."""
        deadline = time.monotonic() + self._poll_timeout
        vm = self._find(name, host)
        while vm is not None and vm["state"] in ("creating", "incoming") and time.monotonic() < deadline:
            time.sleep(self._poll_interval)
            vm = self._find(name, host)
        return vm

    # ---- operations (on the worker thread) -----------------------------------
    def _converge(self, spec: VmSpec) -> dict:
        """Make the VM `spec` names exist, running, with its shape."""
        vm = self._settle(spec.name, spec.host)
        if vm is not None:
            changes = spec.differs(vm)
            if vm["state"] == "sleeping" and not changes:
                try:
                    vm = self.client.vms.wake(spec.name, host=vm["host"])
                    _LOG.info("fuse: woke vm %s on %s", spec.name, vm["host"])
                except fuse.ApiError as err:
                    moved = self._wake_elsewhere(spec, vm) if err.code == "host_full" else None
                    if moved is not None:
                        vm = moved
                    else:
                        _LOG.warning("fuse: vm %s did not wake (%s); recreating it", spec.name, err)
                        changes = ["did not wake"]
            elif vm["state"] in _GONE_STATES:
                changes = [f"state {vm['state']}"]
            if changes:
                _LOG.info("fuse: recreating vm %s on %s: %s", spec.name, vm["host"], "; ".join(changes))
                self._delete(spec.name, vm["host"])
                vm = None
        if vm is None:
            vm = self.client.vms.create(spec.body())
            _LOG.info("fuse: created vm %s (%d vCPUs, %d MiB) on %s", spec.name, spec.vcpus, spec.mem_mib,
                      vm["host"])
        if vm["state"] != "running":
            raise OperationFailed(f"vm {spec.name} is {vm['state']} on {vm['host']}: {vm.get('reason') or ''}")
        return vm

    def _wake_elsewhere(self, spec: "VmSpec", vm: dict) -> dict | None:
        """Its host has no room now: move the sleeping VM (it stays asleep) to
        the best host that has, and wake it there. None when that fails."""
        try:
            move = self.client.moves.create(spec.name, host=vm["host"])
            deadline = time.monotonic() + self._poll_timeout
            while move["state"] not in ("done", "failed") and time.monotonic() < deadline:
                time.sleep(min(self._poll_interval, 1.0))
                move = self.client.moves.get(move["id"])
            if move["state"] != "done":
                return None
            woke = self.client.vms.wake(spec.name, host=move["to"])
            _LOG.info("fuse: vm %s woke on %s after moving from %s", spec.name, move["to"], vm["host"])
            return woke
        except fuse.ApiError as err:
            _LOG.warning("fuse: vm %s could not wake elsewhere: %s", spec.name, err)
            return None

    def _delete(self, name: str, host: str | None) -> None:
        try:
            self.client.vms.delete(name, host=host)
        except fuse.ApiError as err:
            if err.code != "not_found":
                raise

    def _remove(self, name: str, host: str | None) -> dict:
        self._delete(name, host)
        if self._find(name, host) is not None:
            raise OperationFailed(f"vm {name} still exists after delete")
        _LOG.info("fuse: deleted vm %s", name)
        return {}

    def _sleep(self, name: str, host: str | None) -> dict:
        vm = self._settle(name, host)
        if vm is None:
            raise OperationFailed(f"vm {name} not found")
        if vm["state"] == "running":
            vm = self.client.vms.sleep(name, host=vm["host"])
        if vm["state"] != "sleeping":
            raise OperationFailed(f"vm {name} is {vm['state']}, not sleeping")
        _LOG.info("fuse: vm %s sleeps on %s", name, vm["host"])
        return vm

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

    # ---- SupportsHostProvisioning -------------------------------------------
    def provision_host(self, params: dict) -> tuple[Status, dict]:
        """Check the VM is running with the trial's shape; create, wake or
        recreate it if not (PENDING with an operation handle)."""
        try:
            spec = VmSpec.from_params(params, self.config)
            with self._lock:
                busy = any(not f.done() for f in self._ops.values())
            if not busy:  # nothing queued could change the answer: look now
                vm = self._find(spec.name, spec.host)
                if vm is not None and vm["state"] == "running" and not spec.differs(vm):
                    _LOG.info("fuse: vm %s already running on %s", spec.name, vm["host"])
                    return Status.SUCCEEDED, {}  # seed 002: the result is always {}
            return self._submit(lambda: self._converge(spec), params)
        except Exception as err:
            return self._failed(f"provision of vm {params.get('vmName')}", err)

    def deprovision_host(self, params: dict) -> tuple[Status, dict]:
        """Delete the VM (PENDING with an operation handle; a VM already gone
        counts as deleted)."""
        name = params.get("vmName")
        if not name:
            _LOG.error("fuse: deprovision_host: params lack vmName")
            return Status.FAILED, {}
        host = params.get("vmHost", self.config.get("vmHost"))
        try:
            return self._submit(lambda: self._remove(str(name), host), params)
        except Exception as err:
            return self._failed(f"deprovision of vm {name}", err)

    def deallocate_host(self, params: dict) -> tuple[Status, dict]:
        """Sleep the VM: free its compute, keep its state; the next provision
        wakes it. Blocks up to pollTimeout."""
        name = params.get("vmName")
        if not name:
            _LOG.error("fuse: deallocate_host: params lack vmName")
            return Status.FAILED, {}
        host = params.get("vmHost", self.config.get("vmHost"))
        try:
            status, handle = self._submit(lambda: self._sleep(str(name), host), params)
            status, _ = self._wait(handle, is_setup=False, what=f"deallocate of vm {name}")
            return status, {}
        except Exception as err:
            return self._failed(f"deallocate of vm {name}", err)

    def wait_host_deployment(self, params: dict, *, is_setup: bool) -> tuple[Status, dict]:
        """Wait for the operation in `params` (from provision/deprovision) to
        finish: SUCCEEDED, FAILED, or TIMED_OUT after pollTimeout."""
        what = f"{'provision' if is_setup else 'deprovision'} of vm {params.get('vmName')}"
        try:
            return self._wait(params, is_setup=is_setup, what=what)
        except Exception as err:
            return self._failed(what, err)

    def _wait(self, params: dict, *, is_setup: bool, what: str) -> tuple[Status, dict]:
        deadline = time.monotonic() + self._poll_timeout
        with self._lock:
            fut = self._ops.get(params.get(OP_KEY, ""))
        if fut is None:
            return self._wait_for_vm(params, is_setup, deadline)
        while not fut.done():
            left = deadline - time.monotonic()
            if left <= 0:
                _LOG.warning("fuse: operation %s timed out after %.0f s", params.get(OP_KEY), self._poll_timeout)
                return Status.TIMED_OUT, {}
            wait_futures([fut], timeout=min(self._poll_interval, left))
        with self._lock:
            self._ops.pop(params[OP_KEY], None)
        try:
            vm = fut.result()
        except Exception as err:
            return self._failed(what, err)
        out = {**params}
        out.pop(OP_KEY, None)
        if vm:
            out.update(vmHost=vm["host"], vmState=vm["state"])
        return Status.SUCCEEDED, out

    def _wait_for_vm(self, params: dict, is_setup: bool, deadline: float) -> tuple[Status, dict]:
        """No operation of ours: poll the VM itself until it runs (setup) or is
        gone (teardown)."""
        name = params.get("vmName")
        if not name:
            return Status.FAILED, {}
        host = params.get("vmHost", self.config.get("vmHost"))
        while True:
            vm = self._find(str(name), host)
            if is_setup and vm is not None and vm["state"] == "running":
                return Status.SUCCEEDED, {**params, "vmHost": vm["host"], "vmState": vm["state"]}
            if is_setup and vm is not None and vm["state"] in _GONE_STATES:
                return Status.FAILED, {}
            if not is_setup and vm is None:
                return Status.SUCCEEDED, {**params}
            if time.monotonic() >= deadline:
                return Status.TIMED_OUT, {}
            time.sleep(min(self._poll_interval, max(0.0, deadline - time.monotonic())))

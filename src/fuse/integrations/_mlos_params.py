"""What `FuseVMService` reads from its service config and a trial's params.

The checks behind seed 002's "bad params are FAILED, never raised": numbers
that may arrive as strings ("2") or floats (2.0) from tunables and the
command line, times in the service config, and `VmSpec`, the VM a trial asks
for. Kept apart from the service so these rules, which docs/integrations.md
spells out, sit in one place and need neither mlos_bench nor a controller.
Everything here raises ValueError on a bad value; the service turns that into
FAILED with the reason logged.
"""

from __future__ import annotations

import math
import numbers
import re
from dataclasses import dataclass
from typing import Any

# A config value mlos_bench left as written: it fills a service config key
# from the global of the same name, and expands no "$name" there.
_UNEXPANDED = re.compile(r"\$\{?\w+\}?")

# What a VM created without a vmEntry runs: keep running until deleted.
DEFAULT_ENTRY = "while true; do sleep 3600; done"

# The service config mlos_bench hands FuseVMService (checked in its
# _validate_json_config: mlos_bench's own schema lists only its own classes).
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


# The longest time a config may give: a wait past it is one the platform's clocks cannot time
# (1e10 s overflowed every wait), and a year is longer than any trial waits in practice.
MAX_SECONDS = 365 * 24 * 3600


def _seconds(config: dict, key: str, default: float, *, zero: bool = False) -> float:
    """A time from the service config: finite and above 0 (at least 0 when
    `zero`). Refused when the service is built, not met as a wait that never
    starts (pollTimeout 0) or a negative sleep on the first poll."""
    value = _number(key, config.get(key, default), "a number of seconds")
    if not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        raise ValueError(f"{key} must be a finite number of seconds {'of at least 0' if zero else 'above 0'}, "
                         f"not {config.get(key)!r}")
    if value > MAX_SECONDS:
        raise ValueError(f"{key} must be at most {MAX_SECONDS} seconds (a year), not {config.get(key)!r}")
    return value


def _whole(key: str, value: Any) -> int:
    """A count from params. Tunables and command-line overrides may arrive as
    strings or floats ("2", 2.0); a fraction is refused, not truncated: a
    trial asking for 1.5 vCPUs must not silently run on 1."""
    number = _number(key, value, "a whole number")
    if not number.is_integer() or number < 1:
        raise ValueError(f"{key} must be a whole number of at least 1, not {value!r}")
    return int(number)


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
    """`key` from params, else from the service config; None when neither gives one."""
    value = params.get(key, config.get(key))
    return str(value) if value not in (None, "") else None


def _named(params: Any) -> Any:
    """The vmName of `params` for a log line, whatever `params` is."""
    return params.get("vmName") if isinstance(params, dict) else None


def _vm_name(params: dict) -> str:
    """The VM `params` names; params that are no dict, or name none, are refused."""
    if not isinstance(params, dict):
        raise ValueError(f"params must be a dict, not {type(params).__name__}")
    name = params.get("vmName")
    if name in (None, ""):
        raise ValueError("params lack vmName")
    return str(name)

"""client.vms: VMs placed by the controller."""

from __future__ import annotations

from typing import Any, Callable

from ..models.base import Record
from ._core import Call, body_json, none, path, record, record_list

# A sleep's or wake's wait: the controller's for a 16 GiB VM (120 s + 30 s a GiB past 2 GiB)
# and a minute more; it was 180 s, which a big VM's sleep outlasts at the controller (review 38)
STATE_WAIT_S = 600.0

VM = record("name", "state")  # (a placed VM always has them: PlacedVm)


def _q(host: str | None) -> dict | None:
    return {"host": host} if host is not None else None  # ("": the controller says it names no host)


class VmsAPI:
    def __init__(self, send: Callable[[Call], Any]):
        self._send = send

    def create(self, body: dict | Record | None = None, **fields: Any) -> dict:
        """Place a VM by best fit: `create({"shape": {"vcpus": 2, "mem_mib": 1024}, "entry": "..."})` or
        `create(shape={...}, entry=..., name=..., host=...)`, or a body and fields beside it (the
        fields join it; one given both ways is a ValueError). 409 fleet_full/vm_exists."""
        if body is not None and fields:
            base = body_json(body)
            if not isinstance(base, dict):
                raise ValueError("create: a body beside fields must be a dict or a request record")
            if both := sorted(set(base) & set(fields)):
                raise ValueError(f"create: {', '.join(both)} given both in the body and as an argument")
            body = base | fields
        # up to 15 min: a create the elastic pool buys a machine for waits for it to join (at most 10)
        return self._send(Call("POST", "/v1/vms", body=body if body is not None else fields, timeout=900, parse=VM))

    def list(self, host: str | None = None) -> list[dict]:
        return self._send(Call("GET", "/v1/vms", params=_q(host), parse=record_list("vms", "name", "state")))

    def get(self, name: str, host: str | None = None) -> dict:
        return self._send(Call("GET", path("/v1/vms", name), params=_q(host), parse=VM))

    def delete(self, name: str, host: str | None = None) -> None:
        return self._send(Call("DELETE", path("/v1/vms", name), params=_q(host), parse=none, timeout=120))

    def sleep(self, name: str, host: str | None = None, *, timeout: float = STATE_WAIT_S) -> dict:
        """Save the VM's state and stop it; waits ``timeout`` seconds for the answer (the controller
        waits longer for a VM of more than 16 GiB: 120 s + 30 s a GiB past 2 GiB)."""
        return self._send(Call("POST", path("/v1/vms", name, "sleep"), params=_q(host), timeout=timeout, parse=VM))

    def wake(self, name: str, host: str | None = None, *, timeout: float = STATE_WAIT_S) -> dict:
        """Start the VM from its saved state; waits ``timeout`` seconds, as ``sleep``."""
        return self._send(Call("POST", path("/v1/vms", name, "wake"), params=_q(host), timeout=timeout, parse=VM))

    def console(self, name: str, offset: int = 0, host: str | None = None) -> dict:
        """`{"text", "offset", "next_offset"}`: the serial log from `offset`."""
        return self._send(Call("GET", path("/v1/vms", name, "console"), params={"offset": offset, **(_q(host) or {})},
                               parse=record("text", "offset", "next_offset")))

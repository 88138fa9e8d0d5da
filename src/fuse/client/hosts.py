"""client.hosts: the host registry (seed 000)."""

from __future__ import annotations

from typing import Any, Callable

from ..models.hosts import Host, HostCapacity, HostPage, RegisterHostRequest
from ._core import Call, model, model_list, none, path, record


def _page(r) -> HostPage:
    """The answer as a page of hosts, each one a host (``{}`` is no page and no host: every
    field has a default, and a catch-all's ``{"hosts": [{}]}`` was read as one host with no id)."""
    page = model(HostPage)(r)
    model_list(Host, "hosts")(r)
    return page




# (a drain's answer: what each of its lists holds, checked as the list methods' answers are)
DRAIN_LISTS = {"moved": ("vm", "move", "to"), "stuck": ("vm", "code", "reason"), "finished": ("vm", "state"),
               "prewarmed": str}


class HostsAPI:
    def __init__(self, send: Callable[[Call], Any]):
        self._send = send

    def register(self, request: RegisterHostRequest) -> Host:
        """Register (or re-register) a host; capacity fields left at 0 are probed."""
        return self._send(Call("POST", "/v1/hosts", body=request, parse=model(Host)))

    def add(self, name: str, addr: str, **fields: Any) -> Host:
        """Seed 004's short form, `POST /v1/hosts {name, addr}`: as `register`, but
        the backend, when `fields` names none, is the one the host agent runs, and
        capacity.vm_count defaults to 16. `fields`: token, region, backend,
        capacity (a `HostCapacity` or a dict), labels. Of a `HostCapacity`, the
        fields given when it was made are sent, so one without vm_count takes
        that default too."""
        if isinstance(capacity := fields.get("capacity"), HostCapacity):
            fields["capacity"] = capacity.model_dump(mode="json", exclude_none=True, exclude_unset=True)
        return self._send(Call("POST", "/v1/hosts", body={"name": name, "addr": addr, **fields}, parse=model(Host)))

    def list(self) -> list[Host]:
        """Every registered host, with declared capacity and live allocations."""
        return self._send(Call("GET", "/v1/hosts", parse=model_list(Host, "hosts")))

    def list_page(self, *, limit: int = 0, cursor: str = "") -> HostPage:
        params = {k: v for k, v in (("limit", limit), ("cursor", cursor)) if v}
        return self._send(Call("GET", "/v1/hosts", params=params, parse=_page))

    def get(self, host_id: str) -> Host:
        return self._send(Call("GET", path("/v1/hosts", host_id), parse=model(Host)))

    def cordon(self, host_id: str) -> None:
        """Stop new placements on the host; what runs keeps running."""
        return self._send(Call("POST", path("/v1/hosts", host_id), params={"action": "cordon"}, parse=none))

    def uncordon(self, host_id: str) -> None:
        """Resume placements (also ends a drain)."""
        return self._send(Call("POST", path("/v1/hosts", host_id), params={"action": "uncordon"}, parse=none))

    def drain(self, host_id: str) -> dict:
        """Mark the host draining and move every VM on it away by best fit;
        returns `{"moved": [...], "stuck": [{"vm", "code", "reason"}], "finished": [{"vm", "state"}],
        "prewarmed": [...]}` (finished: VMs that exited or failed, which need no move and go with the
        host; prewarmed: a prewarm's standby VMs, placed again elsewhere by their prewarm, not moved)."""
        return self._send(Call("POST", path("/v1/hosts", host_id), params={"action": "drain"}, timeout=3600,
                               parse=record("host", "moved", "stuck", inner=DRAIN_LISTS)))

    def deregister(self, host_id: str, force: bool = False) -> None:
        """Remove the host; 409 conflict while a VM that has not finished (creating, running,
        sleeping, moving) is assigned to it or a create waits on it; exited and failed VMs go
        with the host. ``force=True`` is for a host whose agent is gone for good: its VMs'
        records are dropped with it (``vm_lost`` events); 409 conflict while the agent answers."""
        return self._send(Call("DELETE", path("/v1/hosts", host_id), params={"force": "true"} if force else None,
                               parse=none))

"""Attach the resources beyond hosts to a client: one place that lists them
(imported lazily so `import fuse` stays light)."""

from __future__ import annotations

import importlib
from typing import Any

# attribute -> (module, class)
RESOURCES = {
    "vms": ("fuse.client.vms", "VmsAPI"),
    "moves": ("fuse.client.moves", "MovesAPI"),
    "events": ("fuse.client.events", "EventsAPI"),
    "pool": ("fuse.client.pool", "PoolAPI"),
    "controller": ("fuse.client.controller", "ControllerAPI"),
}

# attribute -> class for the async client, where a method does I/O itself
# (iterators) instead of returning one Call; the rest share the sync class.
ASYNC_RESOURCES = {
    "events": "AsyncEventsAPI",
}


def attach(client: Any, *, asynchronous: bool = False) -> None:
    from ._core import Call, record

    def usage(from_: int | str | None = None, to: int | str | None = None, exact: bool = False):
        """Fleet usage over [from, to) (echoed as unix seconds): per-VM rows tagged
        with host, exact totals (zeros when no host answered), the names of the
        hosts that did not answer in `unreachable` and why in `unreachable_reasons`.
        Seconds come as floats (about 16 significant digits, so the rows' float sum
        may differ from `totals` in the last digit); `exact=True` reads every figure
        the controller wrote as a `decimal.Decimal`, where the rows sum to the totals."""
        params = {k: v for k, v in (("from", from_), ("to", to)) if v is not None}
        return client._send(Call("GET", "/v1/usage", params=params, parse=record(
            "vms", "totals", exact=exact, inner={"vms": ("host", "vm"), "totals": dict, "hosts": str, "unreachable": list})))  # (controllers before 2026-12-03 listed objects there)

    def health():
        """`{"status": "ok"}` from GET /v1/healthz (no token needed); the controller
        answers 503 db_unavailable (an ApiError) when it cannot reach its database."""
        # (10 s at most: the check reads the database; a client's shorter timeout is its own)
        limit = min(10.0, client._timeout or 10.0) if isinstance(client._timeout, (int, float)) else 10.0
        return client._send(Call("GET", "/v1/healthz", timeout=limit, parse=record("status")))

    client.usage = usage
    client.health = health
    for attr, (mod, cls) in RESOURCES.items():
        if asynchronous:
            cls = ASYNC_RESOURCES.get(attr, cls)
        api = getattr(importlib.import_module(mod), cls)
        setattr(client, attr, api(client._send))

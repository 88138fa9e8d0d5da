"""Attach the resources beyond hosts to a client: one place that lists them."""

from __future__ import annotations

import importlib
from typing import Any

# attribute -> (module, class)
RESOURCES = {
    "vms": ("fuse.client.vms", "VmsAPI"),
    "moves": ("fuse.client.moves", "MovesAPI"),
    "events": ("fuse.client.events", "EventsAPI"),
    "pool": ("fuse.client.pool", "PoolAPI"),
}


def attach(client: Any) -> None:
    for attr, (mod, cls) in RESOURCES.items():
        try:
            api = getattr(importlib.import_module(mod), cls)
        except (ImportError, AttributeError):
            continue
        setattr(client, attr, api(client._send))

"""Where a VM may go: the ``on`` of a create (``POST /v1/vms``) and of a prewarm
(``POST /v1/prewarms``), parsed in one place so both answer a bad one alike.

    auto            any host (the default; also for ``on`` left out or empty)
    local           the operator's own hosts (none the elastic pool bought)
    host:<machine>  that one host
    anything else   a linked cloud's name (whether one is linked is the pool's to say)

``host:`` naming no machine is 400 ``invalid_argument``: it is a malformed
``on``, not a host that is missing (404 ``not_found`` is for a name that no
host has).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InvalidArgument

HOST_PREFIX = "host:"


@dataclass(frozen=True)
class Target:
    kind: str       # auto | local | host | cloud
    name: str = ""  # the host's or the cloud's name


def parse_on(on: str | None) -> Target:
    """``on`` as a ``Target``, or ``InvalidArgument`` for ``host:`` with no machine."""
    on = on or "auto"
    if on in ("auto", "local"):
        return Target(on)
    if on.startswith(HOST_PREFIX):
        host = on[len(HOST_PREFIX):]
        if not host:
            raise InvalidArgument(f"on {on!r} names no host: host:<machine> (leave on out and placement chooses)")
        return Target("host", host)
    return Target("cloud", on)

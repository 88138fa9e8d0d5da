"""Judging another replica's lease (a move's, a drain's) on this replica's own clock.

A lease carries its holder's wall-clock stamp (``lease_until``, a drain's ``until``) and a
renewal count (``lease_n``, ``n``). The stamp is another machine's clock: a reader a few
seconds ahead of the holder saw every live lease run out (review 37: a replica 10 s ahead took
over every move the healthy one drove, and rolled it back), and a controller restarted with its
clock stepped back waited for the whole step before it settled what its crash left (the VM
asleep meanwhile, its wake refused). So, as Kubernetes' leader election does, a lease is judged
by observation: each replica keeps what it last saw of each lease and when (its monotonic
clock), and the lease has run out once it has looked at it unchanged for `LEASE_S`. A live
holder renews every second, which changes what is seen. The stamps stay for older replicas
and for operators; they decide nothing here.
"""

from __future__ import annotations

import time
from typing import Any, Hashable, Iterable

from .records import LEASE_S

# Looks further apart than this mean this replica could not look meanwhile (the database out of
# reach, or its process stalled): the holder may not have been able to renew either (the same
# outage), so a lease seen unchanged across such a gap has its time start again at the next look,
# and the janitor claims no move for one more lease after such a pass (review 36)
BLIND_S = 3.0
FORGET_S = 30.0  # a lease no one looked at this long, and no longer listed, is forgotten


def seen(holder: Any, stamp: Any, count: Any) -> tuple:
    """What is compared from one look to the next: a holder that renews changes its count (and,
    an older replica that keeps none, its stamp)."""
    return (holder, stamp, count)


class LeaseWatch:
    """What this replica last saw of each lease, and since when (monotonic)."""

    def __init__(self, term: float = LEASE_S):
        self.term = term
        self._seen: dict[Hashable, tuple[tuple, float, float]] = {}  # key -> (value, since, last look)

    def ran_out(self, key: Hashable, value: tuple) -> bool:
        """Look at lease ``key``: whether it has been ``value`` for ``term`` of this replica's
        looks. A value not seen before (a renewal, another holder, this replica's first look)
        starts its time now."""
        now = time.monotonic()
        last = self._seen.get(key)
        if last is None or last[0] != value or now - last[2] > BLIND_S:
            self._seen[key] = (value, now, now)
            return False
        self._seen[key] = (value, last[1], now)
        return now - last[1] >= self.term

    def keep(self, keys: Iterable[Hashable]) -> None:
        """Forget the leases not among ``keys`` (moves ended, hosts no longer draining) that no one
        has looked at for ``FORGET_S``: a caller still waiting on one (the drain a replica took
        over, of a host uncordoned or removed since) keeps its count going. Forgotten on every
        janitor pass, that wait counted each look as the first and never ended (the diff review)."""
        keys, now = set(keys), time.monotonic()
        for key in [k for k, (_, _, last) in self._seen.items() if k not in keys and now - last > FORGET_S]:
            del self._seen[key]

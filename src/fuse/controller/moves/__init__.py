"""Moving a running (or sleeping) VM between hosts (seed 004), crash-safe.

A move is a persisted state machine; every transition is written to the
store before the step it names runs, and emits a `move_state` event:

    starting ─► sleeping ─► copying ─► waking ─► done
       │           │           │         │
       └───────────┴───────────┴─────────┴──► (rolling back) ─► failed

    starting      → sleeping      the move starts
    sleeping      → copying       the source slept, marked with the move id
    copying       → waking        every file copied (4 MiB chunks) and verified
    waking        → done          the target installed and woke the VM, and the
                                  source copy went (or the janitor removes it
                                  once an unanswering source is back)
    any but done  → rolling back  a step failed (or the controller restarted
                                  before the target woke the VM)
    rolling back  → failed        target side aborted, VM woken on the source

The wire shows the seed's six states only: while a failed move brings the VM
home its state stays at the step that failed, with `rolling_back: true` and
the `reason` (a `move_rolling_back` event marks the start); `failed` is
reported once the VM is back, so `failed` always means "home again".

The one-place rule: the source copy is asleep and marked from `sleeping` on,
and the target only wakes after every file verified, so at no instant do two
copies run. Once the target may have been asked to wake (`waking`), only the
target's own answer decides: its incoming side is aborted (which waits for a
wake under way and never touches a woken VM) and, if the VM runs there, the
move finishes forward; the source wakes only when the target holds no copy.
A target or source that cannot be reached is retried, never guessed. After a
controller crash the same settling runs for every move the crash left
behind. A target that cannot be reached for the abort of an unwoken copy is
remembered (`cleanup`) and retried until it answers, so no reservation or
half-copied file outlives the move.

Several controller replicas may share one store: each move carries its
driver (`owner`) and a lease the driver renews every second. Recovery takes
over only moves whose lease ran out, under a row lock, so a live replica's
move is never rolled back by another; a lease runs out once a replica has seen
it unrenewed for its length on its own monotonic clock, so the replicas' wall
clocks need not agree.

The package, one module per responsibility; `MoveService` (``service.py``)
composes the parts, each a mixin on `MoveRecords`:

    records.py   the state table, the record's reads and checked writes, the host call
    targets.py   where the VM goes: a named target checked, or the best fit; a
                 best-fit target refusing at the arrival gives way to the next
    steps.py     the move: sleep, (copy), install and wake, remove the source copy
    copying.py   the copy: 4 MiB chunks over bulk or HTTP, then every file verified
    rollback.py  settling a move that cannot go on: forward, or home
    janitor.py   leases across replicas, take-over of orphaned moves, leftovers
    leases.py    whether another replica's lease ran out, judged on this one's clock
    drain.py     draining a host, and resuming drains at the controller's start
    hooks.py     the test hooks (crash, lost reply, pause) at named points
    service.py   MoveService: starting a move, and the service's start and close
"""

from __future__ import annotations

from .copying import CHUNK, CHUNK_READ_RETRIES
from .drain import DRAIN_MOVE_WAIT_S
from .janitor import LEFTOVER_TIMEOUT
from .records import ACTIVE, IO_TIMEOUT, LEASE_S, QUICK_TIMEOUT, STATES, TRANSITIONS
from .service import MoveService
from .targets import TARGET_REFUSALS, MoveRefused, refuse

__all__ = [
    "ACTIVE", "CHUNK", "CHUNK_READ_RETRIES", "DRAIN_MOVE_WAIT_S", "IO_TIMEOUT", "LEASE_S", "LEFTOVER_TIMEOUT",
    "QUICK_TIMEOUT", "STATES", "TARGET_REFUSALS", "TRANSITIONS", "MoveRefused", "MoveService", "refuse",
]

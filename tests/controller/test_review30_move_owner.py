"""Review 30's diff review: only the task driving a move has its writes refused once another
replica owns the move (``TakenOver``); a finished move keeps its last owner, and the janitor's
tidying, a force deregister's, a later controller's are anyone's (every write to a move a
previous run of the controller ended raised, and the tidying repeated for good)."""

from __future__ import annotations

import asyncio
import time
import types

import pytest
from sqlalchemy import insert

from fuse.controller.moves.records import DRIVING, TakenOver
from fuse.controller.moves.service import MoveService
from fuse.controller.store import Store, moves as moves_t


@pytest.fixture
def moves(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 't.db'}")
    with store.tx() as c:
        for mid, state in (("ended", "failed"), ("active", "copying")):
            c.execute(insert(moves_t).values(id=mid, vm="job", source="src", target="dst", state=state,
                                             record={"owner": "another-run", "lease_until": time.time() + 100},
                                             created_at=time.time(), updated_at=time.time()))
    return MoveService(types.SimpleNamespace(store=store, instance="this-run", fleet=None))


def test_a_move_another_run_ended_is_tidied_by_anyone(moves):
    assert moves._set("ended", cleanup_pending=False)["record"]["cleanup_pending"] is False


def test_only_the_driver_of_a_move_another_replica_owns_is_stopped(moves):
    moves._set("active", copied_bytes=1)  # (not driving it: a force deregister's forgetting, say)

    async def drive():
        DRIVING.set("active")
        with pytest.raises(TakenOver, match="another-run took it over"):
            moves._set("active", copied_bytes=2)
    asyncio.run(drive())
    assert moves._row("active")["record"]["copied_bytes"] == 1

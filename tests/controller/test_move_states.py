"""The move state machine: every pair of states, legal or not."""

from __future__ import annotations

import itertools

import pytest

from fuse.controller.moves import TRANSITIONS

LEGAL = {("pending", "sleeping"), ("sleeping", "copying"), ("copying", "waking"), ("waking", "done"),
         ("pending", "rolling_back"), ("sleeping", "rolling_back"), ("copying", "rolling_back"),
         ("waking", "rolling_back"), ("rolling_back", "failed")}


@pytest.mark.parametrize("before,after", list(itertools.product(TRANSITIONS, TRANSITIONS)),
                         ids=lambda s: s)
def test_transition(before, after):
    assert (after in TRANSITIONS[before]) == ((before, after) in LEGAL)


def test_terminal_states_go_nowhere():
    assert TRANSITIONS["done"] == frozenset() and TRANSITIONS["failed"] == frozenset()


def test_an_illegal_transition_raises(tmp_path):
    import time
    from types import SimpleNamespace

    from sqlalchemy import insert

    from fuse.controller.moves import MoveService
    from fuse.controller.store import Store, engine_url, moves

    store = Store(engine_url(None, tmp_path))
    svc = MoveService(SimpleNamespace(store=store, fleet=None, instance="me"))
    with store.tx() as c:
        c.execute(insert(moves).values(id="mv-1", vm="v", source="a", target="b", state="pending", record={},
                                       created_at=time.time(), updated_at=time.time()))
    svc._set("mv-1", "sleeping")
    with pytest.raises(RuntimeError, match="illegal transition sleeping -> done"):
        svc._set("mv-1", "done")
    assert svc.get("mv-1")["state"] == "sleeping"
    assert [h["state"] for h in svc.get("mv-1")["history"]] == ["sleeping"]
    store.close()

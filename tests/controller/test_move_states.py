"""The move state machine: every pair of states, legal or not."""

from __future__ import annotations

import itertools

import pytest

from fuse.controller.moves import TRANSITIONS

LEGAL = {("starting", "sleeping"), ("sleeping", "copying"), ("copying", "waking"), ("waking", "done"),
         ("starting", "rolling_back"), ("sleeping", "rolling_back"), ("copying", "rolling_back"),
         ("waking", "rolling_back"), ("rolling_back", "failed"),
         ("pending", "sleeping"), ("pending", "rolling_back")}  # "pending": an earlier version's "starting"


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
        c.execute(insert(moves).values(id="mv-1", vm="v", source="a", target="b", state="starting", record={},
                                       created_at=time.time(), updated_at=time.time()))
    svc._set("mv-1", "sleeping")
    with pytest.raises(RuntimeError, match="illegal transition sleeping -> done"):
        svc._set("mv-1", "done")
    assert svc.get("mv-1")["state"] == "sleeping"
    assert [h["state"] for h in svc.get("mv-1")["history"]] == ["sleeping"]
    store.close()


def test_the_wire_shows_the_seed_states_only(tmp_path):
    """Rolling back is not a wire state: the move stays at the step that failed
    (rolling_back: true) until the VM is home, then reads failed."""
    import time
    from types import SimpleNamespace

    from sqlalchemy import insert

    from fuse.controller.moves import STATES, MoveService
    from fuse.controller.store import Store, engine_url, moves

    store = Store(engine_url(None, tmp_path))
    svc = MoveService(SimpleNamespace(store=store, fleet=None, instance="me"))
    with store.tx() as c:
        c.execute(insert(moves).values(id="mv-1", vm="v", source="a", target="b", state="pending",
                                       record={"history": [{"state": "pending", "time": 0}]},
                                       created_at=time.time(), updated_at=time.time()))
    assert svc.get("mv-1")["state"] == "starting"  # a row an earlier version wrote
    svc._set("mv-1", "sleeping")
    svc._set("mv-1", "copying")
    svc._set("mv-1", "rolling_back", reason="the target went away")
    m = svc.get("mv-1")
    assert m["state"] == "copying" and m["rolling_back"] and m["reason"] == "the target went away"
    svc._set("mv-1", "failed")
    m = svc.get("mv-1")
    assert m["state"] == "failed" and not m["rolling_back"]
    assert all(h["state"] in STATES or h["state"] == "pending" for h in m["history"])
    events = [(e["type"], e.get("data", e).get("to")) for e in store.events_after(0, 100)]
    assert ("move_rolling_back", None) in events
    assert [to for t, to in events if t == "move_state"] == ["sleeping", "copying", "failed"]
    store.close()

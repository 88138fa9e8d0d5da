"""The move janitor's clean-up pass reads only the moves that may need it (review 36: every 2 s
it read every move ever made, one more read each, on the event loop: ~1.5 % of a core per 100
moves kept, and GET /v1/hosts at ~1 s p95 with 900): failed moves with a target copy to abort or
their source to wake, done moves whose source copy is not removed yet; on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import insert

from fuse.controller.moves.janitor import MoveJanitor
from fuse.controller.store import Store, moves as moves_t

LEFT = {"f-clean": ("failed", {"cleanup_pending": True}), "f-wake": ("failed", {"source_wake_pending": True}),
        "d-left": ("done", {}), "d-false": ("done", {"source_removed": False}),
        "d-null": ("done", {"source_removed": None})}
TIDY = {"f-none": ("failed", {"cleanup_pending": False, "source_wake_pending": False}), "f-empty": ("failed", {}),
        "d-gone": ("done", {"source_removed": True}), "a-run": ("copying", {"cleanup_pending": True})}


def _janitor_on(url: str, many: int) -> MoveJanitor:
    store = Store(url)
    rows = [(k, s, r) for k, (s, r) in {**LEFT, **TIDY}.items()]
    rows += [(f"old-{i}", "done", {"source_removed": True}) for i in range(many)]
    with store.tx() as c:
        c.execute(insert(moves_t), [dict(id=k, vm="v", source="a", target="b", state=s, record=r, created_at=i,
                                         updated_at=i) for i, (k, s, r) in enumerate(rows)])
    janitor = MoveJanitor.__new__(MoveJanitor)
    janitor.store = store
    return janitor


def test_the_clean_up_reads_only_the_moves_left_to_tidy_on_sqlite(tmp_path):
    janitor = _janitor_on(f"sqlite:///{tmp_path}/c.db", 3000)
    assert [m["id"] for m in janitor._untidy()] == list(LEFT)


@pytest.mark.postgres
def test_the_clean_up_reads_only_the_moves_left_to_tidy_on_postgresql(postgres):
    janitor = _janitor_on(postgres.create_db(f"untidy_{uuid.uuid4().hex[:8]}"), 300)
    assert [m["id"] for m in janitor._untidy()] == list(LEFT)
    janitor.store.engine.dispose()

"""Review 14: PostgreSQL is for several controller replicas sharing one fleet,
so replicas started together on an empty database must all come up: the
schema is created by one of them at a time (an advisory lock), not by each at
once (a duplicate-key error from PostgreSQL's catalog for the loser)."""

from __future__ import annotations

import threading

import fuse
from fuse.controller.store import Store, engine_url, metadata
from support import reap, start_controller


def at_once(threads: list[threading.Thread]) -> None:
    """Start ``threads`` together and wait for each (a minute at most)."""
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def test_two_controllers_started_together_on_an_empty_database_both_come_up(tmp_path, agent, postgres):
    url = postgres.create_db("fuse_r14_together")
    started, errors = {}, []

    def start(name):
        try:
            started[name] = start_controller(tmp_path, db=url, name=name)
        except Exception as exc:  # (a controller that exited: its log says why)
            log = tmp_path / f"{name}.log"
            errors.append(f"{name}: {exc}: {log.read_text()[-800:] if log.exists() else ''}")

    try:
        at_once([threading.Thread(target=start, args=(n,)) for n in ("ctl-a", "ctl-b")])
        assert not errors, errors
        assert sorted(started) == ["ctl-a", "ctl-b"]
        with fuse.Client(started["ctl-a"].url) as ca, fuse.Client(started["ctl-b"].url) as cb:
            ca.hosts.register(fuse.RegisterHostRequest(id="shared", url=agent.url, token=agent.token,
                                                       capacity=fuse.HostCapacity(vm_count=2)))
            assert [h.id for h in cb.hosts.list()] == ["shared"]
    finally:
        for p in started.values():
            p.stop()
        reap(tmp_path)  # one that never came up is still running, maybe


def test_stores_opened_at_once_on_an_empty_database_all_open(tmp_path, postgres):
    # the same race, many at a time and without process start-up to spread them out
    url = engine_url(postgres.create_db("fuse_r14_stores"), tmp_path)
    go, opened, errors = threading.Barrier(6), [], []

    def open_store():
        go.wait(30)
        try:
            opened.append(Store(url))
        except Exception as exc:
            errors.append(repr(exc))

    try:
        at_once([threading.Thread(target=open_store) for _ in range(6)])
        assert not errors, errors
        assert len(opened) == 6
        with opened[0].read() as c:
            for table in metadata.sorted_tables:
                c.execute(table.select().limit(1)).all()
    finally:
        for s in opened:
            s.close()


def test_sqlite_stores_still_open_as_before(tmp_path):
    a, b = Store(engine_url(None, tmp_path)), Store(engine_url(None, tmp_path))
    try:
        a.put_setting("k", 1)
        assert b.get_setting("k") == 1
    finally:
        a.close()
        b.close()

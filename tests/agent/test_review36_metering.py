"""Review 36: the agent's metering file no longer holds the host's whole history, rewritten
about once a second while VMs run (540 segments 146 KB and 5.9 ms a save; one VM a minute
for a month 11.7 MB and 623 ms, on the agent's event loop). A record that can no longer
change (an ended segment, a write) goes once to ``metering.jsonl``, appended; ``metering.json``
keeps what may still change. Both are read at start, a record in both counts once, a torn
last line is skipped, and no figure goes down across a restart."""

from __future__ import annotations

import json
import logging
import math
import os
import stat
import time
from decimal import Decimal

import httpx
from fuse.agent.metering import Metering
from support import start_agent
from test_review22_agent import fill, tmpfs, unfill

C = "2026-12-07T00:00:00Z"  # a VM's created_at (keyed records: the ones that go to the archive)
SHAPE = {"vcpus": 1, "mem_mib": 128}


def lifetimes(m: Metering, n: int, vm: str = "v", t0: float = 1_000.0) -> None:
    """``n`` segments of ``vm`` that began and ended, each with a state write after it."""
    for i in range(n):
        m.start(vm, 128, None, now=t0 + 10 * i, created_at=C)
        m.segments[-1]["cpu_s"] = 1.5
        m.stop(vm, now=t0 + 10 * i + 5)
        m.state_written(vm, 1000 + i, now=t0 + 10 * i + 5, created_at=C)


def hot(path) -> dict:
    return json.loads(path.read_text())


def archived(path) -> list[dict]:
    return [json.loads(line) for line in path.with_suffix(".jsonl").read_text().splitlines()]


def test_a_save_writes_what_may_still_change_whatever_the_history(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    small = Metering(tmp_path / "a" / "metering.json")
    lifetimes(small, 5)
    small.start("live", 256, None, now=9_000.0, created_at=C)
    big = Metering(tmp_path / "b" / "metering.json")
    lifetimes(big, 400)
    big.start("live", 256, None, now=9_000.0, created_at=C)
    for m in (small, big):
        m.save()  # (at a later save an ended record is appended: the one before wrote it as it is)
        m.save()
    # the file rewritten at every save holds the running VM's open segment and nothing else,
    # the same bytes with 5 or 400 lifetimes behind it
    assert hot(small.path) == hot(big.path) == {"segments": [small.segments[-1]], "writes": []}
    assert small.path.stat().st_size == big.path.stat().st_size < 300
    before = big.archive.stat().st_size
    big.save()
    assert big.archive.stat().st_size == before  # (nothing appended twice)
    assert len(archived(big.path)) == 800 and len(archived(small.path)) == 10

    # and what a restart reads is what was reported
    for m in (small, big):
        again = Metering(m.path)
        assert again.usage(0, 10_000, now=10_000) == m.usage(0, 10_000, now=10_000)
        assert again.damaged is None and again._open_segment("live") == m.segments[-1]


def test_an_older_agents_file_loads_as_before_and_its_history_moves_to_the_archive(tmp_path):
    path = tmp_path / "metering.json"
    old = Metering(path)
    lifetimes(old, 30)
    old.start("live", 256, None, now=9_000.0, created_at=C)
    figures = old.usage(0, 10_000, now=10_000)
    older = {"segments": old.segments, "writes": old.writes}  # every record, as agents before this wrote it
    path.write_text(json.dumps(older))
    old.archive.unlink()

    m = Metering(path)
    assert m.usage(0, 10_000, now=10_000) == figures
    m.save()
    assert hot(path) == {"segments": [m.segments[-1]], "writes": []} and len(archived(path)) == 60
    assert Metering(path).usage(0, 10_000, now=10_000) == figures


def test_a_record_in_both_files_counts_once(tmp_path):
    # An agent stopped between the append and the rewrite of metering.json: the appended
    # records are in both, the same in each. Records appended before are only in the archive.
    path = tmp_path / "metering.json"
    m = Metering(path)
    lifetimes(m, 3)
    m.start("v", 128, None, now=500.0, created_at=C)
    m.stop("v", now=600.0)  # ended: metering.json holds it ended, the next save appends it
    left = path.read_text()
    m.save()
    assert archived(path)[-1] == {"segment": m.segments[-1]}
    path.write_text(left)  # (as the rewrite without it never happened)
    figures = m.usage(0, 10_000, now=10_000)

    again = Metering(path)
    assert again.usage(0, 10_000, now=10_000) == figures
    assert len(again.segments) == 4 and again.damaged is None
    again.save()  # rewritten without it, not appended a second time
    assert hot(path) == {"segments": [], "writes": []} and len(archived(path)) == 7
    assert Metering(path).usage(0, 10_000, now=10_000) == figures


def test_a_torn_last_line_is_skipped_with_a_warning_and_the_next_append_goes_after_the_whole_ones(
        tmp_path, caplog):
    path = tmp_path / "metering.json"
    m = Metering(path)
    lifetimes(m, 2)
    m.start("v", 128, None, now=500.0, created_at=C)
    m.stop("v", now=600.0)
    left = path.read_text()  # holds the ended segment
    m.save()
    whole = m.archive.read_bytes()
    last = whole[:-1].rsplit(b"\n", 1)[1] + b"\n"
    m.archive.write_bytes(whole[:-len(last)] + last[:len(last) // 2])  # stopped as it appended it
    path.write_text(left)
    figures = m.usage(0, 10_000, now=10_000)

    with caplog.at_level(logging.WARNING, logger="fuse.agent"):
        again = Metering(path)
    assert "its last line is cut short" in caplog.text and again.damaged is None
    assert again.usage(0, 10_000, now=10_000) == figures
    again.start("w", 64, None, now=700.0, created_at=C)
    again.stop("w", now=800.0)
    again.save()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fuse.agent"):
        third = Metering(path)
    assert caplog.text == "" and third.damaged is None
    assert len(archived(path)) == 6  # every line whole, each record once
    assert third.usage(0, 10_000, now=10_000) == again.usage(0, 10_000, now=10_000)


def test_a_damaged_archive_is_kept_aside_once_and_the_other_figures_count(tmp_path):
    path = tmp_path / "metering.json"
    m = Metering(path)
    lifetimes(m, 2)
    m.start("live", 256, None, now=9_000.0, created_at=C)
    m.save()
    lines = m.archive.read_text().splitlines(keepends=True)
    m.archive.write_text(lines[0] + "{not json\n" + "".join(lines[1:]))

    again = Metering(path)
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith("metering.jsonl.damaged-")]
    assert len(aside) == 1 and not again.archive.exists()
    assert again.damaged is not None and again.damaged.count("could not be read") == 1
    assert aside[0] in again.damaged and "line 2" in again.damaged
    assert [r["vm"] for r in again.usage(0, 10_000, now=10_000)["vms"]] == ["live"]  # metering goes on
    again.start("w", 64, None, now=9_100.0, created_at=C)
    again.stop("w", now=9_200.0)
    again.save()
    assert [r["vm"] for r in Metering(path).usage(0, 10_000, now=10_000)["vms"]] == ["live", "w"]



def test_a_damaged_metering_json_is_kept_aside_and_the_archived_figures_still_count(tmp_path):
    path = tmp_path / "metering.json"
    m = Metering(path)
    lifetimes(m, 2)
    m.save()
    figures = m.usage(0, 10_000, now=10_000)
    path.write_text('{"segments": [')

    again = Metering(path)
    assert again.damaged is not None and again.damaged.startswith("metering.json could not be read")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("metering.json.damaged-")]
    assert again.usage(0, 10_000, now=10_000) == figures

def test_the_archive_is_private_whatever_the_umask(tmp_path):
    path = tmp_path / "metering.json"
    old = os.umask(0o022)
    try:
        m = Metering(path)
        lifetimes(m, 1)
        m.save()
    finally:
        os.umask(old)
    assert stat.S_IMODE(m.archive.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_on_a_full_disk_the_figures_are_kept_and_written_once_it_has_room(tmp_path):
    with tmpfs(tmp_path / "disk", "4m") as disk:
        path = disk / "metering.json"
        m = Metering(path)
        lifetimes(m, 3)
        for i in range(40):
            m.start(f"v{i}", 128, None, now=2_000.0 + i, created_at=C)
        m.save()
        fill(disk)
        try:
            for i in range(40):  # VMs end while neither file can be written
                m.stop(f"v{i}", now=3_000.0 + i)
                m.state_written(f"v{i}", 10_000 + i, now=3_000.0 + i, created_at=C)
            assert m._dirty and m._unsaved is not None  # (persist kept them in memory: nothing raised)
            assert not m.archive.read_bytes() or m.archive.read_bytes().endswith(b"\n")  # no torn line left
        finally:
            unfill(disk)
        m.persist()
        m.persist()  # (the second appends what the first wrote ended in metering.json)
        assert m._unsaved is None and not m._dirty
        figures = m.usage(0, 10_000, now=10_000)
        lines = archived(path)
        assert len(lines) == 6 + 80 and len({json.dumps(x, sort_keys=True) for x in lines}) == 86
        assert hot(path) == {"segments": [], "writes": []}
        assert Metering(path).usage(0, 10_000, now=10_000) == figures


def test_agent_usage_survives_restarts_and_its_metering_json_holds_only_running_vms(tmp_path, procs):
    agent = start_agent(tmp_path, backend="fake")
    procs.append(agent)
    h = {"Authorization": f"Bearer {agent.token}"}

    def create(name):
        r = httpx.post(f"{agent.url}/v1/host/vms", json={"name": name, "shape": SHAPE, "entry": "true"},
                       headers=h, timeout=30)
        assert r.status_code == 201, r.text

    for _ in range(4):
        for i in range(5):
            create(f"v{i}")
        r = httpx.post(f"{agent.url}/v1/host/vms/v0/sleep", headers=h, timeout=30)
        assert r.status_code == 200, r.text
        for i in range(5):
            assert httpx.delete(f"{agent.url}/v1/host/vms/v{i}", headers=h, timeout=30).status_code == 204
    # a window closed before the restarts, over ended VMs only: its figures can only stay as they are
    to = math.ceil(time.time())
    time.sleep(to - time.time() + 0.2)
    create("keeper")  # running across the restarts (after the window)

    def usage():
        r = httpx.get(f"{agent.url}/v1/host/usage", params={"from": "0", "to": str(to)}, headers=h)
        assert r.status_code == 200, r.text
        return json.loads(r.content, parse_float=Decimal)

    before = usage()
    assert len(before["vms"]) == 20 and before["totals"]["state_bytes_written"] > 0
    agent.stop()
    path = agent.state_dir / "metering.json"
    kept = hot(path)
    # only the running VM's open segment (was: all 21 segments and 4 writes, rewritten every second)
    assert [(s["vm"], s["end"]) for s in kept["segments"]] == [("keeper", None)] and kept["writes"] == [], kept
    assert path.stat().st_size < 400
    assert len(archived(path)) == 4 * (5 + 1)  # each round's 5 segments and its sleep's write, once

    for _ in range(2):
        agent = start_agent(tmp_path, backend="fake")
        procs.append(agent)
        assert usage() == before
        agent.stop()
        assert [s["vm"] for s in hot(path)["segments"]] == ["keeper"] and len(archived(path)) == 24
    agent = start_agent(tmp_path, backend="fake")
    procs.append(agent)
    assert httpx.delete(f"{agent.url}/v1/host/vms/keeper", headers=h, timeout=30).status_code == 204

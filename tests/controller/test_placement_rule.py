"""The best-fit rule on arrays: filter reasons, score order, ties."""

from __future__ import annotations

import numpy as np
import pytest

from fuse.controller.placement import FleetArrays, rank, rank_loop
from fuse.controller.resources import Resources


def fleet(rows):
    ids = [r[0] for r in rows]
    col = lambda k: np.array([r[k] for r in rows], dtype=np.int64)
    return FleetArrays(ids, col(1), col(2), col(3), col(4), col(5), col(6), np.array([r[7] for r in rows]))


#            id   cap_v cap_m  free_v free_m vms lim usable
BASE = [("small", 4, 4096, 4, 4096, 0, 10, True),
        ("big", 16, 65536, 16, 65536, 0, 10, True),
        ("busy", 16, 65536, 2, 2048, 7, 10, True)]


def test_memory_is_the_hard_limit_and_cpu_only_ranks():
    d = rank(fleet(BASE), Resources.vm(64, 3000))  # asks more vCPUs than anyone has
    assert d.order == ["small", "big"]           # still placed; busy lacks memory
    assert "3000 MiB" in d.reasons["busy"] and "2048 MiB free" in d.reasons["busy"]


def test_score_is_ask_dot_free_normalised_by_capacity():
    ask = Resources.vm(2, 2048)
    # small: 2/4*4/4 + 2048/4096*4096/4096 = 1.0; big: 2/16*1 + 2048/65536*1 = 0.156
    assert rank(fleet(BASE), ask).order[:2] == ["small", "big"]


def test_ties_go_to_the_host_with_fewer_vms():
    rows = [("a", 4, 4096, 4, 4096, 3, 10, True), ("b", 4, 4096, 4, 4096, 1, 10, True)]
    assert rank(fleet(rows), Resources.vm(1, 512)).order == ["b", "a"]


@pytest.mark.parametrize("row,reason", [
    (("off", 4, 4096, 4, 4096, 0, 10, False), "host is cordoned"),
    (("full", 4, 4096, 4, 4096, 10, 10, True), "vm_count policy 10 reached"),
], ids=["an unusable host keeps the reason it was given", "a host at its vm_count policy is refused"])
def test_every_rejection_has_a_reason(row, reason):
    d = rank(fleet([row]), Resources.vm(1, 512), {"off": "host is cordoned"})
    assert d.order == [] and d.reasons[row[0]] == reason


def test_vectorised_rank_matches_the_loop_on_random_fleets():
    rng = np.random.default_rng(7)
    for _ in range(50):
        n = int(rng.integers(1, 60))
        rows = []
        for i in range(n):
            cv, cm = int(rng.integers(1, 64)), int(rng.integers(512, 262144))
            rows.append((f"h{i:03d}", cv, cm, int(rng.integers(-4, cv + 1)), int(rng.integers(0, cm + 1)),
                         int(rng.integers(0, 5)), int(rng.integers(1, 6)), bool(rng.random() > 0.1)))
        ask = Resources.vm(int(rng.integers(1, 8)), int(rng.integers(64, 16384)))
        f = fleet(rows)
        loop = [dict(id=r[0], i=i, cap_vcpus=r[1], cap_mem=r[2], free_vcpus=r[3], free_mem=r[4], vm_count=r[5],
                     vm_limit=r[6], usable=r[7]) for i, r in enumerate(rows)]
        assert rank(f, ask).order == rank_loop(loop, ask)


def test_best_is_the_first_of_the_order_on_random_fleets_with_ties_and_exclusions():
    rng = np.random.default_rng(11)
    for _ in range(100):
        n = int(rng.integers(1, 80))
        shapes = [(4, 4096), (8, 16384), (16, 65536)]  # few shapes: identical hosts tie on score
        rows = []
        for i in range(n):
            cv, cm = shapes[int(rng.integers(0, 3))]
            rows.append((f"h{i:03d}", cv, cm, int(rng.choice([cv, cv // 2, -1])), int(rng.choice([cm, cm // 2, 0])),
                         int(rng.integers(0, 3)), 4, bool(rng.random() > 0.1)))
        f = fleet(rows)
        for k in range(4):  # the first decision on a snapshot masks, later ones cut a sorted copy
            ask = Resources.vm(int(rng.integers(0, 8)), int(rng.choice([0, 512, 2048, 8192])))
            order = rank(f, ask).order
            skip = set(rng.choice(order, size=min(len(order), int(rng.integers(0, 3))), replace=False).tolist()) \
                if order else set()
            want = next((h for h in order if h not in skip), None)
            assert rank(f, ask).best(skip) == want
            assert rank(f, ask).best() == (order[0] if order else None)

"""The compiled knapsack passes against the array operations they replaced."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fuse.controller.pool import knapsack

copies = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 5), st.integers(0, 2),
                            st.floats(0.0, 10.0, allow_nan=False)), max_size=12)


def reference(shape, items):
    """Each pass as numpy array operations: the table before it, shifted, plus the value."""
    f = np.zeros(shape)
    masks = []
    for cw, mw, sw, v in items:
        mask = np.zeros(shape, dtype=bool)
        if cw < shape[0] and mw < shape[1] and sw < shape[2]:
            cand = f[:shape[0] - cw, :shape[1] - mw, :shape[2] - sw] + v
            sub = f[cw:, mw:, sw:]
            mask[cw:, mw:, sw:] = cand > sub + 1e-12
            np.maximum(sub, cand, out=sub)
        masks.append(mask)
    return f, masks


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 7), st.integers(1, 9), st.integers(1, 3), copies)
def test_passes_match_the_array_operations(rows, cols, depth, items):
    items = [(cw, mw, sw if depth > 1 else 0, v) for cw, mw, sw, v in items]
    f = np.zeros((rows, cols, depth))
    masks = knapsack.run(f, items, record=True)
    want, want_masks = reference((rows, cols, depth), items)
    assert np.array_equal(f, want)
    assert len(masks) == len(items)
    for got, expected in zip(masks, want_masks):
        assert np.array_equal(got, expected)
    plain = np.zeros((rows, cols, depth))
    knapsack.run(plain, items)
    assert np.array_equal(plain, want)


def test_a_copy_weighing_no_vcpu_is_refused():
    # the sweep reads a lower row than it writes; a 0-vCPU copy would read its own writes
    try:
        knapsack.run(np.zeros((2, 2, 1)), [(0, 1, 0, 1.0)])
    except ValueError as e:
        assert "no vCPU" in str(e)
    else:
        raise AssertionError("a 0-vCPU copy was taken")


def test_bounded_knapsack_optimum_on_a_known_machine():
    # 8 vCPUs, 8 memory units: items (2 vCPU, 1 unit, 3.0) x3 and (3, 4, 5.0) x2, split 1+2 / 1+1
    f = np.zeros((9, 9, 1))
    knapsack.run(f, [(2, 1, 0, 3.0), (4, 2, 0, 6.0), (3, 4, 0, 5.0), (3, 4, 0, 5.0)])
    assert f[8, 8, 0] == 11.0  # two small and one large (7 vCPUs, 6 units); three small: 9; two large: 10
    assert f[6, 8, 0] == 10.0  # two large


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 12), st.integers(1, 40), copies, copies)
def test_a_table_worked_out_to_its_row_limits_reads_as_the_whole_table(rows, cols, first, then):
    """(review 37) Rows are worked out up to ⌊r·c⌋ memory units only (r: the most memory per
    vCPU of any copy, of every stage of the table): each cell read through ``at`` holds what the
    whole table holds there, stage by stage, and walking the masks back through the limits
    gives a set of copies within the cell's capacity worth exactly its value."""
    first = [(cw, mw, 0, v) for cw, mw, _, v in first]
    then = [(cw, mw, 0, v) for cw, mw, _, v in then]
    whole, part = np.zeros((rows, cols, 1)), np.zeros((rows, cols, 1))
    lims = knapsack.row_limits(part, first + then)
    assert all(0 <= lims[c] < cols for c in range(rows))
    after_first = None
    for stage in (first, then):
        after_first = part.copy()  # (the second time round: the table the second stage starts from)
        knapsack.run(whole, stage)
        masks = knapsack.run(part, stage, record=True, lims=lims)
        for c in range(rows):
            for m in range(cols):
                assert part[c, knapsack.at(lims, c, m), 0] == whole[c, m, 0], (c, m)
    for c0 in range(rows):
        for m0 in range(cols):
            c, m, value, used_c, used_m = c0, knapsack.at(lims, c0, m0), 0.0, 0, 0
            for p in range(len(then) - 1, -1, -1):
                cw, mw, _, v = then[p]
                if masks[p, c, m, 0]:
                    value, used_c, used_m = value + v, used_c + cw, used_m + mw
                    c, m = c - cw, knapsack.at(lims, c - cw, m - mw)
            rest = after_first[c, m, 0]  # (what the first stage holds in what is left)
            assert used_c <= c0 and used_m <= m0
            assert abs(value + rest - whole[c0, m0, 0]) < 1e-9 * max(1.0, whole[c0, m0, 0])

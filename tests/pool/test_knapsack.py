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

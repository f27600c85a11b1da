"""robust._block_sum_diff (one column pass, on the transpose, over the uint16 row-sum difference) equals the
difference of two _block_sum calls, at the extremes of 8-bit input, for every block side, and on the
fallbacks (16-bit, ragged edges)."""

import numpy as np
import pytest

from imgdiff.robust import _block_sum, _block_sum_diff


@pytest.mark.parametrize(
    "shape,s,dtype",
    [
        ((64, 96, 3), 8, np.uint8),
        ((32, 48, 4), 16, np.uint8),
        ((16, 24), 8, np.uint8),
        ((8, 8, 3), 1, np.uint8),
        ((16, 24, 3), 2, np.uint8),
        ((24, 16, 1), 4, np.uint8),
        ((60, 90, 3), 8, np.uint8),  # ragged: padded by _block_sum
        ((32, 32, 3), 8, np.uint16),
    ],
)
def test_block_sum_diff_equals_two_block_sums(shape, s, dtype):
    rng = np.random.default_rng(sum(shape) + s)
    top = np.iinfo(dtype).max
    a = rng.integers(0, top + 1, shape, dtype=dtype)
    b = rng.integers(0, top + 1, shape, dtype=dtype)
    lo, hi = np.zeros(shape, dtype), np.full(shape, top, dtype)
    for x, y in [(b, a), (hi, lo), (lo, hi)]:  # random, and the largest sums of either sign
        got = _block_sum_diff(x, y, s)
        fast = dtype == np.uint8 and shape[0] % s == shape[1] % s == 0  # else the two-_block_sum fallback
        assert got.dtype == (np.int32 if fast else np.int64)
        np.testing.assert_array_equal(got, _block_sum(x, s) - _block_sum(y, s))

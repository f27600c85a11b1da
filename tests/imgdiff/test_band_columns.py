""":func:`imgdiff.band_diff.window_columns` searches the first and last changed columns from each
side a slice at a time: the same window as the brute-force scan of every column, on dense and
sparse changes, slice edges, gray and colour bands."""

import numpy as np
import pytest

from imgdiff import band_diff
from imgdiff.band_diff import band_rows, window_columns


def _brute(a, b, mode):
    """The window from every column that differs anywhere (the definition)."""
    w = a.shape[1]
    cols = np.flatnonzero((a != b).reshape(a.shape[0], w, -1).any(axis=(0, 2)))
    return (0, w) if cols.size == 0 else band_rows(w, int(cols[0]), int(cols[-1]), mode=mode)


@pytest.mark.parametrize("channels", [0, 3, 4])
@pytest.mark.parametrize("mode", ["robust", "exact"])
@pytest.mark.parametrize("seed", range(12))
def test_window_equals_brute_force(monkeypatch, channels, mode, seed):
    rng = np.random.default_rng(seed)
    monkeypatch.setattr(band_diff, "COLUMN_STEP", int(rng.choice([1, 7, 128])))
    h, w = int(rng.integers(1, 40)), int(rng.integers(1, 700))
    shape = (h, w) if channels == 0 else (h, w, channels)
    a = rng.integers(0, 256, shape, dtype=np.uint8)
    b = a.copy()
    kind = seed % 4
    if kind == 1:  # dense: every pixel may change
        b = rng.integers(0, 256, shape, dtype=np.uint8)
    elif kind == 2:  # a few pixels, anywhere
        for _ in range(int(rng.integers(1, 4))):
            b[int(rng.integers(h)), int(rng.integers(w))] ^= 1
    elif kind == 3:  # the first or last column only
        b[int(rng.integers(h)), int(rng.choice([0, w - 1]))] ^= 0x80
    assert window_columns(a, b, mode=mode) == _brute(a, b, mode)


def test_no_change_is_every_column():
    a = np.zeros((5, 300, 3), np.uint8)
    assert window_columns(a, a.copy()) == (0, 300)

"""robust.strong_points: the gathered per-pixel test (few tiles over the margin) finds exactly the pixels of
strong_mask box by box, on random pairs with edges, clusters, 16-bit data, every channel count and
crops that do not start at the image origin."""

from unittest import mock

import numpy as np
import pytest

from imgdiff import core, robust


def _pair(rng, h, w, c, dtype):
    top = np.iinfo(dtype).max
    scale = 1 if dtype == np.uint8 else 257
    if rng.random() < 0.5:  # full-range noise: wide 3x3 ranges
        a = rng.integers(0, top + 1, (h, w, c)).astype(dtype)
    else:  # low-texture reference: narrow ranges, most changes strong
        a = (rng.integers(0, 40, (h, w, c)) * scale).astype(dtype)
    b = a.copy()
    n = int(rng.integers(0, h * w // 4 + 2))
    b[rng.integers(0, h, n), rng.integers(0, w, n)] = rng.integers(0, top + 1, (n, c))
    y, x = int(rng.integers(0, h)), int(rng.integers(0, w))
    b[y : y + 4, x : x + 5] = rng.integers(0, top + 1)  # a coherent block (the opening), maybe clipped
    return a, b, scale


@pytest.mark.parametrize("seed", range(6))
def test_gathered_strong_pixels_match_strong_mask(seed):
    rng = np.random.default_rng(seed)
    for _ in range(40):
        h, w = int(rng.integers(1, 70)), int(rng.integers(1, 70))
        dtype = np.uint16 if rng.random() < 0.3 else np.uint8
        a, b, scale = _pair(rng, h, w, int(rng.choice([1, 3, 4])), dtype)
        margin = float(rng.choice([0, 10, 32])) * scale
        window = int(rng.choice([3, 5]))
        ty, tx = int(rng.integers(0, -(-h // 16))), int(rng.integers(0, -(-w // 16)))
        crop = (ty * 16, h, tx * 16, w)
        grid = core.block_max_numpy(a, b, 16)
        ys, xs = robust.strong_points(a, b, crop, window=window, margin=margin, grid=grid)
        ry, rx = np.nonzero(robust.strong_in_crop(a, b, crop, window=window, margin=margin))
        got = sorted(zip(ys.tolist(), xs.tolist()))
        assert got == sorted(zip((ry + crop[0]).tolist(), (rx + crop[2]).tolist()))
        with mock.patch.object(robust, "STRONG_PIXELS", 0):  # the box-by-box path: same pixels
            ys2, xs2 = robust.strong_points(a, b, crop, window=window, margin=margin, grid=grid)
        assert sorted(zip(ys2.tolist(), xs2.tolist())) == got

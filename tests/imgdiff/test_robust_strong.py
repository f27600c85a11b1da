"""robust.strong_points: the gathered per-pixel test (scattered tiles over the margin) finds exactly the
pixels of strong_mask box by box (strong_in_crop), on random pairs with edges, clusters, 16-bit data,
every channel count and crops that do not start at the image origin."""

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
    dense = rng.random() < 0.3
    n = int(rng.integers(0, h * w // 4 + 2)) if dense else int(rng.integers(0, 12))  # else scattered
    b[rng.integers(0, h, n), rng.integers(0, w, n)] = rng.integers(0, top + 1, (n, c))
    y, x = int(rng.integers(0, h)), int(rng.integers(0, w))
    b[y : y + 4, x : x + 5] = rng.integers(0, top + 1)  # a coherent block (the opening), maybe clipped
    return a, b, scale


@pytest.mark.parametrize("seed", range(6))
def test_gathered_strong_pixels_match_strong_mask(seed):
    rng = np.random.default_rng(seed)
    gathered = 0
    for _ in range(40):
        h, w = int(rng.integers(1, 200)), int(rng.integers(1, 200))
        dtype = np.uint16 if rng.random() < 0.3 else np.uint8
        a, b, scale = _pair(rng, h, w, int(rng.choice([1, 3, 4])), dtype)
        margin = float(rng.choice([0, 10, 32])) * scale
        window = int(rng.choice([3, 5]))
        ty, tx = int(rng.integers(0, -(-h // 48))), int(rng.integers(0, -(-w // 48)))  # tile-aligned crop
        crop = (ty * 16, h, tx * 16, w)
        grid = core.block_max_numpy(a, b, 16)
        ys, xs = robust.strong_points(a, b, crop, window=window, margin=margin, grid=grid)
        ry, rx = np.nonzero(robust.strong_in_crop(a, b, crop, window=window, margin=margin))
        got = sorted(zip(ys.tolist(), xs.tolist()))
        assert got == sorted(zip((ry + crop[0]).tolist(), (rx + crop[2]).tolist()))
        gathered += len(robust._strong_boxes(a, b, crop, margin, None, grid)) > 1
    assert gathered >= 3  # some pairs take the gathered path (scattered tiles), the rest the box path


def test_gathered_path_at_image_edges_and_corners():
    # Scattered single-pixel and 2x2 changes on the image's corners and edges (clipped windows), a 3x3
    # block (the opening) on an edge, on a flat and on a textured reference: the gathered path.
    rng = np.random.default_rng(7)
    for a in (np.full((150, 230, 3), 90, np.uint8), rng.integers(0, 256, (150, 230, 3)).astype(np.uint8)):
        b = a.copy()
        for y, x in [(0, 0), (0, 229), (149, 0), (149, 229), (0, 100), (75, 0), (149, 120), (70, 229)]:
            b[y, x] = 255 - b[y, x]
        b[40:42, 60:62] = 0
        b[147:150, 180:183] = 255
        crop = (0, 150, 0, 230)
        grid = core.block_max_numpy(a, b, 16)
        assert len(robust._strong_boxes(a, b, crop, 32.0, None, grid)) > 1
        ys, xs = robust.strong_points(a, b, crop, window=3, margin=32.0, grid=grid)
        ry, rx = np.nonzero(robust.strong_in_crop(a, b, crop, window=3, margin=32.0))
        assert sorted(zip(ys.tolist(), xs.tolist())) == sorted(zip(ry.tolist(), rx.tolist()))
        assert ys.size >= 8

"""Pure NumPy core: input validation, pair normalisation, and the exact coarse-to-fine reference.

Everything here works on arrays and never touches files. Deltas are *per channel absolute
differences*; a pixel's delta is the max over its channels. Thresholds and reported deltas are in
0-255 units; 16-bit pairs are compared in raw 16-bit units (``scale = 257``), so an 8-bit threshold
``t`` becomes ``t * 257`` there.

Coarse-to-fine: the grid of per-block *max* deltas (``block_max``) is a max-pool of
the delta image, so a block whose max is ``<= threshold`` provably holds no changed pixel and is never
read again. Rows whose bytes are identical (compared 8 bytes at a time through ``uint64`` views) are
skipped before any delta is computed, so identical and small-change pairs cost about one read of both
images. Only flagged blocks are refined at full resolution. :func:`exact_bbox` additionally uses the
shape of the answer: the top/bottom edges come only from the first/last flagged block rows, and
the left/right edges only from blocks outside the box's current x-range.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from imgdiff.morph import absdiff, transpose

BLOCK = 16
"""Side of the coarse grid's blocks in pixels."""

Box = tuple[int, int, int, int]


class SizeMismatchError(ValueError):
    """The two images have different sizes and ``allow_size_mismatch`` was not set."""


def validate(img: np.ndarray, name: str) -> np.ndarray:
    """Check one decoded image; return it as a contiguous ``(H, W, C)`` array."""
    if not isinstance(img, np.ndarray):
        raise ValueError(f"image {name}: expected a numpy array, got {type(img).__name__}")
    if img.dtype not in (np.uint8, np.uint16):
        raise ValueError(
            f"image {name}: expected dtype uint8 or uint16, got {img.dtype}; "
            "convert with arr.astype(np.uint8) or decode with imgdiff.io"
        )
    if img.ndim == 2:
        img = img[:, :, None]
    if img.ndim != 3:
        raise ValueError(f"image {name}: expected shape (H, W) or (H, W, C), got {img.shape}")
    if img.shape[2] not in (1, 3, 4):
        raise ValueError(f"image {name}: expected 1, 3 or 4 channels, got {img.shape[2]} (shape {img.shape})")
    if img.shape[0] == 0 or img.shape[1] == 0:
        raise ValueError(f"image {name}: expected a non-empty image, got shape {img.shape}")
    return np.ascontiguousarray(img)


def _to_channels(img: np.ndarray, c: int) -> np.ndarray:
    """Expand gray -> RGB(A) and RGB -> RGBA (opaque alpha at the dtype's max)."""
    have = img.shape[2]
    if have == c:
        return img
    if have == 1:
        img = np.repeat(img, 3, axis=2)
        have = 3
    if c == 4 and have == 3:
        alpha = np.full(img.shape[:2] + (1,), np.iinfo(img.dtype).max, dtype=img.dtype)
        img = np.concatenate([img, alpha], axis=2)
    return np.ascontiguousarray(img)


def normalise_pair(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """Bring a pair to the same channels and dtype (pure). Returns ``(a, b, scale)``.

    Gray vs RGB: gray is repeated to 3 channels (same content -> no difference). RGB vs RGBA: the
    missing alpha is opaque (dtype max); alpha is compared. uint8 vs uint16: uint8 is scaled by 257
    (255 -> 65535). ``scale`` converts raw deltas to 0-255 units (1 for uint8, 257 for uint16).
    """
    a = validate(a, "A")
    b = validate(b, "B")
    c = max(a.shape[2], b.shape[2])
    a, b = _to_channels(a, c), _to_channels(b, c)
    if a.dtype != b.dtype:
        a = a.astype(np.uint16) * np.uint16(257) if a.dtype == np.uint8 else a
        b = b.astype(np.uint16) * np.uint16(257) if b.dtype == np.uint8 else b
    scale = 257 if a.dtype == np.uint16 else 1
    return a, b, scale


def raw_threshold(threshold: float, scale: int) -> int:
    """Largest raw delta that is *not* a change: ``delta > threshold*scale``  <=>  ``delta > floor(.)``."""
    if threshold < 0:
        raise ValueError(f"threshold must be >= 0 (0-255 units), got {threshold}")
    return int(np.floor(threshold * scale))


def changed_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(H,) bool: rows whose bytes differ, compared 8 bytes at a time where the row allows it."""
    h = a.shape[0]
    ra = a.reshape(h, -1).view(np.uint8)  # (H, row_bytes)
    rb = b.reshape(h, -1).view(np.uint8)
    n8 = ra.shape[1] // 8 * 8
    out = np.zeros(h, dtype=bool)
    if n8 == ra.shape[1]:
        out |= (ra.view(np.uint64) != rb.view(np.uint64)).any(axis=1)
    else:
        out |= (ra != rb).any(axis=1)
    return out


def changed_bands(a: np.ndarray, b: np.ndarray, block: int) -> np.ndarray:
    """(Hb,) bool: bands of ``block`` rows whose bytes differ (the last band may be shorter).

    The first :data:`PREFIX_BYTES` of every band's first row are compared first; only the bands where
    they are equal are compared in full (:func:`changed_rows`), a run of consecutive such bands at a
    time. Same answer as reducing ``changed_rows`` per band, but where nearly every row differs (JPEG
    noise: a 4K pair's ~2 ms full compare) it reads almost nothing, and otherwise about as much."""
    h = a.shape[0]
    ra, rb = a.reshape(h, -1).view(np.uint8), b.reshape(h, -1).view(np.uint8)  # (H, row_bytes)
    n = min(ra.shape[1], PREFIX_BYTES)
    out = changed_rows(ra[::block, :n], rb[::block, :n])  # (Hb,)
    todo = np.flatnonzero(~out)
    if todo.size:
        cut = np.flatnonzero(np.diff(todo) > 1) + 1  # runs of consecutive bands: [starts[k], ends[k])
        starts, ends = todo[np.r_[0, cut]], todo[np.r_[cut - 1, todo.size - 1]] + 1
        for s, e in zip(starts.tolist(), ends.tolist()):
            rows = changed_rows(a[s * block : min(h, e * block)], b[s * block : min(h, e * block)])
            out[s:e] = np.add.reduceat(rows, np.arange(0, rows.size, block)) > 0
    return out


PREFIX_BYTES = 1024
"""Bytes of each band's first row that :func:`changed_bands` compares before deciding to read the band."""


def pixel_delta(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(h, w) per-pixel max-channel absolute delta in raw units, same dtype as the inputs."""
    h, w, c = a.shape
    d = absdiff(a.reshape(h, w * c), b.reshape(h, w * c)).reshape(h, w, c)  # (h, w, C)
    out = d[:, :, 0].copy()
    for k in range(1, c):  # elementwise maximum: much faster than a reduction over a length-3 axis
        np.maximum(out, d[:, :, k], out=out)
    return out


PARALLEL_ELEMENTS = 1 << 22
"""Array elements (rows x columns x channels) from which :func:`in_row_halves` uses two threads."""


def in_row_halves(fn, a: np.ndarray, b: np.ndarray, *args, unit: int) -> np.ndarray:
    """``fn(a, b, *args)`` for a row-separable ``fn`` (its output rows for input rows ``[k*unit, ...)``
    depend on those rows only), computed on the top and bottom halves of the rows (split at a multiple
    of ``unit``) in two threads and concatenated: NumPy releases the GIL in its loops, so a 4K pair's
    pass costs about half the wall time on two cores. Small arrays or one CPU: a plain call."""
    import os

    h = a.shape[0]
    mid = h // 2 // unit * unit
    if a.size < PARALLEL_ELEMENTS or mid == 0 or (os.cpu_count() or 1) < 2:
        return fn(a, b, *args)
    import threading

    top: list = [None]

    def upper() -> None:
        try:
            top[0] = fn(a[:mid], b[:mid], *args)
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            top[0] = e

    thread = threading.Thread(target=upper)
    thread.start()
    bottom = fn(a[mid:], b[mid:], *args)
    thread.join()
    if isinstance(top[0], BaseException):
        raise top[0]
    return np.concatenate([top[0], bottom])


def block_max_numpy(a: np.ndarray, b: np.ndarray, block: int = BLOCK) -> np.ndarray:
    """(Hb, Wb) uint32 max-pool of :func:`pixel_delta` over ``block``-sized tiles (edge tiles clipped);
    the two halves of the rows in two threads for large images (:func:`in_row_halves`)."""
    return in_row_halves(_block_max_numpy, a, b, block, unit=block)


def _block_max_numpy(a: np.ndarray, b: np.ndarray, block: int) -> np.ndarray:
    h, w, c = a.shape
    hb, wb = -(-h // block), -(-w // block)
    grid = np.zeros((hb, wb), dtype=np.uint32)
    a2, b2 = a.reshape(h, w * c), b.reshape(h, w * c)  # channels interleaved: a block is block*C columns
    bands = np.flatnonzero(changed_bands(a, b, block))
    if bands.size == 0:
        return grid
    colmax = np.zeros((bands.size, wb * block * c), a.dtype)  # (nb, Wb*block*C) max over each band's rows
    work = bands.size * block * w * c  # elements all the bands' absdiffs read: OpenCV when many
    for k, i in enumerate(bands):
        y0, y1 = i * block, min(h, (i + 1) * block)
        d = absdiff(a2[y0:y1], b2[y0:y1], work=work)  # (h_i, W*C)
        colmax[k, : w * c] = d.max(axis=0)  # over the rows: contiguous inner axis, vectorised
    # Over each tile's block*C columns. On the transpose the tile's columns are rows and the bands the
    # contiguous axis, so the halving maxima run over long rows: ~5x faster than on the short last axis.
    x = transpose(colmax).reshape(wb, block * c, bands.size)  # (Wb, block*C, nb)
    while x.shape[1] > c and x.shape[1] % (2 * c) == 0:
        x = np.maximum(x[:, : x.shape[1] // 2], x[:, x.shape[1] // 2 :])
    x = x.reshape(wb, -1, c, bands.size).max(axis=1)  # (Wb, C, nb); a no-op axis when block is 2**k
    out = x[:, 0].copy()
    for k in range(1, c):
        np.maximum(out, x[:, k], out=out)
    out = out.T  # (nb, Wb)
    grid[bands] = out
    return grid


def clip_boxes(ignore: Sequence[Sequence[int]], w: int, h: int) -> list[Box]:
    """Validate inclusive ignore boxes and clip them to the image; drop boxes fully outside."""
    out: list[Box] = []
    for box in ignore:
        if len(box) != 4:
            raise ValueError(f"ignore box must be (x0, y0, x1, y1), got {box!r}")
        x0, y0, x1, y1 = (int(v) for v in box)
        if x1 < x0 or y1 < y0:
            raise ValueError(f"ignore box must have x0 <= x1 and y0 <= y1, got {box!r}")
        x0, y0, x1, y1 = max(x0, 0), max(y0, 0), min(x1, w - 1), min(y1, h - 1)
        if x0 <= x1 and y0 <= y1:
            out.append((x0, y0, x1, y1))
    return out


def ignore_mask(boxes: Sequence[Box], h: int, w: int) -> np.ndarray | None:
    """(H, W) bool of ignored pixels, or None when there are none."""
    if not boxes:
        return None
    m = np.zeros((h, w), dtype=bool)
    for x0, y0, x1, y1 in boxes:
        m[y0 : y1 + 1, x0 : x1 + 1] = True
    return m


def refine_blocks(
    a: np.ndarray, b: np.ndarray, flagged: np.ndarray, block: int = BLOCK
) -> tuple[np.ndarray, tuple[int, int]]:
    """Full-resolution pixel deltas of the flagged blocks only.

    Returns ``(delta, (oy, ox))``: delta (h', w') covers the bounding box of the flagged blocks
    starting at pixel ``(oy, ox)``; pixels outside flagged blocks are 0.
    """
    h, w, _ = a.shape
    ys, xs = np.nonzero(flagged)
    by0, by1, bx0, bx1 = ys.min(), ys.max(), xs.min(), xs.max()
    oy, ox = by0 * block, bx0 * block
    ey, ex = min(h, (by1 + 1) * block), min(w, (bx1 + 1) * block)
    out = np.zeros((ey - oy, ex - ox), dtype=a.dtype)
    for i in range(by0, by1 + 1):
        cols = np.flatnonzero(flagged[i])
        if cols.size == 0:
            continue
        y0, y1 = i * block, min(h, (i + 1) * block)
        x0, x1 = cols[0] * block, min(w, (cols[-1] + 1) * block)
        d = pixel_delta(a[y0:y1, x0:x1], b[y0:y1, x0:x1])  # (h_i, w_i)
        keep = np.repeat(flagged[i, cols[0] : cols[-1] + 1], block)[: x1 - x0]
        out[y0 - oy : y1 - oy, x0 - ox : x1 - ox] = d * keep[None, :]
    return out, (int(oy), int(ox))


def exact_bbox(a: np.ndarray, b: np.ndarray, thr: int, grid: np.ndarray, block: int = BLOCK) -> Box | None:
    """Minimal inclusive box of pixels with delta > ``thr`` (raw units), from the coarse ``grid``.

    Uses the answer's shape: y0/y1 are refined only in the first/last flagged block rows; x0/x1
    only in the flagged blocks of the extreme block columns, and only in rows not already inside
    a known [x0, x1] range for that side.
    """
    flagged = grid > thr
    if not flagged.any():
        return None
    h, w, _ = a.shape
    rows = np.flatnonzero(flagged.any(axis=1))
    cols = np.flatnonzero(flagged.any(axis=0))

    def band(i0: int, i1: int, j0: int, j1: int) -> np.ndarray:
        y0, y1, x0, x1 = i0 * block, min(h, i1 * block), j0 * block, min(w, j1 * block)
        return pixel_delta(a[y0:y1, x0:x1], b[y0:y1, x0:x1]) > thr  # (h', w')

    # Top / bottom: the first/last flagged block row, over that row's flagged column span.
    def row_edge(i: int, last: bool) -> int:
        js = np.flatnonzero(flagged[i])
        m = band(i, i + 1, js[0], js[-1] + 1).any(axis=1)
        return i * block + int(np.flatnonzero(m)[-1 if last else 0])

    def col_edge(j: int, last: bool) -> int:
        iss = np.flatnonzero(flagged[:, j])
        m = band(iss[0], iss[-1] + 1, j, j + 1).any(axis=0)
        return j * block + int(np.flatnonzero(m)[-1 if last else 0])

    return (
        col_edge(cols[0], False),
        row_edge(rows[0], False),
        col_edge(cols[-1], True),
        row_edge(rows[-1], True),
    )

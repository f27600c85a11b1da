"""Public API on decoded arrays: :func:`diff`, :func:`change_mask` and both at once,
:func:`diff_and_mask` (pure; no file I/O).

Pipeline: validate + normalise the pair (:func:`imgdiff.core.normalise_pair`), handle a size
mismatch (diff the overlap; the non-overlapping strips of the ``max(W) x max(H)`` canvas count as
changed with delta 255), build the coarse max-pooled grid with the chosen backend, then find the
changed pixels with the chosen mode (exact: :mod:`imgdiff.core`; robust: :mod:`imgdiff.robust`), drop
ignored pixels, and reduce them to per-tile statistics that :mod:`imgdiff.regions` merges into regions.

Backends: ``numpy`` is the vectorised reference (it builds the crop's change mask, which
:func:`change_mask` returns; :func:`diff` in exact mode reduces chunks of tile rows straight to tile
statistics instead, :mod:`imgdiff.exact_tiles`); ``numba`` and ``cuda`` run fused kernels for the
grid, exact mode and robust pass 1. Robust mode's last step (:func:`imgdiff.robust.changed_pixels`,
on the candidate tiles only) is NumPy for every backend. All three give identical :class:`Result`
objects.
"""

from __future__ import annotations

import sys
from collections import namedtuple
from collections.abc import Sequence

import numpy as np

from imgdiff import core
from imgdiff.options import BACKENDS, DEFAULT_MERGE_GAP, DEFAULT_THRESHOLD, MODES  # noqa: F401 - re-exported
from imgdiff.regions import TILE, TileStats, empty_stats, regions_from_tiles, tile_stats_from_mask
from imgdiff.result import Result


def resolve_backend(backend: str) -> str:
    """Map ``auto`` to a concrete backend.

    ``auto`` never pays a start-up cost the caller did not already pay: it picks ``numba`` only
    when Numba is already imported in this process (a batch run, or a caller that warmed it up),
    else ``numpy``. Importing Numba and loading the cached kernels costs about 1 s, more than the
    NumPy path needs on a single 4K pair (identical / small-change pairs cost about one read of
    both images thanks to the 8-byte row skipping; see ``benchmarks/imgdiff_bench.py`` for the
    all-pixels-differ JPEG pairs). ``cuda`` is only used when asked for explicitly.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; expected one of {', '.join(BACKENDS)}")
    if backend == "auto":
        return "numba" if "numba" in sys.modules else "numpy"
    return backend


def block_max(a: np.ndarray, b: np.ndarray, *, backend: str = "numpy", block: int = core.BLOCK) -> np.ndarray:
    """(Hb, Wb) uint32 max-pooled per-pixel delta (raw units) computed by ``backend``."""
    backend = resolve_backend(backend)
    if backend == "numpy":
        return core.block_max_numpy(a, b, block)
    if backend == "numba":
        from imgdiff.kernels_cpu import block_max_numba

        return block_max_numba(a, b, block)
    from imgdiff.kernels_cuda import block_max_cuda

    return block_max_cuda(a, b, block)


class _Pair(namedtuple("_Pair", "a b scale thr mode params boxes width height")):
    """A validated, normalised pair and its resolved options (internal): ``a``, ``b`` the (h, w, C)
    overlaps of A and B; ``scale`` raw units per 0-255 level; ``thr`` the raw threshold (a delta
    ``> thr`` is a change); ``mode`` ``exact`` or ``robust``; ``params`` the
    :class:`imgdiff.robust.RobustParams` in robust mode, else None; ``boxes`` the clipped inclusive
    ignore boxes on the canvas; ``width``, ``height`` the canvas size (max of both).

    A named tuple: a frozen dataclass costs ~0.5 ms to create at import, on the CLI's critical path."""

    __slots__ = ()


def _prepare(a, b, *, mode, threshold, ignore, allow_size_mismatch, mode_params) -> _Pair:
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")
    a, b, scale = core.normalise_pair(a, b)
    threshold = DEFAULT_THRESHOLD[mode] if threshold is None else float(threshold)
    if mode == "exact" and mode_params:
        raise ValueError(f"mode 'exact' takes no extra parameters, got {sorted(mode_params)}")
    (ha, wa), (hb, wb) = a.shape[:2], b.shape[:2]
    if (ha, wa) != (hb, wb) and not allow_size_mismatch:
        raise core.SizeMismatchError(
            f"image sizes differ: A is {wa}x{ha}, B is {wb}x{hb}; pass allow_size_mismatch=True "
            "(CLI: --allow-size-mismatch) to diff the overlap and report the rest as changed"
        )
    h, w = min(ha, hb), min(wa, wb)
    H, W = max(ha, hb), max(wa, wb)
    boxes = core.clip_boxes(ignore, W, H)
    thr = core.raw_threshold(threshold, scale)
    params = None
    if mode == "robust":
        from imgdiff.robust import RobustParams

        unknown = sorted(set(mode_params) - set(RobustParams.names()))
        if unknown:
            raise TypeError(f"unknown robust parameter(s) {unknown}; expected some of {RobustParams.names()}")
        params = RobustParams(**mode_params)
    if (ha, wa) != (hb, wb):
        a, b = np.ascontiguousarray(a[:h, :w]), np.ascontiguousarray(b[:h, :w])
    return _Pair(a, b, scale, thr, mode, params, boxes, W, H)


def _drop_ignored(mask: np.ndarray, origin: tuple[int, int], boxes) -> np.ndarray:
    if not boxes:
        return mask
    mask = mask.copy()
    oy, ox = origin
    for x0, y0, x1, y1 in boxes:
        y0c, y1c = max(y0 - oy, 0), max(y1 + 1 - oy, 0)
        x0c, x1c = max(x0 - ox, 0), max(x1 + 1 - ox, 0)
        mask[y0c:y1c, x0c:x1c] = False
    return mask


def _robust_area(p: _Pair, grid: np.ndarray, backend: str):
    """Robust pass 1 on the crop of tiles ``grid`` (the (Ht, Wt) max-pooled ``|d|``) says can differ:
    ``(S (Hb, Wb, C), N (Hb, Wb), strong tiles (Ht, Wt) bool)``, or None when the pair is equal."""
    from imgdiff import robust

    a, b, prm = p.a, p.b, p.params
    h, w, _ = a.shape
    crop = robust.crop_box(grid, core.BLOCK, h, w)
    if crop is None:
        return None
    m = robust.margin_raw(prm, p.scale)
    if backend == "numba":
        from imgdiff.kernels_cpu import robust_sums_numba

        S, N, stiles = robust_sums_numba(a, b, crop, block=prm.block, window=prm.window, margin=m)
    elif backend == "cuda":
        from imgdiff.kernels_cuda import robust_sums_cuda

        S, N, stiles = robust_sums_cuda(a, b, crop, block=prm.block, window=prm.window, margin=m)
    else:
        S, N, stiles = robust.block_sums_numpy(a, b, crop, prm, m, grid=grid if core.BLOCK == TILE else None)
    return S, N, stiles


def _overlap_mask(p: _Pair, backend: str):
    """NumPy reference changed pixels of the overlap: ``None`` or ``(mask, raw delta, (oy, ox))``."""
    grid = block_max(p.a, p.b, backend=backend)
    if p.mode == "exact":
        flagged = grid > p.thr
        if not flagged.any():
            return None
        d, origin = core.refine_blocks(p.a, p.b, flagged)  # (h', w') raw
        return d > p.thr, d, origin
    from imgdiff.robust import changed_pixels

    found = _robust_area(p, grid, backend)
    if found is None:
        return None
    S, N, stiles = found
    return changed_pixels(p.a, p.b, S, N, stiles, grid, p.params, p.scale, p.thr)


def _canvas_mask(p: _Pair, backend: str):
    """``(mask, raw delta, origin)`` on the canvas (crop), ignored pixels removed; mask may be empty."""
    h, w, _ = p.a.shape
    found = _overlap_mask(p, backend)
    if (h, w) == (p.height, p.width):
        if found is None:
            return np.zeros((0, 0), bool), np.zeros((0, 0), np.int64), (0, 0)
        mask, d, origin = found
    else:  # the overlap's result in the canvas; the strips are changed with delta 255 levels
        mask = np.ones((p.height, p.width), bool)
        d = np.full((p.height, p.width), 255 * p.scale, np.int64)
        mask[:h, :w] = False
        d[:h, :w] = 0
        if found is not None:
            m, dd, (oy, ox) = found
            mask[oy : oy + m.shape[0], ox : ox + m.shape[1]] = m
            d[oy : oy + m.shape[0], ox : ox + m.shape[1]] = dd
        origin = (0, 0)
    return _drop_ignored(mask, origin, p.boxes), d, origin


def _tile_stats(p: _Pair, backend: str) -> TileStats:
    """Per-tile statistics of the changed pixels, by ``backend`` (all give identical numbers)."""
    h, w, _ = p.a.shape
    boxes = np.array(p.boxes, np.int64).reshape(-1, 4)
    if backend == "numpy" and p.mode == "exact" and (h, w) == (p.height, p.width):
        from imgdiff.exact_tiles import exact_stats_numpy

        return exact_stats_numpy(p.a, p.b, thr=p.thr, boxes=boxes)
    if backend == "numpy" or p.mode == "robust" or (h, w) != (p.height, p.width):
        mask, d, origin = _canvas_mask(p, backend)
        return tile_stats_from_mask(mask, d, origin, p.height, p.width)
    if backend == "numba" and p.mode == "exact":
        from imgdiff.kernels_cpu import exact_stats_numba

        return exact_stats_numba(p.a, p.b, thr=p.thr, boxes=boxes)
    tiles = block_max(p.a, p.b, backend=backend) > p.thr  # exact mode on cuda
    if not tiles.any():
        return empty_stats(h, w)
    from imgdiff.kernels_cuda import tile_stats_cuda

    return tile_stats_cuda(
        p.a, p.b, tiles, thr=p.thr, area=tiles, area_block=core.BLOCK, margin=float("inf"), window=3,
        boxes=boxes,
    )  # fmt: skip


def diff(
    a: np.ndarray,
    b: np.ndarray,
    *,
    mode: str = "robust",
    threshold: float | None = None,
    ignore: Sequence[tuple[int, int, int, int]] = (),
    backend: str = "auto",
    merge_gap: int = DEFAULT_MERGE_GAP,
    allow_size_mismatch: bool = False,
    **mode_params: float,
) -> Result:
    """Where do two decoded images differ?

    ``a``/``b``: (H, W) or (H, W, C), C in {1, 3, 4}, uint8 or uint16. ``mode``: ``"exact"`` (every
    pixel with a per-channel delta > ``threshold``, default 0) or ``"robust"`` (default; ignores
    JPEG noise and sub-pixel anti-aliasing shifts, see :mod:`imgdiff.robust`; ``mode_params`` are
    :class:`imgdiff.robust.RobustParams` fields). ``ignore``: inclusive ``(x0, y0, x1, y1)`` boxes.
    Raises ``ValueError`` on bad arrays/options and :class:`SizeMismatchError` on different sizes
    unless ``allow_size_mismatch``.
    """
    p = _prepare(
        a, b, mode=mode, threshold=threshold, ignore=ignore, allow_size_mismatch=allow_size_mismatch,
        mode_params=mode_params,
    )  # fmt: skip
    if merge_gap < 0:
        raise ValueError(f"merge_gap must be >= 0 pixels, got {merge_gap}")
    return _result(p, _tile_stats(p, resolve_backend(backend)), merge_gap)


def _result(p: _Pair, st: TileStats, merge_gap: int) -> Result:
    regions = regions_from_tiles(st, merge_gap=merge_gap, scale=p.scale)
    if not regions:
        return Result(bbox=None, regions=[], changed_pixels=0, width=p.width, height=p.height)
    bbox = (
        min(r.bbox[0] for r in regions),
        min(r.bbox[1] for r in regions),
        max(r.bbox[2] for r in regions),
        max(r.bbox[3] for r in regions),
    )
    return Result(
        bbox=bbox,
        regions=regions,
        changed_pixels=sum(r.pixels for r in regions),
        width=p.width,
        height=p.height,
    )


def change_mask(
    a: np.ndarray,
    b: np.ndarray,
    *,
    mode: str = "robust",
    threshold: float | None = None,
    ignore: Sequence[tuple[int, int, int, int]] = (),
    backend: str = "auto",
    allow_size_mismatch: bool = False,
    **mode_params: float,
) -> np.ndarray:
    """(H, W) bool mask of the changed pixels :func:`diff` would report (same options)."""
    p = _prepare(
        a, b, mode=mode, threshold=threshold, ignore=ignore, allow_size_mismatch=allow_size_mismatch,
        mode_params=mode_params,
    )  # fmt: skip
    mask, _, origin = _canvas_mask(p, resolve_backend(backend))
    return _full_mask(p, mask, origin)


def _full_mask(p: _Pair, mask: np.ndarray, origin: tuple[int, int]) -> np.ndarray:
    oy, ox = origin
    out = np.zeros((p.height, p.width), dtype=bool)
    out[oy : oy + mask.shape[0], ox : ox + mask.shape[1]] = mask
    return out


def diff_and_mask(
    a: np.ndarray,
    b: np.ndarray,
    *,
    mode: str = "robust",
    threshold: float | None = None,
    ignore: Sequence[tuple[int, int, int, int]] = (),
    backend: str = "auto",
    merge_gap: int = DEFAULT_MERGE_GAP,
    allow_size_mismatch: bool = False,
    **mode_params: float,
) -> tuple[Result, np.ndarray]:
    """``(diff(...), change_mask(...))`` with one detection pass (same options as :func:`diff`).

    The changed pixels are found once, as the NumPy reference mask (pass 1 and the pyramid use
    ``backend``), and the result is reduced from that mask: equal to :func:`diff` on every backend.
    """
    p = _prepare(
        a, b, mode=mode, threshold=threshold, ignore=ignore, allow_size_mismatch=allow_size_mismatch,
        mode_params=mode_params,
    )  # fmt: skip
    if merge_gap < 0:
        raise ValueError(f"merge_gap must be >= 0 pixels, got {merge_gap}")
    mask, d, origin = _canvas_mask(p, resolve_backend(backend))
    st = tile_stats_from_mask(mask, d, origin, p.height, p.width)
    return _result(p, st, merge_gap), _full_mask(p, mask, origin)

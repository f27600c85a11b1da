"""Public API on decoded arrays: :func:`diff` and :func:`change_mask` (pure; no file I/O).

Pipeline: validate + normalise the pair (:func:`imgdiff.core.normalise_pair`), handle a size
mismatch (diff the overlap; the non-overlapping strips of the ``max(W) x max(H)`` canvas count as
changed with delta 255), build the coarse max-pooled grid with the chosen backend, then find the
changed pixels with the chosen mode (exact: :mod:`imgdiff.core`; robust: :mod:`imgdiff.robust`), drop
ignored pixels, and group them into regions (:mod:`imgdiff.regions`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from imgdiff import core
from imgdiff.regions import find_regions
from imgdiff.result import Result

BACKENDS = ("auto", "numpy", "numba", "cuda")
"""Accepted ``backend`` names."""
MODES = ("exact", "robust")
"""Accepted ``mode`` names."""
DEFAULT_THRESHOLD = {"exact": 0.0, "robust": 2.0}
"""Per-channel delta (0-255 units) that counts as a change when ``threshold`` is None."""
DEFAULT_MERGE_GAP = 8
"""Regions with at most this many unchanged pixels between them merge."""


@dataclass(frozen=True)
class Changes:
    """Changed pixels of a pair, cropped to where they can be (internal)."""

    mask: np.ndarray
    """(h, w) bool changed pixels of the crop."""
    delta: np.ndarray
    """(h, w) float32 per-pixel max-channel delta in 0-255 units."""
    origin: tuple[int, int]
    """(oy, ox) of the crop in the full canvas."""
    width: int
    """Canvas width."""
    height: int
    """Canvas height."""


def resolve_backend(backend: str) -> str:
    """Map ``auto`` to a concrete backend.

    ``auto`` never pays a start-up cost the caller did not already pay: it picks ``numba`` only
    when Numba is already imported in this process (a batch run that warmed it up), else ``numpy``
    (which is within a small factor of the memory floor thanks to the 8-byte row skipping and
    OpenCV's SIMD absdiff). ``cuda`` is only used when asked for explicitly.
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


def _exact(a: np.ndarray, b: np.ndarray, scale: int, threshold: float, grid: np.ndarray):
    thr = core.raw_threshold(threshold, scale)
    flagged = grid > thr
    if not flagged.any():
        return None
    d, origin = core.refine_blocks(a, b, flagged)  # (h', w') raw
    return d > thr, d.astype(np.float32) / np.float32(scale), origin


def _changes(a, b, *, mode, threshold, ignore, backend, allow_size_mismatch, mode_params) -> Changes:
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
    core.raw_threshold(threshold, scale)  # validates
    params = None
    if mode == "robust":
        from imgdiff.robust import RobustParams

        unknown = sorted(set(mode_params) - set(RobustParams.names()))
        if unknown:
            raise TypeError(f"unknown robust parameter(s) {unknown}; expected some of {RobustParams.names()}")
        params = RobustParams(**mode_params)
    if (ha, wa) != (hb, wb):
        a, b = np.ascontiguousarray(a[:h, :w]), np.ascontiguousarray(b[:h, :w])
    grid = block_max(a, b, backend=backend)
    if mode == "exact":
        found = _exact(a, b, scale, threshold, grid)
    else:
        from imgdiff.robust import robust_changes

        found = robust_changes(a, b, scale=scale, grid=grid, threshold=threshold, params=params)
    if (h, w) == (H, W):
        if found is None:
            mask = np.zeros((0, 0), dtype=bool)
            return Changes(mask, np.zeros((0, 0), np.float32), (0, 0), W, H)
        mask, delta, origin = found
    else:  # paste the overlap's result into the canvas; the strips are changed (delta 255)
        mask = np.ones((H, W), dtype=bool)
        delta = np.full((H, W), 255.0, dtype=np.float32)
        mask[:h, :w] = False
        delta[:h, :w] = 0.0
        if found is not None:
            m, d, (oy, ox) = found
            mask[oy : oy + m.shape[0], ox : ox + m.shape[1]] = m
            delta[oy : oy + m.shape[0], ox : ox + m.shape[1]] = d
        origin = (0, 0)
    if boxes:
        mask = mask.copy()
        oy, ox = origin
        for x0, y0, x1, y1 in boxes:
            y0c, y1c = max(y0 - oy, 0), max(y1 + 1 - oy, 0)
            x0c, x1c = max(x0 - ox, 0), max(x1 + 1 - ox, 0)
            mask[y0c:y1c, x0c:x1c] = False
    return Changes(mask, delta, origin, W, H)


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
    ch = _changes(
        a,
        b,
        mode=mode,
        threshold=threshold,
        ignore=ignore,
        backend=backend,
        allow_size_mismatch=allow_size_mismatch,
        mode_params=mode_params,
    )
    regions = find_regions(ch.mask, ch.delta, merge_gap=merge_gap, origin=ch.origin) if ch.mask.size else []
    if not regions:
        return Result(bbox=None, regions=[], changed_pixels=0, width=ch.width, height=ch.height)
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
        width=ch.width,
        height=ch.height,
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
    ch = _changes(
        a,
        b,
        mode=mode,
        threshold=threshold,
        ignore=ignore,
        backend=backend,
        allow_size_mismatch=allow_size_mismatch,
        mode_params=mode_params,
    )
    out = np.zeros((ch.height, ch.width), dtype=bool)
    oy, ox = ch.origin
    out[oy : oy + ch.mask.shape[0], ox : ox + ch.mask.shape[1]] = ch.mask
    return out

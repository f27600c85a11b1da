"""Diff of two images that differ only in a band of rows, from that band alone (the CLI's fast path).

When the decoder can tell that only rows ``r0..r1`` may differ (:func:`imgdiff.pair_rows.read_pair_rows`),
:func:`band_rows` says which rows ``[y0, y1)`` :func:`diff_band` must see to give exactly
:func:`imgdiff.diff`'s answer on the whole images, and :func:`diff_band` returns that answer with
image coordinates. Why a band suffices (the rows outside it are equal in both images):

- exact mode looks at each pixel's own delta, summarised per ``TILE``-aligned tile, so a band that
  starts and ends on tile edges (or the image's end) sees the same tiles;
- robust mode (:mod:`imgdiff.robust`) reads the reference only around blocks whose signed sums are
  non-zero, i.e. inside pyramid cells (side ``block * 2**(levels-1)``, aligned to the image) that
  hold a changed row, plus ``ceil(spread/block)`` blocks and a 1-px border around them for the
  texture, 2 px around changed tiles for the strong test, and the 8-neighbour tiles of changed tiles
  with a 4-px border for the last step (:mod:`imgdiff.robust.verify`). The band is the cells holding changed
  rows plus whole cells of context covering that reach, so every block the rule reads sees the same
  pixels and the same pyramid grid; everything else of the rule sums zero deltas.

The same holds along the columns (the rule treats both axes alike), so :func:`diff_band` also cuts
the band to a window of the columns that hold changes plus the same context (:func:`band_rows` on
the columns): a small patch of a 4K band is diffed on ~384 columns instead of 3,840.
"""

from __future__ import annotations

from dataclasses import replace

from imgdiff.result import Result


def band_rows(height: int, r0: int, r1: int, *, mode: str = "robust", **mode_params) -> tuple[int, int]:
    """``(y0, y1)``: the rows :func:`diff_band` needs when only rows ``r0..r1`` (inclusive) may differ
    (or, with the width for ``height``, the columns it needs when only columns ``r0..r1`` may)."""
    from imgdiff.regions import TILE  # imports NumPy and OpenCV: not before the CLI starts inflating
    from imgdiff.robust.verify import PAD as VERIFY_PAD

    if mode == "exact":
        cell, reach = TILE, 0
    else:
        from imgdiff.robust import RobustParams

        p = RobustParams(**mode_params)
        cell = max(TILE, p.block << (p.levels - 1))
        reach = p.block * -(-p.spread // p.block) + max(p.window // 2, 2) + 1
        # the last step reads the 8-neighbour tiles of changed tiles with a PAD-px border
        reach = max(reach, TILE + VERIFY_PAD)
    context = -(-reach // cell) * cell  # whole cells, so the band keeps the image's grid
    y0 = max(0, r0 // cell * cell - context)
    y1 = min(height, (r1 // cell + 1) * cell + context)
    return y0, y1


def diff_band(a, b, *, y0: int, height: int, x0: int = 0, width: int | None = None, **options) -> Result:
    """:func:`imgdiff.diff` of two ``height``-row images given only their rows ``[y0, y0 + len(a))``,
    a band from :func:`band_rows` (the other rows are equal in both); boxes are in image coordinates.
    ``a``, ``b`` hold the columns ``[x0, x0 + a.shape[1])`` of ``width``-column images: a window
    from :func:`band_rows` on the columns, or whole rows (default), which are cut to the window
    that :func:`window_columns` picks before the diff."""
    from imgdiff.api import diff

    if options.get("allow_size_mismatch") or a.shape != b.shape:
        raise ValueError(f"diff_band needs two bands of one shape, got {a.shape} and {b.shape}")
    width = a.shape[1] if width is None else width
    if a.shape[1] == width:  # whole rows: cut them to the window
        mode_params = {k: v for k, v in options.items() if k not in _DIFF_OPTIONS}
        x0, x1 = window_columns(a, b, mode=options.get("mode", "robust"), **mode_params)
        a, b = a[:, x0:x1], b[:, x0:x1]
    ignore = [(bx0 - x0, by0 - y0, bx1 - x0, by1 - y0) for bx0, by0, bx1, by1 in options.pop("ignore", ())]
    res = diff(a, b, ignore=ignore, **options)

    def shift(box):
        return (box[0] + x0, box[1] + y0, box[2] + x0, box[3] + y0)

    return Result(
        bbox=None if res.bbox is None else shift(res.bbox),
        regions=[replace(r, bbox=shift(r.bbox)) for r in res.regions],
        changed_pixels=res.changed_pixels,
        width=width,
        height=height,
    )


_DIFF_OPTIONS = {"mode", "threshold", "ignore", "backend", "merge_gap", "allow_size_mismatch"}
""":func:`imgdiff.diff` options that are not parameters of a mode."""


def window_columns(a, b, *, mode: str = "robust", **mode_params) -> tuple[int, int]:
    """``(x0, x1)``: the columns of two bands that :func:`diff_band` must see, :func:`band_rows` applied
    to the columns: those holding changes (found on the rows that differ), plus the mode's context.
    All columns when none differ.

    Only the first and last changed columns matter, so they are searched from each side a
    :data:`COLUMN_STEP`-column slice at a time: a dense diff (a JPEG round trip) stops at the first
    slice of each side instead of comparing (and, on a subset of rows, copying) the whole band."""
    import numpy as np

    from imgdiff.core import changed_rows

    w = a.shape[1]
    rows = changed_rows(a, b)  # (h,) bool
    if not rows.any():
        return 0, w
    every_row = bool(rows.all())

    def differ(c0: int, c1: int) -> np.ndarray:
        """(c1 - c0,) bool: the columns ``[c0, c1)`` that differ on the changed rows."""
        sa, sb = a[:, c0:c1], b[:, c0:c1]  # views; only the changed rows of them are copied
        if not every_row:
            sa, sb = sa[rows], sb[rows]
        per_element = (sa != sb).reshape(len(sa), -1).any(axis=0)  # ((c1 - c0) * C,)
        return per_element.reshape(c1 - c0, -1).any(axis=1)

    first = last = None
    for c0 in range(0, w, COLUMN_STEP):
        got = differ(c0, min(c0 + COLUMN_STEP, w))
        if got.any():
            first = c0 + int(np.argmax(got))
            break
    for c1 in range(w, first, -COLUMN_STEP):
        c0 = max(c1 - COLUMN_STEP, first)
        got = differ(c0, c1)
        if got.any():
            last = c1 - 1 - int(np.argmax(got[::-1]))
            break
    return band_rows(w, first, last, mode=mode, **mode_params)


COLUMN_STEP = 128
"""Columns compared at a time by :func:`window_columns` from each side."""

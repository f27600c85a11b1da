"""Diff of two images that differ only in a band of rows, from that band alone (the CLI's fast path).

When the decoder can tell that only rows ``r0..r1`` may differ (:func:`imgdiff.png.changed_span`),
:func:`band_rows` says which rows ``[y0, y1)`` :func:`diff_band` must see to give exactly
:func:`imgdiff.diff`'s answer on the whole images, and :func:`diff_band` returns that answer with
image coordinates. Why a band suffices (the rows outside it are equal in both images):

- exact mode looks at each pixel's own delta, summarised per ``TILE``-aligned tile, so a band that
  starts and ends on tile edges (or the image's end) sees the same tiles;
- robust mode (:mod:`imgdiff.robust`) reads the reference only around blocks whose signed sums are
  non-zero, i.e. inside pyramid cells (side ``block * 2**(levels-1)``, aligned to the image) that
  hold a changed row, plus ``ceil(spread/block)`` blocks and a 1-px border around them for the
  texture, and 2 px around changed tiles for the strong test. The band is the cells holding changed
  rows plus whole cells of context covering that reach, so every block the rule reads sees the same
  pixels and the same pyramid grid; everything else of the rule sums zero deltas.
"""

from __future__ import annotations

from dataclasses import replace

from imgdiff.result import Result


def band_rows(height: int, r0: int, r1: int, *, mode: str = "robust", **mode_params) -> tuple[int, int]:
    """``(y0, y1)``: the rows :func:`diff_band` needs when only rows ``r0..r1`` (inclusive) may differ."""
    from imgdiff.regions import TILE  # imports NumPy and OpenCV: not before the CLI starts inflating

    if mode == "exact":
        cell, reach = TILE, 0
    else:
        from imgdiff.robust import RobustParams

        p = RobustParams(**mode_params)
        cell = max(TILE, p.block << (p.levels - 1))
        reach = p.block * -(-p.spread // p.block) + max(p.window // 2, 2) + 1
    context = -(-reach // cell) * cell  # whole cells, so the band keeps the image's grid
    y0 = max(0, r0 // cell * cell - context)
    y1 = min(height, (r1 // cell + 1) * cell + context)
    return y0, y1


def diff_band(a, b, *, y0: int, height: int, **options) -> Result:
    """:func:`imgdiff.diff` of two ``height``-row images given only their rows ``[y0, y0 + len(a))``,
    a band from :func:`band_rows` (the other rows are equal in both); boxes are in image rows."""
    from imgdiff.api import diff

    if options.get("allow_size_mismatch") or a.shape != b.shape:
        raise ValueError(f"diff_band needs two bands of one shape, got {a.shape} and {b.shape}")
    ignore = [(x0, by0 - y0, x1, by1 - y0) for x0, by0, x1, by1 in options.pop("ignore", ())]
    ignore = [box for box in ignore if box[3] >= 0]
    res = diff(a, b, ignore=ignore, **options)

    def shift(box):
        return (box[0], box[1] + y0, box[2], box[3] + y0)

    return Result(
        bbox=None if res.bbox is None else shift(res.bbox),
        regions=[replace(r, bbox=shift(r.bbox)) for r in res.regions],
        changed_pixels=res.changed_pixels,
        width=res.width,
        height=height,
    )

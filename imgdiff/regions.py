"""Regions: connected components of changed pixels, merged when closer than ``merge_gap`` pixels.

Two changed pixels belong to the same region when a chain of changed pixels joins them in which
consecutive pixels are at most ``merge_gap`` pixels apart along each axis, i.e. at most ``merge_gap``
unchanged pixels lie between them (Chebyshev distance ``<= merge_gap + 1``). ``merge_gap = 0`` is plain
8-connectivity. Implementation: dilate the mask by a ``(merge_gap+1)``-square anchored at its top-left
(each pixel reaches ``merge_gap`` pixels right and down), take 8-connected components of the dilated
mask with OpenCV, and read every region's statistics from the *original* changed pixels only.
"""

from __future__ import annotations

import cv2
import numpy as np

from imgdiff.result import Region


def find_regions(
    mask: np.ndarray, delta: np.ndarray, *, merge_gap: int, origin: tuple[int, int] = (0, 0)
) -> list[Region]:
    """Regions of ``mask`` (h, w) bool; ``delta`` (h, w) float is each pixel's delta in 0-255 units.

    ``origin`` = ``(oy, ox)`` of the crop in the full image. Regions are sorted by
    ``(y0, x0, y1, x1)``.
    """
    if merge_gap < 0:
        raise ValueError(f"merge_gap must be >= 0 pixels, got {merge_gap}")
    if not mask.any():
        return []
    ys, xs = np.nonzero(mask)
    y_lo, y_hi, x_lo, x_hi = ys.min(), ys.max(), xs.min(), xs.max()
    m = mask[y_lo : y_hi + 1, x_lo : x_hi + 1]  # (h', w') tight crop
    d = delta[y_lo : y_hi + 1, x_lo : x_hi + 1]
    g = int(merge_gap)
    work = np.zeros((m.shape[0] + g, m.shape[1] + g), dtype=np.uint8)  # room to dilate right/down
    work[: m.shape[0], : m.shape[1]] = m
    if g > 0:
        kernel = np.ones((g + 1, g + 1), np.uint8)
        work = cv2.dilate(work, kernel, anchor=(g, g))  # out[p] = max(in[p-g .. p])
    n, labels, stats, _ = cv2.connectedComponentsWithStats(work, connectivity=8, ltype=cv2.CV_32S)
    lab = labels[: m.shape[0], : m.shape[1]]
    on = lab[m]  # (N,) labels of the changed pixels
    dv = d[m].astype(np.float64)
    counts = np.bincount(on, minlength=n)
    sums = np.bincount(on, weights=dv, minlength=n)
    maxes = np.zeros(n)
    if n <= 256:
        for k in range(1, n):
            x, y, ww, hh = stats[k, :4]
            sub = lab[y : y + hh, x : x + ww] == k
            sub &= m[y : y + hh, x : x + ww]
            if sub.any():
                maxes[k] = d[y : y + hh, x : x + ww][sub].max()
    else:
        order = np.argsort(on, kind="stable")
        starts = np.searchsorted(on[order], np.arange(n))
        valid = counts > 0
        maxes[valid] = np.maximum.reduceat(dv[order], starts[valid])
    oy, ox = origin[0] + int(y_lo), origin[1] + int(x_lo)
    out = []
    for k in range(1, n):
        if counts[k] == 0:
            continue
        x, y, ww, hh = (int(v) for v in stats[k, :4])
        # The dilated component spans exactly [min, max + g] of its pixels (room was padded).
        box = (ox + x, oy + y, ox + x + ww - 1 - g, oy + y + hh - 1 - g)
        out.append(
            Region(
                bbox=box,
                pixels=int(counts[k]),
                max_delta=float(maxes[k]),
                mean_delta=float(sums[k] / counts[k]),
            )
        )
    out.sort(key=lambda r: (r.bbox[1], r.bbox[0], r.bbox[3], r.bbox[2]))
    return out

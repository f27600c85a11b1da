"""Regenerate ``assets/sample_a.png`` and ``assets/sample_b.png`` (seeded, deterministic pixels).

A is a synthetic 640x400 "photo": smooth lighting gradient, soft blobs, fine texture and anti-aliased
text. B is A after a JPEG q90 round trip (noise everywhere, which the robust mode ignores) with two
real changes: a small red square (a strong, local change) and a +8-level brightness bump over a
160x100 area (a weak, smooth change that only coherent aggregation finds). The README demo runs
``imgdiff assets/sample_a.png assets/sample_b.png``.

Usage: ``python assets/make_samples.py [OUT_DIR]`` (default: this folder).
"""

from __future__ import annotations

import os
import sys

import cv2
import numpy as np

WIDTH, HEIGHT = 640, 400
SEED = 20261129
SQUARE = (420, 90, 435, 105)
"""Inclusive box of the red square drawn on B."""
BUMP = (80, 230, 239, 329)
"""Inclusive box of the +8 brightness bump on B."""
TEXT, TEXT_ORG, TEXT_SCALE, TEXT_THICKNESS = "notelens imgdiff", (24, 60), 1.4, 2
"""The caption drawn on A (OpenCV's Hershey simplex font, anti-aliased)."""


def text_box() -> tuple[int, int, int, int]:
    """Inclusive box that holds the caption's pixels (glyph rasterising differs between OpenCV releases)."""
    (w, h), base = cv2.getTextSize(TEXT, cv2.FONT_HERSHEY_SIMPLEX, TEXT_SCALE, TEXT_THICKNESS)
    x, y = TEXT_ORG
    m = TEXT_THICKNESS + 2  # stroke width and anti-aliasing
    return x - m, y - h - m, x + w + m, y + base + m


def make_pair(seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """(A, B) as (H, W, 3) uint8 RGB arrays."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)  # (H, W)
    base = np.stack([60 + 0.15 * xx, 90 + 0.2 * yy, 140 - 0.1 * xx + 0.05 * yy], axis=2)  # (H, W, 3)
    for _ in range(12):
        cx, cy, r = rng.uniform(0, WIDTH), rng.uniform(0, HEIGHT), rng.uniform(20, 90)
        colour = rng.uniform(-60, 60, size=3).astype(np.float32)
        base += np.exp(-((xx - cx) ** 2 + (yy - cy) ** 2) / (2 * r * r))[:, :, None] * colour
    small = rng.normal(0, 6, size=(HEIGHT // 4, WIDTH // 4, 3)).astype(np.float32)
    base += cv2.resize(small, (WIDTH, HEIGHT), interpolation=cv2.INTER_CUBIC)  # fine texture
    a = np.clip(base, 0, 255).astype(np.uint8)
    white = (250, 250, 245)
    cv2.putText(a, TEXT, TEXT_ORG, cv2.FONT_HERSHEY_SIMPLEX, TEXT_SCALE, white, TEXT_THICKNESS, cv2.LINE_AA)
    ok, jpg = cv2.imencode(".jpg", a[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    b = cv2.imdecode(jpg, cv2.IMREAD_COLOR)[:, :, ::-1].copy()  # (H, W, 3) RGB, JPEG noise everywhere
    x0, y0, x1, y1 = BUMP
    b[y0 : y1 + 1, x0 : x1 + 1] = np.clip(b[y0 : y1 + 1, x0 : x1 + 1].astype(np.int16) + 8, 0, 255)
    x0, y0, x1, y1 = SQUARE
    b[y0 : y1 + 1, x0 : x1 + 1] = (220, 30, 40)
    return a, b


def main(out_dir: str) -> None:
    a, b = make_pair()
    for name, img in (("sample_a.png", a), ("sample_b.png", b)):
        cv2.imwrite(os.path.join(out_dir, name), img[:, :, ::-1], [cv2.IMWRITE_PNG_COMPRESSION, 9])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__)))

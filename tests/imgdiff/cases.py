"""Seeded synthetic "photo-like" golden cases for robust/exact mode (pure; no file I/O).

Used by the golden tests at ~512x384 and reusable by benchmarks at 4K: every geometry is
relative to the image size. API::

    make_case(name, *, h=384, w=512, seed=0) -> Case     # one case; names in CASE_NAMES
    make_cases(*, h=384, w=512, seed=0) -> list[Case]     # all of them
    photo(h, w, *, seed=0) -> (H, W, 3) uint8              # the reference image
    jpeg(img, quality=90) -> same shape, re-encoded in memory (cv2.imencode/imdecode)

A :class:`Case` holds ``a``, ``b``, the expected inclusive box (``None`` = no difference) and a
per-side tolerance ``(left, top, right, bottom)`` in pixels for robust mode: the found box must
be within ``tol`` of ``expect`` on every side.
"""

from __future__ import annotations

from dataclasses import dataclass

import cv2
import numpy as np

Box = tuple[int, int, int, int]


@dataclass(frozen=True)
class Case:
    """One golden pair."""

    name: str
    """Case name (one of CASE_NAMES)."""
    a: np.ndarray
    """Reference image."""
    b: np.ndarray
    """Changed image."""
    expect: Box | None
    """Expected inclusive (x0, y0, x1, y1) box, or None for 'no difference'."""
    tol: tuple[int, int, int, int] = (0, 0, 0, 0)
    """Allowed |found - expected| per side (left, top, right, bottom) in pixels."""


def photo(h: int, w: int, *, seed: int = 0) -> np.ndarray:
    """(H, W, 3) uint8: smooth gradients + texture noise + anti-aliased shapes and text."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    yy /= h
    xx /= w
    base = np.stack(
        [60 + 90 * xx + 20 * np.sin(6.0 * yy), 70 + 80 * yy + 15 * np.cos(5.0 * xx), 150 - 60 * xx * yy],
        axis=2,
    )  # (H, W, 3)
    noise = rng.normal(0.0, 5.0, size=(h // 2 + 1, w // 2 + 1, 3)).astype(np.float32)
    noise = cv2.resize(noise, (w, h), interpolation=cv2.INTER_LINEAR)  # soft texture
    img = base + noise.reshape(h, w, 3)
    u = max(1, min(h, w) // 128)  # geometry unit
    layers = [np.zeros((h, w), np.uint8) for _ in range(3)]  # AA drawing needs 8-bit canvases
    cv2.circle(layers[0], (int(0.75 * w), int(0.3 * h)), 12 * u, 255, -1, cv2.LINE_AA)
    cv2.rectangle(
        layers[1], (int(0.1 * w), int(0.65 * h)), (int(0.3 * w), int(0.85 * h)), 255, -1, cv2.LINE_AA
    )
    cv2.putText(
        layers[2],
        "notelens 42",
        (int(0.45 * w), int(0.8 * h)),
        cv2.FONT_HERSHEY_SIMPLEX,
        0.35 * u,
        255,
        max(1, u // 2),
        cv2.LINE_AA,
    )
    for layer, colour in zip(layers, [(200, 60, 40), (30, 40, 35), (240, 240, 230)]):
        c = layer[:, :, None].astype(np.float32) / 255
        img = img * (1 - c) + np.float32(colour) * c
    return np.clip(img + 0.5, 0, 255).astype(np.uint8)


def jpeg(img: np.ndarray, quality: int = 90) -> np.ndarray:
    """Re-encode through JPEG in memory."""
    ok, buf = cv2.imencode(".jpg", img, [cv2.IMWRITE_JPEG_QUALITY, quality])
    assert ok
    return cv2.imdecode(buf, cv2.IMREAD_UNCHANGED).reshape(img.shape)


def _rect(w: int, h: int, fx0: float, fy0: float, fx1: float, fy1: float) -> Box:
    return int(fx0 * w), int(fy0 * h), int(fx1 * w) - 1, int(fy1 * h) - 1


def _add(img: np.ndarray, box: Box, delta) -> np.ndarray:
    out = img.astype(np.int32)
    x0, y0, x1, y1 = box
    out[y0 : y1 + 1, x0 : x1 + 1] += np.asarray(delta, dtype=np.int32)
    return np.clip(out, 0, np.iinfo(img.dtype).max).astype(img.dtype)


def _text_layer(h: int, w: int, shift: float, u: int) -> np.ndarray:
    """(H, W) float32 anti-aliased text coverage, shifted right/down by ``shift`` px."""
    layer8 = np.zeros((h, w), np.uint8)
    cv2.putText(
        layer8,
        "Hello AA text",
        (int(0.05 * w), int(0.15 * h)),
        cv2.FONT_HERSHEY_SIMPLEX,
        0.3 * u,
        255,
        max(1, u // 3),
        cv2.LINE_AA,
    )
    layer = layer8.astype(np.float32) / 255
    if shift:
        m = np.float32([[1, 0, shift], [0, 1, shift]])
        layer = cv2.warpAffine(layer, m, (w, h), flags=cv2.INTER_LINEAR)
    return layer


def _blend(img: np.ndarray, cover: np.ndarray, colour) -> np.ndarray:
    c = cover[:, :, None]
    return np.clip(img * (1 - c) + np.float32(colour) * c + 0.5, 0, 255).astype(np.uint8)


def _bbox(m: np.ndarray) -> Box:
    ys, xs = np.nonzero(m)
    return int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max())


CASE_NAMES = (
    "identical",
    "bump8",
    "ramp12",
    "small_patch",
    "single_pixel",
    "text_subpixel_shift",
    "jpeg_q90",
    "jpeg_q90_patch",
    "jpeg_q90_bump",
    "gray_vs_rgb",
    "alpha_change",
    "uint16_change",
    "equal_luma_colour",
    "thin_line",
    "removed_dot",
    "text_added",
)
"""Names accepted by :func:`make_case`."""


def make_case(name: str, *, h: int = 384, w: int = 512, seed: int = 0) -> Case:
    """Build one named golden case at size ``h x w``."""
    a = photo(h, w, seed=seed)
    u = max(1, min(h, w) // 128)
    jt = 8 if min(h, w) <= 512 else 16  # JPEG cases: refined blocks may keep up to one tile of noise
    if name == "identical":
        return Case(name, a, a.copy(), None)
    if name == "bump8":  # 900x600 at 4K
        box = _rect(w, h, 0.2, 0.2, 0.2 + 900 / 3840, 0.2 + 600 / 2160)
        return Case(name, a, _add(a, box, 8), box, (2, 2, 2, 2))
    if name == "ramp12":  # 0 -> 12 left to right
        x0, y0, x1, y1 = box = _rect(w, h, 0.5, 0.3, 0.9, 0.6)
        ramp = np.round(np.linspace(0, 12, x1 - x0 + 1)).astype(np.int32)  # (w',)
        b = a.astype(np.int32)
        b[y0 : y1 + 1, x0 : x1 + 1] += ramp[None, :, None]
        b = np.clip(b, 0, 255).astype(np.uint8)
        first = x0 + int(np.flatnonzero(ramp > 0)[0])
        return Case(name, a, b, (first, y0, x1, y1), ((x1 - x0) // 4, 2, 2, 2))
    if name == "small_patch":
        box = _rect(w, h, 0.6, 0.5, 0.6, 0.5)
        box = (box[0], box[1], box[0] + 3 * u, box[1] + 2 * u)
        return Case(name, a, _add(a, box, (50, -40, 30)), box)
    if name == "single_pixel":
        x, y = int(0.33 * w), int(0.71 * h)
        b = _add(a, (x, y, x, y), 60)
        return Case(name, a, b, (x, y, x, y))
    if name == "text_subpixel_shift":
        return Case(
            name, _blend(a, _text_layer(h, w, 0.0, u), 20), _blend(a, _text_layer(h, w, 0.3, u), 20), None
        )
    if name == "jpeg_q90":
        return Case(name, a, jpeg(a), None)
    if name == "jpeg_q90_patch":
        box = _rect(w, h, 0.4, 0.4, 0.4, 0.4)
        box = (box[0], box[1], box[0] + 5 * u, box[1] + 4 * u)
        return Case(name, a, jpeg(_add(a, box, (-60, 50, 60))), box, (jt, jt, jt, jt))
    if name == "jpeg_q90_bump":
        box = _rect(w, h, 0.3, 0.25, 0.55, 0.5)
        return Case(name, a, jpeg(_add(a, box, 8)), box, (jt, jt, jt, jt))
    if name == "gray_vs_rgb":
        g = cv2.cvtColor(a, cv2.COLOR_RGB2GRAY)
        return Case(name, g, np.repeat(g[:, :, None], 3, axis=2), None)
    if name == "alpha_change":
        a4 = np.concatenate([a, np.full((h, w, 1), 255, np.uint8)], axis=2)
        box = _rect(w, h, 0.7, 0.1, 0.8, 0.2)
        b4 = a4.copy()
        b4[box[1] : box[3] + 1, box[0] : box[2] + 1, 3] = 200
        return Case(name, a4, b4, box)
    if name == "uint16_change":
        rng = np.random.default_rng(seed + 1)
        a16 = a.astype(np.uint16) * 257 + rng.integers(0, 120, a.shape, dtype=np.uint16)  # sub-level jitter
        b16 = a.astype(np.uint16) * 257 + rng.integers(0, 120, a.shape, dtype=np.uint16)
        box = _rect(w, h, 0.15, 0.3, 0.35, 0.45)
        return Case(name, a16, _add(b16, box, 10 * 257), box, (2, 2, 2, 2))
    if name == "equal_luma_colour":  # dY = 0.299*20 - 0.587*10 ~ 0.1; its bottom edge touches text
        box = _rect(w, h, 0.6, 0.7, 0.75, 0.8)
        return Case(name, a, _add(a, box, (20, -10, 0)), box, (2, 2, 2, 4))
    if name == "thin_line":
        y, x0, x1 = int(0.55 * h), int(0.1 * w), int(0.4 * w)
        b = a.copy()
        b[y, x0 : x1 + 1] = np.clip(a[y, x0 : x1 + 1].astype(np.int32) + 60, 0, 255)
        return Case(name, a, b, (x0, y, x1, y))
    if name == "removed_dot":  # a has a dark 2x2 dot that b lacks (caught by the B-side range test)
        x, y = int(0.85 * w), int(0.6 * h)
        return Case(name, _add(a, (x, y, x + 1, y + 1), -90), a.copy(), (x, y, x + 1, y + 1))
    if name == "text_added":
        cover8 = np.zeros((h, w), np.uint8)
        cv2.putText(
            cover8,
            "NEW",
            (int(0.2 * w), int(0.45 * h)),
            cv2.FONT_HERSHEY_SIMPLEX,
            0.4 * u,
            255,
            max(1, u // 2),
            cv2.LINE_AA,
        )
        cover = cover8.astype(np.float32) / 255
        b = _blend(a, cover, 250)
        return Case(name, a, b, _bbox(np.abs(b.astype(int) - a.astype(int)).max(axis=2) > 2), (3, 3, 3, 3))
    raise ValueError(f"unknown case {name!r}; expected one of {', '.join(CASE_NAMES)}")


def make_cases(*, h: int = 384, w: int = 512, seed: int = 0) -> list[Case]:
    """All golden cases at size ``h x w``."""
    return [make_case(n, h=h, w=w, seed=seed) for n in CASE_NAMES]

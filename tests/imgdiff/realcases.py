"""Seeded imgdiff pairs built on real photos (:mod:`tests.imgdiff.photos`), pure: nothing is written.

Every case starts from one photo of :data:`PHOTOS` resized to a named size (``small`` 960x540 for
fast tests, ``4k`` 3840x2160 for what users diff) and changes it in one known way:

- ``jpeg_q75`` / ``jpeg_q90``: the photo (A, lossless) against its own JPEG re-encode (B);
  ``jpeg_q75_q90``: the two re-encodes against each other. Expected: no difference.
- ``patch_<w>x<h>_<amp>_<grey|colour>[_jpeg]``: a ``w x h`` box at a seeded position gets a signed
  delta whose largest channel is ``amp`` levels (grey: the same delta on every channel; the sign that
  clips less); ``_jpeg``: B is the JPEG q90 re-encode of the changed photo. Expected: the box of the
  pixels the delta changed (the whole box unless clipping ate an edge).
- ``text_sub_<dx>_<dy>``: one line of anti-aliased text (DejaVu Sans, rendered at 4x and averaged
  down) on the photo, against the same text rendered ``(dx, dy)`` px off, a sub-pixel offset
  (0.25 / 0.5 px). Expected: no difference.
- ``text_shift_<right|down|both>``: the same text block moved by one whole pixel. Expected: the union
  of the boxes of the two renderings (pixels the text covers in A or in B).

API::

    SIZES, PHOTOS, CASE_NAMES
    base(photo_name, size) -> (H, W, 3) uint8          # the photo at that size (read-only)
    jpeg(img, quality) -> img re-encoded in memory      # Pillow, 4:2:0, as most encoders do
    make_case(photo_name, case_name, size="small") -> RealCase
    make_cases(photo_name, size="small", names=CASE_NAMES) -> list[RealCase]

Positions, signs and colours come from a generator seeded by (photo, case), so a case is the same in
every process.
"""

from __future__ import annotations

import io
import os
import zlib
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from tests.imgdiff.photos import PHOTOS, photo_4k

Box = tuple[int, int, int, int]  # inclusive (x0, y0, x1, y1)

SIZES = {"small": (540, 960), "4k": (2160, 3840)}
"""Named sizes, (height, width)."""
PATCH_SIZES = ((16, 16), (32, 32), (64, 64), (200, 120))
"""Planted change sizes (width, height) in pixels at every image size."""
AMPLITUDES = (24, 40, 80)
"""Largest per-channel delta of a planted change, in levels."""
SUB_OFFSETS = ((0.25, 0.0), (0.5, 0.0), (0.0, 0.5), (0.25, 0.25), (0.5, 0.5))
"""Sub-pixel re-render offsets (dx, dy) in pixels (multiples of 1/4: the text is rendered at 4x)."""
SHIFTS = {"right": (1, 0), "down": (0, 1), "both": (1, 1)}
"""Whole-pixel moves of the text block."""
TEXT = "Quarterly totals 2026: 4,217 units (+3.8%)"
"""The text line drawn on the photos."""
OVERSAMPLE = 4
"""Text is rendered at this many times the image resolution, then averaged down."""


def _patch_names() -> list[str]:
    out = []
    for w, h in PATCH_SIZES:
        for amp in AMPLITUDES:
            for kind in ("grey", "colour"):
                out += [f"patch_{w}x{h}_{amp}_{kind}", f"patch_{w}x{h}_{amp}_{kind}_jpeg"]
    return out


JPEG_NAMES = ("jpeg_q75", "jpeg_q90", "jpeg_q75_q90")
PATCH_NAMES = tuple(_patch_names())
TEXT_SUB_NAMES = tuple(f"text_sub_{dx:g}_{dy:g}" for dx, dy in SUB_OFFSETS)
TEXT_SHIFT_NAMES = tuple(f"text_shift_{k}" for k in SHIFTS)
CASE_NAMES = JPEG_NAMES + PATCH_NAMES + TEXT_SUB_NAMES + TEXT_SHIFT_NAMES
"""Every case name :func:`make_case` accepts."""


@dataclass(frozen=True)
class RealCase:
    """One pair on a real photo."""

    photo: str
    """Photo name (one of :data:`PHOTOS`)."""
    name: str
    """Case name (one of :data:`CASE_NAMES`)."""
    size: str
    """Size name (a key of :data:`SIZES`)."""
    a: np.ndarray
    """Reference image (H, W, 3) uint8."""
    b: np.ndarray
    """Changed image (H, W, 3) uint8."""
    expect: Box | None
    """Expected inclusive (x0, y0, x1, y1) box, or None for 'no difference'."""


def base(photo_name: str, size: str) -> np.ndarray:
    """(H, W, 3) uint8: the photo resized (bicubic) to the named size; read-only."""
    if size not in SIZES:
        raise KeyError(f"unknown size {size!r}; expected one of {tuple(SIZES)}")
    h, w = SIZES[size]
    return photo_4k(photo_name, h, w)


def jpeg(img: np.ndarray, quality: int) -> np.ndarray:
    """``img`` (H, W, 3) uint8 RGB re-encoded through JPEG at ``quality`` in memory (Pillow, 4:2:0)."""
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=int(quality))
    return np.asarray(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"))


def _rng(photo_name: str, case_name: str, size: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(f"{photo_name}/{case_name}/{size}".encode()))


def _plant(img: np.ndarray, box: Box, amp: int, colour: bool, rng: np.random.Generator) -> np.ndarray:
    """``img`` with a signed delta on ``box``; the sign is flipped where the patch would mostly clip."""
    x0, y0, x1, y1 = box
    if colour:  # the largest channel gets |amp|, the others a seeded fraction of either sign
        delta = rng.uniform(-1.0, 1.0, 3)
        delta[int(rng.integers(0, 3))] = 1.0
        delta = np.round(delta * amp).astype(np.int32)
    else:
        delta = np.full(3, amp, np.int32)
    if rng.random() < 0.5:
        delta = -delta
    region = img[y0 : y1 + 1, x0 : x1 + 1].astype(np.int32)  # (h, w, 3)

    def clipped(dv: np.ndarray) -> int:  # delta lost to clipping, summed over the patch
        return int(np.abs(np.clip(region + dv, 0, 255) - region - dv).sum())

    if clipped(-delta) < clipped(delta):  # the sign that keeps more of the change
        delta = -delta
    out = img.astype(np.int32)
    out[y0 : y1 + 1, x0 : x1 + 1] += delta
    return np.clip(out, 0, 255).astype(np.uint8)


@lru_cache(maxsize=4)
def _font(px: int) -> ImageFont.FreeTypeFont:
    import matplotlib

    path = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data", "fonts", "ttf", "DejaVuSans.ttf")
    return ImageFont.truetype(path, px)


def _text_cover(h: int, w: int, org: tuple[int, int], px: int, off: tuple[int, int]) -> np.ndarray:
    """(h, w) float32 coverage in [0, 1] of :data:`TEXT` at ``px`` px with its top-left at ``org``
    (x, y) + ``off`` (x, y) in 1/:data:`OVERSAMPLE` px: rendered at 4x and averaged over 4x4 cells."""
    s = OVERSAMPLE
    hi = Image.new("L", (w * s, h * s), 0)
    x, y = org
    ImageDraw.Draw(hi).text((x * s + off[0], y * s + off[1]), TEXT, fill=255, font=_font(px * s))
    cov = np.asarray(hi, np.float32).reshape(h, s, w, s).mean(axis=(1, 3)) / 255.0
    return cov


def _composite(img: np.ndarray, cover: np.ndarray, colour: np.ndarray) -> np.ndarray:
    c = cover[:, :, None]
    return np.clip(img * (1.0 - c) + colour * c + 0.5, 0, 255).astype(np.uint8)


def _box_of(mask: np.ndarray) -> Box:
    ys, xs = np.nonzero(mask)
    return int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max())


def _text_pair(img: np.ndarray, rng: np.random.Generator, off_b: tuple[float, float]):
    """(A, B, union box): the text at offset 0 in A and at ``off_b`` (x, y) px in B."""
    h, w, _ = img.shape
    px = max(10, h // 36)  # 15 px at 540 rows, 60 px at 2160
    tw, th = int(len(TEXT) * 0.62 * px), int(1.4 * px)  # generous box of the line
    x = int(rng.integers(w // 20, w - tw - w // 20))
    y = int(rng.integers(h // 10, h - th - h // 10))
    margin = 8
    sy, sx = slice(y - margin, y + th + margin), slice(x - margin, x + tw + margin)
    local = img[sy, sx].astype(np.float32)  # (h', w', 3)
    colour = np.float32([250, 250, 245]) if local.mean() < 128 else np.float32([12, 12, 20])
    lh, lw = local.shape[:2]
    q = OVERSAMPLE
    ca = _text_cover(lh, lw, (margin, margin), px, (0, 0))
    cb = _text_cover(lh, lw, (margin, margin), px, (round(off_b[0] * q), round(off_b[1] * q)))
    a, b = img.copy(), img.copy()
    a[sy, sx] = _composite(local, ca, colour)
    b[sy, sx] = _composite(local, cb, colour)
    x0, y0, x1, y1 = _box_of((ca > 0) | (cb > 0))
    return a, b, (x0 + x - margin, y0 + y - margin, x1 + x - margin, y1 + y - margin)


def make_case(photo_name: str, case_name: str, size: str = "small") -> RealCase:
    """Build one named case (see the module docstring) on ``photo_name`` at ``size``."""
    if photo_name not in PHOTOS:
        raise KeyError(f"unknown photo {photo_name!r}; expected one of {PHOTOS}")
    img = base(photo_name, size)
    h, w, _ = img.shape
    rng = _rng(photo_name, case_name, size)
    if case_name == "jpeg_q75":
        return RealCase(photo_name, case_name, size, img, jpeg(img, 75), None)
    if case_name == "jpeg_q90":
        return RealCase(photo_name, case_name, size, img, jpeg(img, 90), None)
    if case_name == "jpeg_q75_q90":
        return RealCase(photo_name, case_name, size, jpeg(img, 75), jpeg(img, 90), None)
    if case_name in PATCH_NAMES:
        parts = case_name.split("_")  # patch, WxH, amp, kind[, jpeg]
        pw, ph = (int(v) for v in parts[1].split("x"))
        amp, colour, on_jpeg = int(parts[2]), parts[3] == "colour", parts[-1] == "jpeg"
        x0, y0 = int(rng.integers(0, w - pw)), int(rng.integers(0, h - ph))
        box = (x0, y0, x0 + pw - 1, y0 + ph - 1)
        b = _plant(img, box, amp, colour, rng)
        box = _box_of((b != img).any(axis=2))  # clipping may leave an edge of the patch unchanged
        return RealCase(photo_name, case_name, size, img, jpeg(b, 90) if on_jpeg else b, box)
    if case_name in TEXT_SUB_NAMES or case_name in TEXT_SHIFT_NAMES:
        if case_name in TEXT_SUB_NAMES:
            off = SUB_OFFSETS[TEXT_SUB_NAMES.index(case_name)]
        else:
            off = SHIFTS[case_name.rsplit("_", 1)[1]]
        a, b, union = _text_pair(img, rng, off)
        expect = union if case_name in TEXT_SHIFT_NAMES else None
        return RealCase(photo_name, case_name, size, a, b, expect)
    raise KeyError(f"unknown case {case_name!r}; expected one of {CASE_NAMES}")


def make_cases(photo_name: str, size: str = "small", names: tuple[str, ...] = CASE_NAMES) -> list[RealCase]:
    """The named cases (default: all) on one photo at one size."""
    return [make_case(photo_name, n, size) for n in names]


def iou(got: Box | None, want: Box) -> float:
    """Intersection over union of two inclusive boxes (0 when ``got`` is None)."""
    if got is None:
        return 0.0
    ix = min(got[2], want[2]) - max(got[0], want[0]) + 1
    iy = min(got[3], want[3]) - max(got[1], want[1]) + 1
    inter = max(ix, 0) * max(iy, 0)
    area = (got[2] - got[0] + 1) * (got[3] - got[1] + 1) + (want[2] - want[0] + 1) * (want[3] - want[1] + 1)
    return inter / (area - inter)

"""Reading users' image files the one way every command reads them: upright, 8-bit RGB, clear errors.

    image = open_rgb("photos/IMG_0412.jpg", where="notes.jsonl:3")   # PIL RGB image, upright

Training decodes notes with OpenCV (:func:`mm.data.dataset.decode_image`), which turns a photo upright by
its EXIF orientation and scales 16-bit PNGs to 8 bits. Pillow does neither by itself: a phone photo
stored sideways with an orientation tag came out sideways, and a 16-bit greyscale PNG came out white,
so evals, labelers, pair builders and prompts saw other pixels than training did. Every PIL read of a
user's file goes through :func:`open_rgb`, which gives the pixels OpenCV gives (tested), and turns every
way a file can fail to decode into one :class:`mm.errors.UserError` naming the file:

- not an image, truncated or corrupt: "cannot read image PATH (...)";
- more pixels than Pillow's decompression-bomb limit (``PIL.Image.MAX_IMAGE_PIXELS``, 2x for the
  error): the size, the limit and how to raise it.
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import numpy as np

from mm.errors import UserError

ImageSource = str | Path | bytes | IO[bytes]
"""A path, the file's bytes, or an open binary file."""

_SIXTEEN_BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")
"""Pillow's modes of 16-bit greyscale PNGs (and 32-bit integer images, read as 16-bit)."""


def _name(source: ImageSource) -> str:
    if isinstance(source, (str, Path)):
        return str(source)
    return "<bytes>" if isinstance(source, bytes) else getattr(source, "name", "<file>")


def _upright(im: Any) -> Any:
    """``im`` turned by its EXIF orientation (a corrupt EXIF block leaves it as stored)."""
    from PIL import ImageOps

    try:
        return ImageOps.exif_transpose(im)
    except Exception:  # noqa: BLE001 - Pillow raises several types for malformed EXIF blocks
        return im


def _to_rgb(im: Any) -> Any:
    """8-bit RGB; 16-bit greyscale keeps its top byte, as OpenCV does (Pillow's own conversion clips)."""
    from PIL import Image

    if im.mode in _SIXTEEN_BIT:
        grey = np.clip(np.asarray(im, dtype=np.int64) >> 8, 0, 255).astype(np.uint8)  # (H, W)
        return Image.fromarray(grey, mode="L").convert("RGB")
    return im.convert("RGB")


@contextlib.contextmanager
def _reading(source: ImageSource, where: str) -> Iterator[Any]:
    """Pillow's image of ``source``, open; every way reading it can fail becomes one ``UserError``."""
    from PIL import Image, UnidentifiedImageError

    name, at = _name(source), f"{where}: " if where else ""
    file = io.BytesIO(source) if isinstance(source, bytes) else source
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Corrupt EXIF")  # the pixels are still good
            with Image.open(file) as im:
                yield im
    except Image.DecompressionBombError as e:
        raise UserError(
            f"{at}image {name} is too large to decode safely ({e}); shrink it, or raise "
            "PIL.Image.MAX_IMAGE_PIXELS in your script if you trust the file"
        ) from None
    except FileNotFoundError:
        raise UserError(f"{at}image {name} not found; check the path (and the image folder)") from None
    except UnidentifiedImageError:
        why = "not an image PIL can read; give a PNG or JPEG file"
        raise UserError(f"{at}cannot read image {name}: {why}") from None
    except (OSError, ValueError, SyntaxError) as e:
        raise UserError(f"{at}cannot read image {name} ({e}); give a PNG or JPEG file") from None


def open_rgb(source: ImageSource, where: str = "", *, max_side: int = 0) -> Any:
    """The image ``source`` holds as a decoded, upright (EXIF orientation), 8-bit RGB PIL image; any
    failure to read it is a :class:`mm.errors.UserError` that starts with ``where`` (module docstring).

    ``max_side`` > 0 shrinks it (Lanczos) so its longest side is at most that; a JPEG is then decoded at
    the smallest of libjpeg's 1/2, 1/4, 1/8 scales that is still at least that large (``draft``), which
    makes a 12-megapixel photo read at 1024 several times faster, at nearly the same pixels."""
    from PIL import Image

    with _reading(source, where) as im:
        if max_side and max(im.size) > max_side:
            scale = max_side / max(im.size)
            im.draft(None, (math.ceil(im.size[0] * scale), math.ceil(im.size[1] * scale)))  # JPEG only
        im.load()  # decode now: a truncated file fails here, not inside a training step
        im = _to_rgb(_upright(im))
        if max_side and max(im.size) > max_side:
            scale = max_side / max(im.size)
            size = (max(1, round(im.size[0] * scale)), max(1, round(im.size[1] * scale)))
            im = im.resize(size, Image.Resampling.LANCZOS)
        return im


def check_image(source: ImageSource, where: str = "", *, verify: bool = False) -> None:
    """:func:`open_rgb`'s errors without decoding: the header alone, or with ``verify`` Pillow's check of
    the whole file (PNG chunk checksums). A cheap check of many files before a run writes anything."""
    with _reading(source, where) as im:
        if verify:
            im.verify()

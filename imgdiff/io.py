"""Image files in and out for imgdiff: the only imgdiff module that touches disk (:mod:`imgdiff.pair_rows`
reads a pair's rows through it, and this module never imports that one).

Reading validates before decoding, in this order: the path exists, is a regular file, is readable, is
not empty, starts with the magic bytes of a supported format (PNG, JPEG, WebP, TIFF, BMP), has a
parsable header, and declares a size within the pixel limit (a decompression-bomb guard: the size comes
from the header, before any pixel is decoded). Anything wrong raises :class:`ImageIOError` with one line
that names the file, says what is wrong and how to fix it (:mod:`imgdiff.io_errors`, re-exported here).

Decoded arrays are what :func:`imgdiff.diff` takes: ``(H, W)`` gray or ``(H, W, C)`` with ``C`` in
``{3, 4}`` (RGB / RGBA order), ``uint8`` or ``uint16``. Palette images are expanded to RGB, or to RGBA
when they carry transparency; gray+alpha becomes RGBA; 1/2/4-bit gray becomes 8-bit.

Decoders (their speeds: benchmarks/README.md): gray/RGB/RGBA 8- and 16-bit PNGs go through
:mod:`imgdiff.png` (ISA-L inflate, which needs no NumPy and releases the GIL; None/Sub/Up rows
unfiltered by a native kernel on x86-64 Linux, else None/Sub/Up rows by NumPy and Avg/Paeth rows by
libspng, :mod:`imgdiff.png_spng`), faster than any full
decoder at hand, so :func:`read_pair` decodes both images of a pair in two threads while the CLI
imports NumPy; palette, gray+alpha and 1/2/4-bit PNGs go through OpenCV (which expands them to RGB(A)
with transparency as alpha), as does every PNG when imagecodecs is missing. The other formats
go through Pillow, which raises on truncated JPEGs where libjpeg inside OpenCV only prints a warning
and returns a grey-filled image; 16-bit RGB TIFFs go through OpenCV because Pillow reduces them to 8
bits. OpenCV's own logging is silenced so the CLI's one-line errors are the only thing on stderr.

Writes (PNG overlay and mask, JSON) live in :mod:`imgdiff.write` (atomic, and never onto an input);
their names are re-exported here, loaded on first use (:mod:`imgdiff.write` imports only
:mod:`imgdiff.io_errors`, so the dependency runs one way).
"""

from __future__ import annotations

import os
import stat
import struct
import warnings
from collections import namedtuple

from imgdiff.io_errors import ImageIOError, read_error  # noqa: F401 - ImageIOError re-exported
from imgdiff.options import DEFAULT_MAX_PIXELS, SUPPORTED_FORMATS  # noqa: F401 - re-exported

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs the CLI ~2 ms of start-up
if TYPE_CHECKING:
    import numpy as np

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
_PNG_BIT_DEPTHS = {0: (1, 2, 4, 8, 16), 2: (8, 16), 3: (1, 2, 4, 8), 4: (8, 16), 6: (8, 16)}
_HEAD_BYTES = 64


class ImageInfo(namedtuple("ImageInfo", "path format width height")):
    """What the header of an image file says, read before any pixel is decoded: ``path`` (the file as
    given), ``format`` (one of :data:`SUPPORTED_FORMATS`), ``width`` (pixels per row), ``height`` (rows).

    A named tuple, not a dataclass: ``dataclasses`` imports ``inspect``, ~7 ms of the CLI's start-up."""

    __slots__ = ()


def sniff_format(head: bytes) -> str | None:
    """The format named by a file's first bytes, or ``None`` when it is not a supported one."""
    if head.startswith(_PNG_MAGIC):
        return "PNG"
    if head.startswith(b"\xff\xd8\xff"):
        return "JPEG"
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WebP"
    if head[:4] in (b"II*\x00", b"MM\x00*"):
        return "TIFF"
    if head[:2] == b"BM":
        return "BMP"
    return None


def _open_checked(path: str):
    """Open ``path`` for binary reading after the file-system checks; returns ``(file, size)``."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise read_error(path, "no such file", "check the path") from None
    except OSError as e:
        raise read_error(path, e.strerror or str(e), "check the path and its permissions") from None
    if stat.S_ISDIR(st.st_mode):
        raise read_error(
            path, "it is a directory, not an image file", "pass an image file (or two folders for batch)"
        )
    if not stat.S_ISREG(st.st_mode):
        raise read_error(path, "not a regular file", "pass a PNG/JPEG/WebP/TIFF/BMP file")
    if st.st_size == 0:
        raise read_error(path, "the file is empty (0 bytes)", "re-export or re-download it")
    try:
        return open(path, "rb"), st.st_size  # noqa: SIM115 - closed by the caller
    except PermissionError:
        raise read_error(
            path, "permission denied", "make it readable (chmod +r) or run as its owner"
        ) from None
    except OSError as e:
        raise read_error(path, e.strerror or str(e), "check the file") from None


def _png_size(path: str, head: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk, validated against the PNG spec."""
    if len(head) < 33 or head[12:16] != b"IHDR":
        raise read_error(path, "PNG header is missing or corrupt (no IHDR chunk)", "re-export the image")
    width, height, depth, color = struct.unpack(">IIBB", head[16:26])
    if color not in _PNG_BIT_DEPTHS or depth not in _PNG_BIT_DEPTHS[color]:
        raise read_error(
            path, f"PNG header is corrupt (bit depth {depth}, colour type {color})", "re-export it"
        )
    return width, height


def _pil_open(path: str, f):
    """Pillow image object with only its header read, with Pillow's own bomb check relaxed to ours."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None  # the caller applies its own, configurable limit from the header
    try:
        with warnings.catch_warnings():  # e.g. "Corrupt EXIF data": the error below says it in one line
            warnings.simplefilter("ignore")
            return Image.open(f)
    except Image.UnidentifiedImageError:
        raise read_error(path, "header is corrupt or truncated", "re-export or re-download it") from None
    except Exception as e:  # noqa: BLE001 - Pillow raises many types for bad headers
        problem = f"header is corrupt ({type(e).__name__}: {e})".replace("\n", " ")
        raise read_error(path, problem, "re-export it") from None


def probe(path: str | os.PathLike, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> ImageInfo:
    """Validate ``path`` and read its header; no pixel is decoded. Raises :class:`ImageIOError`."""
    path = os.fspath(path)
    f, _ = _open_checked(path)
    with f:
        head = f.read(_HEAD_BYTES)
        fmt = sniff_format(head)
        if fmt is None:
            raise read_error(
                path,
                f"unsupported or unrecognised format (first bytes {head[:8].hex()})",
                f"convert it to one of {', '.join(SUPPORTED_FORMATS)}",
            )
        if fmt == "PNG":
            width, height = _png_size(path, head)
        else:
            f.seek(0)
            width, height = _pil_open(path, f).size
    _check_size(path, width, height, max_pixels)
    return ImageInfo(path=path, format=fmt, width=width, height=height)


def _check_size(path: str, width: int, height: int, max_pixels: int) -> None:
    if width <= 0 or height <= 0:
        raise read_error(path, f"header declares an empty image ({width}x{height})", "re-export it")
    if width * height > max_pixels:
        raise read_error(
            path,
            f"header declares {width}x{height} = {width * height:,} pixels, over the limit of {max_pixels:,}",
            "raise --max-pixels if you trust this file",
        )


def _cv2():
    os.environ.setdefault("OPENCV_LOG_LEVEL", "SILENT")
    import cv2

    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    return cv2


def _from_bgr(cv2, arr: np.ndarray) -> np.ndarray:
    """OpenCV's BGR(A) channel order to RGB(A), in place."""
    if arr.ndim == 3 and arr.shape[2] == 3:
        return cv2.cvtColor(arr, cv2.COLOR_BGR2RGB, dst=arr)
    if arr.ndim == 3 and arr.shape[2] == 4:
        return cv2.cvtColor(arr, cv2.COLOR_BGRA2RGBA, dst=arr)
    return arr


def _decode_cv2(path: str, data: bytes) -> np.ndarray:
    import numpy as np

    cv2 = _cv2()
    try:
        arr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error as e:
        raise read_error(
            path, f"decoder error ({str(e).strip().splitlines()[-1]})", "re-export the image"
        ) from None
    if arr is None:
        raise read_error(path, "image data is corrupt or truncated", "re-export or re-download it")
    if arr.dtype not in (np.uint8, np.uint16):
        raise read_error(path, f"{arr.dtype} samples are not supported", "convert it to 8- or 16-bit")
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    return _from_bgr(cv2, arr)


_PNG_FAST_COLOURS = (0, 2, 6)
"""PNG colour types (gray, RGB, RGBA) decoded by :mod:`imgdiff.png` or imagecodecs; palette and
gray+alpha go through OpenCV."""


def _imagecodecs():
    """The imagecodecs module, or None when it is not installed (OpenCV then decodes every PNG)."""
    try:
        import imagecodecs
    except ImportError:  # pragma: no cover - a declared dependency; the fallback keeps a bare env working
        return None
    return imagecodecs


def _decode_imagecodecs(path: str, data: bytes) -> np.ndarray:
    codecs = _imagecodecs()
    try:
        return codecs.png_decode(data)  # RGB(A) order, native-endian uint16 for 16-bit
    except codecs.PngError as e:
        raise read_error(
            path, f"image data is corrupt or truncated ({e})", "re-export or re-download it"
        ) from None


_PIL_TO_RGB = {"CMYK", "YCbCr", "LAB", "HSV", "RGBX"}


def _decode_pil(path: str, data: bytes) -> np.ndarray:
    import io as _bytes_io

    import numpy as np

    img = _pil_open(path, _bytes_io.BytesIO(data))
    bits = getattr(img, "tag_v2", {}).get(258) if img.format == "TIFF" else None
    if bits is not None and len(bits) > 1 and max(bits) > 8:
        return _decode_cv2(path, data)  # Pillow would reduce 16-bit RGB(A) TIFF to 8 bits
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            img.load()
    except Exception as e:  # noqa: BLE001 - Pillow raises OSError, SyntaxError, ValueError, ...
        problem = "the file is truncated" if "truncated" in str(e) else f"image data is corrupt ({e})"
        raise read_error(path, problem.replace("\n", " "), "re-export or re-download it") from None
    mode = img.mode
    if mode == "1":
        img = img.convert("L")
    elif mode in ("LA", "La", "PA", "RGBa"):
        img = img.convert("RGBA")
    elif mode == "P":
        img = img.convert("RGBA" if "transparency" in img.info else "RGB")
    elif mode in _PIL_TO_RGB:
        img = img.convert("RGB")
    arr = np.asarray(img)
    if mode.startswith("I"):
        if arr.dtype.kind in "iu" and arr.size and (arr.min() < 0 or arr.max() > 65535):
            raise read_error(path, f"{mode} samples outside 0..65535", "convert it to 8- or 16-bit")
        arr = arr.astype(np.uint16)
    if arr.dtype not in (np.uint8, np.uint16):
        raise read_error(
            path, f"pixel mode {mode} ({arr.dtype}) is not supported", "convert it to 8- or 16-bit"
        )
    return arr


def _read_bytes(info: ImageInfo) -> bytes:
    f, _ = _open_checked(info.path)
    with f:
        return f.read()


def _map_bytes(info: ImageInfo):
    """The file's bytes as a private memory map (PNG fast path: a 10 MB ``read`` into a fresh buffer
    costs ~5 ms of page faults here; a map faults lazily, 16 cached pages per fault, which measured
    fewer faults than ``MAP_POPULATE``'s one per page); ``bytes`` where mapping fails. Mapped
    copy-on-write with write access so that ctypes can take its address (:mod:`imgdiff.png_pair_inflate`);
    nothing writes to it, and the file is never changed."""
    import mmap

    f, size = _open_checked(info.path)
    with f:
        try:
            return mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ | mmap.PROT_WRITE, flags=mmap.MAP_PRIVATE)
        except (OSError, ValueError, AttributeError):  # pragma: no cover - e.g. a file system without mmap
            return f.read()


def _decode_png(info: ImageInfo, data: bytes) -> np.ndarray:
    """Gray/RGB/RGBA 8/16-bit PNGs: :mod:`imgdiff.png` (ISA-L inflate, then the unfilter; no NumPy
    until the unfilter), or imagecodecs' libpng when that cannot finish; the rest: OpenCV."""
    from imgdiff import png

    depth, colour = data[24], data[25]
    if depth in (8, 16) and colour in _PNG_FAST_COLOURS:
        try:
            arr = png.decode(data)
        except png.PngDataError as e:
            raise read_error(info.path, str(e), "re-export or re-download it") from None
        if arr is not None:
            return arr
        if _imagecodecs():
            return _decode_imagecodecs(info.path, data)
    return _decode_cv2(info.path, data)


def decode(info: ImageInfo, data: bytes | None = None) -> np.ndarray:
    """Decode a file that :func:`probe` accepted (``data``: its bytes, when already read); raises
    :class:`ImageIOError` on bad pixel data."""
    if data is None:
        data = _read_bytes(info)
    if info.format == "PNG":
        if b"IEND" not in data[-1024:]:
            raise read_error(
                info.path, "the file is truncated (PNG ends before its IEND chunk)", "re-export it"
            )
        arr = _decode_png(info, data)
    else:
        arr = _decode_pil(info.path, data)
    if arr.shape[:2] != (info.height, info.width):
        raise read_error(
            info.path,
            f"header says {info.width}x{info.height} but the data is {arr.shape[1]}x{arr.shape[0]}",
            "re-export it",
        )
    import numpy as np

    return np.ascontiguousarray(arr)


def read_image(path: str | os.PathLike, *, max_pixels: int = DEFAULT_MAX_PIXELS) -> np.ndarray:
    """Validate and decode one image file into an ``(H, W)`` or ``(H, W, C)`` uint8/uint16 array."""
    return decode(probe(path, max_pixels=max_pixels))


def _check_png_data(info: ImageInfo, data: bytes) -> bool:
    """Validate a non-interlaced, non-palette PNG without decoding its pixels: chunk layout, CRCs
    of critical chunks, and an inflate of the image data to exactly ``height * (1 + row bytes)``
    bytes with valid filter types (what libpng checks; :mod:`imgdiff.png`). Returns False when it
    cannot tell (other PNG kinds); raises :class:`ImageIOError` when the file is bad."""
    from imgdiff import png

    try:
        layout = png.layout(data)
        if layout is None:
            return False
        png.inflate(layout)
    except png.PngDataError as e:
        raise read_error(info.path, str(e), "re-export or re-download it") from None
    return True


def identical_pair(
    a: str | os.PathLike, b: str | os.PathLike, *, max_pixels: int = DEFAULT_MAX_PIXELS
) -> ImageInfo | None:
    """A's :class:`ImageInfo` when both files pass :func:`probe` and hold the same bytes (so the same
    pixels), else None. The shared data is still validated (PNG: :func:`_check_png_data`, no pixel
    decoded and no NumPy import; other formats: decoded), so a corrupt file is an error, never "same"."""
    infos = (probe(a, max_pixels=max_pixels), probe(b, max_pixels=max_pixels))
    if os.path.getsize(infos[0].path) != os.path.getsize(infos[1].path):
        return None
    data = _read_bytes(infos[0])
    if data != _read_bytes(infos[1]):
        return None
    if not (infos[0].format == "PNG" and _check_png_data(infos[0], data)):
        decode(infos[0], data)
    return infos[0]


def _in_two_threads(fn, infos, data) -> list:
    """``[fn(infos[0], data[0]), fn(infos[1], data[1])]``, the second in a thread at once (``threading``:
    lighter to import than ``concurrent.futures``, which pulls in ``logging``); an exception in either is
    re-raised here."""
    import threading

    out: list = [None, None]

    def work(i: int) -> None:
        try:
            out[i] = fn(infos[i], data[i])
        except BaseException as e:  # noqa: BLE001 - re-raised in the caller's thread
            out[i] = e

    thread = threading.Thread(target=work, args=(1,))
    thread.start()
    work(0)
    thread.join()
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out


def read_pair(
    a: str | os.PathLike, b: str | os.PathLike, *, max_pixels: int = DEFAULT_MAX_PIXELS
) -> tuple[np.ndarray, np.ndarray]:
    """Validate both headers first (so a bad B fails before A is decoded), then decode both in two threads.

    The decoders release the GIL, so on two cores the pair costs about one decode. Byte-identical
    files are decoded once (the same pixels, so one array serves as both; it is still decoded, so a
    corrupt file is still an error). When both fail, A's error is raised.
    """
    infos = (probe(a, max_pixels=max_pixels), probe(b, max_pixels=max_pixels))
    data = [_read_bytes(info) for info in infos]
    if data[0] == data[1]:
        arr = decode(infos[0], data[0])
        return arr, arr
    arrays = _in_two_threads(decode, infos, data)
    return arrays[0], arrays[1]


# ---------------------------------------------------------------------------------------------- writing

_WRITERS = frozenset(
    {
        "OVERLAY_COLOR", "OutputClash", "atomic_write", "atomic_write_all", "check_writable",
        "encode_mask_png", "encode_png", "render_overlay", "write_json", "write_mask_png", "write_png",
    }
)  # fmt: skip
"""Names of :mod:`imgdiff.write` that this module re-exports (loaded on first use, PEP 562)."""


def __getattr__(name: str):
    """The writers live in :mod:`imgdiff.write`; ``from imgdiff.io import write_png`` still works."""
    if name in _WRITERS:
        from imgdiff import write

        return getattr(write, name)
    raise AttributeError(f"module 'imgdiff.io' has no attribute {name!r}")

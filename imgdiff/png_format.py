"""The PNG file format, below any decoding: chunks, where the pixel data is, and shared buffers.

:func:`layout` walks a PNG's chunks and checks what libpng checks of them (chunk lengths inside the
file, the CRC of every critical chunk, an IEND chunk); :func:`stream` joins the IDAT payloads into
one zlib stream; :func:`common_prefix` measures how far two files are byte-identical. Any failure
raises :class:`PngDataError` with a one-line problem that :mod:`imgdiff.io` turns into its error
message. This module imports no other imgdiff module: the decoder (:mod:`imgdiff.png`), the shared
inflate of a pair (:mod:`imgdiff.png_pair_inflate`) and the native/libspng unfilter
(:mod:`imgdiff.png_spng`) build on it, and none of it needs NumPy.

Buffers are anonymous ``mmap`` s advised for transparent huge pages (:func:`new_buffer`): a fresh 25 MB
buffer otherwise costs ~6,000 page faults, which can cost as much as the inflate itself.
"""

from __future__ import annotations

import mmap
import struct

CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}
"""Samples per pixel of the PNG colour types :func:`layout` accepts (palette is decoded elsewhere)."""
NONE, SUB, UP, AVG, PAETH = 0, 1, 2, 3, 4
"""The five row filter types (PNG spec, filter method 0)."""


class PngDataError(Exception):
    """The PNG's chunks or pixel data are bad; the message is the problem, in one line."""


def zlib_codec():
    """(module, error class): ISA-L's zlib-compatible inflate when installed, else the standard one."""
    try:
        from isal import isal_zlib
    except ImportError:  # pragma: no cover - a declared dependency; zlib keeps a bare env working
        import zlib

        return zlib, zlib.error
    return isal_zlib, isal_zlib.error


class Layout:
    """Where a PNG's pixel data is: its header fields and its IDAT payloads (views into the file)."""

    __slots__ = ("width", "height", "depth", "colour", "idat", "idat_at")

    def __init__(self, *, width: int, height: int, depth: int, colour: int, idat: list, idat_at: list):
        self.width = width
        """Pixels per row."""
        self.height = height
        """Rows."""
        self.depth = depth
        """Bits per sample (1, 2, 4, 8 or 16)."""
        self.colour = colour
        """PNG colour type (0 gray, 2 RGB, 4 gray+alpha, 6 RGBA)."""
        self.idat = idat
        """memoryviews of the IDAT payloads, in file order."""
        self.idat_at = idat_at
        """File offset of each IDAT payload (same order as :attr:`idat`)."""

    @property
    def row_bytes(self) -> int:
        """Bytes per inflated row, including its filter-type byte."""
        return 1 + (self.width * CHANNELS[self.colour] * self.depth + 7) // 8


def layout(data, checked: int = 0, *, idat_crc: bool = True) -> Layout | None:
    """Walk the chunks of a PNG (``data``: bytes-like, IHDR already validated by the caller).

    Returns None for PNGs this module does not handle (interlaced, palette); raises
    :class:`PngDataError` on a bad CRC of a critical chunk or a missing IEND. ``checked``: the chunks
    that end before this offset are byte-identical to those of a file whose CRCs were checked (the
    common prefix of a pair), so theirs are not recomputed. ``idat_crc=False`` leaves the IDAT chunks'
    CRCs to a later :func:`check_idat_crcs` (the CLI runs it after the inflate: a 4K PNG has ~1,200
    IDAT chunks, and a CRC call per chunk releases and retakes the GIL, which the import thread
    holds most of the time then)."""
    width, height, depth, colour, _, _, interlace = struct.unpack_from(">IIBBBBB", data, 16)
    if colour not in CHANNELS or interlace != 0:
        return None
    zlib_mod, _ = zlib_codec()
    crc32, unpack, view = zlib_mod.crc32, struct.unpack_from, memoryview(data)
    pos, size, idat, idat_at, end = 8, len(data), [], [], False
    while pos + 12 <= size:
        (n,) = unpack(">I", data, pos)
        if pos + 12 + n > size:
            break
        kind = bytes(view[pos + 4 : pos + 8])
        if (
            65 <= kind[0] <= 90
            and pos + 12 + n > checked
            and (idat_crc or kind != b"IDAT")
            and crc32(view[pos + 4 : pos + 8 + n]) != unpack(">I", data, pos + 8 + n)[0]
        ):
            raise PngDataError(f"image data is corrupt ({kind.decode('latin-1')} chunk fails its CRC check)")
        if kind == b"IDAT":
            idat.append(view[pos + 8 : pos + 8 + n])
            idat_at.append(pos + 8)
            if not idat_crc:  # no per-chunk work left: take the run of chunks like this one at once
                run = _same_headers(data, pos, 12 + n)
                for k in range(1, run):
                    at = pos + k * (12 + n) + 8
                    idat.append(view[at : at + n])
                    idat_at.append(at)
                pos += (run - 1) * (12 + n)
        pos += 12 + n
        if kind == b"IEND":
            end = True
            break
    if not end or not idat:
        raise PngDataError("the file is truncated (PNG ends before its IEND chunk)")
    return Layout(width=width, height=height, depth=depth, colour=colour, idat=idat, idat_at=idat_at)


def _same_headers(data, pos: int, stride: int) -> int:
    """How many chunks from ``pos`` on, ``stride`` bytes apart, have the 8-byte header (length, type)
    of the one at ``pos``: encoders split the IDAT stream into equal chunks (a 4K PNG has ~1,200 of
    8 KB), and 8 strided slices check them all in C instead of ~4 us of Python per chunk."""
    count = (len(data) - pos) // stride  # whole chunks that fit (a cut-off one ends the walk as before)
    head = bytes(data[pos : pos + 8])
    for j in range(8):
        column = data[pos + j : pos + j + (count - 1) * stride + 1 : stride]
        lo, hi = 0, count  # longest prefix of column equal to head[j] repeated: binary search
        if column != head[j : j + 1] * count:
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if column[:mid] == head[j : j + 1] * mid:
                    lo = mid
                else:
                    hi = mid - 1
            count = lo
    return max(count, 1)


def check_idat_crcs(png: Layout, data, checked: int = 0) -> None:
    """Raise :class:`PngDataError` when an IDAT chunk that ends after file offset ``checked`` fails its
    CRC (the check :func:`layout` skips with ``idat_crc=False``)."""
    crc32, unpack, view = zlib_codec()[0].crc32, struct.unpack_from, memoryview(data)
    for at, payload in zip(png.idat_at, png.idat):
        end = at + len(payload)
        if end + 4 > checked and crc32(view[at - 4 : end]) != unpack(">I", data, end)[0]:
            raise PngDataError("image data is corrupt (IDAT chunk fails its CRC check)")


def stream(png: Layout, start: int = 0):
    """The zlib stream (all IDAT payloads, in order) from stream offset ``start`` on, copied into one
    buffer, so that an inflater can take it in a single call (slice copies hold the GIL for ~2 ms a
    10 MB file: no per-chunk calls). ``start``: bytes another stream already covers (a shared prefix,
    :mod:`imgdiff.png_pair_inflate`), which are neither copied nor touched."""
    buf = new_buffer(sum(len(payload) for payload in png.idat) - start)
    out, pos = memoryview(buf), 0
    for payload in png.idat:
        if start >= len(payload):
            start -= len(payload)
            continue
        piece = payload[start:] if start else payload
        start = 0
        out[pos : pos + len(piece)] = piece
        pos += len(piece)
    return buf


def new_buffer(size: int):
    """A zeroed anonymous mapping of ``size`` bytes, advised for huge pages where the OS offers them."""
    buf = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # pragma: no cover - kernels without THP
            pass
    return buf


MIN_SHARED = 1 << 16
"""Shortest common file prefix worth the shared inflate of :mod:`imgdiff.png_pair_inflate` (bytes)."""
PREFIX_CHUNK = 1 << 16
"""Bytes compared at a time by :func:`common_prefix` when it compares slices."""


def common_prefix(a, b) -> int:
    """Length of the longest common prefix of two bytes-like objects: C ``memcmp`` in place on 1 MB
    steps then a bisection (:func:`_memcmp`), or the same on compared slices when a buffer has no
    address."""
    n, memcmp = min(len(a), len(b)), _memcmp(a, b)
    if memcmp is None:
        return _prefix_end(lambda lo, hi: a[lo:hi] == b[lo:hi], n, PREFIX_CHUNK)
    return _prefix_end(lambda lo, hi: memcmp(lo, hi - lo) == 0, n, 1 << 20)


def _prefix_end(equal, n: int, step: int) -> int:
    """The largest ``p <= n`` with ``equal(0, p)``, given ``equal(lo, hi)`` for ranges: ``step``-sized
    ranges while they are equal, then a bisection of the first unequal one."""
    pos = 0
    while pos < n and equal(pos, min(pos + step, n)):
        pos = min(pos + step, n)
    lo, hi = pos, min(pos + step, n)  # the prefix ends in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if equal(lo, mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _memcmp(a, b):
    """``f(offset, n)``: libc's ``memcmp`` of ``n`` bytes of ``a`` and ``b`` from ``offset``, or None when
    a buffer has no address (read-only views) or there is no libc. Compares in place: slicing a 10 MB
    mmap copies every slice (~0.7 ms of a 4K pair). Called through ``ctypes.PyDLL``, which keeps the
    GIL: a call that released it would wait up to the 5 ms switch interval to take it back from the
    CLI's import thread."""
    import ctypes

    try:
        func = ctypes.PyDLL(None).memcmp
        pa, pb = (
            ctypes.cast(ctypes.c_char_p(x), ctypes.c_void_p).value
            if isinstance(x, bytes)
            else ctypes.addressof(ctypes.c_char.from_buffer(x))
            for x in (a, b)
        )
    except (OSError, AttributeError, TypeError, ValueError):
        return None
    func.restype, func.argtypes = ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    return lambda offset, n: func(pa + offset, pb + offset, n)

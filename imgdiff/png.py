"""PNG pixel data without libpng: chunk walk, ISA-L inflate, vectorised unfilter (the CLI's fast path).

A 4K RGB PNG spends its decode time in inflate (zlib: ~80-110 ms; ISA-L via PyPI ``isal``: ~20-45 ms)
and in the per-row unfilter. :func:`inflate` needs no NumPy, so the CLI starts it in a thread while
NumPy is still being imported; :func:`unfilter` undoes the None, Sub and Up filters with
``imagecodecs.delta_decode`` (a cumulative sum modulo 256: Sub along the row with a distance of one
pixel, Up down a run of rows) and hands rows that use Avg or Paeth, which depend on the unfiltered
left neighbour and cannot be vectorised, to libspng (:mod:`imgdiff.png_spng`). OpenCV writes every
row with Sub; libpng's and Pillow's adaptive choice mixes all five (photos: almost every row Paeth).

Validation is what libpng checks: chunk lengths inside the file, the CRC of every critical chunk, an
IEND chunk, a zlib stream (with its Adler-32) that inflates to exactly ``height * (1 + row bytes)``
bytes, and filter types 0-4. Any failure raises :class:`PngDataError` with a one-line problem that
:mod:`imgdiff.io` turns into its error message. Scope: non-interlaced gray, RGB and RGBA, 8 or 16 bits
(what :func:`layout` accepts); other PNGs go to the full decoders.

The inflated rows land in an anonymous ``mmap`` advised for transparent huge pages: a fresh 25 MB
buffer otherwise costs ~6,000 page faults, which can cost as much as the inflate itself.
"""

from __future__ import annotations

import mmap
import struct

TYPE_CHECKING = False  # not typing's: importing typing costs the CLI ~2 ms of start-up
if TYPE_CHECKING:
    import numpy as np

CHANNELS = {0: 1, 2: 3, 4: 2, 6: 4}
"""Samples per pixel of the PNG colour types :func:`inflate` can validate (palette is decoded elsewhere)."""
FAST_COLOURS = (0, 2, 6)
"""Colour types :func:`unfilter` turns into arrays: gray, RGB, RGBA."""
NONE, SUB, UP, AVG, PAETH = 0, 1, 2, 3, 4


class PngDataError(Exception):
    """The PNG's chunks or pixel data are bad; the message is the problem, in one line."""


def _zlib():
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
    zlib_mod, _ = _zlib()
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
    crc32, unpack, view = _zlib()[0].crc32, struct.unpack_from, memoryview(data)
    for at, payload in zip(png.idat_at, png.idat):
        end = at + len(payload)
        if end + 4 > checked and crc32(view[at - 4 : end]) != unpack(">I", data, end)[0]:
            raise PngDataError("image data is corrupt (IDAT chunk fails its CRC check)")


def stream(png: Layout, start: int = 0):
    """The zlib stream (all IDAT payloads, in order) from stream offset ``start`` on, copied into one
    buffer, so that an inflater can take it in a single call (slice copies hold the GIL for ~2 ms a
    10 MB file: no per-chunk calls). ``start``: bytes another stream already covers (a shared prefix,
    :mod:`imgdiff.png_shared`), which are neither copied nor touched."""
    buf = _buffer(sum(len(payload) for payload in png.idat) - start)
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


def _buffer(size: int):
    """A zeroed anonymous mapping of ``size`` bytes, advised for huge pages where the OS offers them."""
    buf = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except OSError:  # pragma: no cover - kernels without THP
            pass
    return buf


def inflate(png: Layout):
    """Inflate the IDAT stream into a new buffer of exactly ``height * row_bytes`` bytes (no NumPy).

    Returns ``(buffer, filter types as bytes)``; raises :class:`PngDataError` when the stream is
    corrupt, ends early, holds more data than the header declares, or a row has a filter type > 4."""
    zlib_mod, zerror = _zlib()
    row, total = png.row_bytes, png.height * png.row_bytes
    buf = _buffer(total)
    out = memoryview(buf)
    inflater, pos = zlib_mod.decompressobj(), 0
    try:
        for chunk in png.idat:
            piece = inflater.decompress(chunk, total - pos + 1)
            if pos + len(piece) > total:
                raise PngDataError("image data is corrupt (more pixel data than the header declares)")
            out[pos : pos + len(piece)] = piece
            pos += len(piece)
        if pos == total and not inflater.eof and inflater.decompress(b"", 1):
            raise PngDataError("image data is corrupt (more pixel data than the header declares)")
    except zerror as e:
        raise PngDataError(f"image data is corrupt ({e})".replace("\n", " ")) from None
    if pos != total or not inflater.eof:
        raise PngDataError("image data is corrupt or truncated")
    filters = buf[0:total:row]
    if max(filters) > 4:
        raise PngDataError(f"image data is corrupt (row filter type {max(filters)}, expected 0-4)")
    return buf, filters


def _runs(filters: bytes):
    """``(filter, first row, end row)`` for each run of equal filter types."""
    start = 0
    for i in range(1, len(filters) + 1):
        if i == len(filters) or filters[i] != filters[start]:
            yield filters[start], start, i
            start = i


def unfilter(
    png: Layout, buf, filters: bytes, rows: tuple[int, int] | None = None, above: np.ndarray | None = None
) -> np.ndarray | None:
    """The pixels of an inflated PNG of a :data:`FAST_COLOURS` type with 8 or 16 bits: ``(h, W)`` or
    ``(h, W, C)`` uint8/uint16 in RGB(A) order, native byte order, for the rows ``rows = (y0, y1)``
    (default: all). Rows above ``y0`` are unfiltered as far as a chain of rows that read the row
    above needs them (:func:`chain_start`), unless ``above`` gives the unfiltered row ``y0 - 1``
    (shape ``(W[, C])``). Rows with Avg or Paeth go to :func:`imgdiff.png_spng.unfilter_rows`. None
    when imagecodecs is missing (use a full decoder then)."""
    import numpy as np

    if png.colour not in FAST_COLOURS or png.depth not in (8, 16):
        return None
    h, w, c = png.height, png.width, CHANNELS[png.colour]
    y0, y1 = rows if rows is not None else (0, h)
    start = y0 if above is not None else chain_start(filters, y0)
    if max(filters[start:y1], default=NONE) >= AVG:
        from imgdiff import png_spng

        got = png_spng.unfilter_rows(png, buf, start, y1, above)
        return None if got is None else got[y0 - start :]
    try:
        from imagecodecs import delta_decode
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    bpp = c * png.depth // 8
    raw = np.frombuffer(buf, np.uint8, count=h * png.row_bytes).reshape(h, png.row_bytes)[:, 1:]  # (H, W*bpp)
    out = np.empty((1 + y1 - start, w * bpp), np.uint8)  # (1 + rows, W*bpp) bytes, big-endian samples
    if above is None:
        out[0] = 0  # the row above row 0 (PNG: zeros); a None/Sub row at `start` does not read it
    else:
        out[0] = np.ascontiguousarray(above, ">u2" if png.depth == 16 else np.uint8).view(np.uint8).ravel()
    for kind, r0, r1 in _runs(filters[start:y1]):
        src = raw[start + r0 : start + r1]
        if kind == SUB:
            delta_decode(src.reshape(-1, w, bpp), axis=1, out=out[1 + r0 : 1 + r1].reshape(-1, w, bpp))
            continue
        out[1 + r0 : 1 + r1] = src
        if kind == UP:  # row r = filtered row r + row r-1: a running sum down the run from the row above
            delta_decode(out[r0 : 1 + r1], axis=0, out=out[r0 : 1 + r1])
    out = out[1 + y0 - start :]
    if png.depth == 16:
        out = out.view(">u2").astype(np.uint16)  # (rows, W*C) native byte order
    return out.reshape(-1, w) if c == 1 else out.reshape(-1, w, c)


def chain_start(filters: bytes, y0: int) -> int:
    """The first row :func:`unfilter` reads to unfilter rows from ``y0`` on: an Up, Avg or Paeth row
    needs the unfiltered row above it, so a run of them reaches back to the row before it (a None or
    Sub row, or row 0)."""
    start = y0
    while start > 0 and filters[start] >= UP:
        start -= 1
    return start


def changed_rows(pa: Layout, a: tuple, pb: Layout, b: tuple, equal: int = 0) -> tuple[int, int] | None:
    """``(r0, r1)`` inclusive: the first and last rows whose filtered bytes (filter type included)
    differ between two inflated PNGs of the same layout (``a``, ``b``: what :func:`inflate` returned),
    or None when every byte is equal. ``equal``: a count of leading inflated bytes known to be equal
    in both (:func:`imgdiff.png_shared.inflate_pair`), which are not compared."""
    import numpy as np

    total = pa.height * pa.row_bytes
    n8 = total // 8
    skip = min(equal // 8, n8)
    ua = np.frombuffer(a[0], np.uint64, count=n8)  # (total/8,) the filtered rows, 8 bytes at a time
    ub = np.frombuffer(b[0], np.uint64, count=n8)
    tail = a[0][n8 * 8 : total] != b[0][n8 * 8 : total]
    first = _first_unequal(ua, ub, skip, n8, 1)
    if first is None:
        return None if not tail else (pa.height - 1, pa.height - 1)
    r0 = first * 8 // pa.row_bytes
    r1 = pa.height - 1 if tail else (_first_unequal(ua, ub, n8 - 1, first - 1, -1) * 8 + 7) // pa.row_bytes
    return r0, r1


def changed_span(pa: Layout, a: tuple, pb: Layout, b: tuple, equal: int = 0) -> tuple[int, int] | None:
    """``(r0, r1)`` inclusive: the first and last rows whose pixels may differ between two inflated
    PNGs of the same layout, or None when every row is equal. A row whose filtered bytes are equal
    (:func:`changed_rows`) has equal pixels when its filter does not read the row above (None, Sub)
    or that row is equal, so the span grows down through the Up/Avg/Paeth rows after the last
    differing row (:func:`imgdiff.io.read_pair_rows` narrows it by comparing pixels)."""
    rows = changed_rows(pa, a, pb, b, equal)
    return None if rows is None else (rows[0], span_end(a[1], b[1], rows[1]))


def span_end(fa: bytes, fb: bytes, r1: int) -> int:
    """The last row whose pixels may differ when row ``r1`` does and no filtered byte after it does
    (``fa``, ``fb``: both images' filter types): the run of rows after ``r1`` that read the row above."""
    while r1 + 1 < len(fa) and max(fa[r1 + 1], fb[r1 + 1]) >= UP:  # Up, Avg, Paeth read row r1
        r1 += 1
    return r1


SCAN_WORDS = 1 << 15
"""8-byte words compared per step by :func:`_first_unequal` (a 256 KB slice: no large temporaries)."""


def _first_unequal(ua, ub, start: int, stop: int, step: int) -> int | None:
    """Index of the first word where ``ua != ub``, scanning from ``start`` towards ``stop`` (exclusive)
    in direction ``step`` (+1 or -1), a slice at a time so that it stops early; None when all equal."""
    import numpy as np

    i = start
    while (i < stop) if step > 0 else (i > stop):
        lo, hi = (i, min(i + SCAN_WORDS, stop)) if step > 0 else (max(i - SCAN_WORDS, stop) + 1, i + 1)
        ne = ua[lo:hi] != ub[lo:hi]
        if ne.any():
            return lo + int(np.argmax(ne)) if step > 0 else hi - 1 - int(np.argmax(ne[::-1]))
        i = hi if step > 0 else lo - 1
    return None


def decode(data) -> np.ndarray | None:
    """Validate and decode a PNG held in ``data``; None when it is of a kind :func:`unfilter` leaves to
    a full decoder (palette, gray+alpha, 1/2/4 bits, interlaced). Raises :class:`PngDataError` on bad
    data."""
    png = layout(data)
    if png is None or png.colour not in FAST_COLOURS or png.depth not in (8, 16):
        return None
    from imgdiff.png_shared import inflate_one

    buf, filters = inflate_one(png, data) or inflate(png)
    return unfilter(png, buf, filters)


MIN_SHARED = 1 << 16
"""Shortest common file prefix worth the shared inflate of :mod:`imgdiff.png_shared` (bytes)."""
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

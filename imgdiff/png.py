"""PNG pixel data without libpng: ISA-L inflate and vectorised unfilter (the CLI's fast path).

A 4K RGB PNG spends its decode time in inflate (zlib: ~80-110 ms; ISA-L via PyPI ``isal``: ~20-45 ms)
and in the per-row unfilter. :func:`inflate` needs no NumPy, so the CLI starts it in a thread while
NumPy is still being imported; :func:`unfilter` hands the rows to the native kernel of
:mod:`imgdiff.png_spng` (every filter type; x86-64 Linux) where it runs. Elsewhere it undoes the None,
Sub and Up filters with ``imagecodecs.delta_decode`` (a cumulative sum modulo 256: Sub along the row
with a distance of one pixel, Up down a run of rows) and hands rows that use Avg or Paeth, which
depend on the unfiltered left neighbour and cannot be vectorised, to libspng. OpenCV writes every
row with Sub; libpng's and Pillow's adaptive choice mixes all five (photos: almost every row Paeth).

Validation is what libpng checks: the chunks (:func:`imgdiff.png_format.layout`), then a zlib stream
(with its Adler-32) that inflates to exactly ``height * (1 + row bytes)`` bytes, and filter types
0-4. Any failure raises :class:`PngDataError` with a one-line problem that :mod:`imgdiff.io` turns
into its error message. Scope: non-interlaced gray, RGB and RGBA, 8 or 16 bits (what :func:`layout`
accepts); other PNGs go to the full decoders.

Layers: :mod:`imgdiff.png_format` (chunks, buffers; imports no other imgdiff module), then
:mod:`imgdiff.png_pair_inflate` and :mod:`imgdiff.png_spng` (each on the format only), then this
decoder. The format's names are re-exported here (``png.layout(data)``, ``png.PngDataError``).
"""

from __future__ import annotations

from imgdiff.png_format import (  # noqa: F401 - re-exported: png.layout(...), png.PngDataError, ...
    AVG,
    CHANNELS,
    MIN_SHARED,
    NONE,
    PAETH,
    SUB,
    UP,
    Layout,
    PngDataError,
    check_idat_crcs,
    common_prefix,
    layout,
    new_buffer,
    stream,
    zlib_codec,
)

TYPE_CHECKING = False  # not typing's: importing typing costs the CLI ~2 ms of start-up
if TYPE_CHECKING:
    import numpy as np

FAST_COLOURS = (0, 2, 6)
"""Colour types :func:`unfilter` turns into arrays: gray, RGB, RGBA."""


def inflate(png: Layout):
    """Inflate the IDAT stream into a new buffer of exactly ``height * row_bytes`` bytes (no NumPy).

    Returns ``(buffer, filter types as bytes)``; raises :class:`PngDataError` when the stream is
    corrupt, ends early, holds more data than the header declares, or a row has a filter type > 4."""
    zlib_mod, zerror = zlib_codec()
    row, total = png.row_bytes, png.height * png.row_bytes
    buf = new_buffer(total)
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
    (shape ``(W[, C])``). Rows go to :func:`imgdiff.png_spng.unfilter_rows` when its native kernel
    runs, or when they hold Avg or Paeth (libspng); else NumPy undoes None/Sub/Up. None
    when imagecodecs is missing (use a full decoder then)."""
    import numpy as np

    if png.colour not in FAST_COLOURS or png.depth not in (8, 16):
        return None
    h, w, c = png.height, png.width, CHANNELS[png.colour]
    y0, y1 = rows if rows is not None else (0, h)
    start = y0 if above is not None else chain_start(filters, y0)
    from imgdiff import png_spng

    if max(filters[start:y1], default=NONE) >= AVG or png_spng.native_unfilter() is not None:
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
    in both (:func:`imgdiff.png_pair_inflate.inflate_pair`), which are not compared."""
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
    differing row (:func:`imgdiff.pair_rows.read_pair_rows` narrows it by comparing pixels)."""
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
    from imgdiff.png_pair_inflate import inflate_one

    buf, filters = inflate_one(png, data) or inflate(png)
    return unfilter(png, buf, filters)

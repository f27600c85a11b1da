"""The rows of two images that a diff needs, read from both files (the CLI's single-pair path).

:func:`read_pair_rows` validates and inflates two PNGs (:mod:`imgdiff.png`, :mod:`imgdiff.png_pair_inflate`:
no NumPy, GIL released, so it overlaps the CLI's imports), finds the rows whose filtered bytes differ
and unfilters only the band of rows :mod:`imgdiff.band_diff` asks for, and only B's own rows of it when
they are few. Other files (formats, sizes, PNG kinds) are decoded whole by :func:`imgdiff.io.decode`.
Errors are :class:`imgdiff.io_errors.ImageIOError`, as in :func:`imgdiff.io.read_pair`.
"""

from __future__ import annotations

import os
from collections import namedtuple

from imgdiff.io import _PNG_FAST_COLOURS, ImageInfo, _in_two_threads, _map_bytes, _read_bytes, decode, probe
from imgdiff.io_errors import read_error
from imgdiff.options import DEFAULT_MAX_PIXELS


def _inflate_or_decode(info: ImageInfo, data: bytes):
    """Stage 1 of :func:`read_pair_rows` (no NumPy for the fast PNG kind): ``(layout, (buffer,
    filters))`` of an inflated PNG that :func:`imgdiff.png.unfilter` can finish, else the decoded array."""
    from imgdiff import png

    fast = info.format == "PNG" and data[24] in (8, 16) and data[25] in _PNG_FAST_COLOURS
    if fast and b"IEND" in data[-1024:]:
        try:
            layout = png.layout(data, idat_crc=False)  # IDAT CRCs: read_pair_rows, after the inflate
            if layout is not None:
                from imgdiff.png_pair_inflate import inflate_one

                return layout, inflate_one(layout, data) or png.inflate(layout)
        except png.PngDataError as e:
            raise read_error(info.path, str(e), "re-export or re-download it") from None
    return decode(info, data)


def _fast_layout(info: ImageInfo, data, checked: int = 0):
    """The :class:`imgdiff.png.Layout` of a PNG that :func:`imgdiff.png.unfilter` can finish (None for
    other kinds); raises :class:`ImageIOError` on bad chunks."""
    from imgdiff import png

    if not (info.format == "PNG" and data[24] in (8, 16) and data[25] in _PNG_FAST_COLOURS):
        return None
    if b"IEND" not in data[-1024:]:
        return None  # the plain path reports it
    try:
        layout = png.layout(data, checked, idat_crc=False)  # IDAT CRCs: read_pair_rows, after the inflate
        return layout
    except png.PngDataError as e:
        raise read_error(info.path, str(e), "re-export or re-download it") from None


def _nothing() -> None:
    """The default ``on_inflate`` of :func:`read_pair_rows`."""


class _Once:
    """``fn`` callable any number of times, run the first time only."""

    def __init__(self, fn):
        self.fn = fn

    def __call__(self) -> None:
        fn, self.fn = self.fn, _nothing
        fn()


def _inflate_shared(infos, data, on_inflate=_nothing):
    """Stage 1 of :func:`read_pair_rows` for two PNGs of one layout whose files share a long prefix:
    ``((layout A, inflated A), (layout B, inflated B), equal leading bytes, common file prefix, b_from)``
    with the common compressed prefix inflated once (:func:`imgdiff.png_pair_inflate.inflate_pair`; B's
    buffer holds B's bytes from ``b_from`` on, see :func:`_fill_shared_rows`), else None. The IDAT
    CRCs are left to the caller (:func:`imgdiff.png.check_idat_crcs`). ``on_inflate()`` is called
    after the chunk walks, before the inflate (see :func:`read_pair_rows`)."""
    if not (infos[0].format == infos[1].format == "PNG" and data[0][16:29] == data[1][16:29]):
        return None
    from imgdiff import png

    common = png.common_prefix(data[0], data[1])
    if common < png.MIN_SHARED:  # cheap: before any CRC pass or ctypes import
        return None
    from imgdiff import png_pair_inflate

    la = _fast_layout(infos[0], data[0])
    lb = _fast_layout(infos[1], data[1], common) if la is not None else None  # shared chunks: A's CRCs
    if lb is None:
        return None
    on_inflate()
    got = png_pair_inflate.inflate_pair(la, data[0], lb, data[1], common)
    if got is None:
        return None
    return (la, got[0]), (lb, got[1]), got[2], common, got[3]


def _fill_shared_rows(sa, sb, b_from: int, first: int) -> None:
    """Make B's buffer from :func:`_inflate_shared` (B's bytes from ``b_from`` on) hold the rows from
    ``first`` on: the rows before ``b_from`` are A's (the shared prefix), copied over only when needed."""
    if not b_from:
        return
    from imgdiff import png_pair_inflate

    png_pair_inflate.fill_shared(sa[1][0], sb[1][0], b_from, first * sb[0].row_bytes)


def _finish(info: ImageInfo, data: bytes, staged, rows=None, above=None):
    """Stage 2: the unfiltered ``rows`` of a staged PNG (``above``: its unfiltered row above them, if
    known; :func:`imgdiff.png.unfilter`), or of a decoded array; a full decode when the unfilter
    cannot finish."""
    from imgdiff import png

    if not isinstance(staged, tuple):
        return staged if rows is None else staged[rows[0] : rows[1]]
    layout, (buf, filters) = staged
    arr = png.unfilter(layout, buf, filters, rows, above)
    if arr is None:
        arr = decode(info, data)
        return arr if rows is None else arr[rows[0] : rows[1]]
    return arr


class Band(namedtuple("Band", "a b y0 height x0 width")):
    """What :func:`read_pair_rows` returns: ``a``, ``b`` the pixels of A and B in rows
    ``[y0, y0 + len(a))`` and columns ``[x0, x0 + a.shape[1])`` of two ``height`` x ``width`` images
    that are equal everywhere else (whole images: ``y0 = x0 = 0``)."""

    __slots__ = ()


def read_pair_rows(
    a: str | os.PathLike,
    b: str | os.PathLike,
    *,
    band,
    window=None,
    on_inflate=_nothing,
    max_pixels: int = DEFAULT_MAX_PIXELS,
) -> Band:
    """Like :func:`imgdiff.io.read_pair`, but decodes only the rows a diff needs (and, with
    ``window``, cuts them to the columns it needs): a :class:`Band`.

    Both files are validated and inflated (for PNGs of the :mod:`imgdiff.png` kind this needs no
    NumPy, so it overlaps the caller's imports); when both are such PNGs of one layout, only the rows
    ``band(height, r0, r1) -> (y0, y1)`` are unfiltered, ``r0..r1`` being the rows that differ
    (:func:`_png_band`; ``band`` may be asked twice). When those few rows are all B needs of its own
    (a thin span), ``window(width, c0, c1) -> (x0, x1)`` gets the columns ``c0..c1`` where they
    differ and the band is cut to the columns it returns: B's band is then A's cut band with B's
    span rows written in, no full-width copy. Otherwise (other formats, sizes or kinds) both images
    are decoded whole. Errors as in :func:`imgdiff.io.read_pair`.

    ``on_inflate()`` is called once, when the GIL-holding checks and chunk walks are done and the
    inflate (GIL released) starts: the CLI starts its NumPy import thread there, as a thread that
    competes for the GIL from the start only stretches this thread's walks and gains nothing (the
    GIL-held work is the same in total; benchmarks/README.md).
    """
    from imgdiff import png

    infos = (probe(a, max_pixels=max_pixels), probe(b, max_pixels=max_pixels))
    data = [_map_bytes(info) if info.format == "PNG" else _read_bytes(info) for info in infos]
    once = _Once(on_inflate)
    staged = _inflate_shared(infos, data, once)
    if staged is None:
        once()
        staged = (*_in_two_threads(_inflate_or_decode, infos, data), 0, 0, 0)
    sa, sb, equal, common, b_from = staged
    for i, s, done in ((0, sa, 0), (1, sb, common)):  # B's chunks in the common prefix: A's CRCs
        if isinstance(s, tuple):
            try:
                png.check_idat_crcs(s[0], data[i], done)
            except png.PngDataError as e:
                raise read_error(infos[i].path, str(e), "re-export or re-download it") from None
    if isinstance(sa, tuple) and isinstance(sb, tuple):
        la, lb = sa[0], sb[0]
        if (la.width, la.height, la.colour, la.depth) == (lb.width, lb.height, lb.colour, lb.depth):
            return _png_band(infos, data, (sa, sb), equal, b_from, band, window)
    ra, rb = _finish_both(infos, data, (sa, sb), None)
    return Band(ra, rb, 0, ra.shape[0], 0, ra.shape[1])


def _png_band(infos, data, staged, equal: int, b_from: int, band, window) -> Band:
    """:func:`read_pair_rows` for two inflated PNGs of one layout (``staged``: A's and B's
    ``(layout, (buffer, filters))``). The rows whose filtered bytes differ, ``r0..r1``
    (:func:`imgdiff.png.changed_rows`), hold every pixel difference when B's row ``r1`` equals A's:
    below it the filtered bytes and the row above are equal. Else the span grows through the rows
    below that read the row above (:func:`imgdiff.png.changed_span`), and ``band`` is asked again.
    A thin span: A's band is unfiltered, B's span rows from A's row above them (no chain of rows
    above the span), and B's band is A's with them written in. A wide one: both bands."""
    from imgdiff import png

    sa, sb = staged
    layout, filters_a, filters_b = sa[0], sa[1][1], sb[1][1]
    h, w = layout.height, layout.width
    found = png.changed_rows(layout, sa[1], sb[0], sb[1], equal)
    if found is None:
        rows = band(h, 0, 0)
        ra = _finish(infos[0], data[0], sa, rows)
        return Band(ra, ra, rows[0], h, 0, w)  # the same pixels
    r0, r1 = found
    settled = r1 == png.span_end(filters_a, filters_b, r1)
    rows = band(h, r0, r1)
    if 2 * (r1 - r0 + 1) <= rows[1] - rows[0]:  # a thin span
        lo = min(rows[0], max(r0 - 1, 0))  # A's row above the span too
        a_rows = _finish(infos[0], data[0], sa, (lo, rows[1]))
        _fill_shared_rows(sa, sb, b_from, r0)
        above = a_rows[r0 - 1 - lo] if r0 else None
        span_b = _finish(infos[1], data[1], sb, (r0, r1 + 1), above)  # (r1 - r0 + 1, W[, C]): B's own rows
        if settled or (r1 < rows[1] and (span_b[-1] == a_rows[r1 - lo]).all()):
            ra = a_rows[rows[0] - lo :]
            span_at = slice(r0 - rows[0], r1 + 1 - rows[0])
            x0, x1 = _columns(ra[span_at], span_b, window)
            ra = ra[:, x0:x1]
            rb = ra.copy()
            rb[span_at] = span_b[:, x0:x1]
            return Band(ra, rb, rows[0], h, x0, w)
    else:
        _fill_shared_rows(sa, sb, b_from, png.chain_start(filters_b, rows[0]))
        ra, rb = _finish_both(infos, data, staged, rows)
        if settled or (rows[0] <= r1 < rows[1] and (ra[r1 - rows[0]] == rb[r1 - rows[0]]).all()):
            return Band(ra, rb, rows[0], h, 0, w)
    r1 = png.span_end(filters_a, filters_b, r1)  # B's pixels below r1 may differ
    rows = band(h, r0, r1)
    _fill_shared_rows(sa, sb, b_from, png.chain_start(filters_b, rows[0]))
    ra, rb = _finish_both(infos, data, staged, rows)
    return Band(ra, rb, rows[0], h, 0, w)


def _columns(span_a, span_b, window) -> tuple[int, int]:
    """``window(width, c0, c1)`` for the columns ``c0..c1`` where two row spans differ; all columns
    without a ``window`` or a difference."""
    import numpy as np

    w = span_a.shape[1]
    if window is None:
        return 0, w
    differ = (span_a != span_b).reshape(len(span_a), -1).any(axis=0)  # (W*C,): contiguous reductions
    cols = np.flatnonzero(differ.reshape(w, -1).any(axis=1))  # (W,) -> differing columns
    return window(w, int(cols[0]), int(cols[-1])) if cols.size else (0, w)


def _finish_both(infos, data, staged, rows):
    """:func:`_finish` of both images: in two threads when there are many rows to unfilter
    (the native kernel, ``imagecodecs.delta_decode`` and libspng release the GIL: a whole 4K image is
    ~8-60 ms each), else here."""
    many = rows is None or rows[1] - rows[0] >= PARALLEL_ROWS
    if not many:
        return [_finish(infos[i], data[i], staged[i], rows) for i in (0, 1)]
    pairs = list(zip(data, staged))
    return _in_two_threads(lambda info, item: _finish(info, item[0], item[1], rows), infos, pairs)


PARALLEL_ROWS = 512
"""Rows from which :func:`_finish_both` unfilters the two images in two threads."""

"""Inflate two PNGs that share a compressed prefix once for the prefix, then each on its own
(:func:`inflate_pair`); one PNG in a single ISA-L call (:func:`inflate_one`).

Two PNGs written by one encoder whose pixels agree on their first rows have byte-identical files up
to some offset ``D``: same header, same IDAT chunk boundaries, same compressed bytes. Inflating a
given compressed prefix always yields the same output, so the inflate of that prefix is done once
and the decoder state at ``D`` is copied: A's and B's streams then continue from their own bytes,
one after the other in the caller's thread with the GIL released (not in two threads: in the CLI
a third thread imports NumPy meanwhile, and on two cores that import is the longer path, which a
third runnable thread slows down: measured 7 ms more per 4K pair). Only B's output from ``D`` on is
written (plus the 32 KB of history its rest reads back): its leading rows are A's. Each file's IDAT
payloads are first copied into one buffer (:func:`imgdiff.png_format.stream`; B's from ``D`` on), so
that each inflate is a single ctypes call: one GIL release and re-take instead of one per 8 KB
chunk, each of which waited up to the 5 ms switch interval while the CLI's import thread held the
GIL (a 4K pair's chunk walk and inflate took ~40 ms longer that way). On a 4K pair that differs
in its middle rows this saves about a quarter of the two inflates' CPU time, and
:func:`imgdiff.png.changed_span` need not compare the shared rows.

Python's ``isal_zlib.decompressobj`` has no ``copy()`` and ``zlib``'s (which has) inflates 2-3x
slower than ISA-L here, so this calls ISA-L's ``isal_inflate`` (exported by the ``isal`` extension)
through ``ctypes`` on a raw deflate stream and copies the state as bytes. Only the head of
``struct inflate_state`` (``next_out``, ``avail_out``, ``total_out``, ``next_in``, ``read_in``,
``avail_in``), stable across ISA-L releases, is read or written; the rest of the struct holds no
pointers (the history is read back from the output buffer, so B's buffer gets the last 32 KB of A's
prefix output).
The zlib header and the Adler-32 trailer are checked here. Anything unexpected (no ``isal``, a
short common prefix, a decoder error, a stream that does not end exactly with its trailer, a filter
type > 4) returns None, and the caller inflates both files with :func:`imgdiff.png.inflate`, which
reports a bad file exactly as before: this path only ever returns what :func:`imgdiff.png.inflate`
would return for a good file.
"""

from __future__ import annotations

import ctypes

from imgdiff import png_format
from imgdiff.png_format import Layout, common_prefix, new_buffer
from imgdiff.png_format import stream as png_stream

STATE_BYTES = 1 << 18
"""Bytes reserved for ``struct inflate_state`` (~100 KB in ISA-L 2.31; room to spare)."""
MIN_SHARED = png_format.MIN_SHARED
"""Shortest common compressed prefix worth the state copy (bytes)."""
HISTORY = 1 << 15
"""Deflate's window (RFC 1951): a back-reference reaches at most this many output bytes back, so B's
rest needs only that much of the shared output before it."""


class _Head(ctypes.Structure):
    """The leading fields of ISA-L's ``struct inflate_state``."""

    _fields_ = [
        ("next_out", ctypes.c_void_p),
        ("avail_out", ctypes.c_uint32),
        ("total_out", ctypes.c_uint32),
        ("next_in", ctypes.c_void_p),
        ("read_in", ctypes.c_uint64),
        ("avail_in", ctypes.c_uint32),
        ("read_in_length", ctypes.c_int32),
    ]


_LIB: list = []


def _lib():
    """ISA-L's ``isal_inflate`` / ``isal_inflate_init`` via ctypes, or None when unavailable."""
    if not _LIB:
        try:
            from isal import isal_zlib

            lib = ctypes.CDLL(isal_zlib.__file__)
            lib.isal_inflate.argtypes = lib.isal_inflate_init.argtypes = [ctypes.c_void_p]
            lib.isal_inflate.restype = ctypes.c_int
            lib.isal_inflate_init.restype = None
            _LIB.append((lib, isal_zlib.adler32))
        except (ImportError, OSError, AttributeError):
            _LIB.append(None)
    return _LIB[0]


def _address(data) -> int | None:
    """Address of a bytes object's or writable buffer's first byte, or None."""
    if isinstance(data, bytes):
        return ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p).value
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(data))
    except (TypeError, ValueError):  # read-only or not a buffer: the plain path
        return None


def _feed(lib, state, address: int, n: int) -> bool:
    """One ``isal_inflate`` call on ``n`` bytes at ``address`` (the GIL is released for all of it)."""
    head = _Head.from_buffer(state)
    head.next_in, head.avail_in = address, n
    return lib.isal_inflate(state) in (0, 1)  # ISAL_DECOMP_OK, ISAL_END_INPUT


def _finish(lib, adler32, state, stream, start: int, png: Layout, buf, seed: tuple[int, int], head=b""):
    """Feed the rest of a stream (from ``start``); ``(buffer, filters)`` when it ends exactly with a
    matching Adler-32 trailer (``seed``: (bytes, adler) already summed), else None. ``head``: the filter
    types of the leading rows that ``buf`` does not hold (:func:`inflate_pair`: B's shared rows)."""
    row, total = png.row_bytes, png.height * png.row_bytes
    if len(stream) - start < 4 or not _feed(lib, state, _address(stream) + start, len(stream) - start):
        return None
    state_head = _Head.from_buffer(state)
    if state_head.total_out != total or state_head.avail_in != 4:
        return None
    trailer = bytes(stream[len(stream) - 4 :])
    done, value = seed
    if adler32(memoryview(buf)[done:total], value) != int.from_bytes(trailer, "big"):
        return None
    filters = head + buf[len(head) * row : total : row]
    return (buf, filters) if max(filters) <= 4 else None


def _zlib_header_ok(png: Layout) -> bool:
    """The stream starts with a zlib header for deflate without a preset dictionary."""
    if len(png.idat[0]) < 2:
        return False
    cmf, flg = png.idat[0][0], png.idat[0][1]
    return cmf & 15 == 8 and cmf >> 4 <= 7 and (cmf * 256 + flg) % 31 == 0 and not flg & 32


def _new_state(lib, out: int, size: int):
    state = ctypes.create_string_buffer(STATE_BYTES)
    lib.isal_inflate_init(state)
    head = _Head.from_buffer(state)
    head.next_out, head.avail_out = out, size
    return state


def inflate_one(png: Layout, data):
    """What :func:`imgdiff.png.inflate` returns for a good file, decoded by ISA-L in one call from the
    stream (:func:`imgdiff.png_format.stream`) straight into the output buffer; None when unavailable or
    anything is unexpected (the caller then runs :func:`imgdiff.png.inflate`, which names the problem).
    ``data``: the file's bytes (unused; kept for symmetry with :func:`inflate_pair`)."""
    found = _lib()
    if found is None or not _zlib_header_ok(png):
        return None
    lib, adler32 = found
    total = png.height * png.row_bytes
    buf = new_buffer(total)
    state = _new_state(lib, _address(buf), total)
    return _finish(lib, adler32, state, png_stream(png), 2, png, buf, (0, 1))


def _stream_prefix(png: Layout, common: int) -> int:
    """Leading zlib-stream bytes of ``png`` that lie before file offset ``common``: when two files share
    their first ``common`` bytes, their chunk framing up to there is the same, so their streams share
    at least this many leading bytes."""
    shared = 0
    for at, payload in zip(png.idat_at, png.idat):
        if common <= at:
            break
        shared += min(len(payload), common - at)
    return shared


def inflate_pair(pa: Layout, da, pb: Layout, db, common: int | None = None):
    """``(A's (buffer, filters), B's (buffer, filters), equal, b_from)`` as :func:`imgdiff.png.inflate`
    returns them, inflating the common compressed prefix once; ``equal`` is the count of leading
    inflated bytes that are equal in both. B's buffer holds B's bytes only from ``b_from`` on (a row
    start, at most ``equal``): its leading rows are A's, which :func:`fill_shared` copies over where
    needed (leaving them unwritten spares copying and faulting in ~half of a 25 MB buffer). None when
    this path does not apply or anything is unexpected. ``da``/``db``: the files' bytes; ``common``:
    the length of their common prefix when the caller knows it."""
    found = _lib()
    same = (pa.width, pa.height, pa.depth, pa.colour) == (pb.width, pb.height, pb.depth, pb.colour)
    if found is None or not same:
        return None
    lib, adler32 = found
    if not (_zlib_header_ok(pa) and _zlib_header_ok(pb)) or pa.idat_at[0] != pb.idat_at[0]:
        return None
    d = _stream_prefix(pa, common_prefix(da, db) if common is None else common)
    if d <= 2 or d - 2 < MIN_SHARED:  # 2: the zlib header, which the raw inflate skips
        return None
    sa, sb = png_stream(pa), png_stream(pb, d)  # B's stream: only what follows the shared prefix
    row, total = pa.row_bytes, pa.height * pa.row_bytes
    buf_a, buf_b = new_buffer(total), new_buffer(total)
    out_a, out_b = _address(buf_a), _address(buf_b)
    state_a = _new_state(lib, out_a, total)
    if not _feed(lib, state_a, _address(sa) + 2, d - 2):
        return None
    shared = _Head.from_buffer(state_a).total_out
    if shared >= total:
        return None
    b_from = max(shared - HISTORY, 0) // row * row
    state_b = ctypes.create_string_buffer(STATE_BYTES)
    ctypes.memmove(state_b, state_a, STATE_BYTES)
    ctypes.memmove(out_b + b_from, out_a + b_from, shared - b_from)  # the history B's rest reads back
    head_b = _Head.from_buffer(state_b)
    head_b.next_out, head_b.avail_out = out_b + shared, total - shared
    seed = (shared, adler32(memoryview(buf_a)[:shared]))
    filters_before = buf_a[0:b_from:row]  # B's (= A's) filter types of the rows it does not hold
    got_a = _finish(lib, adler32, state_a, sa, d, pa, buf_a, seed)
    got_b = _finish(lib, adler32, state_b, sb, 0, pb, buf_b, seed, filters_before) if got_a else None
    if got_b is None:
        return None
    return got_a, got_b, shared, b_from


def fill_shared(buf_a, buf_b, b_from: int, start: int) -> int:
    """Copy A's inflated bytes ``[start, b_from)`` into B's buffer from :func:`inflate_pair` (they are
    equal: the shared prefix) so that B's buffer holds B's bytes from ``start`` on; returns the new
    ``b_from``."""
    if start < b_from:
        memoryview(buf_b)[start:b_from] = memoryview(buf_a)[start:b_from]
        return start
    return b_from

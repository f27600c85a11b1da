"""Unfilter inflated PNG rows of any filter type: a native kernel where it runs, else libspng on the
rows re-wrapped as a small PNG.

The native kernel (:func:`native_unfilter`) is ``imgdiff/native/unfilter.c`` (a branch-free Paeth
predictor: ~2.4x libspng's speed on a Paeth-filtered 4K RGB photo, benchmarks/README.md) compiled
ahead of time into x86-64 machine code that needs no loader: one function, no relocation, no call,
no data (``imgdiff/native/build_unfilter.py`` checks that and writes ``unfilter_x86_64.hex``). On Linux
x86-64 it is copied into an anonymous mapping that is then made read-only and executable
(``mprotect``) and called through ``ctypes``, which releases the GIL; elsewhere, or where the OS
refuses executable mappings, or with ``IMGDIFF_NATIVE=0`` in the environment, libspng does the work as
below.

The Avg and Paeth filters predict a byte from its left neighbour, so a row is a chain of dependent
steps (Paeth: a branchy choice among three neighbours per byte) that NumPy cannot vectorise; the
fastest unfilter at hand is libspng's (part of imagecodecs, a dependency), and the alternatives
measured (benchmarks/README.md) were slower per image or cost ~0.4 s to start (Numba). libspng
only decodes whole PNG streams, so :func:`unfilter_rows` copies the rows ``[start, stop)`` of an
already inflated and validated image (:func:`imgdiff.png.inflate`) into a minimal PNG whose zlib
stream is stored (uncompressed) deflate blocks: re-inflating it is a copy, and libspng does the
unfilter only. A leading None-filtered row holds the unfiltered row above ``start`` (or zeros), so
the rows decode as they do inside the image: a band needs no rows above it once the row just above
is known.

libspng is called through ``ctypes`` on the symbols that imagecodecs' ``_spng`` extension exports
(like :mod:`imgdiff.png_pair_inflate` calls ISA-L's), with the CRC and Adler-32 checks off: the file's
own checksums were checked when it was inflated, and the wrapper is built here. When those symbols
are missing, imagecodecs' public ``png_decode`` (libpng; its ``spng_decode`` rejects 16-bit gray)
decodes the same wrapper with real checksums (a little slower). None when neither is available (the
caller then decodes the file in full).
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

from imgdiff.png_format import CHANNELS, Layout, new_buffer, zlib_codec

TYPE_CHECKING = False  # not typing's: importing typing costs the CLI ~2 ms of start-up
if TYPE_CHECKING:
    import numpy as np

BLOCK = 65535
"""Payload bytes of one stored deflate block (RFC 1951: at most 65,535)."""
SPNG_CTX_IGNORE_ADLER32, SPNG_CRC_USE, SPNG_FMT_PNG = 1, 2, 256
"""libspng's flags: skip the zlib trailer check; use chunk data without CRC checks; output in the
PNG's own layout, samples host-endian."""
_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_IEND = struct.pack(">I4sI", 0, b"IEND", 0xAE426082)

_LIB: list = []


def _lib():
    """libspng's functions via ctypes (the GIL is released during each call), or None."""
    if not _LIB:
        try:
            from imagecodecs import _spng

            lib = ctypes.CDLL(_spng.__file__)
            ptr, u32, size = ctypes.c_void_p, ctypes.c_uint32, ctypes.c_size_t
            lib.spng_ctx_new.argtypes, lib.spng_ctx_new.restype = [ctypes.c_int], ptr
            lib.spng_ctx_free.argtypes, lib.spng_ctx_free.restype = [ptr], None
            lib.spng_set_crc_action.argtypes = [ptr, ctypes.c_int, ctypes.c_int]
            lib.spng_set_image_limits.argtypes = [ptr, u32, u32]
            lib.spng_set_png_buffer.argtypes = [ptr, ptr, size]
            lib.spng_decode_image.argtypes = [ptr, ptr, size, ctypes.c_int, ctypes.c_int]
            for name in ("spng_set_crc_action", "spng_set_image_limits", "spng_set_png_buffer"):
                getattr(lib, name).restype = ctypes.c_int
            lib.spng_decode_image.restype = ctypes.c_int
            _LIB.append(lib)
        except (ImportError, OSError, AttributeError):
            _LIB.append(None)
    return _LIB[0]


_NATIVE: list = []
NATIVE_CODE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native", "unfilter_x86_64.hex")
"""The native kernel's machine code, hex below a header line (:mod:`imgdiff.native.build_unfilter`)."""
PROT_READ, PROT_EXEC = 1, 4


NATIVE_ENV = "IMGDIFF_NATIVE"
"""Set to ``0`` to never map the native kernel (libspng unfilters instead; same pixels, slower)."""


def read_native_code(path: str = NATIVE_CODE) -> bytes:
    """The machine code of the native kernel (the hex file without its ``#`` header line)."""
    with open(path) as f:
        return bytes.fromhex("".join(line for line in f.read().splitlines() if not line.startswith("#")))


def _load_native():
    """``imgdiff_unfilter`` of ``unfilter.c`` as a ctypes function over an executable mapping of its
    code (kept alive with it), or None off Linux x86-64 or when any step fails."""
    if sys.platform != "linux" or os.uname().machine != "x86_64":
        return None
    if os.environ.get(NATIVE_ENV, "1") == "0":
        return None  # the user opted out: libspng does the work
    try:
        import mmap

        code = read_native_code()
        mem = mmap.mmap(-1, len(code), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        mem.write(code)
        cell = ctypes.c_char.from_buffer(mem)
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        libc.mprotect.restype = ctypes.c_int
        if libc.mprotect(ctypes.addressof(cell), len(code), PROT_READ | PROT_EXEC) != 0:
            return None  # e.g. a hardened kernel that forbids executable anonymous memory
        ptr, size = ctypes.c_void_p, ctypes.c_size_t
        signature = ctypes.CFUNCTYPE(ctypes.c_int, ptr, ptr, size, size, size, ptr)
        return signature(ctypes.addressof(cell)), mem, cell
    except (OSError, ValueError, AttributeError, TypeError):
        return None


def native_unfilter():
    """The native kernel ``(src, out, rows, n, bpp, above) -> 0 | -1`` (``unfilter.c``), or None."""
    if not _NATIVE:
        _NATIVE.append(_load_native())
    return None if _NATIVE[0] is None else _NATIVE[0][0]


def wrap(png: Layout, buf, start: int, stop: int, above: bytes | None, *, checksums: bool):
    """``(buffer, size)``: a PNG of the inflated rows ``[start, stop)`` of ``buf`` (each with its
    filter-type byte) below a None-filtered row holding ``above`` (raw row bytes; zeros when None),
    the zlib stream in stored blocks, one IDAT chunk per block. ``checksums``: write real CRCs and
    Adler-32 (else zeros, for a decoder told to skip them)."""
    row = png.row_bytes
    n = (stop - start + 1) * row
    blocks = -(-n // BLOCK)
    size = 8 + 25 + blocks * (12 + 5) + 2 + n + 4 + 12
    out = new_buffer(size)
    view, rows = memoryview(out), memoryview(buf).cast("B")[start * row : stop * row]
    ihdr = struct.pack(">4sIIBBBBB", b"IHDR", png.width, stop - start + 1, png.depth, png.colour, 0, 0, 0)
    crc32, adler32 = (zlib_codec()[0].crc32, zlib_codec()[0].adler32) if checksums else (None, None)
    view[:33] = _SIGNATURE + struct.pack(">I", 13) + ihdr + struct.pack(">I", crc32(ihdr) if crc32 else 0)
    head = b"\x00" + (bytes(above) if above is not None else bytes(row - 1))  # (row,) the row above
    adler, pos = 1, 33
    for k in range(blocks):
        lo, hi = k * BLOCK, min((k + 1) * BLOCK, n)
        extra = (2 if k == 0 else 0) + (4 if k == blocks - 1 else 0)
        struct.pack_into(">I4s", out, pos, 5 + hi - lo + extra, b"IDAT")
        body = pos + 4
        pos += 8
        if k == 0:
            out[pos : pos + 2] = b"\x78\x01"  # zlib header: deflate, 32 KB window, no dictionary
            pos += 2
        struct.pack_into("<BHH", out, pos, k == blocks - 1, hi - lo, (hi - lo) ^ 0xFFFF)
        pos += 5
        for src, at in ((head, 0), (rows, row)):  # the block's bytes, from the head row and the rows
            a, b = max(lo - at, 0), min(hi - at, len(src))
            if a < b:
                view[pos + a + at - lo : pos + b + at - lo] = src[a:b]
        if adler32:
            adler = adler32(view[pos : pos + hi - lo], adler)
        pos += hi - lo
        if k == blocks - 1:
            struct.pack_into(">I", out, pos, adler if adler32 else 0)
            pos += 4
        struct.pack_into(">I", out, pos, crc32(view[body:pos]) if crc32 else 0)
        pos += 4
    view[pos : pos + 12] = _IEND
    return out, pos + 12


def unfilter_rows(png: Layout, buf, start: int, stop: int, above: np.ndarray | None = None):
    """The pixels of the inflated rows ``[start, stop)`` (any filter types): ``(rows, W)`` or
    ``(rows, W, C)`` uint8/uint16 (native byte order) from the native kernel, else from libspng; None
    when neither is available or succeeds.
    ``above``: the unfiltered row ``start - 1`` (shape ``(W[, C])``); None when ``start`` is 0 or its
    row does not read the row above (None/Sub filters)."""
    import numpy as np

    c = CHANNELS[png.colour]
    dtype = np.uint16 if png.depth == 16 else np.uint8
    raw = None
    if above is not None:
        raw = np.ascontiguousarray(above, dtype=">u2" if png.depth == 16 else np.uint8).view(np.uint8)
    shape = (stop - start + 1, png.width) if c == 1 else (stop - start + 1, png.width, c)
    native = native_unfilter() if png.depth in (8, 16) else None
    n, rows = png.row_bytes - 1, stop - start
    head = raw if raw is not None else np.zeros(n, np.uint8)  # (n,) the row above, raw bytes
    if native is not None and head.size == n:
        # bounds: frombuffer raises unless buf holds the rows; out and head are sized here
        src = np.frombuffer(buf, np.uint8, count=rows * png.row_bytes, offset=start * png.row_bytes)
        out = np.frombuffer(new_buffer(rows * n), np.uint8, count=rows * n)  # (rows * n,) unfiltered bytes
        if native(src.ctypes.data, out.ctypes.data, rows, n, c * png.depth // 8, head.ctypes.data) == 0:
            if png.depth == 16:
                out = out.view(">u2").astype(np.uint16)  # big-endian samples to native order
            return out.reshape(rows, *shape[1:])
    lib = _lib()
    if lib is not None:
        count = int(np.prod(shape))
        out = np.frombuffer(new_buffer(count * np.dtype(dtype).itemsize), dtype, count=count).reshape(shape)
        # (1 + rows, W[, C]): the head row, then the rows asked for; a huge-page mapping (few faults)
        wrapped, size = wrap(png, buf, start, stop, raw, checksums=False)
        ctx = lib.spng_ctx_new(SPNG_CTX_IGNORE_ADLER32)
        if not ctx:
            return None
        try:
            address = ctypes.addressof(ctypes.c_char.from_buffer(wrapped))
            ok = (
                lib.spng_set_crc_action(ctx, SPNG_CRC_USE, SPNG_CRC_USE) == 0
                and lib.spng_set_image_limits(ctx, png.width, stop - start + 1) == 0
                and lib.spng_set_png_buffer(ctx, address, size) == 0
                and lib.spng_decode_image(ctx, out.ctypes.data, out.nbytes, SPNG_FMT_PNG, 0) == 0
            )
        finally:
            lib.spng_ctx_free(ctx)
        return out[1:] if ok else None
    try:
        from imagecodecs import PngError, png_decode
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    wrapped, size = wrap(png, buf, start, stop, raw, checksums=True)
    try:
        out = png_decode(memoryview(wrapped)[:size])  # (1 + rows, W[, C]) native byte order
    except PngError:  # pragma: no cover - the wrapper is well formed
        return None
    return out.reshape(shape)[1:]

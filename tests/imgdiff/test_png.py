"""imgdiff.png (ISA-L inflate + unfilter) against libpng, and read_pair_rows."""

import struct
import zlib

import cv2
import imagecodecs
import numpy as np
import pytest

from imgdiff import io as iio
from imgdiff import pair_rows, png


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _paeth(left: np.ndarray, up: np.ndarray, corner: np.ndarray) -> np.ndarray:
    """The PNG spec's Paeth predictor, elementwise (int32 arrays)."""
    p = left + up - corner
    pa, pb, pc = np.abs(p - left), np.abs(p - up), np.abs(p - corner)
    return np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, corner))


def _encode(img: np.ndarray, filters: list[int]) -> bytes:
    """A PNG of ``img`` whose row r uses filter ``filters[r % len(filters)]`` (0 None .. 4 Paeth),
    filtered by this test's own NumPy code from the PNG spec."""
    h, w = img.shape[:2]
    c = 1 if img.ndim == 2 else img.shape[2]
    depth = 8 * img.dtype.itemsize
    px = img.reshape(h, -1).astype(">u2").view(np.uint8) if depth == 16 else img.reshape(h, -1)
    px = px.reshape(h, -1).astype(np.int32)
    bpp = c * depth // 8
    rows = []
    for r in range(h):
        f = filters[r % len(filters)]
        up = px[r - 1] if r else np.zeros_like(px[r])
        left = np.concatenate([np.zeros(bpp, np.int32), px[r, :-bpp]])
        corner = np.concatenate([np.zeros(bpp, np.int32), up[:-bpp]])
        pred = {0: 0, 1: left, 2: up, 3: (left + up) // 2, 4: _paeth(left, up, corner)}[f]
        rows.append(bytes([f]) + ((px[r] - pred) % 256).astype(np.uint8).tobytes())
    ihdr = struct.pack(">IIBBBBB", w, h, depth, {1: 0, 3: 2, 4: 6}[c], 0, 0, 0)
    body = _chunk(b"IDAT", zlib.compress(b"".join(rows)))
    return iio._PNG_MAGIC + _chunk(b"IHDR", ihdr) + body + _chunk(b"IEND", b"")


FILTER_MIXES = [[0], [1], [2], [3], [4], [2, 2, 1, 2, 0, 2], [1, 0, 2], [4, 3, 2, 1, 0, 4], [0, 3, 4, 2]]
"""Row filter types cycled down a test image: each alone, and mixes as adaptive encoders write them."""


@pytest.mark.parametrize("shape", [(9, 13), (9, 13, 3), (9, 13, 4), (1, 5, 3)])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("filters", FILTER_MIXES)
def test_decode_matches_libpng(shape, dtype, filters):
    img = np.random.default_rng(3).integers(0, np.iinfo(dtype).max + 1, shape, dtype=dtype)
    data = _encode(img, filters)
    got = png.decode(data)
    assert got.dtype == dtype and got.shape == shape
    np.testing.assert_array_equal(got, imagecodecs.png_decode(data))
    np.testing.assert_array_equal(got, img)
    layout = png.layout(data)
    buf, kinds = png.inflate(layout)
    for y0, y1 in [(0, 1), (3, 7), (shape[0] - 1, shape[0])]:
        if y0 < shape[0]:
            np.testing.assert_array_equal(png.unfilter(layout, buf, kinds, (y0, y1)), img[y0:y1])


def test_avg_and_paeth_rows_stay_on_the_fast_path(tmp_path, monkeypatch):
    img = np.random.default_rng(4).integers(0, 256, (20, 7, 3), dtype=np.uint8)
    for filters in ([1, 3], [1] * 19 + [4]):  # Avg from the first rows; Paeth on the last row only
        data = _encode(img, filters)
        np.testing.assert_array_equal(png.decode(data), img)
        (tmp_path / "x.png").write_bytes(data)
        monkeypatch.setattr(iio, "_decode_imagecodecs", None)  # no full decoder: the fast path did it
        np.testing.assert_array_equal(iio.read_image(tmp_path / "x.png"), img)
        monkeypatch.undo()


def test_changed_span_follows_up_chains():
    a = np.random.default_rng(5).integers(0, 256, (12, 5, 3), dtype=np.uint8)
    b = a.copy()
    b[4, 2] += 1
    for filters, want in (([1], (4, 4)), ([1, 1, 1, 1, 1, 2, 2, 1], (4, 6)), ([2], (4, 11)), ([4], (4, 11))):
        la, lb = png.layout(_encode(a, filters)), png.layout(_encode(b, filters))
        assert png.changed_span(la, png.inflate(la), lb, png.inflate(lb)) == want
        assert png.changed_rows(la, png.inflate(la), lb, png.inflate(lb)) == (4, 4 if filters == [1] else 5)
    la = png.layout(_encode(a, [1]))
    assert png.changed_span(la, png.inflate(la), la, png.inflate(la)) is None


def test_inflate_rejects_bad_streams():
    img = np.zeros((4, 3, 3), np.uint8)
    raw = b"".join(b"\x01" + bytes(9) for _ in range(4))
    ihdr = _chunk(b"IHDR", struct.pack(">IIBBBBB", 3, 4, 8, 2, 0, 0, 0))
    end = _chunk(b"IEND", b"")
    for body, word in (
        (raw + b"\x00" * 10, "more pixel data"),
        (raw[:-10], "truncated"),
        (b"\x07" + raw[1:], "filter type 7"),
    ):
        data = iio._PNG_MAGIC + ihdr + _chunk(b"IDAT", zlib.compress(body)) + end
        with pytest.raises(png.PngDataError, match=word):
            png.inflate(png.layout(data))
    good = _encode(img, [1])
    broken = good[:40] + bytes([good[40] ^ 0xFF]) + good[41:]  # inside the IDAT payload
    with pytest.raises(png.PngDataError, match="CRC"):
        png.layout(broken)


def _recording(result):
    """``(calls, fn)``: ``fn(*args)`` appends ``args`` to ``calls`` and returns ``result``."""
    calls = []

    def fn(*args):
        calls.append(args)
        return result

    return calls, fn


def _noise_pair(tmp_path, seed, shape, change):
    """Random image A, B = A with ``change(B)`` applied in place; written as tmp_path/a.png and b.png."""
    a = np.random.default_rng(seed).integers(0, 256, shape, dtype=np.uint8)
    b = a.copy()
    change(b)
    cv2.imwrite(str(tmp_path / "a.png"), a)
    cv2.imwrite(str(tmp_path / "b.png"), b)
    return a, b


def test_read_pair_rows_band_and_whole(tmp_path):
    def change(b):
        b[150, 7] ^= 0x40

    a, b = _noise_pair(tmp_path, 6, (300, 40, 3), change)
    seen, band = _recording((140, 160))

    calls = []
    ra, rb, y0, height, x0, width = pair_rows.read_pair_rows(
        tmp_path / "a.png", tmp_path / "b.png", band=band, on_inflate=lambda: calls.append("band")
    )
    assert seen == [(300, 150, 150)] and (y0, height, x0, width) == (140, 300, 0, 40)
    np.testing.assert_array_equal(ra, a[140:160, :, ::-1])
    np.testing.assert_array_equal(rb, b[140:160, :, ::-1])
    got = pair_rows.read_pair_rows(
        tmp_path / "a.png", tmp_path / "b.png", band=band, window=lambda w, c0, c1: (4, 12)
    )
    assert (got.y0, got.height, got.x0, got.width) == (140, 300, 4, 40)
    np.testing.assert_array_equal(got.a, a[140:160, 4:12, ::-1])
    np.testing.assert_array_equal(got.b, b[140:160, 4:12, ::-1])
    cv2.imwrite(str(tmp_path / "g.png"), a[:, :, 0])
    ra, rb, y0, height, x0, width = pair_rows.read_pair_rows(
        tmp_path / "a.png", tmp_path / "g.png", band=band, on_inflate=lambda: calls.append("whole")
    )
    assert ra.shape == (300, 40, 3) and rb.shape == (300, 40) and (y0, height, x0, width) == (0, 300, 0, 40)
    assert calls == ["band", "whole"]  # once per read, on either path


def test_read_pair_rows_window_gets_the_changed_columns(tmp_path):
    """A thin span: the window callback sees the columns where the span's rows differ, and the band
    comes back cut to the window it returns (wide spans and equal images are not cut)."""

    def change(b):
        b[100:104, 30:41] ^= 0x11
        b[102, 55] ^= 0x01

    a, b = _noise_pair(tmp_path, 8, (200, 90, 3), change)
    seen, window = _recording((16, 64))

    got = pair_rows.read_pair_rows(
        tmp_path / "a.png", tmp_path / "b.png", band=lambda h, r0, r1: (80, 120), window=window
    )
    assert seen == [(90, 30, 55)] and (got.y0, got.x0, got.width) == (80, 16, 90)
    np.testing.assert_array_equal(got.a, a[80:120, 16:64, ::-1])
    np.testing.assert_array_equal(got.b, b[80:120, 16:64, ::-1])
    wide = pair_rows.read_pair_rows(
        tmp_path / "a.png", tmp_path / "b.png", band=lambda h, r0, r1: (99, 105), window=window
    )
    assert (wide.x0, wide.a.shape[1]) == (0, 90) and len(seen) == 1
    same = pair_rows.read_pair_rows(
        tmp_path / "a.png", tmp_path / "a.png", band=lambda h, r0, r1: (0, 10), window=window
    )
    assert same.a.shape == (10, 90, 3) and len(seen) == 1
    np.testing.assert_array_equal(same.b, a[:10, :, ::-1])


def _split_idat(data: bytes, sizes: list[int]) -> bytes:
    """``data`` (one IDAT chunk) re-chunked into IDAT payloads of ``sizes`` (cycled), the rest last."""
    ihdr_end = 8 + 25
    (n,) = struct.unpack(">I", data[ihdr_end : ihdr_end + 4])
    stream = data[ihdr_end + 8 : ihdr_end + 8 + n]
    chunks, pos, k = [], 0, 0
    while pos < len(stream):
        size = sizes[k % len(sizes)]
        chunks.append(_chunk(b"IDAT", stream[pos : pos + size]))
        pos, k = pos + size, k + 1
    return data[:ihdr_end] + b"".join(chunks) + _chunk(b"IEND", b"")


@pytest.mark.parametrize("sizes", [[64], [1], [64, 64, 64, 7], [5, 64], [100000]])
def test_layout_run_skip_equals_chunk_walk(sizes):
    """``idat_crc=False`` takes runs of equal IDAT chunks with strided slices: same payloads and
    offsets as the chunk-by-chunk walk, and a cut-off file still fails as truncated."""
    img = np.random.default_rng(5).integers(0, 256, (40, 33, 3), dtype=np.uint8)
    data = _split_idat(_encode(img, [1, 2]), sizes)
    walk, run = png.layout(data), png.layout(data, idat_crc=False)
    assert run.idat_at == walk.idat_at
    assert [bytes(v) for v in run.idat] == [bytes(v) for v in walk.idat]
    np.testing.assert_array_equal(png.decode(data), img)
    for cut in (len(data) - 12, len(data) - 30, len(data) // 2):  # inside IEND, the last IDATs, the middle
        with pytest.raises(png.PngDataError, match="truncated"):
            png.layout(data[:cut], idat_crc=False)


@pytest.mark.parametrize("filters", [[1], [2], [2, 2, 1], [0, 2], [4], [3], [4, 3, 1, 4, 2]])
@pytest.mark.parametrize("rows", [(50, 50), (48, 55), (10, 90)])
def test_read_pair_rows_thin_span_takes_b_from_a(tmp_path, filters, rows):
    """B's band is A's band with only the changed span unfiltered from B (a thin span), or both
    bands unfiltered (a wide one): either way the exact rows of both images, Up chains included."""
    a = np.random.default_rng(7).integers(0, 256, (100, 24, 3), dtype=np.uint8)
    b = a.copy()
    b[rows[0] : rows[1] + 1, 5] ^= 0x21
    (tmp_path / "a.png").write_bytes(_encode(a, filters))
    (tmp_path / "b.png").write_bytes(_encode(b, filters))
    ra, rb, y0, height, _, _ = pair_rows.read_pair_rows(
        tmp_path / "a.png", tmp_path / "b.png", band=lambda *_: (30, 95)
    )
    assert (y0, height) == (30, 100)
    np.testing.assert_array_equal(ra, a[30:95])
    np.testing.assert_array_equal(rb, b[30:95])


def test_png_modules_are_layered():
    """The format module imports no other imgdiff module, the pair inflate and the libspng unfilter
    build on it only, and the decoder re-exports the format's names (``png.layout``)."""
    from imgdiff import png_format
    from tests.test_layout import import_graph

    graph = import_graph()
    assert graph["imgdiff.png_format"] == set()
    assert graph["imgdiff.png_pair_inflate"] == {"imgdiff.png_format"}
    assert graph["imgdiff.png_spng"] == {"imgdiff.png_format"}
    assert graph["imgdiff.png"] == {"imgdiff.png_format", "imgdiff.png_pair_inflate", "imgdiff.png_spng"}
    for name in ("layout", "Layout", "PngDataError", "check_idat_crcs", "common_prefix", "stream", "PAETH"):
        assert getattr(png, name) is getattr(png_format, name), name

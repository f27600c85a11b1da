"""imgdiff.png_pair_inflate (inflate a common compressed prefix once) equals two plain inflates, and falls
back (None) on anything it cannot vouch for, so the plain path reports bad files as before."""

import struct
import zlib

import numpy as np
import pytest

from imgdiff import io as iio
from imgdiff import pair_rows, png, png_pair_inflate


@pytest.fixture(autouse=True)
def _small_prefixes(monkeypatch):
    """Small test images: share prefixes from 256 bytes on (4K images clear the default easily)."""
    monkeypatch.setattr(png_pair_inflate, "MIN_SHARED", 256)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png(
    img: np.ndarray,
    *,
    idat: int = 8192,
    filt: int = 0,
    level: int = 1,
    tail: bytes = b"",
    rows: int = 0,
    avg_from: int | None = None,
) -> bytes:
    """An 8-bit RGB PNG whose rows all use filter ``filt`` (0 None, 1 Sub, 2 Up), or Avg from row
    ``avg_from`` on, its zlib stream cut into IDAT chunks of ``idat`` bytes (as OpenCV writes them);
    ``tail`` is appended to the zlib stream; ``rows``: the height its header declares (default: the
    image's)."""
    h, w, _ = img.shape
    px = img.reshape(h, -1).astype(np.int32)
    left = np.concatenate([np.zeros((h, 3), np.int32), px[:, :-3]], axis=1)
    up = np.concatenate([np.zeros((1, px.shape[1]), np.int32), px[:-1]], axis=0)
    kinds = [filt if avg_from is None or r < avg_from else 3 for r in range(h)]
    pred = {0: 0 * px, 1: left, 2: up, 3: (left + up) // 2}
    px = np.stack([(px[r] - pred[k][r]) % 256 for r, k in enumerate(kinds)])
    raw = b"".join(bytes([k]) + row.astype(np.uint8).tobytes() for k, row in zip(kinds, px))
    stream = zlib.compress(raw, level) + tail
    body = b"".join(_chunk(b"IDAT", stream[i : i + idat]) for i in range(0, len(stream), idat))
    ihdr = struct.pack(">IIBBBBB", w, rows or h, 8, 2, 0, 0, 0)
    return iio._PNG_MAGIC + _chunk(b"IHDR", ihdr) + body + _chunk(b"IEND", b"")


def _noise(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)


def _check_equal_to_plain(da: bytes, db: bytes):
    la, lb = png.layout(da), png.layout(db)
    got = png_pair_inflate.inflate_pair(la, da, lb, db)
    assert got is not None
    (buf_a, fa), (buf_b, fb), equal, b_from = got
    ra, rb = png.inflate(la), png.inflate(lb)
    assert bytes(buf_a) == bytes(ra[0]) and fa == ra[1]
    assert fb == rb[1]  # every row's filter type, those B's buffer does not hold included
    assert 0 < equal and bytes(ra[0])[:equal] == bytes(rb[0])[:equal]
    assert b_from % la.row_bytes == 0
    assert b_from <= max(equal - png_pair_inflate.HISTORY, 0) < b_from + la.row_bytes
    assert b_from <= equal and bytes(buf_b)[b_from:] == bytes(rb[0])[b_from:]
    assert not any(bytes(buf_b)[:b_from])  # the shared rows are left unwritten (A's)
    span = png.changed_span(la, ra, lb, rb)
    assert png.changed_span(la, got[0], lb, got[1], equal) == span
    assert png_pair_inflate.fill_shared(buf_a, buf_b, b_from, 0) == 0
    assert bytes(buf_b) == bytes(rb[0])  # completed with A's rows, B's buffer is the plain inflate
    return got, span


@pytest.mark.parametrize("row", [150, 199, 120])
@pytest.mark.parametrize("idat", [8192, 1000, 100_000])
def test_shared_prefix_equals_plain_inflate(row, idat):
    a = _noise(200, 300, 1)
    b = a.copy()
    b[row, 7] ^= 0xFF
    (_, _, equal, _), span = _check_equal_to_plain(_png(a, idat=idat), _png(b, idat=idat))
    assert span == (row, row) and equal <= row * png.layout(_png(a)).row_bytes + 1 + 7 * 3  # first diff


def test_last_byte_and_sub_filter():
    y, x = np.mgrid[0:400, 0:400]
    a = np.stack([x, y, (x + y) // 2], axis=2).astype(np.uint8) + _noise(400, 400, 9) // 32  # long matches
    b = a.copy()
    b[-1, -1, 2] ^= 1  # the very last pixel byte
    da, db = _png(a, filt=1, level=9, idat=4096), _png(b, filt=1, level=9, idat=4096)
    _, span = _check_equal_to_plain(da, db)
    assert span == (399, 399)


@pytest.mark.parametrize("seed", range(4))
def test_random_pairs(seed):
    rng = np.random.default_rng(seed)
    h, w = int(rng.integers(120, 260)), int(rng.integers(100, 300))
    a = (_noise(h, w, seed) // 64 * 64).astype(np.uint8)  # some structure, some noise
    b = a.copy()
    r0 = int(rng.integers(h // 2, h))
    b[r0:, int(rng.integers(0, w))] = rng.integers(0, 256, 3, dtype=np.uint8)
    idat = int(rng.integers(500, 20_000))
    _check_equal_to_plain(_png(a, idat=idat), _png(b, idat=idat))


def test_not_applicable_returns_none():
    a = _noise(200, 300, 2)
    b = a.copy()
    b[0, 0, 0] ^= 1  # divergence in the first bytes of the stream: nothing to share
    da, db = _png(a), _png(b)
    assert png_pair_inflate.inflate_pair(png.layout(da), da, png.layout(db), db) is None
    dc = _png(np.ascontiguousarray(a[:, :299]))  # another layout
    assert png_pair_inflate.inflate_pair(png.layout(da), da, png.layout(dc), dc) is None
    same = _png(a)  # identical files: the prefix holds the whole stream
    assert png_pair_inflate.inflate_pair(png.layout(da), da, png.layout(same), same) is None
    b2 = a.copy()
    b2[190, 0, 0] ^= 1
    db2 = _png(b2)
    got = png_pair_inflate.inflate_pair(png.layout(da), da, png.layout(db2), db2)
    assert got is not None
    ro = memoryview(db2).toreadonly()  # read-only input is fine: the stream is copied before the inflate
    got_ro = png_pair_inflate.inflate_pair(png.layout(da), da, png.layout(ro), ro)
    assert got_ro is not None and bytes(got_ro[1][0]) == bytes(got[1][0]) and got_ro[2:] == got[2:]


def test_bad_streams_fall_back_to_the_plain_errors(tmp_path):
    a = _noise(200, 300, 5)
    b = a.copy()
    b[180, 3, 1] ^= 1
    da = _png(a)
    long_b = _png(b, tail=b"junk")  # data after the zlib stream: not vouched for here
    assert png_pair_inflate.inflate_pair(png.layout(da), da, png.layout(long_b), long_b) is None
    good_b = bytearray(_png(b))
    layout = png.layout(bytes(good_b))
    at = layout.idat_at[-1] + len(layout.idat[-1]) - 2  # corrupt the Adler-32 trailer (CRC fixed up)
    good_b[at] ^= 0xFF
    start = layout.idat_at[-1] - 8
    n = len(layout.idat[-1])
    kind_body = bytes(good_b[start + 4 : start + 8 + n])
    good_b[start + 8 + n : start + 12 + n] = struct.pack(">I", zlib.crc32(kind_body))
    bad_b = bytes(good_b)
    assert png_pair_inflate.inflate_pair(png.layout(da), da, png.layout(bad_b), bad_b) is None
    pa, pb = tmp_path / "a.png", tmp_path / "b.png"
    pa.write_bytes(da)
    pb.write_bytes(bad_b)
    with pytest.raises(iio.ImageIOError, match="corrupt"):
        pair_rows.read_pair_rows(pa, pb, band=lambda h, r0, r1: (0, h))


def test_read_pair_rows_uses_the_shared_path(tmp_path, monkeypatch):
    a = _noise(200, 300, 6)
    b = a.copy()
    b[170:175, 40:60] = 0
    pa, pb = tmp_path / "a.png", tmp_path / "b.png"
    pa.write_bytes(_png(a))
    pb.write_bytes(_png(b))
    calls = []
    real = png_pair_inflate.inflate_pair
    monkeypatch.setattr(png_pair_inflate, "inflate_pair", lambda *x: calls.append(real(*x)) or calls[-1])
    started = []
    ra, rb, y0, h, _, _ = pair_rows.read_pair_rows(
        pa, pb, band=lambda h, r0, r1: (r0, r1 + 1), on_inflate=lambda: started.append(len(calls))
    )
    assert calls and calls[0] is not None
    assert started == [0]  # once, before the inflate
    assert (y0, h) == (170, 200)
    np.testing.assert_array_equal(ra, a[170:175])
    np.testing.assert_array_equal(rb, b[170:175])


@pytest.mark.parametrize("filt", [1, 2])
@pytest.mark.parametrize("band", ["wide from above B's tail", "thin", "wide inside B's tail"])
def test_read_pair_rows_fills_the_shared_rows_b_needs(tmp_path, filt, band):
    """B's buffer holds only B's tail (png_pair_inflate leaves the shared rows to A's): a wide span whose band
    starts above it, or a chain of Up rows reaching back into it, still gets B's exact rows."""
    a = _noise(200, 300, 8)
    b = a.copy()
    b[150:200, 10:20] = 7
    pa, pb = tmp_path / "a.png", tmp_path / "b.png"
    pa.write_bytes(_png(a, filt=filt))
    pb.write_bytes(_png(b, filt=filt))
    got = pair_rows._inflate_shared(*_staged_inputs(pa, pb))
    assert got is not None and got[4] > 0  # the shared path ran and left B's leading rows unwritten
    tail = got[4] // got[0][0].row_bytes  # B's first row of its own
    rows = {
        "wide from above B's tail": (tail - 5, 200),
        "thin": (0, 200),
        "wide inside B's tail": (tail + 20, 200),
    }
    ra, rb, y0, h, _, _ = pair_rows.read_pair_rows(pa, pb, band=lambda h, r0, r1: rows[band])
    assert (y0, h) == (rows[band][0], 200)
    np.testing.assert_array_equal(ra, a[y0:])
    np.testing.assert_array_equal(rb, b[y0:])


def test_b_with_avg_rows_after_the_shared_prefix(tmp_path):
    """B's filters are not peeked at (its first rows are A's): Avg rows in B's tail still decode
    right, through the full decoder."""
    a = _noise(200, 300, 9)
    b = a.copy()
    b[170:175, 40:60] = 0
    pa, pb = tmp_path / "a.png", tmp_path / "b.png"
    pa.write_bytes(_png(a, filt=1))
    pb.write_bytes(_png(b, filt=1, avg_from=160))
    got = pair_rows._inflate_shared(*_staged_inputs(pa, pb))
    assert got is not None and max(got[1][1][1]) == 3  # the shared path ran; B has Avg rows
    for rows in [(100, 200), (165, 180)]:  # a thin span, a wide one
        ra, rb, y0, *_ = pair_rows.read_pair_rows(pa, pb, band=lambda h, r0, r1, rows=rows: rows)
        np.testing.assert_array_equal(ra, a[y0 : rows[1]])
        np.testing.assert_array_equal(rb, b[y0 : rows[1]])


def _staged_inputs(pa, pb):
    infos = (iio.probe(pa), iio.probe(pb))
    return infos, [iio._map_bytes(info) for info in infos]


def test_common_prefix():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes()
    for d in (0, 1, 65535, 65536, 65537, 200_001, 299_999):
        y = bytearray(x)
        y[d] ^= 1
        assert png.common_prefix(x, bytes(y)) == d
    assert png.common_prefix(x, x) == len(x)
    assert png.common_prefix(x, x[:1000]) == 1000
    big = rng.integers(0, 256, 3_000_000, dtype=np.uint8).tobytes()  # several 1 MB memcmp steps
    for d in (0, 1_048_576, 2_500_001):
        y = bytearray(big)
        y[d] ^= 1
        assert png.common_prefix(big, y) == d  # bytes and a writable buffer: compared in place
        assert png.common_prefix(memoryview(big).toreadonly(), bytes(y)) == d  # no address: slices


def test_first_unequal_scans_both_ways(monkeypatch):
    monkeypatch.setattr(png, "SCAN_WORDS", 7)  # many small slices
    rng = np.random.default_rng(2)
    ua = rng.integers(0, 2**63, 100, dtype=np.uint64)
    for idx in ([], [0], [99], [6, 7], [13, 50, 93]):
        ub = ua.copy()
        ub[idx] ^= np.uint64(1)
        for start in (0, 6, 7, 50, 99):
            ahead = [j for j in idx if j >= start]
            behind = [j for j in idx if j <= start]
            assert png._first_unequal(ua, ub, start, 100, 1) == (ahead[0] if ahead else None)
            assert png._first_unequal(ua, ub, start, -1, -1) == (behind[-1] if behind else None)


@pytest.mark.parametrize("idat", [5, 1000, 100_000])
@pytest.mark.parametrize("filt", [0, 1])
def test_inflate_one_equals_plain_inflate(idat, filt):
    data = _png(_noise(50, 70, idat + filt), idat=idat, filt=filt)
    layout = png.layout(data)
    got = png_pair_inflate.inflate_one(layout, data)  # idat=5: the trailer spans chunks
    ref = png.inflate(layout)
    assert got is not None and bytes(got[0]) == bytes(ref[0]) and got[1] == ref[1]
    assert png_pair_inflate.inflate_one(layout, bytearray(data)) is not None  # a writable buffer works too


def test_inflate_one_leaves_odd_and_bad_streams_to_the_plain_inflate():
    img = _noise(50, 70, 1)
    junk = _png(img, tail=b"junk")  # bytes after the zlib stream: the plain inflate ignores them
    assert png_pair_inflate.inflate_one(png.layout(junk), junk) is None
    assert bytes(png.inflate(png.layout(junk))[0]) == bytes(png.inflate(png.layout(_png(img)))[0])
    for bad in (_png(img, rows=49), _png(img, rows=51)):  # more / less data than the header declares
        layout = png.layout(bad)
        assert png_pair_inflate.inflate_one(layout, bad) is None
        with pytest.raises(png.PngDataError):
            png.inflate(layout)
    good = _png(img)
    ro = memoryview(good).toreadonly()  # the stream is copied: read-only input is fine
    want = bytes(png.inflate(png.layout(good))[0])
    assert bytes(png_pair_inflate.inflate_one(png.layout(ro), ro)[0]) == want


def test_layout_skips_only_the_crcs_of_checked_chunks():
    a = _noise(200, 300, 7)
    data = bytearray(_png(a, idat=1000))
    first = png.layout(bytes(data))
    at = first.idat_at[3] + 5  # corrupt a byte inside the fourth IDAT payload
    data[at] ^= 1
    with pytest.raises(png.PngDataError, match="CRC"):
        png.layout(bytes(data))
    with pytest.raises(png.PngDataError, match="CRC"):  # the chunk ends after `checked`: still checked
        png.layout(bytes(data), checked=at + 1)
    end4 = first.idat_at[3] + len(first.idat[3]) + 4
    assert png.layout(bytes(data), checked=end4) is not None  # declared byte-identical to a good file
    deferred = png.layout(bytes(data), idat_crc=False)  # the IDAT CRCs are left to check_idat_crcs
    assert deferred is not None
    with pytest.raises(png.PngDataError, match="IDAT chunk fails its CRC"):
        png.check_idat_crcs(deferred, bytes(data))
    with pytest.raises(png.PngDataError, match="CRC"):
        png.check_idat_crcs(deferred, bytes(data), checked=end4 - 1)
    png.check_idat_crcs(deferred, bytes(data), checked=end4)
    png.check_idat_crcs(first, _png(a, idat=1000))  # a good file passes
    data[first.idat_at[0] - 10] ^= 1  # a byte of the IHDR CRC (no chunk in between): still checked
    with pytest.raises(png.PngDataError, match="IHDR chunk fails"):
        png.layout(bytes(data), idat_crc=False)

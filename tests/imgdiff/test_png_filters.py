"""Every PNG filter type on the fast path: files written by Pillow (adaptive filters: Avg/Paeth rows)
and by OpenCV decode equal to OpenCV/Pillow, the band path equals the full decode, libspng's public
API gives what its ctypes call gives, and corrupt files still give exit 2 with one line."""

import struct
import zlib

import cv2
import imagecodecs
import numpy as np
import pytest
from PIL import Image

from imgdiff import io as iio
from imgdiff import pair_rows, png, png_spng
from imgdiff.api import diff
from imgdiff.band_diff import band_rows, diff_band
from imgdiff.cli import main
from tests.imgdiff.photos import photo
from tests.imgdiff.test_png import FILTER_MIXES, _encode


def _photo(h: int, w: int, channels: int = 3, dtype=np.uint8) -> np.ndarray:
    """A real photo cut to (h, w[, channels]): smooth areas and edges, as adaptive filters meet them."""
    rgb = cv2.resize(np.asarray(photo("coffee")), (w, h), interpolation=cv2.INTER_AREA)  # (h, w, 3)
    if channels == 1:
        img = rgb[:, :, 1]
    elif channels == 4:
        img = np.dstack([rgb, np.linspace(0, 255, w, dtype=np.uint8)[None, :].repeat(h, 0)])
    else:
        img = rgb
    if dtype == np.uint16:
        img = img.astype(np.uint16) * 257 + np.arange(w, dtype=np.uint16)[None, :].reshape(
            (1, w) + (1,) * (img.ndim - 2)
        )
    return np.ascontiguousarray(img)


def _filters(data: bytes) -> set[int]:
    layout = png.layout(data)
    return set(png.inflate(layout)[1])


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_pillow_files_decode_like_opencv(tmp_path, channels):
    img = _photo(70, 90, channels)
    Image.fromarray(img).save(tmp_path / "p.png")  # Pillow defaults: adaptive filters, zlib level 6
    data = (tmp_path / "p.png").read_bytes()
    assert {png.AVG, png.PAETH} & _filters(data)  # the filters the fast path used to leave to libpng
    got = png.decode(data)
    np.testing.assert_array_equal(got, img)
    ref = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    ref = (
        ref
        if ref.ndim == 2
        else cv2.cvtColor(ref, cv2.COLOR_BGR2RGB if channels == 3 else cv2.COLOR_BGRA2RGBA)
    )
    np.testing.assert_array_equal(got, ref)


def test_pillow_16_bit_gray_and_palette(tmp_path):
    gray16 = _photo(40, 50, 1, np.uint16)
    Image.fromarray(gray16).save(tmp_path / "g16.png")
    data = (tmp_path / "g16.png").read_bytes()
    assert data[24] == 16
    np.testing.assert_array_equal(png.decode(data), gray16)
    pal = Image.fromarray(_photo(40, 50)).quantize(64)  # palette: the OpenCV fallback expands it
    pal.save(tmp_path / "p.png")
    assert png.decode((tmp_path / "p.png").read_bytes()) is None
    np.testing.assert_array_equal(iio.read_image(tmp_path / "p.png"), np.asarray(pal.convert("RGB")))


@pytest.mark.parametrize("channels", [1, 3, 4])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_opencv_files_decode_like_pillow(tmp_path, channels, dtype):
    img = _photo(30, 41, channels, dtype)
    bgr = (
        img
        if channels == 1
        else cv2.cvtColor(img, cv2.COLOR_RGB2BGR if channels == 3 else cv2.COLOR_RGBA2BGRA)
    )
    cv2.imwrite(str(tmp_path / "c.png"), bgr)
    data = (tmp_path / "c.png").read_bytes()
    got = png.decode(data)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, img)
    if dtype == np.uint8:
        np.testing.assert_array_equal(got, np.asarray(Image.open(tmp_path / "c.png")))


@pytest.mark.parametrize("shape", [(11, 9), (11, 9, 3), (11, 9, 4)])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("filters", FILTER_MIXES)
def test_rows_from_a_known_row_above(shape, dtype, filters):
    """``above`` (the unfiltered row above) lets any rows be unfiltered without the rows above them."""
    img = np.random.default_rng(11).integers(0, np.iinfo(dtype).max + 1, shape, dtype=dtype)
    layout = png.layout(_encode(img, filters))
    buf, kinds = png.inflate(layout)
    for y0, y1 in [(1, 11), (4, 6), (10, 11)]:
        got = png.unfilter(layout, buf, kinds, (y0, y1), above=img[y0 - 1])
        np.testing.assert_array_equal(got, img[y0:y1])


@pytest.mark.parametrize("shape", [(11, 9), (11, 9, 3), (11, 9, 4)])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_public_spng_api_equals_the_ctypes_call(monkeypatch, shape, dtype):
    img = np.random.default_rng(12).integers(0, np.iinfo(dtype).max + 1, shape, dtype=dtype)
    layout = png.layout(_encode(img, [4, 3, 1]))
    buf, _ = png.inflate(layout)
    assert png_spng._lib() is not None  # imagecodecs' build exports libspng: the fast call is tested
    fast = png_spng.unfilter_rows(layout, buf, 3, 9, img[2])
    monkeypatch.setattr(png_spng, "_LIB", [None])  # as with an imagecodecs that hides the symbols
    public = png_spng.unfilter_rows(layout, buf, 3, 9, img[2])
    np.testing.assert_array_equal(fast, img[3:9])
    np.testing.assert_array_equal(public, img[3:9])
    wrapped, size = png_spng.wrap(layout, buf, 0, 11, None, checksums=True)  # a valid PNG on its own
    head = np.zeros((1,) + shape[1:], dtype)
    np.testing.assert_array_equal(imagecodecs.png_decode(bytes(wrapped[:size])), np.concatenate([head, img]))


def test_wrapper_spans_many_stored_blocks(monkeypatch):
    monkeypatch.setattr(png_spng, "BLOCK", 100)  # rows cross block edges, the head row too
    img = np.random.default_rng(13).integers(0, 256, (30, 47, 3), dtype=np.uint8)
    layout = png.layout(_encode(img, [4, 2, 3]))
    buf, _ = png.inflate(layout)
    np.testing.assert_array_equal(png_spng.unfilter_rows(layout, buf, 5, 30, img[4]), img[5:])
    monkeypatch.setattr(png_spng, "_LIB", [None])
    np.testing.assert_array_equal(png_spng.unfilter_rows(layout, buf, 0, 30), img)


def _pillow_pair(tmp_path, a: np.ndarray, b: np.ndarray):
    pa, pb = tmp_path / "a.png", tmp_path / "b.png"
    Image.fromarray(a).save(pa)
    Image.fromarray(b).save(pb)
    return pa, pb


@pytest.mark.parametrize("mode", ["exact", "robust"])
@pytest.mark.parametrize("rows", [(0, 3), (330, 334), (690, 702), (699, 700)])
def test_band_path_on_paeth_files_equals_the_full_decode(tmp_path, mode, rows):
    a = _photo(700, 120)
    b = a.copy()
    b[rows[0] : rows[1], 40:52] //= 2
    pa, pb = _pillow_pair(tmp_path, a, b)
    assert png.PAETH in _filters(pa.read_bytes())
    got = pair_rows.read_pair_rows(
        pa,
        pb,
        band=lambda h, r0, r1: band_rows(h, r0, r1, mode=mode),
        window=lambda w, c0, c1: band_rows(w, c0, c1, mode=mode),
    )
    y0, x0 = got.y0, got.x0
    np.testing.assert_array_equal(got.a, a[y0 : y0 + len(got.a), x0 : x0 + got.a.shape[1]])
    np.testing.assert_array_equal(got.b, b[y0 : y0 + len(got.b), x0 : x0 + got.b.shape[1]])
    assert y0 <= rows[0] and min(rows[1], 700) <= y0 + len(got.a) < 700 + y0  # a band, not the image
    res = diff_band(got.a, got.b, y0=y0, height=got.height, x0=x0, width=got.width, mode=mode)
    assert res == diff(a, b, mode=mode)


def _with_filtered_byte_changed(data: bytes, row: int, col: int) -> bytes:
    """``data`` (one IDAT chunk) with one filtered byte of ``row`` changed: the pixels of that row
    change and, through rows that read the row above, those of the rows below, while every later
    filtered byte stays equal."""
    layout = png.layout(data)
    buf, _ = png.inflate(layout)
    raw = bytearray(bytes(buf))
    raw[row * layout.row_bytes + 1 + col] ^= 0x40
    ihdr = data[8:33]
    body = zlib.compress(bytes(raw))
    idat = struct.pack(">I", len(body)) + b"IDAT" + body + struct.pack(">I", zlib.crc32(b"IDAT" + body))
    return data[:8] + ihdr + idat + data[-12:]


@pytest.mark.parametrize("filters", [[2], [4], [3], [4, 1, 4, 4, 4]])
def test_pixels_below_the_changed_rows_are_checked(tmp_path, filters):
    """B differs from A in one filtered byte only, yet its pixels differ in the rows below (Up, Avg,
    Paeth carry the change down): the band grows to hold them."""
    a = np.random.default_rng(14).integers(0, 256, (60, 20, 3), dtype=np.uint8)
    da = _encode(a, filters)
    db = _with_filtered_byte_changed(da, 20, 7)
    b = imagecodecs.png_decode(db)
    (tmp_path / "a.png").write_bytes(da)
    (tmp_path / "b.png").write_bytes(db)
    asked = []

    def band(h, r0, r1):
        asked.append((r0, r1))
        return max(r0 - 2, 0), min(r1 + 3, h)

    got = pair_rows.read_pair_rows(tmp_path / "a.png", tmp_path / "b.png", band=band)
    last = int(np.flatnonzero((a != b).any(axis=(1, 2)))[-1])
    assert asked[0] == (20, 20) and asked[-1][1] >= last
    np.testing.assert_array_equal(got.a, a[got.y0 : got.y0 + len(got.a)])
    np.testing.assert_array_equal(got.b, b[got.y0 : got.y0 + len(got.b)])


def test_corrupt_paeth_file_exit_2_one_line(tmp_path, capsys):
    a = _photo(80, 60)
    pa, pb = _pillow_pair(tmp_path, a, a[::-1].copy())
    data = bytearray(pb.read_bytes())
    layout = png.layout(bytes(data))
    data[layout.idat_at[0] + len(layout.idat[0]) // 2] ^= 0xFF  # inside the IDAT payload: a CRC error
    pb.write_bytes(bytes(data))
    for argv in ([pa, pb], [pb, pa], [pa, pb, "--out", tmp_path / "o.png"]):
        code = main([str(x) for x in argv])
        out, err = capsys.readouterr()
        assert code == 2 and out == "" and err.count("\n") == 1 and "corrupt" in err and str(pb) in err

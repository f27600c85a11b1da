"""imgdiff.io: decoding every supported format/depth/mode, validation errors, atomic writes."""

from __future__ import annotations

import os
import struct
import zlib

import cv2
import numpy as np
import pytest
from PIL import Image

from imgdiff import io as iio


@pytest.fixture
def rgb():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (24, 40, 3), dtype=np.uint8)  # (H, W, 3)


def _only_tmp_files(folder) -> list[str]:
    return sorted(p for p in os.listdir(folder) if p.endswith(".tmp"))


# ------------------------------------------------------------------------------------- decoding


@pytest.mark.parametrize("ext", ["png", "webp", "tif", "bmp"])
def test_lossless_formats_round_trip_rgb(tmp_path, rgb, ext):
    path = tmp_path / f"x.{ext}"
    Image.fromarray(rgb).save(path, **({"lossless": True} if ext == "webp" else {}))
    out = iio.read_image(path)
    assert out.dtype == np.uint8 and out.shape == rgb.shape
    np.testing.assert_array_equal(out, rgb)  # RGB order, not BGR


def test_jpeg_decodes_to_pillow_pixels(tmp_path, rgb):
    path = tmp_path / "x.jpg"
    Image.fromarray(rgb).save(path, quality=90)
    np.testing.assert_array_equal(iio.read_image(path), np.asarray(Image.open(path)))


def test_png_rgba_and_gray(tmp_path, rgb):
    rgba = np.dstack([rgb, rgb[:, :, 0]])  # (H, W, 4)
    Image.fromarray(rgba).save(tmp_path / "a.png")
    np.testing.assert_array_equal(iio.read_image(tmp_path / "a.png"), rgba)
    Image.fromarray(rgb[:, :, 1]).save(tmp_path / "g.png")
    out = iio.read_image(tmp_path / "g.png")
    assert out.shape == rgb.shape[:2]
    np.testing.assert_array_equal(out, rgb[:, :, 1])


def test_png_16bit_gray_and_rgb_keep_16_bits(tmp_path, rgb):
    rgb16 = rgb.astype(np.uint16) * 257 + 3  # (H, W, 3) values not representable in 8 bits
    cv2.imwrite(str(tmp_path / "c.png"), rgb16[:, :, ::-1])
    out = iio.read_image(tmp_path / "c.png")
    assert out.dtype == np.uint16
    np.testing.assert_array_equal(out, rgb16)
    Image.fromarray(rgb16[:, :, 0]).save(tmp_path / "g.png")
    out = iio.read_image(tmp_path / "g.png")
    assert out.dtype == np.uint16 and out.shape == rgb.shape[:2]
    np.testing.assert_array_equal(out, rgb16[:, :, 0])


def test_tiff_16bit_rgb_keeps_16_bits(tmp_path, rgb):
    rgb16 = rgb.astype(np.uint16) * 257 + 1
    cv2.imwrite(str(tmp_path / "c.tif"), rgb16[:, :, ::-1])
    out = iio.read_image(tmp_path / "c.tif")
    assert out.dtype == np.uint16
    np.testing.assert_array_equal(out, rgb16)


def test_palette_with_transparency_becomes_rgba(tmp_path, rgb):
    pal = Image.fromarray(rgb).quantize(8)
    pal.save(tmp_path / "p.png", transparency=0)
    out = iio.read_image(tmp_path / "p.png")
    want = np.asarray(Image.open(tmp_path / "p.png").convert("RGBA"))
    assert out.shape == (*rgb.shape[:2], 4)
    np.testing.assert_array_equal(out, want)
    assert (out[:, :, 3] == 0).any() and (out[:, :, 3] == 255).any()
    pal.save(tmp_path / "q.png")  # no transparency: plain RGB
    np.testing.assert_array_equal(iio.read_image(tmp_path / "q.png"), np.asarray(pal.convert("RGB")))


def test_palette_gif_like_bmp_and_1bit_and_gray_alpha(tmp_path, rgb):
    bw = Image.fromarray(rgb[:, :, 0]).convert("1")
    bw.save(tmp_path / "bw.png")
    np.testing.assert_array_equal(iio.read_image(tmp_path / "bw.png"), np.asarray(bw.convert("L")))
    la = Image.fromarray(np.dstack([rgb[:, :, 0], rgb[:, :, 1]]), mode="LA")
    la.save(tmp_path / "la.png")
    out = iio.read_image(tmp_path / "la.png")
    np.testing.assert_array_equal(out, np.asarray(la.convert("RGBA")))
    la.save(tmp_path / "la.webp", lossless=True)
    assert iio.read_image(tmp_path / "la.webp").shape == (*rgb.shape[:2], 4)


def test_read_pair_decodes_both(tmp_path, rgb):
    Image.fromarray(rgb).save(tmp_path / "a.png")
    Image.fromarray(255 - rgb).save(tmp_path / "b.png")
    a, b = iio.read_pair(tmp_path / "a.png", tmp_path / "b.png")
    np.testing.assert_array_equal(a, rgb)
    np.testing.assert_array_equal(b, 255 - rgb)


def test_probe_reads_header_only(tmp_path, rgb):
    Image.fromarray(rgb).save(tmp_path / "a.jpg")
    info = iio.probe(tmp_path / "a.jpg")
    assert (info.format, info.width, info.height) == ("JPEG", 40, 24)


# ------------------------------------------------------------------------------------- bad input


def _png_with_size(width: int, height: int) -> bytes:
    """A tiny valid-looking PNG whose IHDR declares ``width x height`` (a decompression bomb header)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return iio._PNG_MAGIC + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b"")


def _expect_error(path, *words, **kw):
    with pytest.raises(iio.ImageIOError) as info:
        iio.read_image(path, **kw)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    for w in words:
        assert w in msg, msg
    return msg


def test_missing_directory_and_empty(tmp_path):
    _expect_error(tmp_path / "nope.png", "no such file")
    _expect_error(tmp_path, "directory")
    (tmp_path / "e.png").write_bytes(b"")
    _expect_error(tmp_path / "e.png", "empty")


def test_unsupported_format(tmp_path):
    (tmp_path / "x.png").write_bytes(b"GIF89a" + b"\0" * 40)
    _expect_error(tmp_path / "x.png", "unsupported", "PNG, JPEG")
    (tmp_path / "t.txt").write_text("hello, not an image")
    _expect_error(tmp_path / "t.txt", "unsupported")


@pytest.mark.parametrize("ext", ["png", "jpg", "webp", "tif", "bmp"])
def test_truncated_files(tmp_path, rgb, ext):
    path = tmp_path / f"x.{ext}"
    big = np.tile(rgb, (8, 8, 1))  # (192, 320, 3), so half a file cuts pixel data
    Image.fromarray(big).save(path)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    msg = _expect_error(path)
    assert "truncated" in msg or "corrupt" in msg


def test_corrupt_png_data_and_header(tmp_path, rgb):
    path = tmp_path / "c.png"
    Image.fromarray(rgb).save(path)
    data = bytearray(path.read_bytes())
    data[60:80] = b"\xff" * 20  # inside IDAT: zlib stream / CRC broken
    path.write_bytes(bytes(data))
    _expect_error(path, "corrupt")
    path.write_bytes(iio._PNG_MAGIC + b"\0\0\0\x0dJUNK" + b"\0" * 30)
    _expect_error(path, "IHDR")


def test_decompression_bomb_guard_uses_header(tmp_path):
    path = tmp_path / "bomb.png"
    path.write_bytes(_png_with_size(100_000, 100_000))
    _expect_error(path, "100000x100000", "--max-pixels")
    _expect_error(path, "over the limit of 1,000", max_pixels=1000)
    small = tmp_path / "s.jpg"
    Image.fromarray(np.zeros((50, 50, 3), np.uint8)).save(small)
    _expect_error(small, "2,500 pixels", max_pixels=2000)
    assert iio.read_image(small, max_pixels=2500).shape == (50, 50, 3)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files regardless of permissions")
def test_unreadable_file(tmp_path, rgb):
    path = tmp_path / "x.png"
    Image.fromarray(rgb).save(path)
    path.chmod(0)
    _expect_error(path, "permission denied")


def test_read_pair_reports_b_before_decoding(tmp_path, rgb):
    Image.fromarray(rgb).save(tmp_path / "a.png")
    with pytest.raises(iio.ImageIOError, match="b.png"):
        iio.read_pair(tmp_path / "a.png", tmp_path / "b.png")


# ------------------------------------------------------------------------------------- writing


def test_write_png_json_atomic_and_readable(tmp_path, rgb):
    iio.write_png(tmp_path / "o.png", rgb)
    np.testing.assert_array_equal(iio.read_image(tmp_path / "o.png"), rgb)
    mask = rgb[:, :, 0] > 128
    iio.write_mask_png(tmp_path / "m.png", mask)
    np.testing.assert_array_equal(iio.read_image(tmp_path / "m.png"), np.where(mask, 255, 0))
    iio.write_json(tmp_path / "r.json", {"bbox": None})
    assert (tmp_path / "r.json").read_text() == '{"bbox": null}\n'
    assert _only_tmp_files(tmp_path) == []


def test_atomic_write_failure_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "o.json"
    target.write_text("old")

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(iio.os, "replace", boom)
    with pytest.raises(iio.ImageIOError, match="No space left"):
        iio.write_json(target, {"x": 1})
    assert target.read_text() == "old"
    assert _only_tmp_files(tmp_path) == []


def test_write_to_missing_folder_or_directory(tmp_path, rgb):
    with pytest.raises(iio.ImageIOError, match="does not exist"):
        iio.write_png(tmp_path / "no" / "o.png", rgb)
    with pytest.raises(iio.ImageIOError, match="is a directory"):
        iio.write_png(tmp_path, rgb)
    (tmp_path / "f").write_bytes(b"a file")
    with pytest.raises(iio.ImageIOError, match="is a file, not a folder"):
        iio.write_png(tmp_path / "f" / "o.png", rgb)
    assert (tmp_path / "f").read_bytes() == b"a file" and _only_tmp_files(tmp_path) == []


def test_render_overlay_draws_boxes_on_a_copy(rgb):
    img = np.zeros((30, 40), np.uint16)  # 16-bit gray
    out = iio.render_overlay(img, [(5, 6, 20, 25)])
    assert out.shape == (30, 40, 3) and out.dtype == np.uint8
    assert tuple(out[6, 10]) == iio.OVERLAY_COLOR and tuple(out[25, 5]) == iio.OVERLAY_COLOR
    assert tuple(out[15, 12]) == (0, 0, 0) and (img == 0).all()
    before = rgb.copy()
    iio.render_overlay(rgb, [(0, 0, 3, 3)])
    np.testing.assert_array_equal(rgb, before)


@pytest.mark.parametrize("shape", [(24, 40), (24, 40, 3), (24, 40, 4)])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
def test_png_decoders_agree(tmp_path, shape, dtype):
    """imagecodecs (fast path) and the OpenCV fallback decode the same pixels, in RGB order."""
    rng = np.random.default_rng(5)
    img = rng.integers(0, np.iinfo(dtype).max + 1, shape, dtype=dtype)
    bgr = img if img.ndim == 2 else np.ascontiguousarray(img[:, :, [2, 1, 0, 3][: img.shape[2]]])
    cv2.imwrite(str(tmp_path / "x.png"), bgr)
    data = (tmp_path / "x.png").read_bytes()
    fast = iio._decode_imagecodecs("x.png", data)
    slow = iio._decode_cv2("x.png", data)
    assert fast.dtype == slow.dtype == dtype
    np.testing.assert_array_equal(fast, img)
    np.testing.assert_array_equal(slow, img)


# ------------------------------------------------------------------------------ identical files


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _png(width: int, height: int, raw: bytes, colour: int = 2) -> bytes:
    """A PNG with a valid chunk layout and CRCs around ``raw`` filtered rows (zlib-compressed)."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0)
    return iio._PNG_MAGIC + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(raw)) + _chunk(b"IEND", b"")


def _copies(tmp_path, data: bytes, ext: str = "png"):
    a, b = tmp_path / f"a.{ext}", tmp_path / f"b.{ext}"
    a.write_bytes(data)
    b.write_bytes(data)
    return a, b


@pytest.mark.parametrize("ext", ["png", "jpg", "webp"])
def test_identical_pair_of_valid_files(tmp_path, rgb, ext):
    a = tmp_path / f"a.{ext}"
    Image.fromarray(rgb).save(a)
    a, b = _copies(tmp_path, a.read_bytes(), ext)
    info = iio.identical_pair(a, b)
    assert (info.width, info.height) == (40, 24)
    data = b.read_bytes()
    b.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # same size, other bytes
    assert iio.identical_pair(a, b) is None


def test_identical_pair_validates_the_shared_data(tmp_path, rgb):
    ok = _png(2, 2, b"\x00" + b"\x01" * 6 + b"\x01" + b"\x02" * 6)
    a, b = _copies(tmp_path, ok)
    assert iio.identical_pair(a, b) is not None
    np.testing.assert_array_equal(iio.read_image(a)[1], [[2, 2, 2], [4, 4, 4]])  # Sub filter: 2, 2 + 2
    bad_cases = {
        "filter": _png(2, 2, b"\x07" + b"\x01" * 6 + b"\x00" + b"\x02" * 6),  # filter type 7
        "short": _png(2, 2, b"\x00" + b"\x01" * 6),  # one row of two
        "zlib": ok.replace(zlib.compress(b"\x00" + b"\x01" * 6 + b"\x01" + b"\x02" * 6), b"\x78\x9c\xff\xff"),
        "crc": ok[:-20] + bytes([ok[-20] ^ 1]) + ok[-19:],  # a byte of the IDAT CRC
        "iend": ok[:-12],
    }
    for name, data in bad_cases.items():
        a, b = _copies(tmp_path, data)
        with pytest.raises(iio.ImageIOError) as info:
            iio.identical_pair(a, b)
        assert "\n" not in str(info.value) and str(a) in str(info.value), name
        with pytest.raises(iio.ImageIOError):  # the full decoder agrees that the file is bad
            iio.read_image(a)


def test_read_errors_live_below_the_readers_and_writers():
    """io, pair_rows and write share ImageIOError from io_errors, which imports nothing; io never
    imports pair_rows (pair_rows reads through io) and write never imports io."""
    from imgdiff import io_errors, write
    from tests.test_layout import import_graph

    graph = import_graph()
    assert graph["imgdiff.io_errors"] == set()
    assert "imgdiff.pair_rows" not in graph["imgdiff.io"]
    assert "imgdiff.io" not in graph["imgdiff.write"]
    assert iio.ImageIOError is io_errors.ImageIOError and issubclass(write.OutputClash, iio.ImageIOError)
    err = io_errors.read_error("a.png", "the file is empty (0 bytes)", "re-export it")
    assert isinstance(err, iio.ImageIOError)
    assert str(err) == "cannot read 'a.png': the file is empty (0 bytes); re-export it"

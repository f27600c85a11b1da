"""The native unfilter (``imgdiff/native/unfilter.c``, mapped from prebuilt machine code): its code is
built from the current source, it gives the exact pixels of every filter type and pixel size (the
same as libspng, which stays the fallback), and the paths without it still work."""

import os
import shutil
import sys

import numpy as np
import pytest
from PIL import Image

from imgdiff import png, png_spng
from imgdiff.native import build_unfilter
from tests.imgdiff.test_png import FILTER_MIXES, _encode

NATIVE_HOST = sys.platform == "linux" and os.uname().machine == "x86_64"


def _inflated(img: np.ndarray, filters: list[int]):
    data = _encode(img, filters)
    layout = png.layout(data)
    buf, kinds = png.inflate(layout)
    return layout, buf, kinds


def test_code_is_built_from_the_current_source():
    """The hex file's header holds the SHA-256 of ``unfilter.c``: edit the C, rerun the build."""
    with open(png_spng.NATIVE_CODE) as f:
        header = f.readline()
    assert header.strip() == f"# sha256 of unfilter.c: {build_unfilter.source_digest()}"
    code = png_spng.read_native_code()
    assert 256 < len(code) < 16384


def test_code_rebuilds_byte_for_byte_with_the_recorded_compiler():
    """With the gcc named in the header, the build script's checks pass and its code is the file's."""
    with open(png_spng.NATIVE_CODE) as f:
        recorded = f.read().splitlines()[1].removeprefix("# compiler: ")
    if not all(shutil.which(tool) for tool in ("gcc", "objdump", "objcopy", "nm")):
        pytest.skip("gcc and binutils are not installed")
    if build_unfilter.compiler() != recorded:
        pytest.skip(f"another gcc than the recorded {recorded!r}")
    assert build_unfilter.build() == png_spng.read_native_code()


@pytest.mark.skipif(not NATIVE_HOST, reason="the prebuilt code is x86-64 Linux only")
def test_native_kernel_loads_on_linux_x86_64():
    assert png_spng.native_unfilter() is not None


@pytest.mark.parametrize("shape", [(11, 17), (11, 17, 3), (11, 17, 4), (1, 1, 3), (5, 1), (2, 40, 4)])
@pytest.mark.parametrize("dtype", [np.uint8, np.uint16])
@pytest.mark.parametrize("filters", FILTER_MIXES)
def test_native_equals_the_image_and_libspng(monkeypatch, shape, dtype, filters):
    """Every filter type and pixel size (bpp 1, 2, 3, 4, 6, 8), whole images and bands from a row
    above: the native kernel, libspng through ctypes and libspng's public API all give the image."""
    img = np.random.default_rng(11).integers(0, np.iinfo(dtype).max + 1, shape, dtype=dtype)
    layout, buf, _ = _inflated(img, filters)
    h = shape[0]
    got = {}
    for name, native, lib in (("native", None, None), ("spng", [None], None), ("public", [None], [None])):
        if native is not None:
            monkeypatch.setattr(png_spng, "_NATIVE", native)
        if lib is not None:
            monkeypatch.setattr(png_spng, "_LIB", lib)
        got[name] = png_spng.unfilter_rows(layout, buf, 0, h)
        if h > 2:
            band = png_spng.unfilter_rows(layout, buf, 2, h, img[1])  # rows 2.. from row 1's pixels
            np.testing.assert_array_equal(band, img[2:])
    for name, out in got.items():
        assert out.dtype == img.dtype, name
        np.testing.assert_array_equal(out, img, err_msg=name)


@pytest.mark.skipif(not NATIVE_HOST, reason="the prebuilt code is x86-64 Linux only")
def test_native_paeth_on_a_photo_written_by_pillow(tmp_path):
    """A real photo as Pillow writes it (adaptive filters: mostly Paeth rows, ties included), RGB and
    RGBA: the native kernel gives Pillow's pixels."""
    from tests.imgdiff.test_png_filters import _photo

    for channels in (3, 4):
        img = _photo(64, 96, channels)
        path = tmp_path / f"photo{channels}.png"
        Image.fromarray(img).save(path)
        data = path.read_bytes()
        layout = png.layout(data)
        buf, kinds = png.inflate(layout)
        assert 4 in kinds
        np.testing.assert_array_equal(png_spng.unfilter_rows(layout, buf, 0, layout.height), img)


@pytest.mark.skipif(not NATIVE_HOST, reason="the prebuilt code is x86-64 Linux only")
def test_native_kernel_rejects_a_bad_filter_type():
    """A filter type above 4 makes the kernel return -1 (its callers validated the types already)."""
    img = np.arange(4 * 6 * 3, dtype=np.uint8).reshape(4, 6, 3)
    layout, buf, _ = _inflated(img, [4])
    src = np.frombuffer(bytes(buf), np.uint8, count=layout.height * layout.row_bytes).copy()
    src[2 * layout.row_bytes] = 5  # row 2's filter type
    out = np.empty(layout.height * (layout.row_bytes - 1), np.uint8)
    above = np.zeros(layout.row_bytes - 1, np.uint8)
    kernel = png_spng.native_unfilter()
    assert kernel(src.ctypes.data, out.ctypes.data, 4, layout.row_bytes - 1, 3, above.ctypes.data) == -1
    src[2 * layout.row_bytes] = 4
    assert kernel(src.ctypes.data, out.ctypes.data, 4, layout.row_bytes - 1, 3, above.ctypes.data) == 0
    np.testing.assert_array_equal(out.reshape(img.shape), img)


def test_without_the_native_kernel_the_decode_is_unchanged(monkeypatch):
    """Off x86-64 Linux (or where executable mappings are refused) libspng unfilters every row."""
    img = np.random.default_rng(5).integers(0, 256, (9, 13, 3), dtype=np.uint8)
    data = _encode(img, [4, 3, 2, 1, 0])
    monkeypatch.setattr(png_spng, "_NATIVE", [None])
    np.testing.assert_array_equal(png.decode(data), img)


def test_the_native_kernel_can_be_turned_off(monkeypatch):
    """IMGDIFF_NATIVE=0: no executable mapping is made (libspng unfilters instead)."""
    monkeypatch.setenv(png_spng.NATIVE_ENV, "0")
    assert png_spng._load_native() is None

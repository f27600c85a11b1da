import io

import cv2
import numpy as np
import pytest
from PIL import Image

from mm.world.png import encode_png


def _images():
    rng = np.random.default_rng(0)
    yield rng.integers(0, 256, (7, 5, 3), dtype=np.uint8)  # random bytes: every filter wrap-around
    yield np.full((64, 64, 3), (112, 100, 86), np.uint8)  # flat
    yield np.zeros((1, 1, 3), np.uint8)
    img = np.full((33, 48, 3), 250, np.uint8)
    img[5:20, 3:40] = (3, 200, 17)
    yield img


@pytest.mark.parametrize("noisy", [False, True])
def test_decoders_read_back_the_exact_pixels(noisy):
    for img in _images():
        data = encode_png(img, noisy=noisy)
        via_cv2 = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)[:, :, ::-1]
        assert np.array_equal(via_cv2, img)
        with Image.open(io.BytesIO(data)) as im:
            im.load()  # Pillow checks the CRCs and the zlib stream
            assert im.mode == "RGB" and np.array_equal(np.asarray(im), img)


def test_non_contiguous_input_and_flat_images_are_small():
    img = np.ascontiguousarray(np.full((64, 64, 3), 90, np.uint8)[:, :, ::-1])
    assert len(encode_png(img)) < 300  # raw pixels: 12,288 bytes
    view = np.arange(64 * 64 * 3, dtype=np.uint8).reshape(64, 64, 3)[::2, ::-1]
    data = encode_png(view)
    assert np.array_equal(cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)[:, :, ::-1], view)


@pytest.mark.parametrize(
    "bad", [np.zeros((4, 4), np.uint8), np.zeros((4, 4, 4), np.uint8), np.zeros((4, 4, 3), np.float32)]
)
def test_bad_arrays_are_refused(bad):
    with pytest.raises(ValueError, match=r"\(H, W, 3\) uint8"):
        encode_png(bad)

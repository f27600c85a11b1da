"""mm.data.image_cache: decoded once, mapped after; keyed by the file's bytes and the settings; atomic."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from mm.data.image_cache import ImageCache
from mm.data.images import open_rgb
from mm.errors import UserError


@pytest.fixture
def photo(tmp_path):
    path = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (20, 30, 3), dtype=np.uint8)).save(path)
    return path


def _decode(path):
    return lambda: np.asarray(open_rgb(path))


def test_decoded_once_then_mapped_read_only(photo, tmp_path):
    cache = ImageCache(tmp_path / "cache")
    first = cache.get(photo, "max_side=0", _decode(photo))
    assert isinstance(first, np.memmap) and not first.flags.writeable
    np.testing.assert_array_equal(first, np.asarray(open_rgb(photo)))
    again = ImageCache(tmp_path / "cache")  # another run sharing the folder
    second = again.get(photo, "max_side=0", lambda: pytest.fail("decoded twice"))
    np.testing.assert_array_equal(second, first)
    assert (cache.decoded, again.decoded) == (1, 0)
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [f"{cache.key(photo, 'max_side=0')}.npy"]


def test_other_bytes_or_settings_are_other_entries(photo, tmp_path):
    cache = ImageCache(tmp_path / "cache")
    cache.get(photo, "max_side=0", _decode(photo))
    cache.get(photo, "max_side=10", lambda: np.asarray(open_rgb(photo))[:10])
    assert cache.get(photo, "max_side=10", lambda: pytest.fail("decoded twice")).shape == (10, 30, 3)
    Image.fromarray(np.zeros((5, 5, 3), np.uint8)).save(photo)  # the photo edited in place
    assert cache.get(photo, "max_side=0", _decode(photo)).shape == (5, 5, 3)
    assert cache.decoded == 3 and len(list((tmp_path / "cache").glob("*.npy"))) == 3


def test_an_unreadable_entry_is_decoded_again(photo, tmp_path):
    cache = ImageCache(tmp_path / "cache")
    cache.get(photo, "s", _decode(photo))
    entry = tmp_path / "cache" / f"{cache.key(photo, 's')}.npy"
    entry.write_bytes(entry.read_bytes()[:40])  # a truncated write from elsewhere
    np.testing.assert_array_equal(cache.get(photo, "s", _decode(photo)), np.asarray(open_rgb(photo)))
    assert cache.decoded == 2


def test_a_failed_decode_leaves_nothing(photo, tmp_path):
    cache = ImageCache(tmp_path / "cache")

    def fail():
        raise UserError("bad photo")

    with pytest.raises(UserError, match="bad photo"):
        cache.get(photo, "s", fail)
    assert list((tmp_path / "cache").iterdir()) == []


def test_a_folder_that_cannot_be_made_is_a_user_error(photo, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="cannot create the image cache .*file/cache"):
        ImageCache(tmp_path / "file" / "cache")

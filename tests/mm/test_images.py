"""mm.data.images: every PIL read of a user's file gives training's pixels (OpenCV's), and fails clearly.

Files as ordinary tools write them: phone JPEGs with each EXIF orientation, 16-bit and palette PNGs,
alpha, CMYK. Then the readers of evals, labelers, pair builders, prompts and agent task files, each on a
sideways-stored photo, and every way a file can fail to decode.
"""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from mm.data.dataset import decode_image
from mm.data.images import check_image, open_rgb
from mm.errors import UserError

RNG = np.random.default_rng(0)
PIXELS = (RNG.random((24, 36, 3)) * 255).astype(np.uint8)  # (H, W, 3): not square, so a turn shows


def _oriented(path, orientation: int) -> None:
    im = Image.fromarray(PIXELS)
    exif = im.getexif()
    exif[0x0112] = orientation
    im.save(path, exif=exif, **({"quality": 95} if path.suffix == ".jpg" else {}))


def _odd_files(d):
    """name -> path of each kind of file (module docstring)."""
    base = Image.fromarray(PIXELS)
    files = {}
    for o in range(1, 9):
        for ext in ("jpg", "png"):
            files[f"orientation {o} {ext}"] = d / f"o{o}.{ext}"
            _oriented(files[f"orientation {o} {ext}"], o)
    grey16 = (RNG.random((24, 36)) * 65535).astype(np.uint16)
    Image.fromarray(grey16).save(d / "grey16.png")
    rgba = np.dstack([PIXELS, RNG.integers(0, 256, (24, 36), dtype=np.uint8)])
    Image.fromarray(rgba, "RGBA").save(d / "rgba.png")
    base.convert("P").save(d / "palette.png", transparency=0)
    base.convert("LA").save(d / "grey_alpha.png")
    base.convert("L").save(d / "grey.jpg")
    for name in ("grey16", "rgba", "palette", "grey_alpha"):
        files[name] = d / f"{name}.png"
    files["grey jpg"] = d / "grey.jpg"
    for ext in ("webp", "bmp", "tif", "gif"):
        files[ext] = d / f"x.{ext}"
        base.save(files[ext])
    return files


@pytest.fixture(scope="module")
def odd_files(tmp_path_factory):
    return _odd_files(tmp_path_factory.mktemp("odd"))


def test_every_kind_of_file_gives_the_pixels_training_decodes(odd_files):
    for name, path in odd_files.items():
        got = np.asarray(open_rgb(path))
        assert got.dtype == np.uint8 and got.shape[2] == 3, name
        np.testing.assert_array_equal(got, decode_image(path), err_msg=name)


def test_cmyk_jpeg_within_one_level_of_training(tmp_path):
    path = tmp_path / "cmyk.jpg"
    Image.fromarray(PIXELS).convert("CMYK").save(path)
    diff = np.abs(np.asarray(open_rgb(path)).astype(int) - decode_image(path))
    assert diff.max() <= 1  # the two libraries round the CMYK -> RGB conversion differently


def test_orientation_turns_the_photo_upright(odd_files):
    # EXIF orientation 6: stored turned 90 degrees counter-clockwise, shown turned back clockwise
    np.testing.assert_array_equal(np.asarray(open_rgb(odd_files["orientation 6 png"])), np.rot90(PIXELS, -1))
    np.testing.assert_array_equal(np.asarray(open_rgb(odd_files["orientation 3 png"])), np.rot90(PIXELS, 2))
    # what Pillow gives by itself, which the readers used to pass on: the stored, sideways pixels
    with Image.open(odd_files["orientation 6 png"]) as im:
        assert np.asarray(im.convert("RGB")).shape == PIXELS.shape


def test_sixteen_bit_grey_keeps_its_top_byte(odd_files):
    with Image.open(odd_files["grey16"]) as im:
        raw = np.asarray(im, dtype=np.int64)
        clipped = np.asarray(im.convert("RGB"))[..., 0]  # Pillow's own conversion clips: nearly all white
        np.testing.assert_array_equal(clipped, np.clip(raw, 0, 255))
    got = np.asarray(open_rgb(odd_files["grey16"]))
    np.testing.assert_array_equal(got[..., 0], raw >> 8)
    assert (got == got[..., :1]).all()


def test_bytes_and_open_files_read_as_paths(odd_files):
    path = odd_files["orientation 8 jpg"]
    want = np.asarray(open_rgb(path))
    np.testing.assert_array_equal(np.asarray(open_rgb(path.read_bytes())), want)
    with path.open("rb") as f:
        np.testing.assert_array_equal(np.asarray(open_rgb(f)), want)


def test_corrupt_exif_leaves_the_photo_as_stored(tmp_path):
    path = tmp_path / "bad_exif.jpg"
    Image.fromarray(PIXELS).save(path, exif=b"Exif\x00\x00MM\x00*\x00\x00\x00\x08\xff\xff", quality=95)
    np.testing.assert_array_equal(np.asarray(open_rgb(path)), decode_image(path))


def _truncated(tmp_path):
    path = tmp_path / "o1.jpg"
    _oriented(path, 1)
    data = path.read_bytes()
    (tmp_path / "half.jpg").write_bytes(data[: len(data) // 2])
    return tmp_path / "half.jpg"


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda d: (d / "text.png").write_text("not an image") and d / "text.png", "cannot read image"),
        (lambda d: d / "missing.png", r"image .*missing\.png not found; check the path"),
        (_truncated, r"cannot read image .*half\.jpg \(image file is truncated"),
        (lambda d: (d / "empty.jpg").write_bytes(b"") or d / "empty.jpg", "cannot read image"),
    ],
    ids=["not an image", "missing", "truncated", "empty"],
)
def test_unreadable_files_are_one_user_error_naming_where(tmp_path, make, match):
    path = make(tmp_path)
    with pytest.raises(UserError, match=r"^notes\.jsonl:7: " + match):
        open_rgb(path, "notes.jsonl:7")


def test_a_truncated_file_passes_the_header_check_but_not_the_decode(tmp_path):
    path = _truncated(tmp_path)
    check_image(path, "x")  # the header is whole
    with pytest.raises(UserError, match="truncated"):
        open_rgb(path, "x")


def test_decompression_bombs_say_how_to_go_on(odd_files, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 24 x 36 = 864 > 2 x 100: Pillow's error
    for read in (open_rgb, check_image):
        with pytest.raises(
            UserError, match=r"^a\.jsonl:2: image .* too large .* PIL\.Image\.MAX_IMAGE_PIXELS"
        ):
            read(odd_files["orientation 1 png"], "a.jsonl:2")


def test_corrupt_bytes_fail_the_verified_check():
    good = np.asarray(Image.fromarray(PIXELS))
    import io

    buf = io.BytesIO()
    Image.fromarray(good).save(buf, format="PNG")
    data = bytearray(buf.getvalue())
    data[60] ^= 0xFF  # inside the image data: the chunk's CRC no longer matches
    check_image(bytes(data))  # the header alone is fine
    with pytest.raises(UserError, match="cannot read image <bytes>"):
        check_image(bytes(data), verify=True)


# --- every reader of users' files sees the upright photo --------------------------------------------


@pytest.fixture
def sideways(tmp_path):
    path = tmp_path / "phone.jpg"
    _oriented(path, 6)
    return path


def test_readers_of_users_files_see_the_photo_upright(sideways, tmp_path):
    from mm.model.processing import NoteProcessor
    from rl.agent.task_file import read_image
    from rl.labeler import image_digest
    from rl.pairs.corruption import load_pixels

    upright = np.asarray(open_rgb(sideways))
    assert upright.shape == (36, 24, 3)
    np.testing.assert_array_equal(read_image(sideways, 0), upright)
    np.testing.assert_array_equal((load_pixels(sideways).permute(1, 2, 0).numpy() * 255).round(), upright)
    assert image_digest(sideways) == image_digest(Image.fromarray(upright))
    from mm.data.tokenizer import load_tokenizer

    proc = NoteProcessor(tokenizer=load_tokenizer(), image_size=16, tokens_per_image=2, max_length=16)
    np.testing.assert_array_equal(
        proc.load_image(sideways).numpy(), proc.load_image(Image.fromarray(upright)).numpy()
    )


def test_pair_and_prompt_files_see_the_photo_upright(sideways):
    from rl.pairs.importers import FilePair, open_images
    from rl.trainers.grpo_files_data import PromptImages, PromptRecord

    upright = np.asarray(open_rgb(sideways))
    pair = FilePair(
        id="p", images=(sideways, sideways.read_bytes()), question="q", chosen="a", rejected="b", where="f:1"
    )
    for im in open_images(pair):
        np.testing.assert_array_equal(np.asarray(im), upright)
    record = PromptRecord(id="r", images=(sideways,), question="q", record={}, where="prompts.jsonl:1")
    np.testing.assert_array_equal(np.asarray(PromptImages([record]).sample(0).images[0]), upright)


def test_a_bad_image_in_a_pair_file_names_its_line(tmp_path):
    from rl.pairs.importers import FilePair, open_images

    (tmp_path / "bad.png").write_text("no")
    pair = FilePair(
        id="p", images=(tmp_path / "bad.png",), question="q", chosen="a", rejected="b", where="pairs.jsonl:4"
    )
    with pytest.raises(UserError, match=r"^pairs\.jsonl:4: cannot read image .*bad\.png"):
        open_images(pair)


def test_max_side_shrinks_upright_and_jpegs_decode_at_a_reduced_scale(tmp_path):
    big = np.kron(PIXELS, np.ones((20, 20, 1), np.uint8))  # (480, 720, 3): smooth blocks
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(big).save(tmp_path / "big.jpg", quality=95, exif=exif)
    Image.fromarray(big).save(tmp_path / "big.png", exif=exif)

    def full_then_lanczos(path, side):
        im = open_rgb(path)
        scale = side / max(im.size)
        return np.asarray(im.resize((round(im.size[0] * scale), round(im.size[1] * scale)), Image.LANCZOS))

    png = np.asarray(open_rgb(tmp_path / "big.png", max_side=100))
    assert png.shape == (100, 67, 3)  # upright: 480 wide x 720 high, longest side 100
    np.testing.assert_array_equal(png, full_then_lanczos(tmp_path / "big.png", 100))
    jpg = np.asarray(open_rgb(tmp_path / "big.jpg", max_side=100))  # decoded at 1/4 scale first
    assert jpg.shape == (100, 67, 3)
    diff = np.abs(jpg.astype(int) - full_then_lanczos(tmp_path / "big.jpg", 100))
    assert 0 < diff.mean() < 3.0  # other pixels than a full decode (~1.7 levels on these hard-edged blocks)
    assert np.asarray(open_rgb(tmp_path / "big.png", max_side=1000)).shape == (720, 480, 3)  # never enlarged

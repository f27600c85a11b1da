"""imgdiff CLI: exit codes, --json shape, outputs, batch mode, every bad input -> one line + exit 2."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import cv2
import numpy as np
import pytest
from PIL import Image

from imgdiff import io as iio
from imgdiff import pair_rows
from imgdiff.cli import build_parser, main, match_folders, parse_args, parse_box

BOX = (10, 5, 17, 9)  # inclusive x0, y0, x1, y1 of the change in B


def _pair(folder, name="x.png", change=True):
    yy, xx = np.mgrid[0:32, 0:48]
    a = np.stack([40 + 2 * xx, 60 + 3 * yy, 100 + xx + yy], axis=2).astype(np.uint8)  # (H, W, 3) smooth
    b = a.copy()
    if change:
        x0, y0, x1, y1 = BOX
        b[y0 : y1 + 1, x0 : x1 + 1] ^= 0x80  # strong change: every channel moves by 128
    os.makedirs(folder, exist_ok=True)
    pa, pb = os.path.join(folder, "a_" + name), os.path.join(folder, "b_" + name)
    Image.fromarray(a).save(pa)
    Image.fromarray(b).save(pb)
    return pa, pb


def _run(capsys, *argv):
    code = main([str(x) for x in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _trouble(capsys, *argv, words=()):
    code, out, err = _run(capsys, *argv)
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("imgdiff: error: "), err
    assert "Traceback" not in err and out == ""
    for w in words:
        assert w in err, err
    return err


@pytest.mark.parametrize("mode", ["exact", "robust"])
def test_json_exit_codes_and_exact_box(tmp_path, capsys, mode):
    a, b = _pair(tmp_path)
    code, out, _ = _run(capsys, a, b, "--json", "--mode", mode)
    assert code == 1
    got = json.loads(out)
    assert set(got) == {"bbox", "regions", "changed_pixels", "width", "height"}
    assert got["bbox"] == list(BOX) and (got["width"], got["height"]) == (48, 32)
    assert got["changed_pixels"] == 8 * 5
    assert got["regions"][0]["bbox"] == list(BOX) and got["regions"][0]["max_delta"] == 128.0
    code, out, _ = _run(capsys, a, a, "--json", "--mode", mode)
    assert code == 0 and json.loads(out) == {
        "bbox": None, "regions": [], "changed_pixels": 0, "width": 48, "height": 32,
    }  # fmt: skip


@pytest.mark.parametrize("mode", ["exact", "robust"])
def test_band_and_window_path_equals_the_whole_image_diff(tmp_path, capsys, monkeypatch, mode):
    """A small change in a wide, tall PNG pair: the CLI decodes a band of rows cut to a window of
    columns (imgdiff.pair_rows.read_pair_rows, imgdiff.band_diff.diff_band) and must print diff's answer on
    the whole images, ignore boxes included."""
    from imgdiff import diff
    from tests.imgdiff.cases import photo

    a = photo(600, 1000, seed=2)
    b = a.copy()
    b[300:306, 610:640] = np.clip(b[300:306, 610:640].astype(int) + 40, 0, 255)
    b[303, 700] ^= 0x7F
    pa, pb = tmp_path / "a.png", tmp_path / "b.png"
    cv2.imwrite(str(pa), a[:, :, ::-1])  # OpenCV's PNGs (Sub rows): the fast path
    cv2.imwrite(str(pb), b[:, :, ::-1])
    real, seen = pair_rows.read_pair_rows, []
    monkeypatch.setattr(pair_rows, "read_pair_rows", lambda *x, **k: seen.append(real(*x, **k)) or seen[-1])
    for extra, ignore in [((), []), (("--ignore", "600,0,615,599"), [(600, 0, 615, 599)])]:
        code, out, _ = _run(capsys, pa, pb, "--json", "--mode", mode, *extra)
        want = diff(a, b, mode=mode, ignore=ignore)
        assert code == 1 and json.loads(out) == json.loads(json.dumps(want.to_json()))
    band = seen[0]
    assert len(band.a) < 600 and band.a.shape[1] < 1000 and band.x0 > 0  # a band cut to a window


def test_human_line_threshold_and_ignore(tmp_path, capsys):
    a, b = _pair(tmp_path)
    code, out, _ = _run(capsys, a, b)
    assert code == 1 and out.startswith("different:") and "[10, 5, 17, 9]" in out and out.count("\n") == 1
    assert _run(capsys, a, b, "--mode", "exact", "--threshold", "200")[0] == 0  # 128 < 200
    assert _run(capsys, a, b, "--mode", "exact", "--ignore", "10,5,17,9")[0] == 0
    code, out, _ = _run(capsys, a, b, "--mode", "exact", "--ignore", "0,0,13,31", "--json")
    assert code == 1 and json.loads(out)["bbox"] == [14, 5, 17, 9]


def test_gray_vs_rgb_same_and_alpha_compared(tmp_path, capsys):
    g = np.random.default_rng(2).integers(0, 256, (20, 30), dtype=np.uint8)  # (H, W)
    Image.fromarray(g).save(tmp_path / "g.png")
    Image.fromarray(np.dstack([g, g, g])).save(tmp_path / "rgb.png")
    assert _run(capsys, tmp_path / "g.png", tmp_path / "rgb.png", "--mode", "exact")[0] == 0
    rgba = np.dstack([g, g, g, np.full_like(g, 255)])
    rgba2 = rgba.copy()
    rgba2[3, 4, 3] = 0  # alpha only
    Image.fromarray(rgba).save(tmp_path / "p.png")
    Image.fromarray(rgba2).save(tmp_path / "q.png")
    code, out, _ = _run(capsys, tmp_path / "p.png", tmp_path / "q.png", "--mode", "exact", "--json")
    assert code == 1 and json.loads(out)["bbox"] == [4, 3, 4, 3]


def test_overlay_and_mask_outputs(tmp_path, capsys):
    a, b = _pair(tmp_path)
    out_png, mask_png = tmp_path / "o.png", tmp_path / "m.png"
    code, _, _ = _run(capsys, a, b, "--mode", "exact", "--out", out_png, "--mask-out", mask_png)
    assert code == 1
    overlay, mask = iio.read_image(out_png), iio.read_image(mask_png)
    x0, y0, x1, y1 = BOX
    assert tuple(overlay[y0, x0]) == iio.OVERLAY_COLOR and tuple(overlay[y1, x1]) == iio.OVERLAY_COLOR
    want = np.zeros((32, 48), np.uint8)
    want[y0 : y1 + 1, x0 : x1 + 1] = 255
    np.testing.assert_array_equal(mask, want)


def test_size_mismatch(tmp_path, capsys):
    Image.fromarray(np.zeros((10, 20, 3), np.uint8)).save(tmp_path / "a.png")
    Image.fromarray(np.zeros((12, 20, 3), np.uint8)).save(tmp_path / "b.png")
    out_png = tmp_path / "o.png"
    _trouble(
        capsys, tmp_path / "a.png", tmp_path / "b.png", "--out", out_png, words=["--allow-size-mismatch"]
    )
    assert not out_png.exists()
    code, out, _ = _run(capsys, tmp_path / "a.png", tmp_path / "b.png", "--allow-size-mismatch", "--json")
    assert code == 1 and json.loads(out)["bbox"] == [0, 10, 19, 11]


def test_bad_inputs_one_line_exit_2_no_output(tmp_path, capsys):
    a, b = _pair(tmp_path)
    out_png = tmp_path / "o.png"
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    trunc = tmp_path / "trunc.png"
    data = open(b, "rb").read()
    trunc.write_bytes(data[: len(data) // 2])
    corrupt = tmp_path / "corrupt.jpg"
    corrupt.write_bytes(b"\xff\xd8\xff\xe0" + b"\x13" * 300)
    gif = tmp_path / "x.gif"
    Image.fromarray(np.zeros((4, 4), np.uint8)).save(gif)
    cases = [
        (tmp_path / "missing.png", "no such file"),
        (empty, "empty"),
        (trunc, "truncated"),
        (corrupt, "corrupt"),
        (gif, "unsupported"),
        (tmp_path, "folder"),
    ]
    for bad, word in cases:
        err = _trouble(
            capsys, a, bad, "--out", out_png, "--mask-out", tmp_path / "m.png", words=[word, str(bad)]
        )
        assert not out_png.exists() and not (tmp_path / "m.png").exists(), err
    _trouble(capsys, a, b, "--max-pixels", "100", words=["--max-pixels", "1,536 pixels"])


@pytest.mark.parametrize(
    "argv, word",
    [
        (["--ignore", "1,2,3"], "x0,y0,x1,y1"),
        (["--ignore", "5,5,1,1"], "x0 <= x1"),
        (["--ignore", "a,b,c,d"], "four integers"),
        (["--threshold", "-1"], "from 0 to 255"),
        (["--max-pixels", "0"], "positive integer"),
        (["--mode", "fuzzy"], "invalid choice"),
        (["--out", "o.jpg"], "ending in .png"),
        (["--out", "/no/such/folder/o.png"], "does not exist"),
    ],
)
def test_bad_options(tmp_path, capsys, argv, word):
    a, b = _pair(tmp_path)
    _trouble(capsys, a, b, *argv, words=[word])


@pytest.mark.parametrize(
    "argv",
    [
        ["a.png", "b.png"],
        ["a.png", "b.png", "--json"],
        ["--json", "a.png", "b.png", "--allow-size-mismatch"],
        ["a.png", "--allow-size-mismatch", "b.png", "--json", "--json"],
        ["", "b.png"],
        ["a.png", "b.png", "--mode", "exact"],  # the rest go through argparse: same result by definition
        ["a.png", "b.png", "--js"],
        ["a.png", "-", "--json"],
    ],
)
def test_plain_argv_parses_as_argparse_does(argv):
    """parse_args reads the plain forms without argparse: every option must come out as argparse's
    (a new option with a default that the plain path lacks fails here)."""
    assert vars(parse_args(argv)) == vars(build_parser().parse_args(argv))


def test_parse_box():
    assert parse_box("0,1,2,3") == (0, 1, 2, 3)


# ------------------------------------------------------------------------------------------- batch


def _folders(tmp_path):
    da, db = tmp_path / "A", tmp_path / "B"
    rng = np.random.default_rng(3)
    img = rng.integers(0, 256, (16, 24, 3), dtype=np.uint8)
    for d in (da, db, da / "sub", db / "sub"):
        d.mkdir(exist_ok=True)
    Image.fromarray(img).save(da / "same.png")
    Image.fromarray(img).save(db / "same.png")
    Image.fromarray(img).save(da / "sub" / "diff.png")
    changed = img.copy()
    changed[2, 3] ^= 0xFF
    Image.fromarray(changed).save(db / "sub" / "diff.png")
    Image.fromarray(img).save(da / "only_a.png")
    return da, db


def test_match_folders(tmp_path):
    da, db = _folders(tmp_path)
    got = [(m.name, m.in_a, m.in_b) for m in match_folders(str(da), str(db))]
    assert got == [("only_a.png", True, False), ("same.png", True, True), ("sub/diff.png", True, True)]


def test_batch_json_lines_summary_and_outputs(tmp_path, capsys):
    da, db = _folders(tmp_path)
    code, out, err = _run(capsys, da, db, "--json", "--mode", "exact", "--out", tmp_path / "ov")
    rows = {r["name"]: r for r in map(json.loads, out.splitlines())}
    assert code == 2  # a missing counterpart is trouble
    assert rows["only_a.png"]["status"] == "missing" and "only in A" in rows["only_a.png"]["error"]
    assert rows["same.png"]["status"] == "same" and rows["same.png"]["bbox"] is None
    assert rows["sub/diff.png"]["status"] == "different" and rows["sub/diff.png"]["bbox"] == [3, 2, 3, 2]
    assert "2 pairs" in err and "1 missing" in err
    assert (tmp_path / "ov" / "sub" / "diff.png").exists() and (tmp_path / "ov" / "same.png").exists()
    os.remove(da / "only_a.png")
    code, out, _ = _run(capsys, da, db, "--mode", "exact")
    assert code == 1 and out.splitlines()[-1] == "2 pairs: 1 same, 1 different, 0 error, 0 missing"
    (db / "sub" / "diff.png").write_bytes(b"")
    code, out, _ = _run(capsys, da, db, "--mode", "exact")
    assert code == 2 and "error: sub/diff.png" in out and "empty" in out


def test_batch_refuses_to_write_into_an_input_folder(tmp_path, capsys):
    da, db = _folders(tmp_path)
    _trouble(capsys, da, db, "--out", db, words=["input folder"])


def test_file_and_folder_mixed(tmp_path, capsys):
    a, _ = _pair(tmp_path)
    _trouble(capsys, a, tmp_path, words=["two files or two folders"])


def test_real_entry_point_help_and_run(tmp_path):
    a, b = _pair(tmp_path)
    env = dict(os.environ, PYTHONWARNINGS="error::DeprecationWarning")
    help_ = subprocess.run(
        [sys.executable, "-m", "imgdiff", "--help"], capture_output=True, text=True, env=env
    )
    assert help_.returncode == 0 and "examples:" in help_.stdout and "--allow-size-mismatch" in help_.stdout
    assert "safety:" in help_.stdout and "never written" in help_.stdout
    proc = subprocess.run(
        [sys.executable, "-m", "imgdiff", a, b, "--json", "--mode", "exact"], capture_output=True, text=True
    )
    assert proc.returncode == 1 and json.loads(proc.stdout)["bbox"] == list(BOX) and proc.stderr == ""
    proc = subprocess.run([sys.executable, "-m", "imgdiff", a, "nope.png"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_sample_assets_are_the_documented_pair(capsys):
    root = os.path.join(os.path.dirname(__file__), "..", "..", "assets")
    spec = importlib.util.spec_from_file_location("make_samples", os.path.join(root, "make_samples.py"))
    make_samples = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_samples)  # a script, not a package: loaded from its file
    a = iio.read_image(os.path.join(root, "sample_a.png"))
    b = iio.read_image(os.path.join(root, "sample_b.png"))
    assert a.shape == b.shape == (make_samples.HEIGHT, make_samples.WIDTH, 3)
    x0, y0, x1, y1 = make_samples.SQUARE
    assert (b[y0 : y1 + 1, x0 : x1 + 1] == (220, 30, 40)).all()
    want_a, _ = make_samples.make_pair()
    # the committed A is what the script makes: to the pixel outside the caption, whose anti-aliased glyphs
    # OpenCV rasterises differently between releases (5.1 against the one that wrote the file); inside it,
    # the same amount of ink
    tx0, ty0, tx1, ty1 = make_samples.text_box()
    outside = np.ones(a.shape[:2], dtype=bool)
    outside[ty0 : ty1 + 1, tx0 : tx1 + 1] = False
    np.testing.assert_array_equal(a[outside], want_a[outside])
    ink = [(img[ty0 : ty1 + 1, tx0 : tx1 + 1].min(axis=2) > 200).sum() for img in (a, want_a)]
    assert abs(ink[0] - ink[1]) <= 0.2 * ink[1] and ink[1] > 1000, ink


@pytest.mark.parametrize("ext", ["tif", "jpg", "webp"])
def test_truncated_file_stderr_is_one_line_at_fd_level(tmp_path, ext):
    """Library warnings (Pillow's 'Corrupt EXIF', libjpeg/libtiff prints) must not reach stderr."""
    rng = np.random.default_rng(4)
    img = rng.integers(0, 256, (64, 96, 3), dtype=np.uint8)
    good, bad = tmp_path / f"good.{ext}", tmp_path / f"bad.{ext}"
    Image.fromarray(img).save(good)
    data = good.read_bytes()
    bad.write_bytes(data[: len(data) // 3])
    proc = subprocess.run([sys.executable, "-m", "imgdiff", good, bad], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("imgdiff: error: cannot read"), proc.stderr


def test_byte_identical_files_same_or_trouble(tmp_path, capsys):
    pa, _ = _pair(tmp_path, change=False)
    pb = tmp_path / "copy.png"
    data = open(pa, "rb").read()
    pb.write_bytes(data)
    code, out, _ = _run(capsys, pa, pb, "--json")
    assert code == 0 and json.loads(out) == {
        "bbox": None, "regions": [], "changed_pixels": 0, "width": 48, "height": 32
    }  # fmt: skip
    code, out, _ = _run(capsys, pa, pb, "--out", tmp_path / "o.png")  # outputs: the full path, same answer
    assert code == 0 and out.startswith("same:") and (tmp_path / "o.png").exists()
    bad = bytearray(data)
    bad[60:80] = b"\xff" * 20  # inside IDAT
    for p in (pa, pb):
        open(p, "wb").write(bytes(bad))
    _trouble(capsys, pa, pb, words=["corrupt"])

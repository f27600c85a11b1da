"""Smoke of benchmarks/imgdiff_bench.py at a tiny size: the table prints, the OpenCV recipe is exact."""

from __future__ import annotations

import importlib.util
import os
import sys

import numpy as np
import pytest

from tests.imgdiff.cases import make_case

_PATH = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "imgdiff_bench.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("imgdiff_bench", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the file runs
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_opencv_recipe_gives_the_exact_box(bench):
    case = make_case("small_patch", h=96, w=128)
    assert bench.opencv_exact_box(case.a, case.b) == case.expect
    assert bench.opencv_exact_box(case.a, case.a.copy()) is None
    a = np.zeros((5, 7, 3), np.uint8)
    b = a.copy()
    b[4, 6, 2] = 1  # last channel of the last pixel
    assert bench.opencv_exact_box(a, b) == (6, 4, 6, 4)


def test_table_prints_every_row(bench, capsys, monkeypatch):
    monkeypatch.setenv("IMGDIFF_BENCH_ODIFF", "/nonexistent/odiff")
    monkeypatch.setattr(bench.shutil, "which", lambda name: None)
    monkeypatch.setattr(bench, "has_blazediff", lambda: False)  # one CLI per pair: a fast smoke run
    argv = ["--width", "64", "--height", "48", "--runs", "1", "--backends", "numpy", "--photos", "coffee"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    for label in ("L = np.array_equal", "kernel exact/numpy", "kernel robust/numpy", "opencv absdiff", "xL"):
        assert label in out
    for pair in ("opencv jpeg_q90", "pillow coffee identical", "pillow coffee small_patch"):
        assert pair in out
    assert "browser coffee jpeg_q90" in out
    assert "imgdiff wall/cpu ms" in out and "load average" in out
    assert "skipped: cli odiff: not found" in out and "skipped: cli blazediff" in out


def test_photo_pairs_are_written_as_described(bench, tmp_path):
    """Pillow-written pairs: RGB, adaptive filters (Paeth rows), the planted patch and a JPEG side;
    browser-style pairs: RGBA."""
    from imgdiff import png

    pairs = {p.name: p for p in bench.write_photo_pairs(str(tmp_path), 96, 64, ["coffee"])}
    writers = (("pillow", bench.CASES), ("browser", bench.CASES[1:]))
    assert sorted(pairs) == sorted(f"{w} coffee {c}" for w, cases in writers for c in cases)
    assert pairs["pillow coffee identical"].differ == 0
    patch = pairs["pillow coffee small_patch"]
    assert patch.differ == pytest.approx(bench.PATCH**2 / (96 * 64))
    assert pairs["pillow coffee jpeg_q90"].differ > 0.5
    data = open(patch.b, "rb").read()
    layout = png.layout(data)
    assert layout.colour == 2 and png.PAETH in png.inflate(layout)[1]
    assert png.layout(open(pairs["browser coffee jpeg_q90"].a, "rb").read()).colour == 6

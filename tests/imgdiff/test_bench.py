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
    assert bench.main(["--width", "64", "--height", "48", "--runs", "1", "--backends", "numpy"]) == 0
    out = capsys.readouterr().out
    for label in ("L = np.array_equal", "kernel exact/numpy", "kernel robust/numpy", "opencv absdiff"):
        assert label in out
    assert "cli imgdiff" in out and "xL" in out
    assert "skipped: cli odiff: not found" in out

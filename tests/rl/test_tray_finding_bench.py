"""The tray-finding benchmark's pure parts: reading a caption's tray box, and counting exact hits."""

from __future__ import annotations

import pytest

from tests.helpers.bench import load_benchmark


@pytest.fixture(scope="module")
def tf():
    return load_benchmark("tray_finding")


def test_tray_box_is_read_as_written(tf):
    assert (
        tf.tray_box("The photo shows a red car and a tray at [0.35, 0.0, 0.65, 0.31].")
        == "[0.35, 0.0, 0.65, 0.31]"
    )
    assert tf.tray_box("The photo shows a red car.") is None


def test_box_hits_count_exact_boxes_only(tf):
    ref = [
        "a tray at [0.0, 0.0, 0.31, 0.31].",
        "a tray at [0.35, 0.69, 0.65, 1.0].",
        "a tray at [0.69, 0.0, 1.0, 0.31].",
    ]
    got = ["a cup and a tray at [0.0, 0.0, 0.31, 0.31].", "a tray at [0.35, 0.69, 0.65, 0.99].", "no tray"]
    assert tf.box_hits(ref, got) == 1
    with pytest.raises(ValueError, match="one caption per reference"):
        tf.box_hits(ref, got[:2])

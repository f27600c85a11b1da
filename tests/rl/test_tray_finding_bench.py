"""The tray-finding benchmark's pure parts: reading a caption's tray box, counting exact hits, and the
labels the tray probes read."""

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


def test_tray_labels_golden(tf):
    def obj(category, color):
        return {"category": category, "color": color}

    rows = [
        {"objects": [[obj("car", "red")], [obj("cup", "red"), obj("cup", "blue"), obj("cup", "red")]]},
        {"objects": [[], [obj("fork", "blue"), obj("cup", "green"), obj("fork", "red"), obj("pan", "red")]]},
        {"objects": [[], [obj("pan", "green"), obj("fork", "green"), obj("spoon", "white")]]},
    ]
    got = tf.tray_labels(rows, colours=2, categories=2)
    assert got == {
        "objects": [0, 1, 0],
        "colour:red": [1, 1, 0],  # red 4 times, green 3, blue 2, white 1
        "colour:green": [0, 1, 1],
        "category:cup": [2, 1, 0],  # cup 4 times, fork 3: two or more is class 2
        "category:fork": [0, 2, 1],
    }

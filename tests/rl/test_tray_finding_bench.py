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


def test_token_labels_golden(tf):
    def obj(category, color, bbox):
        return {"category": category, "color": color, "bbox": bbox}

    rows = [
        {"objects": [[], [obj("cup", "red", [1, 1, 6, 6]), obj("pan", "blue", [9, 1, 15, 6])]]},
        # two objects in one cell: that token is left out; one object covering two cells' centres tags both
        {
            "objects": [
                [],
                [
                    obj("cup", "red", [1, 1, 3, 3]),
                    obj("fork", "green", [5, 5, 7, 7]),
                    obj("pan", "white", [1, 9, 14, 14]),
                ],
            ]
        },  # fmt: skip
    ]
    held, empty = tf.token_labels(rows, grid=2, size=16)  # 8-px cells, centres at 4 and 12
    assert held == [
        (0, 0, "cup", "red"),
        (0, 1, "pan", "blue"),
        (1, 2, "pan", "white"),
        (1, 3, "pan", "white"),
    ]
    assert empty == [[2, 3], [1]]

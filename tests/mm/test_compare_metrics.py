"""`mm compare-fusion` scores: recall by photo position and t intervals (golden), variants, summaries."""

from __future__ import annotations

import math

import pytest

from mm.train.compare import CompareConfig, variant_folder
from mm.train.compare_metrics import mean_interval, recall_by_position, summarize


def test_recall_by_position_golden():
    mentioned = [{"cat", "fork"}, {"cup"}, {"dog"}]
    photos = [
        [{"cat", "dog"}, {"fork", "cat"}, {"knife"}],  # 1st: cat, dog (1 of 2); later: fork, knife (1 of 2)
        [{"cup"}, {"plate"}],  # 1st: cup (1 of 1); later: plate (0 of 1)
        [{"dog"}],  # one photo: skipped
    ]
    r = recall_by_position(mentioned, photos)
    assert r["recall_first"] == 2 / 3 and r["recall_later"] == 1 / 3
    assert r["recall_gap"] == pytest.approx(1 / 3)
    assert (r["n_first_objects"], r["n_later_objects"], r["n_multi_photo_notes"]) == (3, 3, 2)
    empty = recall_by_position([set()], [[{"cat"}]])
    assert empty["recall_first"] is None and empty["recall_gap"] is None
    with pytest.raises(ValueError, match="one mention set per note"):
        recall_by_position([set()], [])


def test_mean_interval_golden():
    assert mean_interval([1.0, 2.0, 3.0]) == (2.0, pytest.approx(4.303 / math.sqrt(3)))
    assert mean_interval([0.5]) == (0.5, None)
    assert mean_interval([None, None]) == (None, None)
    assert mean_interval([2.0, None, 4.0]) == (3.0, pytest.approx(12.706 * math.sqrt(2) / math.sqrt(2)))


def test_summarize_groups_seeds():
    rows = [
        {"kind": "qformer", "scope": "note", "seed": 0, "recall": 0.4},
        {"kind": "qformer", "scope": "image", "seed": 0, "recall": 0.3},
        {"kind": "qformer", "scope": "note", "seed": 1, "recall": 0.6},
    ]
    out = summarize(rows, group=("kind", "scope"), keys=("recall",))
    assert [(r["scope"], r["seeds"]) for r in out] == [("note", 2), ("image", 1)]
    assert out[0]["recall"] == pytest.approx(0.5) and out[1]["recall_ci"] is None


def test_variants_skip_mlp_note_scope_and_folder_names():
    cfg = CompareConfig(kinds=["mlp", "qformer"], scopes=["image", "note"], visibilities=["all", "own"])
    assert cfg.variants() == [
        ("mlp", "image", "all"), ("mlp", "image", "own"),
        ("qformer", "image", "all"), ("qformer", "image", "own"),
        ("qformer", "note", "all"), ("qformer", "note", "own"),
    ]  # fmt: skip
    assert variant_folder("qformer", "image", "all", 0) == "qformer"
    assert variant_folder("resampler", "note", "own", 2) == "resampler-note-own-s2"
    with pytest.raises(ValueError, match="mlp has scope 'image' only"):
        CompareConfig(kinds=["mlp"], scopes=["note"])
    with pytest.raises(ValueError, match="visibilities must be"):
        CompareConfig(visibilities=["mine"])
    with pytest.raises(ValueError, match="seeds must be"):
        CompareConfig(seeds=[0, 0])

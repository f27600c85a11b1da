"""Bootstrap intervals: golden values (fixed seed), parity with a plain loop, paired changes, bad inputs."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mm.eval.bootstrap import (
    CHAIR_RATIOS,
    POPE_RATIOS,
    chair_units,
    intervals,
    mean_interval,
    paired_change_interval,
    paired_intervals,
    pope_units,
    ratio_interval,
    resample_weights,
)
from mm.eval.chair import Vocabulary, chair_scores
from mm.eval.pope import pope_scores

NUM, DEN = [1, 0, 2, 1, 0], [3, 2, 4, 1, 2]


def test_ratio_interval_golden():
    iv = ratio_interval(NUM, DEN, n_boot=200, seed=0)
    assert iv.value == pytest.approx(4 / 12)
    assert iv.low == pytest.approx(0.08863636363636401)
    assert iv.high == pytest.approx(0.5559523809523811)
    assert (iv.level, iv.n_units, iv.n_valid) == (0.95, 5, 200)


def test_ratio_interval_matches_a_plain_loop():
    rng = np.random.default_rng(7)
    num, den = rng.integers(0, 5, 30).astype(float), rng.integers(1, 6, 30).astype(float)
    iv = ratio_interval(num, den, n_boot=300, seed=4)
    idx = np.random.default_rng(4).integers(0, 30, size=(300, 30))
    stats = [num[row].sum() / den[row].sum() for row in idx]
    assert iv.low == pytest.approx(np.percentile(stats, 2.5))
    assert iv.high == pytest.approx(np.percentile(stats, 97.5))
    assert iv.low <= iv.value <= iv.high


def test_mean_and_weights_golden():
    iv = mean_interval([0.1, 0.5, 0.9, 0.3], n_boot=200, seed=1)
    assert (iv.value, iv.low) == (pytest.approx(0.45), pytest.approx(0.2))
    assert iv.high == pytest.approx(0.70125)
    w = resample_weights(3, 2, 0)
    assert w.tolist() == [[0.0, 2.0, 1.0], [3.0, 0.0, 0.0]]
    assert (resample_weights(17, 50, 3).sum(1) == 17).all()


def test_paired_change_golden_and_degenerate():
    before, after = (NUM, DEN), ([0, 0, 1, 1, 0], DEN)
    rel = paired_change_interval(before, after, n_boot=200, seed=0)
    assert (rel.value, rel.low, rel.high, rel.n_valid) == (
        -0.5,
        -1.0,
        0.0,
        195,
    )  # 5 resamples had no hallucination
    ab = paired_change_interval(before, after, relative=False, n_boot=200, seed=0)
    assert (
        ab.value == pytest.approx(-2 / 12) and ab.low == pytest.approx(-0.2728535353535353) and ab.high == 0.0
    )
    same = paired_change_interval(before, before, n_boot=50)
    assert (same.value, same.low, same.high) == (0.0, 0.0, 0.0)  # paired: the spread between notes cancels


def test_paired_intervals_match_units_by_id():
    before = {"id": ["a", "b", "c"], "h": [1.0, 0.0, 2.0], "m": [2.0, 2.0, 2.0]}
    after = {"id": ["c", "a", "z"], "h": [1.0, 0.0, 5.0], "m": [2.0, 2.0, 9.0]}
    out = paired_intervals(before, after, {"x": ("h", "m")}, relative={"x": True}, n_boot=20)
    assert out["x"]["value"] == pytest.approx((1 / 4 - 3 / 4) / (3 / 4))  # only a and c are compared
    with pytest.raises(ValueError, match="share no unit id"):
        paired_intervals(before, {"id": ["q"], "h": [1.0], "m": [1.0]}, {"x": ("h", "m")}, relative={})


def test_zero_denominator_gives_nan_value_and_none_in_json():
    iv = ratio_interval([0, 0], [0, 0], n_boot=10)
    assert math.isnan(iv.value) and iv.n_valid == 0
    assert iv.to_json()["value"] is None and iv.to_json()["low"] is None


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num": [1, 2], "den": [1]}, "one value per unit"),
        ({"num": [], "den": []}, "no units"),
        ({"num": [1], "den": [1], "n_boot": 0}, "n_boot"),
        ({"num": [1], "den": [1], "level": 1.5}, "level"),
        ({"num": [float("nan")], "den": [1]}, "non-finite"),
    ],
)
def test_bad_inputs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ratio_interval(**kwargs)


def test_pope_units_reproduce_pope_scores():
    rows = [
        ("i1", "yes", "yes"),
        ("i1", "no", "yes"),
        ("i2", "yes", "no"),
        ("i2", "no", "no"),
        ("i3", "yes", "yes"),
    ]
    res = pope_scores(
        {str(k): lab for k, (_, lab, _) in enumerate(rows)}, {str(k): p for k, (*_, p) in enumerate(rows)}
    )
    ivs = intervals(pope_units(rows), POPE_RATIOS, n_boot=50)
    for m in POPE_RATIOS:
        assert ivs[m]["value"] == pytest.approx(res[m]), m


def test_chair_units_reproduce_chair_scores():
    caps = [
        {"image_id": 1, "caption": "A fork and a knife."},
        {"image_id": 2, "caption": "Two cups and a dog."},
    ]
    res = chair_scores(caps, {1: ["fork"], 2: ["cup", "plate"]}, Vocabulary.world())
    ivs = intervals(chair_units(res["per_caption"]), CHAIR_RATIOS, n_boot=50)
    for m in CHAIR_RATIOS:
        assert ivs[m]["value"] == pytest.approx(res[m]), m


@pytest.mark.parametrize("parser", ["original", "lmms", "vlmevalkit"])
def test_pope_scores_intervals_match_every_parser(parser):
    labels = {f"q{i}": "yes" if i % 2 == 0 else "no" for i in range(12)}
    texts = ["yes", "no", "Yes", "maybe", "no", "no", "yes", "yes", "I think not", "no", "yes", "no"]
    units = {f"q{i}": f"img{i // 4}" for i in range(12)}
    res = pope_scores(labels, dict(zip(labels, texts)), parser=parser, units=units)
    for m in POPE_RATIOS:
        assert res["intervals"][m]["value"] == pytest.approx(res[m]), (parser, m)
        assert res["intervals"][m]["n_units"] == 3  # three images, not twelve questions
    per_question = pope_scores(labels, dict(zip(labels, texts)), parser=parser)
    assert per_question["intervals"]["accuracy"]["n_units"] == 12


def test_eval_cli_tables_print_intervals(tmp_path, capsys):
    import json

    from mm.cli import main

    q, a = tmp_path / "q.jsonl", tmp_path / "a.jsonl"
    rows = [(1, "a", "yes", "Yes"), (2, "a", "no", "Yes"), (3, "b", "yes", "No"), (4, "b", "no", "No")]
    q.write_text("".join(json.dumps({"question_id": i, "image": im, "text": "?", "label": lab}) + "\n"
                         for i, im, lab, _ in rows))  # fmt: skip
    a.write_text("".join(json.dumps({"question_id": i, "text": t}) + "\n" for i, _, _, t in rows))
    assert main(["eval", "pope", "--questions", str(q), "--answers", str(a)]) == 0
    out = capsys.readouterr().out
    assert "accuracy   0.5000  [0.5000, 0.5000]" in out and "recall     0.5000  [0.0000, 1.0000]" in out
    assert main(["eval", "pope", "--questions", str(q), "--answers", str(a), "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["intervals"]["f1"]["n_units"] == 2 and res["intervals"]["f1"]["value"] == 0.5

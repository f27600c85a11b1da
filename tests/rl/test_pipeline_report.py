"""rl.report: hand-computed changes and target checks, markdown and plots from a synthetic metrics dict."""

from __future__ import annotations

import pytest

from rl import report


def _eval(recall, chair_i, length, f1, yes, partner=6, confusion=3, other=1):
    total = partner + confusion + other
    return {
        "n_notes": 10,
        "chair": {"recall": recall, "chair_i": chair_i, "chair_s": 2 * chair_i, "mean_length": length,
                  "n_mentions": 40, "n_hallucinated": total},
        "pope": {s: {"f1": f1, "yes_ratio": yes, "accuracy": f1}
                 for s in ("adversarial", "popular", "random")},
        "causes": {"partner": partner, "confusion": confusion, "other": other, "total": total,
                   "partner_frac": partner / total if total else 0.0},
        "samples": [{"id": "w1", "caption": "a fork and a knife.", "hallucinated": ["knife"]}],
    }  # fmt: skip


def _stages():
    s = {
        "pretrain": {"status": "ran", "seconds": 10.0, "peak_rss_mb": 500.0,
                     "metrics": {"text2note_R@1": 0.5, "note2text_R@1": 0.4, "step": 3}},
        "eval_sft": {"status": "ran", "seconds": 5.0, "peak_rss_mb": 600.0,
                     "metrics": _eval(0.90, 0.20, 20.0, 0.80, 0.70)},
        "eval_dpo": {"status": "skipped (done earlier)", "seconds": 5.0, "peak_rss_mb": 650.0,
                     "metrics": _eval(0.89, 0.06, 21.0, 0.92, 0.52, 1, 1, 0)},
        "eval_grpo": {"status": "ran", "seconds": 900.0, "peak_rss_mb": 640.0,
                      "metrics": _eval(0.85, 0.10, 17.0, 0.85, 0.60, 2, 1, 1)},
    }  # fmt: skip
    return s


def test_changes_golden():
    before = report.model_summary(_eval(0.90, 0.20, 20.0, 0.80, 0.70))
    after = report.model_summary(_eval(0.89, 0.06, 21.0, 0.92, 0.52))
    d = report.changes(before, after)
    assert d["chair_i_rel_change"] == pytest.approx(-0.7)
    assert d["recall_change_points"] == pytest.approx(-1.0)
    assert d["length_change_pct"] == pytest.approx(5.0)
    assert d["pope_adversarial_f1_change_points"] == pytest.approx(12.0)
    assert d["pope_adversarial_yes_ratio"] == 0.52
    assert before["precision"] == pytest.approx(0.8) and before["partner_frac"] == pytest.approx(0.6)
    zero = report.model_summary(_eval(0.9, 0.0, 20.0, 0.8, 0.5, 0, 0, 0))
    assert report.changes(zero, after)["chair_i_rel_change"] is None  # no relative change from 0


def test_targets_and_metrics():
    m = report.build_metrics(
        _stages(), post=["dpo", "grpo"], wall_seconds=3.0, rss={"peak_rss_mb": 700.0}, load=[1.0, 2.0, 3.0]
    )
    assert m["pipeline_seconds"] == 920.0 and m["peak_rss_mb"] == 700.0
    assert m["retrieval"] == {"text2note_R@1": 0.5, "note2text_R@1": 0.4}
    met = {t["target"]: t["met"] for t in m["targets"]}
    assert met["pipeline wall time (s)"] is False  # 920 s > 900 s
    assert (
        met["SFT object recall"] and met["SFT CHAIR_i"] and met["SFT partner share of hallucinated mentions"]
    )
    assert met["dpo: CHAIR_i change (rel.)"] and met["dpo: recall change (points)"]
    assert met["dpo: mean length change (%)"] and met["dpo: POPE-adv F1"] and met["dpo: POPE-adv yes-ratio"]
    assert not met["grpo: CHAIR_i change (rel.)"]  # -50%
    assert not met["grpo: recall change (points)"]  # -5 points
    assert not met["grpo: mean length change (%)"]  # -15%
    assert not met["grpo: POPE-adv F1"] and not met["grpo: POPE-adv yes-ratio"]  # +5 points; 0.60
    assert m["headline"]["targets_met"] == sum(met.values())


def test_high_sft_f1_needs_095():
    models = {
        "sft": report.model_summary(_eval(0.9, 0.2, 20.0, 0.90, 0.5)),
        "dpo": report.model_summary(_eval(0.9, 0.05, 20.0, 0.96, 0.5)),
    }
    rows = report.target_checks(models, {"dpo": report.changes(models["sft"], models["dpo"])}, 10.0)
    f1 = next(r for r in rows if r["target"] == "dpo: POPE-adv F1")
    assert f1["met"] and "0.95" in f1["goal"]


def test_write_report(tmp_path):
    m = report.build_metrics(
        _stages(), post=["dpo", "grpo"], wall_seconds=3.0, rss={"peak_rss_mb": 7.0}, load=None
    )
    (tmp_path / "eval_sft").mkdir()
    made = report.write_report(tmp_path, m)
    text = made["report.md"].read_text()
    assert "| dpo | -70.0% | -1.0 | +5.0% | +12.0 | 0.520 |" in text
    assert "**missed**" in text and "(hallucinated: knife)" in text and "skipped (done earlier)" in text
    for key in ("before_after", "causes", "stage_times"):
        assert made[key].stat().st_size > 5000

"""rl.report with intervals: per-model intervals, paired change intervals, targets held over the interval."""

from __future__ import annotations

import pytest

from mm.eval.bootstrap import chair_units, pope_units
from mm.eval.chair import Vocabulary, chair_scores
from mm.eval.pope import pope_scores
from rl import report


def _record(n_halluc: int, n_notes: int = 40, yes_wrong: int = 0) -> dict:
    """An evaluate_model-like record: ``n_halluc`` of ``n_notes`` captions add an absent knife."""
    caps = [
        {
            "image_id": f"n{i}",
            "caption": "A fork and a cup and a knife." if i < n_halluc else "A fork and a cup.",
        }
        for i in range(n_notes)
    ]
    gt = {f"n{i}": ["fork", "cup"] for i in range(n_notes)}
    chair = chair_scores(caps, gt, Vocabulary.world())
    rows = [(f"img{i}", lab, "yes" if lab == "yes" or i < yes_wrong else "no")
            for i in range(n_notes) for lab in ("yes", "no")]  # fmt: skip
    labels = {f"q{k}": r[1] for k, r in enumerate(rows)}
    pope = pope_scores(
        labels, {f"q{k}": r[2] for k, r in enumerate(rows)}, units={f"q{k}": r[0] for k, r in enumerate(rows)}
    )
    pope_summary = {k: v for k, v in pope.items() if k in ("f1", "yes_ratio", "accuracy", "intervals")}
    return {
        "n_notes": n_notes,
        "chair": {
            k: chair[k]
            for k in ("chair_i", "chair_s", "recall", "mean_length", "n_mentions", "n_hallucinated")
        },
        "chair_intervals": chair["intervals"],
        "units": {"chair": chair_units(chair["per_caption"]), "pope_adversarial": pope_units(rows)},
        "pope": {"adversarial": pope_summary},
        "causes": {"partner": n_halluc, "confusion": 0, "other": 0, "total": n_halluc, "partner_frac": 1.0},
    }


def _stages(sft, dpo):
    return {
        "eval_sft": {"status": "ran", "seconds": 5.0, "peak_rss_mb": 600.0, "metrics": sft},
        "eval_dpo": {"status": "ran", "seconds": 5.0, "peak_rss_mb": 600.0, "metrics": dpo},
    }


def test_intervals_in_summaries_changes_and_targets(tmp_path):
    stages = _stages(_record(20, yes_wrong=10), _record(2))
    m = report.build_metrics(stages, post=["dpo"], wall_seconds=1.0, rss={"peak_rss_mb": 1.0}, load=None)
    sft = m["models"]["sft"]
    lo, hi = sft["intervals"]["chair_i"]
    assert lo < sft["chair_i"] < hi and sft["chair_i"] == pytest.approx(20 / 100)
    assert sft["intervals"]["precision"] == pytest.approx([1 - hi, 1 - lo])
    assert sft["intervals"]["recall"] == [1.0, 1.0]  # every caption names both objects
    d = m["changes"]["dpo"]
    assert d["chair_i_rel_change"] == pytest.approx((2 / 82 - 20 / 100) / (20 / 100))
    clo, chi = d["intervals"]["chair_i_rel_change"]
    assert clo <= d["chair_i_rel_change"] <= chi < 0
    assert d["intervals"]["recall_change_points"] == [0.0, 0.0]
    flo, fhi = d["intervals"]["pope_adversarial_f1_change_points"]
    assert 0 < flo <= d["pope_adversarial_f1_change_points"] <= fhi
    rows = {t["target"]: t for t in m["targets"]}
    ci = rows["dpo: CHAIR_i change (rel.)"]
    assert ci["met"] is True and ci["interval"] == [clo, chi]
    assert ci["met_at_interval"] == (chi <= -0.6)
    assert rows["dpo: recall change (points)"]["met_at_interval"] is True
    assert rows["pipeline wall time (s)"]["met_at_interval"] is None  # no interval for a time
    h = m["headline"]
    assert h["targets_met_at_interval"] == sum(1 for t in m["targets"] if t["met_at_interval"])
    assert "units" not in m["stages"]["eval_sft"]["metrics"]
    made = report.write_report(tmp_path, m)
    text = made["report.md"].read_text()
    assert "over the interval" in text and "95% bootstrap intervals" in text
    assert f"[{sft['intervals']['chair_i'][0]:.3f}, {sft['intervals']['chair_i'][1]:.3f}]" in text
    assert made["before_after"].stat().st_size > 0


def test_noisy_target_met_at_point_but_not_over_interval():
    # 10 notes, SFT CHAIR_i 3/23 ~ 0.13 >= 0.10 at the point; the interval reaches below 0.10
    m = report.build_metrics(
        _stages(_record(3, n_notes=10), _record(0, n_notes=10)), post=["dpo"], wall_seconds=1.0,
        rss={"peak_rss_mb": 1.0}, load=None,
    )  # fmt: skip
    row = next(t for t in m["targets"] if t["target"] == "SFT CHAIR_i")
    assert row["met"] is True and row["interval"][0] < 0.10 and row["met_at_interval"] is False


def test_records_without_units_have_no_intervals():
    rec = _record(5)
    for k in ("units", "chair_intervals"):
        rec.pop(k)
    rec["pope"]["adversarial"].pop("intervals")
    m = report.build_metrics(
        _stages(rec, rec), post=["dpo"], wall_seconds=1.0, rss={"peak_rss_mb": 1.0}, load=None
    )
    assert m["models"]["sft"]["intervals"] == {} and m["changes"]["dpo"]["intervals"] == {}
    assert all(t["met_at_interval"] is None for t in m["targets"])
    assert "over the interval" in report.render_markdown(m, {})


def _with_claims(rec: dict, wrong_colour: int) -> dict:
    """Adds claim scores of captions naming the red fork blue in ``wrong_colour`` of the notes."""
    from mm.data.format import Note, ObjectAnnotation
    from mm.eval.runners import claims_of_captions

    n = rec["n_notes"]
    objs = [
        ObjectAnnotation(category="fork", bbox=(0, 0, 1, 1), color="red"),
        ObjectAnnotation(category="cup", bbox=(0, 0, 1, 1), color="blue"),
    ]
    notes = [Note(id=f"n{i}", images=["x.png"], objects=[objs]) for i in range(n)]
    per_caption = [
        {"image_id": f"n{i}", "caption": f"A {'blue' if i < wrong_colour else 'red'} fork and a blue cup."}
        for i in range(n)
    ]
    claims = claims_of_captions(per_caption, notes)
    rec["claims"] = claims["kinds"]
    rec["units"].update({f"claims_{k}": u for k, u in claims["units"].items()})
    return rec


def test_attribute_rate_with_interval_and_paired_change():
    stages = _stages(_with_claims(_record(20), 16), _with_claims(_record(2), 4))
    m = report.build_metrics(stages, post=["dpo"], wall_seconds=1.0, rss={"peak_rss_mb": 1.0}, load=None)
    sft, dpo = m["models"]["sft"], m["models"]["dpo"]
    assert sft["attribute_rate"] == pytest.approx(16 / 80) and dpo["attribute_rate"] == pytest.approx(4 / 80)
    assert sft["count_rate"] == 0.0
    lo, hi = sft["intervals"]["attribute_rate"]
    assert lo < 0.2 < hi
    d = m["changes"]["dpo"]
    assert d["attribute_rate_rel_change"] == pytest.approx(-0.75)
    clo, chi = d["intervals"]["attribute_rate_rel_change"]
    assert clo <= -0.75 <= chi < 0
    assert "attribute halluc. change (rel.)" in report.render_markdown(m, {})

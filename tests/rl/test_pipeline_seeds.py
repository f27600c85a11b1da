"""`rl pipeline --seeds N`: training-seed spread (mean +- sd golden values) and a tiny end-to-end run."""

from __future__ import annotations

import json

import pytest

from rl.report_uncertainty import seed_lines, seed_summary
from tests.rl.test_pipeline import POST, _run, tiny_pipeline


def test_seed_summary_golden():
    runs = {
        "dpo": [
            {"seed": 0, "chair_i_rel_change": -0.5, "recall_change_points": -1.0, "length_change_pct": 2.0,
             "pope_adversarial_f1_change_points": None},
            {"seed": 1, "chair_i_rel_change": -0.7, "recall_change_points": -3.0, "length_change_pct": 4.0,
             "pope_adversarial_f1_change_points": 1.0},
        ]
    }  # fmt: skip
    s = seed_summary(runs)["dpo"]
    assert s["mean"]["chair_i_rel_change"] == pytest.approx(-0.6)
    assert s["sd"]["chair_i_rel_change"] == pytest.approx(0.1414213562)  # sample sd of -0.5, -0.7
    assert s["mean"]["recall_change_points"] == pytest.approx(-2.0) and s["sd"][
        "length_change_pct"
    ] == pytest.approx(1.4142135623)
    assert (
        s["mean"]["pope_adversarial_f1_change_points"] == 1.0
        and s["sd"]["pope_adversarial_f1_change_points"] is None
    )
    text = "\n".join(seed_lines(seed_summary(runs)))
    assert "## Training seeds" in text and "| dpo | 1 | -70.0% |" in text
    assert "-60.0% +- 14.1%" in text and "(2 runs)" in text


@pytest.mark.slow
@pytest.mark.skipif("dpo" not in POST, reason="needs the DPO trainer")
def test_seeds_rerun_post_training_and_report_mean_sd(tmp_path, capsys):
    cfg = tiny_pipeline(tmp_path, post=["dpo"])
    out = tmp_path / "run"
    assert _run(cfg, out, "--seeds", "2") == 0
    m = json.loads((out / "metrics.json").read_text())
    runs = m["seeds"]["dpo"]["runs"]
    assert [r["seed"] for r in runs] == [0, 1]
    assert runs[0]["chair_i_rel_change"] == m["changes"]["dpo"]["chair_i_rel_change"]  # run 0 is the main run
    assert (out / "seeds" / "1" / "dpo" / "model" / "config.json").is_file()
    seed1 = json.loads((out / "seeds" / "1" / "dpo" / "stage.json").read_text())
    assert seed1["config"]["train"]["seed"] == 1
    vals = [r["recall_change_points"] for r in runs]
    assert m["seeds"]["dpo"]["mean"]["recall_change_points"] == pytest.approx(sum(vals) / 2)
    assert "## Training seeds" in (out / "report.md").read_text()
    capsys.readouterr()
    assert _run(cfg, out, "--seeds", "2") == 0
    assert capsys.readouterr().err.count("done earlier, skipped") == 2  # seed 1's dpo and eval_dpo
    assert _run(cfg, out, "--seeds", "0") == 2

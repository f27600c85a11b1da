"""The distillation benchmarks at tiny sizes: the evidence script end to end (and its gap-closed golden
values), and the TRL step-time comparison's two sides on a text-only causal LM."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

from tests.helpers.bench import BENCH, load_benchmark


def _load(name, monkeypatch):
    return load_benchmark(name)


def _units(hallucinated, mentions, covered, gt):
    n = len(gt)
    return {"hallucinated": hallucinated, "mentions": mentions, "covered": covered, "gt": gt,
            "words": [10.0] * n, "captions": [1.0] * n}  # fmt: skip


def test_gap_closed_golden(monkeypatch):
    ev = _load("distill_evidence", monkeypatch)
    # CHAIR_i: student 4/8 = 0.5, teacher 1/10 = 0.1, method 3/10 = 0.3 -> (0.5 - 0.3) / (0.5 - 0.1) = 0.5
    # recall: student 4/10, teacher 8/10, method 7/10 -> (0.7 - 0.4) / (0.8 - 0.4) = 0.75
    s = _units([2, 2], [4, 4], [2, 2], [5, 5])
    t = _units([1, 0], [5, 5], [4, 4], [5, 5])
    m = _units([2, 1], [5, 5], [3, 4], [5, 5])
    g = ev.gap_closed(s, t, m, n_boot=200)
    assert g["chair_i"]["value"] == pytest.approx(0.5) and g["recall"]["value"] == pytest.approx(0.75)
    assert g["chair_i"]["better_than_student"] and g["recall"]["better_than_student"]
    assert all(np.isfinite(g[k]["low"]) and g[k]["low"] <= g[k]["high"] for k in ("chair_i", "recall"))


def test_evidence_script_end_to_end(tmp_path, monkeypatch):
    from tests.helpers.eval_model import make_data_dir
    from tests.rl.test_distill_trainer import STUDENT_TEXT, TEACHER_TEXT, _save

    ev = _load("distill_evidence", monkeypatch)
    data = make_data_dir(tmp_path, split="train")
    student = _save(tmp_path / "s", seed=3, text=STUDENT_TEXT)
    teacher = _save(tmp_path / "t", seed=5, text=TEACHER_TEXT, budget=8)
    out = tmp_path / "ev"
    argv = ["--teacher", str(teacher), "--student", str(student), "--data", str(data), "--out", str(out),
            "--steps", "1", "--batch", "2", "--eval-notes", "2", "--eval-split", "train",
            "--max-new-tokens", "6"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert ev.main(argv) == 0
    result = json.loads((out / "evidence.json").read_text())
    assert set(result["scores"]) == {"student", "teacher", "opd_seed0", "kd_seed0"}
    assert set(result["gap_closed"]) == {"opd_seed0", "kd_seed0"}
    assert set(result["by_method"]) == {"opd", "kd"}
    assert set(result["minus_kd"]) == {"opd_seed0"} and set(result["minus_kd"]["opd_seed0"]) == {
        "chair_i",
        "recall",
    }
    assert result["scores"]["student"]["length"]["value"] >= 0
    assert (out / "opd_seed0" / "model" / "config.json").is_file()


def test_trl_benchmark_sides_train_the_same_text_model(tmp_path, monkeypatch):
    bench = _load("distill_vs_trl", monkeypatch)
    rl_bench = _load("rl_bench", monkeypatch)
    from transformers import Qwen2ForCausalLM

    _, tok = rl_bench.make_lm(tmp_path / "s", hidden=16, layers=1, seed=0)
    rl_bench.make_lm(tmp_path / "t", hidden=32, layers=1, seed=1)
    data = bench.Prompts(rl_bench.texts(4, 5, 0), rl_bench.texts(4, 6, 1))
    student = Qwen2ForCausalLM.from_pretrained(str(tmp_path / "s"))
    teacher = Qwen2ForCausalLM.from_pretrained(str(tmp_path / "t")).eval()
    before = [p.detach().clone() for p in student.parameters()]
    times = bench.ours(student, teacher, tok, data, batch=2, new=4, steps=2)
    assert len(times) == 2 and min(times) > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, student.parameters()))
    pytest.importorskip("trl")
    theirs = bench.trl(tmp_path / "s", tmp_path / "t", tok, data, batch=2, new=4, steps=2)
    assert len(theirs) == 2 and min(theirs) > 0


def test_gap_difference_is_paired_and_golden(monkeypatch):
    ev = _load("distill_evidence", monkeypatch)
    s = _units([2, 2], [4, 4], [2, 2], [5, 5])
    t = _units([1, 0], [5, 5], [4, 4], [5, 5])
    a = _units([2, 1], [5, 5], [3, 4], [5, 5])  # closes 0.5 (CHAIR_i) and 0.75 (recall)
    b = _units([2, 2], [5, 5], [3, 3], [5, 5])  # CHAIR_i 0.4 -> 0.25; recall 0.6 -> 0.5
    d = ev.gap_difference(s, t, a, b, n_boot=200)
    assert d["chair_i"]["value"] == pytest.approx(0.25) and d["recall"]["value"] == pytest.approx(0.25)
    same = ev.gap_difference(s, t, a, a, n_boot=200)  # the same resamples for both: exactly 0
    assert all(
        same[m]["value"] == 0 and same[m]["low"] == 0 == same[m]["high"] for m in ("chair_i", "recall")
    )


def _evidence(opd, kd):
    """An evidence.json with one opd and one kd run closing (CHAIR_i, recall) shares ``opd`` and ``kd``."""

    def g(c, r):
        return {"chair_i": {"value": c, "low": c - 0.1, "high": c + 0.1},
                "recall": {"value": r, "low": r - 0.1, "high": r + 0.1}}  # fmt: skip

    return {"gap_closed": {"opd_seed0": g(*opd), "kd_seed0": g(*kd)}}


def test_worlds_aggregate_golden_and_verdicts(monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(BENCH.parent))
    w = _load("distill_worlds", monkeypatch)
    worlds = {"0": _evidence((0.6, 0.5), (0.4, 0.3)), "1": _evidence((0.7, 0.6), (0.5, 0.2)),
              "2": _evidence((0.5, 0.4), (0.6, 0.1))}  # fmt: skip
    agg = w.aggregate(worlds)
    assert agg["mean"]["opd"]["chair_i"]["mean"] == pytest.approx(0.6)
    assert agg["mean"]["opd"]["recall"]["mean"] == pytest.approx(0.5)
    # t interval of (0.6, 0.7, 0.5): sd 0.1, t_0.975(2) = 4.303 -> half width 0.2484
    low, high = agg["mean"]["opd"]["chair_i"]["t95"]
    assert low == pytest.approx(0.6 - 0.2484, abs=1e-3) and high == pytest.approx(0.6 + 0.2484, abs=1e-3)
    assert agg["mean"]["opd_minus_kd"]["recall"]["mean"] == pytest.approx(0.3)
    assert [agg["per_world"][k]["holds"] for k in "012"] == [True, True, False]  # world 2: 0.4 < 0.5 recall
    assert agg["holds_at_mean"] and not agg["holds_every_world"]
    w.print_table(worlds, agg)
    assert "holds at the mean, does not hold in every world" in capsys.readouterr().out
    with pytest.raises(ValueError, match="needs opd and kd runs"):
        w.aggregate({"0": {"gap_closed": {"opd_seed0": worlds["0"]["gap_closed"]["opd_seed0"]}}})


def test_worlds_merge_runs_made_apart(monkeypatch):
    w = _load("distill_worlds", monkeypatch)
    ev = _load("distill_evidence", monkeypatch)
    s = _units([2, 2], [4, 4], [2, 2], [5, 5])
    t = _units([1, 0], [5, 5], [4, 4], [5, 5])
    a = _units([2, 1], [5, 5], [3, 4], [5, 5])
    b = _units([2, 2], [5, 5], [3, 3], [5, 5])
    merged = w.merge([{"units": {"student": s, "teacher": t, "opd_forward_seed0": a}},
                      {"units": {"student": s, "teacher": t, "kd_seed0": b}}])  # fmt: skip
    assert merged["gap_closed"]["opd_forward_seed0"]["chair_i"]["value"] == pytest.approx(0.5)
    assert merged["gap_closed"]["kd_seed0"]["recall"]["value"] == pytest.approx(0.5)
    assert merged["minus_kd"]["opd_forward_seed0"] == ev.gap_difference(s, t, a, b)
    agg = w.aggregate({"0": merged}, opd="opd_forward")
    assert agg["per_world"]["0"]["opd_minus_kd"]["chair_i"] == pytest.approx(0.25)
    other = _units([0, 0], [4, 4], [2, 2], [5, 5])
    with pytest.raises(ValueError, match="disagree on the student"):
        w.merge([{"units": {"student": s, "kd_seed0": b}}, {"units": {"student": other, "opd_seed0": a}}])

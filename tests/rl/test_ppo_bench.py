"""The PPO benchmarks: ppo_vs_grpo reusing finished runs (both run layouts) and its table over runs (golden
values); ppo_vs_trl's two sides on a text-only causal LM."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
import yaml

from tests.helpers.bench import load_benchmark


def _load(name, monkeypatch):
    return load_benchmark(name)


CONFIG = {"data": {"prompts_per_step": 2}, "rollout": {"group_size": 4}, "train": {"seed": 1}}
"""8 responses per step."""


def _pipeline_run(folder: Path, lengths: list[float], seconds: float) -> Path:
    """An ``rl pipeline`` stage folder: stage.json (config + metrics) and a GRPO metrics.jsonl."""
    (folder / "model").mkdir(parents=True)
    stage = {"stage": "grpo", "config": CONFIG, "metrics": {"train_seconds": seconds}}
    (folder / "stage.json").write_text(json.dumps(stage))
    recs = [
        {"step": i + 1, "response_len": n, "reward_mean": 0.1 * i, "entropy": 1.0}
        for i, n in enumerate(lengths)
    ]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return folder


def _cli_run(folder: Path, tokens: list[float], seconds: float) -> Path:
    """An ``rl ppo --out`` folder: config.yaml + result.json, metrics.jsonl with sampled_tokens."""
    (folder / "model").mkdir(parents=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(CONFIG))
    (folder / "result.json").write_text(json.dumps({"train_seconds": seconds}))
    recs = [
        {"step": i + 1, "sampled_tokens": n, "reward_mean": 0.2 * i, "entropy": 0.9}
        for i, n in enumerate(tokens)
    ]
    (folder / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    return folder


def _fake_eval(chair_i: dict[str, float]):
    """``evaluate_model`` returning a fixed CHAIR_i per model folder (keyed by the folder's parent name)."""

    def evaluate_model(folder, data, **kw):
        assert kw["batch_size"] == 64 and kw["max_new_tokens"] == 128 and kw["pope_splits"] == ()
        c = chair_i[Path(folder).parent.name]
        ci = {"low": c - 0.01, "high": c + 0.01}
        return {"chair": {"chair_i": c, "chair_s": 2 * c, "recall": 0.8, "mean_length": 40.0},
                "chair_intervals": {"chair_i": ci}}  # fmt: skip

    return evaluate_model


def test_reusing_a_pipeline_grpo_run_and_a_ppo_run(tmp_path, monkeypatch):
    bench = _load("ppo_vs_grpo", monkeypatch)
    import mm.eval.runners

    grpo = _pipeline_run(tmp_path / "world1" / "grpo", [10.0, 20.0], 30.0)
    ppo = _cli_run(tmp_path / "ppo_run", [100.0, 150.0], 40.0)
    (tmp_path / "sftrun" / "model").mkdir(parents=True)
    chair = {"sftrun": 0.2, "grpo": 0.05, "ppo_run": 0.08}
    monkeypatch.setattr(mm.eval.runners, "evaluate_model", _fake_eval(chair))
    out = tmp_path / "out"
    argv = ["--sft", str(tmp_path / "sftrun" / "model"), "--data", str(tmp_path), "--out", str(out),
            "--grpo-run", str(grpo), "--ppo-run", str(ppo), "--label", "world 1"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert bench.main(argv) == 0
    s = json.loads((out / "summary.json").read_text())
    assert s["label"] == "world 1" and (out / "curves.png").is_file()
    assert s["grpo"]["sampled_tokens"] == (10 + 20) * 8 and s["ppo"]["sampled_tokens"] == 250
    assert s["grpo"]["train_seconds"] == 30.0 and s["ppo"]["train_seconds"] == 40.0
    assert s["grpo"]["chair_i_cut"] == pytest.approx(0.75) and s["ppo"]["chair_i_cut"] == pytest.approx(0.6)
    assert s["cut_diff_points"] == pytest.approx(-15.0)
    assert not (out / "grpo").exists() and not (out / "ppo").exists()  # nothing trained


def test_an_unfinished_run_is_refused(tmp_path, monkeypatch):
    bench = _load("ppo_vs_grpo", monkeypatch)
    (tmp_path / "grpo" / "model").mkdir(parents=True)
    with pytest.raises(SystemExit, match="not a finished run"):
        bench.run_record(tmp_path / "grpo")
    with pytest.raises(ValueError, match="no hallucinations"):
        bench.chair_cut(0.0, 0.0)


def test_table_over_runs_golden(tmp_path, monkeypatch, capsys):
    bench = _load("ppo_vs_grpo", monkeypatch)
    # PPO - GRPO cuts in points: -10, 0, +4 -> mean -2, sd sqrt(52) = 7.2111, t(2) = 4.303:
    # half width 4.303 * 7.2111 / sqrt(3) = 17.915
    cuts = [(0.70, 0.60), (0.50, 0.50), (0.60, 0.64)]
    folders = []
    for i, (g, p) in enumerate(cuts):
        s = {
            "label": f"world {i}", "sft": {"chair_i": 0.1},
            "grpo": {"chair_i": 0.1 * (1 - g), "recall": 0.8, "chair_i_cut": g, "sampled_tokens": 1000.0},
            "ppo": {"chair_i": 0.1 * (1 - p), "recall": 0.8, "chair_i_cut": p, "sampled_tokens": 1100.0},
        }  # fmt: skip
        folders.append(tmp_path / f"w{i}")
        folders[-1].mkdir()
        (folders[-1] / "summary.json").write_text(json.dumps(s))
    summaries = {f"world {i}": json.loads((f / "summary.json").read_text()) for i, f in enumerate(folders)}
    rows = bench.table_rows(summaries)
    assert [r["cut_diff_points"] for r in rows] == pytest.approx([-10.0, 0.0, 4.0])
    means = bench.table(rows)
    d = means["cut_diff_points"]
    assert d["mean"] == pytest.approx(-2.0)
    assert d["interval"] == pytest.approx([-2.0 - 17.915, -2.0 + 17.915], abs=1e-3)
    assert means["tokens_ratio"]["mean"] == pytest.approx(1.1) and means["tokens_ratio"]["interval"] == [
        pytest.approx(1.1), pytest.approx(1.1)
    ]  # fmt: skip
    assert bench.main(["--table", *map(str, folders)]) == 0
    text = capsys.readouterr().out
    row = "| world 0 | 0.100 | 0.030 | 0.040 | 70.0% | 60.0% | -10.0 | 1,000 | 1,100 | 1.100 | 0.800 / 0.800"
    assert row in text
    assert "-2.0 [-19.9, +15.9]" in text
    with pytest.raises(SystemExit, match="summary.json is missing"):
        bench.main(["--table", str(tmp_path / "nowhere")])


def test_trl_benchmark_sides_train_the_same_text_model(tmp_path, monkeypatch):
    bench = _load("ppo_vs_trl", monkeypatch)
    rl_bench = _load("rl_bench", monkeypatch)
    from transformers import Qwen2ForCausalLM

    _, tok = rl_bench.make_lm(tmp_path / "lm", hidden=16, layers=1, seed=0)
    args = bench.argparse.Namespace(prompts=2, group=2, new_tokens=4, epochs=2, minibatches=2, steps=2)
    prompts = rl_bench.texts(4, 5, 0)
    model = Qwen2ForCausalLM.from_pretrained(str(tmp_path / "lm"))
    before = [p.detach().clone() for p in model.parameters()]
    times, length = bench.ours(model, tok, prompts, args)
    assert len(times) == 2 and min(times) > 0 and 1 <= length <= 4
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    pytest.importorskip("trl")
    theirs, their_length = bench.trl(tmp_path / "lm", tok, prompts, args)
    assert len(theirs) == 2 and min(theirs) > 0 and 1 <= their_length <= 4

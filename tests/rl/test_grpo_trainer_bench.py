"""The trainers' step functions on a text-only causal LM (the benchmark path), one step each."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "rl_bench.py"


def _bench():
    spec = importlib.util.spec_from_file_location("rl_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_text_only_dpo_and_grpo_steps_train(tmp_path):
    bench = _bench()
    model, tok = bench.make_lm(tmp_path / "lm", hidden=16, layers=1)
    before = [p.detach().clone() for p in model.parameters()]
    times = bench.ours_dpo(model, tok, bench.pair_data(4), batch=2, steps=2)
    assert len(times) == 2 and all(t > 0 for t in times)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    times, tps = bench.ours_grpo(model, tok, bench.texts(4, 5, 0), n_prompts=2, group=3, new=5, steps=1)
    assert len(times) == 1 and tps > 0
    assert bench.hf_generate_tps(model, tok, bench.texts(4, 5, 0), n_prompts=2, group=3, new=5, steps=1) > 0
    assert bench.median_after_warmup([5.0, 1.0, 3.0]) == 2.0

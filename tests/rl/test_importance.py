"""Truncated importance sampling: golden values, TRL's formula and loss, and the in-process engine's
recorded sampling log-probs (exactly no correction when it samples from the trainer's distribution)."""

from __future__ import annotations

import math

import pytest
import torch

from rl.importance import is_metrics, truncated_is_weights, weighted_advantages
from rl.losses import policy_loss


def trl_is_ratio(old, sampling, mask, *, mode, clip_max, clip_min=None):
    """TRL 1.16 ``GRPOTrainer._generate_and_score_completions``, the ``*_truncate`` branch, verbatim."""
    per_token_logps_diff = (old - sampling) * mask
    per_token_logps_diff = torch.nan_to_num(per_token_logps_diff, nan=0.0)
    if mode == "sequence_truncate":
        logps_diff = per_token_logps_diff.sum(dim=-1, keepdim=True)
    else:
        logps_diff = per_token_logps_diff
    ratio = torch.exp(logps_diff)
    return torch.clamp(ratio, min=clip_min, max=clip_max)


def test_golden_token_weights_by_hand():
    trainer = torch.tensor([[-1.0, -2.0, -0.5, -3.0], [-0.1, -0.2, -0.3, -0.4]], dtype=torch.float64)
    rollout = torch.tensor([[-1.5, -1.0, -0.5, -9.0], [-0.1, -0.9, -0.3, -0.4]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    w = truncated_is_weights(trainer, rollout, mask, cap=1.5)
    # exp(0.5) = 1.6487 -> cap 1.5; exp(-1) = 0.3679; exp(0) = 1; masked: 1; exp(0.7) = 2.0138 -> 1.5
    want = torch.tensor([[1.5, math.exp(-1.0), 1.0, 1.0], [1.0, 1.5, 1.0, 1.0]], dtype=torch.float64)
    assert w.dtype == torch.float64
    assert torch.equal(w, want)
    seq = truncated_is_weights(trainer, rollout, mask, cap=1.5, level="sequence")
    # row 0: 0.5 - 1.0 + 0 = -0.5 -> exp(-0.5) on every column; row 1: 0.7 -> exp(0.7) > cap
    assert torch.allclose(seq[0], torch.full((4,), math.exp(-0.5), dtype=torch.float64), atol=0, rtol=1e-15)
    assert torch.equal(seq[1], torch.full((4,), 1.5, dtype=torch.float64))


@pytest.mark.parametrize("level, mode", [("token", "token_truncate"), ("sequence", "sequence_truncate")])
def test_matches_trl_formula(level, mode):
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(5, 7, generator=g, dtype=torch.float64) * 3
    sampling = old + torch.randn(5, 7, generator=g, dtype=torch.float64) * 0.5
    sampling[1, 2] = float("nan")  # a log-prob the engine did not return: weight 1
    mask = (torch.rand(5, 7, generator=g) > 0.3).long()
    ours = truncated_is_weights(old, sampling, mask, cap=2.0, level=level)
    trl = trl_is_ratio(old, sampling, mask, mode=mode, clip_max=2.0)
    assert torch.equal(ours, trl.expand_as(ours))


def test_weighted_loss_equals_trl_per_token_loss_times_ratio():
    """TRL: ``per_token_loss = -min(r A, clip(r) A) * is_ratio``, token-mean; ours: policy_loss(A * w)."""
    g = torch.Generator().manual_seed(1)
    B, T = 4, 6
    old = -torch.rand(B, T, generator=g, dtype=torch.float64) * 2
    logps = (old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.3).requires_grad_(True)
    mu = old + torch.randn(B, T, generator=g, dtype=torch.float64) * 0.4
    mask = (torch.rand(B, T, generator=g) > 0.2).long()
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5], dtype=torch.float64)
    w = truncated_is_weights(old, mu, mask, cap=2.0)

    loss, _ = policy_loss(logps, old, weighted_advantages(adv, w), mask, eps_low=0.2, eps_high=0.28)
    (grad,) = torch.autograd.grad(loss, logps)

    lp = logps.detach().clone().requires_grad_(True)
    coef_1 = torch.exp(lp - old)
    coef_2 = torch.clamp(coef_1, 1 - 0.2, 1 + 0.28)
    per_token_loss = -torch.min(coef_1 * adv[:, None], coef_2 * adv[:, None])
    per_token_loss = per_token_loss * trl_is_ratio(old, mu, mask, mode="token_truncate", clip_max=2.0)
    ref = (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)  # TRL "dapo"/"bnpo": token mean
    (ref_grad,) = torch.autograd.grad(ref, lp)
    assert torch.allclose(loss, ref, atol=1e-12)
    assert torch.allclose(grad, ref_grad, atol=1e-12)


def test_equal_distributions_give_weights_exactly_one():
    x = -torch.rand(3, 5, dtype=torch.float64)
    w = truncated_is_weights(x, x.clone(), torch.ones(3, 5), cap=1.0)
    assert torch.equal(w, torch.ones(3, 5, dtype=torch.float64))
    assert is_metrics(w, torch.ones(3, 5), cap=2.0)["is_weight_mean"] == 1.0


def test_bad_inputs():
    x = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="same"):
        truncated_is_weights(x, torch.zeros(2, 4), x, cap=2.0)
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_is_weights(x, x, x, cap=0.0)
    with pytest.raises(ValueError, match="level"):
        truncated_is_weights(x, x, x, cap=2.0, level="batch")
    with pytest.raises(ValueError, match=">= 0"):
        weighted_advantages(torch.ones(2), -torch.ones(2, 3))
    with pytest.raises(ValueError, match="do not fit"):
        weighted_advantages(torch.ones(3), torch.ones(2, 3))


# ---------------------------------------------------------------- the in-process engine


def _filtered_logps(adapter, samples, comps, *, temperature, top_k, top_p):
    """What the engine should have recorded: log softmax of HF's warpers applied to the scoring forward."""
    from transformers import TopKLogitsWarper, TopPLogitsWarper

    rows = [s for s in samples for _ in range(len(comps.token_ids) // len(samples))]
    batch = adapter.answer_batch(rows, comps.token_ids)
    ids, resp = batch["input_ids"], batch["response_mask"]
    start = int(resp.any(0).nonzero()[0])
    inputs = {k: v for k, v in batch.items() if k != "response_mask"}
    if (pos := adapter.position_ids(batch)) is not None:
        inputs["position_ids"] = pos
    with torch.no_grad():
        logits = adapter.model(**inputs, use_cache=False).logits[:, start - 1 : -1].float()
    if (suppress := adapter.base_model.generation_config.suppress_tokens) is not None:
        logits[..., list(suppress)] = -float("inf")  # NoteVLM's `<image>`, as generation suppresses it
    logits = logits / temperature
    B, W, V = logits.shape
    flat = logits.reshape(B * W, V)
    if top_k:
        flat = TopKLogitsWarper(top_k)(None, flat)
    if top_p < 1:
        flat = TopPLogitsWarper(top_p)(None, flat)
    logp = torch.log_softmax(flat, -1).reshape(B, W, V).gather(-1, ids[:, start:, None]).squeeze(-1)
    return [logp[i, : len(t)].tolist() for i, t in enumerate(comps.token_ids)]


@pytest.mark.parametrize("family", ["qwen2_vl", "notevlm"])
def test_local_engine_records_the_sampling_distribution(tmp_path, family):
    from mm.model.adapter import Sample, load_adapter
    from rl.rollout import SamplingSpec, build_engine
    from tests.mm.adapter_helpers import build_family, random_image

    if family == "notevlm":
        from tests.helpers.eval_model import make_model_dir

        folder = make_model_dir(tmp_path)
    else:
        folder = build_family(family, tmp_path / family)
    adapter = load_adapter(folder)
    samples = [Sample(images=[random_image(24, 16, seed=i)], text=f"Describe image {i}.") for i in range(2)]

    torch.manual_seed(0)
    full = build_engine("local", adapter, SamplingSpec(group_size=2, max_new_tokens=4, temperature=0.8))
    assert full.exact and full.generate(samples).logps is None  # the trainer's distribution: no weights

    spec = SamplingSpec(group_size=3, max_new_tokens=5, temperature=0.7, top_k=6, top_p=0.9)
    engine = build_engine("local", adapter, spec)
    assert not engine.exact
    torch.manual_seed(1)
    comps = engine.generate(samples)
    assert len(comps.token_ids) == 6 and [len(x) for x in comps.logps] == [len(t) for t in comps.token_ids]
    want = _filtered_logps(adapter, samples, comps, temperature=0.7, top_k=6, top_p=0.9)
    for got, ref in zip(comps.logps, want):
        assert all(math.isfinite(v) and v <= 0 for v in got)
        assert torch.allclose(torch.tensor(got), torch.tensor(ref), atol=2e-5), (got, ref)


def _has_vllm() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _has_vllm(), reason="needs vLLM (the `vllm` extra) and a CUDA GPU")
def test_vllm_engine_logps_against_the_trainer(tmp_path):
    """vLLM samples G completions per prompt with its sampling log-probs; the trainer's log-probs of the
    same tokens differ only by kernel noise, so the truncated weights are close to 1 and within the cap."""
    from mm.model.adapter import Sample, load_adapter
    from rl.importance import truncated_is_weights
    from rl.rollout import SamplingSpec, build_engine
    from rl.trainers.grpo_files import adapter_token_logps, rollout_logps_window
    from tests.mm.adapter_helpers import build_family, random_image

    folder = build_family("qwen2_vl", tmp_path / "qwen2_vl")
    adapter = load_adapter(folder, device="cuda")
    spec = SamplingSpec(group_size=3, max_new_tokens=6, temperature=1.0)
    engine = build_engine("vllm", adapter, spec, model_dir=str(folder), gpu_memory_utilization=0.2)
    samples = [Sample(images=[random_image(32, 32, seed=i)], text="Describe the image.") for i in range(2)]
    comps = engine.generate(samples)
    assert len(comps.token_ids) == 6 and comps.logps is not None
    rows = [s for s in samples for _ in range(3)]
    batch = adapter.answer_batch(rows, comps.token_ids)
    with torch.no_grad():
        logps, mask, _ = adapter_token_logps(adapter.model, batch, adapter=adapter)
    mu = rollout_logps_window(comps.logps, logps.shape[1], logps.device)
    w = truncated_is_weights(logps, mu, mask, cap=3.0)
    assert bool((w > 0).all()) and bool((w <= 3.0).all())
    assert float((logps - mu)[mask.bool()].abs().max()) < 0.1
    engine.sync()  # the trainer's weights load into vLLM without error


@pytest.mark.parametrize("sets, corrected", [((), False), (("rollout.top_p=0.8",), True)])
def test_world_grpo_corrects_only_off_the_trainers_distribution(tmp_path, sets, corrected):
    """``rl grpo`` on notes: full support -> no weights (plain GRPO, unchanged); top-p -> TIS weights."""
    import json
    import warnings
    from pathlib import Path

    from rl.cli import main
    from tests.helpers.eval_model import make_data_dir, make_model_dir

    config = Path(__file__).resolve().parents[2] / "configs" / "rl" / "grpo_tiny.yaml"
    model, data = make_model_dir(tmp_path), make_data_dir(tmp_path, split="train")
    base = [f"init.model={model}", "data.prompts_per_step=2", "rollout.group_size=3",
            "rollout.max_new_tokens=5", "train.steps=1", "train.device=cpu",
            "algo.num_iterations=2"]  # fmt: skip
    out = tmp_path / "run"
    args = ["grpo", "--config", str(config), "--out", str(out), "--data", str(data), "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(args + [x for s in (*base, *sets) for x in ("--set", s)]) == 0
    (rec,) = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert ("is_weight_mean" in rec) == corrected
    if corrected:  # top-p renormalises the kept mass: pi_old / pi_sampling = kept mass <= 1
        assert 0 < rec["is_weight_min"] <= rec["is_weight_max"] <= 1.0 + 1e-5

"""Entropy-collapse remedies (rl.entropy): golden values, parity with a transcription of verl's Clip-Cov and
KL-Cov in float64, the forking-token mask, the entropy bonus, and a two-step `rl grpo` run per mode."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch

from rl.entropy import (
    clip_cov_loss,
    entropy_bonus,
    forking_mask,
    kl_cov_loss,
    remedied_policy_loss,
    sampled_entropy_surrogate,
)
from rl.losses import policy_loss
from rl.trainers.grpo_config import AlgoConfig, GRPOConfig
from tests.rl.test_grpo_trainer import GRPO_KEYS, _records, _run, dirs  # noqa: F401

D = torch.float64

# ------------------------------------------------------------- verl's reference, transcribed
# verl/trainer/ppo/core_algos.py compute_policy_loss_clip_cov / compute_policy_loss_kl_cov with
# agg_loss "token-mean" and verl_F.masked_mean, the config look-ups replaced by arguments.


def _verl_masked_mean(values, mask):
    return (values * mask).sum() / (mask.sum() + 1e-8)


def _verl_clip_cov(old_log_prob, log_prob, advantages, response_mask, cliprange_low, cliprange_high,
                   clip_cov_ratio=0.0002, clip_cov_lb=1.0, clip_cov_ub=5.0):  # fmt: skip
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    corr = torch.ones_like(advantages)
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - cliprange_low, 1 + cliprange_high)
    clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)
    cov_all = (advantages - _verl_masked_mean(advantages, response_mask)) * (
        log_prob - _verl_masked_mean(log_prob.detach(), response_mask)
    )
    cov_all[response_mask == 0] = -torch.inf
    cov_all[clip_by_origin] = -torch.inf
    clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
    top_k_idx = (cov_all < clip_cov_ub) & (cov_all > clip_cov_lb) & (response_mask > 0)
    top_k_idx = torch.nonzero(top_k_idx)
    if len(top_k_idx) > 0:
        perm = torch.randperm(len(top_k_idx))
        top_k_idx = top_k_idx[perm[: min(clip_num, len(top_k_idx))]]
    else:
        top_k_idx = torch.empty((0, 2), device=cov_all.device, dtype=torch.long)
    corr[top_k_idx[:, 0], top_k_idx[:, 1]] = 0
    pg_clipfrac = _verl_masked_mean((corr == 0).float(), response_mask)
    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    return _verl_masked_mean(pg_losses, response_mask), pg_clipfrac


def _verl_kl_cov(old_log_prob, log_prob, advantages, response_mask, kl_cov_ratio=0.0002, ppo_kl_coef=1.0):
    negative_approx_kl = log_prob - old_log_prob
    abs_kl = negative_approx_kl.abs()
    ratio = torch.exp(negative_approx_kl)
    ppo_kl_abs = _verl_masked_mean(negative_approx_kl.abs(), response_mask)
    pg_losses1 = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * abs_kl
    pg_losses = pg_losses1
    all_valid = response_mask > 0
    all_valid_idx = torch.nonzero(all_valid.reshape(-1), as_tuple=True)[0]
    all_valid_adv = advantages[all_valid].detach().reshape(-1).cpu()
    all_valid_logp = log_prob[all_valid].detach().reshape(-1).cpu()
    k = min(kl_cov_ratio, len(all_valid_adv))
    if k != 0:
        cov_lst_all = (all_valid_adv - all_valid_adv.mean()) * (all_valid_logp - all_valid_logp.mean())
        k_percent_nums = max(1, int(len(cov_lst_all) * kl_cov_ratio))
        large_cov_idxs = torch.topk(cov_lst_all, k_percent_nums, largest=True).indices
        if len(large_cov_idxs) != 0:
            large_cov_idxs = all_valid_idx[large_cov_idxs]
            rows, cols = large_cov_idxs // advantages.shape[1], large_cov_idxs % advantages.shape[1]
            pg_losses[rows, cols] = pg_losses_kl[rows, cols]
    return _verl_masked_mean(pg_losses, response_mask), ppo_kl_abs


def _batch(seed, B=8, T=64, per_token=True):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g, dtype=D) * 5  # (B, T) log-probs in [-5, 0]
    logps = old + 0.3 * torch.randn(B, T, generator=g, dtype=D)
    adv = torch.randn(B, T if per_token else 1, generator=g, dtype=D).expand(B, T).clone()
    lengths = torch.randint(T // 4, T + 1, (B,), generator=g)
    mask = (torch.arange(T)[None] < lengths[:, None]).to(D)  # (B, T)
    return logps, old, adv, mask


def _grad(fn, logps):
    x = logps.clone().requires_grad_(True)
    loss = fn(x)
    (g,) = torch.autograd.grad(loss, x)
    return loss.detach(), g


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("ratio, lb, ub", [(0.0002, 1.0, 5.0), (0.05, 1.0, 5.0), (0.2, 0.1, 2.0)])
def test_clip_cov_matches_verl(seed, ratio, lb, ub):
    logps, old, adv, mask = _batch(seed, per_token=seed % 2 == 0)
    torch.manual_seed(100 + seed)
    ref, g_ref = _grad(lambda x: _verl_clip_cov(old, x, adv, mask, 0.2, 0.28, ratio, lb, ub)[0], logps)
    torch.manual_seed(100 + seed)
    ours, g = _grad(lambda x: clip_cov_loss(x, old, adv, mask, eps_low=0.2, eps_high=0.28, ratio=ratio,
                                            lb=lb, ub=ub)[0], logps)  # fmt: skip
    torch.manual_seed(100 + seed)
    frac = clip_cov_loss(logps, old, adv, mask, eps_low=0.2, eps_high=0.28, ratio=ratio, lb=lb, ub=ub)[1]
    torch.manual_seed(100 + seed)
    frac_ref = _verl_clip_cov(old, logps, adv, mask, 0.2, 0.28, ratio, lb, ub)[1]
    assert abs(float(ours - ref)) < 1e-10
    assert torch.allclose(g, g_ref, atol=1e-10, rtol=0)
    assert abs(float(frac["clip_cov_frac"]) - float(frac_ref)) < 1e-10
    n = int(mask.sum())
    assert float(frac["clip_cov_frac"]) * n <= max(int(ratio * n), 1) + 1e-9


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("ratio, coef", [(0.0002, 1.0), (0.02, 1.0), (0.3, 0.5)])
def test_kl_cov_matches_verl(seed, ratio, coef):
    logps, old, adv, mask = _batch(seed, per_token=seed % 2 == 1)
    ref, g_ref = _grad(lambda x: _verl_kl_cov(old, x, adv, mask, ratio, coef)[0], logps)
    ours, g = _grad(lambda x: kl_cov_loss(x, old, adv, mask, ratio=ratio, kl_coef=coef)[0], logps)
    m = kl_cov_loss(logps, old, adv, mask, ratio=ratio, kl_coef=coef)[1]
    assert abs(float(ours - ref)) < 1e-10
    assert torch.allclose(g, g_ref, atol=1e-10, rtol=0)
    assert abs(float(m["approx_kl_abs"]) - float(_verl_kl_cov(old, logps, adv, mask, ratio, coef)[1])) < 1e-10
    n = int(mask.sum())
    assert round(float(m["kl_cov_frac"]) * n) == max(1, int(n * ratio))


# ------------------------------------------------------------------------------ golden values


def test_kl_cov_golden():
    # adv (1, 3) = [1, 0, -1], logps = [-1, -2, -3], old = [-1.5, -2, -2.5]; means 0 and -2, so the
    # covariances are [1, 0, 1]; ratio 0.34 of 3 tokens -> 1 token, the first of the tie (index 0).
    logps = torch.tensor([[-1.0, -2.0, -3.0]], dtype=D)
    old = torch.tensor([[-1.5, -2.0, -2.5]], dtype=D)
    adv = torch.tensor([[1.0, 0.0, -1.0]], dtype=D)
    mask = torch.ones(1, 3, dtype=D)
    loss, m = kl_cov_loss(logps, old, adv, mask, ratio=0.34, kl_coef=2.0)
    # per token: -1*e^0.5 + 2*0.5, 0, +1*e^-0.5
    want = (-math.exp(0.5) + 1.0 + math.exp(-0.5)) / 3
    assert abs(float(loss) - want) < 1e-12
    assert abs(float(m["kl_cov_frac"]) - 1 / 3) < 1e-12 and abs(float(m["approx_kl_abs"]) - 1 / 3) < 1e-12


def test_clip_cov_golden_drops_the_only_token_in_the_window():
    # covariances [1.5, 0, 1.5] with means 0 and -2 (adv [1.5, 0, -1.5], logps [-1, -2, -3]); ratios 1 so
    # nothing is clipped; window (1, 2) holds tokens 0 and 2 -> 1 of them dropped at random.
    logps = torch.tensor([[-1.0, -2.0, -3.0]], dtype=D)
    adv = torch.tensor([[1.5, 0.0, -1.5]], dtype=D)
    mask = torch.ones(1, 3, dtype=D)
    loss, m = clip_cov_loss(logps, logps.clone(), adv, mask, ratio=0.1, lb=1.0, ub=2.0,
                            generator=torch.Generator().manual_seed(0))  # fmt: skip
    # per token -A: [-1.5, 0, 1.5]; dropping one of the ends leaves +1.5 or -1.5, over 3 tokens
    assert abs(abs(float(loss)) - 0.5) < 1e-12 and abs(float(m["clip_cov_frac"]) - 1 / 3) < 1e-12
    none, m0 = clip_cov_loss(logps, logps.clone(), adv, mask, ratio=0.1, lb=3.0, ub=4.0)
    assert float(none) == 0.0 and float(m0["clip_cov_frac"]) == 0.0


def test_forking_mask_keeps_the_top_share_of_response_tokens():
    ent = torch.tensor([[0.1, 0.9, 0.5, 7.0], [0.8, 0.2, 0.3, 0.4]], dtype=D)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=D)  # 7.0 is padding: never kept
    got = forking_mask(ent, mask, 0.3)  # ceil(0.3 * 7) = 3 tokens: 0.9, 0.8, 0.5
    want = torch.tensor([[False, True, True, False], [True, False, False, False]])
    assert torch.equal(got, want)
    assert torch.equal(forking_mask(ent, mask, 1.0), mask.bool())
    assert int(forking_mask(ent, mask, 1e-6).sum()) == 1
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        forking_mask(ent, mask, 0.0)


def test_entropy_bonus_golden_and_sign_in_the_loss():
    ent = torch.tensor([[1.0, 2.0, 9.0], [3.0, 0.0, 0.0]], dtype=D)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=D)
    assert float(entropy_bonus(ent, mask)) == 2.0  # (1 + 2 + 3) / 3
    assert float(entropy_bonus(ent, mask, agg="seq-mean-token-mean")) == 2.25  # (1.5 + 3) / 2
    logps, old, adv, m = _batch(0, B=2, T=3)
    cfg = AlgoConfig(entropy_coef=0.1)
    base = remedied_policy_loss(logps, old, adv, m, ent, AlgoConfig())[0]
    with_bonus = remedied_policy_loss(logps, old, adv, m, ent, cfg)[0]
    assert abs(float(base - with_bonus) - 0.1 * float(entropy_bonus(ent, m))) < 1e-12


def test_sampled_entropy_surrogate_gradient_is_the_entropy_gradient_in_expectation():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, generator=g, dtype=D, requires_grad=True)
    logp = torch.log_softmax(logits, -1)  # (V,)
    exact = -(logp.exp() * logp).sum()
    (g_exact,) = torch.autograd.grad(exact, logits, retain_graph=True)
    # expectation over the sampled token y ~ p of the surrogate's gradient, summed exactly over y
    ent = exact.detach().expand(5)[None]  # (1, V): the same entropy at each "position"
    surr = sampled_entropy_surrogate(ent, logp[None])  # (1, V)
    assert torch.allclose(surr, ent)
    (g_surr,) = torch.autograd.grad((logp.exp().detach() * surr[0]).sum(), logits)
    assert torch.allclose(g_surr, g_exact, atol=1e-12)


# --------------------------------------------------------------------- wiring and bad inputs


def test_defaults_are_plain_policy_loss_bitwise():
    logps, old, adv, mask = _batch(3, per_token=False)
    ent = torch.rand(*logps.shape, dtype=D)
    cfg = AlgoConfig(eps_high=0.28, dual_clip=3.0)
    a = _grad(lambda x: remedied_policy_loss(x, old, adv, mask, ent, cfg)[0], logps)
    b = _grad(lambda x: policy_loss(x, old, adv, mask, eps_low=0.2, eps_high=0.28, dual_clip=3.0)[0], logps)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_forking_top_trains_only_on_the_kept_tokens():
    logps, old, adv, mask = _batch(4)
    ent = torch.rand(*logps.shape, dtype=D)
    cfg = AlgoConfig(forking_top=0.2)
    keep = forking_mask(ent, mask, 0.2)
    loss, g = _grad(lambda x: remedied_policy_loss(x, old, adv, mask, ent, cfg)[0], logps)
    assert (g[~keep] == 0).all() and (g[keep] != 0).any()
    want = policy_loss(logps, old, adv, keep.to(D))[0]
    assert float(loss) == float(want)
    m = remedied_policy_loss(logps, old, adv, mask, ent, cfg)[1]
    assert abs(float(m["forking_frac"]) - math.ceil(0.2 * mask.sum()) / float(mask.sum())) < 1e-12


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"loss_mode": "cov"}, "loss_mode"),
        ({"loss_mode": "kl_cov", "level": "sequence"}, "level=token"),
        ({"clip_cov_ratio": 0.0}, "clip_cov_ratio"),
        ({"clip_cov_lb": 5.0}, "clip_cov_lb < algo.clip_cov_ub"),
        ({"entropy_coef": -0.1}, "entropy_coef"),
        ({"forking_top": 0.0}, "forking_top"),
        ({"forking_top": 1.5}, "forking_top"),
        ({"ppo_kl_coef": -1.0}, "ppo_kl_coef"),
    ],
)
def test_config_errors(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AlgoConfig(**kwargs)


def test_kl_cov_needs_two_updates_per_rollout():
    # one update: old log-probs == current, so |log pi - log pi_old| is 0 and so is its gradient
    logps, old, adv, mask = _batch(0, B=2, T=4)
    x = logps.clone().requires_grad_(True)
    penalised = kl_cov_loss(x, x.detach(), adv, mask, ratio=1.0, kl_coef=10.0)[0]
    (g_pen,) = torch.autograd.grad(penalised, x)
    (g_off,) = torch.autograd.grad(kl_cov_loss(x, x.detach(), adv, mask, ratio=1.0, kl_coef=0.0)[0], x)
    assert torch.equal(g_pen, g_off)
    with pytest.raises(ValueError, match="num_iterations >= 2"):
        GRPOConfig(algo=AlgoConfig(loss_mode="kl_cov"))
    assert GRPOConfig(algo=AlgoConfig(loss_mode="kl_cov", num_iterations=2)).algo.num_iterations == 2


def test_bad_inputs_say_what_is_wrong():
    logps, old, adv, mask = _batch(0, B=2, T=4)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        clip_cov_loss(logps, old[:, :3], adv, mask)
    with pytest.raises(ValueError, match="advantages"):
        kl_cov_loss(logps, old, adv[:, :2], mask)
    with pytest.raises(ValueError, match="ratio > 0"):
        kl_cov_loss(logps, old, adv, mask, ratio=0.0)
    with pytest.raises(ValueError, match="lb < ub"):
        clip_cov_loss(logps, old, adv, mask, lb=2.0, ub=1.0)
    with pytest.raises(ValueError, match="loss_mode"):
        cfg = SimpleNamespace(**{**dataclasses.asdict(AlgoConfig()), "loss_mode": "x"})  # skips the checks
        remedied_policy_loss(logps, old, adv, mask, mask, cfg)


# ------------------------------------------------------------------------------ `rl grpo` runs


@pytest.mark.parametrize(
    "sets, key",
    [
        (("algo.loss_mode=clip_cov", "algo.clip_cov_ratio=0.2", "algo.clip_cov_lb=0.0"), "clip_cov_frac"),
        (("algo.loss_mode=kl_cov", "algo.kl_cov_ratio=0.2", "algo.num_iterations=2"), "kl_cov_frac"),
        (("algo.entropy_coef=0.01", "algo.forking_top=0.2"), "forking_frac"),
    ],
)
def test_two_grpo_steps_per_remedy(tmp_path, dirs, sets, key):  # noqa: F811
    out = tmp_path / "run"
    pen = ("algo.overlong_penalty=true", "algo.overlong_cache=6")
    assert _run(dirs, out, *pen, *sets) == 0
    recs = _records(out)
    assert [r["step"] for r in recs] == [1, 2]
    for k in (*GRPO_KEYS, key):
        assert k in recs[-1] and math.isfinite(recs[-1][k]), k
    assert 0 < recs[-1][key] <= 1

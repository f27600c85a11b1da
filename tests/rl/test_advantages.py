"""Advantages: GRPO group/batch/none scaling and RLOO against TRL 1.16's formulas (they live inside
TRL trainer methods that also generate, so the formulas are reproduced from grpo_trainer.py /
rloo_trainer.py here, using TRL's own ``nanstd``); GAE against a cleanrl-style loop and verl's
masked (skip mask-0 positions) semantics; masked whitening against verl's formula."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from trl.trainer.utils import nanstd

from rl.advantages import (
    gae,
    group_advantages,
    group_reward_std,
    masked_mean,
    masked_var,
    masked_whiten,
    rloo_advantages,
)


@pytest.fixture(autouse=True)
def _float64():
    """Golden and parity checks run in float64; the default dtype is restored for other test modules."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _trl_grpo_advantages(rewards, n, scale):
    """TRL 1.16 GRPOTrainer._generate_and_score_completions, sum_then_normalize branch."""
    mean = rewards.view(-1, n).mean(dim=1).repeat_interleave(n, dim=0)
    if scale in ("group", "none"):
        std = nanstd(rewards.view(-1, n), dim=1).repeat_interleave(n, dim=0)
    else:
        std = nanstd(rewards).expand_as(rewards)
    adv = rewards - mean
    return adv / (std + 1e-4) if scale != "none" else adv


def _trl_rloo_advantages(rewards, n):
    """TRL 1.16 RLOOTrainer: leave-one-out baseline over the other completions of the prompt."""
    grouped = rewards.view(-1, n)
    baselines = (grouped.sum(dim=1, keepdim=True) - grouped) / (n - 1)
    return rewards - baselines.view(-1)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_group_advantages_equal_trl(scale):
    g = torch.Generator().manual_seed(0)
    rewards = torch.randn(24, generator=g)
    ours = group_advantages(rewards, group_size=4, scale=scale)
    assert torch.allclose(ours, _trl_grpo_advantages(rewards, 4, scale), atol=1e-6, rtol=0)


def test_group_advantages_golden():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0])  # second group all equal
    adv = group_advantages(r, group_size=4, scale="group", eps=0.0)
    std = (1 / 3) ** 0.5  # unbiased std of [1, 0, 0, 1]
    assert torch.allclose(adv, torch.tensor([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]) / std)
    assert group_advantages(r, group_size=4, scale="none").tolist() == [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0]


def test_all_equal_rewards_give_exact_zero_advantages():
    r = torch.full((6,), 0.1)  # mean of 0.1s is not exactly 0.1 in floating point
    for scale in ("group", "batch", "none"):
        adv = group_advantages(r, group_size=3, scale=scale)
        assert torch.equal(adv, torch.zeros(6)) and not adv.isnan().any()
    assert torch.equal(group_reward_std(r, group_size=3), torch.zeros(2))
    assert torch.equal(group_advantages(torch.tensor([3.0, 5.0]), group_size=1), torch.zeros(2))


def test_rloo_equals_trl_and_verl():
    g = torch.Generator().manual_seed(1)
    rewards = torch.randn(12, generator=g)
    ours = rloo_advantages(rewards, group_size=4)
    assert torch.allclose(ours, _trl_rloo_advantages(rewards, 4), atol=1e-12)
    grouped = rewards.view(-1, 4)
    verl = (grouped - grouped.mean(1, keepdim=True)) * 4 / 3  # verl compute_rloo_outcome_advantage
    assert torch.allclose(ours, verl.view(-1), atol=1e-12)
    assert torch.equal(rloo_advantages(rewards, group_size=1), torch.zeros(12))


def test_group_size_must_divide_batch():
    with pytest.raises(ValueError, match="multiple of group_size"):
        group_advantages(torch.zeros(5), group_size=2)
    with pytest.raises(ValueError, match="scale must be"):
        group_advantages(torch.zeros(4), group_size=2, scale="std")


def _cleanrl_gae(rewards, values, gamma, lam):
    """cleanrl ppo.py's GAE loop for one episode that terminates after the last step."""
    n = len(rewards)
    adv = [0.0] * n
    lastgaelam = 0.0
    for t in reversed(range(n)):
        nextnonterminal = 0.0 if t == n - 1 else 1.0
        nextvalues = 0.0 if t == n - 1 else values[t + 1]
        delta = rewards[t] + gamma * nextvalues * nextnonterminal - values[t]
        adv[t] = lastgaelam = delta + gamma * lam * nextnonterminal * lastgaelam
    return adv


def test_gae_equals_cleanrl_loop():
    g = torch.Generator().manual_seed(2)
    rewards, values = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)
    adv, ret = gae(rewards, values, torch.ones(3, 7), gamma=0.99, lam=0.95)
    for i in range(3):
        ref = torch.tensor(_cleanrl_gae(rewards[i].tolist(), values[i].tolist(), 0.99, 0.95))
        assert torch.allclose(adv[i], ref, atol=1e-12)
    assert torch.allclose(ret, adv + values)


def test_gae_skips_masked_positions_like_verl():
    """verl's masked GAE == plain GAE on the response tokens alone (tool tokens cut out)."""
    g = torch.Generator().manual_seed(3)
    rewards, values = torch.randn(2, 8, generator=g), torch.randn(2, 8, generator=g)
    mask = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 1], [1, 0, 1, 1, 1, 0, 0, 0]])
    adv, _ = gae(rewards, values, mask, gamma=0.9, lam=0.8)
    for i in range(2):
        keep = mask[i].bool()
        ref = torch.tensor(_cleanrl_gae(rewards[i, keep].tolist(), values[i, keep].tolist(), 0.9, 0.8))
        assert torch.allclose(adv[i, keep], ref, atol=1e-12)
    # a masked position carries the advantage of the next response token (0 after the last one)
    assert adv[0, 2] == adv[0, 4] and adv[0, 6] == adv[0, 7]
    assert torch.equal(adv[1, 5:], torch.zeros(3))


def test_gae_golden():
    # gamma = lam = 1: A_t = sum of future rewards - V_t
    adv, ret = gae(
        torch.tensor([[0.0, 0.0, 1.0]]), torch.tensor([[0.5, 0.5, 0.5]]), torch.ones(1, 3), gamma=1, lam=1
    )
    assert adv.tolist() == [[0.5, 0.5, 0.5]] and ret.tolist() == [[1.0, 1.0, 1.0]]


def _verl_masked_whiten(values, mask):
    def mmean(v, m):
        return (v * m).sum() / (m.sum() + 1e-8)

    mean = mmean(values, mask)
    var = mmean((values - mean) ** 2, mask) * mask.sum() / (mask.sum() - 1)
    return (values - mean) * torch.rsqrt(var + 1e-8)


def test_masked_whiten_equals_verl_and_edge_cases():
    g = torch.Generator().manual_seed(4)
    values = torch.randn(3, 5, generator=g) * 4 + 2
    mask = (torch.rand(3, 5, generator=g) > 0.3).long()
    out = masked_whiten(values, mask)
    assert torch.allclose(out, _verl_masked_whiten(values, mask), atol=1e-6)
    assert abs(masked_mean(out, mask).item()) < 1e-9
    assert masked_var(out, mask).item() == pytest.approx(1.0, abs=1e-6)
    assert torch.allclose(masked_whiten(values, mask, shift_mean=False) - masked_mean(values, mask), out)
    assert torch.equal(masked_whiten(values, torch.zeros_like(mask)), torch.zeros_like(values))
    single = torch.zeros_like(mask)
    single[0, 0] = 1
    assert not masked_whiten(values, single).isnan().any()


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.sampled_from([0.0, 0.25, 0.5, 1.0, -1.0, 1e6]), min_size=8, max_size=8),
    st.sampled_from(["group", "batch", "none"]),
)
def test_group_advantages_properties(values, scale):
    """Finite, zero-mean within each group, and exactly zero for all-equal groups."""
    rewards = torch.tensor(values, dtype=torch.float64)
    adv = group_advantages(rewards, group_size=4, scale=scale)
    assert torch.isfinite(adv).all()
    grouped = adv.view(2, 4)
    assert torch.allclose(grouped.mean(1), torch.zeros(2), atol=1e-6 * max(1.0, adv.abs().max().item()))
    for g in range(2):
        if len(set(values[4 * g : 4 * g + 4])) == 1:
            assert torch.equal(grouped[g], torch.zeros(4))

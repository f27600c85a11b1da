"""rl ppo's pure pieces and critic: per-token rewards, explained variance, minibatch plan, the value head
(shapes, where gradients flow, save/load), and one PPO update against a float64 hand computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rl.advantages import gae, masked_whiten
from rl.trainers.grpo_config import DataConfig, RolloutConfig
from rl.trainers.ppo import ppo_loss
from rl.trainers.ppo_config import PPOConfig, PPOSection
from rl.trainers.ppo_math import explained_variance, last_token_index, minibatch_plan, token_rewards
from rl.trainers.value_head import ActorCritic, load_value_head, save_value_head, value_head
from tests.helpers.model import tiny_model, tiny_processor

P, R = 3, 4
"""Prompt and response widths of the fixed rollout."""


def test_token_rewards_golden():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    credits = torch.tensor([[0.1, 0.0, 0.2, 9.0], [0.5, 9.0, 9.0, 9.0]])  # 9 off the mask: ignored
    kl = torch.tensor([[0.1, 0.1, 0.1, 0.1], [0.2, 0.2, 0.2, 0.2]])
    r = token_rewards(torch.tensor([1.0, -2.0]), mask, credits=credits, kl=kl, kl_coef=0.5)
    want = torch.tensor([[0.05, -0.05, 1.15, 0.0], [-1.6, 0.0, 0.0, 0.0]])
    assert torch.allclose(r, want, atol=1e-6)
    assert last_token_index(torch.tensor([[1, 1, 0], [0, 0, 0]])).tolist() == [1, -1]
    with pytest.raises(ValueError, match="credits must be"):
        token_rewards(torch.zeros(2), mask, credits=torch.zeros(2, 3))


def test_explained_variance_golden_and_cleanrl_parity():
    values = torch.tensor([[1.0, 2.0, 2.5, 100.0]])
    returns = torch.tensor([[1.0, 3.0, 2.0, -50.0]])  # the masked-out column must not count
    mask = torch.tensor([[1, 1, 1, 0]])
    ev = explained_variance(values, returns, mask)
    assert ev == pytest.approx(5 / 12, abs=1e-12)  # Var(r - v) = 7/12, Var(r) = 1 (both unbiased)
    y, v = np.array([1.0, 3.0, 2.0]), np.array([1.0, 2.0, 2.5])
    assert ev == pytest.approx(1 - np.var(y - v) / np.var(y), abs=1e-12)  # cleanrl's formula
    assert explained_variance(returns, returns, mask) == 1.0
    assert math.isnan(explained_variance(values, torch.ones(1, 4), mask))


def test_minibatch_plan_covers_each_row_once_per_epoch():
    plan = minibatch_plan(8, epochs=3, minibatches=2, seed=5)
    assert len(plan) == 6 and all(len(p) == 4 for p in plan)
    for e in range(3):
        assert sorted(torch.cat(plan[2 * e : 2 * e + 2]).tolist()) == list(range(8))
    again = minibatch_plan(8, epochs=3, minibatches=2, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(plan, again))
    assert not torch.equal(torch.cat(plan[:2]), torch.cat(plan[2:4]))  # a fresh permutation per epoch
    with pytest.raises(ValueError, match="equal minibatches"):
        minibatch_plan(6, epochs=1, minibatches=4, seed=0)


def _rollout() -> dict[str, torch.Tensor]:
    """Three left-padded prompts (P=3) and responses of 4, 2 and 3 tokens (R=4), ids off the special ones."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 64, (3, P + R), generator=g)
    resp = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]])
    prompt = torch.tensor([[0, 1, 1], [1, 1, 1], [1, 1, 1]])
    ids = ids.masked_fill(torch.cat([prompt, resp], 1) == 0, 0)
    return {
        "input_ids": ids,
        "attention_mask": torch.cat([prompt, resp], 1),
        "response_mask": torch.cat([torch.zeros_like(prompt), resp], 1),
    }


def _actor_critic(separate: bool = False, dtype=torch.float32) -> ActorCritic:
    torch.manual_seed(0)
    head = value_head(32)
    critic = tiny_model(seed=4).train() if separate else None
    ac = ActorCritic(policy=tiny_model(seed=3).train(), head=head, critic=critic)
    return ac.to(dtype)


@pytest.mark.parametrize("separate", [False, True], ids=["shared", "separate"])
def test_value_head_shapes_and_where_gradients_flow(separate):
    ac, batch = _actor_critic(separate), _rollout()
    logps, mask, entropy, values = ac(batch, with_entropy=True)
    assert logps.shape == mask.shape == entropy.shape == values.shape == (3, R)
    assert torch.allclose(ac.values(batch), values, atol=1e-6)  # the values-only forward agrees
    trunk = ac.policy if not separate else ac.critic
    attn = batch["attention_mask"]
    out = trunk(input_ids=batch["input_ids"], attention_mask=attn, output_hidden_states=True,
                position_ids=(attn.cumsum(-1) - 1).clamp(min=0))  # fmt: skip
    want = ac.head(out.hidden_states[-1][:, P - 1 : -1]).squeeze(-1)  # state before each response token
    assert torch.allclose(values, want, atol=1e-6)

    def grads(module):
        return {n for n, p in module.named_parameters() if p.grad is not None and p.grad.abs().sum() > 0}

    (values * mask).sum().backward()
    assert grads(ac.head) == {"weight", "bias"}
    assert "lm_head.weight" not in grads(ac.policy)
    if separate:
        assert not grads(ac.policy) and any("layers" in n for n in grads(ac.critic))
    else:
        assert any("layers" in n for n in grads(ac.policy))  # the value loss trains the shared trunk
    ac.zero_grad(set_to_none=True)
    logps, *_ = ac(batch)
    logps.sum().backward()
    assert not grads(ac.head) and "lm_head.weight" in grads(ac.policy)
    if separate:
        assert not grads(ac.critic)


def test_value_head_saves_and_loads_beside_the_model(tmp_path):
    ac = _actor_critic(separate=True)
    save_value_head(ac, tiny_processor(), tmp_path, lora=False)
    head, critic = load_value_head(tmp_path)
    assert torch.equal(head.weight, ac.head.weight) and torch.equal(head.bias, ac.head.bias)
    a, b = ac.critic.state_dict(), critic.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(Exception, match="no value head"):
        load_value_head(tmp_path / "critic")


def test_one_ppo_update_equals_a_hand_computation_in_float64():
    ac, batch = _actor_critic(dtype=torch.float64), _rollout()
    gamma, lam, coef, clip, vf_coef, wc = 0.9, 0.8, 0.7, 0.05, 0.3, 0.2
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        logps, mask, _, values = ac(batch)
    old = logps + 0.3 * torch.randn(3, R, generator=g, dtype=torch.float64) * mask  # ratios off 1: some clip
    old_values = values + 0.1 * torch.randn(3, R, generator=g, dtype=torch.float64)
    scores = torch.tensor([1.0, -0.5, 0.3], dtype=torch.float64)
    credits = torch.randn(3, R, generator=g, dtype=torch.float64)
    r = token_rewards(scores, mask, credits=coef * credits)
    adv, returns = gae(r, old_values, mask, gamma=gamma, lam=lam)
    prepared = {
        "rows": batch, "old": old, "values": old_values, "adv": masked_whiten(adv, mask), "returns": returns,
        "ref": None, "weights": None,
    }  # fmt: skip
    cfg = PPOConfig(
        data=DataConfig(prompts_per_step=1), rollout=RolloutConfig(group_size=3, max_new_tokens=R),
        ppo=PPOSection(gamma=gamma, lam=lam, epochs=1, minibatches=1, vf_coef=vf_coef, vf_clip=clip),
    )  # fmt: skip
    loss, metrics = ppo_loss(ac, prepared, cfg)

    # by hand, token by token
    ids, attn = batch["input_ids"], batch["attention_mask"]
    out = ac.policy(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                    output_hidden_states=True)  # fmt: skip
    lengths = mask.sum(-1).tolist()
    tokens = []  # (row, t, logp, value, reward)
    for i in range(3):
        for t in range(lengths[i]):
            c = P + t
            lp = torch.log_softmax(out.logits[i, c - 1], -1)[ids[i, c]]
            v = ac.head(out.hidden_states[-1][i, c - 1]).squeeze()
            rew = coef * float(credits[i, t]) + (float(scores[i]) if t == lengths[i] - 1 else 0.0)
            tokens.append((i, t, lp, v, rew))
    advs, rets = {}, {}
    for i in range(3):
        nxt_v, nxt_a = 0.0, 0.0
        for t in reversed(range(lengths[i])):
            rew = next(x[4] for x in tokens if x[:2] == (i, t))
            delta = rew + gamma * nxt_v - float(old_values[i, t])
            nxt_a = delta + gamma * lam * nxt_a
            nxt_v = float(old_values[i, t])
            advs[i, t], rets[i, t] = nxt_a, nxt_a + nxt_v
    a = np.array(list(advs.values()))
    mean, var = a.mean(), a.var(ddof=1)
    pg, vl = 0.0, 0.0
    for i, t, lp, v, _ in tokens:
        A = (advs[i, t] - mean) / math.sqrt(var + 1e-8)
        ratio = torch.exp(lp - old[i, t])
        pg = pg + torch.maximum(-A * ratio, -A * ratio.clamp(1 - wc, 1 + wc))
        v_clip = old_values[i, t] + (v - old_values[i, t]).clamp(-clip, clip)
        vl = vl + torch.maximum((v - rets[i, t]) ** 2, (v_clip - rets[i, t]) ** 2)
    n = len(tokens)
    want = pg / n + vf_coef * 0.5 * vl / n
    assert (
        float(metrics["value_clip_frac"]) > 0
        and float(metrics["clip_frac_high"]) + float(metrics["clip_frac_low"]) > 0
    )  # both clips are exercised
    assert float(metrics["value_loss"]) == pytest.approx(float(0.5 * vl.detach() / n), abs=1e-12)
    assert float(loss.detach()) == pytest.approx(float(want.detach()), abs=1e-12)
    (g_lib,) = torch.autograd.grad(loss, ac.head.weight)
    (g_hand,) = torch.autograd.grad(want, ac.head.weight)
    assert torch.allclose(g_lib, g_hand, atol=1e-12)


def test_head_and_separate_critic_learn_at_their_own_rate():
    from rl.trainers.common import OptimConfig
    from rl.trainers.ppo import optimizer_groups

    ac = _actor_critic(separate=True)
    cfg = PPOConfig(optim=OptimConfig(lr=1e-4), ppo=PPOSection(critic_lr_scale=10.0))
    groups = optimizer_groups(ac, cfg)
    fast = {id(p) for g in groups if g.get("lr") == pytest.approx(1e-3) for p in g["params"]}
    slow = {id(p) for g in groups if "lr" not in g for p in g["params"]}
    critic = {id(p) for p in [*ac.head.parameters(), *ac.critic.parameters()] if p.requires_grad}
    assert fast == critic and slow == {id(p) for p in ac.policy.parameters() if p.requires_grad}

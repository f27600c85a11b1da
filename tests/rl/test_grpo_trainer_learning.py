"""The step functions move a tiny LM the right way: GRPO raises a token-level reward, DPO the margin."""

from __future__ import annotations

import torch

from rl.advantages import group_advantages
from rl.trainers.common import Reference
from rl.trainers.dpo import LossConfig, dpo_step
from rl.trainers.grpo import AlgoConfig, grpo_loss
from rl.trainers.rollout import generate_rollout

EOS, PAD, GOOD = 7, 0, 3


def _lm(seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=8, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    return Qwen2ForCausalLM(cfg)


def test_grpo_raises_the_rewarded_token_frequency():
    lm = _lm()
    opt = torch.optim.AdamW(lm.parameters(), lr=0.03)
    algo = AlgoConfig(eps_low=0.2, eps_high=0.28, beta=0.0)
    prompts = {
        "input_ids": torch.tensor([[1, 2], [4, 5]]),
        "attention_mask": torch.ones(2, 2, dtype=torch.long),
    }
    fracs = []
    for _ in range(15):
        roll = generate_rollout(lm, prompts, group_size=6, max_new_tokens=6, eos_id=EOS, pad_id=PAD)
        resp = roll.response_ids()
        rewards = torch.tensor([sum(t == GOOD for t in r) / len(r) for r in resp])
        fracs.append(float(rewards.mean()))
        loss, _ = grpo_loss(lm, roll.batch(), group_advantages(rewards, group_size=6), algo, horizon=6)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert sum(fracs[-3:]) / 3 > sum(fracs[:3]) / 3 + 0.2, fracs


def test_dpo_step_separates_chosen_from_rejected():
    lm = _lm(1)
    ref = Reference(model=lm, needed=True)
    opt = torch.optim.AdamW(lm.parameters(), lr=0.01)
    ids = torch.tensor([[1, 2, 3, 3, EOS], [1, 2, 5, 6, EOS]])  # chosen row 0, rejected row 1
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "response_mask": torch.tensor([[0, 0, 1, 1, 1], [0, 0, 1, 1, 1]]),
        "num_pairs": 1,
    }
    margins = []
    for _ in range(10):
        loss, m = dpo_step(lm, ref, batch, LossConfig(beta=0.5))
        margins.append(float(m["reward_margin"]))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert abs(margins[0]) < 1e-6 and margins[-1] > 0.5, margins

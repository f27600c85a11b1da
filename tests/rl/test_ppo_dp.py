"""`rl ppo` data parallel: 2 gloo processes == 1 process on the global batch (weights and value head at every
step, logged metrics, the saved model), data parallel and FSDP; the shard helpers' bookkeeping."""

from __future__ import annotations

import pytest
import torch

from rl.advantages import masked_whiten
from rl.trainers.ppo_math import minibatch_plan
from rl.trainers.ppo_shard import WHOLE, local_plan, rollout_means, update_shares, whiten
from tests.helpers.eval_model import make_data_dir, make_model_dir
from tests.helpers.launch import EPS, checkpoints, moved, one_and_two, same_records, same_weights
from tests.rl.test_ppo_trainer import CONFIG

COMPARED = (
    "loss", "reward_mean", "reward_std", "adv_std", "entropy", "policy_loss", "value_loss",
    "explained_variance", "clip_frac_low", "clip_frac_high", "approx_kl", "kl", "response_len",
    "truncated_frac", "sampled_tokens", "token_reward_sum", "value_mean", "return_mean", "mention_credit_abs",
)  # fmt: skip
"""Logged metrics that must be the global batch's under 2 processes. Not ``value_clip_frac``: it counts the
tokens whose clipped value loss beats the plain one (as TRL and verl), and at the first update, where the
values equal the old ones, the two differ by one ulp of ``old + (v - old)`` either way, so a differently
batched forward flips such ties."""
SETS = [
    "data.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=6", "train.steps=2",
    "train.checkpoint_every=1", "train.keep_last=5", "optim.lr=0.001", "algo.overlong_penalty=true",
    "algo.overlong_cache=6", "algo.beta=0.05", "algo.kl_estimator=k3", "ppo.epochs=2", "ppo.minibatches=2",
    "train.device=cpu", "train.threads=1", EPS,
]  # fmt: skip


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ppo_dp")
    return make_model_dir(root), make_data_dir(root, split="train")


def test_the_compared_plan_gives_a_rank_no_row_of_some_minibatch():
    """The runs below take the stand-in path: a minibatch whose 2 rows both sit on one rank's half."""
    lone = 0
    for step in (0, 1):
        for rows in minibatch_plan(4, epochs=2, minibatches=2, seed=step):  # train.seed 0
            lone += int(all(r < 2 for r in rows.tolist()) or all(r >= 2 for r in rows.tolist()))
    assert lone > 0


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True])
def test_two_processes_equal_one(tmp_path, dirs, fsdp):
    """torchrun, 2 ranks x 1 prompt == 1 process x 2 prompts: the KL reward to a frozen copy, per-mention
    credit, GAE, advantages whitened over both ranks' tokens, 2 epochs x 2 minibatches cut from the global
    rows (some wholly on one rank), losses normalised by each minibatch's global counts."""
    model, data = dirs
    args = ["ppo", "--config", str(CONFIG), "--data", str(data), "--no-progress"]
    args += [x for s in [f"init.model={model}", *SETS] for x in ("--set", s)]
    one, two, stdout = one_and_two(tmp_path, args, fsdp=fsdp)
    assert stdout.count('"critic"') == 1  # rank 0 alone reports
    same_records(one, two, COMPARED, 2)
    first, last, _ = same_weights(one, two, [*checkpoints(2), "model/model.safetensors"])
    assert "head.weight" in first
    moved(first, last)
    head_a, head_b = torch.load(one / "value_head.pt"), torch.load(two / "value_head.pt")
    assert all(torch.allclose(head_a[k], head_b[k], atol=1e-5) for k in head_a)


def test_shard_helpers_alone_are_the_identity():
    """One process: the whole plan, weights exactly 1, masked_whiten's values, the one-process means."""
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 0, 0], [1, 0, 0]])  # (4, 3), one empty response
    plan = minibatch_plan(4, epochs=2, minibatches=2, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(local_plan(plan, lo=0, hi=4), plan))
    assert update_shares(plan, mask, agg="token-mean", world=1) == [WHOLE] * 4
    adv = torch.randn(4, 3, dtype=torch.float64)
    assert torch.allclose(whiten(adv, mask, world=1), masked_whiten(adv, mask), atol=1e-12)
    assert torch.equal(whiten(adv, torch.zeros_like(mask), world=1), torch.zeros_like(adv))
    values, returns, r = torch.randn(3, 4, 3, dtype=torch.float64).unbind(0)
    m = mask.double()
    got = rollout_means(
        values=values, returns=returns, adv=adv, rewards=r, mask=mask, kl=None, rows=4, world=1
    )
    assert got["value_mean"] == pytest.approx(float((values * m).sum() / m.sum()), abs=1e-12)
    assert got["token_reward_sum"] == pytest.approx(float((r * m).sum() / 4), abs=1e-12)
    assert got["sampled_tokens"] == 6 and "kl" not in got


def test_local_plan_splits_each_minibatch_between_ranks():
    plan = [torch.tensor([3, 0]), torch.tensor([1, 2]), torch.tensor([2, 3])]
    first, second = local_plan(plan, lo=0, hi=2), local_plan(plan, lo=2, hi=4)
    assert [x.tolist() for x in first] == [[0], [1], []]
    assert [x.tolist() for x in second] == [[1], [0], [0, 1]]

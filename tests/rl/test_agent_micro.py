"""rl.agent.micro: the gradient accumulated over micro-batches of trajectories equals one pass's, for the SFT
loss (plain and call-weighted), the GRPO loss (every aggregation, with turn credit) and PPO's update (policy
and value head, every aggregation; its rollout values too), and a run with micro-batches trains as one
without."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from mm.config import load_config
from rl.agent.config import AgentPPOConfig, AgentRunConfig
from rl.agent.micro import grpo_backward, micro_batches, sft_backward, sft_weight
from rl.agent.ppo import prepare_rollout, update_backward
from rl.agent.stages import build_backend, demo_trajectories, train_tasks
from rl.agent.train import AgentGRPOConfig, grpo_loss, sft_loss
from rl.losses import AGG_MODES
from rl.trainers.value_head import value_head

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs/rl/agent_tiny.yaml"


@pytest.fixture(scope="module")
def setup():
    cfg = load_config(AgentRunConfig, TINY, ["data.train_tasks=6"])
    backend = build_backend(cfg)
    demos = demo_trajectories(backend, cfg, train_tasks(cfg), tools=True)
    gen = torch.Generator().manual_seed(0)
    for t in demos:  # sampling-time log-probs: the demonstrations have none
        t.logps = (torch.rand(len(t.logps), generator=gen) * -2).tolist()
    backend.adapter.model.train()
    return backend, demos


def _grads(backend, run) -> dict[str, torch.Tensor]:
    model = backend.adapter.model
    model.zero_grad(set_to_none=True)
    run()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _same(a, b, atol=1e-6, rtol=1e-5):
    assert a.keys() == b.keys() and a
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=rtol)


def test_micro_batches_cover_the_rows_in_order():
    assert micro_batches(5, 2) == [slice(0, 2), slice(2, 4), slice(4, 5)]
    assert micro_batches(5, 0) == [slice(0, 5)] and micro_batches(3, 8) == [slice(0, 3)]


@pytest.mark.parametrize("call_weight", [1.0, 3.0])
def test_sft_gradient_accumulated_equals_one_pass(setup, call_weight):
    backend, demos = setup
    assert sft_weight(demos, 1.0) == sum(sum(t.train_mask) for t in demos)
    whole = _grads(backend, lambda: sft_loss(backend, demos, call_weight=call_weight).backward())
    for micro in (1, 4):

        def accumulated(micro=micro):
            sft_backward(backend, demos, call_weight=call_weight, micro=micro)

        _same(_grads(backend, accumulated), whole)


@pytest.mark.parametrize("agg", AGG_MODES)
@pytest.mark.parametrize("turn_credit", [0.0, 0.5])
def test_grpo_gradient_accumulated_equals_one_pass(setup, agg, turn_credit):
    backend, demos = setup
    cfg = AgentGRPOConfig(group_size=2, agg=agg, turn_credit=turn_credit)
    rewards = torch.tensor([0.0, 1.0, 0.5, 0.2, 1.0, 0.0])
    trajs = demos[:6]
    ref = {}

    def one():
        loss, m = grpo_loss(backend, trajs, rewards, cfg, temperature=1.0)
        loss.backward()
        ref.update(loss=float(loss.detach()), **{k: float(v) for k, v in m.items()})

    whole = _grads(backend, one)
    out = {}

    def accumulated():
        loss, m = grpo_backward(backend, trajs, rewards, cfg, temperature=1.0, micro=4)
        out.update(loss=loss, **m)

    _same(_grads(backend, accumulated), whole)
    assert out["loss"] == pytest.approx(ref["loss"], rel=1e-6, abs=1e-6)
    for k in ("reward_mean", "advantage_abs_mean", "approx_kl"):
        assert out[k] == pytest.approx(ref[k], abs=1e-6), k


def _ppo_setup(setup, agg: str, micro: int):
    backend, demos = setup
    trajs = demos[:6]
    assert len({len(t.ids) for t in trajs}) > 1  # micro-batches of other widths than the batch's
    torch.manual_seed(0)
    head = value_head(backend.adapter.model.config.text_config.hidden_size, std=0.5)
    cfg = AgentPPOConfig(agg=agg, minibatches=1, vf_coef=0.5, micro_batch_size=micro)
    rewards = torch.tensor([0.0, 1.0, 0.5, 0.2, 1.0, 0.0])
    return backend, head, trajs, rewards, cfg


def test_ppo_rollout_values_in_micro_batches_equal_one_pass(setup):
    backend, head, trajs, rewards, cfg = _ppo_setup(setup, "token-mean", 0)
    one = prepare_rollout(backend, head, trajs, rewards, cfg)
    for micro in (1, 4):
        parts = prepare_rollout(
            backend, head, trajs, rewards, AgentPPOConfig(minibatches=1, micro_batch_size=micro)
        )
        assert torch.equal(parts.mask, one.mask) and torch.equal(parts.old_logps, one.old_logps)
        for name in ("old_values", "advantages", "returns"):
            torch.testing.assert_close(getattr(parts, name), getattr(one, name), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("agg", AGG_MODES)
def test_ppo_update_accumulated_equals_one_pass(setup, agg):
    backend, head, trajs, rewards, cfg = _ppo_setup(setup, agg, 0)
    roll = prepare_rollout(backend, head, trajs, rewards, cfg)
    rows = torch.tensor([4, 0, 5, 2, 1])  # a shuffled minibatch, as minibatch_plan gives
    model = backend.adapter.model

    def grads(micro):
        model.zero_grad(set_to_none=True)
        head.zero_grad(set_to_none=True)
        loss, metrics = update_backward(backend, head, roll, rows, replace(cfg, micro_batch_size=micro))
        out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        out["head"] = head.weight.grad.clone()
        return out, loss, metrics

    whole, loss, metrics = grads(0)
    for micro in (1, 2):
        got, got_loss, got_metrics = grads(micro)
        _same(got, whole, atol=1e-5, rtol=1e-4)  # float32 sums in another order (the value head's too)
        assert got_loss == pytest.approx(loss, rel=1e-5, abs=1e-6)
        for k in ("policy_loss", "value_loss", "approx_kl", "value_clip_frac"):
            assert got_metrics[k] == pytest.approx(metrics[k], rel=1e-5, abs=1e-6), k


def test_ppo_micro_batch_size_is_checked():
    with pytest.raises(ValueError, match="ppo.micro_batch_size must be >= 0"):
        AgentPPOConfig(micro_batch_size=-1)


def test_a_run_with_micro_batches_trains_as_one_without(tmp_path):
    from rl.agent.run import run_agent

    base = ["data.train_tasks=4", "sft.steps=2", "grpo.steps=2", "eval.n_boot=20", "eval.tasks_per_kind=1"]
    base += ["ppo.steps=1", "ppo.tasks_per_step=2", "ppo.samples_per_task=2", "ppo.minibatches=1"]
    whole = load_config(AgentRunConfig, TINY, base)
    sizes = ["sft.micro_batch_size=3", "grpo.micro_batch_size=5", "ppo.micro_batch_size=1"]
    micro = load_config(AgentRunConfig, TINY, [*base, *sizes])
    for cfg, out in ((whole, tmp_path / "whole"), (micro, tmp_path / "micro")):
        assert run_agent(cfg, out, log=lambda _: None) is not None
    for stage, name in (("sft_tool", "model"), ("grpo", "model"), ("ppo", "model"), ("ppo", "value_head")):
        a = torch.load(tmp_path / "whole" / stage / f"{name}.pt", weights_only=True)
        b = torch.load(tmp_path / "micro" / stage / f"{name}.pt", weights_only=True)
        for k in a:
            torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=1e-4)

"""rl.agent.micro: the gradient accumulated over micro-batches of trajectories equals one pass's, for the SFT
loss (plain and call-weighted) and the GRPO loss (every aggregation, with turn credit), and a run with
micro-batches trains as one without."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mm.config import load_config
from rl.agent.config import AgentRunConfig
from rl.agent.micro import grpo_backward, micro_batches, sft_backward, sft_weight
from rl.agent.stages import build_backend, demo_trajectories, train_tasks
from rl.agent.train import AgentGRPOConfig, grpo_loss, sft_loss
from rl.losses import AGG_MODES

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


def _same(a, b):
    assert a.keys() == b.keys() and a
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5)


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


def test_a_run_with_micro_batches_trains_as_one_without(tmp_path):
    from rl.agent.run import run_agent

    base = ["data.train_tasks=4", "sft.steps=2", "grpo.steps=2", "eval.n_boot=20", "eval.tasks_per_kind=1"]
    whole = load_config(AgentRunConfig, TINY, base)
    micro = load_config(AgentRunConfig, TINY, [*base, "sft.micro_batch_size=3", "grpo.micro_batch_size=5"])
    for cfg, out in ((whole, tmp_path / "whole"), (micro, tmp_path / "micro")):
        assert run_agent(cfg, out, log=lambda _: None) is not None
    for stage in ("sft_tool", "grpo"):
        a = torch.load(tmp_path / "whole" / stage / "model.pt", weights_only=True)
        b = torch.load(tmp_path / "micro" / stage / "model.pt", weights_only=True)
        for k in a:
            torch.testing.assert_close(b[k], a[k], atol=1e-5, rtol=1e-4)

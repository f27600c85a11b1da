"""Run by tests/rl/test_agent_dp.py under ``torchrun --nproc_per_node 2``: PPO's data-parallel rollout and
update equal one process's on the union of the ranks' rows (its advantages, losses and gradients).

    python -m torch.distributed.run --nproc_per_node 2 -m tests.rl.agent_ppo_dp_worker OUT.json AGG

Each rank first computes the one-process answer alone (before joining the group), then joins and takes
its share; rank 0 writes the largest differences to OUT.json.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from mm.config import load_config
from mm.train.loop import average_gradients
from rl.agent.config import AgentPPOConfig, AgentRunConfig
from rl.agent.parallel import join, rank_world, share
from rl.agent.ppo import ppo_optimizer, ppo_step, prepare_rollout, update_backward
from rl.agent.stages import build_backend, demo_trajectories, train_tasks
from rl.trainers.value_head import value_head

TINY = Path(__file__).resolve().parents[2] / "configs/rl/agent_tiny.yaml"
REWARDS = torch.tensor([1.0, 0.0, 0.5, 0.25])
"""One per trajectory: rank 0 holds the first two, rank 1 the last two."""


def _update(backend, head, trajs, rewards, rows, cfg):
    """Advantages of the rollout, and the loss, metrics and (rank-averaged) gradients of one update."""
    roll = prepare_rollout(backend, head, trajs, rewards, cfg)
    params = [p for p in (*backend.adapter.model.parameters(), *head.parameters()) if p.requires_grad]
    for p in params:
        p.grad = None
    loss, metrics = update_backward(backend, head, roll, rows, cfg)
    average_gradients(params)
    names = [n for n, p in backend.adapter.model.named_parameters() if p.requires_grad] + [
        "head.weight",
        "head.bias",
    ]
    return roll, loss, metrics, {n: p.grad.clone() for n, p in zip(names, params, strict=True)}


def _step(backend, head, trajs, rewards, cfg):
    """One whole PPO step (every update of the plan) from the current weights, which it then restores:
    the step's metrics and the weights it reached."""
    modules = [backend.adapter.model, head]
    start = [{k: v.clone() for k, v in m.state_dict().items()} for m in modules]
    table = dict(zip(map(id, trajs), rewards.tolist(), strict=True))
    optimizer = ppo_optimizer(backend, head, cfg)
    for group in optimizer.param_groups:  # as tests.helpers.launch.EPS: float rounding stays below 1e-5
        group["eps"] = 1e-6
    metrics = ppo_step(backend, head, optimizer, trajs, lambda t: table[id(t)], cfg, seed=3)
    reached = {f"{i}.{k}": v.clone() for i, m in enumerate(modules) for k, v in m.state_dict().items()}
    for m, state in zip(modules, start, strict=True):
        m.load_state_dict(state)
    return metrics, reached


def main() -> None:
    out, agg = Path(sys.argv[1]), sys.argv[2]
    cfg = load_config(AgentRunConfig, TINY, ["data.train_tasks=6"])
    backend = build_backend(cfg)
    trajs = demo_trajectories(backend, cfg, train_tasks(cfg), tools=True)[:4]
    gen = torch.Generator().manual_seed(0)
    for t in trajs:  # sampling-time log-probs: the demonstrations have none
        t.logps = (torch.rand(len(t.logps), generator=gen) * -2).tolist()
    backend.adapter.model.train()
    torch.manual_seed(1)
    head = value_head(backend.adapter.model.config.text_config.hidden_size, std=0.5)
    ppo = AgentPPOConfig(agg=agg, minibatches=1, vf_coef=0.5, whiten_advantages=True)
    # one process: the minibatch is every rank's local rows [1, 0], in rank order
    ref = _update(backend, head, trajs, REWARDS, torch.tensor([1, 0, 3, 2]), ppo)
    uneven = _update(backend, head, trajs, REWARDS, torch.tensor([1, 0]), ppo)  # rows of rank 0 alone
    stepped = AgentPPOConfig(agg=agg, minibatches=2, epochs=2, vf_coef=0.5, whiten_advantages=True)
    ref_step = _step(backend, head, trajs, REWARDS, stepped)
    join(torch.device("cpu"))
    rank, world = rank_world()
    mine = share(list(range(len(trajs))))
    micro = AgentPPOConfig(agg=agg, minibatches=1, vf_coef=0.5, whiten_advantages=True, micro_batch_size=1)
    got = _update(backend, head, [trajs[i] for i in mine], REWARDS[mine], torch.tensor([1, 0]), micro)
    none = torch.tensor([], dtype=torch.long)
    got_uneven = _update(
        backend,
        head,
        [trajs[i] for i in mine],
        REWARDS[mine],
        torch.tensor([1, 0]) if rank == 0 else none,
        micro,
    )
    got_step = _step(backend, head, [trajs[i] for i in mine], REWARDS[mine], stepped)
    if rank != 0:
        return
    adv = max(
        float(
            (ref[0].advantages[i][ref[0].mask[i].bool()] - got[0].advantages[j][got[0].mask[j].bool()])
            .abs()
            .max()
        )
        for j, i in enumerate(mine)
    )
    scale = max(float(g.abs().max()) for g in ref[3].values())  # the largest gradient's
    grads = max(float((ref[3][k] - got[3][k]).abs().max()) for k in ref[3]) / scale
    metrics = {k: abs(ref[2][k] - got[2][k]) for k in ("policy_loss", "value_loss", "approx_kl")}
    ref_m, got_m = (
        ref[0].metrics,
        got[0].metrics,
    )  # relative: the explained variance of a fresh head is ~ -200
    rollout = {k: abs(ref_m[k] - got_m[k]) / max(1.0, abs(ref_m[k])) for k in ref_m}
    uneven_grads = max(float((uneven[3][k] - got_uneven[3][k]).abs().max()) for k in uneven[3]) / max(
        float(g.abs().max()) for g in uneven[3].values()
    )
    step_weights = max(float((ref_step[1][k] - got_step[1][k]).abs().max()) for k in ref_step[1])
    moved = max(float((ref_step[1][k] - v).abs().max()) for k, v in _start_weights(backend, head).items())
    step_metrics = {
        k: abs(ref_step[0][k] - got_step[0][k]) / max(1.0, abs(ref_step[0][k])) for k in ref_step[0]
    }
    out.write_text(json.dumps({
        "world": world, "advantages": adv, "gradients_relative": grads, "loss": abs(ref[1] - got[1]),
        "metrics": metrics, "rollout_metrics": rollout, "grad_names": len(ref[3]),
        "uneven_gradients_relative": uneven_grads, "uneven_loss": abs(uneven[1] - got_uneven[1]),
        "step_weights": step_weights, "step_moved": moved, "step_metrics": step_metrics,
        "step_metric_names": sorted(ref_step[0]) == sorted(got_step[0]),
    }))  # fmt: skip


def _start_weights(backend, head):
    """The weights every step starts from (``_step`` restores them), keyed as ``_step`` keys them."""
    modules = [backend.adapter.model, head]
    return {f"{i}.{k}": v for i, m in enumerate(modules) for k, v in m.state_dict().items()}


if __name__ == "__main__":
    main()

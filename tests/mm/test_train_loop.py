"""mm.train.loop, the training skeleton, on a toy regression trainer: resume equality, inner updates,
monitor warnings, evaluation cadence, the resume config check, and gradient averaging over 2 gloo ranks."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from mm.errors import UserError
from mm.train import common, loop
from mm.train.config import OptimConfig, RunConfig, build_optimizer, lr_lambda, param_groups


class Toy(loop.StepTrainer):
    """Least squares on 16 fixed points, batches of 4 drawn by (seed, step)."""

    def __init__(self, updates: int = 1) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(16, 3, generator=g)  # (N, 3)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5]) + 0.1 * torch.randn(16, generator=g)  # (N,)
        self.model = torch.nn.Linear(3, 1)
        self.updates_per_step = updates
        self.calls = {"loss": 0, "after_update": 0, "evaluate": 0}
        self.seen = 0

    def batch(self, step: int) -> list[int]:
        return common.batch_indices(16, 4, seed=0, step=step)

    def loss(self, batch: list[int]) -> tuple[torch.Tensor, dict[str, Any]]:
        self.calls["loss"] += 1
        pred = self.model(self.x[batch]).squeeze(-1)  # (B,)
        return ((pred - self.y[batch]) ** 2).mean(), {"batch_mean_y": self.y[batch].mean(), "n": len(batch)}

    def after_update(self) -> None:
        self.calls["after_update"] += 1

    def evaluate(self) -> dict[str, Any]:
        self.calls["evaluate"] += 1
        with torch.no_grad():
            return {"mse": float(((self.model(self.x).squeeze(-1) - self.y) ** 2).mean()), "_hidden": [1]}

    def state(self) -> dict[str, Any]:
        return {"seen": self.seen}

    def load_state(self, state: dict[str, Any]) -> None:
        self.seen = state["seen"]


def _train(out: Path, *, steps: int = 6, updates: int = 1, stop_after: int | None = None, **kw: Any):
    run = RunConfig(steps=steps, log_every=1, checkpoint_every=2, keep_last=5)
    loop.setup(run)
    toy = Toy(updates)
    opt, sched = build_optimizer(param_groups(toy.model, 0.0), OptimConfig(lr=0.05, warmup_steps=2), steps)
    result = loop.run(
        toy, optimizer=opt, scheduler=sched, run=run, out=out, config={"train": {"steps": steps}}, desc="toy",
        plot_keys=["loss"], show_progress=False, stop_after=stop_after, grad_clip=1.0, **kw,
    )  # fmt: skip
    return toy, opt, sched, result


def _records(out: Path) -> list[dict[str, Any]]:
    timing = ("time_s", "cpu_s", "step_s")
    return [
        {k: v for k, v in r.items() if k not in timing} for r in common.read_metrics(out / "metrics.jsonl")
    ]


def test_kill_and_resume_equals_a_straight_run(tmp_path):
    straight, *_ = _train(tmp_path / "a", eval_every=3)
    killed, *_, res = _train(tmp_path / "b", eval_every=3, stop_after=3)
    assert res.stopped and res.step == 3 and not (tmp_path / "b" / "curves.png").exists()
    resumed, *_, res = _train(tmp_path / "b", eval_every=3)
    assert res.step == 6 and not res.stopped and resumed.calls["loss"] == 4  # steps 3..6 (checkpoint at 2)
    for p, q in zip(straight.model.parameters(), resumed.model.parameters()):
        assert torch.equal(p, q)
    assert _records(tmp_path / "a") == _records(tmp_path / "b")
    recs = _records(tmp_path / "a")
    assert [r["step"] for r in recs] == [1, 2, 3, 4, 5, 6]
    assert [r["step"] for r in recs if "eval/mse" in r] == [3, 6] and "eval/_hidden" not in recs[2]
    assert recs[0]["n"] == 4 and isinstance(recs[0]["batch_mean_y"], float)
    loop.setup(RunConfig())  # the same seed: the initial weights
    assert not torch.equal(Toy().model.weight, straight.model.weight)  # the steps moved the weights
    assert (tmp_path / "a" / "curves.png").read_bytes()[:4] == b"\x89PNG"


def test_inner_updates_step_the_optimizer_not_the_schedule(tmp_path):
    toy, opt, sched, res = _train(tmp_path / "o", steps=3, updates=2)
    assert toy.calls == {"loss": 6, "after_update": 6, "evaluate": 0}
    assert int(opt.state[toy.model.weight]["step"]) == 6 and sched.last_epoch == 3
    rate = lr_lambda(OptimConfig(lr=0.05, warmup_steps=2), 3)(3)
    assert res.last["lr"] == pytest.approx(0.05 * rate)


def test_monitor_warns_once_per_kind_and_logs_every_step(tmp_path):
    def monitor(history: list[dict[str, Any]], record: dict[str, Any]) -> list[str]:
        assert [r["step"] for r in history] == list(range(1, record["step"]))
        return ["always: every step"] + (["late: past step 2"] if record["step"] > 2 else [])

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _train(tmp_path / "m", steps=4, monitor=monitor)
    texts = [str(w.message) for w in caught if issubclass(w.category, loop.TrainingWarning)]
    assert texts == ["always: every step", "late: past step 2"]
    recs = common.read_metrics(tmp_path / "m" / "metrics.jsonl")
    assert [len(r["warnings"]) for r in recs] == [1, 1, 2, 2]


def test_resume_with_another_config_names_the_differing_keys(tmp_path):
    saved = {"optim": {"lr": 0.1, "betas": [0.9, 0.95]}, "train": {"steps": 10, "seed": 0}}
    loop.check_resume_config(
        saved, {**saved, "train": {"steps": 20, "seed": 0}}, tmp_path
    )  # steps may change
    with pytest.raises(UserError, match=r"optim\.lr, train\.seed differ"):
        loop.check_resume_config(
            saved, {"optim": {"lr": 0.2, "betas": (0.9, 0.95)}, "train": {"seed": 1}}, tmp_path
        )


def test_mean_over_ranks_single_process_keeps_numbers():
    out = loop.mean_over_ranks({"a": torch.tensor(0.5), "n": 3, "x": 1.5, "w": ["text"], "b": True}, world=1)
    assert out == {"a": 0.5, "n": 3, "x": 1.5, "w": ["text"], "b": True} and isinstance(out["a"], float)


def _average_worker(rank: int, init: str, result: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        model = torch.nn.Linear(2, 2)
        extra = torch.nn.Parameter(torch.zeros(3))  # a gradient on rank 1 only
        unused = torch.nn.Parameter(torch.zeros(1))  # no gradient anywhere
        model.weight.grad = torch.full((2, 2), float(rank + 1))
        model.bias.grad = torch.tensor([rank * 4.0, 2.0])
        extra.grad = torch.ones(3) * 6.0 if rank == 1 else None
        loop.average_gradients([model.weight, model.bias, extra, unused])
        if rank == 0:
            torch.save(
                {"w": model.weight.grad, "b": model.bias.grad, "e": extra.grad, "u": unused.grad}, result
            )
    finally:
        dist.destroy_process_group()


def test_average_gradients_over_two_gloo_ranks(tmp_path):
    result = str(tmp_path / "grads.pt")
    mp.spawn(_average_worker, args=(f"file://{tmp_path / 'rendezvous'}", result), nprocs=2, join=True)
    got = torch.load(result)
    assert torch.equal(got["w"], torch.full((2, 2), 1.5))  # (1 + 2) / 2
    assert torch.equal(got["b"], torch.tensor([2.0, 2.0]))
    assert torch.equal(got["e"], torch.full((3,), 3.0))  # rank 0's missing gradient counts as zero
    assert got["u"] is None  # no rank had one: AdamW keeps skipping it

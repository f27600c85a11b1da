"""``rl agent`` data parallel: 2 gloo processes under ``torchrun``. The SFT stages equal one process on the
global batch, GRPO and PPO train with every rank's share of the tasks (a PPO update equals one process's on
the union of the ranks' rows), the eval rows come back in task order, only rank 0 writes, and a re-run
resumes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rl.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs/rl/agent_tiny.yaml"
SETS = [
    "data.train_tasks=4", "sft.steps=2", "sft.batch_size=4", "grpo.steps=2", "grpo.tasks_per_step=2",
    "grpo.checkpoint_every=1", "perception.steps=2", "perception.batch_size=4", "perception.check_notes=2",
    "grpo.turn_credit=0.5", "grpo.scale=batch", "eval.n_boot=20", "eval.tasks_per_kind=3",
    "ppo.steps=2", "ppo.tasks_per_step=2", "ppo.samples_per_task=2", "ppo.minibatches=1",
    "ppo.checkpoint_every=1",
]  # fmt: skip


def _launch(*args: str, module: str = "rl") -> subprocess.CompletedProcess:
    """2 CPU processes of ``python -m MODULE ARGS`` under torchrun, from the repository (the configs'
    paths)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    head = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
            "127.0.0.1", "--master_port", str(port)]  # fmt: skip
    return subprocess.run(
        [*head, "-m", module, *args], cwd=ROOT, env=env, stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)


def test_two_processes_train_and_evaluate_as_one(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    threads = torch.get_num_threads()
    try:
        assert main(["agent", "--config", str(TINY), "--out", str(one), "--set", *SETS]) == 0
    finally:
        torch.set_num_threads(threads)
    args = ["agent", "--config", str(TINY), "--out", str(two), "--set", *SETS]
    proc = _launch(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("targets held") == 1  # rank 0 speaks, rank 1 does not
    assert proc.stdout.count("sft_tool: done") == 1
    # perception and SFT: the global batch split over the ranks is one process's step on it
    check = [json.loads((run / "perception/result.json").read_text())["reading_check"] for run in (one, two)]
    assert check[1] == check[0] and sum(v["n"] for v in check[0].values()) > 0  # shared out, gathered
    for stage in ("perception", "sft_tool", "sft_notool"):
        a, b = _weights(one / stage / "model.pt"), _weights(two / stage / "model.pt")
        assert a.keys() == b.keys()
        for k in a:
            gap = (b[k].double() - a[k].double()).abs()
            # the SFT stages start from perception weights that differ by float rounding already; Adam's
            # lr * g / (|g| + eps) turns that rounding of a near-zero gradient element into up to ~1e-4
            assert gap.max() < 1e-4 and (gap > 2e-5).sum() <= max(1, gap.numel() // 10_000), (stage, k)
        steps = [json.loads(x)["step"] for x in (two / stage / "metrics.jsonl").read_text().splitlines()]
        assert steps == [1, 2]  # one writer
        losses = [[json.loads(x)["loss"] for x in (r / stage / "metrics.jsonl").read_text().splitlines()]
                  for r in (one, two)]  # fmt: skip
        assert losses[1] == pytest.approx(losses[0], abs=1e-5)
    # GRPO: each rank sampled its share (other samples than one process's), the same update on both ranks
    grpo = _weights(two / "grpo/model.pt")
    assert all(torch.isfinite(v).all() for v in grpo.values())
    records = [json.loads(x) for x in (two / "grpo/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2] and all("reward_mean" in r for r in records)
    ppo = [json.loads(x) for x in (two / "ppo/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in ppo] == [1, 2] and all(
        r["trajectories"] == 4 for r in ppo
    )  # both ranks' counts
    assert (two / "ppo/value_head.pt").is_file() and (two / "export/tool_ppo/config.json").is_file()
    # eval: every task once, in task order; the SFT model (the same weights) gives the same rows
    for name in ("tool_sft", "notool_sft", "tool_grpo", "tool_ppo"):
        rows_one = [json.loads(x) for x in (one / "eval" / f"{name}.jsonl").read_text().splitlines()]
        rows_two = [json.loads(x) for x in (two / "eval" / f"{name}.jsonl").read_text().splitlines()]
        assert [r["task_id"] for r in rows_two] == [r["task_id"] for r in rows_one]
    tool_sft = (two / "eval/tool_sft.jsonl").read_text()
    assert tool_sft == (one / "eval/tool_sft.jsonl").read_text()
    report = json.loads((two / "report.json").read_text())
    assert set(report["metrics"]) == {"notool_sft", "tool_sft", "tool_grpo", "tool_ppo"}
    assert (two / "export/tool_grpo/config.json").is_file()
    # a re-run finds every stage done
    again = _launch(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "grpo: done before, skipped" in again.stdout and "eval: done before, skipped" in again.stdout


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum-norm"])
def test_a_ppo_update_over_two_processes_is_one_process_update(tmp_path, agg):
    """Advantages whitened over both ranks' tokens, loss normalisers (and the horizon) counted over both:
    the averaged gradient is one process's on the union of the ranks' minibatch rows, also when one rank
    holds none of them; a whole step over one process's minibatch plan reaches one process's weights."""
    out = tmp_path / "diff.json"
    proc = _launch(str(out), agg, module="tests.rl.agent_ppo_dp_worker")
    assert proc.returncode == 0, proc.stderr[-3000:]
    diff = json.loads(out.read_text())
    assert diff["world"] == 2 and diff["grad_names"] > 10
    assert diff["advantages"] < 1e-4 and diff["gradients_relative"] < 1e-4 and diff["loss"] < 1e-5
    assert max(diff["metrics"].values()) < 1e-5 and max(diff["rollout_metrics"].values()) < 1e-5
    # a minibatch wholly on rank 0 (rank 1 takes no backward): still one process's gradient
    assert diff["uneven_gradients_relative"] < 1e-4 and diff["uneven_loss"] < 1e-5
    # a whole step, 2 epochs x 2 minibatches of one process's plan: the same weights and metrics
    assert diff["step_moved"] > 1e-4 and diff["step_weights"] < 1e-5
    assert diff["step_metric_names"] and max(diff["step_metrics"].values()) < 1e-5, diff["step_metrics"]

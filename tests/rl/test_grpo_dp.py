"""`rl grpo` data parallel: 2 gloo processes == 1 process on the global batch (weights at every step, logged
metrics), for the world form (``accelerate launch``) and the prompt-file form (``torchrun``); per-prompt
seeded sampling draws the same tokens whatever the batch; sharded losses average to the global loss."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from rl.cli import main
from tests.helpers.eval_model import make_data_dir, make_model_dir

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "rl" / "grpo_tiny.yaml"
COMPARED = (
    "loss", "reward_mean", "reward_std", "zero_std_frac", "group_reward_std", "adv_std", "clip_frac_low",
    "clip_frac_high", "approx_kl", "entropy", "response_len", "truncated_frac", "sample_batches",
)  # fmt: skip
"""Logged metrics that must be the global batch's under 2 processes."""
EPS = "optim.eps=1e-6"
"""Adam moves a weight by ``lr * g / (|g| + eps)``: for a gradient element near 0 the float32 rounding of
a differently batched forward (~1e-10) moves it by ``lr * 1e-10 / eps``: 1e-5 at lr 1e-3 and the default
1e-8, at the tolerance; 1e-6 keeps the rounding well below it (the same math, not a looser check)."""


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(cwd: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", HF_HOME=str(cwd / ".hf"))
    return env


def _launch(cwd: Path, launcher: str, *args: str) -> subprocess.CompletedProcess:
    """2 CPU processes of ``python -m rl ...`` under ``accelerate launch`` or ``torchrun``."""
    port = _port()
    if launcher == "accelerate":
        head = [
            sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
        ]  # fmt: skip
    else:
        head = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_addr", "127.0.0.1", "--master_port", str(port)]  # fmt: skip
    return subprocess.run(
        [*head, "-m", "rl", *args], cwd=cwd, env=_env(cwd), stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip


def _one_process(args: list[str]) -> None:
    threads = torch.get_num_threads()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(args) == 0
    finally:
        torch.set_num_threads(threads)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _same_runs(one: Path, two: Path, steps: int) -> None:
    """Weights of every step to 1e-5, every compared metric to 1e-5, one record per step (rank 0 logs)."""
    from safetensors.torch import load_file

    a, b = _records(two), _records(one)
    assert [r["step"] for r in a] == [r["step"] for r in b] == list(range(1, steps + 1))
    for ra, rb in zip(a, b):
        assert set(ra) - {"time_s", "cpu_s", "step_s"} == set(rb) - {"time_s", "cpu_s", "step_s"}
        for k in (k for k in COMPARED if k in rb):
            assert ra[k] == pytest.approx(rb[k], abs=1e-5), (ra["step"], k, ra[k], rb[k])
        assert ra["grad_norm"] == pytest.approx(rb["grad_norm"], rel=1e-4)
    weights = []
    for step in range(1, steps + 1):
        name = f"step-{step:08d}/model.safetensors"
        wa, wb = load_file(str(two / "checkpoints" / name)), load_file(str(one / "checkpoints" / name))
        assert wa.keys() == wb.keys()
        assert max((wa[k].double() - wb[k].double()).abs().max().item() for k in wa) < 1e-5, step
        weights.append(wa)
    first, last = weights[0], weights[-1]
    moved = max((first[k].double() - last[k].double()).abs().max().item() for k in first)
    assert moved > 1e-4, "the steps did not move the weights: the comparison would mean nothing"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo_dp")
    return make_model_dir(root), make_data_dir(root, split="train")


def test_world_form_two_processes_equal_one(tmp_path, world):
    """accelerate launch, 2 ranks x 2 prompts == 1 process x 4 prompts: DAPO dynamic sampling (which
    groups are kept is a global decision), batch-std advantages, token-mean over the global token count,
    two updates per rollout (clipping metrics) and a KL to a frozen copy."""
    model, data = world
    sets = [
        f"init.model={model}", "data.prompts_per_step=4", "data.tasks=[caption,question]",
        "rollout.group_size=3", "rollout.max_new_tokens=6", "algo.overlong_penalty=true",
        "algo.overlong_cache=6", "algo.dynamic_sampling=true", "algo.scale=batch", "algo.num_iterations=2",
        "algo.beta=0.04", "train.steps=2", "train.checkpoint_every=1", "train.device=cpu", "train.threads=1",
        "optim.lr=0.001", EPS,
    ]  # fmt: skip
    args = ["grpo", "--config", str(CONFIG), "--data", str(data), "--no-progress"]
    args += [x for s in sets for x in ("--set", s)]
    _one_process([*args, "--out", str(tmp_path / "one")])
    work = tmp_path / "work"
    work.mkdir()
    proc = _launch(work, "accelerate", *args, "--out", str(work / "two"))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert proc.stdout.count('"prompts"') == 1  # rank 0 alone reports
    assert sorted(p.name for p in work.iterdir() if p.name != ".hf") == ["two"]
    assert sorted(p.name for p in (work / "two").iterdir()) == [
        "checkpoints", "config.yaml", "curves.png", "metrics.jsonl", "model", "result.json",
    ]  # fmt: skip
    _same_runs(tmp_path / "one", work / "two", 2)
    assert all("kl" in r for r in _records(work / "two"))


def test_files_form_two_processes_equal_one(tmp_path):
    """torchrun, the prompt-file form on a tiny LLaVA (HF ``generate`` with the seeded sampler), top-k
    sampling (importance weights) and GSPO's sequence ratios with a sequence-mean loss."""
    from tests.mm.adapter_helpers import build_family, random_image

    (tmp_path / "imgs").mkdir()
    for i in range(4):
        random_image(24 + 8 * i, 16 + 8 * i, seed=i).save(tmp_path / "imgs" / f"{i}.png")
    records = [{"image": f"{i}.png", "question": "Describe the image.", "objects": ["fork", "cup"]}
               for i in range(4)]  # fmt: skip
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    model = build_family("llava", tmp_path / "llava")
    sets = [
        "train.steps=2", "train.checkpoint_every=1", "train.device=cpu", "train.threads=1",
        "data.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4", "rollout.top_k=5",
        "optim.lr=0.001", "algo.overlong_penalty=true", "algo.overlong_cache=4", "algo.level=sequence",
        "algo.agg=seq-mean-token-mean", EPS,
    ]  # fmt: skip
    args = ["grpo", "--model", str(model), "--prompts", str(tmp_path / "p.jsonl"), "--image-folder",
            str(tmp_path / "imgs"), "--reward", "hallucination", "--no-progress"]  # fmt: skip
    args += [x for s in sets for x in ("--set", s)]
    _one_process([*args, "--out", str(tmp_path / "one")])
    work = tmp_path / "work"
    work.mkdir()
    proc = _launch(work, "torchrun", *args, "--out", str(work / "two"))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert proc.stdout.count('"family"') == 1
    _same_runs(tmp_path / "one", work / "two", 2)
    assert all("is_weight_mean" in r for r in _records(work / "two"))

"""Multi-process tests: launch ``python -m rl ...`` as 2 CPU processes (gloo) under ``torchrun`` or
``accelerate launch``, run the same command in this process, and compare the two runs' outputs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

EPS = "optim.eps=1e-6"
"""Adam moves a weight by ``lr * g / (|g| + eps)``: for a gradient element near 0 the float32 rounding of
a differently batched forward (~1e-10) moves it by ``lr * 1e-10 / eps``: 1e-5 at lr 1e-3 and the default
1e-8, at the tolerance; 1e-6 keeps the rounding well below it (the same math, not a looser check)."""
TIMING = {"time_s", "cpu_s", "step_s"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(cwd: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", HF_HOME=str(cwd / ".hf"))
    return env


def launch(cwd: Path, launcher: str, *args: str, module: str = "rl") -> subprocess.CompletedProcess:
    """2 CPU processes of ``python -m MODULE ARGS`` under ``accelerate launch`` or ``torchrun`` in ``cwd``."""
    port = free_port()
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
        [*head, "-m", module, *args], cwd=cwd, env=_env(cwd), stdin=subprocess.DEVNULL, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip


def one_process(args: list[str]) -> None:
    """``rl ARGS`` in this process (warnings silenced, the thread count restored)."""
    from rl.cli import main

    threads = torch.get_num_threads()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(args) == 0
    finally:
        torch.set_num_threads(threads)


def one_and_two(
    tmp_path: Path, args: list[str], *, fsdp: bool, launcher: str = "torchrun"
) -> tuple[Path, Path, str]:
    """``rl ARGS`` once in this process (OUT ``tmp_path/one``) and once as 2 launched processes (OUT
    ``tmp_path/work/two``, with ``train.fsdp=true`` when ``fsdp``); ``(one, two, launched stdout)``."""
    one_process([*args, "--out", str(tmp_path / "one")])
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    fsdp_args = ["--set", "train.fsdp=true"] if fsdp else []
    proc = launch(work, launcher, *args, *fsdp_args, "--out", str(work / "two"))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return tmp_path / "one", work / "two", proc.stdout


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def same_records(one: Path, two: Path, keys: Sequence[str], steps: int) -> None:
    """One record per step in both runs (rank 0 logs), the same keys, each of ``keys`` present to 1e-5 and
    the gradient norm to 1e-4 relative."""
    a, b = records(one), records(two)
    assert [r["step"] for r in b] == [r["step"] for r in a] == list(range(1, steps + 1))
    for ra, rb in zip(a, b):
        assert set(ra) - TIMING == set(rb) - TIMING
        for k in (k for k in keys if k in ra):
            assert rb[k] == pytest.approx(ra[k], abs=1e-5), (ra["step"], k, ra[k], rb[k])
        assert rb["grad_norm"] == pytest.approx(ra["grad_norm"], rel=1e-4)


def same_weights(one: Path, two: Path, names: Sequence[str]) -> list[dict[str, torch.Tensor]]:
    """The safetensors files ``names`` (relative to OUT) hold the same tensors to 1e-5; one's, in order."""
    from safetensors.torch import load_file

    out = []
    for name in names:
        wa, wb = load_file(str(one / name)), load_file(str(two / name))
        assert wa.keys() == wb.keys()
        assert max((wa[k].double() - wb[k].double()).abs().max().item() for k in wa) < 1e-5, name
        out.append(wa)
    return out


def checkpoints(steps: int) -> list[str]:
    """The model files of every step's checkpoint."""
    return [f"checkpoints/step-{s:08d}/model.safetensors" for s in range(1, steps + 1)]


def moved(first: dict[str, torch.Tensor], last: dict[str, torch.Tensor]) -> None:
    """The steps moved the weights (else comparing two runs would mean nothing)."""
    gap = max((first[k].double() - last[k].double()).abs().max().item() for k in first)
    assert gap > 1e-4, "the steps did not move the weights: the comparison would mean nothing"

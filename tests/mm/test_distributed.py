"""`accelerate launch` with two CPU processes (DDP over gloo) runs `mm train` and `mm pretrain` unchanged.

Each two-process run is compared with a one-process run of the same config (same global batch, same
seed) made in this test process: the weights after N steps must agree to ~1e-5 (float32 reduction order
is the only difference), the logged losses too, only rank 0 writes the run folder, and a two-process
run stopped at step 2 and resumed to step 4 ends where a straight 4-step run ends.

Launcher note: ``accelerate launch --cpu --num_processes 2`` starts ONE process (accelerate's CPU
multi-process path needs an MPI hostfile). Two CPU processes come from ``--multi_gpu --num_processes 2``
with no visible GPU (torchrun underneath; mm.train.common.init_distributed picks gloo without CUDA).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from mm.cli import main

ROOT = Path(__file__).resolve().parents[2]
SFT_CONFIG = ROOT / "configs" / "mm" / "sft_tiny.yaml"
PRETRAIN_CONFIG = ROOT / "tests" / "configs" / "pretrain_test.yaml"
# Tiny and fast: batch 4 (2 per rank), a checkpoint and a metrics record every step, a 2-note evaluation.
SFT_SET = [
    "train.batch_size=4", "train.log_every=1", "train.checkpoint_every=1", "train.keep_last=4",
    "eval.notes=2", "eval.questions=0", "eval.max_new_tokens=4", "eval.batch_size=2",
]  # fmt: skip
# The object-tag loss is on: its mean over real images must also be over the global batch.
PRETRAIN_SET = ["train.batch_size=8", "train.keep_last=4", "loss.tag_weight=0.5", "train.threads=1"]
ATOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(cwd: Path, *mm_args: str) -> subprocess.CompletedProcess:
    """``accelerate launch`` 2 CPU processes of ``python -m mm ...``; everything on the command line."""
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(
        HF_HUB_OFFLINE="1",
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",  # CPU processes even on a GPU machine (the trainers train on CPU)
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        HF_HOME=str(cwd / ".hf"),  # no user accelerate config (~/.cache/huggingface/accelerate) is read
    )
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no",
        "--dynamo_backend", "no", "--main_process_ip", "127.0.0.1", "--main_process_port", str(port),
        "-m", "mm", *mm_args,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def _in_process(*mm_args: str) -> None:
    """The same command in one process (this one), restoring the thread count the config changes."""
    threads = torch.get_num_threads()
    try:
        assert main(list(mm_args)) == 0
    finally:
        torch.set_num_threads(threads)


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _ckpt(out: Path, step: int) -> dict[str, torch.Tensor]:
    return load_file(str(out / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def _assert_losses_match(ddp: list[dict], ref: list[dict], steps: int) -> None:
    assert [r["step"] for r in ddp] == list(range(1, steps + 1))  # one record per step: only rank 0 logs
    for r, q in zip(ddp, ref):
        assert r["loss"] == pytest.approx(q["loss"], abs=ATOL), r["step"]
        assert r["grad_norm"] == pytest.approx(q["grad_norm"], rel=1e-4), r["step"]


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ddp_world") / "notes"
    assert main(["data", "world", "--out", str(folder), "--notes", "40", "--seed", "0"]) == 0
    return folder


@pytest.mark.slow
def test_train_two_processes_equal_one_and_resume(tmp_path, world):
    from mm.model import NoteVLMForConditionalGeneration

    common = ["--config", str(SFT_CONFIG), "--data", str(world), "--no-progress", "--set", *SFT_SET]
    ref = tmp_path / "ref"
    _in_process("train", "--out", str(ref), *common, "train.steps=4")

    run = tmp_path / "work"
    run.mkdir()
    out = run / "ddp"
    proc = _launch(run, "train", "--out", str(out), *common, "train.steps=2")
    # one run folder, written once: the result line is printed by rank 0 only, nothing else lands in cwd
    assert proc.stdout.count('"stage": "sft"') == 1
    assert sorted(p.name for p in run.iterdir() if p.name != ".hf") == ["ddp"]
    assert sorted(p.name for p in out.iterdir()) == [
        "checkpoints", "config.yaml", "curves.png", "metrics.jsonl", "model", "result.json",
    ]  # fmt: skip
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]
    recs = _records(out)
    _assert_losses_match(recs, _records(ref), steps=2)
    assert "eval/caption_loss" in recs[-1]

    # the strong check: 2 processes x 2 samples == 1 process x 4 samples, step by step
    assert _max_diff(_ckpt(out, 1), _ckpt(ref, 1)) < ATOL
    assert _max_diff(_ckpt(out, 2), _ckpt(ref, 2)) < ATOL
    assert _max_diff(_ckpt(out, 2), _ckpt(ref, 1)) > 1e-4  # the steps move the weights

    # the saved model loads and holds the step-2 weights
    model = NoteVLMForConditionalGeneration.from_pretrained(str(out / "model"))
    state, step2 = model.state_dict(), _ckpt(out, 2)
    for k, v in step2.items():
        assert torch.equal(state[k], v), k

    # resume in two processes from step 2 to step 4 == the straight 4-step run
    _launch(run, "train", "--out", str(out), *common, "train.steps=4")
    _assert_losses_match(_records(out), _records(ref), steps=4)
    assert _max_diff(_ckpt(out, 4), _ckpt(ref, 4)) < ATOL
    assert json.loads((out / "result.json").read_text())["step"] == 4


@pytest.mark.slow
def test_pretrain_two_processes_equal_one(tmp_path, world):
    common = ["--config", str(PRETRAIN_CONFIG), "--data", str(world), "--no-progress", "--set", *PRETRAIN_SET]
    ref = tmp_path / "ref"
    _in_process("pretrain", "--out", str(ref), *common)
    out = tmp_path / "ddp"
    proc = _launch(tmp_path, "pretrain", "--out", str(out), *common)
    assert proc.stdout.count('"train_notes"') == 1
    recs, ref_recs = _records(out), _records(ref)
    # step 1: InfoNCE over the features gathered from both ranks == the one-process loss on 8 notes
    _assert_losses_match(recs, ref_recs, steps=2)
    for key in ("tag_loss", "temperature"):
        assert recs[0][key] == pytest.approx(ref_recs[0][key], abs=ATOL), key
    assert _max_diff(_ckpt(out, 2), _ckpt(ref, 2)) < ATOL

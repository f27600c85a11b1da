"""Device check of the training skeleton: ``mm train`` on a tiny NoteVLM, 2 steps, bf16 autocast and
gradient checkpointing, first data parallel (one process: plain) and then FSDP2, from the same seed.

Checks, each a failure (exit 1) when it does not hold: the losses are finite; the model is on the asked
device and its trainable weights stay float32; FSDP sharded the LM blocks (``Qwen2DecoderLayer``); the
saved models of the two runs agree (``--tol``, bf16 rounding only: the same kernels run on the same
weights); the evaluation under FSDP ran (``eval/caption_loss``). Prints one JSON line per run and one
summary line (step time, peak GPU memory, the largest weight difference).

Usage::

    python benchmarks/gpu_check_train.py                        # one GPU: plain, then FSDP over one rank
    torchrun --nproc_per_node 2 benchmarks/gpu_check_train.py   # two GPUs: DDP, then FSDP over two ranks
    python benchmarks/gpu_check_train.py --device cpu           # the same path on the CPU (bf16 is slow)

A one-process run joins a one-process group itself before the FSDP run (``mm.train.fsdp``: FSDP needs
a joined group), so the FSDP path runs on a single GPU too.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TINY = {
    "model": {
        "vision": {"kind": "open_clip", "image_size": 32, "patch_size": 8, "width": 32, "layers": 1,
                   "heads": 2},
        "fusion": {"kind": "mlp", "budget": 4},
        "text": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
                 "tie_word_embeddings": False},
        "max_length": 200,
    },
    "tasks": {"kinds": ["caption", "question"], "questions_per_note": 1},
    "optim": {"lr": 0.003, "warmup_steps": 1},
    "train": {"stage": "sft", "steps": 2, "batch_size": 4, "log_every": 1, "eval_every": 2,
              "checkpoint_every": 1, "gradient_checkpointing": True},
    "eval": {"notes": 2, "questions": 0, "batch_size": 2, "max_new_tokens": 6},
}  # fmt: skip
"""The tiny NoteVLM SFT config (2-layer Qwen2 LM), plus the device keys set from the command line."""


def make_world(folder: Path, notes: int) -> Path:
    """A small synthetic note folder with a test split of every 8th note."""
    from mm.data.format import read_notes, write_notes
    from mm.world.config import WorldConfig
    from mm.world.generate import write_world

    write_world(WorldConfig(notes=notes, seed=3, questions_per_note=2), folder)
    ns = read_notes(folder)
    for i, n in enumerate(ns):
        n.split = "test" if i % 8 == 0 else "train"
    write_notes(ns, folder)
    return folder


def train_once(world: Path, out: Path, *, device: str, precision: str, use_fsdp: bool) -> dict:
    """One ``mm train`` run in this process; its record, checked."""
    from mm.config import from_dict
    from mm.data.format import read_notes
    from mm.train import sft

    raw = json.loads(json.dumps(TINY))
    raw["train"].update(device=device, precision=precision, fsdp=use_fsdp)
    cfg = from_dict(sft.TrainConfig, raw)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()  # the peak of this run alone
    t0 = time.perf_counter()
    result = sft.train(
        cfg, out_dir=out, train_notes=read_notes(world, "train"), eval_notes=read_notes(world, "test"),
        root=world, show_progress=False,
    )  # fmt: skip
    launched = dist.is_initialized() and dist.get_world_size() > 1
    gpu = device.startswith("cuda")
    record = {
        "run": "fsdp" if use_fsdp else ("ddp" if launched else "plain"),
        "device": device,
        "precision": precision,
        "seconds": round(time.perf_counter() - t0, 2),
        "step_seconds": round(result.step_seconds, 4),
        "peak_gpu_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1) if gpu else None,
    }
    if not dist.is_initialized() or dist.get_rank() == 0:
        from mm.train import common

        recs = common.read_metrics(out / "metrics.jsonl")
        record["losses"] = [r["loss"] for r in recs if "loss" in r]
        evals = [r["eval/caption_loss"] for r in recs if "eval/caption_loss" in r]
        record["eval_caption_loss"] = evals[-1] if evals else None
    return record


def saved_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(out / "model" / "model.safetensors"))


def join_one_process_group(device: str) -> None:
    """A one-rank process group (FSDP needs a joined group), as a launcher would set it up."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0")
    backend = "cpu:gloo,cuda:nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend, rank=0, world_size=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="train.device (default cuda)")
    ap.add_argument("--precision", default="bf16", choices=["fp32", "bf16"], help="train.precision (bf16)")
    ap.add_argument("--notes", type=int, default=40, help="notes of the synthetic world (default 40)")
    ap.add_argument("--tol", type=float, default=2e-2, help="largest weight difference plain vs FSDP (2e-2)")
    ap.add_argument("--out", default=None, help="work folder (default: a temporary one)")
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(json.dumps({"error": "no CUDA device visible; pass --device cpu to run the path on the CPU"}))
        return 1
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    work = Path(args.out or tempfile.mkdtemp(prefix="gpu_check_train_"))
    rank = int(os.environ.get("RANK", "0"))
    world = work / "notes"
    if rank == 0 and not (world / "notes.jsonl").is_file():
        make_world(world, args.notes)
    if launched:  # the other ranks wait for the notes: join the group first, then a barrier
        from mm.train import common

        common.init_distributed("cpu:gloo,cuda:nccl" if args.device.startswith("cuda") else "gloo")
        dist.barrier()

    failures: list[str] = []
    plain = train_once(world, work / "plain", device=args.device, precision=args.precision, use_fsdp=False)
    if not dist.is_initialized():
        join_one_process_group(args.device)
    sharded = train_once(world, work / "fsdp", device=args.device, precision=args.precision, use_fsdp=True)
    if dist.get_rank() == 0:
        for rec in (plain, sharded):
            print(json.dumps(rec))
            if not rec["losses"] or not all(torch.isfinite(torch.tensor(rec["losses"]))):
                failures.append(f"{rec['run']}: losses not finite: {rec['losses']}")
        state = (work / "fsdp" / "checkpoints" / "step-00000002" / "state.json").read_text()
        if "layers.0.self_attn" not in state:  # FSDP saves the optimizer state keyed by parameter name
            failures.append("fsdp: the LM blocks were not sharded (optimizer state not keyed by name)")
        if sharded["eval_caption_loss"] is None:
            failures.append("fsdp: no held-out evaluation was logged")
        a, b = saved_weights(work / "plain"), saved_weights(work / "fsdp")
        if a.keys() != b.keys():
            failures.append(f"saved models differ in keys: {sorted(set(a) ^ set(b))[:4]}")
        diff = max((a[k].double() - b[k].double()).abs().max().item() for k in a.keys() & b.keys())
        if not diff <= args.tol:
            failures.append(f"plain and FSDP weights differ by {diff:.3g} > --tol {args.tol}")
        fp32 = all(v.dtype == torch.float32 for v in a.values())
        if not fp32:
            failures.append("the saved weights are not all float32 (master weights must stay float32)")
        print(json.dumps({
            "check": "ok" if not failures else "FAILED", "failures": failures, "max_weight_diff": diff,
            "processes": dist.get_world_size(), "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        }))  # fmt: skip
    dist.barrier()
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Device check of ``rl agent`` with a transformers family on a GPU: bfloat16 weights, LoRA, every stage.

Builds a tiny random Qwen2.5-VL (``tests/mm/adapter_helpers.py``: windowed tower, M-RoPE), then runs
``rl agent`` from it (``configs/rl/agent_tiny.yaml``: tool SFT, no-tool SFT, GRPO, PPO, export, eval) with
``policy.device``, ``policy.dtype=bfloat16``, ``policy.gradient_checkpointing`` and ``lora.enabled=true``.
Checks, each a failure (exit 1) when it does not hold: the run writes its report; the policy was on the
asked device with bfloat16 frozen weights and trainable adapters only; every stage's losses are finite;
the exported folder loads with transformers alone and its greedy answers to a few eval prompts equal the
adapter policy's. Prints one JSON line: stage seconds, peak GPU memory, the checks.

Usage::

    python benchmarks/gpu_check_agent.py                 # cuda (the current GPU)
    python benchmarks/gpu_check_agent.py --device cpu    # the same path on the CPU (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STEPS = [
    "data.train_tasks=8", "sft.steps=4", "grpo.steps=2", "grpo.checkpoint_every=1", "ppo.steps=2",
    "eval.n_boot=20", "eval.tasks_per_kind=2", "rollout.max_new_tokens=16", "rollout.max_tokens=32",
    "sft.micro_batch_size=2", "grpo.micro_batch_size=4", "ppo.micro_batch_size=4",
]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=None, help="run folder (default: a temporary one)")
    args = p.parse_args(argv)

    from mm.config import load_config
    from mm.train.metrics import read_metrics
    from rl.agent.config import AgentRunConfig
    from rl.agent.run import run_agent
    from rl.agent.stages import build_backend
    from tests.mm.adapter_helpers import build_family

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.out or tmp)
        folder = build_family("qwen2_5_vl", root / "qwen2_5_vl")
        sets = [*STEPS, f"policy.init={folder}", "policy.overrides=[]", f"policy.device={args.device}",
                "policy.dtype=bfloat16", "policy.gradient_checkpointing=true", "lora.enabled=true",
                "lora.r=8"]  # fmt: skip
        cfg = load_config(AgentRunConfig, ROOT / "configs/rl/agent_tiny.yaml", sets)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        checks: dict[str, bool] = {}
        backend = build_backend(cfg)
        model = backend.adapter.model
        checks["on_device"] = backend.adapter.device.type == torch.device(args.device).type
        frozen = [q for q in model.parameters() if not q.requires_grad]
        trained = [n for n, q in model.named_parameters() if q.requires_grad]
        checks["bf16_frozen"] = bool(frozen) and all(q.dtype == torch.bfloat16 for q in frozen)
        checks["adapters_only"] = bool(trained) and all("lora_" in n for n in trained)
        out = root / "run"
        report = run_agent(cfg, out, log=lambda _: None)
        checks["report"] = report is not None and (out / "report.md").is_file()
        losses = [r["loss"] for s in ("sft_tool", "sft_notool", "grpo", "ppo")
                  for r in read_metrics(out / s / "metrics.jsonl") if "loss" in r]  # fmt: skip
        checks["finite_losses"] = bool(losses) and all(math.isfinite(x) for x in losses)
        checks["export_matches_policy"] = _export_matches(cfg, out, args.device)
        line = {
            "device": args.device,
            "stage_seconds": (report or {}).get("stage_seconds"),
            "peak_gpu_mb": torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None,
            "checks": checks,
        }
        print(json.dumps(line))
    return 0 if all(checks.values()) else 1


def _export_matches(cfg, out: Path, device: str) -> bool:
    """Greedy answers of the exported folder (transformers alone) equal the adapter policy's."""
    from mm.model.adapter import Sample, load_adapter
    from rl.agent.stages import build_backend
    from tests.mm.adapter_helpers import random_image

    samples = [Sample(images=[random_image(32, 24, k)], text="What changed?") for k in range(3)]
    exported = load_adapter(str(out / "export/tool_grpo"), device=device, dtype="bfloat16")
    policy = build_backend(cfg, out / "grpo/model.pt").adapter
    a = exported.generate(samples, max_new_tokens=8)
    b = policy.generate(samples, max_new_tokens=8)
    return a == b


if __name__ == "__main__":
    raise SystemExit(main())

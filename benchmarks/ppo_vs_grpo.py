"""PPO with a critic against GRPO at the same sampling budget, from one SFT model, on held-out CHAIR.

    python benchmarks/ppo_vs_grpo.py --sft runs/sft/model --data runs/data/world --out runs/ppo_vs_grpo
    python benchmarks/ppo_vs_grpo.py ... --steps 40 --set-ppo critic=separate

Runs ``rl grpo --config configs/rl/grpo.yaml`` and ``rl ppo --config configs/rl/ppo.yaml`` (8 prompts x 8
responses and 32 prompts x 2 responses: 64 sampled responses of at most 80 tokens per step each, the same
steps, temperature and seed), one after the other in fresh processes, then evaluates both models and the
SFT model on the same ``--eval-notes`` held-out test notes (:func:`mm.eval.runners.evaluate_model`: CHAIR_i,
CHAIR_s, recall, bootstrap 95% intervals; POPE off). Writes OUT/grpo/, OUT/ppo/ (the runs),
OUT/summary.json (per model: CHAIR with intervals, recall, sampled tokens, training seconds) and
OUT/curves.png (reward, hallucination and coverage rewards and entropy of both runs against the
cumulative number of sampled tokens), and prints the summary.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CURVE_KEYS = ("reward_mean", "reward_hallucination", "reward_coverage", "entropy")


def train(kind: str, args: argparse.Namespace, out: Path, extra: list[str]) -> None:
    """``rl KIND --config configs/rl/KIND.yaml`` from the SFT model in a fresh process."""
    sets = [f"init.model={args.sft}", f"data.folder={args.data}", f"train.steps={args.steps}",
            f"train.checkpoint_every={args.steps}", f"train.seed={args.seed}", *extra]  # fmt: skip
    cmd = [sys.executable, "-m", "rl", kind, "--config", str(ROOT / "configs" / "rl" / f"{kind}.yaml"),
           "--out", str(out), "--no-progress", "--no-resume", "--set", *sets]  # fmt: skip
    subprocess.run(cmd, check=True)


def sampled_tokens(records: list[dict[str, Any]], responses_per_step: int) -> list[float]:
    """Cumulative sampled tokens after each step (PPO logs them; GRPO logs the mean response length)."""
    total, out = 0.0, []
    for r in records:
        total += r["sampled_tokens"] if "sampled_tokens" in r else r["response_len"] * responses_per_step
        out.append(total)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sft", required=True, help="SFT model folder both runs start from (mm train OUT/model)")
    p.add_argument("--data", required=True, help="the world note folder (mm data world)")
    p.add_argument("--out", default="runs/ppo_vs_grpo", help="output folder")
    p.add_argument("--steps", type=int, default=80, help="training steps of each run (both configs: 80)")
    p.add_argument("--seed", type=int, default=0, help="train.seed of both runs")
    p.add_argument("--eval-notes", type=int, default=200, help="held-out test notes evaluated")
    p.add_argument("--set-ppo", nargs="*", default=[], help="extra rl ppo overrides, e.g. critic=separate")
    args = p.parse_args()
    out = Path(args.out)
    runs = {"grpo": out / "grpo", "ppo": out / "ppo"}
    for kind, folder in runs.items():
        train(kind, args, folder, args.set_ppo if kind == "ppo" else [])

    from mm.config import load_config
    from mm.eval.runners import evaluate_model
    from mm.train.metrics import read_metrics
    from rl.trainers.grpo import GRPOConfig
    from rl.trainers.ppo_config import PPOConfig

    summary: dict[str, Any] = {"steps": args.steps, "seed": args.seed, "eval_notes": args.eval_notes}
    curves = {}
    for kind, folder in {"sft": Path(args.sft), **{k: v / "model" for k, v in runs.items()}}.items():
        res = evaluate_model(folder, args.data, split="test", notes=args.eval_notes, pope_splits=(),
                             batch_size=64, max_new_tokens=128)  # fmt: skip
        row: dict[str, Any] = {**res["chair"], "intervals": res["chair_intervals"]}
        if kind != "sft":
            cls = GRPOConfig if kind == "grpo" else PPOConfig
            cfg = load_config(cls, runs[kind] / "config.yaml")
            records = read_metrics(runs[kind] / "metrics.jsonl")
            tokens = sampled_tokens(records, cfg.data.prompts_per_step * cfg.rollout.group_size)
            result = json.loads((runs[kind] / "result.json").read_text())
            row.update(sampled_tokens=tokens[-1], train_seconds=result["train_seconds"])
            curves[kind] = [{**r, "sampled_tokens_total": t} for r, t in zip(records, tokens)]
        summary[kind] = row
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(curves, out / "curves.png")
    for kind in ("sft", "grpo", "ppo"):
        r, ci = summary[kind], summary[kind]["intervals"]["chair_i"]
        extra = f"  sampled tokens {r['sampled_tokens']:.0f}" if "sampled_tokens" in r else ""
        print(f"{kind:5s} CHAIR_i {r['chair_i']:.4f} [{ci['low']:.4f}, {ci['high']:.4f}]  recall "
              f"{r['recall']:.4f}  CHAIR_s {r['chair_s']:.3f}{extra}")  # fmt: skip
    return 0


def plot(curves: dict[str, list[dict[str, Any]]], png: Path) -> None:
    """Both runs' :data:`CURVE_KEYS` against the cumulative sampled tokens, one panel per key."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(CURVE_KEYS), figsize=(4 * len(CURVE_KEYS), 3.2))
    for ax, key in zip(axes, CURVE_KEYS):
        for kind, recs in curves.items():
            pts = [(r["sampled_tokens_total"], r[key]) for r in recs if key in r]
            if pts:
                ax.plot(*zip(*pts), label=kind)
        ax.set_title(key)
        ax.set_xlabel("sampled tokens")
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())

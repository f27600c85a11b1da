"""PPO with a critic against GRPO at the same sampling budget, from one SFT model, on held-out CHAIR.

    python benchmarks/ppo_vs_grpo.py --sft runs/sft/model --data runs/data/world --out runs/ppo_vs_grpo
    python benchmarks/ppo_vs_grpo.py ... --steps 40 --set-ppo critic=separate
    python benchmarks/ppo_vs_grpo.py --sft RUN/world1/sft/model --data RUN/world1/data/world \
        --grpo-run RUN/world1/grpo --out runs/pvg_w1 --label "world 1, seed 0"   # reuse a pipeline's GRPO
    python benchmarks/ppo_vs_grpo.py --table runs/pvg_w0 runs/pvg_w1 runs/pvg_w2   # the table over runs

Runs ``rl grpo --config configs/rl/grpo.yaml`` and ``rl ppo --config configs/rl/ppo.yaml`` (8 prompts x 8
responses and 32 prompts x 2 responses: 64 sampled responses of at most 80 tokens per step each, the same
steps, temperature and seed), one after the other in fresh processes, then evaluates both models and the
SFT model on the same ``--eval-notes`` held-out test notes (:func:`mm.eval.runners.evaluate_model`: CHAIR_i,
CHAIR_s, recall, bootstrap 95% intervals; POPE off; batch 64 and 128 new tokens, as ``rl pipeline``'s eval).
``--grpo-run DIR`` / ``--ppo-run DIR`` reuse a finished run instead of training one: an ``rl grpo`` /
``rl ppo`` output folder, or a post-training stage folder of ``rl pipeline`` (``OUT/worldW/grpo``,
``OUT/worldW/seeds/S/grpo``). Writes OUT/grpo/, OUT/ppo/ (the runs it trained), OUT/summary.json (per
model: CHAIR with intervals, recall, the relative CHAIR_i cut against SFT, sampled tokens, training
seconds; and PPO's cut minus GRPO's in points) and OUT/curves.png (reward, hallucination and coverage
rewards and entropy of both runs against the cumulative number of sampled tokens), and prints the summary.

``--table OUT...`` trains nothing: it reads those folders' summary.json files and prints a Markdown table,
one row per folder and the mean over them with a 95% Student-t interval
(:func:`rl.pipeline_table.t_interval`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CURVE_KEYS = ("reward_mean", "reward_hallucination", "reward_coverage", "entropy")
TABLE_KEYS = ("grpo_cut", "ppo_cut", "cut_diff_points", "grpo_tokens", "ppo_tokens", "tokens_ratio")
"""Per-run quantities of :func:`table_rows`, averaged over runs by :func:`table`."""


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


def run_record(folder: Path) -> tuple[dict[str, Any], float]:
    """``(config dict, training seconds)`` of a finished run: ``config.yaml`` + ``result.json`` of an
    ``rl grpo`` / ``rl ppo`` output folder, or the ``stage.json`` of an ``rl pipeline`` stage folder."""
    import yaml

    if (folder / "config.yaml").is_file() and (folder / "result.json").is_file():
        result = json.loads((folder / "result.json").read_text())
        return yaml.safe_load((folder / "config.yaml").read_text()), float(result["train_seconds"])
    if (folder / "stage.json").is_file():
        stage = json.loads((folder / "stage.json").read_text())
        return stage["config"], float(stage["metrics"]["train_seconds"])
    raise SystemExit(
        f"{folder} is not a finished run: expected config.yaml + result.json (rl grpo / rl ppo --out) or "
        "stage.json (an rl pipeline stage folder); wait for the run to finish or pass its folder"
    )


def chair_cut(sft: float, model: float) -> float:
    """Relative CHAIR_i cut against SFT: ``(sft - model) / sft`` (0.6 = 60% fewer hallucinated mentions;
    minus :func:`rl.report.changes`' ``chair_i_rel_change``)."""
    if sft <= 0:
        raise ValueError(f"the SFT model's CHAIR_i is {sft}: no hallucinations to cut")
    return (sft - model) / sft


def table_rows(summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per labelled summary: GRPO's and PPO's CHAIR_i cuts, their difference in points, the sampled
    tokens of each run and PPO's tokens over GRPO's."""
    rows = []
    for label, s in summaries.items():
        g, p = s["grpo"], s["ppo"]
        rows.append({
            "label": label, "sft_chair_i": s["sft"]["chair_i"], "grpo_chair_i": g["chair_i"],
            "ppo_chair_i": p["chair_i"], "grpo_recall": g["recall"], "ppo_recall": p["recall"],
            "grpo_cut": g["chair_i_cut"], "ppo_cut": p["chair_i_cut"],
            "cut_diff_points": 100.0 * (p["chair_i_cut"] - g["chair_i_cut"]),
            "grpo_tokens": g["sampled_tokens"], "ppo_tokens": p["sampled_tokens"],
            "tokens_ratio": p["sampled_tokens"] / g["sampled_tokens"],
        })  # fmt: skip
    return rows


def table(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Mean of each :data:`TABLE_KEYS` quantity over ``rows`` and its 95% Student-t interval (None below
    two rows)."""
    from rl.pipeline_table import t_interval

    out = {}
    for key in TABLE_KEYS:
        values = [r[key] for r in rows]
        out[key] = {"mean": statistics.fmean(values), "interval": t_interval(values)}
    return out


def markdown(rows: list[dict[str, Any]], means: dict[str, dict[str, Any]]) -> str:
    """The table: a row per run, then the mean with its interval."""
    head = ("| run | SFT CHAIR_i | GRPO CHAIR_i | PPO CHAIR_i | GRPO cut | PPO cut | PPO - GRPO (points) "
            "| GRPO sampled tokens | PPO sampled tokens | PPO / GRPO tokens "
            "| recall GRPO / PPO |")  # fmt: skip
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for r in rows:
        lines.append(
            f"| {r['label']} | {r['sft_chair_i']:.3f} | {r['grpo_chair_i']:.3f} | {r['ppo_chair_i']:.3f} | "
            f"{r['grpo_cut']:.1%} | {r['ppo_cut']:.1%} | {r['cut_diff_points']:+.1f} | "
            f"{r['grpo_tokens']:,.0f} | {r['ppo_tokens']:,.0f} | {r['tokens_ratio']:.3f} | "
            f"{r['grpo_recall']:.3f} / {r['ppo_recall']:.3f} |"
        )

    def cell(key: str, fmt: str) -> str:
        m, ci = means[key]["mean"], means[key]["interval"]
        return fmt.format(m) + ("" if ci is None else " [" + ", ".join(fmt.format(x) for x in ci) + "]")

    lines.append(
        f"| **mean [95% t interval]** | | | | {cell('grpo_cut', '{:.1%}')} | {cell('ppo_cut', '{:.1%}')} | "
        f"{cell('cut_diff_points', '{:+.1f}')} | {cell('grpo_tokens', '{:,.0f}')} | "
        f"{cell('ppo_tokens', '{:,.0f}')} | {cell('tokens_ratio', '{:.3f}')} | |"
    )
    return "\n".join(lines)


def print_table(folders: list[str]) -> int:
    summaries = {}
    for f in folders:
        path = Path(f) / "summary.json"
        if not path.is_file():
            raise SystemExit(f"{path} is missing: run this benchmark with --out {f} first")
        s = json.loads(path.read_text())
        summaries[s.get("label") or f] = s
    rows = table_rows(summaries)
    print(markdown(rows, table(rows)))
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sft", help="SFT model folder both runs start from (mm train OUT/model)")
    p.add_argument("--data", help="the world note folder (mm data world)")
    p.add_argument("--out", default="runs/ppo_vs_grpo", help="output folder")
    p.add_argument("--steps", type=int, default=80, help="training steps of each run (both configs: 80)")
    p.add_argument("--seed", type=int, default=0, help="train.seed of both runs")
    p.add_argument("--eval-notes", type=int, default=200, help="held-out test notes evaluated")
    p.add_argument("--set-ppo", nargs="*", default=[], help="extra rl ppo overrides, e.g. critic=separate")
    p.add_argument("--grpo-run", default=None, help="a finished GRPO run to reuse instead of training one")
    p.add_argument("--ppo-run", default=None, help="a finished PPO run to reuse instead of training one")
    p.add_argument("--label", default=None, help="the run's name in --table (default: its OUT folder)")
    p.add_argument("--table", nargs="+", default=None, metavar="OUT", help="only print the table over these")
    args = p.parse_args(argv)
    if args.table:
        return print_table(args.table)
    if not (args.sft and args.data):
        p.error("--sft and --data are needed unless --table is given")
    out = Path(args.out)
    runs = {"grpo": out / "grpo", "ppo": out / "ppo"}
    for kind, given in (("grpo", args.grpo_run), ("ppo", args.ppo_run)):
        if given:
            runs[kind] = Path(given)
            run_record(runs[kind])  # fails early on an unfinished run
        else:
            train(kind, args, runs[kind], args.set_ppo if kind == "ppo" else [])

    from mm.eval.runners import evaluate_model
    from mm.train.metrics import read_metrics

    summary: dict[str, Any] = {"steps": args.steps, "seed": args.seed, "eval_notes": args.eval_notes,
                               "label": args.label, "runs": {k: str(v) for k, v in runs.items()}}  # fmt: skip
    curves = {}
    for kind, folder in {"sft": Path(args.sft), **{k: v / "model" for k, v in runs.items()}}.items():
        res = evaluate_model(folder, args.data, split="test", notes=args.eval_notes, pope_splits=(),
                             batch_size=64, max_new_tokens=128)  # fmt: skip
        row: dict[str, Any] = {**res["chair"], "intervals": res["chair_intervals"]}
        if kind != "sft":
            cfg, seconds = run_record(runs[kind])
            records = read_metrics(runs[kind] / "metrics.jsonl")
            tokens = sampled_tokens(records, cfg["data"]["prompts_per_step"] * cfg["rollout"]["group_size"])
            row.update(sampled_tokens=tokens[-1], train_seconds=seconds, train_seed=cfg["train"]["seed"],
                       chair_i_cut=chair_cut(summary["sft"]["chair_i"], row["chair_i"]))  # fmt: skip
            curves[kind] = [{**r, "sampled_tokens_total": t} for r, t in zip(records, tokens)]
        summary[kind] = row
    summary["cut_diff_points"] = 100.0 * (summary["ppo"]["chair_i_cut"] - summary["grpo"]["chair_i_cut"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(curves, out / "curves.png", title=args.label)
    for kind in ("sft", "grpo", "ppo"):
        r, ci = summary[kind], summary[kind]["intervals"]["chair_i"]
        extra = ""
        if kind != "sft":
            extra = f"  cut {r['chair_i_cut']:.1%}  sampled tokens {r['sampled_tokens']:.0f}"
        print(f"{kind:5s} CHAIR_i {r['chair_i']:.4f} [{ci['low']:.4f}, {ci['high']:.4f}]  recall "
              f"{r['recall']:.4f}  CHAIR_s {r['chair_s']:.3f}{extra}")  # fmt: skip
    print(f"PPO's cut - GRPO's: {summary['cut_diff_points']:+.1f} points")
    return 0


def plot(curves: dict[str, list[dict[str, Any]]], png: Path, *, title: str | None = None) -> None:
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
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())

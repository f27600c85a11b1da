"""Entropy collapse of plain GRPO and one remedy (:mod:`rl.entropy`), per SFT model, on held-out CHAIR.

    python benchmarks/entropy_collapse.py --sft runs/w0/sft/model --data runs/w0/data/world --out runs/ent
    python benchmarks/entropy_collapse.py --sft W0/sft/model W1/sft/model --data W0/data/world W1/data/world \
        --out runs/ent --remedy entropy_bonus

For each (SFT model, note folder) pair: ``rl grpo --config configs/rl/grpo_entropy.yaml`` (plain GRPO set up
to lose entropy: temperature 0.5, no KL, no dense credit, a 10x learning rate, 64 training notes) and the
same run with the ``--remedy`` overrides (:data:`REMEDIES`), one after the other in fresh processes with
the same seed; then the SFT model and both runs' models on ``--eval-notes`` held-out test notes
(:func:`mm.eval.runners.evaluate_model`: CHAIR_i and recall with bootstrap 95% intervals; POPE off).

Criteria (:func:`run_report`, over the per-step ``entropy`` and ``reward_mean`` of metrics.jsonl, with
``W = --window`` steps): a run *collapses* when the mean entropy of its last W steps is below
``--floor`` times that of its first W steps; it *holds the floor* when the W-step rolling mean of its
entropy stays at or above ``--floor`` times its first-W mean over the whole run; its reward *rises*
when the last-W minus first-W mean reward has a 95% Student-t interval (over steps, pooled variance)
above 0. ``zero_std_first`` / ``zero_std_last``: the share of groups whose responses all got one reward
(no learning signal), a symptom of collapse. Across pairs the means get a 95% Student-t interval over
worlds (:func:`rl.pipeline_table.t_interval`).

The per-step reward mixes policy and prompt draw (8 notes a step, whose rewards differ by more than the
policy moves), and its first window already follows the steepest steps. ``--reward-notes N`` adds the
direct measure: each model's *expected* reward (:func:`sampled_reward`: the run's own reward over
``rollout.group_size`` captions per note at the run's temperature, every model drawing from the same
seeded streams) on the notes it trained on and on ``N`` held-out test notes; a run's reward *rises* on a
split when the paired bootstrap 95% interval over notes of its mean minus the SFT model's lies above 0.

Writes OUT/<name>/{plain,remedy}/ (the runs), OUT/summary.json, OUT/entropy.png (entropy and reward
curves of both runs, one row per pair) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "rl" / "grpo_entropy.yaml"
REMEDIES: dict[str, list[str]] = {
    "clip_cov": ["algo.loss_mode=clip_cov", "algo.clip_cov_ratio=0.02"],
    "kl_cov": ["algo.loss_mode=kl_cov", "algo.kl_cov_ratio=0.002", "algo.num_iterations=2"],
    "entropy_bonus": ["algo.entropy_coef=0.02"],
    "forking": ["algo.forking_top=0.2"],
}
"""Remedy name -> the ``rl grpo --set`` overrides that switch it on over the plain config. Clip-Cov drops
the gradient of 2% of the response tokens (verl's 2e-4 is one token of a 3,000-token batch here) drawn
from verl's covariance window (1, 5); KL-Cov needs a second update per rollout (its penalty is 0 on the
first)."""
RUNS = ("plain", "remedy")


def window_means(values: Sequence[float], window: int) -> tuple[float, float]:
    """Means of the first and the last ``window`` values (needs ``len(values) >= window >= 1``)."""
    if window < 1 or len(values) < window:
        raise ValueError(f"need at least window={window} >= 1 values, got {len(values)}")
    return statistics.fmean(values[:window]), statistics.fmean(values[-window:])


def rolling_min(values: Sequence[float], window: int) -> float:
    """The least mean of ``window`` consecutive values (needs ``len(values) >= window >= 1``)."""
    if window < 1 or len(values) < window:
        raise ValueError(f"need at least window={window} >= 1 values, got {len(values)}")
    return min(statistics.fmean(values[i : i + window]) for i in range(len(values) - window + 1))


def gain_interval(values: Sequence[float], window: int) -> list[float]:
    """95% Student-t interval of ``mean(last window) - mean(first window)`` (pooled variance, over steps;
    needs ``window >= 2``). Steps are autocorrelated, so this is narrower than a repeat over seeds."""
    if window < 2:
        raise ValueError(f"an interval over steps needs window >= 2, got {window}")
    from rl.pipeline_table import t_quantile

    first, last = list(values[:window]), list(values[-window:])
    gain = statistics.fmean(last) - statistics.fmean(first)
    pooled = (statistics.variance(first) + statistics.variance(last)) / 2
    half = t_quantile(2 * window - 2) * math.sqrt(pooled * 2 / window)
    return [gain - half, gain + half]


def run_report(
    entropy: Sequence[float], reward: Sequence[float], *, window: int, floor: float
) -> dict[str, Any]:
    """Collapse, floor and reward figures of one run's per-step ``entropy`` and ``reward`` (see the
    module docstring); ``floor`` in (0, 1) is the share of the first-window entropy."""
    if len(entropy) != len(reward):
        raise ValueError(f"entropy and reward need one value per step; got {len(entropy)} and {len(reward)}")
    if not 0 < floor < 1:
        raise ValueError(f"floor is a share of the starting entropy, in (0, 1); got {floor}")
    if len(entropy) < 2 * window:
        raise ValueError(f"need at least 2 * window = {2 * window} steps, got {len(entropy)}")
    e_first, e_last = window_means(entropy, window)
    r_first, r_last = window_means(reward, window)
    gain_ci = gain_interval(reward, window)
    return {
        "steps": len(entropy),
        "entropy_first": e_first,
        "entropy_last": e_last,
        "entropy_ratio": e_last / e_first,
        "entropy_min": rolling_min(entropy, window),
        "entropy_floor": floor * e_first,
        "collapsed": e_last < floor * e_first,
        "above_floor": rolling_min(entropy, window) >= floor * e_first,
        "reward_first": r_first,
        "reward_last": r_last,
        "reward_gain": r_last - r_first,
        "reward_gain_interval": gain_ci,
        "reward_rises": gain_ci[0] > 0,
    }


def across_worlds(rows: list[dict[str, Any]], keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Mean, 95% Student-t interval over the rows (None with one row) and the values of each key."""
    from rl.pipeline_table import t_interval

    out = {}
    for k in keys:
        vals = [float(r[k]) for r in rows]
        out[k] = {"mean": statistics.fmean(vals), "interval": t_interval(vals), "values": vals}
    return out


def train(cfg: Path, sft: str, data: str, out: Path, args: argparse.Namespace, extra: list[str]) -> None:
    """``rl grpo --config cfg`` from the SFT model in a fresh process (skipped when ``--reuse`` finds it
    done)."""
    if args.reuse and (out / "result.json").is_file():
        return
    sets = [f"init.model={sft}", f"data.folder={data}", f"train.seed={args.seed}", *args.set, *extra]
    if args.steps:
        sets += [f"train.steps={args.steps}", f"train.checkpoint_every={args.steps}"]
    cmd = [sys.executable, "-m", "rl", "grpo", "--config", str(cfg), "--out", str(out), "--no-progress",
           "--no-resume", "--set", *sets]  # fmt: skip
    subprocess.run(cmd, check=True)


def evaluate(model: Path, data: str, notes: int, cache: Path, reuse: bool) -> dict[str, Any]:
    """CHAIR_i, recall and CHAIR_s with their bootstrap intervals on held-out test notes, written to
    ``cache`` (read back from it when ``reuse`` and it holds the same number of notes)."""
    if reuse and cache.is_file():
        kept = json.loads(cache.read_text())
        if kept.get("eval_notes") == notes:
            return kept
    from mm.eval.runners import evaluate_model

    res = evaluate_model(model, data, split="test", notes=notes, pope_splits=(), batch_size=64,
                         max_new_tokens=128)  # fmt: skip
    out = {**res["chair"], "intervals": res["chair_intervals"], "eval_notes": notes}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(out, indent=1))
    return out


def sampled_reward(
    model: Path,
    data: str,
    cfg: dict[str, Any],
    *,
    split: str,
    notes: int | None,
    seed: int,
    cache: Path,
    reuse: bool,
) -> dict[str, Any]:
    """The run's own reward, expected under its own sampling, on ``notes`` notes of ``split``.

    ``cfg`` is a run's config.yaml (the plain config for the SFT model): each note gets
    ``rollout.group_size`` captions at ``rollout.temperature`` (at most ``rollout.max_new_tokens``),
    note ``i`` drawing from the seeded stream ``seed * 1_000_003 + i`` for every model (common random
    numbers), scored by :func:`rl.rewards.score` with the run's ``reward`` weights. Returns the per-note
    mean rewards (``units``, for paired intervals) and their mean, cached in ``cache``.
    """
    if reuse and cache.is_file():
        kept = json.loads(cache.read_text())
        if kept.get("split") == split and kept.get("limit") == notes and kept.get("seed") == seed:
            return kept
    from mm.eval.runners import held_out_notes, load_eval_adapter
    from mm.model.adapter import Sample
    from rl.rewards import RewardConfig, score
    from rl.rollout.base import SamplingSpec
    from rl.rollout.local import LocalEngine

    ro, rw = cfg["rollout"], cfg["reward"]
    keep = ("coverage_weight", "hallucination_weight", "caption_weight", "vocab")
    reward = RewardConfig(**{k: rw[k] for k in keep})
    spec = SamplingSpec(group_size=ro["group_size"], max_new_tokens=ro["max_new_tokens"],
                        temperature=ro["temperature"])  # fmt: skip
    held = held_out_notes(data, split=split, limit=notes)
    adapter = load_eval_adapter(model, device="cpu")
    engine = LocalEngine(adapter, spec)
    units: list[float] = []
    for lo in range(0, len(held), 16):
        batch = held[lo : lo + 16]
        samples = [Sample(images=[str(Path(data) / p) for p in n.images], text=cfg["data"]["caption_prompt"])
                   for n in batch]  # fmt: skip
        seeds = [seed * 1_000_003 + lo + i for i in range(len(batch))]
        ids = engine.generate(samples, seeds=seeds).token_ids  # group-major: G per note
        texts = [t.strip() for t in adapter.tokenizer.batch_decode(ids, skip_special_tokens=True)]
        G = spec.group_size
        for i, n in enumerate(batch):
            objs = sorted(n.categories)
            group = texts[i * G : (i + 1) * G]
            units.append(statistics.fmean(score(t, objs, cfg=reward).total for t in group))
    out = {"split": split, "limit": notes, "notes": len(held), "seed": seed, "mean": statistics.fmean(units),
           "units": units}  # fmt: skip
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(out))
    return out


def reward_change(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """``after - before`` mean sampled reward with its paired 95% bootstrap interval over notes."""
    from mm.eval.bootstrap import paired_change_interval

    b, a = before["units"], after["units"]
    iv = paired_change_interval((b, [1.0] * len(b)), (a, [1.0] * len(a)), relative=False)
    return {"gain": iv.value, "interval": [iv.low, iv.high], "rises": iv.low > 0}


def pair(name: str, sft: str, data: str, out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Both runs of one SFT model, their reports, curves and held-out CHAIR."""
    from mm.train.metrics import read_metrics

    row: dict[str, Any] = {
        "name": name,
        "sft": sft,
        "data": data,
        "sft_eval": evaluate(Path(sft), data, args.eval_notes, out / name / "sft_eval.json", args.reuse),
    }
    for run, extra in zip(RUNS, ([], remedy_overrides(args))):
        folder = out / name / run
        train(Path(args.config), sft, data, folder, args, extra)
        recs = [r for r in read_metrics(folder / "metrics.jsonl") if "entropy" in r]
        ent, rew = [r["entropy"] for r in recs], [r["reward_mean"] for r in recs]
        zero_std = window_means([r["zero_std_frac"] for r in recs], args.window)
        row[run] = {
            **run_report(ent, rew, window=args.window, floor=args.floor),
            "zero_std_first": zero_std[0],
            "zero_std_last": zero_std[1],
            "curves": {"entropy": ent, "reward_mean": rew},
            "eval": evaluate(folder / "model", data, args.eval_notes, folder / "eval.json", args.reuse),
        }
    if args.reward_notes:
        add_sampled_rewards(row, Path(sft), data, out / name, args)
    return row


def add_sampled_rewards(
    row: dict[str, Any], sft: Path, data: str, folder: Path, args: argparse.Namespace
) -> None:
    """Each run's and the SFT model's expected reward (:func:`sampled_reward`) on the training notes and on
    ``--reward-notes`` held-out test notes, and each run's paired gain over the SFT model."""
    import yaml

    for run in RUNS:
        cfg = yaml.safe_load((folder / run / "config.yaml").read_text())
        for split, n in (("train", cfg["data"]["notes"] or None), ("test", args.reward_notes)):
            key = f"sampled_reward_{split}"
            if run == RUNS[0]:
                row[key] = sampled_reward(sft, data, cfg, split=split, notes=n, seed=args.seed,
                                          cache=folder / f"sft_{key}.json", reuse=args.reuse)  # fmt: skip
            mine = sampled_reward(folder / run / "model", data, cfg, split=split, notes=n, seed=args.seed,
                                  cache=folder / run / f"{key}.json", reuse=args.reuse)  # fmt: skip
            row[run][key] = {"mean": mine["mean"], **reward_change(row[key], mine)}


def remedy_overrides(args: argparse.Namespace) -> list[str]:
    """The remedy run's overrides: ``--remedy``'s, then ``--remedy-set`` (later ones win)."""
    return [*REMEDIES[args.remedy], *args.remedy_set]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per run kind: the mean over pairs (95% t interval over worlds) of the headline figures."""
    keys = ("entropy_first", "entropy_last", "entropy_ratio", "entropy_min", "reward_first", "reward_last",
            "reward_gain", "zero_std_first", "zero_std_last")  # fmt: skip
    out: dict[str, Any] = {}
    for run in RUNS:
        flat = [{**r[run], **{k: r[run]["eval"][k] for k in ("chair_i", "recall")}} for r in rows]
        out[run] = {
            **across_worlds(flat, (*keys, "chair_i", "recall")),
            "collapsed": sum(r["collapsed"] for r in flat),
            "above_floor": sum(r["above_floor"] for r in flat),
            "reward_rises": sum(r["reward_rises"] for r in flat),
            "pairs": len(flat),
        }
    return out


def table(rows: list[dict[str, Any]], means: dict[str, Any]) -> str:
    """One line per (pair, run) and the means over pairs."""
    head = (f"{'pair':8s} {'run':6s} {'H first':>8s} {'H last':>7s} {'ratio':>6s} {'H min':>6s} "
            f"{'R first':>8s} {'R last':>7s} {'R gain [95% over steps]':>26s} {'CHAIR_i':>8s} "
            f"{'recall':>7s}")  # fmt: skip
    lines = [head]
    for r in rows:
        blank = " " * 71
        lines.append(f"{r['name']:8s} {'sft':6s} {blank} {r['sft_eval']['chair_i']:8.3f} "
                     f"{r['sft_eval']['recall']:7.3f}")  # fmt: skip
        for run in RUNS:
            x, ev = r[run], r[run]["eval"]
            ci = x["reward_gain_interval"]
            flags = ("collapsed " if x["collapsed"] else "") + ("floor-held" if x["above_floor"] else "")
            lines.append(
                f"{r['name']:8s} {run:6s} {x['entropy_first']:8.3f} {x['entropy_last']:7.3f} "
                f"{x['entropy_ratio']:6.2f} {x['entropy_min']:6.3f} {x['reward_first']:8.3f} "
                f"{x['reward_last']:7.3f} {x['reward_gain']:+7.3f} [{ci[0]:+.3f}, {ci[1]:+.3f}] "
                f"{ev['chair_i']:8.3f} {ev['recall']:7.3f}  {flags}{sampled_text(x)}"
            )  # fmt: skip
    for run in RUNS:
        parts = []
        for k in ("entropy_ratio", "reward_gain", "chair_i", "recall"):
            m, ci = means[run][k]["mean"], means[run][k]["interval"]
            parts.append(f"{k} {m:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else ""))
        lines.append(f"mean {run:6s} " + "  ".join(parts))
    return "\n".join(lines)


def sampled_text(run: dict[str, Any]) -> str:
    """`` R~train +g [lo, hi] R~test ...``: a run's sampled-reward gains over SFT, when measured."""
    parts = []
    for split in ("train", "test"):
        x = run.get(f"sampled_reward_{split}")
        if x:
            lo, hi = x["interval"]
            parts.append(f" R~{split} {x['mean']:.3f} ({x['gain']:+.3f} [{lo:+.3f}, {hi:+.3f}])")
    return "".join(parts)


def plot(rows: list[dict[str, Any]], png: Path, floor: float) -> None:
    """Entropy and mean reward per step of both runs, one row per pair; the entropy floor dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(rows), 2, figsize=(9, 3 * len(rows)), squeeze=False)
    for (ax_e, ax_r), r in zip(axes, rows):
        for run, color in zip(RUNS, ("tab:blue", "tab:orange")):
            c = r[run]["curves"]
            ax_e.plot(range(1, len(c["entropy"]) + 1), c["entropy"], c=color, label=run)
            ax_r.plot(range(1, len(c["reward_mean"]) + 1), c["reward_mean"], c=color, label=run)
            ax_e.axhline(
                r[run]["entropy_floor"], ls="--", c=color, lw=1, label=f"{run} floor ({floor:g} x start)"
            )
        ax_e.set_title(f"{r['name']}: token entropy (nats)")
        ax_r.set_title(f"{r['name']}: reward_mean")
        for ax in (ax_e, ax_r):
            ax.set_xlabel("step")
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=80)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sft", nargs="+", required=True, help="SFT model folders (mm train OUT/model)")
    p.add_argument("--data", nargs="+", required=True, help="the world note folders, in --sft's order")
    p.add_argument("--names", nargs="*", default=None, help="a name per pair (default world0, world1, ...)")
    p.add_argument("--out", default="runs/entropy_collapse", help="output folder")
    p.add_argument("--config", default=str(CONFIG), help="the plain GRPO config both runs start from")
    p.add_argument("--remedy", choices=sorted(REMEDIES), default="clip_cov", help="remedy of the second run")
    p.add_argument("--steps", type=int, default=0, help="train.steps of each run (0: the config's)")
    p.add_argument("--seed", type=int, default=0, help="train.seed of every run")
    p.add_argument("--set", nargs="*", default=[], help="extra rl grpo overrides for both runs")
    p.add_argument("--remedy-set", nargs="*", default=[], help="extra overrides for the remedy run only")
    p.add_argument("--window", type=int, default=10, help="steps averaged at the start and at the end")
    p.add_argument("--floor", type=float, default=0.8, help="entropy floor: share of the starting entropy")
    p.add_argument("--eval-notes", type=int, default=200, help="held-out test notes evaluated")
    p.add_argument(
        "--reward-notes",
        type=int,
        default=0,
        help="held-out test notes on which each model's sampled reward is measured (0: off)",
    )
    p.add_argument("--reuse", action="store_true", help="keep runs and evaluations already done under OUT")
    args = p.parse_args(argv)
    names = args.names or [f"world{i}" for i in range(len(args.sft))]
    if len(args.data) != len(args.sft) or len(names) != len(args.sft):
        p.error(f"need one --data (and --names) per --sft; got {len(args.sft)} --sft, {len(args.data)} "
                f"--data, {len(names)} names")  # fmt: skip
    out = Path(args.out)
    rows = [pair(n, s, d, out, args) for n, s, d in zip(names, args.sft, args.data)]
    means = summarize(rows)
    summary = {"remedy": args.remedy, "remedy_overrides": remedy_overrides(args), "config": args.config,
               "seed": args.seed, "window": args.window, "floor": args.floor, "eval_notes": args.eval_notes,
               "pairs": rows, "mean": means}  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(rows, out / "entropy.png", args.floor)
    print(table(rows, means))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

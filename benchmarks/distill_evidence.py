"""Evidence for ``rl distill``: on-policy distillation (OPD) vs off-policy KD at equal student compute.

A bigger NoteVLM model is the teacher, a smaller SFT model the student. From the student, each method
trains ``--steps`` optimizer steps of ``--batch`` captions (the same prompts, learning rate, schedule,
rollout temperature and trainable parameters; OPD samples them with the student, KD with the teacher):

- ``opd``: ``loss.kind=reverse_kl`` (exact per-token KL(student || teacher) on the student's samples);
- ``kd``: ``loss.kind=sft_on_teacher`` (the student's NLL on teacher samples);
- with ``--methods``, also ``opd_forward`` (forward KL(teacher || student) on the student's samples, the
  recipe of ``configs/rl/distill.yaml``) and ``gkd`` (GKD's generalised JSD, beta 0.5, on half student
  and half teacher samples). ``--set KEY=VALUE`` applies to every method alike.

Then the student before, the teacher and each trained student caption the same held-out notes greedily,
scored by CHAIR_i and recall with 95% bootstrap intervals over notes; the share of the student-teacher
gap each method closes (``(S - M) / (S - T)`` for CHAIR_i, ``(M - S) / (T - S)`` for recall) comes with a
paired bootstrap interval (the same resampled notes for the three models), and so does each method's
share minus off-policy KD's at the same training seed (``minus_kd``).

    python benchmarks/distill_evidence.py --teacher runs/sft/model --student runs/sft-small/model \\
        --data runs/data/world --out runs/distill_evidence --steps 60 --batch 16 --eval-notes 100

Writes OUT/evidence.json (with the per-note units, so runs made in separate processes can be merged)
and prints a table; each run's folder is OUT/<method>_seed<k>. ``distill_worlds.py`` reads the outputs of
several worlds: the mean over worlds with a Student-t interval and whether the target holds.
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

METHODS = {
    "opd": ["loss.kind=reverse_kl", "data.lmbda=1"],
    "kd": ["loss.kind=sft_on_teacher"],
    "opd_forward": ["loss.kind=gjsd", "loss.beta=0", "data.lmbda=1"],
    "gkd": ["loss.kind=gjsd", "loss.beta=0.5", "data.lmbda=0.5", "data.off_policy=teacher"],
}
"""Method -> its ``rl distill`` overrides (default: opd and kd; opd_forward: forward KL on the student's
samples; gkd: GKD's JSD with beta 0.5 on half student, half teacher samples)."""


def caption_units(
    adapter: Any, notes: Any, *, batch_size: int, max_new_tokens: int
) -> dict[str, list[float]]:
    """Greedy captions of every held-out note, scored per note (hallucinated, mentions, covered, gt)."""
    from mm.eval.bootstrap import chair_units
    from mm.eval.chair import Vocabulary, chair_scores

    captions: list[str] = []
    with torch.no_grad():
        for i in range(0, len(notes), batch_size):
            samples = [notes.sample(j) for j in range(i, min(i + batch_size, len(notes)))]
            captions += adapter.generate(samples, max_new_tokens=max_new_tokens)
    caps = {str(i): c for i, c in enumerate(captions)}
    gts = {str(i): sorted(o) for i, o in enumerate(notes.objects)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return chair_units(chair_scores(caps, gts, Vocabulary.world())["per_caption"])


def scores(units: dict[str, list[float]]) -> dict[str, Any]:
    """CHAIR_i, recall and mean caption length (words) with 95% bootstrap intervals over notes."""
    from mm.eval.bootstrap import intervals

    return intervals(units, {"chair_i": ("hallucinated", "mentions"), "recall": ("covered", "gt"),
                             "length": ("words", "captions")})  # fmt: skip


GAP_METRICS = {"chair_i": (("hallucinated", "mentions"), -1), "recall": (("covered", "gt"), 1)}
"""Metric -> ((numerator, denominator) unit keys, sign of an improvement)."""


def _shares(weights: np.ndarray, student: dict, teacher: dict, method: dict, metric: str) -> np.ndarray:
    """Share of the student-teacher gap closed by ``method`` on ``metric`` under each row of ``weights``
    ``(R, n)`` (note resample counts): ``(M - S) / (T - S)`` ``(R,)``, NaN where a ratio is undefined."""
    (num, den), _ = GAP_METRICS[metric]
    with np.errstate(divide="ignore", invalid="ignore"):  # a resample without mentions: NaN, left out
        s, t, m = (
            (weights @ np.asarray(u[num])) / (weights @ np.asarray(u[den]))
            for u in (student, teacher, method)
        )
        return (m - s) / (t - s)  # the same for both signs: (S - M) / (S - T) == (M - S) / (T - S)


def _interval(values: np.ndarray) -> tuple[float | None, float | None]:
    """2.5th and 97.5th percentiles of the finite resampled values (None when there are none)."""
    boot = values[np.isfinite(values)]
    return tuple(float(np.percentile(boot, q)) if len(boot) else None for q in (2.5, 97.5))  # type: ignore


def _weights(n: int, n_boot: int, seed: int) -> np.ndarray:
    from mm.eval.bootstrap import resample_weights

    return np.vstack([np.ones(n), resample_weights(n, n_boot, seed)])  # (1 + n_boot, n); row 0 = all notes


def gap_closed(student: dict, teacher: dict, method: dict, *, n_boot: int = 1000, seed: int = 0) -> dict:
    """Share of the student-teacher gap closed on CHAIR_i and recall, with paired bootstrap intervals."""
    w = _weights(len(student["gt"]), n_boot, seed)
    out = {}
    for metric, ((num, den), sign) in GAP_METRICS.items():
        share = _shares(w, student, teacher, method, metric)
        low, high = _interval(share[1:])
        m, s = (sum(u[num]) / max(sum(u[den]), 1e-12) for u in (method, student))
        better = bool(sign * (m - s) > 0)
        out[metric] = {"value": float(share[0]), "low": low, "high": high, "better_than_student": better}
    return out


def gap_difference(
    student: dict, teacher: dict, a: dict, b: dict, *, n_boot: int = 1000, seed: int = 0
) -> dict[str, dict[str, float | None]]:
    """Gap closed by ``a`` minus gap closed by ``b`` on CHAIR_i and recall, with a paired bootstrap
    interval (the same resampled notes for the four models); > 0 means ``a`` closes more."""
    w = _weights(len(student["gt"]), n_boot, seed)
    out = {}
    for metric in GAP_METRICS:
        diff = _shares(w, student, teacher, a, metric) - _shares(w, student, teacher, b, metric)
        low, high = _interval(diff[1:])
        out[metric] = {"value": float(diff[0]), "low": low, "high": high}
    return out


def summarize(result: dict[str, Any], units: dict[str, dict], methods: list[str]) -> None:
    """Scores of every model, the gap each run closes, per method the mean and range over seeds, and each
    run's gap closed minus off-policy KD's at the same training seed."""
    result["scores"] = {k: scores(u) for k, u in units.items()}
    result["gap_closed"] = {
        k: gap_closed(units["student"], units["teacher"], u) for k, u in units.items() if "_seed" in k
    }
    result["by_method"] = {}
    for method in methods:
        runs = [g for k, g in result["gap_closed"].items() if k.startswith(f"{method}_seed")]
        if runs:
            result["by_method"][method] = {
                m: {"mean": float(np.mean([g[m]["value"] for g in runs])),
                    "min": float(min(g[m]["value"] for g in runs)),
                    "max": float(max(g[m]["value"] for g in runs)), "seeds": len(runs)}
                for m in ("chair_i", "recall")
            }  # fmt: skip
    result["minus_kd"] = {}  # run -> its gap closed minus that of kd with the same training seed (paired)
    for k, u in units.items():
        method, _, seed = k.partition("_seed")
        kd = units.get(f"kd_seed{seed}")
        if seed and method != "kd" and kd is not None:
            result["minus_kd"][k] = gap_difference(units["student"], units["teacher"], u, kd)


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--teacher", required=True, help="teacher model folder (the bigger SFT NoteVLM)")
    p.add_argument("--student", required=True, help="student model folder (the smaller SFT NoteVLM)")
    p.add_argument("--data", required=True, help="world note folder (train prompts, held-out notes)")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--steps", type=int, default=60, help="optimizer steps per method")
    p.add_argument("--batch", type=int, default=16, help="captions per step")
    p.add_argument("--lr", type=float, default=1e-4, help="learning rate (both methods)")
    p.add_argument("--eval-notes", type=int, default=100, help="held-out notes captioned")
    p.add_argument("--eval-split", default="test", help="split of the held-out notes")
    p.add_argument("--max-new-tokens", type=int, default=96, help="longest caption (training and eval)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds")
    p.add_argument("--methods", nargs="+", default=["opd", "kd"], choices=list(METHODS), help="methods run")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--set", dest="overrides", nargs="+", default=[], metavar="KEY=VALUE",
                   help="rl distill overrides for every method, e.g. rollout.temperature=0.7")  # fmt: skip
    args = p.parse_args(argv)

    from mm.config import load_config
    from mm.model.adapter import load_adapter
    from rl.trainers import distill
    from rl.trainers.distill_config import DistillConfig
    from rl.trainers.distill_data import NotePrompts

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    notes = NotePrompts(
        folder=args.data, split=args.eval_split, notes=args.eval_notes, prompt="Describe the note."
    )

    def evaluate(folder: str | Path) -> dict[str, list[float]]:
        adapter = load_adapter(folder)
        return caption_units(adapter, notes, batch_size=32, max_new_tokens=args.max_new_tokens)

    t0 = time.perf_counter()
    units = {"student": evaluate(args.student), "teacher": evaluate(args.teacher)}
    result: dict[str, Any] = {"args": vars(args), "runs": {}}
    summarize(result, units, args.methods)
    for seed in args.seeds:
        for method in args.methods:
            name = f"{method}_seed{seed}"
            sets = [f"student.path={args.student}", f"teacher.path={args.teacher}",
                    f"data.folder={args.data}", f"train.steps={args.steps}", f"data.batch_size={args.batch}",
                    f"optim.lr={args.lr}",
                    f"rollout.max_new_tokens={args.max_new_tokens}", f"train.seed={seed}",
                    f"train.checkpoint_every={args.steps}", f"train.threads={args.threads}",
                    *args.overrides, *METHODS[method]]  # fmt: skip
            cfg = load_config(DistillConfig, None, sets)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                summary = distill.train(cfg, out_dir=out / name, resume=False, show_progress=False)
            units[name] = evaluate(out / name / "model")
            result["runs"][name] = {"train_seconds": summary["train_seconds"],
                                    "step_seconds": summary["step_seconds"]}  # fmt: skip
            summarize(result, units, args.methods)
            result["seconds"] = round(time.perf_counter() - t0, 1)
            result["units"] = units  # per held-out note: for merging runs made in separate processes
            (out / "evidence.json").write_text(json.dumps(result, indent=1))  # after every run
    print(f"{'model':<14} {'CHAIR_i [95% CI]':<26} {'recall [95% CI]':<26} gap closed (CHAIR_i / recall)")
    for k, s in result.get("scores", {}).items():
        ci = "  ".join(
            f"{_num(s[m]['value'])} [{_num(s[m]['low'])}, {_num(s[m]['high'])}]"
            for m in ("chair_i", "recall")
        )
        g = result["gap_closed"].get(k)
        gap = "" if g is None else f"{g['chair_i']['value']:+.2f} / {g['recall']['value']:+.2f}"
        print(f"{k:<14} {ci}  {gap}")
    for method, g in result.get("by_method", {}).items():
        c, r = g["chair_i"], g["recall"]
        print(f"{method}: gap closed over {c['seeds']} seed(s): CHAIR_i {c['mean']:+.2f} [{c['min']:+.2f}, "
              f"{c['max']:+.2f}], recall {r['mean']:+.2f} [{r['min']:+.2f}, {r['max']:+.2f}]")  # fmt: skip
    for run, d in result.get("minus_kd", {}).items():
        c, r = d["chair_i"], d["recall"]
        print(f"{run} minus kd (paired): CHAIR_i {c['value']:+.2f} [{_num(c['low'])}, {_num(c['high'])}], "
              f"recall {r['value']:+.2f} [{_num(r['low'])}, {_num(r['high'])}]")  # fmt: skip
    print(f"total {result.get('seconds')} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

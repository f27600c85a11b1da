"""Uncertainty in the pipeline report: bootstrap intervals over notes, spread over training seeds.

A model's eval record (:func:`mm.eval.runners.evaluate_model`) carries its metric intervals
(``chair_intervals``, ``pope[split]["intervals"]``) and its per-unit sums (``units``: per note for CHAIR,
per image for POPE). :func:`summary_intervals` flattens the first onto the report's summary keys;
:func:`change_intervals` runs the paired bootstrap (:func:`mm.eval.bootstrap.paired_intervals`) of each
change against SFT on the notes both models were evaluated on, in the report's units (relative CHAIR_i,
recall and F1 in points, length in percent). :func:`seed_summary` and :func:`seed_lines` give the
spread over training seeds (``rl pipeline --seeds N``): every run's changes, their mean and sample sd.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mm.eval.bootstrap import CHAIR_RATIOS, POPE_RATIOS, paired_intervals

CLAIM_RATIOS = {"rate": ("hallucinated", "judged"), "coverage": ("covered", "facts")}
"""Claim metric -> (numerator, denominator) of :func:`mm.eval.claims.generative_scores`' units."""


def _pair(iv: dict[str, Any] | None, scale: float = 1.0) -> list[float] | None:
    if not iv or iv.get("low") is None or iv.get("high") is None:
        return None
    lo, hi = scale * iv["low"], scale * iv["high"]
    return [min(lo, hi), max(lo, hi)]


def summary_intervals(ev: dict[str, Any]) -> dict[str, list[float]]:
    """``{summary key: [low, high]}`` from an eval record's bootstrap intervals (empty when it has none)."""
    out: dict[str, list[float]] = {}
    ch = ev.get("chair_intervals") or {}
    for k in CHAIR_RATIOS:
        if (p := _pair(ch.get(k))) is not None:
            out[k] = p
    if "chair_i" in out:
        out["precision"] = [1.0 - out["chair_i"][1], 1.0 - out["chair_i"][0]]
    for kind, res in (ev.get("claims") or {}).items():
        lo, hi = res.get("rate_ci") or (None, None)
        if lo is not None and hi is not None:
            out[f"{kind}_rate"] = [lo, hi]
    for split, res in (ev.get("pope") or {}).items():
        for k, iv in (res.get("intervals") or {}).items():
            if (p := _pair(iv)) is not None:
                out[f"pope_{split}_{k}"] = p
    return out


CHANGE_INTERVALS: dict[str, tuple[str, str, bool, float]] = {
    "chair_i_rel_change": ("chair", "chair_i", True, 1.0),
    "chair_s_rel_change": ("chair", "chair_s", True, 1.0),
    "recall_change_points": ("chair", "recall", False, 100.0),
    "length_change_pct": ("chair", "mean_length", True, 100.0),
    "attribute_rate_rel_change": ("claims_attribute", "rate", True, 1.0),
    **{
        f"pope_{s}_f1_change_points": (f"pope_{s}", "f1", False, 100.0)
        for s in ("adversarial", "popular", "random")
    },
}
"""Change key -> (units, metric, relative, scale) of its paired bootstrap interval."""


def change_intervals(
    before_ev: dict[str, Any], after_ev: dict[str, Any], *, seed: int = 0
) -> dict[str, list[float]]:
    """Paired bootstrap 95% intervals of :func:`changes`' keys, from two eval records' per-unit sums."""
    bu, au = before_ev.get("units") or {}, after_ev.get("units") or {}
    out: dict[str, list[float]] = {}
    for key, (units, metric, relative, scale) in CHANGE_INTERVALS.items():
        if units not in bu or units not in au:
            continue
        ratios = (
            CHAIR_RATIOS if units == "chair" else CLAIM_RATIOS if units.startswith("claims") else POPE_RATIOS
        )
        try:
            iv = paired_intervals(
                bu[units], au[units], {metric: ratios[metric]}, relative={metric: relative}, seed=seed
            )
        except ValueError:  # no common notes: no paired interval
            continue
        if (p := _pair(iv[metric], scale)) is not None:
            out[key] = p
    return out


SEED_KEYS: tuple[tuple[str, str, str], ...] = (
    ("chair_i_rel_change", "CHAIR_i change (rel.)", "{:+.1%}"),
    ("recall_change_points", "recall change (points)", "{:+.1f}"),
    ("length_change_pct", "length change (%)", "{:+.1f}"),
    ("pope_adversarial_f1_change_points", "POPE-adv F1 change (points)", "{:+.1f}"),
)
"""(change key, header, format) of the training-seed table."""


def seed_summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per post-training stage: its runs (``{"seed", change keys...}``) with mean and sample sd per key."""
    import statistics

    out: dict[str, Any] = {}
    for post, rows in runs.items():
        mean: dict[str, float | None] = {}
        sd: dict[str, float | None] = {}
        for k, _, _ in SEED_KEYS:
            vals = [r[k] for r in rows if r.get(k) is not None]
            mean[k] = statistics.fmean(vals) if vals else None
            sd[k] = statistics.stdev(vals) if len(vals) > 1 else None
        out[post] = {"runs": rows, "mean": mean, "sd": sd}
    return out


def seed_lines(seeds: dict[str, Any]) -> list[str]:
    """Markdown: each run's changes against SFT, then mean +- sd over the training seeds."""

    def fmt(v: Any, f: str) -> str:
        return "n/a" if v is None else f.format(v)

    head = "| model | training seed | " + " | ".join(h for _, h, _ in SEED_KEYS) + " |"
    lines = ["", "## Training seeds", "", head, "|" + "---|" * (len(SEED_KEYS) + 2)]
    for post, s in seeds.items():
        for r in s["runs"]:
            lines.append(
                f"| {post} | {r['seed']} | " + " | ".join(fmt(r.get(k), f) for k, _, f in SEED_KEYS) + " |"
            )
        cells = [f"{fmt(s['mean'][k], f)} +- {fmt(s['sd'][k], f.replace('+', ''))}" for k, _, f in SEED_KEYS]
        lines.append(f"| {post} | **mean +- sd** ({len(s['runs'])} runs) | " + " | ".join(cells) + " |")
    return lines


def without_units(metrics: Any) -> Any:
    """A stage's metrics without the per-note sums (they stay in OUT/eval_*/eval.json)."""
    return {k: v for k, v in metrics.items() if k != "units"} if isinstance(metrics, dict) else metrics


def error_bars(summary: dict[str, Any], keys: list[tuple[str, str]], vals: list[float]) -> np.ndarray:
    """(2, K) distances from each value down and up to its interval's ends (0 where there is none)."""
    ivs = summary.get("intervals") or {}
    err = np.zeros((2, len(keys)))  # (2, K)
    for i, ((k, _), v) in enumerate(zip(keys, vals)):
        if k in ivs:
            err[:, i] = [max(0.0, v - ivs[k][0]), max(0.0, ivs[k][1] - v)]
    return err

"""Bootstrap intervals of the pipeline report: per-model metric intervals and paired change intervals.

A model's eval record (:func:`mm.eval.runners.evaluate_model`) carries its metric intervals
(``chair_intervals``, ``pope[split]["intervals"]``) and its per-unit sums (``units``: per note for CHAIR,
per image for POPE). :func:`summary_intervals` flattens the first onto the report's summary keys;
:func:`change_intervals` runs the paired bootstrap (:func:`mm.eval.bootstrap.paired_intervals`) of each
change against SFT on the notes both models were evaluated on, in the report's units (relative CHAIR_i,
recall and F1 in points, length in percent).
"""

from __future__ import annotations

from typing import Any

from mm.eval.bootstrap import CHAIR_RATIOS, POPE_RATIOS, paired_intervals


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
        ratios = CHAIR_RATIOS if units == "chair" else POPE_RATIOS
        try:
            iv = paired_intervals(
                bu[units], au[units], {metric: ratios[metric]}, relative={metric: relative}, seed=seed
            )
        except ValueError:  # no common notes: no paired interval
            continue
        if (p := _pair(iv[metric], scale)) is not None:
            out[key] = p
    return out

"""Bootstrap 95% intervals for the eval metrics, resampling notes (or images), and paired intervals.

Every metric the evals print is a *ratio of sums over units* (a unit is a note for CHAIR and claims,
an image for POPE):

    CHAIR_i   = sum(hallucinated) / sum(mentions)        recall = sum(covered) / sum(gt objects)
    CHAIR_s   = sum(any hallucination) / sum(1)          mean length = sum(words) / sum(1)
    accuracy  = sum(correct) / sum(questions)            F1 = sum(2 TP) / sum(2 TP + FP + FN)

so one function, :func:`ratio_interval`, gives every interval: draw ``n_boot`` resamples of the ``n``
units with replacement (``numpy.random.default_rng(seed)``, indices ``integers(0, n, (n_boot, n))``),
recompute the ratio on each, and report the 2.5th and 97.5th percentiles (the percentile method).
Resampling units, not mentions or questions, keeps the correlation between the mentions of one
caption (or the questions about one image) inside the interval.

Paired bootstrap (:func:`paired_change_interval`): the same resampled units for the model before and
after, so the interval of the change (relative, ``(after - before) / before``, or absolute) does not
count the spread between notes twice. Units must be aligned (the same notes in the same order).

Resamples with a zero denominator give NaN and are left out of the percentiles; ``n_valid`` says how
many were kept. Everything here is pure: arrays in, numbers out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

N_BOOT = 1000
"""Default number of bootstrap resamples."""

LEVEL = 0.95
"""Default coverage of the intervals."""


@dataclass(frozen=True, kw_only=True)
class Interval:
    """A point estimate with its bootstrap interval."""

    value: float
    """The metric on all units (the point estimate); NaN when its denominator is 0."""
    low: float
    """Lower end of the interval ((1 - level) / 2 percentile of the resampled metric)."""
    high: float
    """Upper end of the interval ((1 + level) / 2 percentile)."""
    level: float
    """Coverage, e.g. 0.95."""
    n_units: int
    """Units (notes or images) resampled."""
    n_valid: int
    """Resamples with a defined metric (nonzero denominator)."""

    def to_json(self) -> dict[str, float | int | None]:
        """The fields as a dict, NaN as None (JSON has no NaN)."""
        return {k: finite_or_none(v) if isinstance(v, float) else v for k, v in asdict(self).items()}


def finite_or_none(x: float) -> float | None:
    """``x``, or None when it is NaN or infinite (JSON has no NaN)."""
    return float(x) if np.isfinite(x) else None


def _check(arrays: Sequence[np.ndarray], names: Sequence[str], n_boot: int, level: float) -> int:
    n = len(arrays[0])
    for a, name in zip(arrays, names):
        if a.ndim != 1 or len(a) != n:
            raise ValueError(
                f"{name} must be a 1-d array with one value per unit ({n} units), got shape {a.shape}"
            )
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{name} has non-finite values; every unit needs a finite count")
    if n == 0:
        raise ValueError("no units to resample: pass at least one note or image")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    return n


def resample_weights(n: int, n_boot: int = N_BOOT, seed: int = 0) -> np.ndarray:
    """(n_boot, n) counts: how often each unit is drawn in each resample (rows sum to ``n``)."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(n_boot, n))  # (B, n) drawn unit indices
    flat = (idx + n * np.arange(n_boot)[:, None]).ravel()  # (B * n,) index into the flattened (B, n)
    return np.bincount(flat, minlength=n_boot * n).reshape(n_boot, n).astype(np.float64)  # (B, n)


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, num / np.where(den != 0, den, 1.0), np.nan)


def _interval(value: float, stats: np.ndarray, level: float, n: int) -> Interval:
    ok = stats[np.isfinite(stats)]  # (n_valid,)
    if len(ok) == 0:
        low = high = float("nan")
    else:
        low, high = (float(v) for v in np.percentile(ok, [50 * (1 - level), 50 * (1 + level)]))
    return Interval(value=float(value), low=low, high=high, level=level, n_units=n, n_valid=int(len(ok)))


def ratio_interval(
    num: Sequence[float] | np.ndarray,
    den: Sequence[float] | np.ndarray,
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
    level: float = LEVEL,
) -> Interval:
    """Interval of ``sum(num) / sum(den)`` resampling units (``num[i]``, ``den[i]``: unit i's sums)."""
    num_a, den_a = np.asarray(num, dtype=np.float64), np.asarray(den, dtype=np.float64)
    n = _check([num_a, den_a], ["num", "den"], n_boot, level)
    w = resample_weights(n, n_boot, seed)  # (B, n)
    stats = _ratio(w @ num_a, w @ den_a)  # (B,)
    value = _ratio(np.array([num_a.sum()]), np.array([den_a.sum()]))[0]
    return _interval(value, stats, level, n)


def mean_interval(
    values: Sequence[float] | np.ndarray, *, n_boot: int = N_BOOT, seed: int = 0, level: float = LEVEL
) -> Interval:
    """Interval of the mean of per-unit ``values`` (a ratio with denominator 1 per unit)."""
    v = np.asarray(values, dtype=np.float64)
    return ratio_interval(v, np.ones_like(v), n_boot=n_boot, seed=seed, level=level)


def paired_change_interval(
    before: tuple[Sequence[float] | np.ndarray, Sequence[float] | np.ndarray],
    after: tuple[Sequence[float] | np.ndarray, Sequence[float] | np.ndarray],
    *,
    relative: bool = True,
    n_boot: int = N_BOOT,
    seed: int = 0,
    level: float = LEVEL,
) -> Interval:
    """Interval of the change of a ratio metric from ``before`` to ``after`` on the same units.

    ``before`` and ``after`` are ``(num, den)`` per-unit arrays, aligned unit by unit. Each resample
    draws the same units for both; the change is ``(r_after - r_before) / r_before`` when ``relative``
    (NaN when ``r_before`` is 0), else ``r_after - r_before``.
    """
    arrays = [np.asarray(a, dtype=np.float64) for a in (*before, *after)]
    n = _check(arrays, ["before num", "before den", "after num", "after den"], n_boot, level)
    bn, bd, an, ad = arrays
    w = resample_weights(n, n_boot, seed)  # (B, n)

    def change(rb: np.ndarray, ra: np.ndarray) -> np.ndarray:
        return _ratio(ra - rb, rb) if relative else ra - rb

    stats = change(_ratio(w @ bn, w @ bd), _ratio(w @ an, w @ ad))  # (B,)
    value = change(
        _ratio(np.array([bn.sum()]), np.array([bd.sum()])), _ratio(np.array([an.sum()]), np.array([ad.sum()]))
    )
    return _interval(float(value[0]), stats, level, n)


# ---- the evals' metrics as ratios of per-unit sums ------------------------------------------------
CHAIR_RATIOS: dict[str, tuple[str, str]] = {
    "chair_i": ("hallucinated", "mentions"),
    "chair_s": ("any_hallucinated", "captions"),
    "recall": ("covered", "gt"),
    "mean_length": ("words", "captions"),
}
"""CHAIR metric -> (numerator, denominator) of :func:`chair_units`."""

POPE_RATIOS: dict[str, tuple[str, str]] = {
    "accuracy": ("correct", "scored"),
    "precision": ("tp", "pred_yes"),
    "recall": ("tp", "tp_fn"),
    "f1": ("two_tp", "f1_den"),
    "yes_ratio": ("pred_yes", "scored"),
}
"""POPE metric -> (numerator, denominator) of :func:`pope_units`."""


def chair_units(per_caption: Sequence[dict]) -> dict[str, list[float]]:
    """Per-caption sums of :func:`mm.eval.chair.chair_scores`' ``per_caption`` rows (one unit each)."""
    return {
        "id": [str(r["image_id"]) for r in per_caption],
        "hallucinated": [float(len(r["hallucinated"])) for r in per_caption],
        "mentions": [float(len(r["mentioned"])) for r in per_caption],
        "any_hallucinated": [float(bool(r["hallucinated"])) for r in per_caption],
        "captions": [1.0] * len(per_caption),
        "covered": [float(round(r["recall"] * len(r["gt_objects"]))) for r in per_caption],
        "gt": [float(len(r["gt_objects"])) for r in per_caption],
        "words": [float(r["length"]) for r in per_caption],
    }  # type: ignore[dict-item]


def pope_units(rows: Sequence[tuple[str, str, str | None]], *, unparsed_fn: bool = True) -> dict[str, list]:
    """Per-unit POPE counts from ``(unit, label, prediction)`` rows (prediction None = unparsed).

    Units keep their first-seen order. An unparsed answer counts as scored and wrong, and as neither
    a predicted yes nor a true positive; with label yes it is a false negative when ``unparsed_fn``
    (the ``vlmevalkit`` convention; ``lmms`` leaves it out: pass False), as in
    :func:`mm.eval.pope.pope_scores`.
    """
    order: dict[str, dict[str, float]] = {}
    for unit, label, pred in rows:
        u = order.setdefault(
            str(unit), dict.fromkeys(("correct", "scored", "tp", "fp", "fn", "pred_yes", "label_yes"), 0.0)
        )
        u["scored"] += 1
        u["correct"] += float(pred == label)
        u["pred_yes"] += float(pred == "yes")
        u["label_yes"] += float(label == "yes")
        u["tp"] += float(pred == "yes" and label == "yes")
        u["fp"] += float(pred == "yes" and label == "no")
        u["fn"] += float(label == "yes" and (pred == "no" or (pred is None and unparsed_fn)))
    out: dict[str, list] = {"id": list(order)}
    for k in ("correct", "scored", "tp", "fp", "fn", "pred_yes", "label_yes"):
        out[k] = [u[k] for u in order.values()]
    out["two_tp"] = [2 * t for t in out["tp"]]
    out["tp_fn"] = [t + f for t, f in zip(out["tp"], out["fn"])]
    out["f1_den"] = [2 * t + p + f for t, p, f in zip(out["tp"], out["fp"], out["fn"])]
    return out


def intervals(
    units: dict[str, list], ratios: dict[str, tuple[str, str]], *, n_boot: int = N_BOOT, seed: int = 0
) -> dict[str, dict[str, float | int]]:
    """``{metric: Interval.to_json()}`` for each ``metric: (num, den)`` of ``ratios`` over ``units``."""
    return {
        m: ratio_interval(units[a], units[b], n_boot=n_boot, seed=seed).to_json()
        for m, (a, b) in ratios.items()
    }


def paired_intervals(
    before: dict[str, list],
    after: dict[str, list],
    ratios: dict[str, tuple[str, str]],
    *,
    relative: dict[str, bool],
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> dict[str, dict[str, float | int]]:
    """Paired change intervals per metric; units are matched by ``id`` (only the common ones are used)."""
    common = [i for i in before["id"] if i in set(after["id"])]
    if not common:
        raise ValueError("before and after share no unit id; a paired interval needs the same notes")
    bi = {u: k for k, u in enumerate(before["id"])}
    ai = {u: k for k, u in enumerate(after["id"])}

    def pick(units: dict[str, list], index: dict[str, int], key: str) -> list[float]:
        return [units[key][index[u]] for u in common]

    return {
        m: paired_change_interval(
            (pick(before, bi, a), pick(before, bi, b)),
            (pick(after, ai, a), pick(after, ai, b)),
            relative=relative.get(m, True), n_boot=n_boot, seed=seed,
        ).to_json()
        for m, (a, b) in ratios.items()
    }  # fmt: skip

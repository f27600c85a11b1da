"""Pure scores of `mm compare-fusion`: object recall by photo position, and means with t intervals over seeds.

Recall by photo position (per note with 2+ photos): of the objects in the note's 1st photo, the share
its caption mentions (``recall_first``); of the objects that appear only in photos 2-4 (not in the
1st), the share mentioned (``recall_later``). Both are pooled over notes (mentioned / present, summed),
as CHAIR's recall is. ``recall_gap`` = first - later; the multi-image question is whether a scope or a
visibility mode shrinks it at equal tokens per note.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

# Two-sided 95% Student t quantiles t_{0.975, dof} for dof 1..10; larger samples use 1.96 (normal).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def recall_by_position(mentioned: Sequence[set[str]], photo_objects: Sequence[Sequence[set[str]]]) -> dict:
    """``recall_first``, ``recall_later``, ``recall_gap`` and the counts behind them.

    Args:
        mentioned: per note, the object categories its caption mentions.
        photo_objects: per note, the categories present in each of its photos, in photo order.
    Notes with one photo are skipped (they have no later photos); a ratio with no objects is None.
    """
    if len(mentioned) != len(photo_objects):
        raise ValueError(f"need one mention set per note, got {len(mentioned)} and {len(photo_objects)}")
    hit_first = n_first = hit_later = n_later = notes = 0
    for said, photos in zip(mentioned, photo_objects):
        if len(photos) < 2:
            continue
        notes += 1
        first = set(photos[0])
        later = set().union(*photos[1:]) - first
        hit_first += len(first & said)
        n_first += len(first)
        hit_later += len(later & said)
        n_later += len(later)
    r_first = hit_first / n_first if n_first else None
    r_later = hit_later / n_later if n_later else None
    gap = r_first - r_later if r_first is not None and r_later is not None else None
    return {
        "recall_first": r_first,
        "recall_later": r_later,
        "recall_gap": gap,
        "n_first_objects": n_first,
        "n_later_objects": n_later,
        "n_multi_photo_notes": notes,
    }


def mean_interval(values: Iterable[float | None]) -> tuple[float | None, float | None]:
    """Mean and the half-width of its two-sided 95% Student t interval (None with fewer than 2 values).

    None values are dropped. Golden: ``mean_interval([1, 2, 3]) == (2.0, 4.303 * 1 / sqrt(3))``.
    """
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None, None
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, None
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    dof = len(xs) - 1
    t = _T975[dof - 1] if dof <= len(_T975) else 1.96
    return mean, t * sd / math.sqrt(len(xs))


def summarize(rows: Sequence[dict[str, Any]], *, group: Sequence[str], keys: Sequence[str]) -> list[dict]:
    """One row per distinct ``group`` values (first-seen order): ``k`` = mean and ``k_ci`` = half-width
    over the rows (seeds) of that group, for each of ``keys``; ``seeds`` = how many rows it pooled."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r[g] for g in group), []).append(r)
    out = []
    for ident, members in groups.items():
        row: dict[str, Any] = dict(zip(group, ident))
        row["seeds"] = len(members)
        for k in keys:
            row[k], row[f"{k}_ci"] = mean_interval(m.get(k) for m in members)
        out.append(row)
    return out

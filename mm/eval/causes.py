"""Why a caption hallucinated an object: language prior (co-occurrence) vs visual confusion vs other.

Each hallucinated mention of a world category ``h`` (absent from the note) is given one cause,
checked in this order:

- ``partner``: ``h`` is a co-occurrence partner (:func:`mm.world.vocab.partners`) of a present
  category: the language prior ("forks come with knives"), the failure POVID / HA-DPO target;
- ``confusion``: a present category looks like ``h``: in the world every category is drawn as a
  unique outline ``shape`` x inner ``glyph`` (:mod:`mm.world.render`), so a present category with
  the same outline (``by=("shape",)``, the default) is a visually similar object; ``by`` may add
  ``"glyph"`` (same inner pattern) for a looser definition;
- ``other``: neither (e.g. an off-theme guess).

A mention that is both a partner and a look-alike counts as ``partner`` (the partner pairs were
drawn with different shapes, so in the default world this never happens). Colour and size are free
attributes of an object, not of its category, so they cannot make one category look like another.

Deviation from the literature: papers separate "co-occurrence" from "attribute" hallucination with
detectors or human labels; here the ground truth is exact, so the split is a pure function.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from mm.world import vocab

CAUSES: tuple[str, ...] = ("partner", "confusion", "other")
"""The cause labels, in the order they are checked."""

LOOKALIKE_FEATURES: tuple[str, ...] = ("shape", "glyph")
"""Category features that ``by`` may name."""


def looks_alike(a: str, b: str, *, by: Sequence[str] = ("shape",)) -> bool:
    """True when world categories ``a != b`` share any of the rendering features in ``by``."""
    bad = [f for f in by if f not in LOOKALIKE_FEATURES]
    if bad or not by:
        raise ValueError(f"by must name some of {LOOKALIKE_FEATURES}, got {tuple(by)}")
    if a == b:
        return False
    ca, cb = vocab.category(a), vocab.category(b)
    return any(getattr(ca, f) == getattr(cb, f) for f in by)


def hallucination_cause(name: str, present: Iterable[str], *, by: Sequence[str] = ("shape",)) -> str:
    """Cause (one of :data:`CAUSES`) of world category ``name`` being mentioned though absent."""
    present = set(present)
    if name in present:
        raise ValueError(f"{name!r} is present in the scene, so mentioning it is not a hallucination")
    if any(name in vocab.partners(p) for p in present):
        return "partner"
    if any(looks_alike(name, p, by=by) for p in present):
        return "confusion"
    return "other"


def cause_split(
    hallucinated: Sequence[Sequence[str]],
    present: Sequence[Iterable[str]],
    *,
    by: Sequence[str] = ("shape",),
) -> dict[str, Any]:
    """Counts and fractions of hallucinated mentions per cause, over captions.

    ``hallucinated[i]``: canonical names of caption i's hallucinated mentions (not de-duplicated,
    as CHAIR_i counts them); ``present[i]``: the categories present in its note. Returns
    ``{"partner": n, "confusion": n, "other": n, "total": n, "partner_frac": f, ...}`` (fractions
    are 0.0 when nothing was hallucinated).
    """
    if len(hallucinated) != len(present):
        raise ValueError(
            f"need one present-object set per caption, got {len(hallucinated)} and {len(present)}"
        )
    counts = dict.fromkeys(CAUSES, 0)
    for names, objs in zip(hallucinated, present):
        objs = set(objs)
        for n in names:
            counts[hallucination_cause(n, objs, by=by)] += 1
    total = sum(counts.values())
    out: dict[str, Any] = {**counts, "total": total}
    for c in CAUSES:
        out[f"{c}_frac"] = counts[c] / total if total else 0.0
    return out


def cause_split_from_chair(chair: Mapping[str, Any], *, by: Sequence[str] = ("shape",)) -> dict[str, Any]:
    """:func:`cause_split` of a :func:`mm.eval.chair.chair_scores` result (world vocabulary)."""
    rows = chair["per_caption"]
    return cause_split(
        [[c for _, c in r["hallucinated"]] for r in rows], [r["gt_objects"] for r in rows], by=by
    )

"""Generative claim eval: per claim kind, the hallucination rate and the coverage of a set of captions.

For each caption, every claim (:mod:`mm.eval.claims.extract`) is judged against the truth of its scope
(:meth:`NoteTruth.scope`: the image a sentence names, else the whole note):

- ``exists`` is hallucinated when the object is absent (with note scope: exactly CHAIR's rule);
- ``attribute`` is hallucinated when the object is there but has no object of that colour; it is not
  judged when the object is absent (that is an ``exists`` hallucination already, as in AMBER) or its
  colours are unknown;
- ``count`` is hallucinated when the object is there in another number; not judged when absent.

Per kind: ``rate`` = hallucinated / judged claims (mentions not de-duplicated, as CHAIR_i);
``hal_captions`` = captions with >= 1 hallucinated claim of the kind / captions (AMBER's Hal);
``coverage`` = true facts stated correctly / true facts (AMBER's Cover), the facts being the note's
objects (``exists``), the note's (object, colour) pairs where colours are known (``attribute``) and
the (image, object) pairs with two or more objects (``count``; a count with no image named in a
one-image note is about that image). Each rate comes with a bootstrap interval over captions
(:mod:`mm.eval.bootstrap`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mm.eval.bootstrap import N_BOOT, finite_or_none, ratio_interval
from mm.eval.claims.extract import CLAIM_KINDS, Claim, ClaimExtractor
from mm.eval.claims.truth import NoteTruth, merge

UNIT_KEYS = ("judged", "hallucinated", "any", "facts", "covered")
"""Per caption and kind: judged claims, hallucinated claims, 1 if any hallucinated, facts, facts covered."""


def judge(claim: Claim, truth: NoteTruth) -> bool | None:
    """True if ``claim`` is hallucinated, False if it holds, None if it is not judged (module docstring)."""
    scope = truth.scope(claim.image)
    t = scope.get(claim.object)
    if claim.kind == "exists":
        return t is None
    if t is None:
        return None
    if claim.kind == "attribute":
        return None if not t.colors_known else claim.value not in t.colors
    if claim.kind == "count":
        return claim.value != t.count
    raise ValueError(f"unknown claim kind {claim.kind!r}; expected one of {CLAIM_KINDS}")


def facts(truth: NoteTruth) -> dict[str, set]:
    """The true facts a caption can cover, per kind (module docstring)."""
    note = merge(truth.images)
    return {
        "exists": set(note),
        "attribute": {(c, col) for c, t in note.items() if t.colors_known for col in t.colors},
        "count": {(k, c) for k, im in enumerate(truth.images) for c, t in im.items() if t.count >= 2},
    }


def _fact(claim: Claim, truth: NoteTruth) -> Any:
    if claim.kind == "exists":
        return claim.object
    if claim.kind == "attribute":
        return (claim.object, claim.value)
    image = claim.image if claim.image is not None else (0 if len(truth.images) == 1 else None)
    return (image, claim.object)


def score_caption(caption: str, truth: NoteTruth, extractor: ClaimExtractor) -> dict[str, Any]:
    """Claims of one caption with their verdicts, and per-kind unit sums (:data:`UNIT_KEYS`)."""
    claims = extractor.extract(caption)
    verdicts = [judge(c, truth) for c in claims]
    true_facts = facts(truth)
    units: dict[str, dict[str, int]] = {}
    for kind in CLAIM_KINDS:
        mine = [(c, v) for c, v in zip(claims, verdicts) if c.kind == kind]
        covered = {_fact(c, truth) for c, v in mine if v is False} & true_facts[kind]
        n_h = sum(1 for _, v in mine if v)
        units[kind] = {
            "judged": sum(1 for _, v in mine if v is not None),
            "hallucinated": n_h,
            "any": int(n_h > 0),
            "facts": len(true_facts[kind]),
            "covered": len(covered),
        }
    return {
        "claims": [
            {**c.to_json(), "text": c.text(caption), "hallucinated": v} for c, v in zip(claims, verdicts)
        ],
        "units": units,
    }


def generative_scores(
    captions: Sequence[tuple[str, str]],
    truth: Mapping[str, NoteTruth],
    extractor: ClaimExtractor,
    *,
    n_boot: int = N_BOOT,
    seed: int = 0,
) -> dict[str, Any]:
    """Per-kind ``rate``, ``hal_captions`` and ``coverage`` (each with ``*_ci``) of ``(id, caption)`` pairs.

    Every id must have a truth entry. Also returns ``per_caption`` (claims with verdicts) and ``units``
    (per kind, per caption sums, for paired intervals).
    """
    missing = [i for i, _ in captions if i not in truth]
    if missing:
        raise ValueError(
            f"{len(missing)} captioned id(s) have no ground truth, e.g. {missing[:5]}; the objects file or "
            "note folder must list every captioned id"
        )
    per_caption = []
    for cid, cap in captions:
        r = score_caption(cap, truth[cid], extractor)
        per_caption.append({"id": cid, "caption": cap, **r})
    out: dict[str, Any] = {"extractor": extractor.name, "n_captions": len(captions), "kinds": {}}
    units_out: dict[str, dict[str, list]] = {}
    for kind in CLAIM_KINDS:
        u = {k: [float(r["units"][kind][k]) for r in per_caption] for k in UNIT_KEYS}
        u["captions"] = [1.0] * len(per_caption)
        u["id"] = [r["id"] for r in per_caption]  # type: ignore[assignment]
        units_out[kind] = u
        row: dict[str, Any] = {
            "claims": sum(1 for r in per_caption for c in r["claims"] if c["kind"] == kind),
            "judged": int(sum(u["judged"])),
            "hallucinated": int(sum(u["hallucinated"])),
            "facts": int(sum(u["facts"])),
            "covered": int(sum(u["covered"])),
        }
        for name, (a, b) in (("rate", ("hallucinated", "judged")), ("hal_captions", ("any", "captions")),
                             ("coverage", ("covered", "facts"))):  # fmt: skip
            if captions:
                iv = ratio_interval(u[a], u[b], n_boot=n_boot, seed=seed)
                row[name] = iv.value if iv.value == iv.value else 0.0  # NaN (no denominator) -> 0.0
                row[f"{name}_ci"] = [finite_or_none(iv.low), finite_or_none(iv.high)]
            else:
                row[name], row[f"{name}_ci"] = 0.0, [None, None]
        out["kinds"][kind] = row
    out["per_caption"] = per_caption
    out["units"] = units_out
    return out

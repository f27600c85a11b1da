"""Measured statistics of a set of notes: the co-occurrence prior and how hidden partners are.

``cooccurrence_stats(notes)`` works on any notes with object annotations (world or COCO-mapped),
counted per image: for every ``(anchor, partner)`` pair of :data:`mm.world.vocab.PARTNER_PAIRS`,
P(partner | anchor), P(partner | no anchor), and, for partners next to their anchor, the fraction
that are small and the mean hidden fraction.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from mm.data.format import Note
from mm.world import vocab


def cooccurrence_stats(
    notes: list[Note], *, occluded_threshold: float = 0.1, hidden_threshold: float = 0.7
) -> dict[str, Any]:
    """Per-image co-occurrence statistics.

    Returns ``{"images": N, "pairs": {"fork->knife": {...}, ...}, "overall": {...},
    "category_frequency": {name: fraction of images}}``. Per pair: ``anchor_images``,
    ``p_partner_given_anchor``, ``p_partner_given_no_anchor``, ``partner_small_with_anchor``
    (fraction of partner instances in anchor images that are small), ``partner_occluded_with_anchor``
    (fraction hidden more than ``occluded_threshold``), ``partner_hidden_with_anchor`` (more than
    ``hidden_threshold``: hard to see at all), ``partner_mean_occlusion_with_anchor``, and
    ``absent_partner_images`` (fraction of all images that show the anchor without the partner: the
    chances a prior-following captioner has to hallucinate the partner). ``overall`` pools all pairs
    (an image counts once per pair) and adds ``objects_per_image`` and ``categories_per_image``.
    Ratios with an empty denominator are ``None``.
    """
    images = [objs for n in notes for objs in n.objects]
    freq: Counter[str] = Counter()
    for objs in images:
        freq.update({o.category for o in objs})

    def ratio(a: float, b: float) -> float | None:
        return a / b if b else None

    cats_of = [{o.category for o in objs} for objs in images]  # one set per image, shared by all pairs
    pairs: dict[str, dict[str, Any]] = {}
    tot = Counter()
    for anchor, partner in vocab.PARTNER_PAIRS:
        c = Counter()
        n_a = n_ap = n_p = 0
        for objs, cats in zip(images, cats_of):
            if partner in cats:
                n_p += 1
            if anchor not in cats:
                continue
            n_a += 1
            if partner not in cats:
                continue
            n_ap += 1
            for o in objs:
                if o.category == partner:
                    c["inst"] += 1
                    c["small"] += o.size == "small"
                    c["occ"] += o.occluded > occluded_threshold
                    c["hidden"] += o.occluded > hidden_threshold
                    c["occ_sum"] += o.occluded
        c["a"], c["ap"], c["na"], c["nap"] = n_a, n_ap, len(images) - n_a, n_p - n_ap
        c["images"] = len(images)
        tot.update(c)
        pairs[f"{anchor}->{partner}"] = _summary(c, ratio)
    tot["images"] = len(images)
    overall = _summary(tot, ratio)
    overall["objects_per_image"] = ratio(sum(len(objs) for objs in images), len(images))
    overall["categories_per_image"] = ratio(sum(len(cats) for cats in cats_of), len(images))
    return {
        "images": len(images),
        "pairs": pairs,
        "overall": overall,
        "category_frequency": {k: freq[k] / len(images) if images else 0.0 for k in vocab.CATEGORY_NAMES},
    }


def _summary(c: Counter, ratio) -> dict[str, Any]:
    return {
        "anchor_images": c["a"],
        "p_partner_given_anchor": ratio(c["ap"], c["a"]),
        "p_partner_given_no_anchor": ratio(c["nap"], c["na"]),
        "partner_small_with_anchor": ratio(c["small"], c["inst"]),
        "partner_occluded_with_anchor": ratio(c["occ"], c["inst"]),
        "partner_hidden_with_anchor": ratio(c["hidden"], c["inst"]),
        "partner_mean_occlusion_with_anchor": ratio(c["occ_sum"], c["inst"]),
        "absent_partner_images": ratio(c["a"] - c["ap"], c["images"]),
    }

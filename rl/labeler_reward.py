"""Rewards without ground truth: claims verified by a labeler (``reward.source: labeler``) or a reward
model's score (``reward.source: rm:DIR``), for ``rl grpo``.

Claims: until a claim extractor lands in :mod:`mm.eval`, a caption's claims are the objects it mentions
(CHAIR's mention extraction, :meth:`mm.eval.chair.Vocabulary.mentions`), each an existence claim, behind
:func:`caption_claims`. Each distinct claimed object ``c`` gets a support ``s_c`` in [0, 1] from the
labeler (:meth:`rl.labeler.Labeler.supported`: P(yes), or P(yes) >= threshold). Per mention, in order::

    first mention of c:  coverage_weight * s_c - hallucination_weight * (1 - s_c)
    repeat of c:                            - hallucination_weight * (1 - s_c)

and the caption reward is the sum. With an oracle labeler (s_c = 1 for a ground-truth object, else 0)
this is the scene reward of :func:`rl.rewards.caption_reward` times ``g`` (the number of ground-truth
objects, unknown here, so no normalisation). The same credits land on the first token of each mention's
word (:func:`rl.rewards.mention_tokens`), so ``algo.mention_credit`` spreads them over the claim's tokens
exactly as the scene reward's mention credit. Yes/no question rows are scored against the labeler's answer
to the same question: P(yes) for a "yes", 1 - P(yes) for a "no", 0 unparsed.

Colours (``attribute_weight`` / ``attribute_coverage_weight`` > 0): each colour claim ("a *red* fork",
:mod:`mm.eval.claims.extract`) is asked as the existence question of the coloured object ("Is there a red
fork in the image?", answered "A red fork: yes" in ``answer_style: object``), support ``a``; with the
object's own support ``s``, per colour claim in order::

    s * (attribute_coverage_weight * a [first claim of its (object, colour)] - attribute_weight * (1 - a))

(:func:`colour_values`: a colour of an object that is not there is the object's error, not the colour's,
as in the claim eval), added to the caption reward and credited on the colour word's first token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from mm.data.images import open_rgb
from mm.eval.chair import Vocabulary
from mm.eval.pope import parse_answer
from rl.labeler import Labeler, LabelerConfig
from rl.rewards import RewardConfig, char_tokens, claim_extractor, colour_term, mention_tokens, vocabulary

SOURCES = ("scene", "labeler", "rm:DIR")
"""Values of ``reward.source``."""


@dataclass(frozen=True, kw_only=True)
class SourcedRewardConfig(RewardConfig):
    """The reward weights (:class:`rl.rewards.RewardConfig`) and where the reward comes from."""

    source: str = "scene"
    """scene (the notes' ground-truth objects), labeler (claims verified by ``labeler``: no ground truth)
    or rm:DIR (the Bradley-Terry reward model ``rl rm`` wrote to DIR; sequence-level, no mention credit)."""
    labeler: LabelerConfig = field(default_factory=LabelerConfig)
    """The labeler of ``source: labeler``."""

    def __post_init__(self) -> None:
        super().__post_init__()
        rm = self.source.startswith("rm:") and len(self.source) > 3
        if self.source not in ("scene", "labeler") and not rm:
            raise ValueError(f"reward.source must be scene, labeler or rm:DIR, got {self.source!r}")


def caption_claims(text: str, vocab: Vocabulary) -> list[str]:
    """The claims of a caption: the distinct objects it mentions (canonical names, in order)."""
    return list(dict.fromkeys(c for _, c in vocab.mentions(text)))


def claim_values(
    objects: Sequence[str], support: dict[str, float], *, coverage_weight: float, hallucination_weight: float
) -> list[float]:
    """The credit of each mention (``objects``: canonical objects in caption order) given each object's
    support (see the module docstring)."""
    seen: set[str] = set()
    out = []
    for c in objects:
        s = support[c]
        out.append((coverage_weight * s if c not in seen else 0.0) - hallucination_weight * (1.0 - s))
        seen.add(c)
    return out


def colour_claims(text: str, vocab_name: str) -> list[tuple[int, str, str]]:
    """The colour claims of a caption in order: ``(character its colour word starts at, object, colour)``."""
    return [
        (c.span[0], c.object, str(c.value))
        for c in claim_extractor(vocab_name).extract(text)
        if c.kind == "attribute"
    ]


def colour_values(
    claims: Sequence[tuple[str, str]],
    support: dict[str, float],
    colour_support: dict[tuple[str, str], float],
    *,
    attribute_weight: float,
    attribute_coverage_weight: float,
) -> list[float]:
    """The credit of each colour claim ``(object, colour)`` given the object's support and the coloured
    object's (module docstring); an object the labeler was not asked about counts as unsupported."""
    seen: set[tuple[str, str]] = set()
    out = []
    for fact in claims:
        s, a = support.get(fact[0], 0.0), colour_support[fact]
        first = attribute_coverage_weight * a if fact not in seen else 0.0
        out.append(s * (first - attribute_weight * (1.0 - a)))
        seen.add(fact)
    return out


def yesno_value(answer: str, p_yes: float, parser: str) -> float:
    """Reward of a yes/no answer against the labeler: P(yes) for yes, 1 - P(yes) for no, 0 unparsed."""
    parsed = parse_answer(answer, parser)
    return p_yes if parsed == "yes" else 1.0 - p_yes if parsed == "no" else 0.0


class PromptImages:
    """The PIL images each GRPO prompt shows, opened once per note (``prompts``: a
    :class:`rl.trainers.grpo_data.PromptSet` whose notes' image paths are relative to ``root``)."""

    def __init__(self, prompts: Any, root: str | Path) -> None:
        self.prompts, self.root = prompts, Path(root)
        self._images: dict[int, list[Any]] = {}

    def __call__(self, prompt: Any) -> list[Any]:
        """The note's images, or its one image (``prompt.image``)."""

        if prompt.note not in self._images:
            note = self.prompts.notes[prompt.note]
            paths = [p if Path(p).is_absolute() else self.root / p for p in note.images]
            self._images[prompt.note] = [open_rgb(p) for p in paths]
        imgs = self._images[prompt.note]
        return imgs if prompt.image is None else imgs[prompt.image : prompt.image + 1]


class LabelerReward:
    """``reward.source: labeler`` for :class:`rl.trainers.grpo.GRPOTrainer` (rows: ``Prompt`` objects of
    ``prompts``, a :class:`rl.trainers.grpo_data.PromptSet` whose notes' images sit under ``root``)."""

    def __init__(
        self, *, labeler: Labeler, cfg: SourcedRewardConfig, prompts: Any = None, root: str | Path = ".",
        images: Callable[[Any], list[Any]] | None = None, colour_in_sequence: bool = True,
    ) -> None:  # fmt: skip
        """``images(row)``: the row's PIL images (default: :class:`PromptImages` of ``prompts`` under
        ``root``); a row has ``text`` (its question) and ``label`` (None for a caption request)."""
        self.labeler, self.cfg = labeler, cfg
        self.images = images if images is not None else PromptImages(prompts, root)
        self.vocab = vocabulary(cfg.vocab)
        self.colours = colour_term(cfg)
        """Whether colour claims are verified and rewarded (``attribute_weight`` / ``_coverage_weight``)."""
        self.colour_in_sequence = colour_in_sequence
        """False: the colour terms go into the per-token credit only (GRPO's ``algo.colour_in_sequence``)."""

    def _support(self, texts: Sequence[str], rows: Sequence[Any]) -> list[dict[str, float]]:
        """Per caption row, claimed object -> support (one batched labeler call for the whole rollout)."""
        asks = [(i, c) for i, (t, p) in enumerate(zip(texts, rows)) if p.label is None
                for c in caption_claims(t, self.vocab)]  # fmt: skip
        qs = [(self.images(rows[i]), self.labeler.question(c)) for i, c in asks]
        p = self.labeler.p_yes(qs, [c for _, c in asks])
        out: list[dict[str, float]] = [{} for _ in texts]
        for (i, c), v in zip(asks, p):
            out[i][c] = self.labeler.supported(v)
        return out

    def _colour_support(
        self, facts: Sequence[Sequence[tuple[str, str]]], rows: Sequence[Any]
    ) -> list[dict[tuple[str, str], float]]:
        """Per row, (object, colour) -> support of its colour claims ``facts`` (one batched labeler call)."""
        asks = [(i, (o, c)) for i, fs in enumerate(facts) for o, c in dict.fromkeys(fs)]
        p = self.labeler.p_yes(
            [(self.images(rows[i]), self.labeler.question(f"{c} {o}")) for i, (o, c) in asks],
            [f"{c} {o}" for _, (o, c) in asks],
        )
        out: list[dict[tuple[str, str], float]] = [{} for _ in facts]
        for (i, fact), v in zip(asks, p):
            out[i][fact] = self.labeler.supported(v)
        return out

    def _colour_credits(
        self, texts: Sequence[str], rows: Sequence[Any], support: Sequence[dict[str, float]]
    ) -> list[list[tuple[int, float]]]:
        """Per row, ``(character of the colour word, credit)`` of each colour claim ([] on question rows)."""
        claims = [colour_claims(t, self.cfg.vocab) if p.label is None else [] for t, p in zip(texts, rows)]
        colour_support = self._colour_support([[(o, c) for _, o, c in cl] for cl in claims], rows)
        w = {"attribute_weight": self.cfg.attribute_weight,
             "attribute_coverage_weight": self.cfg.attribute_coverage_weight}  # fmt: skip
        out = []
        for cl, sup, csup in zip(claims, support, colour_support):
            values = colour_values([(o, c) for _, o, c in cl], sup, csup, **w)
            out.append([(at, v) for (at, _, _), v in zip(cl, values)])
        return out

    def score(self, texts: Sequence[str], rows: Sequence[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        """Rewards ``(B*G,)`` of decoded responses and component means (``reward_claims``, ``reward_support``
        over caption rows; ``reward_yesno`` over question rows)."""
        cfg = self.cfg
        support = self._support(texts, rows)
        colours = (
            self._colour_credits(texts, rows, support) if self.colours and self.colour_in_sequence else None
        )
        q_rows = [i for i, p in enumerate(rows) if p.label is not None]
        q_p = self.labeler.p_yes([(self.images(rows[i]), rows[i].text) for i in q_rows])
        q_val = dict(zip(q_rows, q_p))
        totals, claims, supp, yesno, colour = [], [], [], [], []
        for i, (t, p) in enumerate(zip(texts, rows)):
            if p.label is not None:
                v = yesno_value(t, q_val[i], cfg.yesno_parser)
                yesno.append(v)
                totals.append(cfg.yesno_weight * v)
                continue
            objs = [c for _, c in self.vocab.mentions(t)]
            v = sum(claim_values(objs, support[i], coverage_weight=cfg.coverage_weight,
                                 hallucination_weight=cfg.hallucination_weight))  # fmt: skip
            if colours is not None:
                colour.append(sum(c for _, c in colours[i]))
                v += colour[-1]
            totals.append(cfg.caption_weight * v)
            claims.append(float(len(support[i])))
            supp.extend(support[i].values())
        means = {
            "reward_claims": claims,
            "reward_support": supp,
            "reward_yesno": yesno,
            "reward_colour": colour,
        }
        comps = {k: sum(v) / len(v) for k, v in means.items() if v}
        hits, misses = self.labeler.cache.hits, self.labeler.cache.misses
        comps["labeler_cache_hit_frac"] = hits / max(hits + misses, 1)
        return torch.tensor(totals, dtype=torch.float32), comps

    def credits(self, roll: Any, rows: Sequence[Any], tok: Any) -> torch.Tensor:
        """``(B*G, R)`` float32 claim credits on the first token of each mention's word (caption rows; 0 on
        question rows and padding); they sum to each caption's claim reward / caption_weight."""
        P = roll.prompt_length
        out = torch.zeros(roll.input_ids.shape[0], roll.input_ids.shape[1] - P)
        ids_rows = roll.response_ids()
        texts = [tok.decode(r, skip_special_tokens=True).strip() for r in ids_rows]
        support = self._support(texts, rows)
        cache: dict[int, str] = {}
        captions: dict[int, list[str]] = {}  # row -> its token texts (caption rows with tokens)
        for i, (ids, prompt) in enumerate(zip(ids_rows, rows)):
            if prompt.label is not None or not ids:
                continue
            pieces = [cache.setdefault(t, tok.decode([t], skip_special_tokens=True)) for t in ids]
            found = mention_tokens(pieces, self.vocab)
            missing = {c for _, c in found} - set(support[i])
            if missing:  # a mention split differently by the stripped text: ask about it too
                asked = self.labeler.verify_objects(self.images(prompt), sorted(missing))
                support[i].update({c: self.labeler.supported(v) for c, v in asked.items()})
            values = claim_values([c for _, c in found], support[i], coverage_weight=self.cfg.coverage_weight,
                                  hallucination_weight=self.cfg.hallucination_weight)  # fmt: skip
            for (pos, _), v in zip(found, values):
                out[i, pos] += v
            captions[i] = pieces
        if self.colours and captions:  # every row's colour claims in one labeler call
            idx = list(captions)
            joined = ["".join(captions[i]) for i in idx]
            credits = self._colour_credits(joined, [rows[i] for i in idx], [support[i] for i in idx])
            for i, cc in zip(idx, credits):
                for pos, (_, v) in zip(char_tokens(captions[i], [at for at, _ in cc]), cc):
                    out[i, pos] += v
        return out

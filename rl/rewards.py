"""Hallucination rewards from the ground-truth scene (pure functions of text and object sets).

The object matching is the CHAIR machinery of :mod:`mm.eval.chair` (Rohrbach et al., 2018):
``Vocabulary.mentions`` turns a caption into canonical object mentions (world synonyms, plurals,
multi-word forms), so the reward and the CHAIR metric agree on what a hallucination is.

Caption reward, for ground-truth categories ``G`` (``g = max(|G|, 1)``) and the caption's mentions::

    coverage      = |distinct mentioned objects in G| / g        (recall; repeats count once)
    hallucination = (mentions of objects not in G) / g           (every hallucinated mention counts)
    caption       = coverage_weight * coverage - hallucination_weight * hallucination

With the note's colour truth (:class:`mm.eval.claims.NoteTruth`) two more terms judge colours (each on
when its weight is > 0)::

    attribute          = (attribute claims judged wrong) / g
    attribute_coverage = |distinct (object, colour) claims judged right| / g
    caption            = ... - attribute_weight * attribute + attribute_coverage_weight * attribute_coverage

An attribute claim ("a *red* fork", "two forks (*red* and *blue*)", :mod:`mm.eval.claims.extract`) is
wrong when the object is there (in the image its sentence names, else in the note) but no object of it
has that colour, exactly the "attribute halluc. rate" of :func:`mm.eval.claims.generative.judge`; a
colour of an absent object is not judged (its mention is a hallucination already). A right colour earns
nothing under ``attribute_weight`` alone, so that term asks for the colours the model is sure of and
nothing more (dropping colours is as good as stating right ones); ``attribute_coverage_weight`` pays for
right colours (once per object and colour, as ``coverage``), so with equal weights a colour is worth
stating when it is more likely right than wrong.

Length-neutral by construction: words that name no object change neither term, there is no
per-word or per-token term, and repeating a correct mention adds nothing (coverage counts distinct
objects). Repeating a hallucinated mention is penalised again (each mention is a hallucination, as
CHAIR_i counts them). Normalising both terms by the number of ground-truth objects keeps one
hallucination and one missed object on the same scale whatever the scene size (deviation from
RLAIF-V, which scores with a labeller model, and from CHAIR_i, whose per-caption ratio over
mentions would reward padding a caption with extra correct mentions).

Yes/no reward (object questions, POPE-style): 1.0 when the answer parsed by
:func:`mm.eval.pope.parse_answer` equals the label, else 0.0 (an unparsed answer is wrong).

:func:`combine` forms the weighted sum of named components and returns each component for logging.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from mm.errors import UserError
from mm.eval.chair import Vocabulary
from mm.eval.claims.extract import RuleExtractor
from mm.eval.claims.generative import judge
from mm.eval.claims.truth import NoteTruth
from mm.eval.pope import PARSERS, parse_answer

VOCABS: tuple[str, ...] = ("world", "coco", "auto")
"""Vocabulary names a :class:`RewardConfig` may select (``auto``: :func:`resolve_vocab` picks one from the
ground-truth object names before scoring)."""


@dataclass(frozen=True, kw_only=True)
class RewardConfig:
    """Weights and conventions of the hallucination rewards."""

    coverage_weight: float = 1.0
    """Weight of the covered-object fraction in the caption reward (>= 0)."""
    hallucination_weight: float = 1.0
    """Weight of the hallucinated-mention penalty in the caption reward (>= 0)."""
    caption_weight: float = 1.0
    """Weight of the caption reward in the combined reward."""
    yesno_weight: float = 1.0
    """Weight of the yes/no correctness reward in the combined reward."""
    attribute_weight: float = 0.0
    """Weight of the wrong-colour penalty in the caption reward (>= 0; 0 = off): each colour claimed of an
    object that is there but has no object of that colour costs ``attribute_weight / g``. Needs the notes'
    colour truth (:class:`mm.eval.claims.NoteTruth`), which the scene reward passes when this is > 0."""
    attribute_coverage_weight: float = 0.0
    """Weight of the right-colour term in the caption reward (>= 0; 0 = off): each distinct (object, colour)
    claimed right earns ``attribute_coverage_weight / g``. Needs the colour truth, as ``attribute_weight``."""
    yesno_parser: str = "vlmevalkit"
    """POPE answer parser for yes/no answers (``original``, ``lmms``, ``vlmevalkit``)."""
    vocab: str = "world"
    """Object vocabulary: ``world`` (synthetic world synonyms), ``coco`` (original CHAIR table) or ``auto``
    (the one that names every ground-truth object: world, else coco; resolved by the trainer)."""

    def __post_init__(self) -> None:
        for name in (
            "coverage_weight",
            "hallucination_weight",
            "attribute_weight",
            "attribute_coverage_weight",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"RewardConfig.{name} must be >= 0, got {getattr(self, name)}")
        if self.yesno_parser not in PARSERS:
            raise ValueError(
                f"RewardConfig.yesno_parser must be one of {', '.join(PARSERS)}, got {self.yesno_parser!r}"
            )
        if self.vocab not in VOCABS:
            raise ValueError(f"RewardConfig.vocab must be one of {', '.join(VOCABS)}, got {self.vocab!r}")


@dataclass(frozen=True)
class Reward:
    """A combined reward and the components it was summed from (unweighted, for logging)."""

    total: float
    """Weighted sum of the components."""
    components: dict[str, float] = field(default_factory=dict)
    """Component name -> unweighted value."""


@cache
def vocabulary(name: str) -> Vocabulary:
    """The named vocabulary (built once per process)."""
    if name == "auto":
        raise ValueError("vocabulary 'auto' must be resolved first: rl.rewards.resolve_vocab(name, objects)")
    if name not in VOCABS:
        raise ValueError(f"unknown vocabulary {name!r}; expected one of {', '.join(VOCABS)}")
    return Vocabulary.world() if name == "world" else Vocabulary.coco()


def resolve_vocab(name: str, object_lists: Iterable[Iterable[str]], *, where: str = "the data") -> str:
    """The vocabulary to score ``object_lists`` (ground truth per prompt) with: ``name`` checked, or for
    ``auto`` the first of ``world``, ``coco`` that knows every object. A name no candidate knows is a
    :class:`mm.errors.UserError` that lists the unknown names and how to fix them."""
    if name not in VOCABS:
        raise UserError(f"reward.vocab must be one of {', '.join(VOCABS)}, got {name!r}")
    names = sorted({o for objs in object_lists for o in objs})
    candidates = ("world", "coco") if name == "auto" else (name,)
    unknown: dict[str, list[str]] = {}
    for cand in candidates:
        vocab = vocabulary(cand)
        unknown[cand] = [o for o in names if vocab.canonicalize(o) is None]
        if not unknown[cand]:
            return cand
    if name == "auto":
        missing = sorted(set(unknown["world"]) & set(unknown["coco"]))
        raise UserError(
            f"{where} names objects that neither the world nor the COCO vocabulary knows: "
            f"{missing[:8]}{' ...' if len(missing) > 8 else ''}; use canonical category names of one "
            "vocabulary"
        )
    others = [c for c in ("world", "coco") if c != name]
    hint = next(
        (f"they are {c} names: set reward.vocab={c} (or auto)" for c in others
         if all(vocabulary(c).canonicalize(o) is not None for o in names)),
        "use canonical category names of one vocabulary (reward.vocab=world or coco)",
    )  # fmt: skip
    bad = unknown[name]
    raise UserError(
        f"{where} names objects outside the {name} vocabulary: {bad[:8]}{' ...' if len(bad) > 8 else ''}; "
        f"{hint}"
    )


def _ground_truth(objects: Iterable[str], vocab: Vocabulary) -> set[str]:
    gt = set()
    for o in objects:
        c = vocab.canonicalize(o)
        if c is None:
            raise ValueError(
                f"ground-truth object {o!r} is not in the {vocab.name} vocabulary; "
                "use canonical category names of that vocabulary"
            )
        gt.add(c)
    return gt


def caption_terms(
    text: str, objects: Iterable[str], vocab: Vocabulary, truth: NoteTruth | None = None
) -> dict[str, float]:
    """``coverage``, ``hallucination`` and the raw counts of ``text`` against ground truth ``objects``; with
    the note's colour ``truth`` also ``attribute`` (wrong colours / g), ``attribute_coverage`` (distinct
    right (object, colour) claims / g) and their counts."""
    gt = _ground_truth(objects, vocab)
    mentioned = [c for _, c in vocab.mentions(text)]
    covered = set(mentioned) & gt
    n_halluc = sum(c not in gt for c in mentioned)
    g = max(len(gt), 1)
    out = {
        "coverage": len(covered) / g,
        "hallucination": n_halluc / g,
        "n_mentions": float(len(mentioned)),
        "n_hallucinated": float(n_halluc),
        "n_covered": float(len(covered)),
        "n_objects": float(len(gt)),
    }
    if truth is not None:
        verdicts = attribute_verdicts(text, truth, vocab)
        n_wrong = sum(wrong for _, wrong, _ in verdicts)
        n_right = len({fact for _, wrong, fact in verdicts if not wrong})
        out["attribute"] = n_wrong / g
        out["attribute_coverage"] = n_right / g
        out["n_attribute_wrong"] = float(n_wrong)
        out["n_attribute_right"] = float(n_right)
    return out


@cache
def claim_extractor(name: str) -> RuleExtractor:
    """The rule claim extractor (:mod:`mm.eval.claims.extract`) of reward vocabulary ``name``, built once."""
    return RuleExtractor(vocabulary(name))


def attribute_verdicts(
    text: str, truth: NoteTruth, vocab: Vocabulary
) -> list[tuple[int, bool, tuple[str, str]]]:
    """The judged colour claims of ``text`` in order, each as ``(character where its colour word starts,
    True if wrong, (object, colour))`` (:func:`mm.eval.claims.generative.judge`; unjudged claims are left
    out)."""
    out = []
    for claim in claim_extractor(vocab.name).extract(text):
        if claim.kind == "attribute":
            verdict = judge(claim, truth)
            if verdict is not None:
                out.append((claim.span[0], verdict, (claim.object, str(claim.value))))
    return out


def _need_truth(cfg: RewardConfig, truth: NoteTruth | None) -> NoteTruth | None:
    """``truth`` when the colour term is on (then it is required), else None (the term is skipped)."""
    if not colour_term(cfg):
        return None
    if truth is None:
        raise ValueError(
            f"reward attribute_weight={cfg.attribute_weight} / attribute_coverage_weight="
            f"{cfg.attribute_coverage_weight} need the note's colour truth (mm.eval.claims.note_truth of the "
            "note); pass truth=, or set both to 0"
        )
    return truth


def caption_reward(
    text: str, objects: Iterable[str], cfg: RewardConfig | None = None, truth: NoteTruth | None = None
) -> float:
    """``coverage_weight * coverage - hallucination_weight * hallucination`` (and the colour terms when
    their weights are on; see module docstring)."""
    cfg = cfg or RewardConfig()
    t = caption_terms(text, objects, vocabulary(cfg.vocab), _need_truth(cfg, truth))
    return _caption_value(t, cfg)


def _caption_value(t: Mapping[str, float], cfg: RewardConfig) -> float:
    value = cfg.coverage_weight * t["coverage"] - cfg.hallucination_weight * t["hallucination"]
    if "attribute" in t:
        value += (
            cfg.attribute_coverage_weight * t["attribute_coverage"] - cfg.attribute_weight * t["attribute"]
        )
    return value


def colour_term(cfg: RewardConfig) -> bool:
    """True when the caption reward judges colours (``attribute_weight`` or ``attribute_coverage_weight``
    > 0), so the scorer must pass each note's colour truth."""
    return cfg.attribute_weight > 0 or cfg.attribute_coverage_weight > 0


def mention_credits(
    pieces: Sequence[str],
    objects: Iterable[str],
    cfg: RewardConfig | None = None,
    truth: NoteTruth | None = None,
) -> list[float]:
    """The caption reward spread over the tokens that earned it: one credit per response token.

    ``pieces``: the text of each response token in order (their concatenation is the caption).
    Each object mention is found where the caption's mention list (:meth:`Vocabulary.mentions` of the
    text so far, evaluated at word ends) grows; the first token of the word that completed it (where the
    model chose the word) gets ``coverage_weight / g`` for a ground-truth object named for the first
    time, ``-hallucination_weight / g`` for a hallucinated one, 0 for a repeat; every other token gets
    0. So the credits sum to :func:`caption_reward` of the caption (multi-word forms are credited to
    their last word). This is
    the dense, per-mention signal of fine-grained feedback (FGAIF, Jing et al. 2024; RLHF-V's dense
    DPO, Yu et al. 2024) for a critic-free trainer: ``rl grpo`` adds it to each token's advantage
    (``algo.mention_credit``). A word starts at a token that begins with whitespace or is punctuation.
    With the colour terms on (and the note's colour ``truth``) each wrong colour claim adds
    ``-attribute_weight / g`` and each first right (object, colour) ``attribute_coverage_weight / g`` on
    the first token of its colour word, so the credits still sum to the caption reward.
    """
    cfg = cfg or RewardConfig()
    truth = _need_truth(cfg, truth)
    vocab = vocabulary(cfg.vocab)
    gt = _ground_truth(objects, vocab)
    g = max(len(gt), 1)
    credits = [0.0] * len(pieces)
    seen: set[str] = set()
    for start, c in mention_tokens(pieces, vocab):
        if c in gt:
            value = cfg.coverage_weight / g if c not in seen else 0.0
            seen.add(c)
        else:
            value = -cfg.hallucination_weight / g
        credits[start] += value  # the word's first token: where the model chose the word
    if truth is not None:
        verdicts = attribute_verdicts("".join(pieces), truth, vocab)
        facts: set[tuple[str, str]] = set()
        for i, (_, bad, fact) in zip(char_tokens(pieces, [at for at, _, _ in verdicts]), verdicts):
            if bad:
                credits[i] -= cfg.attribute_weight / g
            elif fact not in facts:
                credits[i] += cfg.attribute_coverage_weight / g
            facts.add(fact)
    return credits


def char_tokens(pieces: Sequence[str], chars: Sequence[int]) -> list[int]:
    """For each character offset of ``"".join(pieces)`` in ``chars``, the index of the token that holds it."""
    ends, total = [], 0
    for p in pieces:
        total += len(p)
        ends.append(total)
    out = []
    for c in chars:
        if not 0 <= c < total:
            raise ValueError(f"character {c} is outside the caption of {total} characters")
        out.append(next(i for i, e in enumerate(ends) if c < e))
    return out


def mention_tokens(pieces: Sequence[str], vocab: Vocabulary) -> list[tuple[int, str]]:
    """The object mentions of the caption ``"".join(pieces)`` in order, each as ``(index of the first token
    of the word that completed it, canonical object)`` (the token positions :func:`mention_credits` and the
    labeler's claim credits use). A word starts at a token that begins with whitespace or is punctuation."""
    out: list[tuple[int, str]] = []
    text, start, counted = "", 0, 0

    def boundary(piece: str) -> bool:  # a token that starts a new word (or is punctuation)
        return not piece or piece[0].isspace() or not piece[0].isalnum()

    for i, piece in enumerate(pieces):
        if i == 0 or boundary(piece) or boundary(pieces[i - 1][-1:] or " "):
            start = i
        text += piece
        if i + 1 < len(pieces) and not boundary(pieces[i + 1]) and not boundary(piece[-1:] or " "):
            continue  # the word goes on in the next token
        found = vocab.mentions(text)
        out.extend((start, c) for _, c in found[counted:])
        counted = len(found)
    return out


def yesno_reward(answer: str, label: str, parser: str = "vlmevalkit") -> float:
    """1.0 when ``answer`` parses to ``label`` (``yes``/``no``), else 0.0 (unparsed counts as wrong)."""
    lab = label.strip().lower()
    if lab not in ("yes", "no"):
        raise ValueError(f"label must be 'yes' or 'no', got {label!r}")
    return float(parse_answer(answer, parser) == lab)


def combine(components: Mapping[str, float], weights: Mapping[str, float]) -> Reward:
    """Weighted sum of ``components``; every component needs a weight (a missing one is an error)."""
    missing = sorted(set(components) - set(weights))
    if missing:
        raise ValueError(f"no weight for reward component(s) {missing}; weights given for {sorted(weights)}")
    total = sum(weights[k] * float(v) for k, v in components.items())
    return Reward(total=total, components={k: float(v) for k, v in components.items()})


def score(
    text: str,
    objects: Iterable[str],
    *,
    label: str | None = None,
    cfg: RewardConfig | None = None,
    truth: NoteTruth | None = None,
) -> Reward:
    """The combined reward of one response.

    A caption (``label is None``) gets the ``caption`` component (with ``coverage`` and
    ``hallucination`` logged beside it, and ``attribute`` / ``attribute_coverage`` when the colour terms are
    on); an answer to an
    object question (``label`` = ``yes``/``no``) gets the ``yesno`` component. ``objects`` are the
    ground-truth categories of the note/image; ``truth`` its colours (needed when the colour terms are on).
    """
    cfg = cfg or RewardConfig()
    if label is not None:
        r = combine({"yesno": yesno_reward(text, label, cfg.yesno_parser)}, {"yesno": cfg.yesno_weight})
        return r
    t = caption_terms(text, objects, vocabulary(cfg.vocab), _need_truth(cfg, truth))
    cap = _caption_value(t, cfg)
    r = combine({"caption": cap}, {"caption": cfg.caption_weight})
    comps = {"caption": cap, "coverage": t["coverage"], "hallucination": t["hallucination"]}
    if "attribute" in t:
        comps["attribute"] = t["attribute"]
        comps["attribute_coverage"] = t["attribute_coverage"]
    return Reward(total=r.total, components=comps)


def batch_scores(
    texts: Sequence[str],
    objects: Sequence[Iterable[str]],
    *,
    labels: Sequence[str | None] | None = None,
    cfg: RewardConfig | None = None,
    truths: Sequence[NoteTruth | None] | None = None,
) -> tuple[list[float], dict[str, list[float]]]:
    """Totals and per-component lists for a batch (``labels[i]`` None for captions; ``truths[i]`` the
    colour truth of text i's note, needed when the colour terms are on).

    A component absent from a response (a caption has no ``yesno``) is logged as NaN so the lists
    stay aligned with ``texts``; take ``nanmean`` to summarise.
    """
    if truths is not None and len(truths) != len(texts):
        raise ValueError(f"need one colour truth per text, got {len(texts)} texts, {len(truths)} truths")
    if len(texts) != len(objects) or (labels is not None and len(labels) != len(texts)):
        raise ValueError(
            f"need one object list (and label) per text, got {len(texts)} texts, {len(objects)} object "
            f"lists, {None if labels is None else len(labels)} labels"
        )
    labs: Sequence[Any] = labels if labels is not None else [None] * len(texts)
    tru: Sequence[Any] = truths if truths is not None else [None] * len(texts)
    rewards = [score(t, o, label=lab, cfg=cfg, truth=tr) for t, o, lab, tr in zip(texts, objects, labs, tru)]
    names = sorted({k for r in rewards for k in r.components})
    comps = {k: [r.components.get(k, float("nan")) for r in rewards] for k in names}
    return [r.total for r in rewards], comps

"""CHAIR: object hallucination in captions (Rohrbach et al., "Object Hallucination in Image
Captioning", EMNLP 2018), reproducing the original ``utils/chair.py`` of LisaAnne/Hallucination.

    CHAIR_i = hallucinated object mentions / all object mentions   (mentions not de-duplicated)
    CHAIR_s = captions with >= 1 hallucinated mention / captions

reported with ``recall`` (distinct ground-truth objects mentioned / ground-truth objects, summed
over captions) and ``mean_length`` (white-space words per caption), because CHAIR falls trivially
with shorter captions; ``intervals`` gives each a bootstrap 95% interval over captions
(:mod:`mm.eval.bootstrap`).

Mention extraction for the COCO vocabulary follows the original step by step: lower-case,
``nltk.word_tokenize`` (offline emulation, :mod:`mm.eval.words`), Pattern 2.6
``singularize`` (offline, :mod:`mm.eval.singularize`), greedy left-to-right merge of the original
*two*-word "double words" (``hot dog``, ``teddy bear``, ``baby bird -> bird``,
``passenger jet -> jet``, ``bow tie -> tie``, ``toilet seat -> toilet``, ``wine glas -> wine glass``,
...), drop every ``seat`` when the caption also says ``toilet``, then keep the words that are in
the synonym table (``assets/chair_synonyms.txt``, read as ``line.strip().split(', ')``).
Consequences kept on purpose: ``stove top oven`` (three words) never merges; ``motor bike`` and
``cheesecake`` (stored with a leading space) and ``iPhone`` never match; ``bus`` singularises to
``bu`` and is never matched.

Deviations (documented, by necessity): the tokeniser approximates Punkt's learned abbreviations
with a fixed list; ground-truth objects come from the objects file (the original also parsed the
reference COCO captions: put those objects in the file to follow the paper); ``chair_i`` with no
mention at all is 0.0 with a warning (the original divides by zero).

The world vocabulary (:meth:`Vocabulary.world`) lists plurals and irregular forms explicitly, so
it matches tokens without singularising, merges multi-word forms longest first, and has no COCO
special cases.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm.data.jsonio import as_id, id_problem
from mm.errors import UserError
from mm.eval.bootstrap import CHAIR_RATIOS, chair_units, intervals
from mm.eval.singularize import singularize
from mm.eval.words import word_tokenize
from mm.world.vocab import synonym_table

COCO_SYNONYMS_PATH = Path(__file__).resolve().parents[2] / "assets" / "chair_synonyms.txt"
"""The original COCO synonym table (one category per line, canonical name first)."""

COCO_DOUBLE_WORDS: tuple[str, ...] = (
    "motor bike", "motor cycle", "air plane", "traffic light", "street light", "traffic signal",
    "stop light", "fire hydrant", "stop sign", "parking meter", "suit case", "sports ball",
    "baseball bat", "baseball glove", "tennis racket", "wine glass", "hot dog", "cell phone",
    "mobile phone", "teddy bear", "hair drier", "potted plant", "bow tie", "laptop computer",
    "stove top oven", "home plate",
)  # fmt: skip
"""Word pairs the original treats as one word (``stove top oven`` is listed but can never match)."""

COCO_ANIMAL_WORDS: tuple[str, ...] = (
    "bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "animal", "cub",
)  # fmt: skip
"""``baby X`` / ``adult X`` -> ``X`` (so *baby* does not fire *person*)."""

COCO_VEHICLE_WORDS: tuple[str, ...] = ("jet", "train")
"""``passenger X`` -> ``X`` (so *passenger* does not fire *person*)."""


def _coco_merges() -> dict[str, str]:
    merges = {w: w for w in COCO_DOUBLE_WORDS}
    for animal in COCO_ANIMAL_WORDS:
        merges[f"baby {animal}"] = animal
        merges[f"adult {animal}"] = animal
    for vehicle in COCO_VEHICLE_WORDS:
        merges[f"passenger {vehicle}"] = vehicle
    merges["bow tie"] = "tie"
    merges["toilet seat"] = "toilet"
    merges["wine glas"] = "wine glass"
    return merges


@dataclass(frozen=True, kw_only=True)
class Vocabulary:
    """Which words name which objects, and how caption text is normalised before matching."""

    name: str
    """Short name reported with the scores (``coco``, ``world``, ``custom``)."""
    forms: Mapping[str, str]
    """Surface form (lower case, words joined by one space) -> canonical object name."""
    merges: Mapping[str, str]
    """Token n-gram (space-joined) -> the single word it is treated as (may not be an object)."""
    max_merge: int
    """Longest n-gram tried when merging (the original COCO code only looks at pairs: 2)."""
    singularize: bool
    """Singularise each token (Pattern 2.6 rules) before merging and matching."""
    toilet_seat_rule: bool
    """Drop every ``seat`` from a caption that also mentions ``toilet`` (COCO special case)."""
    canonical: frozenset[str] = field(default_factory=frozenset)
    """All canonical names (defaults to the values of ``forms``)."""

    def __post_init__(self) -> None:
        if not self.canonical:
            object.__setattr__(self, "canonical", frozenset(self.forms.values()))
        if self.max_merge < 1:
            raise ValueError(f"max_merge must be >= 1, got {self.max_merge}")

    # ---- constructors -------------------------------------------------------------------------
    @classmethod
    def coco(cls, path: str | Path = COCO_SYNONYMS_PATH) -> Vocabulary:
        """The original CHAIR COCO vocabulary from the synonym table at ``path``."""
        p = Path(path)
        if not p.is_file():
            raise UserError(
                f"COCO synonym table not found at {p}; expected the file assets/chair_synonyms.txt "
                "shipped with notelens (copy it from LisaAnne/Hallucination data/synonyms.txt)"
            )
        forms: dict[str, str] = {}
        canonical = []
        for line in p.read_text().splitlines():
            if not line.strip():
                continue
            synonyms = line.strip().split(", ")
            canonical.append(synonyms[0])
            for s in synonyms:  # later lines win, as in the original's dict
                forms[s] = synonyms[0]
        return cls(
            name="coco",
            forms=forms,
            merges=_coco_merges(),
            max_merge=2,
            singularize=True,
            toilet_seat_rule=True,
            canonical=frozenset(canonical),
        )

    @classmethod
    def from_table(cls, table: Mapping[str, Sequence[str]], *, name: str = "custom") -> Vocabulary:
        """Vocabulary from ``{canonical: [surface forms]}``; forms must list plurals themselves.

        The canonical name always counts as a form; multi-word forms are merged longest first.
        A form claimed by two canonical names is an error.
        """
        forms: dict[str, str] = {}
        for canon, surfaces in table.items():
            for s in (canon, *surfaces):
                key = " ".join(s.lower().split())
                if not key:
                    raise UserError(f"vocabulary table: empty surface form for {canon!r}")
                if forms.get(key, canon) != canon:
                    raise UserError(
                        f"vocabulary table: surface form {key!r} belongs to both {forms[key]!r} and "
                        f"{canon!r}; give each form to one object"
                    )
                forms[key] = canon
        merges = {f: f for f in forms if " " in f}
        max_merge = max((len(f.split()) for f in forms), default=1)
        return cls(
            name=name,
            forms=forms,
            merges=merges,
            max_merge=max_merge,
            singularize=False,
            toilet_seat_rule=False,
            canonical=frozenset(table),
        )

    @classmethod
    def world(cls) -> Vocabulary:
        """The synthetic world's vocabulary (``mm.world.vocab.synonym_table()``)."""
        return cls.from_table(synonym_table(), name="world")

    # ---- matching -----------------------------------------------------------------------------
    def words(self, caption: str) -> list[str]:
        """Normalised words of ``caption`` after tokenising, singularising and merging."""
        tokens = word_tokenize(caption.lower())
        if self.singularize:
            tokens = [singularize(t) for t in tokens]
        out, i = [], 0
        while i < len(tokens):
            for n in range(min(self.max_merge, len(tokens) - i), 1, -1):
                gram = " ".join(tokens[i : i + n])
                if gram in self.merges:
                    out.append(self.merges[gram])
                    i += n
                    break
            else:
                out.append(tokens[i])
                i += 1
        if self.toilet_seat_rule and "toilet" in out and "seat" in out:
            out = [w for w in out if w != "seat"]
        return out

    def mentions(self, caption: str) -> list[tuple[str, str]]:
        """Object mentions of ``caption`` in order: ``(surface word, canonical object)``."""
        return [(w, self.forms[w]) for w in self.words(caption) if w in self.forms]

    def canonicalize(self, obj: str) -> str | None:
        """Canonical name of a ground-truth object name, or None if the vocabulary lacks it."""
        if obj in self.canonical:
            return obj
        key = " ".join(obj.lower().split())
        if key in self.canonical:
            return key
        return self.forms.get(key)


def _ratio(num: float, den: float, what: str, warn: list[str]) -> float:
    if den == 0:
        warn.append(f"{what} is undefined (denominator 0); reported as 0.0")
        return 0.0
    return num / den


def _image_id(value: Any, where: str) -> str:
    """An image id as a string (:func:`mm.data.jsonio.normalize_id`: ``2``, ``"2"``, ``2.0`` -> ``"2"``)."""
    key = as_id(value)
    if key is None:
        raise UserError(f"{where}: {id_problem(value, 'image_id')}")
    return key


def _normalize_captions(captions: Mapping[Any, str] | Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    if isinstance(captions, Mapping):
        return [(_image_id(k, "captions"), v) for k, v in captions.items()]
    out = []
    for i, c in enumerate(captions):
        if not isinstance(c, Mapping) or "image_id" not in c or not isinstance(c.get("caption"), str):
            raise UserError(f"caption entry {i}: expected {{'image_id': ..., 'caption': str}}, got {c!r}")
        out.append((_image_id(c["image_id"], f"caption entry {i}"), c["caption"]))
    return out


def chair_scores(
    captions: Mapping[Any, str] | Sequence[Mapping[str, Any]],
    objects: Mapping[Any, Sequence[str]],
    vocab: Vocabulary,
) -> dict[str, Any]:
    """CHAIR_s, CHAIR_i, recall and mean length of ``captions`` against ground-truth ``objects``.

    ``captions``: ``{image_id: caption}`` or a list of ``{"image_id", "caption"}`` (one image may
    have several captions); ``objects``: ``{image_id: [object names]}`` (names are mapped to
    canonical ones through ``vocab``; ids are compared as strings: ``2``, ``"2"`` and ``2.0`` are one
    id). Every caption is scored, several per image included (the file reader
    :func:`mm.eval.files.read_captions` keeps the first caption of each image). Returns ``chair_s``,
    ``chair_i``, ``recall``, ``mean_length``, counts, ``per_caption`` and ``warnings``.
    """
    caps = _normalize_captions(captions)
    gt_by_id = {_image_id(k, "objects"): v for k, v in objects.items()}
    missing = sorted({i for i, _ in caps if i not in gt_by_id})
    if missing:
        raise UserError(
            f"{len(missing)} captioned image id(s) have no ground-truth objects, e.g. {missing[:5]}; "
            "the objects file must list every captioned image (use [] for an image with no objects)"
        )
    warn: list[str] = []
    unknown: set[str] = set()
    gt_sets: dict[str, set[str]] = {}
    for image_id, objs in gt_by_id.items():
        s = set()
        for o in objs:
            c = vocab.canonicalize(o)
            if c is None:
                unknown.add(o)
            else:
                s.add(c)
        gt_sets[image_id] = s
    if unknown:
        warn.append(
            f"{len(unknown)} ground-truth object name(s) are not in the {vocab.name} vocabulary and "
            f"are ignored: {sorted(unknown)[:10]}"
        )

    per_caption = []
    n_mentions = n_halluc = n_halluc_caps = n_words = gt_total = gt_covered = 0
    for image_id, caption in caps:
        gt = gt_sets[image_id]
        mentioned = vocab.mentions(caption)
        hallucinated = [(w, c) for w, c in mentioned if c not in gt]
        covered = {c for _, c in mentioned} & gt
        length = len(caption.split())
        n_mentions += len(mentioned)
        n_halluc += len(hallucinated)
        n_halluc_caps += bool(hallucinated)
        n_words += length
        gt_total += len(gt)
        gt_covered += len(covered)
        per_caption.append(
            {
                "image_id": image_id,
                "caption": caption,
                "mentioned": [list(m) for m in mentioned],
                "hallucinated": [list(h) for h in hallucinated],
                "gt_objects": sorted(gt),
                "chair_s": int(bool(hallucinated)),
                "chair_i": len(hallucinated) / len(mentioned) if mentioned else 0.0,
                "recall": len(covered) / len(gt) if gt else 0.0,
                "length": length,
            }
        )
    n = len(caps)
    result = {
        "vocab": vocab.name,
        "chair_s": _ratio(n_halluc_caps, n, "chair_s (no captions)", warn),
        "chair_i": _ratio(n_halluc, n_mentions, "chair_i (no object mentioned)", warn),
        "recall": _ratio(gt_covered, gt_total, "recall (no ground-truth objects)", warn),
        "mean_length": _ratio(n_words, n, "mean_length (no captions)", warn),
        "n_captions": n,
        "n_mentions": n_mentions,
        "n_hallucinated": n_halluc,
        "per_caption": per_caption,
        "intervals": intervals(chair_units(per_caption), CHAIR_RATIOS) if per_caption else {},
        "warnings": warn,
    }
    for w in warn:
        warnings.warn(w, RuntimeWarning, stacklevel=2)
    return result

"""POPE: polling-based object probing (Li et al., "Evaluating Object Hallucination in Large
Vision-Language Models", EMNLP 2023): question building, answer parsing and scoring.

Three answer parsers, each reproducing its source's rule (positive class = ``yes``):

- ``original`` (RUCAIBox/POPE ``evaluate.py``): keep the text before the first ``.``, delete
  ``,``, split on single spaces; ``no`` if a token is ``No``, ``not`` or ``no``, else ``yes``.
  Never unparsed: ``""``, ``NO``, ``Nope`` and ``Not sure`` all count as *yes*.
- ``lmms`` (lmms-eval ``tasks/pope/utils.py``): ``text.lower().strip()`` must equal ``yes`` or
  ``no``; anything else is unparsed. As in lmms-eval, an unparsed answer is wrong for accuracy and
  is left out of recall's false negatives (lmms counts FN only where the prediction is ``no``).
- ``vlmevalkit`` (VLMEvalKit ``YOrN_Extraction`` + ``POPE_rating``): lower-case, VQA punctuation
  stripping (``process_punctuation``), split on white space; ``yes`` iff the word ``yes`` is there
  and ``no`` is not, ``no`` for the reverse, else unknown. Unknown counts as ``no`` for
  precision/recall/F1 (it is a false negative when the label is yes) and as wrong for accuracy.

Deviations from the sources (on purpose, the point of this tool): ``yes_ratio`` is always the
fraction of *predictions* that are ``yes`` over all scored answers (lmms-eval reports the fraction
of *labels*); answers are joined to questions by ``question_id``, not by line order; undefined
ratios (no predicted yes -> precision) are 0.0 with a warning instead of a crash (the original)
or a silent 0 (lmms-eval, VLMEvalKit). Scores are fractions in [0, 1] (VLMEvalKit prints x100).
"""

from __future__ import annotations

import random
import re
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mm.data.jsonio import as_id, id_problem
from mm.eval.bootstrap import POPE_RATIOS, intervals, pope_units

PARSERS: tuple[str, ...] = ("original", "lmms", "vlmevalkit")
"""Names accepted by :func:`parse_answer` and :func:`pope_scores`."""

SPLITS: tuple[str, ...] = ("random", "popular", "adversarial")
"""Negative-sampling strategies of the POPE paper."""

DEFAULT_TEMPLATE = "Is there a {object} in the image?"
"""POPE's question template; ``{object}`` is replaced by the object name."""


# ---- parsers -----------------------------------------------------------------------------------
def parse_original(text: str) -> str:
    """POPE ``evaluate.py``: first sentence, no commas, single-space split, negation words."""
    if text.find(".") != -1:
        text = text.split(".")[0]
    words = text.replace(",", "").split(" ")
    return "no" if ("No" in words or "not" in words or "no" in words) else "yes"


def parse_lmms(text: str) -> str | None:
    """lmms-eval: exact ``yes`` / ``no`` after ``lower().strip()``; None otherwise."""
    pred = text.lower().strip()
    return pred if pred in ("yes", "no") else None


_VQA_PUNCT = list(';/[]"{}()=+\\_-><@`,?!')  # VQA-eval's list, same order
_COMMA_STRIP = re.compile(r"(\d)(,)(\d)")
_PERIOD_STRIP = re.compile(r"(?!<=\d)(\.)(?!\d)")  # the VQA regex, typo included


def vqa_process_punctuation(text: str) -> str:
    """VLMEvalKit / VQA-eval ``process_punctuation``, quirks included.

    A punctuation mark next to a space (or any text with a ``digit,digit``) is deleted, otherwise
    replaced by a space; periods not followed by a digit are deleted, at most 32 of them (the
    source passes ``re.UNICODE`` == 32 as ``re.sub``'s *count*).
    """
    out = text
    for p in _VQA_PUNCT:
        if (p + " " in text or " " + p in text) or _COMMA_STRIP.search(text) is not None:
            out = out.replace(p, "")
        else:
            out = out.replace(p, " ")
    return _PERIOD_STRIP.sub("", out, count=int(re.UNICODE))


def parse_vlmevalkit(text: str) -> str | None:
    """VLMEvalKit ``YOrN_Extraction``: yes xor no among the words; None (``Unknown``) otherwise."""
    words = vqa_process_punctuation(text.lower()).split()
    if "yes" in words and "no" not in words:
        return "yes"
    if "yes" not in words and "no" in words:
        return "no"
    return None


_PARSE = {"original": parse_original, "lmms": parse_lmms, "vlmevalkit": parse_vlmevalkit}


def parse_answer(text: str, parser: str) -> str | None:
    """``"yes"``, ``"no"`` or None (unparsed) for a free-form answer, by the named parser."""
    if parser not in _PARSE:
        raise ValueError(f"unknown POPE parser {parser!r}; expected one of {', '.join(PARSERS)}")
    return _PARSE[parser](text)


# ---- scoring -----------------------------------------------------------------------------------
def _qid(qid: Any) -> str:
    """A question id as a string (:func:`mm.data.jsonio.normalize_id`: ``2``, ``"2"``, ``2.0`` -> ``"2"``)."""
    key = as_id(qid)
    if key is None:
        raise ValueError(id_problem(qid, "question id"))
    return key


def _ratio(num: float, den: float, what: str, warn: list[str]) -> float:
    if den == 0:
        warn.append(f"{what} is undefined (denominator 0); reported as 0.0")
        return 0.0
    return num / den


def pope_scores(
    labels: Mapping[Any, str],
    answers: Mapping[Any, str] | Iterable[tuple[Any, str]],
    parser: str = "original",
    *,
    units: Mapping[Any, Any] | None = None,
) -> dict[str, Any]:
    """Accuracy, precision, recall, F1, yes_ratio and the confusion counts of POPE answers.

    ``labels``: ``{question_id: "yes" | "no"}``; ``answers``: ``{question_id: text}`` or
    ``(question_id, text)`` pairs (pairs let duplicates be reported; the first one is scored).
    Ids are compared as strings (``2``, ``"2"`` and ``2.0`` are one id; ``True`` is an error).
    Only questions with an answer are scored; ``missing_ids``, ``duplicate_ids`` and ``extra_ids``
    (answers to unknown questions) are reported.

    ``tp/fp/tn/fn`` count parsed answers; ``unparsed`` counts the rest (always wrong for accuracy;
    see the module docstring for how each parser treats them in recall).

    ``intervals`` holds a bootstrap 95% interval per metric (:mod:`mm.eval.bootstrap`), resampling
    ``units`` (``{question_id: image}``: all questions about one image are drawn together), or single
    questions when ``units`` is None.
    """
    if parser not in _PARSE:
        raise ValueError(f"unknown POPE parser {parser!r}; expected one of {', '.join(PARSERS)}")
    gold: dict[str, str] = {}
    for qid, label in labels.items():
        lab = str(label).strip().lower()
        if lab not in ("yes", "no"):
            raise ValueError(f"question {qid!r}: label must be 'yes' or 'no', got {label!r}")
        gold[_qid(qid)] = lab
    pairs = answers.items() if isinstance(answers, Mapping) else answers
    seen: dict[str, str] = {}
    duplicates: list[str] = []
    extra: list[str] = []
    for qid, text in pairs:
        key = _qid(qid)
        if key not in gold:
            extra.append(key)
        elif key in seen:
            duplicates.append(key)
        else:
            seen[key] = text
    missing = [q for q in gold if q not in seen]

    tp = fp = tn = fn = unparsed_yes = unparsed_no = n_pred_yes = 0
    for qid, text in seen.items():
        pred, lab = _PARSE[parser](text), gold[qid]
        if pred is None:
            unparsed_yes += lab == "yes"
            unparsed_no += lab == "no"
            continue
        n_pred_yes += pred == "yes"
        tp += pred == "yes" and lab == "yes"
        fp += pred == "yes" and lab == "no"
        tn += pred == "no" and lab == "no"
        fn += pred == "no" and lab == "yes"

    warn: list[str] = []
    if missing:
        warn.append(f"{len(missing)} question(s) have no answer and are not scored, e.g. {missing[:5]}")
    if duplicates:
        warn.append(f"{len(duplicates)} duplicate answer id(s); the first is scored, e.g. {duplicates[:5]}")
    if extra:
        warn.append(f"{len(extra)} answer id(s) match no question and are ignored, e.g. {extra[:5]}")
    n = len(seen)
    # vlmevalkit: unknown == "no" for P/R/F1, so an unknown with label yes is a false negative.
    fn_recall = fn + unparsed_yes if parser == "vlmevalkit" else fn
    precision = _ratio(tp, tp + fp, "precision (no 'yes' prediction)", warn)
    recall = _ratio(tp, tp + fn_recall, "recall (no positive label among parsed answers)", warn)
    f1 = _ratio(2 * precision * recall, precision + recall, "f1 (precision + recall = 0)", warn)
    result = {
        "parser": parser,
        "accuracy": _ratio(tp + tn, n, "accuracy (no answered question)", warn),
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "yes_ratio": _ratio(n_pred_yes, n, "yes_ratio (no answered question)", warn),
        "tp": tp,
        "fp": fp,
        "tn": tn,
        "fn": fn,
        "unparsed": unparsed_yes + unparsed_no,
        "n_scored": n,
        "missing_ids": missing,
        "duplicate_ids": duplicates,
        "extra_ids": extra,
        "warnings": warn,
    }
    unit_of = {_qid(k): str(v) for k, v in units.items()} if units is not None else {}
    rows = [(unit_of.get(q, q), gold[q], _PARSE[parser](seen[q])) for q in gold if q in seen]  # labels' order
    by_unit = pope_units(rows, unparsed_fn=parser != "lmms")
    result["intervals"] = intervals(by_unit, POPE_RATIOS) if rows else {}
    for w in warn:
        warnings.warn(w, RuntimeWarning, stacklevel=2)
    return result


# ---- question building -------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class PopeBuildConfig:
    """How to build a POPE question set from object annotations."""

    split: str = "random"
    """Negative sampling: ``random``, ``popular`` (most frequent absent) or ``adversarial``
    (absent categories that co-occur most with the present ones)."""
    seed: int = 0
    """Seed for every random choice (same seed, same file)."""
    template: str = DEFAULT_TEMPLATE
    """Question text; must contain ``{object}``."""
    per_image: int | None = None
    """At most this many present objects per image (sampled), or None for all of them."""

    def __post_init__(self) -> None:
        if self.split not in SPLITS:
            raise ValueError(f"split must be one of {', '.join(SPLITS)}, got {self.split!r}")
        if "{object}" not in self.template:
            raise ValueError(f"template must contain '{{object}}', got {self.template!r}")
        if self.per_image is not None and self.per_image < 1:
            raise ValueError(f"per_image must be >= 1 or None, got {self.per_image}")


def cooccurrence(objects: Mapping[str, Sequence[str]]) -> tuple[Counter[str], Counter[tuple[str, str]]]:
    """Images per category and images per (a, b) category pair (both orders) in ``objects``."""
    freq: Counter[str] = Counter()
    pairs: Counter[tuple[str, str]] = Counter()
    for objs in objects.values():
        present = sorted(set(objs))
        freq.update(present)
        for a in present:
            for b in present:
                if a != b:
                    pairs[(a, b)] += 1
    return freq, pairs


def _negatives(
    present: list[str],
    absent: list[str],
    k: int,
    split: str,
    freq: Counter[str],
    pairs: Counter[tuple[str, str]],
    rng: random.Random,
) -> list[str]:
    if split == "random":
        return rng.sample(absent, k)
    if split == "popular":
        return sorted(absent, key=lambda c: (-freq[c], c))[:k]
    score = {c: sum(pairs[(p, c)] for p in present) for c in absent}
    return sorted(absent, key=lambda c: (-score[c], -freq[c], c))[:k]


def build_questions(
    objects: Mapping[Any, Sequence[str]],
    cfg: PopeBuildConfig,
    *,
    categories: Sequence[str] | None = None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """POPE questions ``{"question_id", "image", "text", "label"}`` and warnings.

    Per image: its distinct present objects (sampled down to ``cfg.per_image``) as ``yes``
    questions and as many absent categories as ``no`` questions, in yes/no pairs. Absent
    categories come from ``categories`` (default: every category seen in ``objects``). When an
    image has fewer absent categories than present objects, its positives are cut to keep the
    balance (with a warning). Images without objects get no questions. Ids run from 1.
    """
    rng = random.Random(cfg.seed)
    objs = {str(k): list(dict.fromkeys(v)) for k, v in objects.items()}
    freq, pairs = cooccurrence(objs)
    universe = list(dict.fromkeys(categories)) if categories is not None else sorted(freq)
    warn: list[str] = []
    unknown = sorted(set(freq) - set(universe))
    if unknown:
        raise ValueError(f"objects not in the category list: {unknown[:10]}; add them to the categories")
    questions: list[dict[str, Any]] = []
    short = 0
    for image in sorted(objs):
        present = objs[image]
        if not present:
            continue
        if cfg.per_image is not None and len(present) > cfg.per_image:
            present = rng.sample(present, cfg.per_image)
        absent = [c for c in universe if c not in set(objs[image])]
        k = min(len(present), len(absent))
        if k < len(present):
            short += 1
            present = present[:k]
        negatives = _negatives(objs[image], absent, k, cfg.split, freq, pairs, rng)
        for pos, neg in zip(present, negatives):
            for obj, label in ((pos, "yes"), (neg, "no")):
                questions.append(
                    {
                        "question_id": len(questions) + 1,
                        "image": image,
                        "text": cfg.template.format(object=obj),
                        "label": label,
                    }
                )
    if short:
        warn.append(f"{short} image(s) had fewer absent categories than present objects; positives were cut")
    return questions, warn


def objects_from_notes(notes: Iterable[Any]) -> dict[str, list[str]]:
    """``{image: [categories]}`` from :class:`mm.data.format.Note` objects, one entry per image.

    The image key is the image path as stored in the note (relative to the note folder), which is
    what a POPE question's ``image`` field names.
    """
    out: dict[str, list[str]] = {}
    for note in notes:
        for path, anns in zip(note.images, note.objects):
            out[path] = [a.category for a in anns]
    return out

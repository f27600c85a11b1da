"""Turn notes into NoteVLM training samples: note captioning, yes/no object questions, chat turns.

A sample is (note, prompt, answer); :class:`mm.model.NoteProcessor` turns it into tokens where only the
answer and its ``<eos>`` are learned (labels -100 on images, separators and the prompt). Sources:

- ``caption``: prompt :data:`CAPTION_PROMPT`, answer = the note's text (world notes and COCO notes: the
  caption names every object, so a captioner's object recall can reach 1).
- ``image_caption``: prompt :data:`IMAGE_CAPTION_PROMPT` over ONE image of the note, answer = that
  image's caption (world notes). Shorter sequences (one image's tokens, one sentence) that tie each object
  name to the pixels that show it; the note caption then only has to walk through the images in order.
- ``question``: each of the note's yes/no questions (world / POPE files), answer ``"yes"`` / ``"no"``, or
  with ``answer_style="object"`` the object first, ``"A fork: no"`` (:func:`yes_no_answer`).
- ``pope_question``: POPE-style questions about ONE image of the note (:func:`pope_question_samples`: the
  negatives are absent objects that co-occur with the image's objects across the notes, POPE's adversarial
  rule, instead of the world's partner-or-random ones), same answer style.
- ``attribute_question``: colour yes/no questions about ONE image of the note
  (:func:`attribute_question_samples`: "Is there a red fork in this note?", the "no" colour taken from
  another object of the same image, the claim eval's adversarial rule), same answer style with the
  coloured object first ("A red fork: no").
- ``colour_answer``: open colour questions about ONE image of the note (:func:`colour_answer_samples`:
  "What colour is the fork in this photo?", answer the colour word, "red"), for each category the image
  shows in one colour: the lookup a caption makes after the noun ("a fork (red)"), asked on its own.
- ``count_answer``: open count questions about ONE image of the note (:func:`count_answer_samples`:
  "How many cups are in this photo?", answer the count in digits, "2"), for each category the image
  shows: a caption's grouping ("two tiny cups (red and blue)"), asked on its own.
- ``conversation``: LLaVA files: each ``human`` turn followed by a ``gpt`` turn is one sample (single
  turn; the ``<image>`` marker is removed from the prompt since the processor places the images).

Pure functions of the notes: no I/O, no tokenizer.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mm.data.prompts import CAPTION_PROMPT, IMAGE_CAPTION_PROMPT
from mm.eval.chair import Vocabulary
from mm.eval.claims.questions import ClaimQuestionConfig, build_claim_questions
from mm.eval.claims.truth import note_truth
from mm.eval.pope_notes import pope_questions
from mm.world.text import article

TASK_KINDS = (
    "caption", "image_caption", "question", "pope_question", "attribute_question", "colour_answer",
    "count_answer", "conversation",
)  # fmt: skip
"""Kinds of samples :func:`build_samples` can make."""

ANSWER_STYLES = ("word", "object")
"""How a yes/no answer is written (:func:`yes_no_answer`)."""


@dataclass(frozen=True)
class Sample:
    """One training sample: the index of its note, the user prompt and the answer to learn."""

    note: int
    """Index of the note in the list given to :func:`build_samples`."""
    kind: str
    """One of :data:`TASK_KINDS`."""
    prompt: str
    """User text after the images."""
    answer: str
    """Assistant text (learned)."""
    image: int | None = None
    """The one image of the note this sample shows (``image_caption``); None = all of the note's images."""


def caption_samples(index: int, note: Any, *, prompt: str = CAPTION_PROMPT) -> list[Sample]:
    """The captioning sample of ``note`` ([] when the note has no text)."""
    text = note.text.strip()
    return [Sample(note=index, kind="caption", prompt=prompt, answer=text)] if text else []


def image_caption_samples(index: int, note: Any, *, prompt: str = IMAGE_CAPTION_PROMPT) -> list[Sample]:
    """One sample per image of ``note`` that has a caption (none for notes without ``image_captions``)."""
    caps = note.image_captions or []
    return [
        Sample(note=index, kind="image_caption", prompt=prompt, answer=c.strip(), image=k)
        for k, c in enumerate(caps[: len(note.images)])
        if c.strip()
    ]


def yes_no_answer(label: str, obj: str | None, style: str = "word") -> str:
    """The text a model learns for a yes/no object question whose answer is ``label``.

    - ``word``: ``"yes"`` / ``"no"`` (POPE's single word; every POPE parser reads it).
    - ``object``: the asked object first, then the word: ``"A fork: yes"``, ``"An umbrella: no"``
      (``obj`` = the category; a question without one falls back to the word). The decision token then
      comes after the object's own token, so a small LM checks the image for *that* token (one attention
      hop) instead of first fetching the noun from inside the question (two hops, which the tiny 3-layer LM
      learned late or never: held-out yes/no accuracy 0.60 -> 0.90, README). POPE's ``original`` and
      VLMEvalKit's parsers read it; lmms-eval's exact-word parser does not.
    """
    if style not in ANSWER_STYLES:
        raise ValueError(f"answer style must be one of {ANSWER_STYLES}, got {style!r}")
    if label not in ("yes", "no"):
        raise ValueError(f"a yes/no label must be 'yes' or 'no', got {label!r}")
    if style == "word" or not obj:
        return label
    return f"{article(obj).capitalize()} {obj}: {label}"


def question_samples(
    index: int, note: Any, *, limit: int | None = None, answer_style: str = "word"
) -> list[Sample]:
    """One sample per yes/no question of ``note`` (the first ``limit`` when given), answers written in
    ``answer_style`` (:func:`yes_no_answer`)."""
    qs = note.questions if limit is None else note.questions[:limit]
    return [
        Sample(index, "question", q.question, yes_no_answer(q.answer, q.object, answer_style)) for q in qs
    ]


def pope_question_samples(
    notes: Sequence[Any],
    *,
    per_note: int = 1,
    split: str = "adversarial",
    seed: int = 0,
    answer_style: str = "word",
) -> list[list[Sample]]:
    """Per note, ``per_note`` POPE-style yes/no samples about single images of it, drawn at random from the
    questions :func:`mm.eval.pope_notes.pope_questions` builds over ``notes`` (as many "yes" as "no" per
    image; ``split``: how the absent objects are chosen, POPE's random / popular / adversarial rule applied
    to these notes' statistics). The world's own questions take their "no" objects from co-occurrence
    partners or from any category (mostly another theme's); POPE's adversarial ones are absent objects that
    co-occur with the image's objects, i.e. the note's theme, the hard case a captioner learns to guess."""
    where = {path: (i, k) for i, n in enumerate(notes) for k, path in enumerate(n.images)}
    questions, _ = pope_questions(notes, split=split, seed=seed)

    def sample(q: dict) -> Sample:
        note, image = where[q["image"]]
        answer = yes_no_answer(q["label"], q["object"], answer_style)
        return Sample(note, "pope_question", q["text"], answer, image=image)

    return _draw_per_note(questions, len(notes), lambda q: where[q["image"]][0], sample, per_note, seed)


def _draw_per_note(
    questions: Sequence[dict], n_notes: int, note_of: Any, sample: Any, per_note: int, seed: int
) -> list[list[Sample]]:
    """Per note, ``per_note`` of its ``questions`` (``note_of(q)``: its note index) drawn at random with
    ``seed``, each made a :class:`Sample` by ``sample(q)``."""
    by_note: list[list[dict]] = [[] for _ in range(n_notes)]
    for q in questions:
        by_note[note_of(q)].append(q)
    rng = random.Random(seed)
    return [[sample(q) for q in rng.sample(qs, min(per_note, len(qs)))] for qs in by_note]


def attribute_question_samples(
    notes: Sequence[Any],
    *,
    per_note: int = 1,
    split: str = "adversarial",
    seed: int = 0,
    answer_style: str = "word",
) -> list[list[Sample]]:
    """Per note, ``per_note`` colour yes/no samples about single images of it, drawn at random from the claim
    eval's attribute questions (:func:`mm.eval.claims.questions.build_claim_questions`, ``split`` its
    negative rule; one "yes" and one "no" per object whose colours are known). The answer names the coloured
    object first in ``answer_style`` "object" ("A red fork: no"), so the decision follows the colour and the
    noun: the one-hop read a yes/no answer needs (:func:`yes_no_answer`)."""
    vocab = Vocabulary.world()
    images = {}
    for i, note in enumerate(notes):
        for k, truth in enumerate(note_truth(note, vocab).images):
            images[f"{i}/{k}"] = truth
    cfg = ClaimQuestionConfig(split=split, seed=seed, kinds=("attribute",))  # as `mm eval claims` asks
    questions, _ = build_claim_questions(images, cfg, categories=sorted(vocab.canonical))

    def sample(q: dict) -> Sample:
        note, image = (int(x) for x in q["image"].split("/"))
        answer = yes_no_answer(q["label"], f"{q['value']} {q['object']}", answer_style)
        return Sample(note, "attribute_question", q["text"], answer, image=image)

    note_of = lambda q: int(q["image"].split("/")[0])  # noqa: E731
    return _draw_per_note(questions, len(notes), note_of, sample, per_note, seed)


COLOUR_QUESTION = "What colour is the {name} in this photo?"


def colour_answer_samples(notes: Sequence[Any], *, per_note: int = 1, seed: int = 0) -> list[list[Sample]]:
    """Per note, ``per_note`` open colour questions (:data:`COLOUR_QUESTION`) drawn at random over its
    images' categories that are there in one colour (a category in two colours has no one answer), each
    answered with the colour word ("red"). Objects without a colour are skipped."""
    questions = []
    for i, note in enumerate(notes):
        for k, objects in enumerate(note.objects or []):
            colours: dict[str, set] = {}
            for o in objects:
                colours.setdefault(o.category, set()).add(o.color)
            for name, cs in sorted(colours.items()):
                if len(cs) == 1 and None not in cs:
                    questions.append({"note": i, "image": k, "object": name, "colour": next(iter(cs))})

    def sample(q: dict) -> Sample:
        prompt = COLOUR_QUESTION.format(name=q["object"])
        return Sample(q["note"], "colour_answer", prompt, q["colour"], image=q["image"])

    return _draw_per_note(questions, len(notes), lambda q: q["note"], sample, per_note, seed)


COUNT_QUESTION = "How many {what} are in this photo?"


def plural(name: str) -> str:
    """The plural of a category: the world vocabulary's, else ``name + "s"`` (COCO-style names)."""
    from mm.world import vocab

    try:
        return vocab.category(name).plural
    except KeyError:
        return name + "s"


def count_answer_samples(notes: Sequence[Any], *, per_note: int = 1, seed: int = 0) -> list[list[Sample]]:
    """Per note, ``per_note`` open count questions (:data:`COUNT_QUESTION`) about the categories of its
    images' objects, each answered with the count in digits ("2"). Each draw takes a count value first,
    uniformly among those the note's questions have, then a question with it, so answers are not mostly
    "1" (most categories appear once), which a model could learn without counting."""
    questions = []
    for i, note in enumerate(notes):
        for k, objects in enumerate(note.objects or []):
            counts: dict[str, int] = {}
            for o in objects:
                counts[o.category] = counts.get(o.category, 0) + 1
            for name, n in sorted(counts.items()):
                questions.append({"note": i, "image": k, "object": name, "count": n})

    def sample(q: dict) -> Sample:
        prompt = COUNT_QUESTION.format(what=plural(q["object"]))
        return Sample(q["note"], "count_answer", prompt, str(q["count"]), image=q["image"])

    by_note: list[dict[int, list[dict]]] = [{} for _ in notes]
    for q in questions:
        by_note[q["note"]].setdefault(q["count"], []).append(q)
    rng = random.Random(seed)
    out = []
    for buckets in by_note:
        picked = []
        while len(picked) < per_note and buckets:
            n = rng.choice(sorted(buckets))
            picked.append(sample(buckets[n].pop(rng.randrange(len(buckets[n])))))
            if not buckets[n]:
                del buckets[n]
        out.append(picked)
    return out


def conversation_samples(index: int, note: Any) -> list[Sample]:
    """Single-turn samples from a LLaVA conversation: each human turn answered by the next gpt turn."""
    turns = note.conversations or []
    out = []
    for a, b in zip(turns, turns[1:]):
        if a["from"] == "human" and b["from"] == "gpt":
            prompt = " ".join(a["value"].replace("<image>", " ").split())
            answer = b["value"].strip()
            if prompt and answer:
                out.append(Sample(note=index, kind="conversation", prompt=prompt, answer=answer))
    return out


def build_samples(
    notes: Sequence[Any],
    *,
    kinds: Sequence[str] = ("caption", "question"),
    caption_prompt: str = CAPTION_PROMPT,
    questions_per_note: int | None = None,
    image_caption_prompt: str = IMAGE_CAPTION_PROMPT,
    answer_style: str = "word",
    pope_questions_per_note: int = 1,
    attribute_questions_per_note: int = 1,
    colour_answers_per_note: int = 1,
    count_answers_per_note: int = 1,
    seed: int = 0,
) -> list[Sample]:
    """Every sample of ``kinds`` from ``notes``, note by note (caption, image captions, questions, POPE-style
    and colour questions, colour and count answers, chat); yes/no answers in ``answer_style``
    (:func:`yes_no_answer`)."""
    unknown = [k for k in kinds if k not in TASK_KINDS]
    if unknown:
        raise ValueError(f"unknown task kind(s) {unknown}; known kinds: {', '.join(TASK_KINDS)}")
    pope = (
        pope_question_samples(notes, per_note=pope_questions_per_note, seed=seed, answer_style=answer_style)
        if "pope_question" in kinds
        else None
    )
    colour = (
        attribute_question_samples(
            notes, per_note=attribute_questions_per_note, seed=seed, answer_style=answer_style
        )
        if "attribute_question" in kinds
        else None
    )
    answers = (
        colour_answer_samples(notes, per_note=colour_answers_per_note, seed=seed)
        if "colour_answer" in kinds
        else None
    )
    counts = (
        count_answer_samples(notes, per_note=count_answers_per_note, seed=seed)
        if "count_answer" in kinds
        else None
    )
    out: list[Sample] = []
    for i, note in enumerate(notes):
        if "caption" in kinds:
            out.extend(caption_samples(i, note, prompt=caption_prompt))
        if "image_caption" in kinds:
            out.extend(image_caption_samples(i, note, prompt=image_caption_prompt))
        if "question" in kinds:
            out.extend(question_samples(i, note, limit=questions_per_note, answer_style=answer_style))
        if pope is not None:
            out.extend(pope[i])
        if colour is not None:
            out.extend(colour[i])
        if answers is not None:
            out.extend(answers[i])
        if counts is not None:
            out.extend(counts[i])
        if "conversation" in kinds:
            out.extend(conversation_samples(i, note))
    return out


def count_kinds(samples: Sequence[Sample]) -> dict[str, int]:
    """How many samples of each kind (all of :data:`TASK_KINDS`, zeros included)."""
    counts = dict.fromkeys(TASK_KINDS, 0)
    for s in samples:
        counts[s.kind] += 1
    return counts

"""Captions and yes/no questions from annotated scenes (templated, varied; pure functions).

Captions mention every object of the image (so a captioner's recall can reach 1): objects of a
category are grouped ("two forks"), named by the canonical name or, with ``synonym_prob``, a
synonym; colour is given when it is shared by the group, size and position sometimes. The note
caption introduces the theme and walks through the images ("In the second photo, ...").

Questions are balanced yes/no: "yes" about a present object (in the note or in image k), "no"
about an absent one, drawn with ``partner_negatives`` from absent co-occurrence partners of present
objects (the adversarial negatives of POPE) and otherwise at random.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mm.data.format import ObjectAnnotation, Question
from mm.world import vocab

NUMBERS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight")
ORDINALS = ("first", "second", "third", "fourth")
THEME_PLACE = {
    "kitchen": "a kitchen",
    "desk": "a desk",
    "bathroom": "a bathroom",
    "beach": "the beach",
    "park": "a park",
    "street": "the street",
}


def article(word: str) -> str:
    """``a`` or ``an`` for ``word``."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def surface(name: str, plural: bool, rng: np.random.Generator, synonym_prob: float) -> str:
    """A surface form of category ``name`` (canonical or, with ``synonym_prob``, a synonym)."""
    c = vocab.category(name)
    if c.synonyms and rng.random() < synonym_prob:
        k = int(rng.integers(len(c.synonyms)))
        return c.synonym_plurals[k] if plural else c.synonyms[k]
    return c.plural if plural else c.name


def position_phrase(bbox: tuple[float, float, float, float], size: int) -> str:
    """Where a box sits in a 3x3 grid: "on the left", "at the top right", "in the middle"."""
    cx, cy = (bbox[0] + bbox[2]) / 2 / size, (bbox[1] + bbox[3]) / 2 / size
    col = "left" if cx < 1 / 3 else "right" if cx > 2 / 3 else ""
    row = "top" if cy < 1 / 3 else "bottom" if cy > 2 / 3 else ""
    if row and col:
        return f"at the {row} {col}"
    if row:
        return f"at the {row}"
    if col:
        return f"on the {col}"
    return "in the middle"


def join_phrases(parts: list[str]) -> str:
    """``["a", "b", "c"]`` -> "a, b and c"."""
    if len(parts) == 1:
        return parts[0]
    return ", ".join(parts[:-1]) + " and " + parts[-1]


_ANCHOR_OF = {p: a for a, p in vocab.PARTNER_PAIRS}


def caption_order(names: list[str]) -> list[str]:
    """Category names in mention order: the given order, but a partner right after its anchor.

    Captions then say "a fork and a knife" the way real captions pair co-occurring objects, which
    is exactly the bigram a captioner's language prior picks up.
    """
    present = set(names)
    anchor_of = _ANCHOR_OF
    follows = {n for n in names if anchor_of.get(n) in present}
    out: list[str] = []
    for n in names:
        if n in follows:
            continue
        out.append(n)
        out.extend(p for p in vocab.partners(n) if p in follows and anchor_of[p] == n)
    return out


CATEGORY_INDEX = {c.name: i for i, c in enumerate(vocab.CATEGORIES)}
"""Mention order of categories: the vocabulary's order, in which every partner follows its anchor."""


def mention_order(objects: list[ObjectAnnotation]) -> list[ObjectAnnotation]:
    """``objects`` sorted by category in :data:`CATEGORY_INDEX` order (ties keep their drawing order).

    A caption then lists an image's objects like a checklist: the next mention is the next present
    category, which a small captioner learns from the image far faster than a drawing or spatial order
    (it need not track where it has looked), and "a fork and a knife" stays the bigram a language prior
    picks up.
    """
    return sorted(objects, key=lambda o: CATEGORY_INDEX[o.category])


@dataclass(frozen=True)
class ColourStyle:
    """How captions give colours: ``after`` the noun in brackets ("two forks (red)", like a mixed group's
    list) or before it ("two red forks"), the random draws the same either way; with ``prob`` < 1 each
    group's colours are stated with that probability, drawn from ``rng`` (not the caption's own stream, so
    every other word is the same)."""

    after: bool = False
    prob: float = 1.0
    rng: np.random.Generator | None = None

    def __post_init__(self) -> None:
        if self.prob < 1.0 and self.rng is None:
            raise ValueError("a colour prob < 1 needs rng, the stream its draws come from")

    def stated(self) -> bool:
        """Whether the next group's colours are stated (one draw from ``rng`` when ``prob`` < 1)."""
        return self.prob >= 1.0 or bool(self.rng.random() < self.prob)


PLAIN = ColourStyle()
"""Every colour stated, before the noun."""


def object_phrases(
    objects: list[ObjectAnnotation],
    *,
    size: int,
    rng: np.random.Generator,
    synonym_prob: float,
    colour: ColourStyle = PLAIN,
) -> list[str]:
    """One noun phrase per category group ("two red forks"), groups in :func:`mention_order`, colours
    given as ``colour`` says (:class:`ColourStyle`)."""
    groups: dict[str, list[ObjectAnnotation]] = {}
    for o in mention_order(objects):
        groups.setdefault(o.category, []).append(o)
    phrases = []
    for name in caption_order(list(groups)):
        objs = groups[name]
        n = len(objs)
        colors = {o.color for o in objs} if colour.stated() else set()
        color = objs[0].color if len(colors) == 1 else None
        noun = surface(name, n > 1, rng, synonym_prob)
        words = []
        if n == 1 and objs[0].size and rng.random() < 0.3:
            words.append(objs[0].size)
        if color and not colour.after:
            words.append(color)
        words.append(noun)
        head = " ".join(words)
        listed = sorted(c for c in colors if c) if not color or colour.after else []
        bracket = " (" + join_phrases(listed) + ")" if listed else ""
        if n == 1:
            phrase = f"{article(head)} {head}{bracket}"
            if rng.random() < 0.3:
                phrase += " " + position_phrase(objs[0].bbox, size)
        else:
            phrase = f"{NUMBERS[n]} {head}{bracket}"
        phrases.append(phrase)
    return phrases


_IMAGE_TEMPLATES = ("{X}.", "There is {x}.", "This photo shows {x}.", "I can see {x}.", "Here: {x}.")


def image_caption(
    objects: list[ObjectAnnotation],
    *,
    size: int,
    rng: np.random.Generator,
    synonym_prob: float,
    colour: ColourStyle = PLAIN,
) -> str:
    """A one-sentence caption naming every object of one image (``colour``: :class:`ColourStyle`)."""
    if not objects:
        return "Nothing in particular."
    kw = {"size": size, "rng": rng, "synonym_prob": synonym_prob, "colour": colour}
    phrases = object_phrases(objects, **kw)
    body = join_phrases(phrases)
    t = _IMAGE_TEMPLATES[int(rng.integers(len(_IMAGE_TEMPLATES)))]
    if t == "There is {x}." and not phrases[0].startswith(("a ", "an ")):
        t = "There are {x}."
    return t.format(x=body, X=body[:1].upper() + body[1:])


def note_caption(
    theme: str,
    objects: list[list[ObjectAnnotation]],
    *,
    size: int,
    rng: np.random.Generator,
    synonym_prob: float,
    colour: ColourStyle = PLAIN,
) -> str:
    """The note's text: a theme introduction, then every image's objects in order (``colour``:
    :class:`ColourStyle`)."""
    n = len(objects)
    kw = {"size": size, "rng": rng, "synonym_prob": synonym_prob, "colour": colour}
    place = THEME_PLACE[theme]
    if n == 1:
        intro = f"A photo from {place}."
        body = join_phrases(object_phrases(objects[0], **kw))
        return f"{intro} It shows {body}."
    intro = f"{NUMBERS[n].capitalize()} photos from {place}."
    parts = [intro]
    for k, objs in enumerate(objects):
        body = join_phrases(object_phrases(objs, **kw)) if objs else "nothing"
        parts.append(f"In the {ORDINALS[k]} photo, {body}.")
    return " ".join(parts)


def _yes_no(
    note_id: str,
    qi: int,
    name: str,
    image: int | None,
    answer: str,
    rng: np.random.Generator,
    synonym_prob: float,
) -> Question:
    noun = surface(name, False, rng, synonym_prob)
    a = article(noun)
    if image is None:
        templates = (f"Is there {a} {noun} in this note?", f"Do any of the photos show {a} {noun}?")
    else:
        templates = (f"Is there {a} {noun} in image {image + 1}?", f"Does image {image + 1} show {a} {noun}?")
    q = templates[int(rng.integers(len(templates)))]
    return Question(question_id=f"{note_id}_q{qi}", question=q, answer=answer, image=image, object=name)


def questions(
    note_id: str,
    objects: list[list[ObjectAnnotation]],
    *,
    count: int,
    partner_negatives: float,
    rng: np.random.Generator,
    synonym_prob: float,
) -> list[Question]:
    """``count`` balanced yes/no questions (yes first half, then no; order shuffled)."""
    n_img = len(objects)
    present_img = [{o.category for o in objs} for objs in objects]
    present_note = set().union(*present_img)
    specs: list[tuple[str, int | None, str]] = []
    asked: set[tuple[str, int | None]] = set()
    for i in range(count):
        for _ in range(8):  # a few tries to avoid asking the same (object, image) twice
            image = None if n_img == 1 or rng.random() < 0.4 else int(rng.integers(n_img))
            present = present_note if image is None else present_img[image]
            if i % 2 == 0 and present:
                pool = sorted(present)
                name, answer = pool[int(rng.integers(len(pool)))], "yes"
            else:
                absent = [c for c in vocab.CATEGORY_NAMES if c not in present]
                partner_pool = sorted({p for c in present for p in vocab.partners(c)} - present)
                if partner_pool and rng.random() < partner_negatives:
                    name = partner_pool[int(rng.integers(len(partner_pool)))]
                else:
                    name = absent[int(rng.integers(len(absent)))]
                answer = "no"
            if (name, image) not in asked:
                break
        asked.add((name, image))
        specs.append((name, image, answer))
    order = rng.permutation(len(specs))
    return [_yes_no(note_id, qi, *specs[j], rng, synonym_prob) for qi, j in enumerate(order)]

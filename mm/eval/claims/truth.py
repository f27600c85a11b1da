"""Ground truth for claims: per image, each object's count and colours.

The note format already stores what claims need (:mod:`mm.data.format`): every object of an image is
one :class:`~mm.data.format.ObjectAnnotation` with its ``color`` (None when unknown, as in COCO), and
duplicates are separate annotations, so a count is the number of annotations of a category. This
module exposes that as :class:`ObjectTruth` per category per image (:func:`note_truth`), and reads the
same from a plain objects JSON (:func:`read_truth`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm.data.format import NOTES_FILE, read_notes
from mm.data.jsonio import normalize_id, read_json
from mm.errors import UserError
from mm.eval.chair import Vocabulary


@dataclass(frozen=True, kw_only=True)
class ObjectTruth:
    """What is true of one category in one image (or in a whole note)."""

    count: int
    """Number of objects of the category."""
    colors: frozenset[str] = field(default_factory=frozenset)
    """Colours of those objects (empty when unknown)."""
    colors_known: bool = False
    """True when every object of the category has a known colour (only then is a colour claim judged)."""


ImageTruth = dict[str, ObjectTruth]
"""Canonical category -> its truth in one image."""


@dataclass(frozen=True, kw_only=True)
class NoteTruth:
    """Per-image truth of one note (or of one captioned image: a one-image note)."""

    images: tuple[ImageTruth, ...]
    """One mapping per image."""

    def scope(self, image: int | None) -> ImageTruth:
        """Truth of image ``image`` or, for None or an index past the last image, of the whole note."""
        if image is not None and 0 <= image < len(self.images):
            return self.images[image]
        if len(self.images) == 1:
            return self.images[0]
        return merge(self.images)


def merge(images: Iterable[ImageTruth]) -> ImageTruth:
    """The note-level truth: counts summed, colours united, known only if known in every image."""
    out: dict[str, ObjectTruth] = {}
    for im in images:
        for c, t in im.items():
            if c in out:
                o = out[c]
                out[c] = ObjectTruth(
                    count=o.count + t.count,
                    colors=o.colors | t.colors,
                    colors_known=o.colors_known and t.colors_known,
                )
            else:
                out[c] = t
    return out


def image_truth(
    objects: Sequence[tuple[str, str | None]], vocab: Vocabulary, unknown: set[str]
) -> ImageTruth:
    """Truth of one image from ``(name, colour or None)`` pairs; names outside ``vocab`` go to ``unknown``."""
    counts: dict[str, int] = {}
    colors: dict[str, set[str]] = {}
    known: dict[str, bool] = {}
    for name, color in objects:
        c = vocab.canonicalize(name)
        if c is None:
            unknown.add(name)
            continue
        counts[c] = counts.get(c, 0) + 1
        colors.setdefault(c, set())
        if color:
            colors[c].add(color.lower())
        known[c] = known.get(c, True) and bool(color)
    return {
        c: ObjectTruth(count=n, colors=frozenset(colors[c]), colors_known=known[c]) for c, n in counts.items()
    }


def note_truth(note: Any, vocab: Vocabulary, unknown: set[str] | None = None) -> NoteTruth:
    """Truth of a :class:`mm.data.format.Note` (its ``objects``, one list per image)."""
    sink = set() if unknown is None else unknown
    return NoteTruth(
        images=tuple(image_truth([(o.category, o.color) for o in objs], vocab, sink) for objs in note.objects)
    )


def _item(where: str, key: str, item: Any) -> tuple[str, str | None]:
    if isinstance(item, str):
        return item, None
    if isinstance(item, dict) and isinstance(item.get("category"), str):
        color = item.get("color")
        if color is not None and not isinstance(color, str):
            raise UserError(f"{where}: {key!r}: 'color' must be a string or null, got {color!r}")
        return item["category"], color
    raise UserError(
        f"{where}: {key!r}: an object must be a name or {{'category': name, 'color': ...}}, got {item!r}"
    )


def read_truth(path: str | Path, vocab: Vocabulary, warn: list[str]) -> dict[str, NoteTruth]:
    """``{id: NoteTruth}`` from a note folder (every note, all images) or an objects JSON.

    The objects JSON is ``{image_id: [name | {"category": name, "color": c | null}, ...]}`` (one
    image per id; a duplicate object is listed twice). Names outside the vocabulary are ignored with
    one warning.
    """
    p = Path(path)
    unknown: set[str] = set()
    if p.is_dir():
        if not (p / NOTES_FILE).is_file():
            raise UserError(f"{p}: a folder must hold {NOTES_FILE} (a note folder); or pass an objects JSON")
        out = {n.id: note_truth(n, vocab, unknown) for n in read_notes(p)}
    else:
        data, lines = read_json(p)
        if not isinstance(data, dict):
            raise UserError(
                f"{p}:{lines.start()}: expected {{image_id: [objects]}}, got {type(data).__name__}"
            )
        out = {}
        for i, (key, objs) in enumerate(data.items()):
            where = f"{p}:{lines.item(i)}"
            if not isinstance(objs, list):
                raise UserError(f"{where}: {key!r}: expected a list of objects, got {type(objs).__name__}")
            image = image_truth([_item(where, key, o) for o in objs], vocab, unknown)
            out[normalize_id(key, where, "image_id")] = NoteTruth(images=(image,))
    if unknown:
        warn.append(
            f"{len(unknown)} ground-truth object name(s) are not in the {vocab.name} vocabulary and are "
            f"ignored: {sorted(unknown)[:10]}"
        )
    return out


def read_image_truth(path: str | Path, vocab: Vocabulary, warn: list[str]) -> dict[str, ImageTruth]:
    """``{image: ImageTruth}``: a note folder's images keyed by their paths (as a POPE question's
    ``image``), or an objects JSON's ids (one image each)."""
    p = Path(path)
    if p.is_dir() and (p / NOTES_FILE).is_file():
        unknown: set[str] = set()
        out = {
            image: im
            for note in read_notes(p)
            for image, im in zip(note.images, note_truth(note, vocab, unknown).images)
        }
        if unknown:
            warn.append(
                f"{len(unknown)} object name(s) not in the {vocab.name} vocabulary: {sorted(unknown)[:10]}"
            )
        return out
    return {i: t.images[0] for i, t in read_truth(p, vocab, warn).items()}

"""The note format: one folder, one ``notes.jsonl``, PNG images referenced relative to the folder.

Synthetic notes (``mm data world``) and converted real data (``mm data coco``, ``mm data llava``)
are written in this format, so everything downstream takes the same path.

Layout::

    DIR/notes.jsonl            one JSON object per line (one note)
    DIR/images/<id>_<k>.png    image files (any relative path is allowed)

One line (keys in this order; ``conversations`` is optional)::

    {"id": "w000123", "split": "train" | "val" | "test", "source": "world" | "coco" | "llava" | ...,
     "images": ["images/w000123_0.png", ...],                  # 1+ paths relative to DIR
     "text": "<note caption / body text>",
     "image_captions": ["...", ...],                           # one per image, "" when unknown
     "objects": [[{"category": "fork", "color": "red", "size": "small",
                   "bbox": [x0, y0, x1, y1], "occluded": 0.3}, ...], ...],   # one list per image
     "questions": [{"question_id": "w000123_q0", "question": "Is there a fork in image 2?",
                    "answer": "yes", "image": 1, "object": "fork"}, ...],
     "conversations": [{"from": "human", "value": "..."}, {"from": "gpt", "value": "..."}]}

Field rules:

- ``objects[k]`` is ``[]`` when image k's objects are unknown. ``category`` is a canonical name
  (world: :data:`mm.world.vocab.CATEGORY_NAMES`; COCO: the COCO category name). ``color`` and
  ``size`` may be ``null`` (COCO has none). ``bbox`` is in pixels, ``x1``/``y1`` exclusive.
  ``occluded`` is the hidden fraction of the object's area in [0, 1] (0 when unknown).
- ``questions[i].image`` is the 0-based image index the question is about, or ``null`` for a
  question about the whole note; ``answer`` is ``"yes"`` or ``"no"``; ``object`` names the
  category asked about (or ``null``).
- ``conversations`` alternate ``human`` / ``gpt`` turns; a ``<image>`` marker in the first human
  turn is kept verbatim (LLaVA convention).

:func:`read_notes` reports a bad line as ``file:line: what is wrong``; :func:`write_notes` writes
``notes.jsonl`` atomically (temp file + rename).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mm.errors import UserError

NOTES_FILE = "notes.jsonl"
"""Name of the JSONL file inside a note folder."""

SPLITS: tuple[str, ...] = ("train", "val", "test")
"""Allowed values of ``Note.split``."""


_NOTE_KEYS = (
    "id",
    "split",
    "source",
    "images",
    "text",
    "image_captions",
    "objects",
    "questions",
    "conversations",
)


_NOTE_KEY_SET = frozenset(_NOTE_KEYS)
_OBJECT_KEYS = frozenset({"category", "bbox", "color", "size", "occluded"})
_QUESTION_KEYS = frozenset({"question_id", "question", "answer", "image", "object"})
_NUM = (int, float)  # exact types: bool is not a number here


class FormatError(UserError):
    """A record does not follow the note format; the message names the file and line."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@dataclass
class ObjectAnnotation:
    """One object in one image."""

    category: str
    """Canonical category name."""
    bbox: tuple[float, float, float, float]
    """``(x0, y0, x1, y1)`` in pixels, ``x1``/``y1`` exclusive."""
    color: str | None = None
    """Colour name, or None when unknown."""
    size: str | None = None
    """Size name (``small``/``medium``/``large``), or None when unknown."""
    occluded: float = 0.0
    """Hidden fraction of the object's area, in [0, 1]."""

    @classmethod
    def from_json(cls, d: Any) -> ObjectAnnotation:
        # messages are built only on failure: this runs for every object of every note
        if not isinstance(d, dict):
            raise ValueError(f"object must be a mapping, got {type(d).__name__}")
        if not isinstance(d.get("category"), str):
            raise ValueError(f"object needs a string 'category', got {d!r}")
        bbox = d.get("bbox")
        if not (isinstance(bbox, list | tuple) and len(bbox) == 4 and all(type(v) in _NUM for v in bbox)):
            raise ValueError(f"object bbox must be 4 numbers [x0, y0, x1, y1], got {bbox!r}")
        occ = d.get("occluded", 0.0)
        if not (type(occ) in _NUM and 0.0 <= occ <= 1.0):
            raise ValueError(f"'occluded' must be in [0, 1], got {occ!r}")
        if not d.keys() <= _OBJECT_KEYS:
            raise ValueError(f"object has unknown key(s) {sorted(set(d) - _OBJECT_KEYS)}")
        return cls(
            category=d["category"],
            bbox=tuple(bbox),  # type: ignore[arg-type]
            color=d.get("color"),
            size=d.get("size"),
            occluded=float(occ),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "category": self.category,
            "color": self.color,
            "size": self.size,
            "bbox": list(self.bbox),
            "occluded": self.occluded,
        }


@dataclass
class Question:
    """A yes/no question about the note or one of its images."""

    question_id: str
    """Unique id (``<note id>_q<i>`` for the world)."""
    question: str
    """The question text."""
    answer: str
    """``"yes"`` or ``"no"``."""
    image: int | None = None
    """0-based image index the question is about; None for the whole note."""
    object: str | None = None
    """Category asked about, or None."""

    @classmethod
    def from_json(cls, d: Any) -> Question:
        if not isinstance(d, dict):
            raise ValueError(f"question must be a mapping, got {type(d).__name__}")
        for k in ("question_id", "question", "answer"):
            if not isinstance(d.get(k), str):
                raise ValueError(f"question needs a string {k!r}, got {d.get(k)!r}")
        if d["answer"] not in ("yes", "no"):
            raise ValueError(f"question answer must be 'yes' or 'no', got {d['answer']!r}")
        img = d.get("image")
        if not (img is None or (type(img) is int and img >= 0)):
            raise ValueError(f"question image must be >= 0 or null, got {img!r}")
        if not d.keys() <= _QUESTION_KEYS:
            raise ValueError(f"question has unknown key(s) {sorted(set(d) - _QUESTION_KEYS)}")
        return cls(d["question_id"], d["question"], d["answer"], img, d.get("object"))

    def to_json(self) -> dict[str, Any]:
        return {
            "question_id": self.question_id,
            "question": self.question,
            "answer": self.answer,
            "image": self.image,
            "object": self.object,
        }


@dataclass
class Note:
    """One note: 1+ images, text, optional per-image captions, objects, questions, conversation."""

    id: str
    """Unique note id."""
    images: list[str]
    """Image paths relative to the note folder."""
    text: str = ""
    """Note caption or body text."""
    split: str = "train"
    """``train``, ``val`` or ``test``."""
    source: str = "world"
    """Where the note came from (``world``, ``coco``, ``llava``, ...)."""
    image_captions: list[str] = field(default_factory=list)
    """One caption per image (``""`` when unknown); filled with ``""`` when empty."""
    objects: list[list[ObjectAnnotation]] = field(default_factory=list)
    """One object list per image (``[]`` when unknown); filled with ``[]`` when empty."""
    questions: list[Question] = field(default_factory=list)
    """Yes/no questions."""
    conversations: list[dict[str, str]] | None = None
    """Optional chat turns ``{"from": "human"|"gpt", "value": ...}``."""

    def __post_init__(self) -> None:
        n = len(self.images)
        if not self.image_captions:
            self.image_captions = [""] * n
        if not self.objects:
            self.objects = [[] for _ in range(n)]
        if n == 0:
            raise ValueError(f"note {self.id!r}: needs at least one image, got 0")
        if self.split not in SPLITS:
            raise ValueError(f"note {self.id!r}: split must be one of {SPLITS}, got {self.split!r}")
        if len(self.image_captions) != n:
            raise ValueError(f"note {self.id!r}: {n} images but {len(self.image_captions)} image_captions")
        if len(self.objects) != n:
            raise ValueError(f"note {self.id!r}: {n} images but {len(self.objects)} object lists")
        for q in self.questions:
            if q.image is not None and q.image >= n:
                raise ValueError(
                    f"note {self.id!r}: question {q.question_id} is about image {q.image}, note has {n}"
                )

    @property
    def categories(self) -> set[str]:
        """Categories present anywhere in the note."""
        return {o.category for objs in self.objects for o in objs}

    @classmethod
    def from_json(cls, d: Any) -> Note:
        """Parse one JSON record; ``ValueError`` saying which field is wrong."""
        if not isinstance(d, dict):
            raise ValueError(f"note must be a JSON object, got {type(d).__name__}")
        if not d.keys() <= _NOTE_KEY_SET:
            raise ValueError(f"note has unknown key(s) {sorted(set(d) - _NOTE_KEY_SET)}")
        if not (isinstance(d.get("id"), str) and d["id"] != ""):
            raise ValueError(f"note needs a non-empty string 'id', got {d.get('id')!r}")
        images = d.get("images")
        if not (isinstance(images, list) and all(isinstance(p, str) for p in images)):
            raise ValueError(f"note 'images' must be a list of paths, got {images!r}")
        objects = d.get("objects", [])
        if not (isinstance(objects, list) and all(isinstance(o, list) for o in objects)):
            raise ValueError("'objects' must be a list of lists")
        convs = d.get("conversations")
        if convs is not None and not (
            isinstance(convs, list)
            and all(
                isinstance(t, dict) and isinstance(t.get("from"), str) and isinstance(t.get("value"), str)
                for t in convs
            )
        ):
            raise ValueError("'conversations' must be a list of {'from': str, 'value': str}")
        text = d.get("text", "")
        if not isinstance(text, str):
            raise ValueError(f"'text' must be a string, got {type(text).__name__}")
        caps = d.get("image_captions", [])
        if not (isinstance(caps, list) and all(isinstance(c, str) for c in caps)):
            raise ValueError("'image_captions' must be a list of strings")
        qs = d.get("questions", [])
        if not isinstance(qs, list):
            raise ValueError("'questions' must be a list")
        return cls(
            id=d["id"],
            images=list(images),
            text=text,
            split=d.get("split", "train"),
            source=str(d.get("source", "world")),
            image_captions=list(caps),
            objects=[[ObjectAnnotation.from_json(o) for o in objs] for objs in objects],
            questions=[Question.from_json(q) for q in qs],
            conversations=[dict(t) for t in convs] if convs is not None else None,
        )

    def to_json(self) -> dict[str, Any]:
        """The record as JSON-ready data (keys in the documented order)."""
        d: dict[str, Any] = {
            "id": self.id,
            "split": self.split,
            "source": self.source,
            "images": list(self.images),
            "text": self.text,
            "image_captions": list(self.image_captions),
            "objects": [[o.to_json() for o in objs] for objs in self.objects],
            "questions": [q.to_json() for q in self.questions],
        }
        if self.conversations is not None:
            d["conversations"] = [dict(t) for t in self.conversations]
        return d


def read_notes(folder: str | Path, split: str | None = None) -> list[Note]:
    """Read ``folder/notes.jsonl``; only notes of ``split`` when given.

    Raises :class:`FormatError` naming ``file:line`` for the first bad record, and for duplicate ids.
    """
    path = Path(folder) / NOTES_FILE
    if not path.is_file():
        raise FormatError(f"{path} does not exist; expected a note folder written by `mm data ...`")
    if split is not None and split not in SPLITS:
        raise FormatError(f"split must be one of {SPLITS} or None, got {split!r}")
    notes: list[Note] = []
    seen: dict[str, int] = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                note = Note.from_json(json.loads(line))
            except (json.JSONDecodeError, ValueError, TypeError) as e:
                raise FormatError(f"{path}:{lineno}: {e}") from e
            if note.id in seen:
                raise FormatError(
                    f"{path}:{lineno}: duplicate note id {note.id!r} (first on line {seen[note.id]})"
                )
            seen[note.id] = lineno
            if split is None or note.split == split:
                notes.append(note)
    return notes


def note_line(note: Note) -> str:
    """The ``notes.jsonl`` line of ``note`` (no newline)."""
    return json.dumps(note.to_json(), ensure_ascii=False)


def write_notes(notes: list[Note], folder: str | Path, *, lines: list[str] | None = None) -> Path:
    """Write ``folder/notes.jsonl`` atomically (temp file in the folder, then rename); returns its path.

    ``lines``: ``[note_line(n) for n in notes]`` when the caller already has them (e.g. serialised
    in worker processes); must be one per note, in the same order.
    """
    folder = Path(folder)
    if lines is not None and len(lines) != len(notes):
        raise ValueError(f"lines must be one per note: got {len(lines)} lines for {len(notes)} notes")
    folder.mkdir(parents=True, exist_ok=True)
    ids = [n.id for n in notes]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise FormatError(f"duplicate note ids {dup}; every note needs a unique id")
    if lines is None:
        lines = [note_line(n) for n in notes]
    path = folder / NOTES_FILE
    fd, tmp = tempfile.mkstemp(prefix=".notes-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual file mode
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


@contextlib.contextmanager
def staged_folder(out: str | Path, *, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary sibling of ``out`` to fill; on success it is renamed to ``out``.

    ``out`` must be missing or empty unless ``overwrite``. On any error the temporary folder is
    removed and ``out`` is left as it was, so readers never see a half-written note folder.
    """
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise UserError(
            f"output folder {out} exists and is not empty; pass --overwrite or choose a new folder"
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; give the usual folder mode
    try:
        yield tmp
        if out.exists():
            trash = Path(tempfile.mkdtemp(prefix=f".{out.name}-old-", dir=out.parent))
            os.replace(out, trash / "old")
            os.replace(tmp, out)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

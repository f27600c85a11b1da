"""Notes without their ground truth, for post-training that must not read it.

The no-ground-truth pipeline (``configs/rl/pipeline_nogt.yaml``) post-trains with rewards that need no
annotation: on-policy DPO pairs ranked by a labeler VLM (``data.scorer: labeler``) and GRPO rewards from
the labeler or a reward model (``reward.source: labeler | rm:DIR``). Those trainers get each note
through :func:`strip_ground_truth`: a read-only view that keeps what a real, unannotated note has (its id,
images, split and source) and raises :class:`GroundTruthError` on any read of what only an annotator
could know: the object lists (categories, colours, duplicates = counts), the note text and per-image
captions (they name the objects and their colours), the yes/no questions and their answers, and
conversations. A reward or pair builder that reads one of them fails on its first call instead of
quietly using the truth.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mm.errors import UserError

KEPT = ("id", "images", "split", "source")
"""What a stripped note still has: what an unannotated note has."""

GROUND_TRUTH = ("objects", "categories", "text", "image_captions", "questions", "conversations")
"""Note attributes that are ground truth (object categories, colours and counts live in ``objects``;
``categories`` is derived from it; the texts name the objects)."""


class GroundTruthError(UserError):
    """A stage of the no-ground-truth pipeline read a note's ground truth."""


class StrippedNote:
    """A read-only view of a :class:`mm.data.format.Note` without its ground truth (see the module
    docstring). ``note.id``, ``note.images``, ``note.split`` and ``note.source`` read through; any of
    :data:`GROUND_TRUTH` raises :class:`GroundTruthError`."""

    __slots__ = ("_note",)

    def __init__(self, note: Any) -> None:
        object.__setattr__(self, "_note", note)

    def __getattr__(self, name: str) -> Any:
        note = object.__getattribute__(self, "_note")
        if name in KEPT:
            return getattr(note, name)
        if name in GROUND_TRUTH:
            raise GroundTruthError(
                f"note {note.id}: .{name} is ground truth; the no-ground-truth pipeline must not read it "
                "(rewards and pairs there come from a labeler or a reward model: data.scorer=labeler, "
                "reward.source=labeler or rm:DIR). Use the note's images only, or run the ground-truth "
                "pipeline (configs/rl/pipeline.yaml)"
            )
        raise AttributeError(
            f"a note without ground truth has only {', '.join(KEPT)}; {name!r} is not one of them"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"a note without ground truth is read-only (tried to set {name!r})")

    def __repr__(self) -> str:
        return f"StrippedNote(id={self.id!r}, images={len(self.images)})"


def strip_ground_truth(note: Any) -> StrippedNote:
    """``note`` without its ground truth (idempotent)."""
    return note if isinstance(note, StrippedNote) else StrippedNote(note)


def strip_all(notes: Iterable[Any]) -> list[StrippedNote]:
    """Every note of ``notes`` without its ground truth."""
    return [strip_ground_truth(n) for n in notes]


def is_stripped(note: Any) -> bool:
    """Whether ``note`` is a view without ground truth."""
    return isinstance(note, StrippedNote)

"""The prompts of ``rl grpo``: captions and yes/no object questions over notes held in memory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mm.data.format import read_notes
from mm.errors import UserError
from mm.eval.claims import NoteTruth, note_truth
from mm.train.sft_data import load_note_images
from mm.train.tasks import pope_question_samples
from rl.ground_truth import strip_all
from rl.rewards import resolve_vocab, vocabulary
from rl.trainers.common import note_pixels
from rl.trainers.grpo_config import DataConfig


@dataclass(frozen=True)
class Prompt:
    """One prompt: which note, the text after the images, and the yes/no label (None for a caption)."""

    note: int
    """Index into the prompt set's notes."""
    text: str
    """User prompt after the images."""
    label: str | None
    """``yes``/``no`` for an object question; None for a caption."""
    image: int | None = None
    """The one image of the note the prompt shows (pope_question); None = all of them."""


class PromptSet:
    """Prompts over notes held in memory (uint8 images), encoded once per (images, prompt)."""

    def __init__(self, *, processor: Any, notes: list[Any], root: str | Path, cfg: DataConfig) -> None:
        self.processor = processor
        self.notes = notes
        self._objects: list[list[str]] | None = None
        self._truths: dict[str, list[NoteTruth]] = {}
        self.prompts: list[Prompt] = []
        pope = None
        if "pope_question" in cfg.tasks:
            pope = pope_question_samples(notes, per_note=cfg.questions_per_note)
        for i, n in enumerate(notes):
            if "caption" in cfg.tasks:
                self.prompts.append(Prompt(i, cfg.caption_prompt, None))
            if "question" in cfg.tasks:
                qs = n.questions[: cfg.questions_per_note]
                self.prompts.extend(Prompt(i, q.question, q.answer) for q in qs)
            if pope is not None:  # answers in the word style: the label
                self.prompts.extend(Prompt(i, s.prompt, s.answer, image=s.image) for s in pope[i])
        if not self.prompts:
            raise UserError(
                f"no prompts: the notes give no {cfg.tasks} prompts; check data.tasks and the notes"
            )
        self.images = load_note_images(
            notes, root, processor.image_size, resize=processor.resize, fill=processor.image_mean
        )

    @property
    def objects(self) -> list[list[str]]:
        """Each note's ground-truth objects (sorted categories), read on first use: the scene reward's; a
        note without ground truth (:mod:`rl.ground_truth`) raises."""
        if self._objects is None:
            self._objects = [sorted(n.categories) for n in self.notes]
        return self._objects

    def truths(self, vocab: str) -> list[NoteTruth]:
        """Each note's per-image colour truth (:func:`mm.eval.claims.note_truth` in the reward vocabulary
        ``vocab``), built on first use: the colour term of the scene reward."""
        if vocab not in self._truths:
            v = vocabulary(vocab)
            self._truths[vocab] = [note_truth(n, v) for n in self.notes]
        return self._truths[vocab]

    def __len__(self) -> int:
        return len(self.prompts)

    def _images(self, prompt: Prompt) -> torch.Tensor:
        """uint8 images the prompt shows (n, 3, S, S): the note's, or its one image."""
        imgs = self.images[prompt.note]
        return imgs if prompt.image is None else imgs[prompt.image : prompt.image + 1]

    def batch(self, indices: list[int]) -> dict[str, torch.Tensor]:
        """Left-padded prompt batch (input_ids, attention_mask, pixel_values, image_mask)."""
        p = self.processor
        items = [
            p.encode_pixels(note_pixels(self._images(self.prompts[i]), p), self.prompts[i].text)
            for i in indices
        ]
        return p.collate(items, padding_side="left")


def load_prompt_notes(folder: Path, cfg: DataConfig, *, source: str, vocab: str) -> tuple[list[Any], str]:
    """The notes of the prompts and the reward vocabulary (``reward.source``, ``reward.vocab``).

    The scene reward takes the notes with objects (the other sources every note); ``vocab`` is resolved
    against the notes' objects (:func:`rl.rewards.resolve_vocab`). With ``data.ground_truth: false``
    every note comes stripped of its ground truth (:func:`rl.ground_truth.strip_ground_truth`), so a reward
    or prompt kind that reads it raises, and ``vocab`` must be named (``auto`` would pick it from the
    objects)."""
    scene = source == "scene"
    notes = read_notes(folder, split=cfg.split)
    if not cfg.ground_truth:
        notes = strip_all(notes)
    elif scene:
        notes = [n for n in notes if n.categories]
    notes = notes[: cfg.notes] if cfg.notes else notes
    if not notes:
        what = "notes with object annotations" if scene and cfg.ground_truth else "notes"
        raise UserError(f"data.folder={folder}: no {cfg.split!r} {what}")
    if "caption" not in cfg.tasks:
        return notes, vocab
    if cfg.ground_truth:  # the caption reward needs a vocabulary that names every object
        where = f"data.folder={folder} ({cfg.split})"
        return notes, resolve_vocab(vocab, [n.categories for n in notes], where=where)
    if vocab == "auto":
        raise UserError(
            "reward.vocab=auto picks the vocabulary from the notes' ground-truth objects, which "
            "data.ground_truth=false hides; name it: reward.vocab=world or coco"
        )
    return notes, resolve_vocab(vocab, [], where=str(folder))

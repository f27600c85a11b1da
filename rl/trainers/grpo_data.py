"""The prompts of ``rl grpo``: captions and yes/no object questions over notes held in memory."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mm.errors import UserError
from mm.train.sft_data import load_note_images
from mm.train.tasks import pope_question_samples
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
        self.objects = [sorted(n.categories) for n in notes]
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

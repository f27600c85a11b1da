"""In-memory NoteVLM training data: note images decoded once (uint8), samples tokenized once.

``SampleSet.batch(indices)`` returns exactly what ``NoteProcessor.collate`` returns for the same samples
(input_ids, attention_mask, labels (B, T); pixel_values (B, N, 3, S, S); image_mask (B, N)), built from
cached prompt / answer token ids so tens of thousands of samples tokenize in seconds. Samples longer
than ``processor.max_length`` go through ``NoteProcessor.encode`` itself, which truncates the answer or
rejects a sample whose images would be cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mm.errors import UserError
from mm.model.processing import IGNORE_INDEX, _fit_size
from mm.train.tasks import Sample


def load_note_images(
    notes: Sequence[Any],
    root: str | Path,
    size: int,
    *,
    resize: str = "stretch",
    fill: Sequence[float] = (0.5, 0.5, 0.5),
) -> list[torch.Tensor]:
    """Each note's images as one uint8 tensor (n_images, 3, size, size), RGB, fitted to the square as
    NoteProcessor's ``resize`` does ("pad" borders: ``fill`` [0, 1] colour, e.g. ``processor.image_mean``)."""
    import cv2

    out = []
    for note in notes:
        imgs = []
        for rel in note.images:
            path = Path(root) / rel
            arr = cv2.imread(str(path), cv2.IMREAD_COLOR)
            if arr is None:
                raise UserError(f"note {note.id}: cannot read image {path}; check the note folder")
            h, w = arr.shape[:2]
            if resize != "stretch" and h != w:
                fh, fw = _fit_size(h, w, size, resize)
                arr = _pad_or_crop_uint8(
                    cv2.resize(arr, (fw, fh), interpolation=cv2.INTER_AREA), size, fill[::-1]
                )  # BGR
            elif arr.shape[:2] != (size, size):
                arr = cv2.resize(arr, (size, size), interpolation=cv2.INTER_AREA)
            imgs.append(torch.from_numpy(np.ascontiguousarray(arr[:, :, ::-1])).permute(2, 0, 1))
        out.append(torch.stack(imgs))  # (n, 3, S, S) uint8
    return out


def _pad_or_crop_uint8(arr: np.ndarray, side: int, fill: Sequence[float]) -> np.ndarray:
    """(H, W, 3) uint8 -> (side, side, 3): centre crop of a longer side, centred letterbox of a shorter."""
    h, w = arr.shape[:2]
    top, left = max(0, (h - side) // 2), max(0, (w - side) // 2)
    arr = arr[top : top + side, left : left + side]
    h, w = arr.shape[:2]
    canvas = np.empty((side, side, 3), np.uint8)
    canvas[:] = np.round(np.asarray(fill) * 255.0).astype(np.uint8)
    top, left = (side - h) // 2, (side - w) // 2
    canvas[top : top + h, left : left + w] = arr
    return canvas


def to_unit(images: torch.Tensor) -> list[torch.Tensor]:
    """uint8 (n, 3, S, S) -> list of n float (3, S, S) tensors in [0, 1] (what the processor accepts)."""
    return list(images.float().div(255.0).unbind(0))


class SampleSet:
    """Tokenized samples over notes whose images are held as uint8 tensors."""

    def __init__(self, *, processor: Any, images: Sequence[torch.Tensor], samples: Sequence[Sample]) -> None:
        self.processor = processor
        self.images = list(images)
        self.samples = list(samples)
        if not self.samples:
            raise UserError("no training samples: the notes have no text / questions for the chosen tasks")
        self._prompt: dict[tuple[int, str], list[int]] = {}
        self._answer: dict[str, list[int]] = {}
        self.input_ids: list[torch.Tensor] = []
        self.labels: list[torch.Tensor] = []
        for s in self.samples:
            ids, labels = self._encode(s)
            self.input_ids.append(ids)
            self.labels.append(labels)
        mean = torch.tensor(processor.image_mean).view(1, 3, 1, 1)
        std = torch.tensor(processor.image_std).view(1, 3, 1, 1)
        self._mean, self._std = mean, std

    def __len__(self) -> int:
        return len(self.samples)

    def sample_images(self, s: Sample) -> torch.Tensor:
        """uint8 images a sample shows (n, 3, S, S): the note's, or its one image ``s.image``."""
        imgs = self.images[s.note]
        if s.image is None:
            return imgs
        if not 0 <= s.image < len(imgs):
            raise UserError(
                f"a sample of note {s.note} shows image {s.image}, but the note has {len(imgs)} images; "
                "build samples from the same notes as the images"
            )
        return imgs[s.image : s.image + 1]

    def _encode(self, s: Sample) -> tuple[torch.Tensor, torch.Tensor]:
        p = self.processor
        n = len(self.sample_images(s))
        key = (n, s.prompt)
        if key not in self._prompt:
            self._prompt[key] = p.prompt_ids(n, s.prompt)
        if s.answer not in self._answer:
            self._answer[s.answer] = p.tokenizer(s.answer, add_special_tokens=False)["input_ids"]
        prompt, answer = self._prompt[key], self._answer[s.answer]
        if len(prompt) + len(answer) + 1 > p.max_length:  # truncation rules live in the processor
            enc = p.encode(to_unit(self.sample_images(s)), s.prompt, s.answer)
            return enc["input_ids"], enc["labels"]
        ids = torch.tensor([*prompt, *answer, p.tokenizer.eos_token_id], dtype=torch.long)  # (T,)
        labels = ids.clone()
        labels[: len(prompt)] = IGNORE_INDEX
        return ids, labels

    def pixel_values(self, index: int) -> torch.Tensor:
        """Normalised float images of sample ``index`` (n, 3, S, S)."""
        return (self.sample_images(self.samples[index]).float().div(255.0) - self._mean) / self._std

    def batch(self, indices: Sequence[int]) -> dict[str, Any]:
        """Right-padded training batch of the samples ``indices`` (see ``NoteProcessor.collate``)."""
        items = [
            {
                "input_ids": self.input_ids[i],
                "attention_mask": torch.ones_like(self.input_ids[i]),
                "labels": self.labels[i],
                "pixel_values": self.pixel_values(i),
            }
            for i in indices
        ]
        return self.processor.collate(items, padding_side="right")

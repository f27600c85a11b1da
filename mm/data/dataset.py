"""``NoteDataset`` (a note folder in memory) and ``collate_notes`` (padding to image slots).

Images are decoded once at construction into one uint8 tensor per note (20k notes of 64x64 images
take ~600 MB; pass ``split`` and ``limit`` to decode only what you need: only the first ``limit`` notes
of the split are decoded, by a small thread pool, since OpenCV releases the GIL). ``__getitem__`` returns::

    {"id": str, "pixel_values": (N_img, 3, H, W) float32, "text": str, "image_captions": [str],
     "objects": [[ObjectAnnotation]], "questions": [Question], "note": Note}

``pixel_values`` are scaled to [0, 1] and then standardised with ``mean``/``std`` when given
(e.g. CLIP's). :func:`collate_notes` stacks a batch into ``(B, N_max, 3, H, W)`` with an
``image_mask`` ``(B, N_max)`` bool (True = real image); padded slots are zeros.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from mm.data.format import FormatError, Note, read_notes


def decode_image(path: str | Path, image_size: int | None = None) -> np.ndarray:
    """Read one image file as ``(H, W, 3)`` uint8 RGB, resized to a square ``image_size`` when given."""
    img = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if img is None:
        raise FormatError(f"cannot read image {path}: missing or not an image file")
    img = img[:, :, ::-1]  # BGR -> RGB
    if image_size is not None and img.shape[:2] != (image_size, image_size):
        img = cv2.resize(img, (image_size, image_size), interpolation=cv2.INTER_AREA)
    return np.ascontiguousarray(img)


def decode_note_images(folder: Path, note: Note, image_size: int | None = None) -> torch.Tensor:
    """All images of ``note`` (paths relative to ``folder``) as one ``(N_img, 3, H, W)`` uint8 tensor."""
    arrs = [decode_image(folder / p, image_size) for p in note.images]
    shapes = {a.shape for a in arrs}
    if len(shapes) != 1:
        raise FormatError(
            f"note {note.id}: images have different sizes {sorted(shapes)}; pass image_size= to resize"
        )
    # HWC -> CHW in numpy: a per-note torch .contiguous() costs ~2 ms here (thread start-up), numpy ~10 us
    return torch.from_numpy(np.ascontiguousarray(np.stack(arrs).transpose(0, 3, 1, 2)))  # (N_img, 3, H, W)


class NoteDataset(torch.utils.data.Dataset):
    """All notes of a folder (or one split), images decoded into memory once."""

    def __init__(
        self,
        folder: str | Path,
        split: str | None = None,
        *,
        image_size: int | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        limit: int | None = None,
        workers: int = 4,
    ) -> None:
        """``image_size`` resizes every image to a square (needed when files differ in size); ``limit``
        keeps only the first ``limit`` notes (of ``split``); ``workers`` threads decode (1 = no pool)."""
        if (mean is None) != (std is None):
            raise ValueError(f"give both mean and std or neither; got mean={mean}, std={std}")
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0 or None, got {limit}")
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self.folder = Path(folder)
        self.notes: list[Note] = read_notes(self.folder, split=split)[:limit]
        self.mean = None if mean is None else torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = None if std is None else torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)

        def decode(notes: list[Note]) -> list[torch.Tensor]:
            return [decode_note_images(self.folder, n, image_size) for n in notes]

        size = max(1, min(256, len(self.notes) // (4 * workers)))  # notes per task: ~4 tasks per thread
        chunks = [self.notes[i : i + size] for i in range(0, len(self.notes), size)]
        if workers == 1 or len(chunks) < 2:
            self.images: list[torch.Tensor] = decode(self.notes)  # per note: (N_img, 3, H, W) uint8
        else:
            with ThreadPoolExecutor(max_workers=workers) as pool:
                self.images = [t for part in pool.map(decode, chunks) for t in part]

    def __len__(self) -> int:
        return len(self.notes)

    def pixels_uint8(self, i: int) -> torch.Tensor:
        """Note ``i``'s images as stored: ``(N_img, 3, H, W)`` uint8."""
        return self.images[i]

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = self.notes[i]
        px = self.images[i].float().div_(255.0)  # (N_img, 3, H, W) in [0, 1]
        if self.mean is not None:
            px = (px - self.mean) / self.std
        return {
            "id": n.id,
            "pixel_values": px,
            "text": n.text,
            "image_captions": n.image_captions,
            "objects": n.objects,
            "questions": n.questions,
            "note": n,
        }


def collate_notes(batch: list[dict[str, Any]], max_images: int = 4) -> dict[str, Any]:
    """Pad a list of ``NoteDataset`` items to ``pixel_values`` ``(B, N_max, 3, H, W)`` + ``image_mask``.

    ``N_max`` is the most images of any note in the batch; a note with more than ``max_images``
    images is an error (raise ``max_images`` or drop the note), never silently cut. Returns
    ``pixel_values``, ``image_mask``, ``n_images`` (B,) and, as lists of length B, ``ids``, ``text``,
    ``image_captions``, ``objects``, ``questions`` and ``note``.
    """
    if not batch:
        raise ValueError("collate_notes: empty batch")
    counts = [b["pixel_values"].shape[0] for b in batch]
    too_many = [(b["id"], c) for b, c in zip(batch, counts) if c > max_images]
    if too_many:
        raise ValueError(
            f"notes with more than max_images={max_images} images: {too_many[:5]}; raise max_images"
        )
    shapes = {tuple(b["pixel_values"].shape[1:]) for b in batch}
    if len(shapes) != 1:
        raise ValueError(
            f"images in the batch differ in shape {sorted(shapes)}; build NoteDataset with image_size="
        )
    c, h, w = shapes.pop()
    B, N = len(batch), max(counts)
    first = batch[0]["pixel_values"]
    pixel_values = first.new_zeros(B, N, c, h, w)  # (B, N_max, 3, H, W)
    image_mask = torch.zeros(B, N, dtype=torch.bool)  # (B, N_max)
    for i, (b, k) in enumerate(zip(batch, counts)):
        pixel_values[i, :k] = b["pixel_values"]
        image_mask[i, :k] = True
    out: dict[str, Any] = {"pixel_values": pixel_values, "image_mask": image_mask}
    for key in batch[0]:
        if key != "pixel_values":
            out[key if key != "id" else "ids"] = [b[key] for b in batch]
    out["n_images"] = torch.tensor(counts, dtype=torch.long)
    return out

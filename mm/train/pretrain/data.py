"""Pretraining data held in memory: a split of a note folder as uint8 images + token ids (+ object tags)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mm.data.dataset import NoteDataset
from mm.errors import UserError
from mm.train.pretrain.config import PretrainConfig
from mm.world.vocab import CATEGORY_NAMES, COLORS


@dataclass
class NoteTensors:
    """A split held in memory: uint8 images, image mask, token ids (all indexed by note)."""

    pixels: torch.Tensor
    """(M, N, 3, H, W) uint8."""
    image_mask: torch.Tensor
    """(M, N) bool."""
    input_ids: torch.Tensor
    """(M, T) long."""
    attention_mask: torch.Tensor
    """(M, T) long."""
    tags: torch.Tensor | None = None
    """(M, N, C) bool: which of ``tag_classes`` each image shows, or (M, N, K, C) per cell of a
    ``tag_grid`` of K cells (None = not loaded)."""

    def __len__(self) -> int:
        return self.pixels.shape[0]

    def batch(self, idx: list[int] | torch.Tensor) -> dict[str, torch.Tensor]:
        """Model inputs for notes ``idx``: pixels scaled to [-1, 1]."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        ids, am = self.input_ids[idx], self.attention_mask[idx]
        t = int(am.sum(1).max())  # trim padding shared by the whole batch
        out = {
            "pixel_values": self.pixels[idx].float().div_(127.5).sub_(1.0),  # (B, N, 3, H, W)
            "image_mask": self.image_mask[idx],
            "input_ids": ids[:, :t],
            "attention_mask": am[:, :t],
        }
        if self.tags is not None:
            out["tags"] = self.tags[idx]  # (B, N, C) or (B, N, K, C)
        return out


def load_split(
    folder: str | Path,
    split: str,
    *,
    tokenizer: Any,
    max_images: int,
    max_len: int,
    limit: int | None = None,
    tag_classes: Sequence[str] | None = None,
    tag_grid: tuple[int, int] | None = None,
) -> NoteTensors:
    """Read a split of a note folder into memory (images decoded once, texts tokenized once).

    Notes are padded to ``max_images`` image slots; a note with more images is a :class:`UserError`.
    With ``tag_classes`` the per-image object tags are loaded too (an object of another category, or a
    note without object annotations, is a :class:`UserError`). With ``tag_grid`` ``(gh, gw)`` the tags are
    per cell of that grid over each image, row-major (:func:`cell_objects`).
    """
    ds = NoteDataset(folder, split=split, limit=limit)  # decodes only the notes used
    n = len(ds)
    if n == 0:
        raise UserError(
            f"{folder} has no notes in split {split!r}; generate more notes or choose another split"
        )
    first = ds.pixels_uint8(0)  # (N_img, 3, H, W)
    pixels = torch.zeros(n, max_images, *first.shape[1:], dtype=torch.uint8)  # (M, N, 3, H, W)
    mask = torch.zeros(n, max_images, dtype=torch.bool)  # (M, N)
    for i in range(n):
        px = ds.pixels_uint8(i)
        if px.shape[0] > max_images or px.shape[1:] != first.shape[1:]:
            raise UserError(
                f"note {ds.notes[i].id} in {folder}: {px.shape[0]} images of shape {tuple(px.shape[1:])}; "
                f"expected at most model.max_images={max_images} of shape {tuple(first.shape[1:])}"
            )
        pixels[i, : px.shape[0]] = px
        mask[i, : px.shape[0]] = True
    tags = None
    if tag_classes is not None:
        size = (first.shape[-2], first.shape[-1])  # (H, W) of the stored images: the boxes' pixels
        tags = _load_tags(ds.notes, folder, tag_classes, max_images, tag_grid, size)
    texts = [ds.notes[i].text for i in range(n)]
    # pad to the longest text only: batch() trims padding per batch anyway
    enc = tokenizer(texts, padding="longest", truncation=True, max_length=max_len, return_tensors="pt")
    return NoteTensors(
        pixels=pixels,
        image_mask=mask,
        input_ids=enc["input_ids"].long(),
        attention_mask=enc["attention_mask"].long(),
        tags=tags,
    )


def tag_classes(cfg: PretrainConfig) -> list[str] | None:
    """The tag classes ``load_split`` needs for ``cfg``: the world's categories when ``loss.tag_weight``
    is on, else None (no tags loaded); ``loss.tag_colours`` adds colour classes ("colour:red") and
    (category, colour) pair classes ("red fork") after them (:func:`object_tags`)."""
    if cfg.loss.tag_weight <= 0:
        return None
    classes = list(CATEGORY_NAMES)
    if cfg.loss.tag_colours in ("colour", "pair"):
        classes += [_colour_class(c) for c in COLORS]
    if cfg.loss.tag_colours == "pair":
        classes += [_pair_class(cat, c) for cat in CATEGORY_NAMES for c in COLORS]
    return classes


def tag_grid(cfg: PretrainConfig) -> tuple[int, int] | None:
    """The grid of per-token tags ``load_split`` needs for ``cfg`` (``loss.tag_scope: token``): the vision
    tower's patch grid, ``image_size // patch_size`` each way; None for per-image tags."""
    if cfg.loss.tag_weight <= 0 or cfg.loss.tag_scope == "image":
        return None
    v = cfg.model.vision
    if v.image_size is None:
        raise UserError(
            "loss.tag_scope: token tags each patch, so it needs model.vision.image_size (and patch_size) "
            "set; set them, or use loss.tag_scope: image"
        )
    n = v.image_size // v.patch_size
    return (n, n)


def cell_objects(bbox: Sequence[float], grid: tuple[int, int], size: tuple[int, int]) -> list[int]:
    """The row-major cells of a ``grid`` over an image of ``size`` (H, W) that an object with box ``bbox``
    (x0, y0, x1, y1 in pixels, x1/y1 exclusive) tags: the cells whose centre the box covers, and always
    the cell of the box's centre (so every object tags at least one cell)."""
    (gh, gw), (H, W) = grid, size
    x0, y0, x1, y1 = bbox
    ch, cw = H / gh, W / gw
    cells = {
        r * gw + c
        for r in range(gh)
        for c in range(gw)
        if x0 <= (c + 0.5) * cw < x1 and y0 <= (r + 0.5) * ch < y1
    }
    r = min(int(((y0 + y1) / 2) // ch), gh - 1)
    c = min(int(((x0 + x1) / 2) // cw), gw - 1)
    cells.add(max(r, 0) * gw + max(c, 0))
    return sorted(cells)


def object_tags(category: str, color: str | None, classes: Sequence[str]) -> list[str]:
    """The tag classes one object switches on: its category, and where ``classes`` has colour classes
    its colour and its (category, colour) pair. A missing colour is a :class:`UserError` then."""
    names = [category]
    colour_cls = _colour_class(color) if color is not None else None
    wants_colour = any(c.startswith(_COLOUR_PREFIX) for c in classes)
    if wants_colour and color is None:
        raise UserError(
            f"an object of category {category!r} has no colour, which loss.tag_colours needs; use notes "
            "whose objects carry colours (the world's) or set loss.tag_colours: none"
        )
    if wants_colour:
        names.append(colour_cls)
        pair = _pair_class(category, color)
        if pair in classes:
            names.append(pair)
    return names


_COLOUR_PREFIX = "colour:"


def _colour_class(color: str) -> str:
    return f"{_COLOUR_PREFIX}{color}"


def _pair_class(category: str, color: str) -> str:
    return f"{color} {category}"


def _load_tags(
    notes: Sequence[Any],
    folder: str | Path,
    classes: Sequence[str],
    max_images: int,
    grid: tuple[int, int] | None,
    size: tuple[int, int],
) -> torch.Tensor:
    index = {c: i for i, c in enumerate(classes)}
    cells = 1 if grid is None else grid[0] * grid[1]
    tags = torch.zeros(len(notes), max_images, cells, len(classes), dtype=torch.bool)  # (M, N, K, C)
    for i, note in enumerate(notes):
        if not note.objects:
            raise UserError(
                f"note {note.id} in {folder} has no object annotations, which loss.tag_weight > 0 needs; "
                "use notes with objects (world or COCO) or set loss.tag_weight: 0"
            )
        for k, objs in enumerate(note.objects[:max_images]):
            for o in objs:
                for name in object_tags(o.category, o.color, classes):
                    if name not in index:
                        raise UserError(
                            f"note {note.id} in {folder}: object tag {name!r} is not a tag class "
                            f"({len(classes)} world classes); set loss.tag_weight: 0 for other vocabularies"
                        )
                    where = [0] if grid is None else cell_objects(o.bbox, grid, size)
                    tags[i, k, where, index[name]] = True
    return tags[:, :, 0] if grid is None else tags  # (M, N, C) or (M, N, K, C)

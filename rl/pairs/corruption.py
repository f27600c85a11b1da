"""Image-corrupted pairs (mDPO, Wang et al. 2024, conditional term).

Chosen and rejected are the same ground-truth caption; the rejected side is scored with a corrupted copy
of the images (:mod:`rl.corrupt`, recorded as ``corruption`` so a trainer rebuilds it with
:func:`pair_images`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mm.data.images import open_rgb
from mm.errors import UserError
from rl.corrupt import KINDS, corrupt
from rl.pairs.record import PreferencePair


def load_pixels(path: str | Path) -> Any:
    """An image file as a float tensor (3, H, W) in [0, 1]."""
    arr = np.asarray(open_rgb(path), dtype=np.float32) / 255.0  # (H, W, 3)
    return torch.from_numpy(arr).permute(2, 0, 1).contiguous()  # (3, H, W)


def pair_images(pair: PreferencePair, root: str | Path, *, rejected: bool = False) -> list[Any]:
    """The images of one side of ``pair`` (the corrupted ones for the rejected side of a corrupt pair)."""

    paths = [str(Path(root) / p) for p in pair.images]
    if not (rejected and pair.corruption):
        return paths
    stacked = torch.stack([load_pixels(p) for p in paths])  # (N, 3, H, W)
    return list(corrupt(stacked, **pair.corruption))


def corrupt_pairs(
    notes: Sequence[Any],
    *,
    prompt: str,
    corruption: str = "crop",
    seed: int = 0,
    **corrupt_kwargs: Any,
) -> list[PreferencePair]:
    """One mDPO conditional pair per note with a caption: same answer, corrupted images rejected."""
    if corruption not in KINDS:
        raise UserError(f"unknown corruption {corruption!r}; expected one of {', '.join(KINDS)}")
    out = []
    for i, note in enumerate(notes):
        caption = note.text.strip()
        if not caption:
            continue
        spec = {"kind": corruption, "seed": seed * 1_000_003 + i, **corrupt_kwargs}
        out.append(
            PreferencePair(
                id=f"{note.id}-corrupt-0",
                kind="corrupt",
                note_id=note.id,
                images=list(note.images),
                prompt=prompt,
                chosen=caption,
                rejected=caption,
                objects=sorted(note.categories),
                corruption=spec,
            )
        )
    return out

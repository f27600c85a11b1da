"""Batched greedy generation: captions and yes/no answers.

    captions = generate_captions(model, processor, notes, prompt="Describe the note.", root=folder)
    answers = answer_questions(model, processor, notes, ["Is there a fork in image 1?", ...], root=folder)
    texts = adapter_generate(adapter, [["a.jpg"], ["b.png"]], ["Is there a cup?", ...], batch_size=16)

:func:`generate` drives a NoteVLM (or a PeftModel of one) with its NoteProcessor directly;
:func:`adapter_generate` drives any model behind :class:`mm.model.adapter.VLMAdapter` (NoteVLM or a
transformers family: its chat template, greedy, KV cache), opening image files one batch at a time.

Batches are left padded (so every row's new tokens start at the same position) and decoded greedily with
the KV cache; the images are encoded once, on the prefill step. An item of ``notes`` is an
`mm.data.format.Note` (its image paths are resolved against ``root``) or a list of images that
:meth:`NoteProcessor.load_image` accepts (PIL images, paths, uint8 arrays, float tensors in [0, 1]).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mm.data.images import open_rgb
from mm.eval.parallel import strided_map


def note_images(item: Any, root: str | Path | None = None) -> list[Any]:
    """The images of ``item`` (a Note: paths resolved against ``root``; else the item itself)."""
    if hasattr(item, "images") and hasattr(item, "id"):
        base = Path(root) if root is not None else Path(".")
        return [p if Path(p).is_absolute() else str(base / p) for p in item.images]
    if isinstance(item, (list, tuple)):
        return list(item)
    raise TypeError(f"expected a Note or a list of images, got {type(item).__name__}")


@torch.no_grad()
def generate(
    model: Any,
    processor: Any,
    items: Sequence[Any],
    prompts: Sequence[str],
    *,
    batch_size: int = 32,
    max_new_tokens: int = 64,
    root: str | Path | None = None,
) -> list[str]:
    """Greedy continuation of ``prompts[i]`` about ``items[i]``'s images, decoded without special tokens."""
    if len(items) != len(prompts):
        raise ValueError(f"need one prompt per item, got {len(items)} items and {len(prompts)} prompts")
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size}, {max_new_tokens}")
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    tok = processor.tokenizer
    out: list[str] = []
    try:
        for start in range(0, len(items), batch_size):
            chunk = range(start, min(len(items), start + batch_size))
            batch = processor(
                [note_images(items[i], root) for i in chunk], [prompts[i] for i in chunk], padding_side="left"
            )
            batch = {k: v.to(device) for k, v in batch.items()}
            ids = model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )  # (b, T + new)
            new = ids[:, batch["input_ids"].shape[1] :]  # (b, new)
            out.extend(t.strip() for t in processor.batch_decode(new, skip_special_tokens=True))
    finally:
        model.train(was_training)
    return out


def generate_captions(
    model: Any,
    processor: Any,
    notes: Sequence[Any],
    prompt: str,
    batch_size: int = 32,
    max_new_tokens: int = 64,
    *,
    root: str | Path | None = None,
) -> list[str]:
    """One greedy caption per note for the same ``prompt``."""
    return generate(
        model, processor, notes, [prompt] * len(notes), batch_size=batch_size,
        max_new_tokens=max_new_tokens, root=root,
    )  # fmt: skip


def answer_questions(
    model: Any,
    processor: Any,
    notes: Sequence[Any],
    questions: Sequence[str],
    batch_size: int = 32,
    max_new_tokens: int = 8,
    *,
    root: str | Path | None = None,
) -> list[str]:
    """Greedy answer to ``questions[i]`` about ``notes[i]`` (pass a note once per question)."""
    return generate(
        model, processor, notes, list(questions), batch_size=batch_size,
        max_new_tokens=max_new_tokens, root=root,
    )  # fmt: skip


def adapter_generate(
    adapter: Any,
    images: Sequence[Sequence[str | Path]],
    prompts: Sequence[str],
    *,
    batch_size: int = 32,
    max_new_tokens: int = 64,
    where: Sequence[str] | None = None,
) -> list[str]:
    """Greedy answer to ``prompts[i]`` about the image files ``images[i]`` through a `VLMAdapter`.

    Images are opened (RGB) one batch at a time; ``where[i]`` (e.g. ``FILE:LINE``) names item ``i`` in
    the error for an unreadable image. Under ``torchrun`` each process answers its share of the items
    (:func:`mm.eval.parallel.strided_map`) and every process returns all the answers.
    """
    from mm.model.adapter import Sample

    if len(images) != len(prompts):
        raise ValueError(f"need one prompt per item, got {len(images)} items and {len(prompts)} prompts")
    if batch_size < 1 or max_new_tokens < 1:
        raise ValueError(f"batch_size and max_new_tokens must be >= 1, got {batch_size}, {max_new_tokens}")

    def answer(items: Sequence[int]) -> list[str]:
        out: list[str] = []
        for start in range(0, len(items), batch_size):
            samples = [
                Sample(images=[open_rgb(p, where[i] if where else "") for p in images[i]], text=prompts[i])
                for i in items[start : start + batch_size]
            ]
            out.extend(adapter.generate(samples, max_new_tokens=max_new_tokens))
        return out

    return strided_map(answer, len(images))

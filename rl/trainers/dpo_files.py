"""``rl dpo --model DIR --pairs PAIRS.jsonl``: DPO on any model the adapter loads, from your pair files.

The same step as the world form (:func:`rl.trainers.dpo.scored_dpo_step` in :class:`DPOTrainer` on
:mod:`mm.train.loop`), with the rows built by the model's own processor and chat template
(:meth:`mm.model.adapter.VLMAdapter.answer_batch`) and scored by the adapter
(:class:`rl.trainers.dpo_score.AdapterScorer`). Chosen and rejected rows (and mDPO's conditional rows)
of a step go through one forward pass, as TRL's ``concatenated_forward``.

Reference: the adapters switched off under LoRA (the default), a frozen copy with full fine-tuning.
Full fine-tuning trains everything but the vision tower. OUT/model is a complete model folder (LoRA
merged) that ``AutoModelForImageTextToText.from_pretrained`` loads without notelens for transformers
families; the LoRA itself is beside it in OUT/adapter/ (as the world form writes them).
Deviation from the world form: mDPO's conditional rows corrupt the original images before the processor
(the world form corrupts the resized ones).
"""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import torch

from mm.config import to_dict
from mm.errors import UserError
from mm.model.adapter import Sample, load_adapter
from mm.train import common, loop
from rl.corrupt import corrupt
from rl.pairs.importers import FilePair, open_images
from rl.trainers.common import Reference, make_optimizer, start_run, trained_adapter
from rl.trainers.dpo import DPO_PLOT_KEYS, DPOTrainer
from rl.trainers.dpo_config import FilesDPOConfig
from rl.trainers.dpo_score import AdapterScorer
from rl.trainers.monitor import failure_warnings

VISION_MODULES = ("vision_tower", "vision_model", "visual")
"""Module names of vision towers (LLaVA, NoteVLM; Idefics3/SmolVLM; Qwen2-VL): frozen in full fine-tuning."""


def corrupt_image(image: Any, kind: str, seed: int) -> Any:
    """A PIL image corrupted by :func:`rl.corrupt.corrupt` (``kind``, ``seed``), as a PIL image."""
    import numpy as np
    from PIL import Image

    x = torch.from_numpy(np.asarray(image, dtype=np.uint8)).permute(2, 0, 1).float() / 255.0  # (3, H, W)
    y = corrupt(x, kind, seed=seed).reshape(x.shape)  # (3, H, W) in [0, 1]
    arr = (y * 255.0).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()  # (H, W, 3)
    return Image.fromarray(arr, "RGB")


class FilePairBatcher:
    """:class:`rl.pairs.importers.FilePair` records -> adapter answer batches (one forward per step).

    Row layout of ``batch(indices)`` with ``b = len(indices)``: rows ``[0, b)`` chosen, ``[b, 2b)``
    rejected and, with ``conditional``, ``[2b, 3b)`` the chosen answer with corrupted images; each row is
    the model's chat-template prompt (left padded) + the answer (right padded) with ``response_mask``.
    """

    def __init__(
        self,
        *,
        adapter: Any,
        pairs: list[FilePair],
        conditional: str | None = None,
        seed: int = 0,
        max_answer_tokens: int = 0,
    ) -> None:
        if not pairs:
            raise UserError("no preference pairs to train on")
        self.adapter, self.pairs = adapter, pairs
        self.conditional, self.seed, self.max_answer_tokens = conditional, seed, max_answer_tokens

    def __len__(self) -> int:
        return len(self.pairs)

    def _answer(self, text: str) -> list[int]:
        ids = self.adapter.encode_answer(text)  # text tokens + eos
        return ids[: self.max_answer_tokens] if self.max_answer_tokens else ids

    def batch(self, indices: list[int]) -> dict[str, Any]:
        """Model inputs (3b or 2b rows, on the model's device) with ``response_mask`` and ``num_pairs``."""
        pairs = [self.pairs[i] for i in indices]
        images = [open_images(p) for p in pairs]
        samples = [Sample(images=imgs, text=p.question) for p, imgs in zip(pairs, images)]
        chosen = [self._answer(p.chosen) for p in pairs]
        rows, answers = samples + samples, chosen + [self._answer(p.rejected) for p in pairs]
        if self.conditional is not None:
            for i, p, imgs in zip(indices, pairs, images):
                seed = self.seed * 1_000_003 + i
                bad = [corrupt_image(im, self.conditional, seed + k) for k, im in enumerate(imgs)]
                rows.append(Sample(images=bad, text=p.question))
            answers += chosen
        try:
            out = self.adapter.answer_batch(rows, answers)
        except ValueError as e:  # e.g. more images than image markers, an image the processor rejects
            where = ", ".join(p.where for p in pairs)
            raise UserError(f"the processor rejected a batch of pairs ({where}): {e}") from e
        out["num_pairs"] = len(indices)
        return out


def prepare_model(cfg: FilesDPOConfig, device: torch.device) -> Any:
    """The adapter over ``cfg.model.path``: LoRA-wrapped when enabled, else all but the vision tower
    trainable."""
    adapter = load_adapter(cfg.model.path, device=device, dtype=cfg.model.dtype)
    if cfg.lora.enabled:
        adapter.apply_lora(r=cfg.lora.r, alpha=cfg.lora.alpha, dropout=cfg.lora.dropout)
    else:
        for name, p in adapter.model.named_parameters():
            p.requires_grad_(not any(m in name.split(".") for m in VISION_MODULES))
    return adapter


def save_model(adapter: Any, out: Path) -> None:
    """OUT/model (LoRA merged, with the processor) and, when LoRA was trained, OUT/adapter beside it."""
    for old in (out / "model", out / "adapter"):  # a rerun after a finished run replaces both
        if old.exists():
            shutil.rmtree(old)
    adapter.merge_and_save(out / "model")  # writes the LoRA to OUT/model/adapter, then merges
    if (out / "model" / "adapter").is_dir():
        (out / "model" / "adapter").rename(out / "adapter")


def train(
    cfg: FilesDPOConfig,
    pairs: list[FilePair],
    *,
    out_dir: str | Path,
    resume: bool = True,
    show_progress: bool = True,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train on ``pairs`` (:func:`rl.pairs.importers.read_pair_file`); writes OUT/metrics.jsonl,
    OUT/curves.png, OUT/checkpoints/, OUT/model and, under LoRA, OUT/adapter. Returns a summary."""
    out, device = start_run(cfg.train, out_dir, global_batch=cfg.data.batch_size)
    rank, world = common.init_distributed()
    adapter = prepare_model(cfg, device)
    ref = Reference(model=adapter.model, needed=True)
    conditional = cfg.loss.corruption if cfg.loss.conditional_weight > 0 else None
    batcher = FilePairBatcher(
        adapter=adapter, pairs=pairs, conditional=conditional, seed=cfg.train.seed,
        max_answer_tokens=cfg.data.max_answer_tokens,
    )  # fmt: skip
    opt, sched = make_optimizer(adapter.model, cfg.optim, cfg.train.steps)
    trainer = DPOTrainer(
        model=adapter.model, scorer=AdapterScorer(adapter, ref), loss=cfg.loss, pairs=batcher,
        batch_size=cfg.data.batch_size, seed=cfg.train.seed, device=device, rank=rank, world=world,
    )  # fmt: skip
    result = loop.run(
        trainer, optimizer=opt, scheduler=sched, run=cfg.train, out=out, config=to_dict(cfg),
        desc=f"dpo-{adapter.family}" + ("-lora" if cfg.lora.enabled else ""), plot_keys=DPO_PLOT_KEYS,
        monitor=failure_warnings, grad_clip=cfg.optim.grad_clip, resume=resume, show_progress=show_progress,
        stop_after=stop_after,
    )  # fmt: skip
    if not result.stopped:  # rank 0 writes OUT; every rank returns once it is there
        common.on_rank0(lambda: save_model(trained_adapter(adapter, result.model), out))
    return {
        "step": result.step,
        "family": adapter.family,
        "pairs": len(pairs),
        "images_per_pair": dict(sorted(Counter(len(p.images) for p in pairs).items())),
        "reference": ref.kind,
        "train_seconds": round(result.seconds, 3),
        "step_seconds": round(result.step_seconds, 4),
        "last": result.last,
    }

"""DPO-family post-training of a NoteVLM from its SFT checkpoint (``rl dpo``), with mDPO's terms.

Objective per pair (Rafailov et al. 2023, "Direct Preference Optimization"; the loss family and its
deviations are in :func:`rl.losses.dpo_loss`)::

    loss = dpo(loss_type, beta)  [+ sft_weight * NLL(chosen)  (RPO)]
         + conditional_weight * mDPO conditional term   (same chosen answer, corrupted image rejected)
         + anchor_weight * mDPO anchor term             (Wang et al. 2024, eqs. 4-5)

Why a compact loop and not TRL's ``DPOTrainer``: TRL 1.16 tokenises with ``processor(images=...,
text=...)`` and a chat template, flattens ``pixel_values`` per image and has no notion of NoteVLM's
``(B, N, 3, S, S)`` + ``image_mask`` layout or of corrupted-image rows for mDPO's conditional term; it
also re-tokenises text, while on-policy pairs here carry raw sampled ids. So this module builds the
rows itself (chosen, rejected and, for mDPO, chosen-with-corrupted-images concatenated into one
forward, as TRL's ``concatenated_forward``) and calls :func:`rl.losses.dpo_loss`. The step
(:func:`dpo_step`) also takes a text-only causal LM batch (no ``pixel_values``), which is how
``benchmarks/rl_bench.py`` times it against ``DPOTrainer``.

Reference: adapter-disabled model under LoRA, a frozen copy otherwise (DPO always needs one).
Deviation: corrupt pairs (and mDPO's conditional rows) corrupt the images *after* resizing to the
processor's size (``rl.pairs.pair_images`` corrupts full-size files); same corruption kind and seed.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from mm.errors import UserError
from mm.train.tasks import ANSWER_STYLES
from rl.trainers.common import (
    InitConfig,
    LoraConfig,
    OptimConfig,
    Reference,
    RunConfig,
    batch_token_logps,
    note_pixels,
)

DPO_PLOT_KEYS = ["loss", "reward_margin", "reward_accuracy", "grad_norm", "kl", "entropy"]
"""Panels of OUT/curves.png."""


@dataclass(kw_only=True)
class LossConfig:
    """The DPO-family loss and mDPO's extra terms."""

    loss_type: str = "sigmoid"
    """One of rl.losses.DPO_LOSS_TYPES (sigmoid, ipo, hinge, robust, bco_pair, ..., sigmoid_norm)."""
    beta: float = 0.1
    """DPO temperature (KL strength to the reference); > 0."""
    label_smoothing: float = 0.0
    """cDPO / robust DPO label-flip rate in [0, 0.5)."""
    sft_weight: float = 0.0
    """Weight of the chosen answer's NLL mixed in (RPO); 0 = off."""
    conditional_weight: float = 0.0
    """mDPO conditional term weight (chosen answer with true vs corrupted images); 0 = off."""
    anchor_weight: float = 0.0
    """mDPO anchor term weight (chosen implicit reward kept above anchor_delta); 0 = off."""
    anchor_delta: float = 0.0
    """mDPO anchor threshold delta (0 in the paper)."""
    corruption: str = "crop"
    """rl.corrupt kind for mDPO's conditional rows: noise, crop, patch_shuffle or blank."""

    def __post_init__(self) -> None:
        from rl.corrupt import KINDS
        from rl.losses import DPO_LOSS_TYPES

        if self.loss_type not in DPO_LOSS_TYPES:
            raise ValueError(f"loss.loss_type must be one of {DPO_LOSS_TYPES}, got {self.loss_type!r}")
        if self.beta <= 0:
            raise ValueError(f"loss.beta must be > 0 for DPO (it scales the log-ratios), got {self.beta}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"loss.label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if min(self.sft_weight, self.conditional_weight, self.anchor_weight) < 0:
            raise ValueError("loss.sft_weight, conditional_weight and anchor_weight must be >= 0")
        if self.corruption not in KINDS:
            raise ValueError(f"loss.corruption must be one of {KINDS}, got {self.corruption!r}")


BUILDS = ("injection", "corrupt", "correction", "onpolicy")
"""Pair kinds ``rl dpo`` builds itself (``data.build``)."""


@dataclass(kw_only=True)
class DataConfig:
    """Preference pairs: a JSONL from ``rl pairs``, or injection/corrupt pairs built from the notes."""

    folder: str = "runs/data/world"
    """Note folder (notes.jsonl + images); pair image paths are relative to it."""
    pairs: str | None = None
    """Pairs JSONL written by ``rl pairs``; None = build ``build`` pairs from ``split`` notes."""
    build: str = "injection"
    """Pairs to build when ``pairs`` is None: injection (POVID/HA-DPO), corrupt (mDPO), correction
    (RLHF-V: the starting policy's own greedy captions minus their hallucinated objects) or onpolicy
    (RLAIF-V: best vs worst by the scene reward of ``samples`` captions sampled from the starting policy).
    correction and onpolicy generate with the policy first, so they need ``notes`` > 0."""
    samples: int = 4
    """onpolicy: captions sampled per note."""
    temperature: float = 1.0
    """onpolicy: sampling temperature."""
    hallucination_weight: float = 1.0
    """onpolicy: weight of the hallucinated-mention penalty in the reward that ranks the samples (the
    covered-object fraction has weight 1; :class:`rl.rewards.RewardConfig`). RLAIF-V ranks by
    hallucinations; at 1 the best sample is often the one that names more objects, hallucinations too."""
    split: str = "train"
    """Note split pairs are built from."""
    notes: int = 0
    """Use the first n notes (0 = all)."""
    prompt: str = "Describe the note."
    """Caption prompt (the SFT caption prompt)."""
    batch_size: int = 8
    """Pairs per optimizer step."""
    question_ratio: float = 0.0
    """Add POPE-style yes/no pairs (:func:`rl.pairs.question_pairs`, one "yes" and one adversarial "no" per
    image of the ``split`` notes), this many per caption pair, drawn at random (0 = none; also with
    ``pairs``). They teach the model to say "no" to the absent partner that a caption pair punishes."""
    question_batch_size: int = 0
    """POPE-style yes/no pairs (:func:`rl.pairs.question_pairs` on the notes the caption pairs come from,
    one "yes" and one adversarial "no" per image) trained in a batch of their own beside every step's
    pairs (0 = none); their loss (same loss type, beta and SFT term) is added with weight 1, metrics under
    ``question/``. A question pair is ~3x shorter than a caption pair, which a mixed batch
    (``question_ratio``) pads to caption length, so many cost little this way."""
    answer_style: str = "word"
    """How the yes/no pairs' answers are written: the SFT model's ``tasks.answer_style`` ("word": "yes";
    "object": "A fork: yes"; :func:`mm.train.tasks.yes_no_answer`)."""

    def __post_init__(self) -> None:
        if self.question_ratio < 0 or self.question_batch_size < 0:
            raise ValueError(
                "data.question_ratio and data.question_batch_size must be >= 0, got "
                f"{self.question_ratio} and {self.question_batch_size}"
            )
        if self.answer_style not in ANSWER_STYLES:
            raise ValueError(f"data.answer_style must be one of {ANSWER_STYLES}, got {self.answer_style!r}")
        if self.build not in BUILDS:
            raise ValueError(f"data.build must be one of {', '.join(BUILDS)}, got {self.build!r}")
        if self.build in ("correction", "onpolicy") and self.pairs is None and self.notes == 0:
            raise ValueError(
                f"data.build={self.build} captions every note with the policy first; set data.notes to how "
                "many (e.g. 600)"
            )
        hw = self.hallucination_weight
        if not (hw >= 0 and math.isfinite(hw)):
            raise ValueError(f"data.hallucination_weight must be a finite number >= 0, got {hw}")
        if self.samples < 2 or self.temperature <= 0:
            raise ValueError(
                f"need data.samples >= 2 and data.temperature > 0, got {self.samples}, {self.temperature}"
            )
        if self.batch_size < 1 or self.notes < 0:
            raise ValueError(
                f"need data.batch_size >= 1 and data.notes >= 0, got {self.batch_size}, {self.notes}"
            )


@dataclass(kw_only=True)
class DPOConfig:
    """Everything ``rl dpo`` needs."""

    init: InitConfig = field(default_factory=InitConfig)
    """SFT checkpoint to start from."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA (reference = adapters off) or full fine-tuning (reference = frozen copy)."""
    loss: LossConfig = field(default_factory=LossConfig)
    """DPO-family loss and mDPO terms."""
    data: DataConfig = field(default_factory=DataConfig)
    """Preference pairs."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    train: RunConfig = field(default_factory=RunConfig)
    """Steps, seed, cadence."""


# ---------------------------------------------------------------- pairs -> batches


class PairBatcher:
    """Turns :class:`rl.pairs.PreferencePair` records into right-padded training rows.

    Row layout of ``batch(indices)`` with ``b = len(indices)``: rows ``[0, b)`` chosen, ``[b, 2b)``
    rejected and, with ``conditional``, ``[2b, 3b)`` the chosen answer with corrupted images.
    """

    def __init__(
        self,
        *,
        processor: Any,
        pairs: list[Any],
        root: str | Path,
        conditional: str | None = None,
        seed: int = 0,
    ) -> None:
        from mm.train.sft_data import load_note_images

        if not pairs:
            raise UserError("no preference pairs to train on")
        self.processor = processor
        self.pairs = pairs
        self.conditional = conditional
        self.seed = seed
        self._images: dict[tuple[str, ...], torch.Tensor] = {}
        for p in pairs:
            key = tuple(p.images)
            if key not in self._images:
                note = SimpleNamespace(id=p.note_id, images=list(p.images))
                self._images[key] = load_note_images([note], root, processor.image_size)[0]  # (n, 3, S, S) u8
        self._prompt: dict[tuple[int, str], list[int]] = {}

    def __len__(self) -> int:
        return len(self.pairs)

    def _pixels(self, pair: Any, corruption: dict[str, Any] | None) -> torch.Tensor:
        from rl.corrupt import corrupt

        u8 = self._images[tuple(pair.images)]  # (n, 3, S, S)
        if corruption is None:
            return note_pixels(u8, self.processor)
        unit = corrupt(u8.float() / 255.0, **corruption)  # (n, 3, S, S) in [0, 1]
        return note_pixels((unit * 255.0).round().to(torch.uint8), self.processor)

    def _row(self, pair: Any, text: str, ids: list[int] | None, corruption: dict[str, Any] | None) -> dict:
        from mm.model.processing import IGNORE_INDEX

        p = self.processor
        pixels = self._pixels(pair, corruption)
        key = (len(pixels), pair.prompt)
        if key not in self._prompt:
            self._prompt[key] = p.prompt_ids(len(pixels), pair.prompt)
        prompt = self._prompt[key]
        if ids is None:
            ids = [*p.tokenizer(text, add_special_tokens=False)["input_ids"], p.tokenizer.eos_token_id]
        room = p.max_length - len(prompt)
        if room < 1:
            raise UserError(
                f"pair {pair.id}: the prompt with its images is {len(prompt)} tokens but max_length="
                f"{p.max_length}; raise the processor's max_length"
            )
        seq = torch.tensor([*prompt, *ids[:room]], dtype=torch.long)  # (T,)
        labels = seq.clone()
        labels[: len(prompt)] = IGNORE_INDEX
        return {
            "input_ids": seq,
            "attention_mask": torch.ones_like(seq),
            "labels": labels,
            "pixel_values": pixels,
        }

    def batch(self, indices: list[int]) -> dict[str, Any]:
        """Rows for ``indices`` (see class docstring) with ``response_mask`` and ``num_pairs``."""
        rows, rejected, cond = [], [], []
        for i in indices:
            pair = self.pairs[i]
            rows.append(self._row(pair, pair.chosen, pair.chosen_ids, None))
            rejected.append(self._row(pair, pair.rejected, pair.rejected_ids, pair.corruption))
            if self.conditional is not None:
                spec = {"kind": self.conditional, "seed": self.seed * 1_000_003 + i}
                cond.append(self._row(pair, pair.chosen, pair.chosen_ids, spec))
        out = self.processor.collate(rows + rejected + cond, padding_side="right")
        out["response_mask"] = (out.pop("labels") != -100).long()  # (R, T)
        out["num_pairs"] = len(indices)
        return out


def _world_notes(cfg: DataConfig) -> list[Any]:
    """The first ``cfg.notes`` annotated notes with text of ``cfg.split`` in ``cfg.folder``."""
    from mm.data.format import read_notes

    folder = Path(cfg.folder)
    if not (folder / "notes.jsonl").is_file():
        raise UserError(f"data.folder={folder} has no notes.jsonl; generate notes with `mm data world`")
    notes = [n for n in read_notes(folder, split=cfg.split) if n.categories and n.text.strip()]
    return notes[: cfg.notes] if cfg.notes else notes


def load_question_pairs(cfg: DataConfig, seed: int) -> list[Any]:
    """POPE-style yes/no pairs on the configured notes (``data.question_ratio`` / ``question_batch_size``)."""
    from rl.pairs import question_pairs

    pairs = question_pairs(_world_notes(cfg), per_image=1, seed=seed, answer_style=cfg.answer_style)
    if not pairs:
        raise UserError(f"no yes/no question pairs from the {cfg.split!r} notes of {cfg.folder}")
    return pairs


def load_pairs(cfg: DataConfig, seed: int, policy: tuple[Any, Any] | None = None) -> list[Any]:
    """The configured pairs: read from ``cfg.pairs`` or built from the notes of ``cfg.split`` (correction
    pairs with ``policy`` = (model, processor))."""
    from rl.pairs import (
        correction_pairs,
        corrupt_pairs,
        injection_pairs,
        onpolicy_pairs,
        read_pairs,
    )

    if cfg.pairs is not None:
        pairs = read_pairs(cfg.pairs)
    elif cfg.build == "injection":
        pairs = injection_pairs(_world_notes(cfg), prompt=cfg.prompt, seed=seed)
    elif cfg.build in ("correction", "onpolicy"):
        if policy is None:
            raise ValueError(f"{cfg.build} pairs need the policy (model, processor)")
        if cfg.build == "correction":
            pairs = correction_pairs(*policy, _world_notes(cfg), cfg.folder, prompt=cfg.prompt)
        else:
            from rl.rewards import RewardConfig

            pairs = onpolicy_pairs(
                *policy, _world_notes(cfg), cfg.folder, prompt=cfg.prompt, num_samples=cfg.samples,
                temperature=cfg.temperature, seed=seed,
                reward_cfg=RewardConfig(hallucination_weight=cfg.hallucination_weight),
            )  # fmt: skip
    else:
        pairs = corrupt_pairs(_world_notes(cfg), prompt=cfg.prompt, seed=seed)
    if cfg.question_ratio > 0:
        pool = load_question_pairs(cfg, seed)
        want = min(len(pool), round(cfg.question_ratio * len(pairs)))
        pick = np.random.default_rng(seed).choice(len(pool), size=want, replace=False)
        pairs += [pool[i] for i in sorted(pick.tolist())]
    if not pairs:
        raise UserError(
            f"no preference pairs (data.pairs={cfg.pairs}, data.build={cfg.build}, split={cfg.split!r}); "
            "check the note folder or build pairs with `rl pairs`"
        )
    return pairs


# ---------------------------------------------------------------- the step


QUESTION_METRICS = ("dpo_loss", "reward_accuracy", "reward_margin", "logp_chosen")
"""What the yes/no question batch (``data.question_batch_size``) logs, as ``question/<name>``."""


def dpo_step(
    model: Any,
    ref: Reference,
    batch: dict[str, Any],
    cfg: LossConfig,
    *,
    bco_delta: float = 0.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss (scalar, with grad) and detached metrics of one batch of pairs (see :class:`PairBatcher`).

    Works for NoteVLM batches and for text-only causal LM batches (no ``pixel_values``).
    """
    from rl.losses import dpo_loss, mdpo_anchor_loss, mdpo_conditional_loss

    b = int(batch["num_pairs"])
    logps, mask, entropy = batch_token_logps(model, batch, with_entropy=True)  # (R, W)
    ref_logps = ref.token_logps(batch)  # (R, W)
    seq, ref_seq = logps.sum(-1), ref_logps.sum(-1)  # (R,)
    lengths = mask.sum(-1)  # (R,)
    losses, chosen_r, rejected_r = dpo_loss(
        seq[:b], seq[b : 2 * b], ref_seq[:b], ref_seq[b : 2 * b],
        loss_type=cfg.loss_type, beta=cfg.beta, label_smoothing=cfg.label_smoothing,
        chosen_lengths=lengths[:b], rejected_lengths=lengths[b : 2 * b], bco_delta=bco_delta,
        sft_weight=cfg.sft_weight,
    )  # fmt: skip
    loss = losses.mean()
    metrics: dict[str, torch.Tensor] = {"dpo_loss": loss.detach()}
    if cfg.conditional_weight > 0:
        cond = mdpo_conditional_loss(
            seq[:b], ref_seq[:b], seq[2 * b :], ref_seq[2 * b :], beta=cfg.beta
        ).mean()
        loss = loss + cfg.conditional_weight * cond
        metrics["conditional_loss"] = cond.detach()
    if cfg.anchor_weight > 0:
        anchor = mdpo_anchor_loss(seq[:b], ref_seq[:b], beta=cfg.beta, delta=cfg.anchor_delta).mean()
        loss = loss + cfg.anchor_weight * anchor
        metrics["anchor_loss"] = anchor.detach()
    with torch.no_grad():
        m = mask[: 2 * b].to(logps.dtype)
        margin = chosen_r - rejected_r
        implicit = torch.cat([chosen_r, rejected_r])
        metrics.update(
            {
                "reward_chosen": chosen_r.mean(),
                "reward_rejected": rejected_r.mean(),
                "reward_margin": margin.mean(),
                "reward_accuracy": (margin > 0).float().mean(),
                "reward_mean": implicit.mean(),
                "reward_std": implicit.std() if implicit.numel() > 1 else implicit.new_zeros(()),
                "logp_chosen": (seq[:b] / lengths[:b].clamp(min=1)).mean(),
                "logp_rejected": (seq[b : 2 * b] / lengths[b : 2 * b].clamp(min=1)).mean(),
                "kl": ((logps - ref_logps)[: 2 * b] * m).sum() / m.sum().clamp(min=1),
                "entropy": (entropy[: 2 * b] * m).sum() / m.sum().clamp(min=1),
                "response_len": lengths[: 2 * b].float().mean(),
            }
        )
    return loss, metrics


# ---------------------------------------------------------------- training


def train(
    cfg: DPOConfig,
    *,
    out_dir: str | Path,
    resume: bool = True,
    show_progress: bool = True,
    stop_after: int | None = None,
) -> dict[str, Any]:
    """Train; writes OUT/metrics.jsonl, OUT/curves.png, OUT/checkpoints/, OUT/model. Returns a summary."""
    from mm.config import to_dict
    from mm.train import common as C
    from rl.losses import bco_running_delta
    from rl.trainers.common import (
        clip_and_norm,
        load_policy,
        make_optimizer,
        save_final,
        start_run,
        to_device,
        train_loop,
    )

    out, device = start_run(cfg.train, out_dir)
    model, processor = load_policy(cfg.init, cfg.lora, device)
    pairs = load_pairs(cfg.data, cfg.train.seed, policy=(model, processor))
    ref = Reference(model=model, needed=True)
    conditional = cfg.loss.corruption if cfg.loss.conditional_weight > 0 else None
    batcher = PairBatcher(
        processor=processor, pairs=pairs, root=cfg.data.folder, conditional=conditional, seed=cfg.train.seed
    )
    questions = None
    if cfg.data.question_batch_size:
        qpairs = load_question_pairs(cfg.data, cfg.train.seed)
        questions = PairBatcher(processor=processor, pairs=qpairs, root=cfg.data.folder, seed=cfg.train.seed)
    opt, sched = make_optimizer(model, cfg.optim, cfg.train.steps)
    state: dict[str, Any] = {"bco_mean": 0.0, "bco_count": 0}
    model.train()

    def step_fn(step: int) -> dict[str, Any]:
        idx = C.batch_indices(len(batcher), cfg.data.batch_size, seed=cfg.train.seed, step=step)
        batch = to_device(batcher.batch(idx), device)
        loss, metrics = dpo_step(model, ref, batch, cfg.loss, bco_delta=state["bco_mean"])
        if questions is not None:
            qb = cfg.data.question_batch_size
            qidx = C.batch_indices(len(questions), qb, seed=cfg.train.seed + 1, step=step)
            qloss, qm = dpo_step(model, ref, to_device(questions.batch(qidx), device), cfg.loss)
            loss = loss + qloss
            metrics.update({f"question/{k}": qm[k] for k in QUESTION_METRICS})
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = clip_and_norm(model, cfg.optim.grad_clip)
        opt.step()
        sched.step()
        if cfg.loss.loss_type == "bco_pair":
            b = len(idx)
            state["bco_mean"], state["bco_count"] = bco_running_delta(
                state["bco_mean"], state["bco_count"], metrics["reward_chosen"].expand(b),
                metrics["reward_rejected"].expand(b),
            )  # fmt: skip
        return {
            "loss": float(loss.detach()),
            "grad_norm": grad_norm,
            **{k: float(v) for k, v in metrics.items()},
        }

    from rl.trainers.monitor import failure_warnings

    result = train_loop(
        out=out, config=to_dict(cfg), model=model, optimizer=opt, scheduler=sched, run=cfg.train,
        step_fn=step_fn, desc="dpo" + ("-lora" if cfg.lora.enabled else ""), state=state,
        plot_keys=DPO_PLOT_KEYS, monitor=failure_warnings, resume=resume, show_progress=show_progress,
        stop_after=stop_after,
    )  # fmt: skip
    if stop_after is None or result.step < stop_after:
        save_final(model, processor, out, lora=cfg.lora.enabled)
    return {
        "step": result.step,
        "pairs": len(pairs),
        "pair_kinds": dict(sorted(Counter(pr.kind for pr in pairs).items())),
        "question_pairs": 0 if questions is None else len(questions),
        "reference": ref.kind,
        "train_seconds": round(result.seconds, 3),
        "step_seconds": round(result.step_seconds, 4),
        "last": result.last,
    }

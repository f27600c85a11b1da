"""Preference pairs for ``rl dpo``: read from ``rl pairs`` files or built from the notes, and turned into
right-padded training rows (:class:`PairBatcher`)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from mm.data.format import read_notes
from mm.errors import UserError
from mm.model.processing import IGNORE_INDEX
from mm.train.sft_data import load_note_images
from rl import pairs as preference_pairs
from rl.corrupt import corrupt
from rl.ground_truth import strip_all
from rl.rewards import RewardConfig
from rl.trainers.common import note_pixels
from rl.trainers.dpo_config import DataConfig


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
                self._images[key] = load_note_images(
                    [note], root, processor.image_size, resize=processor.resize, fill=processor.image_mean
                )[0]  # (n, 3, S, S) u8
        self._prompt: dict[tuple[int, str], list[int]] = {}

    def __len__(self) -> int:
        return len(self.pairs)

    def _pixels(self, pair: Any, corruption: dict[str, Any] | None) -> torch.Tensor:
        u8 = self._images[tuple(pair.images)]  # (n, 3, S, S)
        if corruption is None:
            return note_pixels(u8, self.processor)
        unit = corrupt(u8.float() / 255.0, **corruption)  # (n, 3, S, S) in [0, 1]
        return note_pixels((unit * 255.0).round().to(torch.uint8), self.processor)

    def _row(self, pair: Any, text: str, ids: list[int] | None, corruption: dict[str, Any] | None) -> dict:
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
    """The first ``cfg.notes`` notes of ``cfg.split`` in ``cfg.folder``: annotated notes with text, or, with
    ``data.ground_truth: false``, every note stripped of its annotations
    (:func:`rl.ground_truth.strip_ground_truth`: any read of its objects, texts or questions raises)."""
    folder = Path(cfg.folder)
    if not (folder / "notes.jsonl").is_file():
        raise UserError(f"data.folder={folder} has no notes.jsonl; generate notes with `mm data world`")
    if not cfg.ground_truth:
        notes = strip_all(read_notes(folder, split=cfg.split))
    else:
        notes = [n for n in read_notes(folder, split=cfg.split) if n.categories and n.text.strip()]
    return notes[: cfg.notes] if cfg.notes else notes


def load_question_pairs(cfg: DataConfig, seed: int) -> list[Any]:
    """POPE-style yes/no pairs on the configured notes (``data.question_ratio`` / ``question_batch_size``)."""
    pairs = preference_pairs.question_pairs(
        _world_notes(cfg), per_image=1, seed=seed, answer_style=cfg.answer_style
    )
    if not pairs:
        raise UserError(f"no yes/no question pairs from the {cfg.split!r} notes of {cfg.folder}")
    return pairs


def _labeler(cfg: DataConfig, policy: tuple[Any, Any]) -> Any:
    """The labeler VLM of ``cfg.labeler``, on the policy's device."""
    from rl.labeler import Labeler, LabelerConfig

    device = next(policy[0].parameters()).device
    lab_cfg = LabelerConfig(
        answer_style=cfg.answer_style, soft=cfg.labeler_soft, threshold=cfg.labeler_threshold
    )
    return Labeler.from_folder(cfg.labeler, lab_cfg, device=device)


def colour_pairs(cfg: DataConfig, policy: tuple[Any, Any] | None) -> list[Any]:
    """``data.colour_corrections``: colour-correction pairs on the configured notes, the colours to cut
    chosen by ``data.colour_judge``."""
    from rl.pairs import colour_fix

    if policy is None:
        raise ValueError("colour-correction pairs need the policy (model, processor)")
    if cfg.colour_judge == "labeler":
        judge = colour_fix.labeler_colour_judge(
            _labeler(cfg, policy), cfg.folder, threshold=cfg.colour_threshold
        )
    elif cfg.colour_judge == "self":
        judge = colour_fix.self_colour_judge(
            *policy, cfg.folder, prompt=cfg.prompt, threshold=cfg.colour_threshold
        )
    else:
        judge = colour_fix.scene_colour_judge()
    return colour_fix.colour_correction_pairs(
        *policy,
        _world_notes(cfg),
        cfg.folder,
        prompt=cfg.prompt,
        judge=judge,
        with_objects=cfg.ground_truth,
        keep_pairs=cfg.colour_keep_pairs,
    )


def load_pairs(cfg: DataConfig, seed: int, policy: tuple[Any, Any] | None = None) -> list[Any]:
    """The configured pairs: read from ``cfg.pairs`` or built from the notes of ``cfg.split`` (correction
    pairs with ``policy`` = (model, processor))."""
    if cfg.pairs is not None:
        pairs = preference_pairs.read_pairs(cfg.pairs)
    elif cfg.build == "injection":
        pairs = preference_pairs.injection_pairs(_world_notes(cfg), prompt=cfg.prompt, seed=seed)
    elif cfg.build in ("correction", "onpolicy"):
        if policy is None:
            raise ValueError(f"{cfg.build} pairs need the policy (model, processor)")
        if cfg.build == "correction":
            pairs = preference_pairs.correction_pairs(
                *policy, _world_notes(cfg), cfg.folder, prompt=cfg.prompt
            )
        else:
            reward_cfg = RewardConfig(
                hallucination_weight=cfg.hallucination_weight,
                attribute_weight=cfg.attribute_weight,
                attribute_coverage_weight=cfg.attribute_coverage_weight,
            )
            scorer = None
            if cfg.scorer == "labeler":
                from rl.pairs.onpolicy import labeler_scorer

                scorer = labeler_scorer(_labeler(cfg, policy), cfg.folder, reward_cfg)
            pairs = preference_pairs.onpolicy_pairs(
                *policy, _world_notes(cfg), cfg.folder, prompt=cfg.prompt, num_samples=cfg.samples,
                temperature=cfg.temperature, seed=seed,
                reward_cfg=reward_cfg, scorer=scorer,
            )  # fmt: skip
    elif cfg.build == "none":
        pairs = []
    else:
        pairs = preference_pairs.corrupt_pairs(_world_notes(cfg), prompt=cfg.prompt, seed=seed)
    if cfg.colour_corrections:
        pairs = [*pairs, *colour_pairs(cfg, policy)]
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

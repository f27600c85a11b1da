"""Rewards without ground truth for ``rl grpo --prompts``: ``--reward labeler`` or ``--reward rm:DIR``.

The prompt file needs no ``objects`` or ``answer``: each completion is scored from the record's images
and question alone, by the same rewarders as the world form (:mod:`rl.labeler_reward`,
:mod:`rl.trainers.rm_reward`):

- ``labeler``: a caption's claims (the objects it mentions, in ``reward.vocab``: ``auto`` means coco
  here, since there is no ground truth to pick from) verified by a labeler VLM, P(yes) per claim (the
  policy's own starting checkpoint unless ``reward.labeler.model`` names another); a yes/no question's
  answer scored against the labeler's P(yes) for the same question.
- ``rm:DIR``: the Bradley-Terry reward model ``rl rm`` wrote to DIR, one score per completion.

A record is a yes/no question when its ``task`` field is ``"yesno"``, or, without a ``task`` field,
when its question starts with an auxiliary verb (``Is``, ``Are``, ``Does``, ``Can``...; see
:data:`YESNO`); every other record is a caption request.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mm.errors import UserError

YESNO = re.compile(r"^\s*(is|are|am|does|do|did|can|could|was|were|has|have|had|will|would|should)\b", re.I)
"""Questions that open with one of these words are yes/no questions (unless the record sets ``task``)."""

SOURCES = ("labeler", "rm:")
"""``reward.fn`` values (or prefixes) served here."""


def is_sourced(fn: str) -> bool:
    """Whether ``reward.fn`` names a ground-truth-free reward of this module."""
    return fn == "labeler" or (fn.startswith("rm:") and len(fn) > 3)


@dataclass(frozen=True)
class FileRow:
    """A prompt-file record as the rewarders see a prompt: its question, whether it is a yes/no question
    (``label`` not None) and its position in the prompt file."""

    text: str
    """The record's question."""
    label: str | None
    """``"yesno"`` for a yes/no question, None for a caption request."""
    index: int
    """The record's position in the prompt file."""


def is_yesno(record: dict[str, Any], question: str) -> bool:
    """Whether a record is a yes/no question (``task: yesno``, or a question opening like one)."""
    task = record.get("task")
    if task is not None:
        if task not in ("yesno", "caption"):
            raise ValueError(f"task must be 'yesno' or 'caption', got {task!r}")
        return task == "yesno"
    return bool(YESNO.match(question))


def yesno_rows(records: Sequence[Any]) -> list[bool]:
    """Per prompt-file record, whether it is a yes/no question; a bad ``task`` is a one-line error naming
    ``file:line`` (checked before a model is loaded)."""
    out = []
    for r in records:
        try:
            out.append(is_yesno(r.record, r.question))
        except ValueError as e:
            raise UserError(f"{r.where}: {e}") from None
    return out


class SourcedFilesReward:
    """Batched rewards of a rollout: ``score(indices, texts)`` -> ``((N,) rewards, component means)``."""

    def __init__(self, rewarder: Any, records: Sequence[Any], images: Any) -> None:
        self.rewarder, self.records, self.images = rewarder, list(records), images
        self.rows = [FileRow(text=r.question, label="yesno" if yn else None, index=i)
                     for i, (r, yn) in enumerate(zip(self.records, yesno_rows(self.records)))]  # fmt: skip

    def row_images(self, row: FileRow) -> list[Any]:
        """The PIL images of a row's record."""
        return self.images.sample(row.index).images

    def score(self, indices: Sequence[int], texts: Sequence[str]) -> tuple[torch.Tensor, dict[str, float]]:
        """Rewards of ``texts[k]`` answering record ``indices[k]``, and the rewarder's component means."""
        return self.rewarder.score(list(texts), [self.rows[i] for i in indices])


def build_sourced_reward(cfg: Any, *, records: Sequence[Any], images: Any, policy_folder: str,
                         device: Any) -> SourcedFilesReward:  # fmt: skip
    """The ground-truth-free reward of ``cfg`` (:class:`rl.trainers.grpo_files_config.FilesRewardConfig`
    with ``fn`` labeler or rm:DIR) over the prompt file's ``records`` (images from ``images``)."""
    from dataclasses import fields

    from rl.labeler import Labeler
    from rl.labeler_reward import LabelerReward, SourcedRewardConfig
    from rl.rewards import RewardConfig
    from rl.trainers.rm_reward import RewardModelReward

    holder: dict[str, SourcedFilesReward] = {}

    def row_images(row: FileRow) -> list[Any]:
        return holder["reward"].row_images(row)

    if cfg.fn == "labeler":
        weights = {f.name: getattr(cfg, f.name) for f in fields(RewardConfig)}
        weights["vocab"] = "coco" if cfg.vocab == "auto" else cfg.vocab
        sourced = SourcedRewardConfig(**weights, source="labeler", labeler=cfg.labeler)
        labeler = Labeler.from_folder(cfg.labeler.model or policy_folder, cfg.labeler, device=device)
        rewarder: Any = LabelerReward(labeler=labeler, cfg=sourced, images=row_images)
    else:
        rewarder = RewardModelReward.from_folder(cfg.fn[3:], device=device, images=row_images)
    holder["reward"] = SourcedFilesReward(rewarder, records, images)
    return holder["reward"]

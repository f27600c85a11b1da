"""``reward.source: rm:DIR`` for ``rl grpo``: each response's reward is the Bradley-Terry reward model's
score of (the prompt's images and text, the response) (:mod:`rl.trainers.rm_model`). Sequence-level only:
a reward model gives no per-claim credit, so ``algo.mention_credit`` must be 0."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from mm.errors import UserError
from mm.model.adapter import Sample
from rl.labeler_reward import PromptImages
from rl.trainers.rm_model import RewardModel, load_reward_model


class RewardModelReward:
    """Scores GRPO rows (``Prompt`` objects of a ``PromptSet`` whose note images sit under ``root``)."""

    def __init__(self, *, rm: RewardModel, prompts: Any = None, root: str | Path = ".", batch_size: int = 16,
                 images: Callable[[Any], list[Any]] | None = None) -> None:  # fmt: skip
        """``images(row)``: a row's PIL images (default: :class:`PromptImages` of ``prompts`` at ``root``)."""
        self.rm, self.batch_size = rm, batch_size
        self.images = images if images is not None else PromptImages(prompts, root)

    @classmethod
    def from_folder(
        cls, folder: str | Path, *, device: Any, prompts: Any = None, root: str | Path = ".",
        images: Callable[[Any], list[Any]] | None = None,
    ) -> RewardModelReward:  # fmt: skip
        """The reward model ``rl rm`` wrote to ``folder``, scoring ``prompts`` (or rows ``images`` reads)."""
        return cls(rm=load_reward_model(folder, device=device), prompts=prompts, root=root, images=images)

    def score(self, texts: Sequence[str], rows: Sequence[Any]) -> tuple[torch.Tensor, dict[str, float]]:
        """Rewards ``(B*G,)`` and their mean as ``reward_rm``."""
        samples = [Sample(images=self.images(p), text=p.text) for p in rows]
        values = self.rm.score(samples, list(texts), batch_size=self.batch_size)
        return torch.tensor(values, dtype=torch.float32), {"reward_rm": sum(values) / len(values)}

    def credits(self, roll: Any, rows: Sequence[Any], tok: Any) -> torch.Tensor:
        raise UserError("reward.source rm:DIR gives one reward per response, no claim credit; set "
                        "algo.mention_credit=0")  # fmt: skip

"""The rewarder of GRPO's ``reward.source``: the trainer's own scene reward, a labeler VLM
(:mod:`rl.labeler_reward`) or a trained reward model (:mod:`rl.trainers.rm_reward`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rl.labeler import Labeler
from rl.labeler_reward import LabelerReward, SourcedRewardConfig
from rl.trainers.rm_reward import RewardModelReward


def build_rewarder(cfg: SourcedRewardConfig, *, policy_folder: str, prompts: Any, root: str | Path,
                   device: Any, colour_in_sequence: bool = True) -> Any:  # fmt: skip
    """The rewarder of ``cfg.source`` (None for ``scene``: the trainer's own scene reward);
    ``colour_in_sequence``: the labeler's colour terms also in the sequence reward (else credit only)."""
    if cfg.source == "scene":
        return None
    if cfg.source == "labeler":
        folder = cfg.labeler.model or policy_folder
        return LabelerReward(labeler=Labeler.from_folder(folder, cfg.labeler, device=device), prompts=prompts,
                             root=root, cfg=cfg, colour_in_sequence=colour_in_sequence)  # fmt: skip
    return RewardModelReward.from_folder(cfg.source[3:], prompts=prompts, root=root, device=device)

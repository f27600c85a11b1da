"""The no-ground-truth pipeline's side of ``rl pipeline`` (``ground_truth: false``,
``configs/rl/pipeline_nogt.yaml``): the self-feedback wiring of the DPO labeler and the check, before
anything runs, that no post-training stage would read the notes' ground truth.

The pipeline sets ``data.ground_truth=false`` in every post-training stage, so its trainer gets the notes
stripped of their ground truth (:mod:`rl.ground_truth`) and a reward that reads it anyway raises; the check
catches the settings known to need it before anything runs.
"""

from __future__ import annotations

from typing import Any

from mm.errors import UserError


def self_feedback_wiring(name: str, raw: Any, sft_model: str) -> list[str]:
    """Extra wiring overrides of post-training stage ``name`` whose config as written is ``raw``: a DPO
    labeler that names the same folder as ``init.model`` is the policy's own SFT checkpoint
    (self-feedback), so it follows ``init.model`` to the run's ``sft_model``. (GRPO's
    ``reward.labeler.model: ""`` already means the starting checkpoint.)"""
    if name == "dpo" and raw.data.scorer == "labeler" and raw.data.labeler == raw.init.model:
        return [f"data.labeler={sft_model}"]
    return []


def ground_truth_reads(name: str, c: Any) -> list[str]:
    """Why post-training stage ``name`` with config ``c`` would read ground truth (empty: it reads none)."""
    why = []
    if c.data.ground_truth:
        why.append("data.ground_truth=true hands the trainer the notes with their ground truth")
    if name == "dpo":
        d = c.data
        if d.pairs is not None:
            why.append(f"data.pairs={d.pairs}: a pairs file may have been ranked with ground truth")
        if d.build != "onpolicy":
            why.append(f"data.build={d.build} builds pairs from the notes' objects (use onpolicy)")
        if d.scorer != "labeler":
            why.append(f"data.scorer={d.scorer} ranks the samples by the notes' objects (use labeler)")
        if d.question_ratio > 0:
            why.append("data.question_ratio > 0 adds yes/no pairs made from the notes' objects (use 0)")
    elif name == "grpo":
        if c.reward.source == "scene":
            why.append("reward.source=scene scores against the notes' objects (use labeler or rm:DIR)")
        extra = [t for t in c.data.tasks if t != "caption"]
        if extra:
            why.append(f"data.tasks {extra} ask questions made from the notes' objects (use [caption])")
    else:
        why.append(f"{name}: not known to read no ground truth")
    return why


def check_without_ground_truth(configs: dict[str, Any], post: list[str]) -> None:
    """Raise :class:`mm.errors.UserError` listing every post-training setting that would read ground truth."""
    why = [f"{name}: {w}" for name in post for w in ground_truth_reads(name, configs[name])]
    if why:
        raise UserError(
            "ground_truth: false, but post-training would read the notes' ground truth: "
            + "; ".join(why)
            + ". Fix those stage configs (configs/rl/dpo_nogt.yaml and grpo_nogt.yaml are the no-ground-truth"
            " recipes) or set ground_truth: true"
        )

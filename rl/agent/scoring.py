"""Scoring whole trajectories of world tasks: the GRPO reward and the eval's per-task row (pure).

- :func:`final_text`: what a trajectory answered (a dialogue: all its replies; else the answer, "" when
  it was truncated without one).
- :func:`trajectory_reward`: ``score_answer`` (``rl.agent.answers``), minus ``hallucination_weight`` times
  the share of a caption's judged attribute and count claims that are false, plus for dialogues
  ``turn_reward_weight`` times the simulated user's mean turn score, minus ``invalid_call_penalty`` per
  invalid tool call, minus ``truncation_penalty`` when the trajectory ended without an answer.
- :func:`eval_row`: one JSON row per trajectory with what the report's metrics sum over.
"""

from __future__ import annotations

from typing import Any

from rl.agent.answers import caption_units, score_answer
from rl.agent.trajectory import Trajectory

CORRECT = 1.0 - 1e-9
"""A task counts as answered correctly when its score is 1 (every part right)."""
HALLUCINATION_KINDS = ("attribute", "count")
"""Claim kinds whose false share is the caption's hallucination term."""


def final_text(traj: Trajectory) -> str:
    """The text the task is scored on (module docstring)."""
    if traj.task.kind == "dialogue":
        return " ".join(traj.replies) if traj.user_turns else (traj.answer or "")
    return traj.answer or ""


def trajectory_reward(
    traj: Trajectory,
    *,
    invalid_call_penalty: float,
    hallucination_weight: float,
    turn_reward_weight: float,
    truncation_penalty: float = 0.0,
) -> float:
    """The scalar GRPO reward of one trajectory (module docstring)."""
    text = final_text(traj)
    reward = score_answer(traj.task, text)
    if traj.task.kind == "caption" and text:
        units = caption_units(traj.task, text)
        judged = sum(units[k]["judged"] for k in HALLUCINATION_KINDS)
        wrong = sum(units[k]["hallucinated"] for k in HALLUCINATION_KINDS)
        reward -= hallucination_weight * (wrong / judged if judged else 0.0)
    if traj.user_turns and turn_reward_weight:
        reward += turn_reward_weight * sum(u.score for u in traj.user_turns) / len(traj.user_turns)
    if traj.answer is None:
        reward -= truncation_penalty
    return reward - invalid_call_penalty * traj.n_invalid_calls


def eval_row(traj: Trajectory, seed: int) -> dict[str, Any]:
    """What the report sums over for one held-out trajectory."""
    text = final_text(traj)
    score = score_answer(traj.task, text)
    row: dict[str, Any] = {
        "seed": seed,
        "task_id": traj.task.task_id,
        "kind": traj.task.kind,
        "score": score,
        "correct": float(score >= CORRECT),
        "answered": float(traj.answer is not None),
        "calls": len(traj.calls),
        "valid_calls": traj.n_valid_calls,
        "turns": len(traj.turns),
        "truncation": traj.truncation,
    }
    if traj.task.kind == "caption":
        units = caption_units(traj.task, text)
        for k in HALLUCINATION_KINDS:
            row[f"{k}_judged"] = units[k]["judged"]
            row[f"{k}_hallucinated"] = units[k]["hallucinated"]
    if traj.satisfied is not None or traj.task.kind == "dialogue":
        row["goal_reached"] = float(bool(traj.satisfied))
    return row

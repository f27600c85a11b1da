"""Scoring whole trajectories of world tasks: the GRPO reward and the eval's per-task row (pure).

- :func:`final_text`: what a trajectory answered (a dialogue: all its replies; else the answer, "" when
  it was truncated without one).
- :func:`trajectory_reward`: ``score_answer`` (``rl.agent.answers``), minus ``hallucination_weight`` times
  the share of a caption's judged attribute and count claims that are false (and ``count_weight`` times
  the share of its count claims alone), plus for dialogues
  ``turn_reward_weight`` times the simulated user's mean turn score, plus ``zoom_reward_weight`` when the
  first tool call zooms where the answer is (:func:`zoom_on_target`), minus ``invalid_call_penalty`` per
  invalid tool call, minus ``truncation_penalty`` when the trajectory ended without an answer.
- :func:`first_aim` / :func:`zoom_on_target`: where a task's first aiming call went (on target, elsewhere in
  the asked photo, another photo, another thing for a ``find``, no zoom), which tells finding the place
  apart from reading it.
- :func:`eval_row`: one JSON row per trajectory with what the report's metrics sum over.
"""

from __future__ import annotations

import re
from typing import Any

from rl.agent.answers import caption_units, score_answer
from rl.agent.parse import ToolCall
from rl.agent.tools import WHOLE, box_pixels
from rl.agent.trajectory import Trajectory

CORRECT = 1.0 - 1e-9
"""A task counts as answered correctly when its score is 1 (every part right)."""
HALLUCINATION_KINDS = ("attribute", "count")
"""Claim kinds whose false share is the caption's hallucination term."""
ZOOM_COVERAGE = 0.5
"""A zoom is on target when its crop holds at least this share of the answer's box."""


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
    zoom_reward_weight: float = 0.0,
    count_weight: float = 0.0,
) -> float:
    """The scalar GRPO reward of one trajectory (module docstring)."""
    text = final_text(traj)
    reward = score_answer(traj.task, text)
    if traj.task.kind == "caption" and text:
        units = caption_units(traj.task, text)
        judged = sum(units[k]["judged"] for k in HALLUCINATION_KINDS)
        wrong = sum(units[k]["hallucinated"] for k in HALLUCINATION_KINDS)
        reward -= hallucination_weight * (wrong / judged if judged else 0.0)
        if count_weight and units["count"]["judged"]:
            reward -= count_weight * units["count"]["hallucinated"] / units["count"]["judged"]
    if traj.user_turns and turn_reward_weight:
        reward += turn_reward_weight * sum(u.score for u in traj.user_turns) / len(traj.user_turns)
    if zoom_reward_weight:
        reward += zoom_reward_weight * (zoom_on_target(traj) or 0.0)
    if traj.answer is None:
        reward -= truncation_penalty
    return reward - invalid_call_penalty * traj.n_invalid_calls


def _whole_photo(call: Any) -> bool:
    return isinstance(call, ToolCall) and list(call.args.get("box", ())) == WHOLE


AIMS = ("on_target", "other_place", "other_photo", "other_thing", "no_zoom")
"""Where the first aiming call of a task with an asked photo went (:func:`first_aim`)."""


def first_aim(traj: Trajectory) -> str | None:
    """For a task whose ``meta`` names the asked photo (``image``, 1-based) and the answer's box in its
    source pixels (``box``: world detail and caption tasks), where the trajectory's first valid tool call
    that aims went (a zoom or tiles of a whole photo only look at it again, and are passed over):

    - ``on_target``: a ``zoom`` (or another call with an ``image`` and a ``box``, e.g. ``tiles``) of that
      photo whose crop holds at least :data:`ZOOM_COVERAGE` of the box;
    - ``other_place``: a ``zoom`` of that photo whose crop misses the box (finding the place failed);
    - ``other_photo``: a ``zoom`` of another photo (telling the photos apart failed);
    - ``no_zoom``: no valid aiming call, or another tool first.

    A ``find`` without a box aims by what it asks for (``rl.agent.find``): ``on_target`` when it looks at
    that photo (or, without ``image``, at every photo) for the task's ``meta["object"]`` (its name or
    plural among the call's words; any thing when the task names none), ``other_thing`` when it asks
    that photo for something else, ``other_photo`` when it looks at another photo.

    None for other tasks."""
    meta = traj.task.meta
    if "image" not in meta or "box" not in meta:
        return None
    aims = (c.call for c in traj.calls if c.valid and not _whole_photo(c.call))
    call = next(aims, None)
    if isinstance(call, ToolCall) and call.name == "find" and "box" not in call.args:
        return _find_aim(call.args, meta)
    if not isinstance(call, ToolCall) or not {"image", "box"} <= set(call.args):
        return "no_zoom"
    if call.args.get("image") != meta["image"]:
        return "other_photo"
    H, W = traj.task.sources[meta["image"] - 1].shape[:2]
    x0, y0, x1, y1 = box_pixels(call.args["box"], W, H)
    a0, b0, a1, b1 = meta["box"]
    inter = max(0, min(x1, a1) - max(x0, a0)) * max(0, min(y1, b1) - max(y0, b0))
    return "on_target" if inter >= ZOOM_COVERAGE * (a1 - a0) * (b1 - b0) else "other_place"


def _find_aim(args: dict[str, Any], meta: dict[str, Any]) -> str:
    from mm.train.tasks import plural

    if args.get("image", meta["image"]) != meta["image"]:
        return "other_photo"
    asked = re.findall(r"[a-z0-9]+", str(args.get("object", "")).lower())
    thing = meta.get("object")
    return "on_target" if thing is None or {thing, plural(thing)} & set(asked) else "other_thing"


def zoom_on_target(traj: Trajectory) -> float | None:
    """1.0 when the first aiming call is on target (:func:`first_aim`), 0.0 when it is not, None for a
    task without an asked photo and box."""
    aim = first_aim(traj)
    return None if aim is None else float(aim == "on_target")


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
        "photos": len(traj.task.sources),
    }
    if traj.task.kind == "caption":
        units = caption_units(traj.task, text)
        for k in HALLUCINATION_KINDS:
            row[f"{k}_judged"] = units[k]["judged"]
            row[f"{k}_hallucinated"] = units[k]["hallucinated"]
    if traj.satisfied is not None or traj.task.kind == "dialogue":
        row["goal_reached"] = float(bool(traj.satisfied))
    aim = first_aim(traj)
    if aim is not None:
        row["zoom_on_target"] = float(aim == "on_target")
        row["aim"] = aim
    return row

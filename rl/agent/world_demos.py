"""Scripted expert trajectories for the SFT cold start, one per task, from the world's ground truth.

    turns = demonstration(task)        # list[DemoTurn]

A demonstration is a plain list of :class:`DemoTurn`, in order:

- ``role="user"``: a user message (the task's question first; the note's images come with it, as
  the loop presents them). ``policy=False``.
- ``role="assistant"``: the policy's text: either exactly one tool call in the loop's format,
  ``<tool>{"name": "zoom", "image": 2, "box": [x0, y0, x1, y1]}</tool>`` (``call`` holds the parsed
  dict) or ``<tool>{"name": "compare", "images": [1, 2]}</tool>``, or the final answer (``call`` None).
  ``policy=True``: the only turns a loss may train on.
- ``role="tool"``: the observation of the call before it (``call`` repeats it). ``text`` is a reference
  rendering and, for ``zoom``, ``image`` is the crop at full resolution (``(h, w, 3)`` uint8; the loop
  encodes it at the tower's size). ``policy=False``: masked out of the loss. A loop that renders
  observations its own way passes ``run_tool(call, task) -> (text, image | None)`` to
  :func:`demonstration` so demos and rollouts show the same observations.

Scripts: ``detail`` zooms on ``meta["box"]`` in the asked photo, then answers; ``change`` calls
``compare`` on photos 1 and 2, zooms on the changed region in each photo where the object is, then
states the change; ``caption`` zooms on the tray, then gives the reference caption; ``dialogue`` plays
against :class:`rl.agent.simulator.UserSimulator`: zooms on each photo's tray, then answers each slot
the user asks (and only that slot) until the user is satisfied.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mm.world import vocab
from rl.agent.simulator import UserSimulator
from rl.agent.task import AgentTask

RunTool = Callable[[dict, AgentTask], tuple[str, "np.ndarray | None"]]
"""``(call, task) -> (observation text, image or None)``."""


@dataclass(frozen=True)
class DemoTurn:
    """One turn of a demonstration (module docstring)."""

    role: str
    """``user``, ``assistant`` or ``tool``."""
    text: str
    """The turn's text."""
    policy: bool
    """True exactly for the assistant's turns (the tokens a loss trains on)."""
    call: dict | None = None
    """The tool call an assistant turn makes, or the call a tool turn answers."""
    image: np.ndarray | None = None
    """A ``zoom`` observation's crop at full resolution, ``(h, w, 3)`` uint8."""

    def to_json(self) -> dict[str, Any]:
        """The turn as JSON (the image as its shape; it is rebuilt from the call and the task's sources)."""
        return {
            "role": self.role,
            "text": self.text,
            "policy": self.policy,
            "call": self.call,
            "image_shape": None if self.image is None else list(self.image.shape),
        }


def tool_text(call: dict) -> str:
    """``call`` in the loop's format."""
    return f"<tool>{json.dumps(call)}</tool>"


def reference_observation(call: dict, task: AgentTask) -> tuple[str, np.ndarray | None]:
    """This module's rendering of a tool's observation (the loop's own tools may word it otherwise)."""
    if call["name"] == "zoom":
        x0, y0, x1, y1 = call["box"]
        crop = task.sources[call["image"] - 1][y0:y1, x0:x1]
        return f"zoom of image {call['image']}, box [{x0}, {y0}, {x1}, {y1}]:", crop
    if call["name"] == "compare":
        import imgdiff

        a, b = (task.sources[i - 1] for i in call["images"])
        regions = imgdiff.diff(a, b).regions
        if not regions:
            return f"images {call['images'][0]} and {call['images'][1]} are the same", None
        boxes = "; ".join(f"[{r.bbox[0]}, {r.bbox[1]}, {r.bbox[2] + 1}, {r.bbox[3] + 1}]" for r in regions)
        return (
            f"images {call['images'][0]} and {call['images'][1]} differ in {len(regions)} region(s): {boxes}",
            None,
        )
    raise ValueError(f"no reference observation for tool {call['name']!r}; pass run_tool")


def _use(turns: list[DemoTurn], call: dict, task: AgentTask, run_tool: RunTool, lead: str = "") -> None:
    turns.append(DemoTurn("assistant", f"{lead}{tool_text(call)}", True, call))
    text, image = run_tool(call, task)
    turns.append(DemoTurn("tool", text, False, call, image))


def _zoom(image: int, box: list[int]) -> dict[str, Any]:
    return {"name": "zoom", "image": image, "box": [int(v) for v in box]}


def detail_demo(task: AgentTask, run_tool: RunTool) -> list[DemoTurn]:
    m = task.meta
    turns = [DemoTurn("user", task.question, False)]
    _use(
        turns,
        _zoom(m["image"], m["box"]),
        task,
        run_tool,
        "The tray is too small to read here; I'll zoom in. ",
    )
    if m["ask"] == "color":
        answer = f"The tiny {m['object']} is {task.answer}."
    else:
        n = int(task.answer)
        c = vocab.category(m["object"])
        answer = f"There {'is' if n == 1 else 'are'} {n} tiny {c.name if n == 1 else c.plural}."
    turns.append(DemoTurn("assistant", answer, True))
    return turns


def change_demo(task: AgentTask, run_tool: RunTool) -> list[DemoTurn]:
    m = task.meta
    turns = [DemoTurn("user", task.question, False)]
    _use(turns, {"name": "compare", "images": [1, 2]}, task, run_tool, "Let me find what differs. ")
    for image, key in ((1, "before_box"), (2, "after_box")):
        if m[key] is not None:
            _use(turns, _zoom(image, m[key]), task, run_tool)
    turns.append(DemoTurn("assistant", task.answer[0].upper() + task.answer[1:] + ".", True))
    return turns


def caption_demo(task: AgentTask, run_tool: RunTool) -> list[DemoTurn]:
    turns = [DemoTurn("user", task.question, False)]
    _use(turns, _zoom(1, task.meta["box"]), task, run_tool, "First a closer look at the tray. ")
    turns.append(DemoTurn("assistant", task.answer, True))
    return turns


def slot_answer(goal: dict, slot: str) -> str:
    """The expert's reply stating one goal slot."""
    c = vocab.category(goal["object"])
    if slot == "count":
        n = goal["count"]
        return f"There {'is' if n == 1 else 'are'} {n} tiny {c.name if n == 1 else c.plural} in all."
    cols = goal["colors"]
    return f"The tiny {c.plural} are {' and '.join(cols)}." if len(cols) > 1 else f"They are {cols[0]}."


def dialogue_demo(task: AgentTask, run_tool: RunTool, seed: int = 0) -> list[DemoTurn]:
    sim = UserSimulator(task, seed=seed)
    goal = task.meta["goal"]
    turns = [DemoTurn("user", sim.opening(), False)]
    for image, box in task.meta["zooms"]:
        if image in goal["images"]:
            _use(turns, _zoom(image, box), task, run_tool)
    while not sim.done:
        text = slot_answer(goal, sim.asked)
        turns.append(DemoTurn("assistant", text, True))
        turns.append(DemoTurn("user", sim.reply(text).text, False))
    return turns


def demonstration(task: AgentTask, run_tool: RunTool | None = None, *, seed: int = 0) -> list[DemoTurn]:
    """The expert trajectory for ``task`` (module docstring); ``seed`` is the simulator's for dialogues."""
    run = run_tool or reference_observation
    if task.kind == "detail":
        return detail_demo(task, run)
    if task.kind == "change":
        return change_demo(task, run)
    if task.kind == "caption":
        return caption_demo(task, run)
    if task.kind == "dialogue":
        return dialogue_demo(task, run, seed)
    raise ValueError(f"task {task.task_id!r}: no demonstration for kind {task.kind!r}")

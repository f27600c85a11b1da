"""One agent task: a note's full-resolution images, a question, and how the world scores an answer.

    task = AgentTask(task_id="n12/detail/0", kind="detail", sources=(img,), question="What colour ...?",
                     answer="red", meta={"object": "cup"})

The tower sees each image downsampled to its input size; ``sources`` keep the full resolution that
the ``zoom`` tool crops from and the ``compare`` tool diffs. World tasks (``rl.agent.world_tasks``)
and users' task files (``rl.agent.task_file``) build these; the loop (``rl.agent.loop``) only reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

KINDS = ("detail", "change", "dialogue", "caption")
"""World task kinds: a detail legible only after zooming, what changed between two photos, a multi-turn
dialogue with the user simulator, a detail caption scored for hallucination."""
FILE_KINDS = ("qa",)
"""Kinds of tasks read from users' files (``rl.agent.task_file``): a question with accepted answers."""


@dataclass(frozen=True)
class AgentTask:
    """A task for the agent; ``sources[i]`` is note image ``i + 1`` at full resolution."""

    task_id: str
    kind: str
    sources: tuple[np.ndarray, ...]  # each (H, W, 3) uint8
    question: str
    answer: str
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS + FILE_KINDS:
            raise ValueError(f"task {self.task_id!r}: kind {self.kind!r} is not one of {KINDS + FILE_KINDS}")
        if not self.sources:
            raise ValueError(f"task {self.task_id!r} has no images; give at least one source image")
        for i, image in enumerate(self.sources, 1):
            if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
                raise ValueError(
                    f"task {self.task_id!r}: image {i} is {image.dtype} {image.shape}; "
                    "sources must be (H, W, 3) uint8 RGB arrays"
                )

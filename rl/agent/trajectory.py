"""A multi-turn trajectory: the raw ids of prompt, policy turns and observations, and what happened.

Layout of ``ids`` (``response_mask`` under it: 1 exactly on tokens the policy generated)::

    [prompt (images + question)][turn 1][obs 1 (text, image)][turn 2] ... [turn n]
     0 ... 0                     1 ... 1  0 ... 0              1 ... 1     1 ... 1

``logps`` holds each policy token's log-prob at sampling time (0 elsewhere): the ``old_logps`` of a
policy-gradient step. ``images`` holds the model inputs of every image in the order of their
placeholders in ``ids`` (the note's images, then those of each observation: one per zoom, two for
``compare`` with ``zoom``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rl.agent.backend import Segment, join
from rl.agent.parse import ParseError, ToolCall
from rl.agent.task import AgentTask

TRUNCATIONS = ("max_turns", "max_tokens", "turn_tokens", "context")
"""Why a trajectory ended without an answer: out of turns; out of policy tokens; a turn ran to its
token limit without an eos or a tool call; the next turn would not fit the model's context."""


@dataclass(frozen=True)
class CallRecord:
    """One tool call: the turn it came from, the parsed call (or why not), the observation text."""

    turn: int
    call: ToolCall | ParseError
    observation: str
    image_added: bool = False
    """Whether the observation carried an image (or several) into the trajectory."""

    @property
    def valid(self) -> bool:
        return isinstance(self.call, ToolCall)


@dataclass(frozen=True)
class UserTurn:
    """The simulated user's answer to the policy's answer turn ``turn`` (1-based)."""

    turn: int
    text: str
    """The user's next message (thanks or giving up when the dialogue ended)."""
    score: float
    """Turn-level reward of the policy's reply, in [0, 1] (``rl.agent.simulator.SimTurn.score``)."""
    done: bool
    """Whether the dialogue ended here."""


@dataclass
class Trajectory:
    """One rollout of one task (see the module docstring for the layout)."""

    task: AgentTask
    ids: list[int]
    response_mask: list[int]
    logps: list[float]
    images: list[Any]
    extra: dict[str, list[int]] = field(default_factory=dict)
    """Other per-token model inputs, aligned with ``ids`` (e.g. Qwen2-VL's ``mm_token_type_ids``)."""
    prompt_length: int = 0
    turns: list[str] = field(default_factory=list)
    """The decoded text of each policy turn (for parsing and transcripts; the ids are the truth)."""
    calls: list[CallRecord] = field(default_factory=list)
    answer: str | None = None
    """The final turn's text when it ended with eos and no tool call; None when truncated."""
    truncation: str | None = None
    """One of :data:`TRUNCATIONS`, or None when the policy answered."""
    spans: list[tuple[str, int, int]] = field(default_factory=list)
    """(kind, start, end) of every part of ``ids``: kind "prompt", "policy" or "observation"."""
    user_turns: list[UserTurn] = field(default_factory=list)
    """Dialogues: the simulated user's reply to each answer turn (its message is an observation)."""
    satisfied: bool | None = None
    """Dialogues: whether the simulated user ended satisfied (None: not a simulated dialogue)."""
    loss_mask: list[int] | None = None
    """The supervised loss's token mask when it is not ``response_mask``: a demonstration's policy turns
    kept as context but out of the loss (a recovery demonstration's mistake; :meth:`mask_turns`)."""

    @classmethod
    def start(cls, task: AgentTask, prompt: Segment) -> Trajectory:
        n = len(prompt.ids)
        return cls(
            task=task,
            ids=list(prompt.ids),
            response_mask=[0] * n,
            logps=[0.0] * n,
            images=list(prompt.images),
            extra={k: list(v) for k, v in prompt.extra.items()},
            prompt_length=n,
            spans=[("prompt", 0, n)],
        )

    @property
    def segment(self) -> Segment:
        """The whole trajectory as one segment (the next turn's model input)."""
        return Segment(self.ids, self.images, self.extra)

    @property
    def done(self) -> bool:
        return self.answer is not None or self.truncation is not None

    @property
    def policy_tokens(self) -> int:
        return sum(self.response_mask)

    @property
    def replies(self) -> list[str]:
        """The policy turns that were not tool calls (a dialogue's replies; the answer otherwise)."""
        called = {c.turn for c in self.calls}
        return [text for i, text in enumerate(self.turns, 1) if i not in called]

    @property
    def n_valid_calls(self) -> int:
        return sum(c.valid for c in self.calls)

    @property
    def n_invalid_calls(self) -> int:
        return len(self.calls) - self.n_valid_calls

    @property
    def train_mask(self) -> list[int]:
        """The tokens a supervised loss trains on: ``loss_mask`` when set, else ``response_mask``."""
        return self.response_mask if self.loss_mask is None else self.loss_mask

    def mask_turns(self, turns: set[int]) -> None:
        """Take policy turns ``turns`` (0-based, in order) out of the supervised loss (``loss_mask``);
        they stay in ``ids`` as context and in ``response_mask``."""
        policy = [(start, end) for kind, start, end in self.spans if kind == "policy"]
        if any(k < 0 or k >= len(policy) for k in turns):
            raise ValueError(f"turns {sorted(turns)} out of range: {len(policy)} policy turns")
        mask = list(self.train_mask)
        for k in turns:
            start, end = policy[k]
            mask[start:end] = [0] * (end - start)
        self.loss_mask = mask

    def add_policy(self, ids: list[int], logps: list[float], text: str) -> None:
        if len(ids) != len(logps):
            raise ValueError(f"a turn needs one log-prob per token: {len(ids)} ids, {len(logps)} log-probs")
        self._append("policy", Segment(ids), 1, logps)
        self.turns.append(text)

    def add_observation(self, segment: Segment) -> None:
        self._append("observation", segment, 0, [0.0] * len(segment.ids))

    def _append(self, kind: str, segment: Segment, mask: int, logps: list[float]) -> None:
        whole = join([self.segment, segment])
        start = len(self.ids)
        self.ids, self.images, self.extra = whole.ids, whole.images, whole.extra
        self.response_mask += [mask] * len(segment.ids)
        if self.loss_mask is not None:
            self.loss_mask += [mask] * len(segment.ids)
        self.logps += logps
        self.spans.append((kind, start, len(self.ids)))

    def transcript(self) -> str:
        """Question, turns, observations and the outcome, as readable text."""
        lines = [f"[task {self.task.task_id}] {self.task.question}"]
        by_turn = {c.turn: c for c in self.calls}
        users = {u.turn: u for u in self.user_turns}
        for i, text in enumerate(self.turns, 1):
            lines.append(f"[policy {i}] {text}")
            record = by_turn.get(i)
            if record is not None:
                image = " (+image)" if record.image_added else ""
                lines.append(f"[observation {i}] {record.observation}{image}")
            if i in users:
                lines.append(f"[user {i}] {users[i].text} (turn score {users[i].score:.2f})")
        outcome = f"answer: {self.answer}" if self.answer is not None else f"truncated: {self.truncation}"
        if self.satisfied is not None:
            outcome += f"; user {'satisfied' if self.satisfied else 'not satisfied'}"
        lines.append(f"[end] {outcome} (expected: {self.task.answer})")
        return "\n".join(lines)

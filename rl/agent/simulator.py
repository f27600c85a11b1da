"""A user simulator for ``dialogue`` tasks: a hidden goal, questions, follow-ups, objections, an end.

    sim = UserSimulator(task, seed=3)
    user = sim.opening()                      # "How many tiny shells are there in these photos?"
    turn = sim.reply("There are two.")        # SimTurn(text="And what colours are they?", score=1.0, ...)
    while not turn.done: ...                  # the agent answers turn.text, the simulator judges
    sim.turn_scores, sim.satisfied

The goal (``task.meta["goal"]``, written by :mod:`rl.agent.world_tasks`) has two slots: the ``count`` of
the tiny objects of one category across the note's photos and their ``colors``. The simulator asks for
one slot (which first is drawn from the seed), judges each assistant reply on the slot it asked
(:func:`rl.agent.answers.goal_scores`: right count, Jaccard overlap of colour sets), and then:

- the asked slot is right: it is settled (so is the other slot, if the reply also states it rightly);
  the simulator asks the next slot, or thanks and ends **satisfied** when none is left;
- the asked slot is wrong or missing: it objects ("That's not right, look again.") and asks again,
  spending one unit of ``patience``; with no patience left it ends **unsatisfied**;
- after ``max_turns`` replies it ends, satisfied only if every slot is settled.

``SimTurn.score`` is the turn-level reward: the reply's score on the asked slot, in [0, 1]. Wording is
drawn from ``default_rng([seed, crc32(task_id)])``: the same seed and replies give the same dialogue.
The simulator only sees the assistant's text for the turn (tool calls are the loop's business).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from mm.world import vocab
from rl.agent.answers import goal_scores
from rl.agent.task import AgentTask

SLOTS = ("count", "colors")
"""The goal's slots."""

_ASK = {
    "count": (
        "How many tiny {plural} are there in these photos, all together?",
        "Can you count the tiny {plural} across the photos for me?",
        "I'm looking for the tiny {plural}. How many are there in all the photos?",
    ),
    "colors": (
        "What colours are the tiny {plural} in these photos?",
        "Which colours do the tiny {plural} come in, across the photos?",
        "Tell me the colours of the tiny {plural} in these photos.",
    ),
}
_FOLLOW = {
    "count": ("Thanks. And how many of them are there in all?", "Good. Now, how many are there altogether?"),
    "colors": ("Thanks. And what colours are they?", "Good. Which colours are they?"),
}
_OBJECT = (
    "That's not right, look again.",
    "Hmm, that doesn't match what I see. Please look again.",
    "No, I don't think so. Could you check the photos more closely?",
)
_THANKS = ("That's what I needed, thank you!", "Great, thanks.", "Perfect, that's it.")
_GIVE_UP = ("Never mind, I'll check myself.", "Let's leave it; that's still not right.")


@dataclass(kw_only=True)
class SimulatorConfig:
    """How patient the simulated user is."""

    patience: int = 2
    """Wrong replies tolerated; the next wrong one ends the dialogue unsatisfied."""
    max_turns: int = 6
    """Most assistant replies in one dialogue."""

    def __post_init__(self) -> None:
        if self.patience < 0 or self.max_turns < 1:
            raise ValueError(f"need patience >= 0 and max_turns >= 1, got {self.patience}, {self.max_turns}")


@dataclass(frozen=True)
class SimTurn:
    """The simulator's answer to one assistant reply."""

    text: str
    """The user's next message (thanks or giving up when ``done``)."""
    score: float
    """Turn-level reward of the reply just judged, in [0, 1]."""
    done: bool
    """True when the dialogue is over."""
    satisfied: bool
    """True when it ended with every slot settled."""


@dataclass
class UserSimulator:
    """One simulated user with the hidden goal of a ``dialogue`` task (module docstring)."""

    task: AgentTask
    seed: int = 0
    cfg: SimulatorConfig = field(default_factory=SimulatorConfig)

    def __post_init__(self) -> None:
        goal = self.task.meta.get("goal") if self.task.kind == "dialogue" else None
        if not isinstance(goal, dict) or not {"object", "count", "colors"} <= goal.keys():
            raise ValueError(
                f"task {self.task.task_id!r} ({self.task.kind}) has no dialogue goal; the simulator needs "
                "a dialogue task with meta['goal'] = {'object', 'count', 'colors'} (rl.agent.world_tasks)"
            )
        self.goal = goal
        self._rng = np.random.default_rng([self.seed, zlib.crc32(self.task.task_id.encode())])
        order = list(SLOTS) if self._rng.random() < 0.5 else list(reversed(SLOTS))
        self.pending: list[str] = order
        self.patience = self.cfg.patience
        self.turn_scores: list[float] = []
        self.transcript: list[tuple[str, str]] = []
        self.done = False
        self.satisfied = False
        self._opening = self._pick(_ASK[self.pending[0]]).format(plural=vocab.category(goal["object"]).plural)
        self.transcript.append(("user", self._opening))

    def _pick(self, options: tuple[str, ...]) -> str:
        return options[int(self._rng.integers(len(options)))]

    def opening(self) -> str:
        """The user's first message."""
        return self._opening

    @property
    def asked(self) -> str | None:
        """The slot the last user message asked, None when the dialogue is over."""
        return None if self.done else self.pending[0]

    def reply(self, assistant_text: str) -> SimTurn:
        """Judge the assistant's reply to the last user message; the user's next message."""
        if self.done:
            raise RuntimeError(
                f"dialogue {self.task.task_id!r} is over; start a new UserSimulator to talk again"
            )
        self.transcript.append(("assistant", assistant_text))
        scores = goal_scores(self.goal, assistant_text)
        slot = self.pending[0]
        score = scores[slot]
        self.turn_scores.append(score)
        if score == 1.0:
            self.pending = [s for s in self.pending[1:] if scores[s] < 1.0]
            if not self.pending:
                return self._end(self._pick(_THANKS), score, satisfied=True)
            text = self._pick(_FOLLOW[self.pending[0]])
        elif self.patience == 0:
            return self._end(self._pick(_GIVE_UP), score, satisfied=False)
        else:
            self.patience -= 1
            text = self._pick(_OBJECT)
        if len(self.turn_scores) >= self.cfg.max_turns:
            return self._end(self._pick(_GIVE_UP), score, satisfied=False)
        self.transcript.append(("user", text))
        return SimTurn(text=text, score=score, done=False, satisfied=False)

    def _end(self, text: str, score: float, *, satisfied: bool) -> SimTurn:
        self.done, self.satisfied = True, satisfied
        self.transcript.append(("user", text))
        return SimTurn(text=text, score=score, done=True, satisfied=satisfied)

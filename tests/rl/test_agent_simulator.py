"""The user simulator: asks, follows up, objects, ends satisfied or out of patience; seeded."""

from __future__ import annotations

import numpy as np
import pytest

from rl.agent.simulator import SimulatorConfig, UserSimulator
from rl.agent.task import AgentTask
from rl.agent.world_tasks import WorldTaskConfig, world_task

GOAL = {"object": "shell", "count": 3, "colors": ["green", "red"], "images": [1, 2]}


def _task(task_id: str = "n/dialogue") -> AgentTask:
    img = np.zeros((8, 8, 3), np.uint8)
    return AgentTask(task_id, "dialogue", (img,), "", "", {"goal": GOAL})


def _right(slot: str) -> str:
    return "There are three tiny shells." if slot == "count" else "They are green and red."


def test_right_answers_satisfy_in_two_turns():
    sim = UserSimulator(_task(), seed=0)
    assert "shells" in sim.opening()
    first = sim.asked
    turn = sim.reply(_right(first))
    assert (turn.score, turn.done) == (1.0, False)
    assert sim.asked != first
    turn = sim.reply(_right(sim.asked))
    assert turn.done and turn.satisfied and sim.satisfied
    assert sim.turn_scores == [1.0, 1.0]
    with pytest.raises(RuntimeError, match="over"):
        sim.reply("more")


def test_both_slots_at_once_end_the_dialogue():
    sim = UserSimulator(_task(), seed=1)
    turn = sim.reply("There are 3 tiny shells, green and red.")
    assert turn.done and turn.satisfied and sim.turn_scores == [1.0]


def test_wrong_answer_draws_an_objection_then_patience_runs_out():
    sim = UserSimulator(_task(), seed=0, cfg=SimulatorConfig(patience=1))
    wrong = "There are five tiny shells, all blue."
    turn = sim.reply(wrong)
    assert not turn.done and turn.score == 0.0
    assert "look again" in turn.text.lower() or "check" in turn.text.lower() or "match" in turn.text.lower()
    turn = sim.reply(wrong)
    assert turn.done and not turn.satisfied
    assert sim.turn_scores == [0.0, 0.0]


def test_objection_then_correction_is_satisfied_with_per_turn_scores():
    sim = UserSimulator(_task(), seed=0)
    sim.reply("I have no idea.")
    sim.reply(_right(sim.asked))
    turn = sim.reply(_right(sim.asked))
    assert turn.satisfied and sim.turn_scores == [0.0, 1.0, 1.0]
    roles = [r for r, _ in sim.transcript]
    assert roles == ["user", "assistant", "user", "assistant", "user", "assistant", "user"]


def test_partial_colours_score_between_zero_and_one():
    sim = UserSimulator(_task(), seed=0)
    while sim.asked != "colors":
        sim.reply(_right(sim.asked))
    turn = sim.reply("They are red.")
    assert turn.score == pytest.approx(0.5) and not turn.done


def test_max_turns_ends_the_dialogue():
    sim = UserSimulator(_task(), seed=0, cfg=SimulatorConfig(patience=10, max_turns=3))
    turns = [sim.reply("no idea") for _ in range(3)]
    assert [t.done for t in turns] == [False, False, True] and not sim.satisfied


def _dialogue(seed: int, task: AgentTask) -> list[tuple[str, str]]:
    sim = UserSimulator(task, seed=seed)
    for text in ("no idea", "There are 3.", "They are green and red.", "3", "green and red"):
        if sim.done:
            break
        sim.reply(text)
    return sim.transcript


def test_deterministic_for_a_seed():
    task = world_task(WorldTaskConfig(seed=0), "dialogue", 3)
    assert task.question == UserSimulator(task, seed=0).opening()
    assert _dialogue(4, task) == _dialogue(4, task)
    runs = {tuple(_dialogue(s, _task(f"n{s}/dialogue"))) for s in range(8)}
    assert len(runs) > 1  # wording and slot order vary with the seed


def test_needs_a_dialogue_goal():
    img = np.zeros((8, 8, 3), np.uint8)
    with pytest.raises(ValueError, match="goal"):
        UserSimulator(AgentTask("x", "detail", (img,), "q", "a", {}))
    with pytest.raises(ValueError, match="patience"):
        SimulatorConfig(patience=-1)

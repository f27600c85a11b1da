"""The copy probe's pure parts: reading a call's object, naming a category, and the absent-thing question."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.helpers.bench import load_benchmark


@pytest.fixture(scope="module")
def cp():
    return load_benchmark("copy_probe")


def test_called_object_and_names(cp):
    turn = '<tool>{"name": "find", "image": 2, "object": "the tiny mice"}</tool>'
    assert cp.called_object(turn) == "the tiny mice" and cp.called_object("It is red.") is None
    assert cp.names("the tiny mice", "mouse") and cp.names("the tiny mouse", "mouse")
    assert not cp.names("the tiny mousepads", "mouse") and not cp.names(None, "mouse")


def test_absent_question_asks_a_thing_not_on_the_tray_in_the_questions_form(cp):
    tiny = [["mouse", "red", 0, 0], ["cup", "blue", 0, 0]]
    count = SimpleNamespace(question="How many tiny mice are on the tray in photo 2?",
                            meta={"ask": "count", "object": "mouse", "tiny": tiny})  # fmt: skip
    colour = SimpleNamespace(question="What colour is the tiny mouse on the tray in the photo?",
                             meta={"ask": "color", "object": "mouse", "tiny": tiny})  # fmt: skip
    rng = np.random.default_rng(0)
    for _ in range(5):
        q, new = cp.absent_question(count, ["cup", "mouse", "knife"], rng)
        assert new == "knife" and q == "How many tiny knives are on the tray in photo 2?"
    q, new = cp.absent_question(colour, ["cup", "mouse", "knife"], rng)
    assert q == "What colour is the tiny knife on the tray in the photo?"

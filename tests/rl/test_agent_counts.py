"""Counts that quote the tools (rl.agent.counts): the phrases an observation states, the check of a turn so
far, the decode-time constraint on a real model's generate and its log-probs, and the settings."""

from __future__ import annotations

import pytest
import torch

from rl.agent.backend import NoteVLMBackend, Sampling
from rl.agent.counts import CountProcessor, allows, count_phrases, is_open, number_tokens
from rl.agent.quote import token_pieces
from tests.rl.agent_helpers import note_images, pushed_notevlm, tiny_notevlm

TALLY = '4 matches for "tiny" in image 1 of 1 (a tiny mouse, two tiny pencils and a tiny keyboard): (+image)'
QUESTION = "Describe this photo in detail."


def test_count_phrases_run_from_a_number_word_to_the_next_punctuation_or_and():
    assert count_phrases(TALLY) == {"two tiny pencils"}
    assert count_phrases("Three  Tiny cups, twelve forks; ten-ish things or two\n") == {
        "three tiny cups",
        "twelve forks",
        "two",
    }
    assert (
        count_phrases("2 matches, one fork, a knife, network, twofold") == set()
    )  # digits, one, inside words


@pytest.mark.parametrize(
    "turn, ok, open_",
    [
        ("On the tray are a tiny blue mouse and a tiny", True, False),  # no number word
        ("On the tray are a tiny blue mouse, two", True, True),
        ("two tiny pen", True, True),
        ("two tiny pencils", True, True),  # a whole phrase, not yet ended
        ("two tiny pencils (orange and", True, False),  # ended: free
        ("two tiny pencilss", False, True),
        ("Two tiny notebooks", False, True),
        ("three", False, True),  # no observed phrase starts with it
        ("There are 2 tiny notebooks.", True, False),  # digits are free
        ('<tool>{"name": "find", "object": "three tiny', True, False),  # inside a call
        ("two tiny pencils and three", False, True),  # each phrase is checked
        ("two tiny two", False, True),  # a phrase left unfinished
        ("two tiny pencils and two tiny", True, True),
    ],
)
def test_allows_checks_the_turns_last_count_phrase(turn, ok, open_):
    phrases = count_phrases(TALLY)
    assert allows(turn, phrases) is ok
    assert is_open(turn, phrases) is open_


def test_number_tokens_are_the_tokens_that_can_end_a_number_word():
    backend = NoteVLMBackend(tiny_notevlm())
    pieces = token_pieces(backend.tokenizer)
    numbers = set(number_tokens(pieces))
    assert {backend.text_ids(" two")[0], backend.text_ids(" three")[0]} <= numbers
    assert backend.text_ids(" tiny")[0] not in numbers and backend.text_ids(" pencils")[0] not in numbers
    assert all(allows(p, set()) for t, p in enumerate(pieces) if t not in numbers)  # the rest never open one


def test_processor_masks_tokens_that_break_the_phrase_and_keeps_the_raw_scores():
    backend = NoteVLMBackend(tiny_notevlm())
    pieces = token_pieces(backend.tokenizer)
    proc = CountProcessor(backend.decode, pieces, 0, [TALLY, ""], number_tokens(pieces))
    head = backend.text_ids("On the tray are two tiny")
    raw = torch.randn(2, len(backend.tokenizer) + 7)  # (2, V) wider than the tokenizer, as a padded head
    before = raw.clone()
    out = proc(torch.tensor([head, head]), raw)  # row 1 has no observed phrase at all
    assert torch.equal(raw, before)  # the raw logits generate records are untouched
    kept = [t for t in range(len(pieces)) if out[0, t] > float("-inf")]
    assert kept and all("pencils".startswith(pieces[t].lstrip()) for t in kept)
    assert torch.equal(out[0, kept], raw[0, kept])
    assert out[1].isinf().sum() == 0  # nothing can continue "two tiny" there: left as it is
    start = proc(torch.tensor([backend.text_ids("On the tray are")] * 2), raw.clone())  # (2, V)
    two, three, tiny = (backend.text_ids(w)[0] for w in (" two", " three", " tiny"))
    assert (
        start[0, two] == raw[0, two] and start[0, three] == float("-inf") and start[0, tiny] == raw[0, tiny]
    )
    assert start[1, two] == float("-inf")  # no tool stated "two"


def test_generate_copies_the_tools_count_where_the_model_would_write_another():
    """A real tiny model pushed to write "two tiny notebooks"; with the observation's tally the phrase
    becomes the tally's, and the recorded log-probs are the unconstrained model's."""
    from rl.agent.loop import trajectory_batch
    from rl.agent.task import AgentTask
    from rl.agent.trajectory import Trajectory

    answer = "On the tray are two tiny notebooks."

    backend = pushed_notevlm(answer)
    task = AgentTask("t0", "caption", note_images(1), QUESTION, "")
    row = backend.prompt(task.sources, QUESTION)
    free = backend.generate([row], max_new_tokens=12, sampling=Sampling())[0]
    assert free.text.startswith(answer)
    turn = backend.generate([row], max_new_tokens=12, sampling=Sampling(), tool_texts=[TALLY])[0]
    assert turn.text.startswith("On the tray are two tiny pencils")
    traj = Trajectory.start(task, row)
    traj.add_policy(turn.ids, turn.logps, turn.text)
    batch, old = trajectory_batch(backend, [traj])  # (1, T) inputs, sampling-time log-probs
    logps, mask = backend.adapter.token_logps(batch)  # (1, T): one forward, no constraint
    assert torch.allclose(logps[mask.bool()], old[mask.bool()], atol=1e-4)
    with pytest.raises(ValueError, match="one tool text per row"):
        backend.generate([row], max_new_tokens=4, sampling=Sampling(), tool_texts=[])


def test_rollout_passes_each_trajectorys_tool_text_when_counts_is_on():
    from rl.agent.loop import LoopConfig, rollout
    from rl.agent.task import AgentTask
    from rl.agent.tools import ToolRegistry

    seen = []

    class Spy(NoteVLMBackend):
        def generate(self, rows, *, max_new_tokens, sampling, tool_texts=None, **kw):
            seen.append(tool_texts)
            return super().generate(rows, max_new_tokens=2, sampling=sampling)

    tasks = [AgentTask("t0", "caption", note_images(1), QUESTION, "")]
    rollout(Spy(tiny_notevlm()), tasks, LoopConfig(max_turns=1, counts=True), registry=ToolRegistry())
    rollout(Spy(tiny_notevlm()), tasks, LoopConfig(max_turns=1), registry=ToolRegistry())
    assert seen == [[""], None]  # no call yet: nothing stated


def test_tool_text_joins_the_observations():
    from rl.agent.backend import Segment
    from rl.agent.loop import tool_text
    from rl.agent.task import AgentTask
    from rl.agent.trajectory import CallRecord, Trajectory

    traj = Trajectory.start(AgentTask("t0", "caption", note_images(1), QUESTION, ""), Segment([1], [], {}))
    traj.calls += [CallRecord(1, None, TALLY), CallRecord(2, None, "2 matches (two tiny cups)")]
    assert tool_text(traj) == TALLY + "\n2 matches (two tiny cups)"


def test_decode_counts_setting_and_the_eval_rows_settings():
    from mm.config import ConfigError, load_config
    from rl.agent.config import AgentRunConfig
    from rl.agent.run import row_settings
    from rl.agent.stages import loop_config

    cfg = load_config(AgentRunConfig, None, ["decode.counts=true", "decode.quote={find: [object]}"])
    assert row_settings(cfg)["decode"] == {"quote": {"find": ["object"]}, "counts": True}
    quoted = load_config(AgentRunConfig, None, ["decode.quote={find: [object]}"])
    assert row_settings(quoted)["decode"] == {"quote": {"find": ["object"]}}  # rows from before counts: valid
    assert loop_config(cfg, tools=True).counts and not loop_config(cfg, tools=False).counts
    with pytest.raises(ConfigError, match="counts"):
        load_config(AgentRunConfig, None, ["decode.counts=3"])

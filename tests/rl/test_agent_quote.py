"""Tool arguments that quote the user (rl.agent.quote): the allowed values, the decode-time constraint on a
real model's generate, its log-probs, and the settings that turn it on."""

from __future__ import annotations

import json

import pytest
import torch

from mm.errors import UserError
from rl.agent.backend import NoteVLMBackend, Sampling
from rl.agent.quote import QuoteProcessor, QuoteTrie, check_quote, open_value, quote_of, quotes, token_pieces
from rl.agent.tools import ToolRegistry
from tests.rl.agent_helpers import note_images, pushed_notevlm, tiny_notevlm

QUESTION = "How many tiny mice are on the tray in photo 2?"


def test_quotes_are_runs_of_the_users_words_after_an_optional_article():
    q = quotes("How many tiny mice?", max_words=2)
    assert {"tiny mice", "the tiny mice", "a mice", "mice", "How many", "how many", "an how"} <= q
    assert "How many tiny" not in q  # three words
    assert "the tiny notebooks" not in q and "tiny" in q and "the" not in q
    assert len(quotes("")) == 0


def test_trie_allows_continuations_of_a_quote_and_anything_after_it_closes():
    trie = QuoteTrie(quotes(QUESTION))
    node = trie.node("the tiny ")
    assert node is not None and trie.node("the tiny n") is None
    assert QuoteTrie.allows(node, "mice") and QuoteTrie.allows(node, "m")
    assert not QuoteTrie.allows(node, "notebooks") and not QuoteTrie.allows(node, 'mouse"')
    assert QuoteTrie.allows(trie.node("the tiny mice"), '"}')  # closes: the rest of the call is free
    assert QuoteTrie.allows(trie.node("the tiny mice"), '", "box": [0')
    assert QuoteTrie.allows(trie.node("the tiny"), '"')  # "the tiny" is a quote too
    assert not QuoteTrie.allows(trie.node("the tin"), '"')


@pytest.mark.parametrize(
    "text, value",
    [
        ('<tool>{"name": "find", "image": 2, "object": "the ti', "the ti"),
        ('<tool>{"name": "find", "object": "', ""),
        ('<tool>{"name": "find", "object": "mice", "image": 2', None),  # closed
        ('<tool>{"name": "zoom", "object": "the ti', None),  # not a quoted tool
        ('<tool>{"object": "the ti', None),  # the tool is not known yet
        ('<tool>{"name": "find", "object": "mice"}</tool> then "object": "x', None),  # the call is over
        ('Answer: the "object": "x', None),  # no call
    ],
)
def test_open_value_finds_a_quoted_argument_being_written(text, value):
    assert open_value(text, {"find": ["object"]}) == value


def test_quote_settings_are_checked_against_the_tools():
    schema = {
        "type": "object",
        "properties": {"image": {"type": "integer"}, "object": {"type": "string"}},
        "required": ["object"],
    }  # find's, without importing rl.agent.find (that registers it in TOOLS for every later test)
    registry = ToolRegistry()
    registry.register("find", lambda task, **args: "", schema)
    check_quote({"find": ["object"]}, registry)
    with pytest.raises(UserError, match="no loaded module registers"):
        check_quote({"fnd": ["object"]}, registry)
    with pytest.raises(UserError, match="no string argument 'image'"):
        check_quote({"find": ["image"]}, registry)
    assert quote_of(["find.object", "find.label", "ocr.text"]) == {
        "find": ["object", "label"],
        "ocr": ["text"],
    }
    with pytest.raises(UserError, match="TOOL.ARG"):
        quote_of(["find"])


def test_decode_quote_config_rejects_a_tool_without_arguments():
    from mm.config import ConfigError, load_config
    from rl.agent.config import AgentRunConfig

    with pytest.raises(ConfigError, match="decode.quote"):
        load_config(AgentRunConfig, None, ["decode.quote={find: []}"])
    cfg = load_config(AgentRunConfig, None, ["decode.quote={find: [object]}"])
    assert cfg.decode.quote == {"find": ["object"]}


def _pieces_processor(backend, user_texts, prompt_length=0):
    return QuoteProcessor(
        backend.decode, token_pieces(backend.tokenizer), prompt_length, user_texts, {"find": ["x"]}
    )


def test_processor_masks_every_token_that_leaves_the_quotes_and_keeps_the_raw_scores():
    backend = NoteVLMBackend(tiny_notevlm())
    head = backend.text_ids('<tool>{"name": "find", "x": "the tiny')
    proc = _pieces_processor(backend, [QUESTION, "What colour is the tiny notebook?"])
    ids = torch.tensor([head, head])  # (2, t)
    raw = torch.randn(2, len(backend.tokenizer) + 7)  # (2, V) wider than the tokenizer, as a padded head
    before = raw.clone()
    out = proc(ids, raw)
    assert torch.equal(raw, before)  # the raw logits generate records are untouched
    pieces = token_pieces(backend.tokenizer)
    for b, word in enumerate(("mice", "notebook")):
        kept = [t for t in range(out.shape[1]) if out[b, t] > float("-inf")]
        assert kept and all(word.startswith(pieces[t].lstrip()) or pieces[t] == '"' for t in kept)
        assert all(pieces[t].startswith(" ") for t in kept if pieces[t] != '"')  # a word after "tiny"
        assert torch.equal(out[b, kept], raw[b, kept])
    free = proc(torch.tensor([backend.text_ids("It is red")]), raw[:1].clone())  # not in a call
    assert torch.equal(free, raw[:1])


def test_generate_quotes_the_question_where_the_model_would_name_something_else():
    """A real tiny model pushed to write a find call for "the tiny notebooks"; with the quote constraint the
    value becomes words of the question, and the recorded log-probs are the unconstrained model's."""
    from rl.agent.loop import trajectory_batch
    from rl.agent.task import AgentTask
    from rl.agent.trajectory import Trajectory

    call = '<tool>{"name": "find", "image": 2, "object": "the tiny notebooks"}</tool>'

    backend = pushed_notevlm(call)
    task = AgentTask("t0", "detail", note_images(2), QUESTION, "2")
    row = backend.prompt(task.sources, QUESTION)
    free = backend.generate([row], max_new_tokens=60, sampling=Sampling())[0]
    assert free.text == call
    turn = backend.generate(
        [row], max_new_tokens=60, sampling=Sampling(), quote={"find": ["object"]}, user_texts=[QUESTION]
    )[0]
    said = turn.text.split('"object": "')[1].split('"')[0]
    assert said in quotes(QUESTION) and said.startswith("the tiny ")  # the push, then the user's words
    traj = Trajectory.start(task, row)
    traj.add_policy(turn.ids, turn.logps, turn.text)
    batch, old = trajectory_batch(backend, [traj])  # (1, T) inputs, sampling-time log-probs
    logps, mask = backend.adapter.token_logps(batch)  # (1, T): one forward, no constraint
    assert mask.sum() == len(turn.ids)
    assert torch.allclose(logps[mask.bool()], old[mask.bool()], atol=1e-4)
    with pytest.raises(ValueError, match="one user text per row"):
        backend.generate([row], max_new_tokens=4, sampling=Sampling(), quote={"find": ["object"]})


def test_rollout_passes_each_trajectorys_user_text():
    from rl.agent.loop import LoopConfig, rollout, user_text
    from rl.agent.task import AgentTask

    seen = []

    class Spy(NoteVLMBackend):
        def generate(self, rows, *, max_new_tokens, sampling, quote=None, user_texts=None):
            seen.append((quote, list(user_texts)))
            return super().generate(rows, max_new_tokens=2, sampling=sampling)

    tasks = [AgentTask(f"t{i}", "detail", note_images(1), q, "1") for i, q in enumerate((QUESTION, "Hi?"))]
    trajs = rollout(Spy(tiny_notevlm()), tasks, LoopConfig(max_turns=1, quote={"find": ["object"]}),
                    registry=ToolRegistry())  # fmt: skip
    assert seen[0] == ({"find": ["object"]}, [QUESTION, "Hi?"])
    assert user_text(trajs[0]) == QUESTION


def test_decode_is_a_late_section_and_part_of_the_eval_rows_settings(tmp_path):
    """decode may change until GRPO has trained (the run's SFT models are kept, GRPO and the eval run
    again); the eval rows of a constrained run are not taken for a free run's."""
    from mm.config import load_config
    from mm.errors import UserError
    from rl.agent.config import AgentRunConfig
    from rl.agent.run import check_training_config, result_path, row_settings

    free = load_config(AgentRunConfig, None, [])
    quoted = load_config(AgentRunConfig, None, ["decode.quote={find: [object]}"])
    assert "decode" not in row_settings(free) and row_settings(quoted)["decode"] == {
        "quote": {"find": ["object"]}
    }
    check_training_config(free, tmp_path)
    result_path(tmp_path, "grpo").parent.mkdir(parents=True)
    result_path(tmp_path, "grpo").write_text("{}")  # a finished GRPO of the free run
    check_training_config(quoted, tmp_path)  # GRPO never trained: taken, its result forgotten
    assert not result_path(tmp_path, "grpo").exists()
    assert json.loads((tmp_path / "training_config.json").read_text())["decode"]["quote"] == {
        "find": ["object"]
    }
    (tmp_path / "grpo" / "metrics.jsonl").write_text("{}\n")  # now it has trained
    with pytest.raises(UserError, match="other decode settings"):
        check_training_config(free, tmp_path)

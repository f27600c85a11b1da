"""The project tokenizer: shipped files equal a fresh deterministic build; compact; chat template."""

import filecmp

import pytest

from mm.data.tokenizer import DEFAULT_PATH, SPECIAL_TOKENS, build_tokenizer, load_tokenizer, save_tokenizer
from mm.errors import UserError
from mm.world.config import WorldConfig
from mm.world.generate import generate_notes


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_shipped_files_equal_a_fresh_build(tmp_path):
    names = save_tokenizer(build_tokenizer(), tmp_path)
    assert "tokenizer.json" in names
    for name in names:
        assert filecmp.cmp(tmp_path / name, DEFAULT_PATH / name, shallow=False), (
            f"{name} differs; rebuild assets"
        )


def test_special_tokens_and_ids(tok):
    assert tok.convert_tokens_to_ids(list(SPECIAL_TOKENS)) == list(range(len(SPECIAL_TOKENS)))
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    assert 1000 <= len(tok) <= 4096
    ids = tok("A fork.")["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[-1] == tok.eos_token_id
    assert tok("<image><image>hi", add_special_tokens=False)["input_ids"][:2] == [4, 4]


def test_world_text_is_compact_and_round_trips(tok):
    words = pieces = 0
    for n in generate_notes(WorldConfig(notes=100, seed=99)):  # notes not in the training corpus
        for text in [n.text, *n.image_captions]:
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert tok.decode(ids) == text
            words += len(text.split())
            pieces += len(ids)
    assert pieces / words < 1.4  # punctuation is its own token; words are one
    for word in ("knives", "toothbrushes", "mice", "streetlight", "purple", "bottom"):
        assert len(tok(" " + word, add_special_tokens=False)["input_ids"]) == 1, word
    odd = "naïve 🙂 text"
    assert tok.decode(tok(odd, add_special_tokens=False)["input_ids"]) == odd  # byte level: no <unk>


def test_chat_template(tok):
    msgs = [
        {"role": "user", "content": "<image>Describe the note."},
        {"role": "assistant", "content": "A fork."},
    ]
    assert tok.apply_chat_template(msgs, tokenize=False) == (
        "<bos><|user|><image>Describe the note.<|end|><|assistant|>A fork.<eos>"
    )
    prompt = tok.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True)
    assert prompt.endswith("<|end|><|assistant|>")


def test_load_missing_path_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="no tokenizer at"):
        load_tokenizer(tmp_path)

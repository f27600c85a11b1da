"""``policy.init`` with a NoteVLM trained on notes: its limits raised for the agent (same weights, same
logits), refused where a weight is sized by them, bad overrides and tokenizers are errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mm.config import load_config
from mm.errors import UserError
from rl.agent.config import AgentRunConfig
from rl.agent.policy_init import check_agent_texts, load_policy, parse_limits, widen_notevlm
from rl.agent.stages import build_backend
from tests.helpers.model import IMAGE_SIZE, K, tiny_config, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs/rl/agent_tiny.yaml"


def note_model(max_images: int = 4, positions: int = 256, index_embeddings: bool = False):
    """A NoteVLM adapter as ``mm train`` leaves one: 4 images, 256 positions, the shipped tokenizer."""
    from mm.data.tokenizer import load_tokenizer
    from mm.model import NoteProcessor, NoteVLMForConditionalGeneration
    from mm.model.adapter.notevlm import NoteVLMAdapter

    tok = load_tokenizer()
    text = dict(tiny_config().text_config.to_dict())
    text.update(vocab_size=len(tok), max_position_embeddings=positions)
    config = tiny_config(
        text_config=text, image_token_id=tok.convert_tokens_to_ids("<image>"), max_images=max_images,
        image_index_embeddings=index_embeddings,
    )  # fmt: skip
    torch.manual_seed(0)
    model = NoteVLMForConditionalGeneration(config).eval()
    model.generation_config.suppress_tokens = [config.image_token_id]
    proc = NoteProcessor(
        tokenizer=tok, image_size=IMAGE_SIZE, tokens_per_image=K, max_length=positions, max_images=max_images
    )
    return NoteVLMAdapter(model=model, processor=proc)


def _logits(adapter, n_images: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    images = [torch.rand(3, IMAGE_SIZE, IMAGE_SIZE, generator=g) for _ in range(n_images)]
    batch = adapter.processor.collate([adapter.processor.encode(images, "what colour is the cup")])
    with torch.no_grad():
        return adapter.model(**batch).logits  # (1, T, V)


def test_widened_model_keeps_weights_and_logits_and_raises_limits():
    loaded = note_model()
    wide = widen_notevlm(loaded, max_images=8, max_length=1024)
    cfg, proc = wide.base_model.config, wide.processor
    assert (cfg.max_images, proc.max_images, proc.max_length) == (8, 8, 1024)
    assert cfg.text_config.max_position_embeddings == 1024
    assert wide.model.generation_config.suppress_tokens == loaded.model.generation_config.suppress_tokens
    mine, theirs = loaded.model.state_dict(), wide.model.state_dict()
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert torch.allclose(_logits(loaded, 3), _logits(wide, 3), atol=1e-6)
    # the loaded adapter is untouched, and the widened one takes more images than it could
    assert (loaded.base_model.config.max_images, loaded.processor.max_length) == (4, 256)
    assert _logits(wide, 6).shape[0] == 1
    with pytest.raises(UserError, match="1..4 images"):
        _logits(loaded, 6)


def test_limits_are_raised_never_lowered():
    wide = widen_notevlm(note_model(max_images=6, positions=512), max_images=2, max_length=128)
    assert (wide.base_model.config.max_images, wide.processor.max_length) == (6, 512)
    assert wide.base_model.config.text_config.max_position_embeddings == 512


def test_weights_sized_by_max_images_are_refused():
    loaded = note_model(index_embeddings=True)
    with pytest.raises(UserError, match=r"would change its weights \(model\.image_index.*add image_index"):
        widen_notevlm(loaded, max_images=8)
    assert widen_notevlm(loaded, max_length=512).processor.max_length == 512  # no weight sized by length


def test_index_embeddings_added_to_a_loaded_model_are_fresh_rows_and_keep_every_weight():
    loaded = note_model()
    rng = torch.get_rng_state()
    wide = widen_notevlm(loaded, max_images=8, image_index_embeddings=True, seed=3)
    assert torch.equal(torch.get_rng_state(), rng)  # drawn apart from the global stream
    mine, theirs = loaded.model.state_dict(), wide.model.state_dict()
    assert set(theirs) - set(mine) == {"model.image_index.weight"}
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)
    rows = theirs["model.image_index.weight"]
    assert rows.shape == (8, loaded.base_model.config.text_config.hidden_size)
    assert 0.01 < float(rows.std()) < 0.03  # N(0, 0.02^2)
    again = widen_notevlm(loaded, max_images=8, image_index_embeddings=True, seed=3)
    other = widen_notevlm(loaded, max_images=8, image_index_embeddings=True, seed=4)
    assert torch.equal(again.model.state_dict()["model.image_index.weight"], rows)
    assert not torch.equal(other.model.state_dict()["model.image_index.weight"], rows)
    # the rows are all that changed: with them at zero the model is the loaded one
    assert not torch.allclose(_logits(loaded, 3), _logits(wide, 3), atol=1e-6)
    with torch.no_grad():
        wide.model.model.image_index.weight.zero_()
    assert torch.allclose(_logits(loaded, 3), _logits(wide, 3), atol=1e-6)


def test_index_rows_for_new_slots_are_fresh_and_the_trained_ones_kept():
    loaded = note_model(index_embeddings=True)
    wide = widen_notevlm(loaded, max_images=8, image_index_embeddings=True, seed=0)
    own, rows = loaded.model.model.image_index.weight, wide.model.model.image_index.weight
    assert rows.shape[0] == 8 and torch.equal(rows[:4], own)
    assert not torch.equal(rows[4:], torch.zeros_like(rows[4:]))
    same = widen_notevlm(loaded, max_length=512, image_index_embeddings=True)  # no new slot: all kept
    assert torch.equal(same.model.model.image_index.weight, own)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["fusion.kind=mlp"], "does not apply to a loaded model"),
        (["max_images"], "does not apply to a loaded model"),
        (["max_images=eight"], "must be an integer"),
        (["max_length=0"], "must be >= 1"),
        (["image_index_embeddings=yes"], "must be true or false"),
    ],
)
def test_bad_overrides_are_errors(overrides, message):
    with pytest.raises(UserError, match=message):
        parse_limits(overrides)


def test_parse_limits():
    assert parse_limits([" max_images = 8", "max_length=1024"]) == {"max_images": 8, "max_length": 1024}
    assert parse_limits([]) == {}
    assert parse_limits(["image_index_embeddings=True"]) == {"image_index_embeddings": True}


def test_tokenizer_must_round_trip_the_agent_format():
    from mm.data.tokenizer import load_tokenizer

    check_agent_texts(load_tokenizer())
    with pytest.raises(UserError, match="does not encode the agent's format"):
        check_agent_texts(tiny_tokenizer())  # word-level: <tool>, JSON and tags are <unk>


def test_build_backend_from_a_note_model_folder(tmp_path):
    loaded = note_model()
    folder = tmp_path / "model"
    loaded.model.save_pretrained(str(folder))
    loaded.processor.save_pretrained(folder)
    # the tiny config keeps its overrides [max_images=8, max_length=1024]
    cfg = load_config(AgentRunConfig, TINY, [f"policy.init={folder}"])
    backend = build_backend(cfg)
    assert backend.max_images == 8 and backend.adapter.processor.max_length == 1024
    assert load_policy(str(folder), []).base_model.config.max_images == 4
    index = ["policy.overrides=[max_images=8,max_length=1024,image_index_embeddings=true]", "policy.seed=3"]
    indexed = build_backend(load_config(AgentRunConfig, TINY, [f"policy.init={folder}", *index]))
    want = widen_notevlm(loaded, max_images=8, image_index_embeddings=True, seed=3).model.model.image_index
    assert torch.equal(indexed.adapter.model.model.image_index.weight, want.weight)  # seeded by policy.seed
    cfg = load_config(AgentRunConfig, TINY, [f"policy.init={folder}", "policy.overrides=[]"])
    with pytest.raises(UserError, match=r"rollout.max_length=1024 does not fit the policy's 256 positions"):
        build_backend(cfg)
    cfg = load_config(AgentRunConfig, TINY, [f"policy.init={folder}", "policy.overrides=[fusion.kind=mlp]"])
    with pytest.raises(UserError, match="does not apply to a loaded model"):
        build_backend(cfg)

"""NoteVLM's optional token position embeddings (what they add), and both fusion-token embeddings (index and
position): save/load, stages, LoRA."""

from __future__ import annotations

import pytest
import torch

from mm.model.peft_presets import apply_lora, freeze_for_stage, trainable_counts
from mm.multi_image import TokenPositionEmbedding
from tests.helpers.model import random_images, tiny_model, two_note_batch


def test_row_k_is_added_to_token_k_of_every_image_and_off_by_default():
    assert tiny_model().token_position is None
    model = tiny_model(token_position_embeddings=True)
    img = random_images(1)[0]
    pixels = torch.stack([img, random_images(1, seed=4)[0]])[None]  # (1, 2, 3, S, S)
    mask = torch.tensor([[True, True]])
    with torch.no_grad():
        tokens, _ = model.model.get_image_features(pixels, mask)  # (1, 2, K, D)
        plain, _ = tiny_model().model.get_image_features(pixels, mask)
        emb = model.token_position.weight  # (K, D)
    assert emb.shape[0] == tokens.shape[2]
    torch.testing.assert_close(tokens - plain, emb[None, None].expand_as(tokens))
    with torch.no_grad():  # a padded slot stays exactly zero
        one, _ = model.model.get_image_features(pixels, torch.tensor([[True, False]]))
    assert torch.equal(one[0, 1], torch.zeros_like(one[0, 1]))


def test_table_size_must_match_the_tokens():
    table = TokenPositionEmbedding(tokens=4, dim=8)
    with pytest.raises(ValueError, match="K=3 per image but the table has 4 rows"):
        table(torch.zeros(1, 1, 3, 8), torch.ones(1, 1, 3, dtype=torch.bool))


# the embeddings added to the fusion's tokens: NoteVLM's module name and the config flag that adds it
TAGS = {"image_index": "image_index_embeddings", "token_position": "token_position_embeddings"}


@pytest.mark.parametrize("tag", list(TAGS))
def test_save_load_identical_logits(tmp_path, tag):
    from mm.model import NoteVLMForConditionalGeneration

    model = tiny_model(seed=3, **{TAGS[tag]: True})
    with torch.no_grad():
        getattr(model, tag).weight.normal_()  # away from init so a dropped tensor would show
        before = model(**two_note_batch()).logits
    model.save_pretrained(tmp_path)
    back = NoteVLMForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
    assert getattr(back, tag) is not None
    with torch.no_grad():
        assert torch.equal(back(**two_note_batch()).logits, before)


@pytest.mark.parametrize("tag", list(TAGS))
def test_trains_with_the_fusion_in_every_stage(tag):
    model = tiny_model(**{TAGS[tag]: True})
    n = getattr(model, tag).weight.numel()
    base = freeze_for_stage(tiny_model(), "align")["fusion"]
    counts = freeze_for_stage(model, "align")
    assert getattr(model, tag).weight.requires_grad and counts["fusion"] == base + n
    assert counts["language_model"] == 0
    lora = apply_lora(tiny_model(**{TAGS[tag]: True}))
    trained = [name for name, p in lora.named_parameters() if p.requires_grad and tag in name]
    assert trained and trainable_counts(lora)["fusion"] > n

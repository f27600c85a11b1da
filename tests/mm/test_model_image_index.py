"""NoteVLM's optional per-image index embeddings: what they add, save/load, stages, LoRA."""

from __future__ import annotations

import torch

from mm.model.peft_presets import apply_lora, freeze_for_stage, trainable_counts
from tests.helpers.model import random_images, tiny_model, two_note_batch


def test_index_embedding_is_added_per_slot_and_off_by_default():
    assert tiny_model().image_index is None
    model = tiny_model(image_index_embeddings=True)
    img = random_images(1)[0]
    pixels = torch.stack([img, img])[None]  # (1, 2, 3, S, S): the same image in slots 0 and 1
    mask = torch.tensor([[True, True]])
    with torch.no_grad():
        tokens, _ = model.model.get_image_features(pixels, mask)  # (1, 2, K, D)
        plain, _ = tiny_model().model.get_image_features(pixels, mask)
        emb = model.image_index.weight
    torch.testing.assert_close(tokens[0, 1] - tokens[0, 0], (emb[1] - emb[0]).expand_as(tokens[0, 0]))
    torch.testing.assert_close(tokens - plain, emb[:2][None, :, None, :].expand_as(tokens))
    pad = torch.tensor([[True, False]])
    with torch.no_grad():  # a padded slot stays exactly zero
        one, _ = model.model.get_image_features(pixels, pad)
    assert torch.equal(one[0, 1], torch.zeros_like(one[0, 1]))


def test_save_load_identical_logits(tmp_path):
    from mm.model import NoteVLMForConditionalGeneration

    model = tiny_model(seed=3, image_index_embeddings=True)
    with torch.no_grad():
        model.image_index.weight.normal_()  # away from init so a dropped tensor would show
        before = model(**two_note_batch()).logits
    model.save_pretrained(tmp_path)
    back = NoteVLMForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
    with torch.no_grad():
        assert torch.equal(back(**two_note_batch()).logits, before)


def test_trains_with_the_fusion_in_every_stage():
    model = tiny_model(image_index_embeddings=True)
    n = model.image_index.weight.numel()
    base = freeze_for_stage(tiny_model(), "align")["fusion"]
    counts = freeze_for_stage(model, "align")
    assert model.image_index.weight.requires_grad and counts["fusion"] == base + n
    assert counts["language_model"] == 0
    lora = apply_lora(tiny_model(image_index_embeddings=True))
    trained = [name for name, p in lora.named_parameters() if p.requires_grad and "image_index" in name]
    assert trained and trainable_counts(lora)["fusion"] > n

"""NoteVLM's optional per-image index embeddings: what they add (save/load, stages and LoRA are tested
with the token position embeddings, test_model_token_position.py)."""

from __future__ import annotations

import torch

from tests.helpers.model import random_images, tiny_model


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

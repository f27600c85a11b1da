"""The pretraining note encoder uses mm.multi_image.ImageIndexEmbedding: same numbers as the plain
nn.Embedding it replaced (init, state-dict key, outputs), and a fusion with K tokens per note."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from mm.config import load_config
from mm.errors import UserError
from mm.multi_image import ImageIndexEmbedding
from mm.train import pretrain

TEST_CFG = Path(__file__).resolve().parents[2] / "tests/configs/pretrain_test.yaml"
VOCAB = 50


def _model(fusion: dict | None = None, **loss):
    cfg = load_config(pretrain.PretrainConfig, TEST_CFG)
    model_cfg = cfg.model
    if fusion is not None:
        model_cfg = replace(cfg.model, fusion=replace(cfg.model.fusion, **fusion))
    torch.manual_seed(0)
    return pretrain.NoteTextModel(cfg=model_cfg, loss=replace(cfg.loss, **loss), vocab_size=VOCAB).eval()


def _pixels(b: int = 3, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    mask = torch.tensor([[True, True, True, False], [True, False, False, False], [True] * 4])[:b, :n]
    return torch.rand(b, n, 3, 64, 64, generator=g) * 2 - 1, mask


def test_same_init_as_nn_embedding():
    torch.manual_seed(0)
    old = nn.Embedding(4, 32)
    torch.manual_seed(0)
    new = ImageIndexEmbedding(max_images=4, dim=32, std=None)
    assert torch.equal(old.weight, new.weight)
    torch.manual_seed(0)
    assert ImageIndexEmbedding(max_images=4, dim=32).weight.std() < 0.1  # the NoteVLM default, std 0.02


def test_old_checkpoint_loads_and_matches_the_old_formula():
    """A state dict written with the nn.Embedding (key image_index.weight) loads strictly, and the per-image
    features equal the old computation: f + MLP(f + E[n]) at real slots, 0 at padded ones."""
    model = _model()
    assert isinstance(model.image_index, ImageIndexEmbedding)
    state = model.state_dict()
    old_weight = torch.randn(4, 32)
    state["image_index.weight"] = old_weight  # what an nn.Embedding(max_images, d_model) saved
    model.load_state_dict(state, strict=True)
    px, mask = _pixels()
    with torch.no_grad():
        got = model.encode_images(px, mask)  # (B, N, D)
        tokens, token_mask = model.fusion(model.vision(px, mask), mask)
        m = token_mask[..., None].float()
        f = (tokens * m).sum(2) / m.sum(2).clamp(min=1.0)  # (B, N, D)
        want = (f + model.image_mlp(f + old_weight[None])) * mask[..., None]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert torch.all(got[~mask] == 0)


def test_note_budget_fusion_pools_one_note_slot():
    fusion = {"kind": "qformer", "scope": "note", "budget_per": "note", "layers": 1, "heads": 2}
    model = _model(fusion)
    px, mask = _pixels()
    with torch.no_grad():
        per_note = model.encode_images(px, mask)
        note, images = model.encode_note(px, mask)
        junk = px.clone()
        junk[~mask] = 100.0
        note_junk, _ = model.encode_note(junk, mask)
    assert per_note.shape == (3, 1, 32) and images.shape == (3, 1, 16) and note.shape == (3, 16)
    torch.testing.assert_close(note.norm(dim=-1), torch.ones(3))
    assert torch.equal(note, note_junk)  # padded slots change nothing
    with pytest.raises(UserError, match="multi_positive"):
        _model(fusion, multi_positive=True)

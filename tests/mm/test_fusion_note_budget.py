"""Budget per note (qformer, resampler): K tokens per note whatever its photo count; padded slots inert."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from mm.fusion import FusionConfig, build_fusion, build_fusion_from_config

D_V, D_LM, GRID, K = 32, 48, (4, 4), 8
KINDS = ["qformer", "resampler"]


def _build(kind: str, budget_per: str = "note", k: int = K):
    torch.manual_seed(0)
    return build_fusion(
        kind, budget=k, d_vision=D_V, d_model=D_LM, grid=GRID, layers=2, heads=4, scope="note",
        max_images=4, budget_per=budget_per,
    )  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
def test_k_tokens_per_note_padded_slots_zero_gradient_and_junk_invariance(kind):
    f = _build(kind)
    mask = torch.tensor([[True, False, True, False], [True, True, True, False], [False] * 4])
    a = torch.randn(3, 4, 16, D_V, requires_grad=True)
    out, token_mask = f(a, mask)
    assert out.shape == (3, 1, K, D_LM)
    assert token_mask.tolist() == [[[True] * K], [[True] * K], [[False] * K]]
    assert torch.all(out[2] == 0) and torch.all(out[:2].abs().sum(-1) > 0)  # a note without images: 0
    out.square().sum().backward()
    assert torch.all(a.grad[~mask] == 0)  # padded slots (and the empty note) get exactly zero gradient
    assert torch.all(a.grad[mask].abs().sum((-1, -2)) > 0)
    assert torch.all(f.slots.patch_slot.grad[3] == 0) and f.slots.query_slot is None  # slot 3: never real
    b = a.detach().clone()
    b[~mask] = torch.randn_like(b[~mask]) * 100
    with torch.no_grad():
        assert torch.equal(f(b, mask)[0], f(a.detach(), mask)[0])


@pytest.mark.parametrize("kind", KINDS)
def test_every_token_reads_every_photo(kind):
    f = _build(kind).eval()
    x = torch.randn(1, 4, 16, D_V)
    for photo in range(4):
        y = x.clone()
        y[0, photo] += 1.0
        with torch.no_grad():
            diff = (f(y)[0] - f(x)[0]).abs().sum(-1)[0, 0]  # (K,)
        assert torch.all(diff > 0), photo


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("images", [1, 4])
def test_flops_and_tokens_per_note(kind, images):
    f = _build(kind)
    x = torch.randn(1, images, 16, D_V)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        f(x)
    d = f.describe(images_per_note=images)
    assert d["budget_per"] == "note" and d["flops_per_note"] == counter.get_total_flops()
    assert d["tokens_per_note"] == K and d["tokens_per_image"] == K / images


def test_config_passes_budget_per_and_rejects_bad_combinations():
    assert "budget_per" not in FusionConfig(kind="qformer", scope="note").kind_kwargs()  # reads as before
    cfg = FusionConfig(kind="resampler", scope="note", budget_per="note", budget=K, layers=1, heads=4)
    assert cfg.kind_kwargs()["budget_per"] == "note"
    f = build_fusion_from_config(cfg, d_vision=D_V, d_model=D_LM, grid=GRID)
    assert f.budget_per == "note" and f.tokens_per_note(3) == K
    with pytest.raises(ValueError, match="budget_per 'note' needs scope 'note'"):
        FusionConfig(kind="qformer", budget_per="note")
    with pytest.raises(ValueError, match="budget_per must be one of"):
        FusionConfig(kind="qformer", scope="note", budget_per="photo")
    with pytest.raises(ValueError, match="needs scope 'note'"):
        build_fusion("qformer", budget=4, d_vision=D_V, d_model=D_LM, grid=GRID, budget_per="note")


@pytest.mark.parametrize("kind", KINDS)
def test_per_image_budget_builds_exactly_as_before(kind):
    """budget_per "image" (the default) draws the same numbers: same weights as a build without it."""
    torch.manual_seed(0)
    old = build_fusion(kind, budget=K, d_vision=D_V, d_model=D_LM, grid=GRID, scope="note", max_images=4)
    new = _build(kind, budget_per="image")
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), new.state_dict().values()))
    assert new(torch.randn(2, 3, 16, D_V))[0].shape == (2, 3, K, D_LM)

"""Note-scope fusion (qformer, resampler): queries read every photo of a note; padded slots stay inert."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from mm.fusion import FusionConfig, build_fusion

D_V, D_LM, GRID = 32, 48, (4, 4)
KINDS = ["qformer", "resampler"]


def _build(kind: str, scope: str, k: int = 8):
    torch.manual_seed(0)
    return build_fusion(
        kind, budget=k, d_vision=D_V, d_model=D_LM, grid=GRID, layers=2, heads=4, scope=scope, max_images=4
    )


@pytest.mark.parametrize("kind", KINDS)
def test_padded_slots_zero_output_zero_gradient_and_junk_invariance(kind):
    f = _build(kind, "note")
    mask = torch.tensor([[True, False, True, False], [True, True, False, False]])
    a = torch.randn(2, 4, 16, D_V, requires_grad=True)
    out, token_mask = f(a, mask)
    assert out.shape == (2, 4, 8, D_LM) and torch.equal(token_mask, mask[:, :, None].expand(2, 4, 8))
    assert torch.all(out[~mask] == 0) and torch.all(out[mask].abs().sum(-1) > 0)
    out.square().sum().backward()
    assert torch.all(a.grad[~mask] == 0)
    assert torch.all(a.grad[mask].abs().sum((-1, -2)) > 0)
    assert torch.all(f.slots.query_slot.grad[3] == 0) and torch.all(f.slots.patch_slot.grad[3] == 0)
    b = a.detach().clone()
    b[~mask] = torch.randn_like(b[~mask]) * 100
    with torch.no_grad():
        assert torch.equal(f(b, mask)[0], f(a.detach(), mask)[0])


@pytest.mark.parametrize("kind", KINDS)
def test_note_scope_reads_the_other_photos_image_scope_does_not(kind):
    x = torch.randn(1, 3, 16, D_V)
    y = x.clone()
    y[0, 2] += 1.0  # change photo 2 only
    for scope, changes in (("note", True), ("image", False)):
        f = _build(kind, scope).eval()
        with torch.no_grad():
            slot0 = f(x)[0][0, 0], f(y)[0][0, 0]
        assert (not torch.equal(*slot0)) == changes


@pytest.mark.parametrize("kind", KINDS)
def test_one_photo_with_zero_slot_embeddings_equals_image_scope(kind):
    """Parity: with the slot embeddings at zero, a one-photo note fuses exactly as scope "image" does."""
    img, note = _build(kind, "image").eval(), _build(kind, "note").eval()
    missing = note.load_state_dict(img.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["slots.patch_slot", "slots.query_slot"]
    with torch.no_grad():
        note.slots.query_slot.zero_()
        note.slots.patch_slot.zero_()
        x = torch.randn(2, 3, 16, D_V)
        mask = torch.tensor([[True, False, False], [True, False, False]])
        torch.testing.assert_close(note(x, mask)[0], img(x, mask)[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("images", [1, 3])
def test_note_flops_match_torch_flop_counter(kind, images):
    f = _build(kind, "note")
    x = torch.randn(1, images, 16, D_V)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        f(x)
    d = f.describe(images_per_note=images)
    assert d["scope"] == "note" and d["flops_per_note"] == counter.get_total_flops()
    assert d["tokens_per_note"] == 8 * images


def test_scope_config_and_errors():
    assert "scope" not in FusionConfig(kind="qformer").kind_kwargs()  # per-image configs read as before
    assert FusionConfig(kind="resampler", scope="note").kind_kwargs()["scope"] == "note"
    with pytest.raises(ValueError, match="needs kind qformer or resampler"):
        FusionConfig(kind="mlp", scope="note")
    with pytest.raises(ValueError, match="fusion scope must be one of"):
        FusionConfig(kind="qformer", scope="photo")
    with pytest.raises(ValueError, match="scope must be one of"):
        _build("qformer", "photo")
    with pytest.raises(ValueError, match="bad arguments for fusion kind 'mlp'"):
        build_fusion("mlp", budget=4, d_vision=D_V, d_model=D_LM, grid=GRID, scope="note")
    with pytest.raises(ValueError, match="max_images=4"):
        _build("resampler", "note")(torch.randn(1, 5, 16, D_V))


def test_notevlm_with_note_scope_fusion_saves_and_loads(tmp_path):
    from mm.model import NoteVLMForConditionalGeneration
    from tests.helpers.model import random_images, tiny_model, tiny_processor

    model = tiny_model(fusion_kind="qformer", fusion_kwargs={"layers": 1, "heads": 2, "scope": "note"})
    assert model.fusion.scope == "note" and model.fusion.slots.max_images == model.config.max_images
    batch = tiny_processor()([random_images(3), random_images(1, seed=1)], ["describe the note", "a"])
    with torch.no_grad():
        before = model(**batch).logits
    model.save_pretrained(tmp_path)
    back = NoteVLMForConditionalGeneration.from_pretrained(str(tmp_path)).eval()
    with torch.no_grad():
        assert torch.equal(back(**batch).logits, before)

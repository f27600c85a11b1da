"""Multi-image notes: index embeddings, zero gradient to padded slots, permutation, pooling, visibility."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mm.fusion import FUSION_KINDS, build_fusion
from mm.multi_image import ImageIndexEmbedding, MultiImageConfig, NotePooler, visibility_mask
from mm.vision import VisionConfig, build_vision_tower

TINY = {"image_size": 32, "patch_size": 8, "width": 32, "layers": 1, "heads": 2}


def _pipeline(kind: str):
    torch.manual_seed(0)
    tower = build_vision_tower(VisionConfig(**TINY))
    kw = {} if kind == "mlp" else {"layers": 2, "heads": 2}
    fusion = build_fusion(kind, budget=16, d_vision=tower.dim, d_model=24, grid=tower.grid, **kw)
    index = ImageIndexEmbedding(max_images=4, dim=24)
    return tower.eval(), fusion.eval(), index


@pytest.mark.parametrize("kind", FUSION_KINDS)
def test_padded_images_zero_gradient_end_to_end(kind):
    tower, fusion, index = _pipeline(kind)
    mask = torch.tensor([[True, False, True, False], [True, True, False, False]])
    px = torch.randn(2, 4, 3, 32, 32, requires_grad=True)
    tokens, token_mask = fusion(tower(px, mask), mask)
    out = index(tokens, token_mask)
    assert torch.all(out[~mask] == 0)
    out.square().sum().backward()
    assert torch.all(px.grad[~mask] == 0)
    assert torch.all(px.grad[mask].abs().flatten(1).sum(-1) > 0)
    assert torch.all(index.weight.grad[3] == 0)  # slot 3 is padded in every note
    junk = px.detach().clone()
    junk[~mask] = torch.rand_like(junk[~mask]) * 50
    out2 = index(*fusion(tower(junk, mask), mask))  # same grad mode as `out`: same kernels, exact equality
    torch.testing.assert_close(out2.detach(), out.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("kind", FUSION_KINDS)
def test_permuting_images_permutes_outputs_before_index_embeddings(kind):
    tower, fusion, index = _pipeline(kind)
    px = torch.randn(1, 3, 3, 32, 32)
    perm = torch.tensor([2, 0, 1])
    with torch.no_grad():
        out, _ = fusion(tower(px))
        out_p, _ = fusion(tower(px[:, perm]))
        torch.testing.assert_close(out_p, out[:, perm], rtol=1e-5, atol=1e-5)
        # after the index embedding, slot n is tagged as "image n", so the same image differs by slot
        tagged = index(out, torch.ones(1, 3, 16, dtype=torch.bool))
        tagged_p = index(out_p, torch.ones(1, 3, 16, dtype=torch.bool))
        assert not torch.allclose(tagged_p, tagged[:, perm])


def test_index_embedding_adds_slot_rows_and_rejects_too_many_images():
    index = ImageIndexEmbedding(max_images=2, dim=3)
    tokens = torch.zeros(1, 2, 4, 3)
    mask = torch.tensor([[True, False]])[:, :, None].expand(1, 2, 4)
    out = index(tokens, mask)
    assert torch.equal(out[0, 0], index.weight[0].expand(4, 3))
    assert torch.all(out[0, 1] == 0)
    with pytest.raises(ValueError, match="max_images=2"):
        index(torch.zeros(1, 3, 4, 3), torch.ones(1, 3, 4, dtype=torch.bool))


def test_note_pooler_golden_masked_mean_and_errors():
    pool = NotePooler(dim=2, out_dim=2).double()
    with torch.no_grad():
        pool.proj.weight.copy_(torch.eye(2, dtype=torch.float64))
        pool.proj.bias.zero_()
    data = [[[[1.0, 2.0], [3.0, 4.0]], [[100.0, 100.0], [100.0, 100.0]]]]  # (1, 2, 2, 2): image 1 is padding
    tokens = torch.tensor(data, dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[[True, True], [False, False]]])
    out = pool(tokens, mask)
    torch.testing.assert_close(out, torch.tensor([[2.0, 3.0]], dtype=torch.float64), rtol=0, atol=0)
    out.sum().backward()
    assert torch.all(tokens.grad[0, 1] == 0) and torch.all(tokens.grad[0, 0] == 0.5)
    with pytest.raises(ValueError, match="no valid image"):
        pool(tokens.detach(), torch.zeros(1, 2, 2, dtype=torch.bool))


def test_visibility_mask_golden_all_and_own():
    # sequence: [img0, img0, img1, txt(seg 0), txt(seg 1), txt(seg -1)]
    image_ids = torch.tensor([[0, 0, 1, -1, -1, -1]])
    segment_ids = torch.tensor([[-1, -1, -1, 0, 1, -1]])
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    m_all = visibility_mask(image_ids, mode="all")
    assert m_all.shape == (1, 1, 6, 6) and torch.equal(m_all[0, 0], causal)
    m_own = visibility_mask(image_ids, segment_ids, mode="own")[0, 0]
    expect = causal.clone()
    expect[2, 0] = expect[2, 1] = False  # image 1 must not see image 0
    expect[3, 2] = False  # segment-0 text must not see image 1
    expect[4, 0] = expect[4, 1] = False  # segment-1 text must not see image 0
    expect[4, 3] = False  # ... nor segment-0 text (which saw image 0)
    assert torch.equal(m_own, expect)
    add = visibility_mask(image_ids, segment_ids, mode="own", additive=True, dtype=torch.float32)[0, 0]
    assert add.dtype == torch.float32
    assert torch.equal(add == 0, expect) and torch.all(add[~expect] == torch.finfo(torch.float32).min)


def test_visibility_mask_padding_and_errors():
    image_ids = torch.tensor([[-1, 0, -1]])
    m = visibility_mask(image_ids, attention_mask=torch.tensor([[0, 1, 1]]))[0, 0]  # left padding
    expect = torch.tensor([[True, False, False], [False, True, False], [False, True, True]])
    assert torch.equal(m, expect)  # nobody sees the padded key; its own row keeps the diagonal (no NaN)
    with pytest.raises(ValueError, match="segment_ids"):
        visibility_mask(image_ids, mode="own")
    with pytest.raises(ValueError, match="visibility mode"):
        visibility_mask(image_ids, mode="some")
    with pytest.raises(ValueError, match="visibility"):
        MultiImageConfig(visibility="mine")


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_visibility_mask_works_as_hf_4d_mask(attn):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    cfg._attn_implementation = attn
    lm = Qwen2ForCausalLM(cfg).eval()
    image_ids = torch.tensor([[0, 0, 1, 1, -1, -1, -1, -1]])
    segment_ids = torch.tensor([[-1, -1, -1, -1, 0, 0, 1, 1]])
    emb = torch.randn(1, 8, 32)
    additive = attn == "eager"
    with torch.no_grad():
        ref = lm(inputs_embeds=emb).logits
        m_all = visibility_mask(image_ids, mode="all", additive=additive)
        torch.testing.assert_close(lm(inputs_embeds=emb, attention_mask=m_all).logits, ref)
        m_own = visibility_mask(image_ids, segment_ids, mode="own", additive=additive)
        own = lm(inputs_embeds=emb, attention_mask=m_own).logits
        emb2 = emb.clone()
        emb2[0, 2:4] += 5.0  # change image 1's tokens
        own2 = lm(inputs_embeds=emb2, attention_mask=m_own).logits
    torch.testing.assert_close(own2[0, 4:6], own[0, 4:6])  # segment 0 cannot see image 1
    assert not torch.allclose(own2[0, 6:8], own[0, 6:8])  # segment 1 does


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_visibility_mask_and_pooler_match_cpu():
    image_ids = torch.tensor([[0, 0, 1, -1, -1, -1]])
    segment_ids = torch.tensor([[-1, -1, -1, 0, 1, -1]])
    kw = {"mode": "own", "additive": True, "dtype": torch.bfloat16}
    ref = visibility_mask(image_ids, segment_ids, **kw)
    out = visibility_mask(image_ids.cuda(), segment_ids.cuda(), **kw)
    assert torch.equal(out.cpu(), ref)
    torch.manual_seed(0)
    pool = NotePooler(dim=4, out_dim=3)
    tokens, mask = torch.randn(2, 3, 5, 4), torch.rand(2, 3, 5) > 0.3
    torch.testing.assert_close(pool.cuda()(tokens.cuda(), mask.cuda()).cpu(), pool.cpu()(tokens, mask))


def _naive_visibility(image_ids, segment_ids, mode, attention_mask):
    B, T = image_ids.shape
    out = torch.zeros(B, 1, T, T, dtype=torch.bool)
    for b in range(B):
        for i in range(T):
            for j in range(T):
                ok = j <= i and bool(attention_mask[b, j])
                if mode == "own":
                    gi = int(image_ids[b, i]) if image_ids[b, i] >= 0 else int(segment_ids[b, i])
                    gj = int(image_ids[b, j]) if image_ids[b, j] >= 0 else int(segment_ids[b, j])
                    ok = ok and (gi < 0 or gj < 0 or gi == gj)
                out[b, 0, i, j] = ok or i == j
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["all", "own"]))
def test_visibility_mask_matches_naive_loops(seed, mode):
    g = torch.Generator().manual_seed(seed)
    B, T = 2, 7
    image_ids = torch.randint(-1, 3, (B, T), generator=g)
    segment_ids = torch.randint(-1, 3, (B, T), generator=g)
    attention_mask = torch.randint(0, 2, (B, T), generator=g)
    got = visibility_mask(image_ids, segment_ids, mode=mode, attention_mask=attention_mask)
    assert torch.equal(got, _naive_visibility(image_ids, segment_ids, mode, attention_mask))

"""Fusion modules: exact K tokens, masks, zero gradient to padded slots, equivariance, FLOPs, errors."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from mm.fusion import FUSION_KINDS, FusionConfig, build_fusion, build_fusion_from_config, describe_kinds
from mm.fusion.layers import factor_grid, sincos_2d

D_V, D_LM = 32, 48
SMALL = {"layers": 2, "heads": 4}


def _build(kind: str, k: int, grid: tuple[int, int]):
    torch.manual_seed(0)
    kw = {} if kind == "mlp" else dict(SMALL)
    return build_fusion(kind, budget=k, d_vision=D_V, d_model=D_LM, grid=grid, **kw)


@pytest.mark.parametrize("kind", FUSION_KINDS)
@pytest.mark.parametrize("k", [16, 64])
@pytest.mark.parametrize("grid", [(8, 8), (16, 16)])
def test_exactly_k_tokens_and_masks(kind, k, grid):
    f = _build(kind, k, grid)
    P = grid[0] * grid[1]
    patches = torch.randn(2, 3, P, D_V)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    tokens, token_mask = f(patches, mask)
    assert tokens.shape == (2, 3, k, D_LM)
    assert token_mask.shape == (2, 3, k) and token_mask.dtype == torch.bool
    assert torch.equal(token_mask, mask[:, :, None].expand(2, 3, k))
    assert torch.all(tokens[~mask] == 0)
    assert torch.all(tokens[mask].abs().sum(-1) > 0)
    d = f.describe(images_per_note=3)
    assert d["kind"] == kind and d["tokens_per_image"] == k and d["tokens_per_note"] == 3 * k
    assert d["params"] == sum(p.numel() for p in f.parameters())
    assert d["flops_per_note"] == 3 * d["flops_per_image"] > 0


@pytest.mark.parametrize("kind", FUSION_KINDS)
def test_padded_slots_get_zero_gradient_and_do_not_change_real_outputs(kind):
    f = _build(kind, 16, (8, 8))
    mask = torch.tensor([[True, False, True], [True, False, False]])
    a = torch.randn(2, 3, 64, D_V, requires_grad=True)
    out_a, _ = f(a, mask)
    out_a.square().sum().backward()
    assert torch.all(a.grad[~mask] == 0)
    assert torch.all(a.grad[mask].abs().sum((-1, -2)) > 0)
    b = a.detach().clone()
    b[~mask] = torch.randn_like(b[~mask]) * 100  # different junk in the padded slots
    out_b, _ = f(b, mask)
    assert torch.equal(out_a.detach(), out_b)


@pytest.mark.parametrize("kind", FUSION_KINDS)
def test_permuting_images_permutes_outputs(kind):
    f = _build(kind, 16, (8, 8)).eval()
    x = torch.randn(1, 4, 64, D_V)
    perm = torch.tensor([2, 0, 3, 1])
    out, _ = f(x)
    out_p, _ = f(x[:, perm])
    torch.testing.assert_close(out_p, out[:, perm], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", FUSION_KINDS)
@pytest.mark.parametrize("k", [16, 64])
def test_analytic_flops_match_torch_flop_counter(kind, k):
    f = _build(kind, k, (16, 16))
    x = torch.randn(1, 1, 256, D_V)
    # The math SDPA backend runs attention as counted matmuls (the fused CPU kernel is not counted).
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        f(x)
    assert f.flops_per_image() == counter.get_total_flops()


def test_unknown_kind_names_known_kinds():
    with pytest.raises(ValueError, match="mlp, qformer, resampler"):
        build_fusion("nope", budget=16, d_vision=D_V, d_model=D_LM, grid=(8, 8))
    with pytest.raises(ValueError, match="known kinds"):
        FusionConfig(kind="perceiver")


def test_mlp_impossible_budgets_are_clear_errors():
    with pytest.raises(ValueError, match="K <= 64"):
        build_fusion("mlp", budget=65, d_vision=D_V, d_model=D_LM, grid=(8, 8))
    with pytest.raises(ValueError, match="no such shape"):
        build_fusion("mlp", budget=11, d_vision=D_V, d_model=D_LM, grid=(8, 8))  # 11 = 1 x 11, 11 > 8


def test_mlp_without_pooling_is_llava_mlp2x_gelu_on_every_patch():
    f = _build("mlp", 64, (8, 8))
    x = torch.randn(1, 1, 64, D_V)
    ref = f.fc2(torch.nn.functional.gelu(f.fc1(x[0, 0])))
    torch.testing.assert_close(f(x)[0][0, 0], ref)


def test_mlp_pooling_averages_2x2_blocks():
    f = _build("mlp", 16, (8, 8))
    x = torch.randn(1, 1, 64, D_V)
    grid = x[0, 0].reshape(8, 8, D_V)
    pooled = grid.reshape(4, 2, 4, 2, D_V).mean((1, 3)).reshape(16, D_V)
    ref = f.fc2(torch.nn.functional.gelu(f.fc1(pooled)))
    torch.testing.assert_close(f(x)[0][0, 0], ref, rtol=1e-5, atol=1e-6)


def test_wrong_patch_count_is_clear_error():
    f = _build("qformer", 16, (8, 8))
    with pytest.raises(ValueError, match="P=64"):
        f(torch.randn(1, 1, 49, D_V))


def test_qformer_cross_attention_every_other_layer():
    f = build_fusion("qformer", budget=16, d_vision=D_V, d_model=D_LM, grid=(8, 8), layers=4)
    assert [layer.cross for layer in f.layers] == [True, False, True, False]


def test_config_builds_each_kind():
    for kind in FUSION_KINDS:
        cfg = FusionConfig(kind=kind, budget=16, layers=1, heads=2)
        f = build_fusion_from_config(cfg, d_vision=D_V, d_model=D_LM, grid=(8, 8))
        assert f.kind == kind and f.budget == 16


def test_sincos_2d_golden_values():
    emb = sincos_2d(2, 3, 8).double()
    # dim 8 -> 2 frequencies: 1 and 1/100; channels [sin y | cos y | sin x | cos x]
    row = 1 * 3 + 2  # (y=1, x=2)
    expect = torch.tensor(
        [
            torch.sin(torch.tensor(1.0, dtype=torch.float64)),
            torch.sin(torch.tensor(0.01, dtype=torch.float64)),
            torch.cos(torch.tensor(1.0, dtype=torch.float64)),
            torch.cos(torch.tensor(0.01, dtype=torch.float64)),
            torch.sin(torch.tensor(2.0, dtype=torch.float64)),
            torch.sin(torch.tensor(0.02, dtype=torch.float64)),
            torch.cos(torch.tensor(2.0, dtype=torch.float64)),
            torch.cos(torch.tensor(0.02, dtype=torch.float64)),
        ]
    )
    torch.testing.assert_close(emb[row], expect, rtol=0, atol=1e-7)
    assert emb.shape == (6, 8)


def test_factor_grid():
    assert factor_grid(16, (8, 8), within=True) == (4, 4)
    assert factor_grid(8, (4, 8), within=True) == (2, 4)
    assert factor_grid(32, (4, 4), within=True) is None
    assert factor_grid(32, (4, 4), within=False) in {(4, 8), (8, 4)}


def test_resampler_has_no_buffers_and_builds_on_meta_device():
    ref = _build("resampler", 16, (8, 8)).eval()
    assert not list(ref.buffers())  # positions are computed, so state_dict == parameters
    with torch.device("meta"):
        meta = build_fusion("resampler", budget=16, d_vision=D_V, d_model=D_LM, grid=(8, 8), **SMALL)
    meta = meta.to_empty(device="cpu")
    meta.load_state_dict(ref.state_dict())
    x = torch.randn(1, 2, 64, D_V)
    torch.testing.assert_close(meta.eval()(x)[0], ref(x)[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", FUSION_KINDS)
def test_cuda_matches_cpu_and_keeps_padded_gradient_zero(kind):
    f = _build(kind, 64, (16, 16)).eval()
    x = torch.randn(2, 4, 256, D_V)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    ref, ref_mask = f(x, mask)
    g = f.cuda()
    xc = x.cuda().requires_grad_(True)
    out, out_mask = g(xc, mask.cuda())
    torch.testing.assert_close(out.cpu(), ref.detach(), rtol=1e-4, atol=1e-4)
    assert torch.equal(out_mask.cpu(), ref_mask)
    out.square().sum().backward()
    assert torch.all(xc.grad[~mask.cuda()] == 0)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out_bf, _ = g(xc.detach(), mask.cuda())
    assert out_bf.shape == (2, 4, 64, D_LM) and torch.all(out_bf[~mask.cuda()] == 0)


def test_describe_kinds_same_budget_table():
    rows = describe_kinds(budget=16, d_vision=D_V, d_model=D_LM, grid=(8, 8), images_per_note=4,
                          kind_kwargs={"qformer": {"layers": 1}})  # fmt: skip
    assert [r["kind"] for r in rows] == list(FUSION_KINDS)
    assert all(r["tokens_per_note"] == 64 for r in rows)
    mlp = rows[0]
    assert mlp["params"] == (D_V * D_LM + D_LM) + (D_LM * D_LM + D_LM)
    assert mlp["flops_per_image"] == 2 * 16 * (D_V * D_LM + D_LM * D_LM)
    with pytest.raises(ValueError, match="unknown kinds"):
        describe_kinds(budget=16, d_vision=D_V, d_model=D_LM, grid=(8, 8), kind_kwargs={"mpl": {}})


def test_attention_matches_torch_multihead_attention():
    from mm.fusion.layers import Attention

    torch.manual_seed(0)
    ours = Attention(dim=16, heads=4).double()
    ref = torch.nn.MultiheadAttention(16, 4, batch_first=True).double()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q.weight, ours.k.weight, ours.v.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.q.bias, ours.k.bias, ours.v.bias]))
        ref.out_proj.weight.copy_(ours.o.weight)
        ref.out_proj.bias.copy_(ours.o.bias)
    q, kv = torch.randn(2, 5, 16, dtype=torch.float64), torch.randn(2, 9, 16, dtype=torch.float64)
    expect, _ = ref(q, kv, kv, need_weights=False)
    torch.testing.assert_close(ours(q, kv), expect, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", FUSION_KINDS)
def test_every_fusion_parameter_gets_a_gradient(kind):
    f = _build(kind, 16, (8, 8))
    f(torch.randn(1, 2, 64, D_V))[0].square().sum().backward()
    assert [n for n, p in f.named_parameters() if p.grad is None] == []

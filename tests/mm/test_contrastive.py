"""Golden values, open_clip parity, multi-positive properties and 2-process gather equality."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from mm import contrastive


def _feats(b: int, d: int, seed: int, dtype=torch.float64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(b, d, generator=g, dtype=dtype), dim=-1)


def test_init_and_clamp():
    assert contrastive.init_logit_scale() == pytest.approx(math.log(1 / 0.07), abs=1e-12)
    p = torch.nn.Parameter(torch.tensor(7.0))
    contrastive.clamp_logit_scale_(p)
    assert p.item() == pytest.approx(math.log(100.0), abs=1e-6)
    q = torch.nn.Parameter(torch.tensor(1.0))
    contrastive.clamp_logit_scale_(q)
    assert q.item() == 1.0
    with pytest.raises(ValueError, match="temperature"):
        contrastive.init_logit_scale(0.0)


def test_clip_golden_identity_features():
    eye = torch.eye(2, dtype=torch.float64)
    # logits = s * I: each row's CE is log(1 + e^-s)
    for s in (1.0, 2.0):
        got = contrastive.clip_loss(eye, eye, s).item()
        assert got == pytest.approx(math.log1p(math.exp(-s)), abs=1e-12)
    # label smoothing 0.1 over 2 columns: targets (0.95, 0.05)
    p = math.e / (math.e + 1)
    want = -(0.95 * math.log(p) + 0.05 * math.log(1 - p))
    assert contrastive.clip_loss(eye, eye, 1.0, label_smoothing=0.1).item() == pytest.approx(want, abs=1e-12)


def test_clip_loss_is_ln_b_at_init():
    b = 16
    loss = contrastive.clip_loss(
        _feats(b, 4096, 0), _feats(b, 4096, 1), math.exp(contrastive.init_logit_scale())
    ).item()
    assert abs(loss - math.log(b)) < 0.15


def test_clip_matches_open_clip():
    from open_clip.loss import ClipLoss

    x, y = _feats(12, 32, 2, torch.float32), _feats(12, 32, 3, torch.float32)
    scale = torch.tensor(math.exp(contrastive.init_logit_scale()))
    ours = contrastive.clip_loss(x, y, scale)
    theirs = ClipLoss()(x, y, scale)
    assert abs(ours.item() - theirs.item()) < 1e-6


def test_siglip_golden_and_open_clip_parity():
    from open_clip.loss import SigLipLoss

    eye = torch.eye(2, dtype=torch.float64)
    s, b = 3.0, -1.0
    want = math.log1p(math.exp(-(s + b))) + math.log1p(math.exp(b))  # -log sig(s+b) - log sig(-b)
    assert contrastive.siglip_loss(eye, eye, s, b).item() == pytest.approx(want, abs=1e-12)
    x, y = _feats(10, 16, 4, torch.float32), _feats(10, 16, 5, torch.float32)
    scale, bias = torch.tensor(10.0), torch.tensor(contrastive.init_logit_bias())
    assert (
        abs(contrastive.siglip_loss(x, y, scale, bias).item() - SigLipLoss()(x, y, scale, bias).item()) < 1e-6
    )


def test_label_smoothing_matches_torch_cross_entropy():
    x, y = _feats(6, 8, 6), _feats(6, 8, 7)
    logits = 5.0 * x @ y.T
    labels = torch.arange(6)
    want = 0.5 * (
        F.cross_entropy(logits, labels, label_smoothing=0.2)
        + F.cross_entropy(logits.T, labels, label_smoothing=0.2)
    )
    assert contrastive.clip_loss(x, y, 5.0, label_smoothing=0.2).item() == pytest.approx(
        want.item(), abs=1e-12
    )


def test_multi_positive_one_image_equals_clip():
    x, y = _feats(5, 8, 8), _feats(5, 8, 9)
    mask = torch.ones(5, 1, dtype=torch.bool)
    for eps in (0.0, 0.1):
        got = contrastive.multi_positive_clip_loss(x[:, None], mask, y, 4.0, label_smoothing=eps).item()
        assert got == pytest.approx(contrastive.clip_loss(x, y, 4.0, label_smoothing=eps).item(), abs=1e-12)


def _multi_positive_loops(images, mask, text, s):
    """Independent loop implementation of the multi-positive loss (no smoothing)."""
    b, n, _ = images.shape
    valid = [(i, k) for i in range(b) for k in range(n) if mask[i, k]]
    t2i = 0.0
    for t in range(b):
        logits = [s * float(text[t] @ images[i, k]) for i, k in valid]
        lse = math.log(sum(math.exp(v) for v in logits))
        pos = [j for j, (i, _) in enumerate(valid) if i == t]
        t2i += -sum(logits[j] - lse for j in pos) / len(pos)
    i2t = 0.0
    for i, k in valid:
        logits = [s * float(images[i, k] @ text[t]) for t in range(b)]
        lse = math.log(sum(math.exp(v) for v in logits))
        i2t += -(logits[i] - lse)
    return 0.5 * (t2i / b + i2t / len(valid))


def test_multi_positive_golden_against_loops_and_padding_gets_no_gradient():
    images = _feats(3 * 3, 8, 10).reshape(3, 3, 8).clone().requires_grad_(True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    text = _feats(3, 8, 11)
    loss = contrastive.multi_positive_clip_loss(images, mask, text, 3.0)
    assert loss.item() == pytest.approx(_multi_positive_loops(images.detach(), mask, text, 3.0), abs=1e-12)
    loss.backward()
    assert torch.all(images.grad[~mask] == 0)
    assert torch.all(images.grad[mask].abs().sum(-1) > 0)
    assert torch.isfinite(images.grad).all()


def test_bad_shapes_raise_clear_errors():
    with pytest.raises(ValueError, match="same shape"):
        contrastive.clip_loss(torch.zeros(3, 4), torch.zeros(2, 4), 1.0)
    with pytest.raises(ValueError, match="at least one valid image"):
        contrastive.multi_positive_clip_loss(
            torch.zeros(2, 2, 4), torch.zeros(2, 2, dtype=torch.bool), torch.zeros(2, 4), 1.0
        )


def test_param_groups_exempt_temperature_and_biases():
    m = torch.nn.Module()
    m.proj = torch.nn.Linear(4, 4)
    m.log_scale = torch.nn.Parameter(torch.tensor(1.0))
    groups = contrastive.param_groups(m, weight_decay=0.1)
    decay_ids = {id(p) for p in groups[0]["params"]}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0
    assert decay_ids == {id(m.proj.weight)}
    assert id(m.log_scale) in {id(p) for p in groups[1]["params"]}


# ------------------------------------------------------------ 2-process gloo equality

B_GLOBAL, D_IN, D_OUT = 8, 6, 5


def _setup(seed: int = 0):
    torch.manual_seed(seed)
    note_proj = torch.nn.Linear(D_IN, D_OUT).double()
    text_proj = torch.nn.Linear(D_IN, D_OUT).double()
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(B_GLOBAL, 2, D_IN, generator=g, dtype=torch.float64)
    y = torch.randn(B_GLOBAL, D_IN, generator=g, dtype=torch.float64)
    mask = torch.ones(B_GLOBAL, 2, dtype=torch.bool)
    mask[::3, 1] = False
    return note_proj, text_proj, x, y, mask


def _losses(note_proj, text_proj, x, y, mask, gather):
    imgs = F.normalize(note_proj(x), dim=-1)  # (B, 2, D)
    note = F.normalize(imgs.mean(1), dim=-1)
    text = F.normalize(text_proj(y), dim=-1)
    note, text, imgs = gather(note), gather(text), gather(imgs)
    mask = contrastive.gather_no_grad(mask) if gather is not _identity else mask
    return {
        "clip": contrastive.clip_loss(note, text, 7.0, label_smoothing=0.1),
        "siglip": contrastive.siglip_loss(note, text, 7.0, -2.0),
        "multi": contrastive.multi_positive_clip_loss(imgs, mask, text, 7.0),
    }


def _identity(t):
    return t


def _grads(modules, loss):
    for m in modules:
        m.zero_grad()
    loss.backward(retain_graph=True)
    return torch.cat([p.grad.flatten() for m in modules for p in m.parameters()])


def _worker(rank: int, world: int, init_file: str, out_file: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    note_proj, text_proj, x, y, mask = _setup()
    sl = slice(rank * B_GLOBAL // world, (rank + 1) * B_GLOBAL // world)
    losses = _losses(note_proj, text_proj, x[sl], y[sl], mask[sl], contrastive.gather_with_grad)
    result = {}
    for name, loss in losses.items():
        g = _grads([note_proj, text_proj], loss)
        dist.all_reduce(g)  # what DDP does: average gradients over ranks
        result[name] = (loss.detach(), g / world)
    if rank == 0:
        torch.save(result, out_file)
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_process_gather_equals_single_process(tmp_path):
    import torch.multiprocessing as mp

    out = tmp_path / "dist.pt"
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(out)), nprocs=2, join=True)
    dist_result = torch.load(out)
    note_proj, text_proj, x, y, mask = _setup()
    for name, loss in _losses(note_proj, text_proj, x, y, mask, _identity).items():
        g = _grads([note_proj, text_proj], loss)
        d_loss, d_g = dist_result[name]
        assert abs(d_loss.item() - loss.item()) < 1e-12, name
        torch.testing.assert_close(d_g, g, rtol=0, atol=1e-12)

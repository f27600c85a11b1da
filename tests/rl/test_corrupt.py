"""Image corruptions for mDPO: seeded, shape/range kept, image really changed."""

from __future__ import annotations

import pytest
import torch

from rl.corrupt import KINDS, corrupt


def _img(n=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (3, 16, 16) if n is None else (n, 3, 16, 16)
    return torch.rand(shape, generator=g)


@pytest.mark.parametrize("kind", KINDS)
def test_shape_range_seed_and_change(kind):
    x = _img()
    a, b = corrupt(x, kind, seed=1), corrupt(x, kind, seed=1)
    assert a.shape == x.shape and a.dtype == x.dtype
    assert torch.equal(a, b)
    assert float(a.min()) >= 0.0 and float(a.max()) <= 1.0
    assert (a - x).abs().mean() > 0.05  # the image really differs
    batch = corrupt(_img(2), kind, seed=1)
    assert batch.shape == (2, 3, 16, 16)


@pytest.mark.parametrize("kind", ["noise", "crop", "patch_shuffle"])
def test_different_seeds_differ(kind):
    x = _img()
    assert not torch.equal(corrupt(x, kind, seed=0), corrupt(x, kind, seed=1))


def test_patch_shuffle_keeps_the_pixels():
    x = _img()
    y = corrupt(x, "patch_shuffle", grid=4, seed=3)
    assert torch.equal(x.flatten().sort().values, y.flatten().sort().values)
    # every 4x4 patch of y is one of x's patches
    px = {
        tuple(x[:, i : i + 4, j : j + 4].flatten().tolist()) for i in range(0, 16, 4) for j in range(0, 16, 4)
    }
    py = {
        tuple(y[:, i : i + 4, j : j + 4].flatten().tolist()) for i in range(0, 16, 4) for j in range(0, 16, 4)
    }
    assert px == py


def test_blank_is_mean_colour_and_noise_zero_is_identity():
    x = _img()
    y = corrupt(x, "blank")
    assert torch.allclose(y[:, 3, 5], x.mean(dim=(1, 2)))
    assert torch.equal(corrupt(x, "noise", noise_std=0.0), x)
    assert torch.allclose(corrupt(x, "crop", crop_keep=1.0), x, atol=1e-6)


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown corruption"):
        corrupt(_img(), "jpeg")
    with pytest.raises(ValueError, match="expected float images"):
        corrupt(torch.zeros(16, 16, 3, dtype=torch.uint8), "noise")
    with pytest.raises(ValueError, match="divisible"):
        corrupt(_img(), "patch_shuffle", grid=5)
    with pytest.raises(ValueError, match="crop_keep"):
        corrupt(_img(), "crop", crop_keep=0.0)

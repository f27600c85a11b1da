"""Image corruptions for mDPO's conditional preference (Wang et al., "mDPO: Conditional Preference
Optimization for Multimodal Large Language Models", 2024): the same chosen answer, scored with a
corrupted image, is the rejected side, so the policy must look at the image to prefer it.

mDPO corrupts by random cropping that keeps at most 20% of the image; we offer that (``crop``) and
three others: ``noise`` (Gaussian pixel noise, as in the diffusion-noise variants of HA-DPO/VCD),
``patch_shuffle`` (the image's patches permuted: local texture kept, layout destroyed) and
``blank`` (a flat image of the mean colour: no visual evidence at all).

Pure functions on float tensors in [0, 1], shape ``(3, H, W)`` or ``(N, 3, H, W)``; every random
choice comes from ``seed`` (a ``torch.Generator``), so the same seed gives the same image. The
output has the input's shape and dtype and stays in [0, 1]. A crop is resized back to ``(H, W)``
(bilinear), as mDPO's pipeline does before the vision encoder.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

KINDS: tuple[str, ...] = ("noise", "crop", "patch_shuffle", "blank")
"""Corruption names accepted by :func:`corrupt`."""


def _check(images: torch.Tensor) -> torch.Tensor:
    if images.dim() not in (3, 4) or images.shape[-3] != 3 or not images.is_floating_point():
        raise ValueError(
            f"expected float images (3, H, W) or (N, 3, H, W) in [0, 1], got {images.dtype} "
            f"{tuple(images.shape)}; convert uint8 with img.permute(2, 0, 1) / 255"
        )
    return images if images.dim() == 4 else images[None]  # (N, 3, H, W)


def add_noise(images: torch.Tensor, *, std: float, gen: torch.Generator) -> torch.Tensor:
    """Images plus Gaussian noise of standard deviation ``std``, clamped to [0, 1]."""
    noise = torch.randn(images.shape, generator=gen, dtype=torch.float32).to(images)
    return (images + std * noise).clamp(0.0, 1.0)


def random_crop(images: torch.Tensor, *, keep: float, gen: torch.Generator) -> torch.Tensor:
    """A random crop of ``keep`` of the area (square aspect), resized back to (H, W)."""
    N, C, H, W = images.shape
    h, w = max(1, round(H * keep**0.5)), max(1, round(W * keep**0.5))
    out = []
    for img in images:
        y = int(torch.randint(0, H - h + 1, (1,), generator=gen))
        x = int(torch.randint(0, W - w + 1, (1,), generator=gen))
        crop = img[None, :, y : y + h, x : x + w]  # (1, 3, h, w)
        out.append(F.interpolate(crop.float(), size=(H, W), mode="bilinear", align_corners=False)[0])
    return torch.stack(out).to(images.dtype).clamp(0.0, 1.0)  # (N, 3, H, W)


def patch_shuffle(images: torch.Tensor, *, grid: int, gen: torch.Generator) -> torch.Tensor:
    """Split each image into ``grid x grid`` patches and permute them (H, W divisible by ``grid``)."""
    N, C, H, W = images.shape
    if H % grid or W % grid:
        raise ValueError(f"patch_shuffle needs H and W divisible by grid={grid}, got {H}x{W}")
    ph, pw = H // grid, W // grid
    patches = images.reshape(N, C, grid, ph, grid, pw).permute(0, 2, 4, 1, 3, 5)  # (N, g, g, C, ph, pw)
    patches = patches.reshape(N, grid * grid, C, ph, pw)
    out = torch.empty_like(patches)
    for n in range(N):
        perm = torch.randperm(grid * grid, generator=gen)
        if grid > 1 and bool((perm == torch.arange(grid * grid)).all()):
            perm = perm.roll(1)  # never hand back the original layout
        out[n] = patches[n, perm]
    out = out.reshape(N, grid, grid, C, ph, pw).permute(0, 3, 1, 4, 2, 5)  # (N, C, g, ph, g, pw)
    return out.reshape(N, C, H, W)


def blank(images: torch.Tensor) -> torch.Tensor:
    """Each image replaced by its per-channel mean colour."""
    return images.mean(dim=(-2, -1), keepdim=True).expand_as(images).clone()


def corrupt(
    images: torch.Tensor,
    kind: str,
    *,
    seed: int = 0,
    noise_std: float = 0.5,
    crop_keep: float = 0.2,
    grid: int = 4,
) -> torch.Tensor:
    """``images`` (3, H, W) or (N, 3, H, W) corrupted by ``kind`` (one of :data:`KINDS`), seeded."""
    if kind not in KINDS:
        raise ValueError(f"unknown corruption {kind!r}; expected one of {', '.join(KINDS)}")
    if not 0.0 < crop_keep <= 1.0 or noise_std < 0 or grid < 1:
        raise ValueError(
            f"need 0 < crop_keep <= 1, noise_std >= 0, grid >= 1; got {crop_keep}, {noise_std}, {grid}"
        )
    x = _check(images)  # (N, 3, H, W)
    gen = torch.Generator().manual_seed(int(seed))
    if kind == "noise":
        y = add_noise(x, std=noise_std, gen=gen)
    elif kind == "crop":
        y = random_crop(x, keep=crop_keep, gen=gen)
    elif kind == "patch_shuffle":
        y = patch_shuffle(x, grid=grid, gen=gen)
    else:
        y = blank(x)
    return y if images.dim() == 4 else y[0]

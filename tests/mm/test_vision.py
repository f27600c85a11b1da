"""Vision towers: shapes, padded slots, lazy open_clip import, local weights, bad inputs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from mm.errors import UserError
from mm.vision import VisionConfig, build_vision_tower

TINY = {"image_size": 32, "patch_size": 8, "width": 32, "layers": 1, "heads": 2}


@pytest.mark.parametrize("kind", ["open_clip", "hf_clip", "hf_siglip"])
def test_tower_shapes_and_padded_slots(kind):
    torch.manual_seed(0)
    tower = build_vision_tower(VisionConfig(kind=kind, **TINY))
    assert (tower.num_patches, tower.dim, tower.grid) == (16, 32, (4, 4))
    x = torch.randn(2, 3, 3, 32, 32, requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    feats = tower(x, mask)
    assert feats.shape == (2, 3, 16, 32)
    assert torch.all(feats[~mask] == 0) and torch.all(feats[mask].abs().sum(-1) > 0)
    feats.sum().backward()
    assert torch.all(x.grad[~mask] == 0)
    tower.eval()
    with torch.no_grad():
        alone = tower(x[:1, :1])
        torch.testing.assert_close(tower(x, mask)[:1, :1], alone, rtol=1e-5, atol=1e-5)


def test_open_clip_named_arch_gives_patch_tokens():
    tower = build_vision_tower(VisionConfig(kind="open_clip", arch="ViT-B-32", image_size=64))
    assert (tower.num_patches, tower.dim, tower.grid) == (4, 768, (2, 2))
    assert tower(torch.randn(1, 1, 3, 64, 64)).shape == (1, 1, 4, 768)


def test_import_mm_does_not_import_open_clip():
    code = "import sys, mm, mm.vision, mm.fusion, mm.multi_image; print('open_clip' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("kind", ["open_clip", "hf_clip"])
def test_pretrained_local_weights_round_trip(tmp_path, kind):
    from safetensors.torch import save_file

    torch.manual_seed(1)
    a = build_vision_tower(VisionConfig(kind=kind, **TINY)).eval()
    sd = {k: v.contiguous() for k, v in a.encoder.state_dict().items()}
    if kind == "open_clip":
        sd = {f"visual.{k}": v for k, v in sd.items()}  # a full CLIP checkpoint names the tower "visual."
    path = tmp_path / "w.safetensors"
    save_file(sd, str(path))
    torch.manual_seed(2)
    b = build_vision_tower(VisionConfig(kind=kind, pretrained=str(path), **TINY)).eval()
    x = torch.randn(1, 2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(a(x), b(x))


def test_mismatched_weights_and_missing_file_are_user_errors(tmp_path):
    from safetensors.torch import save_file

    with pytest.raises(UserError, match="not found"):
        build_vision_tower(VisionConfig(pretrained=str(tmp_path / "nope.safetensors"), **TINY))
    path = tmp_path / "w.safetensors"
    save_file({"conv1.weight": torch.zeros(1)}, str(path))
    with pytest.raises(UserError, match="do not match"):
        build_vision_tower(VisionConfig(pretrained=str(path), **TINY))


def test_bad_config_and_inputs():
    with pytest.raises(ValueError, match="known kinds"):
        VisionConfig(kind="timm")
    with pytest.raises(ValueError, match="multiple of patch_size"):
        VisionConfig(image_size=30, patch_size=8)
    with pytest.raises(UserError, match="unknown open_clip arch"):
        build_vision_tower(VisionConfig(arch="ViT-Nope"))
    tower = build_vision_tower(VisionConfig(**TINY))
    with pytest.raises(ValueError, match="32x32"):
        tower(torch.randn(1, 1, 3, 64, 64))
    with pytest.raises(ValueError, match=r"\(B, N_img, 3, H, W\)"):
        tower(torch.randn(1, 3, 32, 32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("kind", ["open_clip", "hf_clip", "hf_siglip"])
def test_cuda_tower_matches_cpu(kind):
    torch.manual_seed(0)
    tower = build_vision_tower(VisionConfig(kind=kind, **TINY)).eval()
    x = torch.randn(2, 3, 3, 32, 32)
    mask = torch.tensor([[True, False, True], [True, True, False]])
    with torch.no_grad():
        ref = tower(x, mask)
        out = tower.cuda()(x.cuda(), mask.cuda())
    torch.testing.assert_close(out.cpu(), ref, rtol=1e-3, atol=1e-3)
    assert torch.all(out[~mask.cuda()] == 0)


def test_open_clip_timm_arch_is_a_clear_error():
    with pytest.raises(UserError, match="timm backbone"):
        build_vision_tower(VisionConfig(arch="convnext_tiny"))


def test_hf_pretrained_folder(tmp_path):
    torch.manual_seed(3)
    a = build_vision_tower(VisionConfig(kind="hf_siglip", **TINY)).eval()
    a.encoder.save_pretrained(tmp_path / "siglip")
    b = build_vision_tower(VisionConfig(kind="hf_siglip", pretrained=str(tmp_path / "siglip"), **TINY)).eval()
    x = torch.randn(1, 1, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(a(x), b(x))


def test_open_clip_patch_tokens_equal_open_clip_output_tokens():
    torch.manual_seed(0)
    tower = build_vision_tower(VisionConfig(kind="open_clip", **TINY)).eval()
    x = torch.randn(1, 2, 3, 32, 32)
    tower.encoder.output_tokens = True  # open_clip's own path: (pooled, tokens after ln_post, CLS dropped)
    with torch.no_grad():
        _, tokens = tower.encoder(x[0])
        torch.testing.assert_close(tower(x)[0], tokens, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["open_clip", "hf_clip", "hf_siglip"])
def test_every_tower_parameter_gets_a_gradient(kind):
    """No parameter is left without gradient (DDP without find_unused_parameters needs that)."""
    torch.manual_seed(0)
    tower = build_vision_tower(VisionConfig(kind=kind, **TINY))
    tower(torch.randn(1, 2, 3, 32, 32)).square().sum().backward()
    missing = [n for n, p in tower.named_parameters() if p.grad is None]
    assert missing == []


def test_full_open_clip_checkpoint_with_heads_loads(tmp_path):
    """A full CLIP state dict (visual.proj etc.) loads; the unused projection head is skipped."""
    from open_clip.model import CLIPVisionCfg, _build_vision_tower
    from safetensors.torch import save_file

    torch.manual_seed(4)
    vcfg = CLIPVisionCfg(image_size=32, patch_size=8, width=32, layers=1, head_width=16)
    full = _build_vision_tower(16, vcfg).eval()
    sd = {f"visual.{k}": v.contiguous() for k, v in full.state_dict().items()}
    assert "visual.proj" in sd
    sd["logit_scale"] = torch.ones(())  # text-side keys are ignored
    save_file(sd, str(tmp_path / "clip.safetensors"))
    tower = build_vision_tower(VisionConfig(pretrained=str(tmp_path / "clip.safetensors"), **TINY)).eval()
    x = torch.randn(1, 1, 3, 32, 32)
    full.output_tokens = True
    with torch.no_grad():
        torch.testing.assert_close(tower(x)[0], full(x[0])[1], rtol=1e-5, atol=1e-6)


def test_arch_overrides_reach_the_backbone_and_bad_keys_fail():
    tower = build_vision_tower(VisionConfig(arch_overrides={"pos_embed_type": "sin_cos_2d"}, **TINY))
    assert not tower.encoder.positional_embedding.requires_grad  # fixed sin-cos positions
    hf = build_vision_tower(VisionConfig(kind="hf_clip", arch_overrides={"hidden_act": "gelu"}, **TINY))
    assert hf.encoder.config.hidden_act == "gelu"
    with pytest.raises(UserError, match="valid CLIPVisionCfg fields"):
        build_vision_tower(VisionConfig(arch_overrides={"widht": 8}, **TINY))
    with pytest.raises(UserError, match="not a field"):
        build_vision_tower(VisionConfig(kind="hf_siglip", arch_overrides={"widht": 8}, **TINY))


def test_vision_config_loads_from_yaml_and_rejects_unknown_keys(tmp_path):
    from mm.config import ConfigError, load_config

    path = tmp_path / "v.yaml"
    path.write_text(
        "kind: hf_siglip\nimage_size: 32\npatch_size: 8\nwidth: 32\narch_overrides: {hidden_act: gelu}\n"
    )
    cfg = load_config(VisionConfig, path)
    assert cfg.kind == "hf_siglip" and cfg.arch_overrides == {"hidden_act": "gelu"}
    with pytest.raises(ConfigError, match="patch_sise"):
        load_config(VisionConfig, path, ["patch_sise=4"])

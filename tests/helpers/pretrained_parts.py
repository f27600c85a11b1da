"""Tiny pretrained parts on disk, built from configs (no hub): causal-LM folders (Qwen2, Llama) with a
tokenizer, an open_clip checkpoint of a locally registered architecture, CLIP / SigLIP vision folders."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

ASSETS_TOKENIZER = Path(__file__).resolve().parents[2] / "assets" / "tokenizer"
OPEN_CLIP_ARCH = "notelens-test-tiny-vit"
LM_DIMS = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
# A SigLIP preprocessor that is neither 0.5 nor CLIP's, so the test sees where the numbers come from.
SIGLIP_MEAN, SIGLIP_STD = [0.25, 0.5, 0.75], [0.2, 0.3, 0.4]


def _renamed_tokenizer(out: Path) -> None:
    """assets/tokenizer without NoteVLM's tokens: `<image> <im_start> <im_end> <pad>` renamed to reserved
    tokens (same size, no pad token), so loading it as an LM tokenizer adds 4 tokens."""
    out.mkdir(parents=True, exist_ok=True)
    rename = {t: f"<|reserved_{i}|>" for i, t in enumerate(("<image>", "<im_start>", "<im_end>", "<pad>"))}
    tok = json.loads((ASSETS_TOKENIZER / "tokenizer.json").read_text())
    for added in tok["added_tokens"]:
        added["content"] = rename.get(added["content"], added["content"])
    tok["model"]["vocab"] = {rename.get(k, k): v for k, v in tok["model"]["vocab"].items()}
    (out / "tokenizer.json").write_text(json.dumps(tok))
    cfg = json.loads((ASSETS_TOKENIZER / "tokenizer_config.json").read_text())
    cfg.pop("pad_token")
    cfg["extra_special_tokens"] = [rename.get(t, t) for t in cfg["extra_special_tokens"]]
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    shutil.copy(ASSETS_TOKENIZER / "chat_template.jinja", out / "chat_template.jinja")


def causal_lm_folder(out: Path, family: str, *, seed: int = 0) -> Path:
    """A 2-layer random Qwen2 (tokenizer: assets/tokenizer, which has NoteVLM's tokens) or Llama
    (tokenizer without them) AutoModelForCausalLM folder."""
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    if family == "qwen2":
        out.mkdir(parents=True, exist_ok=True)
        for f in ASSETS_TOKENIZER.iterdir():
            shutil.copy(f, out / f.name)
    else:
        _renamed_tokenizer(out)
    tok = PreTrainedTokenizerFast.from_pretrained(str(out))
    config = AutoConfig.for_model(
        family,
        vocab_size=len(tok),
        tie_word_embeddings=family == "llama",
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        **LM_DIMS,
    )
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(str(out))
    return out


def open_clip_checkpoint(out: Path, *, seed: int = 0) -> Path:
    """Register a tiny ViT architecture with open_clip (a model-config JSON folder) and save a full CLIP
    state dict of it (visual + text weights) to ``out`` (.pt)."""
    import open_clip

    arch_dir = out.parent / "open_clip_configs"
    arch_dir.mkdir(parents=True, exist_ok=True)
    arch = {
        "embed_dim": 16,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "head_width": 16, "patch_size": 8},
        "text_cfg": {"context_length": 16, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1},
    }
    (arch_dir / f"{OPEN_CLIP_ARCH}.json").write_text(json.dumps(arch))
    open_clip.add_model_config(arch_dir)
    torch.manual_seed(seed)
    model = open_clip.create_model(OPEN_CLIP_ARCH)
    torch.save(model.state_dict(), out)
    return out


def hf_vision_folder(out: Path, kind: str, *, seed: int = 0) -> Path:
    """A 1-layer random CLIPVisionModel (24 px) or SiglipVisionModel (32 px, with a preprocessor config
    of :data:`SIGLIP_MEAN` / :data:`SIGLIP_STD`) folder."""
    from transformers import CLIPVisionConfig, CLIPVisionModel, SiglipVisionConfig, SiglipVisionModel

    dims = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    torch.manual_seed(seed)
    if kind == "hf_clip":
        model = CLIPVisionModel(CLIPVisionConfig(image_size=24, patch_size=8, **dims))
    else:
        model = SiglipVisionModel(SiglipVisionConfig(image_size=32, patch_size=8, **dims))
    model.save_pretrained(str(out))
    if kind == "hf_siglip":
        pre = {"image_mean": SIGLIP_MEAN, "image_std": SIGLIP_STD, "size": {"height": 32, "width": 32}}
        (out / "preprocessor_config.json").write_text(json.dumps(pre))
    return out

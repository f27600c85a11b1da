"""Shared helpers for the NoteVLM tests: a tiny tokenizer, tiny model and processor.

While `mm.vision` / `mm.fusion` are not on main yet, small stand-ins that follow their contracts are
installed into ``sys.modules`` here (tests only); once the real modules import, they are used instead.
"""

from __future__ import annotations

import sys
import types

import torch
from torch import nn

WORDS = "a an the red blue green cat dog fork knife cup plate is there in image yes no describe note".split()
SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>", "<image>", "<im_start>", "<im_end>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} <im_end> {% endfor %}"
    "{% if add_generation_prompt %}assistant : {% endif %}"
)
IMAGE_SIZE = 16
K = 4


def _install_standins() -> None:
    try:
        import mm.vision  # noqa: F401
    except ImportError:
        from dataclasses import dataclass

        @dataclass
        class VisionConfig:
            image_size: int = IMAGE_SIZE
            patch_size: int = 4
            width: int = 32
            layers: int = 1
            heads: int = 2

        class Tower(nn.Module):
            def __init__(self, cfg: VisionConfig) -> None:
                super().__init__()
                self.grid = (cfg.image_size // cfg.patch_size,) * 2
                self.num_patches = self.grid[0] * self.grid[1]
                self.dim = cfg.width
                self.conv = nn.Conv2d(3, cfg.width, cfg.patch_size, cfg.patch_size)

            def forward(self, x: torch.Tensor, image_mask: torch.Tensor | None = None) -> torch.Tensor:
                B, N = x.shape[:2]
                y = self.conv(x.flatten(0, 1)).flatten(2).transpose(1, 2)  # (B*N, P, D)
                return y.reshape(B, N, self.num_patches, self.dim)

        mod = types.ModuleType("mm.vision")
        mod.VisionConfig = VisionConfig
        mod.build_vision_tower = Tower
        sys.modules["mm.vision"] = mod
    try:
        import mm.fusion  # noqa: F401
    except ImportError:

        class MLPFusion(nn.Module):
            def __init__(self, *, budget, d_vision, d_model, grid) -> None:
                super().__init__()
                self.budget = budget
                self.proj = nn.Sequential(
                    nn.Linear(d_vision, d_model), nn.GELU(), nn.Linear(d_model, d_model)
                )
                self.index = nn.Parameter(torch.randn(8, d_model) * 0.02)

            def forward(self, patches, image_mask):
                x = self.proj(patches)  # (B, N, P, D)
                x = nn.functional.adaptive_avg_pool1d(x.flatten(0, 1).transpose(1, 2), self.budget)
                x = x.transpose(1, 2).reshape(*patches.shape[:2], self.budget, -1)
                x = (x + self.index[: x.shape[1], None]) * image_mask[..., None, None]
                return x, image_mask[..., None].expand(-1, -1, self.budget)

        def build_fusion(kind, *, budget, d_vision, d_model, grid, **kw):
            return MLPFusion(budget=budget, d_vision=d_vision, d_model=d_model, grid=grid)

        mod = types.ModuleType("mm.fusion")
        mod.build_fusion = build_fusion
        sys.modules["mm.fusion"] = mod


_install_standins()


def tiny_tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS + [":", "user", "assistant", "1", "2"])}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        additional_special_tokens=["<image>", "<im_start>", "<im_end>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_config(**overrides):
    from mm.model.configuration import NoteVLMConfig

    kw = dict(
        vision_config={"image_size": IMAGE_SIZE, "patch_size": 4, "width": 32, "layers": 1, "heads": 2},
        fusion_kind="mlp",
        fusion_budget=K,
        text_config={
            "model_type": "qwen2",
            "vocab_size": 64,
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "max_position_embeddings": 256,
        },
        image_token_id=4,
        max_images=4,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    kw.update(overrides)
    return NoteVLMConfig(**kw)


def tiny_model(seed: int = 0, **overrides):
    from mm.model import NoteVLMForConditionalGeneration

    torch.manual_seed(seed)
    return NoteVLMForConditionalGeneration(tiny_config(**overrides)).eval()


def tiny_processor(max_length: int = 64):
    from mm.model import NoteProcessor

    return NoteProcessor(
        tokenizer=tiny_tokenizer(), image_size=IMAGE_SIZE, tokens_per_image=K, max_length=max_length
    )


def random_images(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, IMAGE_SIZE, IMAGE_SIZE, generator=g) for _ in range(n)]


def two_note_batch():
    """Model inputs of two notes (two images, one image) with answers: a small batch for logits checks."""
    return tiny_processor()(
        [random_images(2), random_images(1, seed=1)],
        ["describe the note", "is there a cat"],
        ["a red cat", "yes"],
    )

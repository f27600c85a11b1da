"""Shared fixtures for the align/SFT/compare tests: a tiny world on disk and tiny configs."""

from __future__ import annotations

from pathlib import Path

import yaml

TINY_VISION = {"kind": "open_clip", "image_size": 32, "patch_size": 8, "width": 32, "layers": 1, "heads": 2}
TINY_TEXT = {
    "model_type": "qwen2",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
}


def make_world(folder: Path, notes: int = 40, seed: int = 3) -> Path:
    """A small world note folder (train/val/test splits forced so every split has notes)."""
    from mm.data.format import read_notes, write_notes
    from mm.world.config import WorldConfig
    from mm.world.generate import write_world

    write_world(WorldConfig(notes=notes, seed=seed, questions_per_note=2), folder)
    ns = read_notes(folder)
    for i, n in enumerate(ns):
        n.split = "test" if i % 8 == 0 else "train"
    write_notes(ns, folder)
    return folder


def tiny_train_config(path: Path, **sections) -> Path:
    """Write a tiny mm train YAML (2 steps) and return its path; ``sections`` update top-level sections."""
    cfg = {
        "model": {
            "vision": dict(TINY_VISION),
            "fusion": {"kind": "mlp", "budget": 4},
            "text": dict(TINY_TEXT),
            "max_length": 200,
        },
        "tasks": {"kinds": ["caption", "question"], "questions_per_note": 1},
        "optim": {"lr": 0.003, "warmup_steps": 1},
        "train": {"stage": "sft", "steps": 2, "batch_size": 4, "log_every": 1, "eval_every": 2,
                  "checkpoint_every": 1},
        "eval": {"notes": 2, "questions": 2, "batch_size": 2, "max_new_tokens": 6},
    }  # fmt: skip
    for k, v in sections.items():
        cfg[k] = {**cfg.get(k, {}), **v}
    path.write_text(yaml.safe_dump(cfg))
    return path

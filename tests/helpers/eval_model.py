"""Builders for model-driven eval / pair tests: a saved tiny random NoteVLM and a 2-note world folder."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.helpers.model import IMAGE_SIZE, tiny_model, tiny_processor  # noqa: E402

NOTE_OBJECTS = [[["fork", "cup"]], [["dog"], ["plate", "knife"]]]
"""Per note, per image: the world categories present."""
NOTE_TEXTS = ["A photo from a kitchen. It shows a fork and a cup.", "Two photos. In the first photo, a dog."]


def make_model_dir(root: Path) -> Path:
    """A random tiny NoteVLM + processor saved with save_pretrained (what `mm train` writes)."""
    text = {
        "model_type": "qwen2",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "initializer_range": 0.3,
    }
    d = root / "model"
    tiny_model(seed=3, text_config=text).save_pretrained(str(d))
    tiny_processor(max_length=96).save_pretrained(d)
    return d


def make_data_dir(root: Path, split: str = "test") -> Path:
    """Two world notes (1 and 2 images) with random 16x16 PNGs, in ``split``."""
    import cv2

    from mm.data.format import Note, ObjectAnnotation, write_notes

    d = root / "data"
    (d / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    notes = []
    for i, (objs, text) in enumerate(zip(NOTE_OBJECTS, NOTE_TEXTS)):
        paths = []
        for k in range(len(objs)):
            rel = f"images/n{i}_{k}.png"
            cv2.imwrite(str(d / rel), rng.integers(0, 256, (IMAGE_SIZE, IMAGE_SIZE, 3), dtype=np.uint8))
            paths.append(rel)
        notes.append(
            Note(
                id=f"n{i}",
                images=paths,
                text=text,
                split=split,
                objects=[[ObjectAnnotation(category=c, bbox=(0, 0, 4, 4)) for c in cats] for cats in objs],
            )
        )
    write_notes(notes, d)
    return d

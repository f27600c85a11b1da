"""NoteDataset decodes images once and exactly; collate pads image slots with a mask."""

import numpy as np
import pytest
import torch

from mm.data.dataset import NoteDataset, collate_notes
from mm.data.format import FormatError
from mm.world.config import WorldConfig
from mm.world.generate import generate_note, write_world


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    out = tmp_path_factory.mktemp("d") / "w"
    write_world(WorldConfig(notes=24, val_fraction=0.25, test_fraction=0.0), out)
    return out


def test_items_and_exact_pixels(folder):
    ds = NoteDataset(folder)
    assert len(ds) == 24
    item = ds[5]
    _, images = generate_note(WorldConfig(), 5)
    px = item["pixel_values"]
    assert px.dtype == torch.float32 and px.shape == (len(images), 3, 64, 64)
    expect = torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 255.0
    assert torch.equal(px, expect)
    assert torch.equal(ds.pixels_uint8(5), expect.mul(255).round().byte())
    assert item["text"] == ds.notes[5].text and len(item["objects"]) == len(images)


def test_split_and_standardisation(folder):
    val = NoteDataset(folder, split="val")
    assert 0 < len(val) < 24 and all(n.split == "val" for n in val.notes)
    std = NoteDataset(folder, split="val", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    assert torch.allclose(std[0]["pixel_values"], val[0]["pixel_values"] * 2 - 1)
    with pytest.raises(ValueError, match="both mean and std"):
        NoteDataset(folder, mean=(0.5, 0.5, 0.5))


def test_collate_pads_and_masks(folder):
    ds = NoteDataset(folder)
    batch = [ds[i] for i in range(8)]
    counts = [b["pixel_values"].shape[0] for b in batch]
    out = collate_notes(batch)
    B, N = out["pixel_values"].shape[:2]
    assert (B, N) == (8, max(counts)) and out["image_mask"].dtype == torch.bool
    assert out["image_mask"].sum(1).tolist() == counts == out["n_images"].tolist()
    for i, k in enumerate(counts):
        assert torch.equal(out["pixel_values"][i, :k], batch[i]["pixel_values"])
        assert not out["pixel_values"][i, k:].any()
    assert out["ids"] == [b["id"] for b in batch] and len(out["text"]) == 8
    with pytest.raises(ValueError, match="max_images=1"):
        collate_notes(batch, max_images=1)


def test_missing_image_is_named(folder, tmp_path):
    import shutil

    copy = tmp_path / "c"
    shutil.copytree(folder, copy)
    victim = sorted((copy / "images").iterdir())[0]
    victim.unlink()
    with pytest.raises(FormatError, match=victim.name):
        NoteDataset(copy)


def test_limit_decodes_prefix_and_pool_matches_serial(folder):
    full = NoteDataset(folder, workers=1)
    pooled = NoteDataset(folder, workers=3)
    assert len(pooled) == len(full) == 24
    for i in range(24):
        assert torch.equal(pooled.pixels_uint8(i), full.pixels_uint8(i))
        assert pooled.pixels_uint8(i).is_contiguous()
    head = NoteDataset(folder, split="train", limit=5)
    train = NoteDataset(folder, split="train")
    assert [n.id for n in head.notes] == [n.id for n in train.notes[:5]] and len(head.images) == 5
    assert torch.equal(head[4]["pixel_values"], train[4]["pixel_values"])
    with pytest.raises(ValueError, match="limit must be >= 0"):
        NoteDataset(folder, limit=-1)
    with pytest.raises(ValueError, match="workers must be >= 1"):
        NoteDataset(folder, workers=0)

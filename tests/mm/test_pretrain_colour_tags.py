"""Colour tag classes of the pretraining tagger (``loss.tag_colours``): class lists and golden multi-hots."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mm.config import ConfigError, load_config
from mm.data.format import Note, ObjectAnnotation, write_notes
from mm.data.tokenizer import load_tokenizer
from mm.errors import UserError
from mm.train import pretrain
from mm.world.vocab import CATEGORY_NAMES, COLORS

ROOT = Path(__file__).resolve().parents[2]
TEST_CFG = ROOT / "tests/configs/pretrain_test.yaml"
NC, NK = len(CATEGORY_NAMES), len(COLORS)


def _obj(category: str, color: str | None) -> ObjectAnnotation:
    return ObjectAnnotation(category=category, bbox=(0, 0, 4, 4), color=color)


def _folder(tmp_path: Path, objects: list[list[ObjectAnnotation]]) -> Path:
    """One hand-made note with len(objects) 8x8 black images."""
    (tmp_path / "images").mkdir(parents=True)
    images = []
    for k in range(len(objects)):
        Image.fromarray(np.zeros((8, 8, 3), dtype=np.uint8)).save(tmp_path / f"images/n0_{k}.png")
        images.append(f"images/n0_{k}.png")
    write_notes([Note(id="n0", images=images, text="a red fork", objects=objects)], tmp_path)
    return tmp_path


def _cfg(tag_colours: str):
    return load_config(
        pretrain.PretrainConfig, TEST_CFG, ["loss.tag_weight=1.0", f"loss.tag_colours={tag_colours}"]
    )


def test_class_lists_per_option():
    assert pretrain.tag_classes(_cfg("none")) == list(CATEGORY_NAMES)
    colour = pretrain.tag_classes(_cfg("colour"))
    assert colour == [*CATEGORY_NAMES, *(f"colour:{c}" for c in COLORS)] and len(colour) == NC + NK
    pair = pretrain.tag_classes(_cfg("pair"))
    assert pair[: NC + NK] == colour and len(pair) == NC + NK + NC * NK
    assert (
        pair[NC + NK] == f"{COLORS[0]} {CATEGORY_NAMES[0]}"
        and pair[-1] == f"{COLORS[-1]} {CATEGORY_NAMES[-1]}"
    )
    assert len(set(pair)) == len(pair)


def test_golden_multi_hot_of_a_hand_made_note(tmp_path):
    """Image 0: a red fork and a blue fork; image 1: a red cup; slots 2-3 padding."""
    folder = _folder(tmp_path, [[_obj("fork", "red"), _obj("fork", "blue")], [_obj("cup", "red")]])
    kw = {"tokenizer": load_tokenizer(), "max_images": 4, "max_len": 16}
    for option, want in {
        "none": [{"fork"}, {"cup"}],
        "colour": [{"fork", "colour:red", "colour:blue"}, {"cup", "colour:red"}],
        "pair": [
            {"fork", "colour:red", "colour:blue", "red fork", "blue fork"},
            {"cup", "colour:red", "red cup"},
        ],
    }.items():
        classes = pretrain.tag_classes(_cfg(option))
        tags = pretrain.load_split(folder, "train", tag_classes=classes, **kw).tags  # (1, 4, C)
        assert tags.shape == (1, 4, len(classes)) and tags.dtype.is_floating_point is False
        for k in range(2):
            assert {classes[c] for c in tags[0, k].nonzero().flatten().tolist()} == want[k], (option, k)
        assert int(tags[0].sum()) == sum(len(w) for w in want)  # padded slots stay all-zero
        assert not tags[0, 2:].any()
    # exact positions in the "pair" vector
    classes = pretrain.tag_classes(_cfg("pair"))
    tags = pretrain.load_split(folder, "train", tag_classes=classes, **kw).tags
    red, blue = COLORS.index("red"), COLORS.index("blue")
    fork = CATEGORY_NAMES.index("fork")
    assert tags[0, 0, NC + red] and tags[0, 0, NC + blue]
    assert tags[0, 0, NC + NK + fork * NK + red] and tags[0, 0, NC + NK + fork * NK + blue]


def test_object_tags_names():
    colour = pretrain.tag_classes(_cfg("colour"))
    assert pretrain.object_tags("fork", "red", colour) == ["fork", "colour:red"]
    assert pretrain.object_tags("fork", None, list(CATEGORY_NAMES)) == ["fork"]  # colour not asked for
    with pytest.raises(UserError, match="has no colour"):
        pretrain.object_tags("fork", None, colour)


def test_missing_or_unknown_colour_is_an_error(tmp_path):
    kw = {"tokenizer": load_tokenizer(), "max_images": 4, "max_len": 16}
    folder = _folder(tmp_path, [[_obj("fork", None)]])
    assert pretrain.load_split(
        folder, "train", tag_classes=pretrain.tag_classes(_cfg("none")), **kw
    ).tags.any()
    with pytest.raises(UserError, match="tag_colours: none"):
        pretrain.load_split(folder, "train", tag_classes=pretrain.tag_classes(_cfg("colour")), **kw)
    other = _folder(tmp_path / "other", [[_obj("fork", "magenta")]])
    with pytest.raises(UserError, match="not a tag class"):
        pretrain.load_split(other, "train", tag_classes=pretrain.tag_classes(_cfg("colour")), **kw)


def test_bad_option_values():
    with pytest.raises(ConfigError, match="tag_colours"):
        _cfg("colours")
    with pytest.raises(ConfigError, match="tag_weight > 0"):
        load_config(pretrain.PretrainConfig, TEST_CFG, ["loss.tag_weight=0", "loss.tag_colours=colour"])


def test_cells_an_object_tags():
    # 64x64 image, 4x4 grid: cell centres at 8, 24, 40, 56
    assert pretrain.cell_objects((27, 29, 50, 53), (4, 4), (64, 64)) == [10]  # covers the (40, 40) centre
    assert pretrain.cell_objects((0, 0, 32, 32), (4, 4), (64, 64)) == [0, 1, 4, 5]
    assert pretrain.cell_objects((2, 48, 16, 62), (4, 4), (64, 64)) == [12]  # covers the (8, 56) centre
    assert pretrain.cell_objects((10, 10, 14, 14), (4, 4), (64, 64)) == [0]  # no centre covered: its own cell
    assert pretrain.cell_objects((60, 60, 64, 64), (2, 2), (64, 64)) == [3]


def test_golden_per_token_tags(tmp_path):
    """Image 0: a red fork on the top-left quarter, a blue cup in the bottom-right cell; 4x4 grid."""
    objects = [[
        ObjectAnnotation(category="fork", bbox=(0, 0, 32, 32), color="red"),
        ObjectAnnotation(category="cup", bbox=(50, 50, 62, 62), color="blue"),
    ]]  # fmt: skip
    (tmp_path / "images").mkdir()
    Image.fromarray(np.zeros((64, 64, 3), dtype=np.uint8)).save(tmp_path / "images/n0_0.png")
    write_notes([Note(id="n0", images=["images/n0_0.png"], text="a red fork", objects=objects)], tmp_path)
    cfg = load_config(
        pretrain.PretrainConfig,
        TEST_CFG,
        ["loss.tag_weight=1.0", "loss.tag_colours=colour", "loss.tag_scope=token",
         "model.vision.image_size=64", "model.vision.patch_size=16"],
    )  # fmt: skip
    classes, grid = pretrain.tag_classes(cfg), pretrain.tag_grid(cfg)
    assert grid == (4, 4)
    kw = {"tokenizer": load_tokenizer(), "max_images": 2, "max_len": 16}
    tags = pretrain.load_split(tmp_path, "train", tag_classes=classes, tag_grid=grid, **kw).tags
    assert tags.shape == (1, 2, 16, NC + NK)
    on = {k: {classes[c] for c in tags[0, 0, k].nonzero().flatten().tolist()} for k in range(16)}
    fork, cup = {"fork", "colour:red"}, {"cup", "colour:blue"}
    assert on == {k: fork if k in (0, 1, 4, 5) else cup if k == 15 else set() for k in range(16)}
    assert not tags[0, 1].any()  # the padded image slot


def test_per_token_loss_and_model_checks():
    cfg = load_config(pretrain.PretrainConfig, TEST_CFG, ["loss.tag_weight=1.0", "loss.tag_scope=token"])
    logits = torch.zeros(1, 2, 3, 2)  # (B, N, K, C): BCE of logit 0 is ln 2 whatever the target
    tags = torch.zeros(1, 2, 3, 2, dtype=torch.bool)
    got = pretrain.tag_loss(logits, tags, torch.tensor([[True, False]]))
    assert got.item() == pytest.approx(math.log(2.0))
    with pytest.raises(ValueError, match="differ"):
        pretrain.tag_loss(logits, tags[:, :, 0], torch.tensor([[True, True]]))
    with pytest.raises(ConfigError, match="tag_scope"):
        load_config(pretrain.PretrainConfig, TEST_CFG, ["loss.tag_weight=1.0", "loss.tag_scope=patch"])
    # the test tower's 4x4 patches pooled to 4 tokens: a token is no patch
    with pytest.raises(UserError, match="tokens must be the patches"):
        pretrain.NoteTextModel(cfg=cfg.model, loss=cfg.loss, vocab_size=32, num_tags=4)
    cfg = load_config(
        pretrain.PretrainConfig,
        TEST_CFG,
        ["loss.tag_weight=1.0", "loss.tag_scope=token", "model.fusion.budget=16"],
    )
    model = pretrain.NoteTextModel(cfg=cfg.model, loss=cfg.loss, vocab_size=32, num_tags=4).eval()
    mask = torch.tensor([[True, False]])
    with torch.no_grad():
        feats, logits = model.encode_images(torch.zeros(1, 2, 3, 64, 64), mask, tags=True)
    assert feats.shape == (1, 2, 32) and logits.shape == (1, 2, 16, 4)
    assert not logits[0, 1].any()  # padded slot: zeros


def test_both_scopes_add_the_image_max_to_the_per_token_loss():
    # one image, 2 tokens, 2 classes; token 0 holds class 0, token 1 nothing; image max: class 0 only
    logits = torch.tensor([[[[2.0, -1.0], [0.5, 0.0]]]], dtype=torch.float64)  # (B, N, K, C) = (1, 1, 2, 2)
    tags = torch.tensor([[[[1, 0], [0, 0]]]], dtype=torch.bool)
    mask = torch.tensor([[True]])

    def bce(x: float, y: int) -> float:
        return -math.log(1 / (1 + math.exp(-x))) if y else -math.log(1 - 1 / (1 + math.exp(-x)))

    per_token = (bce(2.0, 1) + bce(-1.0, 0) + bce(0.5, 0) + bce(0.0, 0)) / 4
    image = (bce(2.0, 1) + bce(0.0, 0)) / 2  # max over tokens: logits (2.0, 0.0), tags (1, 0)
    assert pretrain.scoped_tag_loss(logits, tags, mask, "token").item() == pytest.approx(per_token)
    assert pretrain.scoped_tag_loss(logits, tags, mask, "both").item() == pytest.approx(per_token + image)
    cfg = load_config(
        pretrain.PretrainConfig, TEST_CFG,
        ["loss.tag_weight=1.0", "loss.tag_scope=both", "model.vision.image_size=64",
         "model.vision.patch_size=16"],
    )  # fmt: skip
    assert pretrain.tag_grid(cfg) == (4, 4)  # per-token tags loaded, as for "token"

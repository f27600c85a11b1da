"""NoteVLM from pretrained parts: a causal-LM folder (Qwen2, Llama), an open_clip checkpoint or a
transformers CLIP / SigLIP folder; saved folders that load without their sources and without notelens."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from mm.cli import main
from mm.config import ConfigError, load_config
from mm.model import NoteProcessor
from mm.train.sft.config import TrainConfig
from mm.train.sft.model import build_model_and_processor
from mm.vision import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from tests.helpers.pretrained_parts import (
    OPEN_CLIP_ARCH,
    SIGLIP_MEAN,
    SIGLIP_STD,
    causal_lm_folder,
    hf_vision_folder,
    open_clip_checkpoint,
)
from tests.helpers.sft import make_world, tiny_train_config


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("parts")
    return {
        "tmp": tmp,
        "world": make_world(tmp / "notes", notes=16),
        "qwen2": causal_lm_folder(tmp / "qwen2", "qwen2"),
        "llama": causal_lm_folder(tmp / "llama", "llama"),
        "open_clip": open_clip_checkpoint(tmp / "tiny_vit.pt"),
        "hf_clip": hf_vision_folder(tmp / "clip", "hf_clip"),
        "hf_siglip": hf_vision_folder(tmp / "siglip", "hf_siglip"),
    }


def _vision(parts, kind: str, **extra) -> dict:
    if kind == "open_clip":
        return {
            "kind": kind,
            "arch": OPEN_CLIP_ARCH,
            "image_size": None,
            "pretrained": str(parts[kind]),
            **extra,
        }
    return {"kind": kind, "pretrained": str(parts[kind]), **extra}


def _config(parts, text: str, vision: str, **extra) -> TrainConfig:
    overrides = [
        f"model.text={{pretrained: {parts[text]}}}",
        f"model.vision={json.dumps(_vision(parts, vision, **extra))}",
        "model.fusion.budget=4",
        "model.max_length=200",
    ]
    return load_config(TrainConfig, None, overrides)


def _lm_state(folder: Path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    return {**lm.get_decoder().state_dict(), "lm_head.weight": lm.get_output_embeddings().weight.detach()}


@pytest.mark.parametrize(
    ("text", "vision", "mean", "std", "size"),
    [
        ("qwen2", "open_clip", OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, 32),  # open_clip's defaults (no tag)
        ("llama", "hf_clip", OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, 24),  # CLIP's defaults (no preprocessor)
        ("llama", "hf_siglip", SIGLIP_MEAN, SIGLIP_STD, 32),  # the folder's preprocessor_config.json
    ],
)
def test_parts_are_the_sources(parts, text, vision, mean, std, size):
    torch.manual_seed(0)
    model, proc, origin = build_model_and_processor(_config(parts, text, vision))
    # the tower's input: size and normalisation of the checkpoint, not the 64 px / 0.5 defaults
    assert proc.image_size == size and tuple(model.vision_tower.image_size) == (size, size)
    assert proc.image_mean == pytest.approx(mean, abs=0) and proc.image_std == pytest.approx(std, abs=0)
    # LM weights at step 0 are the folder's; new vocabulary rows are the mean of the old ones
    src = _lm_state(parts[text])
    ours = {**model.language_model.state_dict(), "lm_head.weight": model.lm_head.weight.detach()}
    assert set(ours) == set(src)
    V = src["embed_tokens.weight"].shape[0]
    added = {"qwen2": 0, "llama": 4}[text]  # the Llama tokenizer lacks <image> <im_start> <im_end> <pad>
    assert origin["text"]["new_rows"] == added and model.config.text_config.vocab_size == V + added
    for k, v in src.items():
        if k in ("embed_tokens.weight", "lm_head.weight"):
            assert torch.equal(ours[k][:V], v) and torch.equal(ours[k][V:], v.mean(0).expand(added, -1)), k
        else:
            assert torch.equal(ours[k], v), k
    assert model.config.text_config.hidden_size == 32 and model.config.tie_word_embeddings == (
        text == "llama"
    )
    tok = proc.tokenizer
    assert tok.chat_template and "<|assistant|>" in tok.chat_template  # the folder's template
    assert tok.convert_tokens_to_ids("<image>") == model.config.image_token_id
    # the tower's weights are the checkpoint's
    if vision == "open_clip":
        ckpt = torch.load(parts["open_clip"], weights_only=True)
        pairs = [(ckpt[f"visual.{k}"], v) for k, v in model.vision_tower.encoder.state_dict().items()]
    else:
        from safetensors.torch import load_file

        ckpt = load_file(str(parts[vision] / "model.safetensors"))
        pairs = [(ckpt[k], v) for k, v in model.vision_tower.encoder.state_dict().items()]
    assert len(pairs) > 5 and all(torch.equal(a, b) for a, b in pairs)


def test_typed_text_key_and_bad_sources(parts, capsys):
    yaml = tiny_train_config(parts["tmp"] / "typed.yaml")  # model.text: a qwen2 config
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['pretrainde'\]"):
        load_config(TrainConfig, yaml, [f"model.text.pretrainde={parts['qwen2']}"])
    with pytest.raises(
        ConfigError, match=r"neither pretrained nor model_type \(keys given: \['pretrainde'\]"
    ):
        load_config(TrainConfig, None, [f"model.text.pretrainde={parts['qwen2']}"])
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['hidden_sise'\]"):
        load_config(TrainConfig, yaml, ["model.text.hidden_sise=64"])
    with pytest.raises(ConfigError, match="has no config.json"):
        load_config(TrainConfig, None, [f"model.text.pretrained={parts['tmp'] / 'missing'}"])
    with pytest.raises(ConfigError, match=r"unknown key 'model.vision.resise'"):
        load_config(TrainConfig, None, ["model.vision.resise=pad"])
    with pytest.raises(ConfigError, match="resize must be one of"):
        load_config(TrainConfig, None, ["model.vision.resize=squash"])
    # a YAML's LM dims next to pretrained: the disagreement is named, exit 2
    cfg = tiny_train_config(parts["tmp"] / "bad.yaml")
    code = main(
        [
            "train",
            "--config",
            str(cfg),
            "--out",
            str(parts["tmp"] / "bad"),
            "--data",
            str(parts["world"]),
            "--no-progress",
            "--set",
            f"model.text.pretrained={parts['qwen2']}",
        ]
    )
    assert code == 2 and "num_hidden_layers=1 (folder: 2)" in capsys.readouterr().err


def _image(w: int, h: int, left: tuple, right: tuple) -> Image.Image:
    a = np.zeros((h, w, 3), np.uint8)
    a[:, : w // 2], a[:, w // 2 :] = left, right
    return Image.fromarray(a)


def test_aspect_preserving_resize_golden():
    from mm.data.tokenizer import load_tokenizer

    def proc(resize):
        return NoteProcessor(
            tokenizer=load_tokenizer(),
            image_size=4,
            tokens_per_image=1,
            max_length=64,
            image_mean=(0.5, 0.25, 0.0),
            image_std=(0.5, 0.25, 1.0),
            resize=resize,
        )

    red = _image(8, 4, (255, 0, 0), (255, 0, 0))  # 2:1, one colour
    got = proc("pad").load_image(red)  # letterbox: 4x2 content in rows 1-2, rows 0 and 3 the mean colour
    want = torch.zeros(3, 4, 4)
    want[:, 1:3] = torch.tensor([1.0, -1.0, 0.0]).view(3, 1, 1)  # (255/255 - 0.5) / 0.5, (0 - .25) / .25, 0
    assert torch.equal(got, want)
    halves = _image(8, 4, (255, 0, 0), (0, 0, 255))
    got = proc("crop").load_image(halves)  # centre crop of the 8x4 image: columns 2-5
    want = torch.empty(3, 4, 4)
    want[:, :, :2] = torch.tensor([1.0, -1.0, 0.0]).view(3, 1, 1)
    want[:, :, 2:] = torch.tensor([-1.0, -1.0, 1.0]).view(3, 1, 1)
    assert torch.equal(got, want)
    stretch = proc("stretch").load_image(halves)  # aspect ignored: red left half, blue right half, 4x4
    assert stretch.shape == (3, 4, 4) and torch.equal(stretch[:, :, 0], want[:, :, 0])
    # tensors (3, H, W) in [0, 1] take the same path: 2:1 letterbox
    t = torch.ones(3, 4, 8)
    assert torch.equal(proc("pad").load_image(t)[:, [0, 3]], torch.zeros(3, 2, 4))
    # square images are the same in every mode
    sq = _image(8, 8, (10, 200, 30), (90, 40, 250))
    assert torch.equal(proc("pad").load_image(sq), proc("stretch").load_image(sq))
    assert torch.equal(proc("crop").load_image(sq), proc("stretch").load_image(sq))
    saved = proc("pad").to_dict()
    assert saved["resize"] == "pad"


def test_training_images_follow_the_resize_mode(tmp_path):
    from types import SimpleNamespace

    from mm.train.sft_data import load_note_images

    _image(8, 4, (255, 0, 0), (255, 0, 0)).save(tmp_path / "red.png")
    _image(8, 4, (255, 0, 0), (0, 0, 255)).save(tmp_path / "halves.png")
    note = SimpleNamespace(id="n", images=["red.png", "halves.png"])
    padded = load_note_images([note], tmp_path, 4, resize="pad", fill=(0.5, 0.25, 0.0))[0]  # (2, 3, 4, 4) u8
    assert padded.dtype == torch.uint8 and padded.shape == (2, 3, 4, 4)
    assert padded[0, :, [0, 3]].tolist() == [
        [[128] * 4] * 2,
        [[64] * 4] * 2,
        [[0] * 4] * 2,
    ]  # round(fill*255)
    assert padded[0, :, 1:3].tolist() == [[[255] * 4] * 2, [[0] * 4] * 2, [[0] * 4] * 2]
    cropped = load_note_images([note], tmp_path, 4, resize="crop")[0][1]  # columns 2-5 of 8
    assert cropped[:, :, :2].flatten(1).tolist() == [[255] * 8, [0] * 8, [0] * 8]
    assert cropped[:, :, 2:].flatten(1).tolist() == [[0] * 8, [0] * 8, [255] * 8]


REMOTE = r"""
import sys
sys.modules["mm"] = None  # notelens is installed editable in this environment: make it unimportable
try:
    import mm  # noqa: F401
    raise SystemExit("notelens is importable")
except ImportError:
    pass
import torch
from transformers import AutoModelForImageTextToText
from transformers.dynamic_module_utils import get_class_from_dynamic_module

folder, ref = sys.argv[1], torch.load(sys.argv[2])
model = AutoModelForImageTextToText.from_pretrained(folder, trust_remote_code=True).eval()
Processor = get_class_from_dynamic_module("processing_notevlm.NoteProcessor", folder)
batch = Processor.from_pretrained(folder)([[ref["image"]]], [ref["prompt"]])  # the image as a path
with torch.no_grad():
    logits = model(**batch).logits
assert torch.equal(batch["input_ids"], ref["input_ids"]), "input ids differ"
print("MAXDIFF", (logits - ref["logits"]).abs().max().item(), type(model).__module__)
"""


@pytest.mark.parametrize(("text", "vision"), [("qwen2", "open_clip"), ("llama", "hf_siglip")])
def test_train_save_load_without_sources_or_notelens(parts, tmp_path, text, vision):
    from mm.model import NoteVLMForConditionalGeneration

    src = tmp_path / "src"  # copies of the parts, deleted after training
    shutil.copytree(parts[text], src / text)
    if vision == "open_clip":
        shutil.copy(parts[vision], src / "tiny_vit.pt")
        vis = _vision({vision: src / "tiny_vit.pt"}, vision, resize="pad")
    else:
        shutil.copytree(parts[vision], src / vision)
        vis = _vision({vision: src / vision}, vision, resize="crop")
    cfg = tiny_train_config(
        tmp_path / "c.yaml", model={"text": {"pretrained": str(src / text)}, "vision": vis}
    )
    out = tmp_path / "out"
    assert (
        main(
            ["train", "--config", str(cfg), "--out", str(out), "--data", str(parts["world"]), "--no-progress"]
        )
        == 0
    )
    result = json.loads((out / "result.json").read_text())
    assert result["origin"]["text"]["from"] == str(src / text)
    shutil.rmtree(src)
    folder = out / "model"
    assert str(tmp_path) not in (folder / "config.json").read_text()  # no path to a source
    config = json.loads((folder / "config.json").read_text())
    assert (
        config["auto_map"]["AutoModelForImageTextToText"]
        == "modeling_notevlm.NoteVLMForConditionalGeneration"
    )
    model = NoteVLMForConditionalGeneration.from_pretrained(str(folder)).eval()
    proc = NoteProcessor.from_pretrained(folder)
    assert proc.resize == vis["resize"] and proc.image_mean == tuple(model.config.vision_config["image_mean"])
    image = tmp_path / "photo.png"
    _image(48, 24, (200, 30, 30), (20, 90, 220)).save(image)
    batch = proc([[image]], ["Describe the note."])
    with torch.no_grad():
        logits = model(**batch).logits
    ref = tmp_path / "ref.pt"
    torch.save(
        {
            "image": str(image),
            "prompt": "Describe the note.",
            "input_ids": batch["input_ids"],
            "logits": logits,
        },
        ref,
    )
    moved = shutil.copytree(folder, tmp_path / "elsewhere")  # a copy, in a process without notelens
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(tmp_path / "hf_modules"), HF_HUB_OFFLINE="1")
    run = subprocess.run(
        [sys.executable, "-I", "-c", REMOTE, str(moved), str(ref)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(x for x in run.stdout.splitlines() if x.startswith("MAXDIFF"))
    assert float(line.split()[1]) == 0.0 and "transformers_modules" in line


def test_text_hidden_size_reads_the_pretrained_folder(tmp_path):
    """The pipeline's and the harness's width checks see a pretrained LM's width, not None."""
    import json

    from mm.model.pretrained_lm import text_hidden_size

    folder = tmp_path / "lm"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen2", "hidden_size": 96}))
    assert text_hidden_size({"pretrained": str(folder)}) == 96
    assert text_hidden_size({"pretrained": str(folder), "hidden_size": 64}) == 96  # the folder wins
    assert text_hidden_size({"model_type": "qwen2", "hidden_size": 64}) == 64
    assert text_hidden_size({"model_type": "qwen2"}) is None

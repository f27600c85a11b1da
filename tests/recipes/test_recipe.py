"""The real-scale recipe (configs/recipes/README.md), dry-run end to end on tiny stand-ins.

The commands are read from the README's ``recipe`` block and run as written, in a scratch folder laid
out like the README's ``data/`` (a few LLaVA-Pretrain and LLaVA-1.5-mix records, RLAIF-V records with
an image file and with inline bytes, a POPE question file, COCO val images and an instances file), with
``$LM`` / ``$VISION`` a tiny Qwen2 (tests/helpers/pretrained_parts.py) and a tiny full SigLIP folder
(vision and text towers, as the hub's SigLIP checkpoints), and ``$R`` the
recipe's configs with the same keys and tiny values (model sizes, steps, batch sizes).
"""

from __future__ import annotations

import base64
import io
import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers.pretrained_parts import LM_DIMS, causal_lm_folder
from tests.mm.adapter_helpers import random_image

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "configs" / "recipes"
TINY_TEXT = (
    {"model_type": "qwen2"}
    | {k: LM_DIMS[k] for k in ("hidden_size", "intermediate_size")}
    | {
        "num_hidden_layers": LM_DIMS["num_hidden_layers"],
        "num_attention_heads": LM_DIMS["num_attention_heads"],
        "num_key_value_heads": LM_DIMS["num_key_value_heads"],
        "tie_word_embeddings": False,
    }
)
"""The tiny Qwen2 folder's architecture under the recipe's ``model.text`` keys."""
SMALL = {
    "align": {
        "model": {"text": TINY_TEXT, "fusion": {"budget": 16}},  # 32 px / 8 px SigLIP: 16 patches
        "optim": {"warmup_steps": 1},
        "train": {"steps": 2, "batch_size": 4, "eval_every": 2, "checkpoint_every": 2, "precision": "fp32"},
        "eval": {"notes": 2, "batch_size": 2, "max_new_tokens": 4},
    },
    "sft_lora": {
        "model": {"text": TINY_TEXT, "fusion": {"budget": 16}},
        "lora": {"r": 4, "alpha": 8},
        "optim": {"warmup_steps": 1},
        "train": {"steps": 2, "batch_size": 2, "eval_every": 2, "checkpoint_every": 2, "precision": "fp32"},
        "eval": {"notes": 2, "batch_size": 2, "max_new_tokens": 4},
    },
    "dpo_files": {
        "lora": {"r": 4, "alpha": 8},
        "data": {"batch_size": 2, "max_answer_tokens": 16},
        "optim": {"warmup_steps": 1},
        "train": {"steps": 2, "checkpoint_every": 2, "precision": "fp32"},
    },
}
"""Per recipe config: the values the stand-in run changes (every key exists in the recipe's file; fp32, as
bf16 autocast is emulated on the CPU)."""


def _merge(base: dict[str, Any], small: dict[str, Any], where: str = "") -> dict[str, Any]:
    out = dict(base)
    for k, v in small.items():
        assert k in base, f"{where}{k} is not a key of the recipe's config"
        out[k] = _merge(base[k], v, f"{where}{k}.") if isinstance(v, dict) and k != "text" else v
    return out


def _keys(d: Any, prefix: str = "") -> set[str]:
    if not isinstance(d, dict):
        return {prefix}
    return set().union(*(_keys(v, f"{prefix}{k}.") for k, v in d.items()))


def recipe_commands(readme: Path, env: dict[str, str]) -> list[list[str]]:
    """The README's recipe block as argv lists: continuation lines joined, comments and variable
    assignments dropped, ``$VARS`` from ``env``, the launcher (``$RUN``) removed."""
    text = readme.read_text()
    block = text.split("<!-- recipe:begin -->")[1].split("<!-- recipe:end -->")[0]
    block = block.replace("\\\n", " ")
    commands = []
    for line in block.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "```")) or re.match(r"^[A-Z_]+=", line):
            continue
        line = line.split(" # ")[0]
        argv = shlex.split(re.sub(r"\$([A-Z_]+)", lambda m: env[m.group(1)], line))
        if argv[:2] == ["python", "-m"]:
            argv = argv[2:]
        commands.append(argv)
    return commands


def siglip_full_folder(out: Path, *, seed: int = 0) -> Path:
    """A tiny random full `SiglipModel` folder (vision + text towers, as google/siglip-base-patch16-224 is)
    with a SigLIP preprocessor config: 32 px images, 8 px patches (16 patches)."""
    import torch
    from transformers import SiglipConfig, SiglipModel

    dims = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2}
    config = SiglipConfig(
        text_config={**dims, "vocab_size": 64, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0},
        vision_config={**dims, "image_size": 32, "patch_size": 8},
    )
    torch.manual_seed(seed)
    SiglipModel(config).save_pretrained(str(out))
    pre = {"image_processor_type": "SiglipImageProcessor", "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
           "size": {"height": 32, "width": 32}}  # fmt: skip
    (out / "preprocessor_config.json").write_text(json.dumps(pre))
    return out


def _jpg(path: Path, seed: int, size: tuple[int, int] = (40, 32)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    random_image(*size, seed=seed).save(path, format="JPEG")


def _write_data(root: Path) -> None:
    """The README's data/ layout with a few records each."""
    d = root / "data"
    pre = [
        {"id": f"{i:09d}", "image": f"00000/{i:09d}.jpg", "conversations": [
            {"from": "human", "value": "<image>\nRender a clear and concise summary of the photo."},
            {"from": "gpt", "value": cap}]}
        for i, cap in enumerate(["a cup on a table", "a dog on the grass", "a car in the street", "a chair"])
    ]  # fmt: skip
    for i in range(len(pre)):
        _jpg(d / "LLaVA-Pretrain" / "images" / f"00000/{i:09d}.jpg", seed=i)
    (d / "LLaVA-Pretrain" / "blip_laion_cc_sbu_558k.json").write_text(json.dumps(pre))
    mix = [
        {"id": "000000033471", "image": "coco/train2017/000000033471.jpg", "conversations": [
            {"from": "human", "value": "<image>\nWhat is on the table?"}, {"from": "gpt", "value": "A cup."},
            {"from": "human", "value": "Is there a dog?"}, {"from": "gpt", "value": "No."}]},
        {"id": "2354786", "image": "gqa/images/2354786.jpg", "conversations": [
            {"from": "human", "value": "Describe the image.\n<image>"},
            {"from": "gpt", "value": "A street with a red car."}]},
        {"id": "text_only", "conversations": [
            {"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello"}]},
    ]  # fmt: skip
    _jpg(d / "llava_images" / "coco/train2017/000000033471.jpg", seed=10)
    _jpg(d / "llava_images" / "gqa/images/2354786.jpg", seed=11)
    (d / "llava_v1_5_mix665k.json").write_text(json.dumps(mix))
    _jpg(d / "rlaif_v" / "images" / "000000.jpg", seed=20)
    buf = io.BytesIO()
    random_image(36, 28, seed=21).save(buf, format="JPEG")
    meta = {"ds_name": "RLAIF-V", "origin_dataset": "VQAv2", "origin_split": "train"}
    pairs = [
        {**meta, "idx": 0, "image_path": "images/000000.jpg", "question": "Describe the image.",
         "chosen": "A cup on a table.", "rejected": "A cup and a cat on a table."},
        {**meta, "idx": 1, "image": {"bytes": base64.b64encode(buf.getvalue()).decode(), "path": None},
         "question": "What is in the street?", "chosen": "A car.", "rejected": "A car and a bus."},
        {**meta, "idx": 2, "image_path": "images/000000.jpg", "question": "Is there a dog?",
         "chosen": "No, there is no dog.", "rejected": "Yes, a dog is next to the cup."},
    ]  # fmt: skip
    (d / "rlaif_v" / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    ids = [139, 285, 632]
    for k, i in enumerate(ids):
        _jpg(d / "coco" / "val2014" / f"COCO_val2014_{i:012d}.jpg", seed=30 + k)
    cats = [{"id": 1, "name": "cup"}, {"id": 2, "name": "dog"}, {"id": 3, "name": "car"}]
    anns = [
        {"id": n, "image_id": i, "category_id": c} for n, (i, c) in enumerate([(139, 1), (285, 2), (632, 3)])
    ]
    instances = {
        "images": [{"id": i, "file_name": f"COCO_val2014_{i:012d}.jpg"} for i in ids],
        "annotations": anns,
        "categories": cats,
    }
    (d / "coco" / "annotations").mkdir(parents=True)
    (d / "coco" / "annotations" / "instances_val2014.json").write_text(json.dumps(instances, indent=1))
    qs = [
        (139, "cup", "yes"), (139, "dog", "no"), (285, "dog", "yes"), (285, "car", "no"), (632, "car", "yes"),
        (632, "cup", "no"),
    ]  # fmt: skip
    (d / "pope").mkdir()
    (d / "pope" / "coco_pope_adversarial.json").write_text(
        "".join(
            json.dumps(
                {
                    "question_id": n + 1,
                    "image": f"COCO_val2014_{i:012d}.jpg",
                    "text": f"Is there a {o} in the image?",
                    "label": lab,
                }
            )
            + "\n"
            for n, (i, o, lab) in enumerate(qs)
        )  # fmt: skip
    )


def test_recipe_configs_load_and_commands_parse():
    from mm.config import load_config
    from mm.config_kinds import config_class, guess_kind

    for name in SMALL:
        data = yaml.safe_load((RECIPES / f"{name}.yaml").read_text())
        kind, _ = guess_kind(RECIPES / f"{name}.yaml", data)
        assert kind == {"align": "train", "sft_lora": "train", "dpo_files": "dpo_files"}[name]
        load_config(config_class(kind), RECIPES / f"{name}.yaml")
    cmds = recipe_commands(RECIPES / "README.md", {"R": "R", "LM": "LM", "VISION": "V", "RUN": "python -m"})
    assert [c[:2] for c in cmds] == [
        ["mm", "data"], ["mm", "data"], ["mm", "train"], ["mm", "train"], ["rl", "dpo"], ["mm", "eval"],
        ["mm", "eval"],
    ]  # fmt: skip
    assert "model.text.pretrained=LM" in cmds[2] and "model.vision.pretrained=V" in cmds[2]


@pytest.mark.slow
def test_recipe_end_to_end_on_tiny_stand_ins(tmp_path, monkeypatch, capsys):
    from mm.cli import main as mm_main
    from rl.cli import main as rl_main

    parts = tmp_path / "parts"
    lm = causal_lm_folder(parts / "qwen2", "qwen2")
    vision = siglip_full_folder(parts / "siglip")
    configs = tmp_path / "configs"
    configs.mkdir()
    for name, small in SMALL.items():
        full = yaml.safe_load((RECIPES / f"{name}.yaml").read_text())
        tiny = _merge(full, small)
        assert _keys(tiny) == _keys(full), name  # the same config shape
        (configs / f"{name}.yaml").write_text(yaml.safe_dump(tiny, sort_keys=False))
    work = tmp_path / "work"
    work.mkdir()
    _write_data(work)
    monkeypatch.chdir(work)
    env = {"R": str(configs), "LM": str(lm), "VISION": str(vision), "RUN": "python -m"}
    outputs = []
    for argv in recipe_commands(RECIPES / "README.md", env):
        run = {"mm": mm_main, "rl": rl_main}[argv[0]]
        code = run([*argv[1:], "--no-progress"] if argv[1] in ("train", "dpo") else argv[1:])
        captured = capsys.readouterr()
        assert code == 0, (argv, captured.err[-2000:])
        outputs.append(captured.out)
    assert len(json.loads((work / "runs/recipe/align/result.json").read_text())) > 0
    align_cfg = yaml.safe_load((work / "runs/recipe/align/config.yaml").read_text())
    assert align_cfg["model"]["text"]["pretrained"] == str(lm)
    assert align_cfg["model"]["vision"]["pretrained"] == str(vision)
    _assert_parts_loaded(work / "runs/recipe/align/model", lm, vision)
    for stage in ("align", "sft", "dpo"):
        assert (work / "runs/recipe" / stage / "model" / "config.json").is_file(), stage
    assert (work / "runs/recipe/sft/adapter").is_dir() and (work / "runs/recipe/dpo/adapter").is_dir()
    pope = json.loads(outputs[-2])
    assert pope["n_questions"] == 6 and pope["n_scored"] == 6
    answers = (work / "runs/recipe/pope_adversarial.jsonl").read_text().splitlines()
    assert len(answers) == 6
    chair = json.loads(outputs[-1])
    assert chair["n_captions"] == 3 and chair["vocab"] == "coco"
    assert len(json.loads((work / "runs/recipe/chair.json").read_text())) == 3


def _param(model: Any, suffix: str, *, skip: str = "") -> Any:
    """The one parameter of ``model`` whose name ends with ``suffix`` (names containing ``skip`` ignored)."""
    found = [v for k, v in model.named_parameters() if k.endswith(suffix) and not (skip and skip in k)]
    assert len(found) == 1, (suffix, len(found))
    return found[0]


def _assert_parts_loaded(folder: Path, lm: Path, vision: Path) -> None:
    """The aligned model's tower and LM weights are the pretrained parts' (both frozen during align)."""
    import torch
    from transformers import AutoModelForCausalLM, SiglipVisionModel

    from mm.model import NoteVLMForConditionalGeneration

    model = NoteVLMForConditionalGeneration.from_pretrained(str(folder))
    tower = SiglipVisionModel.from_pretrained(str(vision))
    text = AutoModelForCausalLM.from_pretrained(str(lm))
    patch = "patch_embedding.weight"
    assert torch.equal(_param(model, patch), _param(tower, patch))
    q = "layers.0.self_attn.q_proj.weight"  # the LM's (the tower has one too)
    assert torch.equal(_param(model, q, skip="vision"), _param(text, q))


def test_recipe_refuses_an_lm_of_another_architecture(tmp_path, capsys):
    """align.yaml pins Qwen2.5-0.5B's architecture: another LM folder is one line naming both values."""
    from mm.cli import main
    from tests.helpers.eval_model import make_data_dir

    lm = causal_lm_folder(tmp_path / "lm", "qwen2")
    data = make_data_dir(tmp_path, split="train")
    capsys.readouterr()
    argv = [
        "train",
        "--config",
        str(RECIPES / "align.yaml"),
        "--data",
        str(data),
        "--out",
        str(tmp_path / "o"),
    ]
    assert main([*argv, "--no-progress", "--set", f"model.text.pretrained={lm}"]) == 2
    err = capsys.readouterr().err
    assert "hidden_size=896 (folder: 32)" in err and err.count("\n") == 1

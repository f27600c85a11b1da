"""`rl dpo --model DIR --pairs PAIRS.jsonl`: end-to-end runs on tiny LLaVA, Qwen2-VL, Idefics3 and NoteVLM
folders (single- and multi-image pairs), the merged folder in plain transformers, parity with the world
form on NoteVLM, the RLAIF-V / RLHF-V importers and FILE:LINE errors that leave OUT untouched."""

from __future__ import annotations

import base64
import io
import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rl.cli import main
from tests.mm.adapter_helpers import BUILDERS, build_family, random_image

LOG2 = math.log(2.0)
TRANSFORMERS_FAMILIES = list(BUILDERS)
PAIRS = [
    {"id": "one", "image": "a.png", "question": "What is in the picture?", "chosen": "A red square.",
     "rejected": "A blue dog on a mat."},
    {"image": ["b.png", "c.png"], "question": "What differs between the two images?",
     "chosen": "The second one is darker.", "rejected": "Nothing differs."},
    {"id": 7, "image": ["c.png"], "question": "Describe it.", "chosen": "Noise.", "rejected": "A cat."},
]  # fmt: skip


def _write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Model folders of every family, an image folder and a native pairs file."""
    from tests.helpers.model import tiny_model, tiny_processor

    root = tmp_path_factory.mktemp("dpo_files")
    images = root / "images"
    images.mkdir()
    for i, (name, size) in enumerate({"a.png": (16, 16), "b.png": (24, 16), "c.png": (16, 16)}.items()):
        random_image(*size, seed=i).save(images / name)
    models = {f: build_family(f, root / f) for f in TRANSFORMERS_FAMILIES}
    models["notevlm"] = root / "notevlm"
    tiny_model(seed=1).save_pretrained(models["notevlm"])
    tiny_processor().save_pretrained(models["notevlm"])
    return {"models": models, "images": images, "pairs": _write_jsonl(root / "pairs.jsonl", PAIRS)}


def _dpo(files, out, model, *sets, pairs=None):
    args = ["dpo", "--model", str(model), "--pairs", str(pairs or files["pairs"]), "--image-folder",
            str(files["images"]), "--out", str(out), "--no-progress"]  # fmt: skip
    return main(args + [x for s in sets for x in ("--set", s)])


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- end to end, every family

RUN = ("train.steps=3", "data.batch_size=3", "train.checkpoint_every=3", "lora.r=4", "optim.lr=2e-3")
"""Three steps on the same batch (all three pairs), a rate that moves a tiny model."""

MERGED_CHECK = textwrap.dedent(
    """
    import sys
    sys.path.append(sys.argv[3])  # site-packages without its .pth files: notelens's editable install is off
    import importlib.util, json
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor
    assert importlib.util.find_spec("mm") is None, "notelens must not be importable here"
    out = {}
    for family, folder in json.loads(sys.argv[1]).items():
        model = AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True).eval()
        AutoProcessor.from_pretrained(folder, local_files_only=True)
        assert not any("lora" in n for n, _ in model.named_parameters())
        batch = torch.load(folder + "/../batch.pt")
        with torch.no_grad():
            out[family] = model(**batch, use_cache=False).logits
    torch.save(out, sys.argv[2])
    """
)


@pytest.fixture(scope="module")
def runs(files, tmp_path_factory):
    """Every family trained 3 steps (Idefics3 fully fine-tuned: a frozen-copy reference)."""
    root = tmp_path_factory.mktemp("runs")
    outs = {}
    for family, model in files["models"].items():
        extra = ("lora.enabled=false", "optim.lr=2e-4") if family == "idefics3" else ()
        assert _dpo(files, root / family, model, *RUN, *extra) == 0, family
        outs[family] = root / family
    return outs


@pytest.mark.parametrize("family", [*TRANSFORMERS_FAMILIES, "notevlm"])
def test_runs_end_to_end_and_learns(runs, family):
    out = runs[family]
    recs = _records(out)
    assert [r["step"] for r in recs] == [1, 2, 3]
    first, last = recs[0], recs[-1]
    # step 1: policy == reference, so the implicit rewards and the KL are 0 and the loss is log 2
    assert abs(first["loss"] - LOG2) < 1e-5 and abs(first["reward_margin"]) < 1e-5 and abs(first["kl"]) < 1e-5
    # the same batch every step: the margin grows and the loss falls
    assert last["reward_margin"] > 1e-3 and last["loss"] < first["loss"] - 1e-4, (first, last)
    for key in ("entropy", "logp_chosen", "logp_rejected", "reward_accuracy", "grad_norm"):
        assert math.isfinite(last[key]), key
    assert first["entropy"] > 0
    result = json.loads((out / "result.json").read_text())
    assert result["family"] == family and result["pairs"] == 3 and result["pairs_format"] == "native"
    assert result["images_per_pair"] == {"1": 2, "2": 1}
    assert result["reference"] == ("copy" if family == "idefics3" else "adapter")
    assert (out / "model" / "config.json").is_file()
    assert (out / "model" / "adapter" / "adapter_config.json").is_file() == (family != "idefics3")
    assert (out / "curves.png").is_file() and (out / "config.yaml").is_file()


def test_merged_folders_load_in_plain_transformers(files, runs, tmp_path):
    """OUT/model of each transformers family: trained weights, no LoRA left, loadable without notelens."""
    from mm.model.adapter import Sample, load_adapter
    from rl.pairs.importers import open_images, read_pair_file

    pairs, _ = read_pair_file(files["pairs"], files["images"])
    expected, where = {}, {}
    for family in TRANSFORMERS_FAMILIES:
        trained, start = load_adapter(runs[family] / "model"), load_adapter(files["models"][family])
        samples = [Sample(images=open_images(p), text=p.question) for p in pairs]
        batch = trained.answer_batch(samples, [p.chosen for p in pairs])
        batch = {k: v for k, v in batch.items() if k != "response_mask"}
        with torch.no_grad():
            expected[family] = trained.model(**batch, use_cache=False).logits
            assert not torch.allclose(expected[family], start.model(**batch, use_cache=False).logits)
        torch.save(batch, runs[family] / "batch.pt")
        where[family] = str(runs[family] / "model")
    site = str(Path(torch.__file__).resolve().parents[1])
    result = tmp_path / "logits.pt"
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", MERGED_CHECK, json.dumps(where), str(result), site],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = torch.load(result)
    for family in TRANSFORMERS_FAMILIES:
        torch.testing.assert_close(got[family], expected[family], atol=1e-5, rtol=1e-5)

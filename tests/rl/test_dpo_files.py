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


def _dpo(files, out, model, *sets, pairs=None, images=None):
    args = ["dpo", "--model", str(model), "--pairs", str(pairs or files["pairs"]), "--image-folder",
            str(images or files["images"]), "--out", str(out), "--no-progress"]  # fmt: skip
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
    assert (out / "adapter" / "adapter_config.json").is_file() == (family != "idefics3")
    assert not (out / "model" / "adapter").exists()
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


def test_resume_gives_the_same_weights(files, tmp_path):
    """A run killed after step 1 and resumed from its checkpoint ends where an uninterrupted run ends."""
    from mm.config import load_config
    from mm.model.adapter import load_adapter
    from rl.pairs.importers import read_pair_file
    from rl.trainers import dpo_files
    from rl.trainers.dpo_config import FilesDPOConfig

    sets = [f"model.path={files['models']['qwen2_vl']}", "train.steps=2", "data.batch_size=2",
            "train.checkpoint_every=1", "lora.r=2", "optim.lr=1e-2", "train.device=cpu"]  # fmt: skip
    cfg = load_config(FilesDPOConfig, None, sets)
    pairs, _ = read_pair_file(files["pairs"], files["images"])
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    dpo_files.train(cfg, pairs, out_dir=straight, show_progress=False)
    assert dpo_files.train(cfg, pairs, out_dir=resumed, show_progress=False, stop_after=1)["step"] == 1
    assert not (resumed / "model").exists()
    assert dpo_files.train(cfg, pairs, out_dir=resumed, show_progress=False)["step"] == 2
    a = load_adapter(straight / "model").model.state_dict()
    b = load_adapter(resumed / "model").model.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=1e-6, rtol=1e-5, msg=k)
    assert [r["step"] for r in _records(resumed)] == [1, 2]


# ---------------------------------------------------------------- NoteVLM: files form == world form

SAME_RUN = (
    "train.steps=3", "data.batch_size=2", "train.checkpoint_every=3", "lora.enabled=false", "optim.lr=1e-3",
    "optim.weight_decay=0.0", "optim.warmup_steps=0", "optim.min_lr_ratio=1.0", "optim.grad_clip=1.0",
)  # fmt: skip


def test_notevlm_files_form_equals_world_form(files, tmp_path):
    """The same pairs of a NoteVLM through ``--config dpo_tiny.yaml --set data.pairs=...`` (rows by
    :class:`PairBatcher`) and through ``--model --pairs`` (rows by the adapter's ``answer_batch``): every
    logged number of every step and the final weights agree."""
    from mm.model import NoteVLMForConditionalGeneration
    from rl.pairs import PreferencePair, write_pairs
    from tests.helpers.model import IMAGE_SIZE

    folder = tmp_path / "notes"
    folder.mkdir()
    for i in range(3):
        random_image(IMAGE_SIZE, IMAGE_SIZE, seed=10 + i).save(folder / f"{i}.png")
    native = [
        {"id": "p0", "image": ["0.png"], "question": "describe the note", "chosen": "a red cat",
         "rejected": "a dog"},
        {"id": "p1", "image": ["1.png", "2.png"], "question": "is there a cat", "chosen": "yes",
         "rejected": "no"},
        {"id": "p2", "image": ["2.png"], "question": "what is red", "chosen": "the cup",
         "rejected": "the cat"},
    ]  # fmt: skip
    _write_jsonl(tmp_path / "native.jsonl", native)
    world = [
        PreferencePair(id=r["id"], kind="injection", note_id=r["id"], images=r["image"], prompt=r["question"],
                       chosen=r["chosen"], rejected=r["rejected"])
        for r in native
    ]  # fmt: skip
    write_pairs(world, tmp_path / "world.jsonl")
    model = files["models"]["notevlm"]
    config = Path(__file__).resolve().parents[2] / "configs" / "rl" / "dpo_tiny.yaml"
    old = ["dpo", "--config", str(config), "--out", str(tmp_path / "old"), "--data", str(folder)]
    sets = [f"init.model={model}", f"data.pairs={tmp_path / 'world.jsonl'}", *SAME_RUN]
    assert main([*old, "--no-progress"] + [x for s in sets for x in ("--set", s)]) == 0
    native_file = tmp_path / "native.jsonl"
    assert _dpo(files, tmp_path / "new", model, *SAME_RUN, pairs=native_file, images=folder) == 0
    a, b = _records(tmp_path / "old"), _records(tmp_path / "new")
    assert len(a) == len(b) == 3
    for ra, rb in zip(a, b):
        for key in ("loss", "reward_margin", "reward_chosen", "logp_chosen", "logp_rejected", "kl", "entropy",
                    "grad_norm", "response_len"):  # fmt: skip
            assert abs(ra[key] - rb[key]) < 1e-5, (ra["step"], key, ra[key], rb[key])
    assert abs(a[-1]["reward_margin"]) > 1e-4  # the runs moved
    wa = NoteVLMForConditionalGeneration.from_pretrained(str(tmp_path / "old" / "model")).state_dict()
    wb = NoteVLMForConditionalGeneration.from_pretrained(str(tmp_path / "new" / "model")).state_dict()
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=1e-6, rtol=1e-5, msg=k)


def test_adapter_scoring_equals_the_old_model_scoring(files, tmp_path):
    """The trainer's step through the adapter (:class:`AdapterScorer`) equals the former direct model call
    (:class:`ModelScorer`, ``batch_token_logps``) on the world form's rows: loss, metrics and gradients."""
    from mm.model import NoteProcessor, NoteVLMForConditionalGeneration
    from mm.model.adapter import load_adapter
    from rl.pairs import PreferencePair
    from rl.trainers.common import Reference
    from rl.trainers.dpo import LossConfig, PairBatcher, scored_dpo_step
    from rl.trainers.dpo_score import AdapterScorer, ModelScorer
    from tests.helpers.model import IMAGE_SIZE

    for i in range(2):
        random_image(IMAGE_SIZE, IMAGE_SIZE, seed=i).save(tmp_path / f"{i}.png")
    pairs = [
        PreferencePair(id="a", kind="injection", note_id="a", images=["0.png"], prompt="describe the note",
                       chosen="a red cat", rejected="a red cat and a dog"),
        PreferencePair(id="b", kind="injection", note_id="b", images=["0.png", "1.png"], prompt="is it red",
                       chosen="yes", rejected="no"),
    ]  # fmt: skip
    folder = files["models"]["notevlm"]
    model = NoteVLMForConditionalGeneration.from_pretrained(str(folder))
    processor = NoteProcessor.from_pretrained(folder)
    batch = PairBatcher(processor=processor, pairs=pairs, root=tmp_path, conditional="blank").batch([0, 1])
    cfg = LossConfig(beta=0.5, conditional_weight=1.0, anchor_weight=0.5)
    adapter = load_adapter(model, processor)
    scorers = (ModelScorer(model, Reference(model=model, needed=True)),
               AdapterScorer(adapter, Reference(model=adapter.model, needed=True)))  # fmt: skip
    with torch.no_grad():  # move the policy off the (copied) reference so the rewards are not all 0
        for p in model.model.language_model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    results = []
    for scorer in scorers:
        model.zero_grad(set_to_none=True)
        loss, metrics = scored_dpo_step(scorer, batch, cfg)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), metrics, grads))
    (la, ma, ga), (lb, mb, gb) = results
    torch.testing.assert_close(la, lb, atol=1e-6, rtol=0)
    assert ma.keys() == mb.keys() and abs(float(ma["reward_margin"])) > 1e-4
    for k in ma:
        torch.testing.assert_close(ma[k].float(), mb[k].float(), atol=1e-6, rtol=1e-6, msg=k)
    assert ga.keys() == gb.keys() and ga
    for n in ga:
        torch.testing.assert_close(ga[n], gb[n], atol=1e-6, rtol=1e-5, msg=n)


# ---------------------------------------------------------------- importers


def _png_bytes(seed: int) -> bytes:
    buf = io.BytesIO()
    random_image(20, 12, seed=seed).save(buf, format="PNG")
    return buf.getvalue()


def test_rlaif_v_and_rlhf_v_records(files, tmp_path):
    from rl.pairs.importers import open_images, read_pair_file

    data = _png_bytes(3)
    rlaif = [
        {"ds_name": "RLAIF-V", "image": {"bytes": base64.b64encode(data).decode(), "path": None},
         "question": "What is it?", "chosen": "A square.", "rejected": "A cat.", "origin_dataset": "VQAv2",
         "origin_split": "{}", "idx": 11, "image_path": "ignored.jpg"},
        {"ds_name": "RLAIF-V", "image": {"bytes": None, "path": "a.png"}, "question": "Q?", "chosen": "C.",
         "rejected": "R.", "origin_dataset": "COCO", "origin_split": "{}", "idx": "12",
         "image_path": "x.jpg"},
        {"ds_name": "RLAIF-V", "image": None, "question": "Q?", "chosen": "C.", "rejected": "R.",
         "idx": 13, "image_path": "b.png"},
    ]  # fmt: skip
    pairs, fmt = read_pair_file(_write_jsonl(tmp_path / "rlaif.jsonl", rlaif), files["images"])
    assert fmt == "rlaif-v" and [p.id for p in pairs] == ["11", "12", "13"]
    assert pairs[0].images == (data,) and pairs[0].meta["origin_dataset"] == "VQAv2"
    assert pairs[1].images == (files["images"] / "a.png",) and pairs[2].images == (files["images"] / "b.png",)
    assert (pairs[0].question, pairs[0].chosen, pairs[0].rejected) == ("What is it?", "A square.", "A cat.")
    assert open_images(pairs[0])[0].size == (20, 12) and open_images(pairs[2])[0].size == (24, 16)

    text = {"question": "Describe.", "chosen": "A red square.", "rejected": "A red square and a dog."}
    rlhf = [
        {"image": {"bytes": list(data), "path": None}, "text": json.dumps(text), "origin_dataset": "RLHF-V",
         "origin_split": "{}", "idx": 0, "image_path": "x.jpg"},
        {"image": "c.png", "text": text, "idx": 1},
    ]  # fmt: skip
    pairs, fmt = read_pair_file(_write_jsonl(tmp_path / "rlhf.jsonl", rlhf), files["images"])
    assert fmt == "rlhf-v" and [p.id for p in pairs] == ["0", "1"]
    assert pairs[0].images == (data,) and pairs[1].images == (files["images"] / "c.png",)
    assert all((p.question, p.chosen, p.rejected) == tuple(text.values()) for p in pairs)
    # a native file read as native, ids defaulting to FILE:LINE
    pairs, fmt = read_pair_file(files["pairs"], files["images"], "auto")
    assert fmt == "native" and [p.id for p in pairs] == ["one", f"{files['pairs']}:2", "7"]
    assert [len(p.images) for p in pairs] == [1, 2, 1]


def test_rlaif_v_records_train(files, tmp_path):
    """Inline image bytes go through the processor like files (one step on LLaVA)."""
    data = base64.b64encode(_png_bytes(5)).decode()
    recs = [{"image": {"bytes": data, "path": None}, "question": "Q?", "chosen": "Yes.", "rejected": "No.",
             "idx": i, "origin_dataset": "x"} for i in range(2)]  # fmt: skip
    path = _write_jsonl(tmp_path / "rlaif.jsonl", recs)
    out = tmp_path / "out"
    sets = ("train.steps=1", "data.batch_size=2", "lora.r=2", "loss.conditional_weight=1.0")
    assert _dpo(files, out, files["models"]["llava"], *sets, pairs=path) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["pairs_format"] == "rlaif-v" and abs(result["last"]["conditional_loss"] - LOG2) < 1e-5


# ---------------------------------------------------------------- bad records


GOOD = {"image": "a.png", "question": "Q?", "chosen": "C.", "rejected": "R."}
FIRST = {
    "native": GOOD,
    "rlaif-v": {**GOOD, "idx": 0},
    "rlhf-v": {"image": "a.png", "idx": 0, "text": json.dumps({k: GOOD[k] for k in GOOD if k != "image"})},
}  # fmt: skip
BAD_RECORDS = [
    ({k: v for k, v in GOOD.items() if k != "chosen"}, "native", "missing key 'chosen'"),
    ({**GOOD, "image": "missing.png"}, "native", "missing.png not found"),
    ({**GOOD, "question": 3}, "native", "'question' must be a string, got int"),
    ({**GOOD, "image": []}, "native", "empty list"),
    ({**GOOD, "image": [1]}, "native", "'image' must be a non-empty path string"),
    ({**GOOD, "score": 1}, "native", "unknown key(s) ['score']"),
    ("not json {", "native", "not JSON"),
    ([1, 2], "native", "must be a JSON object, got list"),
    ({"text": "{bad", "image": "a.png"}, "rlhf-v", "'text' is not JSON"),
    ({"image": {"bytes": "%%%"}, "question": "Q", "chosen": "C", "rejected": "R"}, "rlaif-v", "not base64"),
    ({"image": {"bytes": base64.b64encode(b"no image").decode()}, "question": "Q", "chosen": "C",
      "rejected": "R"}, "rlaif-v", "not an image PIL can read"),
    ({"idx": 1, "question": "Q", "chosen": "C", "rejected": "R"}, "rlaif-v", "the record has no image"),
]  # fmt: skip


@pytest.mark.parametrize("record, fmt, message", BAD_RECORDS, ids=[m for _, _, m in BAD_RECORDS])
def test_bad_records_name_file_and_line_and_write_nothing(files, tmp_path, capsys, record, fmt, message):
    path = tmp_path / "pairs.jsonl"
    bad = record if isinstance(record, str) else json.dumps(record)
    first = FIRST[fmt]  # the format is told from line 1, then line 3 is read in it
    path.write_text(json.dumps(first) + "\n\n" + bad + "\n")
    out = tmp_path / "out"
    rc = _dpo(files, out, files["models"]["llava"], "train.steps=1", pairs=path)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err, err
    assert f"{path}:3: " in err and message in err, err
    assert not out.exists()
    if fmt != "native":  # the same line read as the given format
        rc = main(["dpo", "--model", str(files["models"]["llava"]), "--pairs", str(path), "--image-folder",
                   str(files["images"]), "--pairs-format", fmt, "--out", str(out)])  # fmt: skip
        assert rc == 2 and f"{path}:3: " in capsys.readouterr().err and not out.exists()


def test_cli_usage_errors(files, tmp_path, capsys):
    llava, out = str(files["models"]["llava"]), tmp_path / "out"
    cases = [
        (["dpo", "--model", llava], "needs --model DIR and --pairs"),
        (["dpo", "--pairs", str(files["pairs"]), "--model", str(tmp_path)], "no config.json"),
        (["dpo", "--model", llava, "--pairs", str(tmp_path / "none.jsonl")], "no such pairs file"),
        (["dpo", "--model", llava, "--pairs", str(files["pairs"]), "--data", str(tmp_path)], "--data is the"),
        (["dpo", "--model", llava, "--pairs", str(files["pairs"]), "--set", "data.pairs_format=x"],
         "data.pairs_format must be"),
        (["dpo", "--no-progress"], "pass --config (world form) or --model DIR"),
    ]  # fmt: skip
    for argv, message in cases:
        assert main([*argv, "--out", str(out)]) == 2, argv
        assert message in capsys.readouterr().err, argv
        assert not out.exists()
    (tmp_path / "mixed.jsonl").write_text('{"text": "{}", "question": "q", "chosen": "c"}\n')
    assert main(["dpo", "--model", llava, "--pairs", str(tmp_path / "mixed.jsonl"), "--out", str(out)]) == 2
    assert "cannot tell the pairs format" in capsys.readouterr().err


def test_help_documents_the_pair_record(capsys):
    with pytest.raises(SystemExit):
        main(["dpo", "--help"])
    text = capsys.readouterr().out
    needles = (
        "--model DIR", "--pairs PAIRS.jsonl", "--image-folder", "--pairs-format", '"question"', '"chosen"',
        '"rejected"', "rlaif-v", "rlhf-v", "FILE:LINE", "AutoModelForImageTextToText",
    )  # fmt: skip
    for needle in needles:
        assert needle in text, needle


# ---------------------------------------------------------------- the benchmark against TRL


def test_dpo_vs_trl_benchmark_smoke(tmp_path):
    """benchmarks/dpo_vs_trl.py: both sides train the same model on the same pairs (2 steps each)."""
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "dpo_vs_trl.py"
    spec = importlib.util.spec_from_file_location("dpo_vs_trl", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model = bench.build_model(tmp_path / "llava", hidden=32, layers=1)
    pairs = bench.write_pairs(tmp_path, 4)
    assert len(pairs.read_text().splitlines()) == 4 and (tmp_path / "3.png").is_file()
    ours = bench.ours(model, pairs, batch=2, steps=2, lr=1e-3)
    theirs = bench.trl(model, pairs, tmp_path / "trl", batch=2, steps=2, lr=1e-3)
    assert len(ours) == len(theirs) == 2 and min(ours + theirs) > 0
    assert bench.median_after_warmup([5.0, 1.0, 3.0]) == 2.0


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True])
def test_two_processes_equal_one(files, tmp_path, fsdp):
    """torchrun, 2 ranks x 2 pairs == 1 process x 4 pairs (LoRA on a tiny Qwen2-VL, the reference its base),
    data parallel and FSDP (the LM's blocks sharded; the merged model gathered whole): the weights of every
    step, every logged metric (the spread and token means too: ``reward_std``, ``kl``, ``entropy``) and the
    saved model."""
    from safetensors.torch import load_file

    from tests.helpers.launch import launch
    from tests.rl.test_grpo_dp import _same_saved_model

    pairs = _write_jsonl(tmp_path / "four.jsonl", [*PAIRS, {**PAIRS[0], "id": "four", "image": "b.png"}])
    sets = ["train.steps=2", "data.batch_size=4", "train.checkpoint_every=1", "lora.r=4", "optim.lr=2e-3",
            "train.device=cpu", "train.threads=1"]  # fmt: skip
    args = ["dpo", "--model", str(files["models"]["qwen2_vl"]), "--pairs", str(pairs), "--image-folder",
            str(files["images"]), "--no-progress"]  # fmt: skip
    args += [x for s in sets for x in ("--set", s)]
    assert main([*args, "--out", str(tmp_path / "one")]) == 0
    work = tmp_path / "work"
    work.mkdir()
    launched = [*args, "--set", "train.fsdp=true"] if fsdp else args
    proc = launch(work, "torchrun", *launched, "--out", str(work / "two"))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert proc.stdout.count('"family"') == 1  # rank 0 alone reports
    one, two = _records(tmp_path / "one"), _records(work / "two")
    assert [r["step"] for r in two] == [r["step"] for r in one] == [1, 2]
    for a, b in zip(one, two):
        numbers = [k for k, v in a.items() if isinstance(v, float) and k not in ("time_s", "cpu_s", "step_s")]
        assert len(numbers) > 10
        for k in numbers:
            assert b[k] == pytest.approx(a[k], abs=1e-5, rel=1e-4), (a["step"], k)
    for step in (1, 2):
        name = f"checkpoints/step-{step:08d}/model.safetensors"
        wa, wb = load_file(str(tmp_path / "one" / name)), load_file(str(work / "two" / name))
        assert wa.keys() == wb.keys() and max((wa[k] - wb[k]).abs().max().item() for k in wa) < 1e-5
    _same_saved_model(tmp_path / "one" / "model", work / "two" / "model")
    assert (work / "two" / "adapter" / "adapter_config.json").is_file()
    base = load_file(str(files["models"]["qwen2_vl"] / "model.safetensors"))
    merged = load_file(str(work / "two" / "model" / "model.safetensors"))
    assert max((merged[k] - base[k]).abs().max().item() for k in base) > 1e-4  # the steps trained

"""`rl distill`: teacher log-probs equal a manual forward (batched and cached), two steps of every loss on
tiny NoteVLMs of two sizes (the teacher with more image tokens per image), a transformers family, the
CLI on a prompt file, and bad inputs (another vocabulary, lmbda outside [0, 1], missing answers)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings

import pytest
import torch

from mm.config import ConfigError, load_config
from mm.errors import UserError
from mm.model import NoteProcessor
from rl.cli import main
from rl.trainers.distill_config import DistillConfig
from tests.helpers.eval_model import make_data_dir
from tests.helpers.model import IMAGE_SIZE, tiny_model, tiny_tokenizer

STUDENT_TEXT = {"model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
                "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                "max_position_embeddings": 256, "initializer_range": 0.3}  # fmt: skip
TEACHER_TEXT = {**STUDENT_TEXT, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3}
RUN = ("train.steps=2", "train.checkpoint_every=2", "data.batch_size=2", "rollout.max_new_tokens=6",
       "optim.lr=1e-3")  # fmt: skip


def _save(folder, *, seed, text, budget=4, vocab=None):
    if vocab is not None:
        text = {**text, "vocab_size": vocab}
    tiny_model(seed=seed, text_config=text, fusion_budget=budget).save_pretrained(str(folder))
    NoteProcessor(tokenizer=tiny_tokenizer(), image_size=IMAGE_SIZE, tokens_per_image=budget, max_length=96
                  ).save_pretrained(folder)  # fmt: skip
    return folder


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    data = make_data_dir(root, split="train")
    student = _save(root / "student", seed=3, text=STUDENT_TEXT)
    teacher = _save(root / "teacher", seed=5, text=TEACHER_TEXT, budget=8)  # longer prompts than the student
    return root, data, student, teacher


def _cfg(world, *sets):
    _, data, student, teacher = world
    base = [f"student.path={student}", f"teacher.path={teacher}", f"data.folder={data}", *RUN]
    return load_config(DistillConfig, None, base + list(sets))


def _train(world, out, *sets):
    from rl.trainers import distill

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return distill.train(_cfg(world, *sets), out_dir=out, show_progress=False)


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_teacher_logps_equal_a_manual_forward_batched_and_cached(world):
    from mm.model.adapter import load_adapter
    from rl.trainers.distill_data import NotePrompts
    from rl.trainers.distill_teacher import TeacherScorer

    _, data, student, teacher_dir = world
    teacher = load_adapter(teacher_dir)
    notes = NotePrompts(folder=data, split="train", notes=0, prompt="Describe the note.")
    samples = [notes.sample(0), notes.sample(1), notes.sample(0)]
    answers = [[7, 8, 2], [9, 2], [10, 11, 12, 13]]
    scorer = TeacherScorer(teacher, batch_size=2)  # rows (0, 1) then (2,): two forwards
    got = scorer.logps("k", samples, answers)  # (3, 4, V)
    assert got.shape == (3, 4, 64) and scorer.forwards == 2
    batch = teacher.answer_batch(samples, answers)
    P = batch["input_ids"].shape[1] - 4
    with torch.no_grad():
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "pixel_values", "image_mask")}
        positions = (batch["attention_mask"].cumsum(-1) - 1).clamp(min=0)
        logits = teacher.model(**inputs, position_ids=positions, use_cache=False).logits  # (3, T, V)
    want = torch.log_softmax(logits[:, P - 1 : -1].float(), dim=-1)  # (3, 4, V)
    for b, a in enumerate(answers):
        torch.testing.assert_close(got[b, : len(a)], want[b, : len(a)], atol=1e-5, rtol=1e-5)
        assert (got[b, len(a) :] == 0).all()
    # the sampled tokens' log-probs equal the adapter's own scoring
    lp, mask = teacher.answer_logps(samples, answers)  # (3, T)
    picked = got.gather(-1, torch.tensor([a + [0] * (4 - len(a)) for a in answers])[..., None])[..., 0]
    torch.testing.assert_close(picked * mask[:, P:], lp[:, P:], atol=1e-5, rtol=1e-5)
    assert scorer.logps("k", samples, answers) is got and scorer.forwards == 2  # cached per rollout key
    scorer.logps("other", samples, answers)
    assert scorer.forwards == 4


@pytest.mark.parametrize(
    "sets",
    [
        ("loss.kind=reverse_kl",),
        ("loss.kind=reverse_kl", "loss.estimator=sampled", "loss.temperature=0.8"),
        ("loss.kind=gjsd", "loss.beta=0.5", "data.lmbda=0.5", "data.off_policy=dataset"),
        (
            "loss.kind=gjsd",
            "loss.beta=0.0",
            "data.lmbda=0.5",
            "data.off_policy=teacher",
            "lora.enabled=true",
            "lora.r=2",
        ),
        ("loss.kind=sft_on_teacher",),
    ],
    ids=["reverse_kl", "sampled", "gjsd_dataset", "gjsd_forward_teacher_lora", "sft_on_teacher"],
)
def test_two_steps_of_each_loss(world, tmp_path, sets):
    out = tmp_path / "run"
    summary = _train(world, out, *sets, "data.eval_notes=2", "data.eval_split=train", "train.eval_every=2")
    recs = _records(out)
    assert [r["step"] for r in recs] == [1, 2]
    kind = sets[0].split("=")[1]
    keys = ["loss", "student_nll", "response_len"]
    keys += [] if kind == "sft_on_teacher" else ["reverse_kl", "teacher_nll"]
    for r in recs:
        assert all(math.isfinite(r[k]) for k in keys), r
        assert 1 <= r["response_len"] <= 6
    assert "reverse_kl" not in recs[0] if kind == "sft_on_teacher" else recs[0]["reverse_kl"] >= 0
    assert 0 <= recs[-1]["eval/chair_i"] <= 1 and 0 <= recs[-1]["eval/recall"] <= 1
    rows = {"reverse_kl": 2, "sft_on_teacher": 0}.get(kind, 1)
    assert summary["student_rows_per_batch"] == rows and recs[0]["student_share"] == rows / 2
    # the teacher scores each rollout once: 2 steps x 1 row batch (none for SFT on teacher samples)
    assert summary["teacher_forwards"] == (0 if kind == "sft_on_teacher" else 2)
    assert (out / "curves.png").is_file() and (out / "model" / "config.json").is_file()
    assert (out / "adapter").is_dir() == ("lora.enabled=true" in sets)  # LoRA merged into OUT/model


def test_one_reverse_kl_step_moves_the_student_toward_the_teacher(world):
    from rl.trainers.distill import DistillTrainer, load_models
    from rl.trainers.distill_data import build_prompts
    from rl.trainers.distill_teacher import TeacherScorer

    cfg = _cfg(world)
    torch.manual_seed(0)
    student, teacher = load_models(cfg, torch.device("cpu"))
    trainer = DistillTrainer(cfg=cfg, student=student, teacher=TeacherScorer(teacher, batch_size=2),
                             prompts=build_prompts(cfg.data))  # fmt: skip
    batch = trainer.batch(0)
    loss, m = trainer.loss(batch)
    assert loss.item() == pytest.approx(m["reverse_kl"], rel=1e-5)  # the full estimator is the exact KL
    opt = torch.optim.SGD([p for p in student.model.parameters() if p.requires_grad], lr=0.05)
    loss.backward()
    opt.step()
    with torch.no_grad():
        after, _ = trainer.loss(batch)
    assert after.item() < loss.item()
    assert all(not p.requires_grad for p in teacher.model.parameters())


def test_cli_on_a_prompt_file_with_a_transformers_family(tmp_path):
    from tests.mm.adapter_helpers import build_family, random_image

    student = build_family("qwen2_vl", tmp_path / "student", seed=0)
    teacher = build_family("qwen2_vl", tmp_path / "teacher", seed=1)
    (tmp_path / "imgs").mkdir()
    for i in range(2):
        random_image(28, 28, seed=i).save(tmp_path / "imgs" / f"{i}.png")
    lines = [{"image": "0.png", "question": "Describe the image.", "answer": "a cat"},
             {"image": ["0.png", "1.png"], "question": "What changed?", "answer": "a dog"}]  # fmt: skip
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = tmp_path / "out"
    args = ["distill", "--student", str(student), "--teacher", str(teacher), "--prompts",
            str(tmp_path / "p.jsonl"), "--image-folder", str(tmp_path / "imgs"), "--out", str(out),
            "--no-progress"]  # fmt: skip
    sets = [*RUN, "loss.kind=gjsd", "data.lmbda=0.5", "data.off_policy=dataset"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(args + [x for s in sets for x in ("--set", s)]) == 0
    result = json.loads((out / "result.json").read_text())
    assert result["step"] == 2 and result["student_family"] == "qwen2_vl" and result["loss"] == "gjsd"
    assert (out / "config.yaml").is_file() and (out / "curves.png").is_file()
    code = ("import sys\nfrom transformers import AutoModelForImageTextToText, AutoProcessor\n"
            "m = AutoModelForImageTextToText.from_pretrained(sys.argv[1])\n"
            "AutoProcessor.from_pretrained(sys.argv[1])\nprint(m.config.model_type)\n")  # fmt: skip
    cmd = [sys.executable, "-I", "-c", code, str(out / "model")]  # -I: notelens is not importable
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.split() == ["qwen2_vl"], proc.stderr[-2000:]


def test_mismatched_vocabularies_are_refused(world, tmp_path):
    from tests.mm.adapter_helpers import build_family

    root, _, student, teacher = world
    wide = _save(tmp_path / "wide", seed=1, text=STUDENT_TEXT, vocab=80)
    with pytest.raises(UserError, match="output 64 and 80 logits per token"):
        _train(world, tmp_path / "a", f"teacher.path={wide}")
    other = build_family("llava", tmp_path / "llava")
    with pytest.raises(UserError, match="vocabularies differ"):
        _train(world, tmp_path / "b", f"teacher.path={other}")


def test_bad_config_values_say_how_to_fix(world, tmp_path):
    for value in ("-0.1", "1.5"):
        with pytest.raises(ConfigError, match=r"data.lmbda .* must be in \[0, 1\]"):
            _cfg(world, f"data.lmbda={value}")
    with pytest.raises(ConfigError, match="set data.lmbda=1"):
        _cfg(world, "loss.estimator=sampled", "data.lmbda=0.5")
    with pytest.raises(ConfigError, match="loss.kind must be one of"):
        _cfg(world, "loss.kind=kl")
    with pytest.raises(ConfigError, match="beta"):
        _cfg(world, "loss.kind=gjsd", "loss.beta=2")
    with pytest.raises(ConfigError, match="loss.tmperature|unknown"):
        _cfg(world, "loss.tmperature=2")
    (tmp_path / "p.jsonl").write_text(json.dumps({"image": "n0_0.png", "question": "Describe."}) + "\n")
    with pytest.raises(UserError, match="needs an 'answer' in every record"):
        _train(world, tmp_path / "c", f"data.prompts={tmp_path / 'p.jsonl'}",
               f"data.image_folder={world[1] / 'images'}", "data.lmbda=0.5",
               "data.off_policy=dataset")  # fmt: skip
    with pytest.raises(UserError, match="needs --student DIR"):
        _train(world, tmp_path / "d", 'student.path=""')

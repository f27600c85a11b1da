"""The no-ground-truth pipeline: notes stripped of their ground truth raise on any read of it, the labeler's
object answer style equals a manual forward, the shipped nogt configs differ from the main job's only where
the reward comes from, the pipeline refuses stage configs that read ground truth, and a tiny end-to-end run
whose DPO and GRPO trainers get stripped notes, while a reward that reads ground truth raises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mm.config import load_config
from mm.data.format import read_notes
from mm.errors import UserError
from mm.model.adapter import Sample
from rl.ground_truth import (
    GROUND_TRUTH,
    KEPT,
    GroundTruthError,
    StrippedNote,
    is_stripped,
    strip_ground_truth,
)
from rl.labeler import Labeler, LabelerConfig
from rl.pipeline import PipelineConfig, _config_dict, resolve
from rl.pipeline_nogt import check_without_ground_truth, ground_truth_reads
from tests.helpers.eval_model import make_data_dir, make_model_dir
from tests.mm.adapter_helpers import random_image
from tests.rl.test_pipeline import POST, _run, tiny_pipeline

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    root = tmp_path_factory.mktemp("nogt")
    return make_model_dir(root), make_data_dir(root, split="train")


# ---------------------------------------------------------------- the stripped note


def test_stripped_note_keeps_images_and_raises_on_ground_truth(small):
    note = read_notes(small[1], split="train")[1]
    s = strip_ground_truth(note)
    assert isinstance(s, StrippedNote) and is_stripped(s) and not is_stripped(note)
    assert (s.id, s.images, s.split, s.source) == (note.id, note.images, note.split, note.source)
    assert strip_ground_truth(s) is s  # idempotent
    for name in GROUND_TRUTH:
        with pytest.raises(
            GroundTruthError, match=rf"\.{name} is ground truth; the no-ground-truth pipeline"
        ):
            getattr(s, name)
    assert issubclass(GroundTruthError, UserError) and not issubclass(GroundTruthError, AttributeError)
    with pytest.raises(GroundTruthError):
        hasattr(s, "categories")  # hasattr swallows only AttributeError: a probe for the truth is loud too
    with pytest.raises(AttributeError, match="has only id, images, split, source"):
        s.to_json  # noqa: B018 - nothing else reads through (a method could hand the truth back)
    with pytest.raises(AttributeError, match="read-only"):
        s.objects = []
    assert set(KEPT).isdisjoint(GROUND_TRUTH) and note.categories == {"dog", "plate", "knife"}


def test_the_scene_reward_and_question_prompts_on_stripped_notes_raise(small):
    from mm.model.processing import NoteProcessor
    from rl.trainers.grpo_config import DataConfig
    from rl.trainers.grpo_data import PromptSet, load_prompt_notes

    nogt = DataConfig(ground_truth=False)
    notes, vocab = load_prompt_notes(small[1], nogt, source="labeler", vocab="world")
    assert vocab == "world" and all(is_stripped(n) for n in notes) and len(notes) == 2
    processor = NoteProcessor.from_pretrained(small[0])
    ps = PromptSet(processor=processor, notes=notes, root=small[1], cfg=nogt)
    assert len(ps) == 2 and ps.batch([0, 1])["input_ids"].shape[0] == 2  # captions need the images only
    with pytest.raises(GroundTruthError, match=r"\.categories is ground truth"):
        ps.objects  # noqa: B018 - what the scene reward reads
    for tasks in (["question"], ["pope_question"]):
        with pytest.raises(GroundTruthError):
            cfg = DataConfig(tasks=tasks, ground_truth=False)
            PromptSet(processor=processor, notes=notes, root=small[1], cfg=cfg)
    with pytest.raises(UserError, match="reward.vocab=auto picks the vocabulary from the notes' ground"):
        load_prompt_notes(small[1], nogt, source="labeler", vocab="auto")
    for source in ("scene", "labeler"):  # with ground truth (the default) nothing is stripped
        kept, vocab = load_prompt_notes(small[1], DataConfig(), source=source, vocab="auto")
        assert vocab == "world" and len(kept) == 2 and not any(is_stripped(n) for n in kept)


def test_dpo_pairs_without_ground_truth_get_stripped_notes(small):
    from rl.trainers.dpo_config import DataConfig
    from rl.trainers.dpo_data import _world_notes, load_question_pairs

    kw = {"folder": str(small[1]), "build": "onpolicy", "notes": 2, "scorer": "labeler", "labeler": "m"}
    cfg = DataConfig(**kw, ground_truth=False)
    assert all(is_stripped(n) for n in _world_notes(cfg)) and len(_world_notes(cfg)) == 2
    with pytest.raises(GroundTruthError):
        load_question_pairs(cfg, seed=0)  # yes/no pairs are made from the objects
    assert not any(is_stripped(n) for n in _world_notes(DataConfig(**kw)))


# ---------------------------------------------------------------- the labeler's object answer style


def _manual_answer_logp(adapter, sample: Sample, answer_ids: list[int]) -> float:
    """One unpadded sample: prompt ids + answer ids in one forward, full logits, log-softmax in float64."""
    batch = adapter.build_prompts([sample])
    ids = torch.tensor([answer_ids])  # (1, A)
    p = batch["input_ids"].shape[1]
    inputs = {k: v for k, v in batch.items() if k not in ("response_mask", "labels")}
    inputs["input_ids"] = torch.cat([batch["input_ids"], ids], dim=1)  # (1, P + A)
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    with torch.no_grad():
        logits = adapter.model(**inputs, use_cache=False).logits[0].double()  # (P + A, V)
    logp = torch.log_softmax(logits, dim=-1)
    return sum(logp[p - 1 + i, t].item() for i, t in enumerate(answer_ids))


def test_object_style_p_yes_equals_a_manual_forward(small):
    import math

    from mm.train.tasks import yes_no_answer

    lab = Labeler.from_folder(small[0], LabelerConfig(answer_style="object", batch_size=3))
    imgs = [random_image(24, 20, seed=1), random_image(30, 18, seed=2)]
    objs = ["cup", "traffic light", "wine glass", "dog"]  # answers of different lengths: padding
    got = lab.verify_objects([imgs[0]], objs)
    tok = lab.adapter.tokenizer
    for o in objs:
        sample = Sample(images=[imgs[0]], text=lab.question(o))
        answers = {a: yes_no_answer(a, o, "object") for a in ("yes", "no")}  # "A cup: yes", "A cup: no"
        ids = {a: tok(t, add_special_tokens=False)["input_ids"] for a, t in answers.items()}
        lp = {a: _manual_answer_logp(lab.adapter, sample, ids[a]) for a in ids}
        want = 1.0 / (1.0 + math.exp(lp["no"] - lp["yes"]))
        assert got[o] == pytest.approx(want, abs=1e-6) and 0.0 < got[o] < 1.0
    word = Labeler.from_folder(small[0], LabelerConfig())
    assert word.model_id != lab.model_id  # the two styles never share cache entries
    with pytest.raises(UserError, match="answer_style=object reads P\\(yes\\) after the asked object"):
        lab.p_yes([([imgs[1]], "Is it sunny?")])
    with pytest.raises(ValueError, match="answer_style must be word or object"):
        LabelerConfig(answer_style="Yes")


# ---------------------------------------------------------------- the shipped configs


@pytest.fixture(scope="module")
def shipped():
    mp = pytest.MonkeyPatch()
    mp.chdir(ROOT)  # stage config paths are relative to the working directory
    try:
        gt = resolve(load_config(PipelineConfig, "configs/rl/pipeline.yaml"), Path("OUT"))
        cfg = load_config(PipelineConfig, "configs/rl/pipeline_nogt.yaml")
        yield cfg, resolve(cfg, Path("OUT")), gt
    finally:
        mp.undo()


def _diff(a, b, prefix=""):
    if isinstance(a, dict) and isinstance(b, dict):
        return {d for k in a.keys() | b.keys() for d in _diff(a.get(k), b.get(k), f"{prefix}{k}.")}
    return set() if a == b else {prefix.rstrip(".")}


def test_nogt_pipeline_is_the_main_job_but_for_where_rewards_come_from(shipped):
    cfg, nogt, gt = shipped
    assert not cfg.ground_truth and cfg.post == ["dpo", "grpo"]
    for stage in ("data", "pretrain", "align", "sft"):
        assert _config_dict(nogt[stage]) == _config_dict(gt[stage]), stage
    assert _diff(_config_dict(nogt["dpo"]), _config_dict(gt["dpo"])) == {
        "data.scorer", "data.labeler", "data.labeler_soft", "data.ground_truth", "train.steps", "data.notes"
    }  # fmt: skip
    assert (nogt["dpo"].train.steps, gt["dpo"].train.steps) == (150, 300)  # labeler pairs overfit at 300
    assert (nogt["dpo"].data.notes, gt["dpo"].data.notes) == (1200, 600)  # more pairs instead
    assert nogt["dpo"].data.labeler == str(Path("OUT") / "sft" / "model") == nogt["dpo"].init.model
    assert _diff(_config_dict(nogt["grpo"]), _config_dict(gt["grpo"])) == {
        "reward.source", "reward.labeler.answer_style", "reward.labeler.soft", "reward.labeler.threshold",
        "algo.mention_credit", "data.ground_truth",
    }  # fmt: skip
    assert nogt["grpo"].reward.labeler.model == ""  # the starting checkpoint: self-feedback
    assert all(ground_truth_reads(p, nogt[p]) == [] for p in cfg.post)


def test_ground_truth_reading_stage_configs_are_refused(shipped):
    _, _, gt = shipped
    with pytest.raises(UserError) as e:
        check_without_ground_truth(gt, ["dpo", "grpo"])
    msg = str(e.value)
    assert "dpo: data.ground_truth=true hands the trainer the notes with their ground truth" in msg
    assert "dpo: data.scorer=scene ranks the samples by the notes' objects" in msg
    assert "grpo: reward.source=scene scores against the notes' objects" in msg
    assert "set ground_truth: true" in msg
    check_without_ground_truth(gt, [])  # nothing to post-train: nothing to refuse


@pytest.mark.slow
@pytest.mark.skipif(POST != ["dpo", "grpo"], reason="needs the DPO and GRPO trainers")
def test_pipeline_refuses_a_ground_truth_stage_before_writing(tmp_path, capsys):
    cfg = tiny_pipeline(tmp_path, ground_truth=False)  # the tiny main job: injection pairs, scene reward
    out = tmp_path / "run"
    assert _run(cfg, out) == 2
    err = capsys.readouterr().err
    assert "data.build=injection builds pairs from the notes' objects" in err and not out.exists()


# ---------------------------------------------------------------- a tiny run end to end


def _tiny_nogt(tmp: Path) -> Path:
    step = ["train.steps=2", "train.checkpoint_every=2", "train.device=cpu"]
    return tiny_pipeline(
        tmp,
        ground_truth=False,
        dpo={"config": str(ROOT / "configs/rl/dpo_nogt_tiny.yaml"),
             "overrides": [*step, "data.batch_size=2", "data.notes=12"]},
        grpo={"config": str(ROOT / "configs/rl/grpo_nogt_tiny.yaml"),
              "overrides": [*step, "rollout.group_size=2", "rollout.max_new_tokens=6",
                            "data.prompts_per_step=2", "data.notes=8"]},
    )  # fmt: skip


@pytest.fixture(scope="module")
def nogt_run(tmp_path_factory):
    """The tiny pipeline without ground truth, with spies on what the DPO and GRPO trainers get."""
    import rl.pairs
    import rl.trainers.grpo as grpo

    tmp = tmp_path_factory.mktemp("nogt_run")
    seen: dict[str, list] = {"dpo": [], "grpo": []}
    original_pairs, original_prompts = rl.pairs.onpolicy_pairs, grpo.PromptSet

    def pairs_spy(model, processor, notes, *a, **k):
        seen["dpo"].extend(notes)
        return original_pairs(model, processor, notes, *a, **k)

    class PromptSpy(original_prompts):
        def __init__(self, **k):
            seen["grpo"].extend(k["notes"])
            super().__init__(**k)

    mp = pytest.MonkeyPatch()
    mp.setattr(rl.pairs, "onpolicy_pairs", pairs_spy)
    mp.setattr(grpo, "PromptSet", PromptSpy)
    try:
        cfg, out = _tiny_nogt(tmp), tmp / "run"
        rc = _run(cfg, out)
    finally:
        mp.undo()
    return cfg, out, rc, seen


@pytest.mark.slow
@pytest.mark.skipif(POST != ["dpo", "grpo"], reason="needs the DPO and GRPO trainers")
def test_tiny_nogt_pipeline_runs_and_its_trainers_get_stripped_notes(nogt_run):
    _, out, rc, seen = nogt_run
    assert rc == 0
    assert len(seen["dpo"]) == 12 and all(is_stripped(n) for n in seen["dpo"])
    assert len(seen["grpo"]) == 8 and all(is_stripped(n) for n in seen["grpo"])
    m = json.loads((out / "metrics.json").read_text())
    assert set(m["changes"]) == {"dpo", "grpo"}
    for stage in ("dpo", "grpo"):
        done = json.loads((out / stage / "stage.json").read_text())
        assert (out / stage / "model" / "config.json").is_file()
        assert done["config"]["init"]["model"] == str(out / "sft" / "model")
    dpo = json.loads((out / "dpo" / "stage.json").read_text())["config"]["data"]
    assert (dpo["scorer"], dpo["labeler"]) == ("labeler", str(out / "sft" / "model"))
    grpo = json.loads((out / "grpo" / "stage.json").read_text())["config"]["reward"]
    assert grpo["source"] == "labeler"
    for stage in ("dpo", "grpo"):  # the pipeline's switch reaches the trainers
        assert json.loads((out / stage / "stage.json").read_text())["config"]["data"]["ground_truth"] is False
    ev = json.loads((out / "eval_grpo" / "eval.json").read_text())  # the evals alone read the truth
    assert {"chair", "pope"} <= set(ev) and "chair_i_rel_change" in m["changes"]["grpo"]


@pytest.mark.slow
@pytest.mark.skipif(POST != ["dpo", "grpo"], reason="needs the DPO and GRPO trainers")
def test_a_ground_truth_reading_reward_raises(nogt_run, tmp_path, monkeypatch):
    import dataclasses

    import rl.pairs.onpolicy
    import rl.trainers.grpo as grpo
    from rl.trainers import dpo

    cfg_path, out, rc, _ = nogt_run
    assert rc == 0
    configs = resolve(load_config(PipelineConfig, cfg_path), out)

    def scene_peek(labeler, root, reward_cfg=None):  # a "labeler" scorer that peeks at the objects
        return lambda note, texts: [float(len(note.categories))] * len(texts)

    # the ground-truth rewards themselves, switched on by mistake: the scene scorer and the scene reward
    data = dataclasses.replace(configs["dpo"].data, scorer="scene")
    with pytest.raises(GroundTruthError, match=r"\.categories is ground truth"):
        dpo.train(
            dataclasses.replace(configs["dpo"], data=data), out_dir=tmp_path / "d0", show_progress=False
        )
    reward = dataclasses.replace(configs["grpo"].reward, source="scene")
    with pytest.raises(GroundTruthError, match=r"\.categories is ground truth"):
        grpo.train(
            dataclasses.replace(configs["grpo"], reward=reward), out_dir=tmp_path / "g0", show_progress=False
        )
    # and rewards of one's own that peek
    monkeypatch.setattr(rl.pairs.onpolicy, "labeler_scorer", scene_peek)
    with pytest.raises(GroundTruthError, match=r"\.categories is ground truth"):
        dpo.train(configs["dpo"], out_dir=tmp_path / "dpo", show_progress=False)

    class Peek:  # a GRPO rewarder that reads each prompt note's objects
        def __init__(self, prompts):
            self.prompts = prompts

        def score(self, texts, rows):
            return torch.tensor([float(len(self.prompts.notes[p.note].objects)) for p in rows]), {}

    monkeypatch.setattr(grpo, "build_rewarder", lambda cfg, *, prompts, **k: Peek(prompts))
    with pytest.raises(GroundTruthError, match=r"\.objects is ground truth"):
        grpo.train(configs["grpo"], out_dir=tmp_path / "grpo", show_progress=False)


def test_grpo_with_the_object_style_labeler_and_claim_credit(small, tmp_path):
    from tests.rl.test_labeler import _grpo

    sets = ("reward.source=labeler", "reward.labeler.answer_style=object", "algo.mention_credit=0.8",
            "data.ground_truth=false", "data.tasks=[caption]")  # fmt: skip
    out = tmp_path / "run"
    assert _grpo(small, out, *sets) == 0
    recs = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2]
    assert all(0.0 <= r["labeler_cache_hit_frac"] <= 1.0 and r["mention_credit_abs"] >= 0 for r in recs)
    assert (out / "model" / "config.json").is_file()

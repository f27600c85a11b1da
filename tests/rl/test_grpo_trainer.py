"""`rl grpo`: two-step smoke runs (no ref / adapter ref / copy ref, DAPO/GSPO), resume, warnings, errors."""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

import pytest
import torch

from rl.cli import main  # noqa: E402
from rl.trainers.monitor import failure_warnings  # noqa: E402
from tests.helpers.eval_model import make_data_dir, make_model_dir  # noqa: E402

GRPO_KEYS = (
    "loss", "grad_norm", "lr", "reward_mean", "reward_std", "zero_std_frac", "adv_std", "clip_frac_low",
    "clip_frac_high", "clip_frac_dual", "approx_kl", "entropy", "response_len", "truncated_frac",
)  # fmt: skip
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "rl" / "grpo_tiny.yaml"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo")
    return make_model_dir(root), make_data_dir(root, split="train")


def _run(dirs, out, *sets):
    model, data = dirs
    base = [
        f"init.model={model}", "data.prompts_per_step=2", "rollout.group_size=3", "rollout.max_new_tokens=6",
        "train.steps=2", "train.checkpoint_every=1", "optim.lr=0.01", "data.tasks=[caption,question]",
    ]  # fmt: skip
    args = ["grpo", "--config", str(CONFIG), "--out", str(out), "--data", str(data), "--no-progress"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return main(args + [x for s in (*base, *sets) for x in ("--set", s)])


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "extra, reference",
    [
        (("algo.beta=0",), "none"),
        (("lora.enabled=true", "lora.r=2", "algo.beta=0.04"), "adapter"),
        (("algo.beta=0.04", "algo.kl_estimator=k2"), "copy"),
    ],
)
def test_two_steps_and_reference_kind(tmp_path, dirs, extra, reference):
    out = tmp_path / "run"
    # the overlong penalty over the whole length makes rewards differ inside groups (a random model's
    # captions name few objects), so the policy gradient is not zero
    pen = ("algo.overlong_penalty=true", "algo.overlong_cache=6")
    assert _run(dirs, out, *pen, *extra) == 0
    recs = _records(out)
    assert [r["step"] for r in recs] == [1, 2]
    for k in GRPO_KEYS:
        assert k in recs[-1] and recs[-1][k] == recs[-1][k], k
    assert ("kl" in recs[-1]) == (reference != "none")
    assert 1 <= recs[-1]["response_len"] <= 6 and recs[0]["approx_kl"] == 0.0
    res = json.loads((out / "result.json").read_text())
    assert res["reference"] == reference and res["prompts"] == 2  # the fixture notes have no questions
    assert (out / "curves.png").stat().st_size > 1000 and (out / "model" / "config.json").is_file()
    from mm.model import NoteVLMForConditionalGeneration

    a = NoteVLMForConditionalGeneration.from_pretrained(str(dirs[0]))
    b = NoteVLMForConditionalGeneration.from_pretrained(str(out / "model"))
    moved = [n for (n, p), q in zip(a.named_parameters(), b.parameters()) if not torch.equal(p, q)]
    assert moved and not any(n.startswith("vision_tower") for n in moved)


def test_dapo_gspo_options_run(tmp_path, dirs):
    sets = (
        "algo.dynamic_sampling=true", "algo.overlong_penalty=true", "algo.overlong_cache=6",
        "algo.dual_clip=3", "algo.level=sequence", "algo.agg=seq-mean-token-mean",
        "algo.num_iterations=2", "algo.advantage=rloo", "train.steps=1",
    )  # fmt: skip
    assert _run(dirs, tmp_path / "dapo", *sets) == 0
    r = _records(tmp_path / "dapo")[-1]
    assert r["sample_batches"] >= 1 and r["zero_std_frac"] <= 1.0


def test_mention_credit_runs_and_logs(tmp_path, dirs):
    assert _run(dirs, tmp_path / "mc", "algo.mention_credit=1.0", "data.tasks=[caption]") == 0
    r = _records(tmp_path / "mc")[-1]
    assert r["mention_credit_abs"] >= 0 and math.isfinite(r["loss"])


def test_token_credits_follow_the_sampled_ids():
    from mm.data.tokenizer import load_tokenizer
    from rl.rewards import RewardConfig, mention_credits
    from rl.trainers.grpo import Prompt, token_credits
    from rl.trainers.rollout import Rollout

    tok = load_tokenizer()
    caption = tok(" a fork and a knife", add_special_tokens=False)["input_ids"]
    answer = tok(" yes", add_special_tokens=False)["input_ids"]
    R = len(caption) + 1
    resp = torch.zeros(2, R, dtype=torch.long)
    resp[0, : len(caption)] = torch.tensor(caption)
    resp[0, len(caption)] = tok.eos_token_id
    resp[1, : len(answer)] = torch.tensor(answer)
    mask = torch.zeros(2, R, dtype=torch.long)
    mask[0, : len(caption) + 1] = 1
    mask[1, : len(answer)] = 1
    prompt = torch.ones(2, 3, dtype=torch.long)
    roll = Rollout(
        input_ids=torch.cat([prompt, resp], 1), attention_mask=torch.cat([prompt, mask], 1),
        response_mask=torch.cat([torch.zeros_like(prompt), mask], 1), prompt_length=3, group_size=2,
        lengths=mask.sum(-1), truncated=torch.tensor([False, True]), images={},
    )  # fmt: skip
    rows = [Prompt(note=0, text="Describe the note.", label=None), Prompt(note=0, text="q", label="yes")]
    cfg = RewardConfig(hallucination_weight=2.0)
    got = token_credits(roll, rows, [["fork", "cup"]], tok, cfg)  # (2, R)
    pieces = [tok.decode([t]) for t in caption]
    assert got[0, : len(caption)].tolist() == pytest.approx(mention_credits(pieces, ["fork", "cup"], cfg))
    assert got[0].sum().item() == pytest.approx(0.5 - 1.0)  # fork covered (1/2), knife hallucinated (2/2)
    assert not got[1].any() and got[0, len(caption) :].abs().sum() == 0  # question rows, eos, padding


def test_dynamic_sampling_on_constant_reward_is_a_clear_error(tmp_path, dirs, capsys):
    sets = (
        "algo.dynamic_sampling=true",
        "algo.max_sample_batches=1",
        "reward.caption_weight=0",
        "reward.yesno_weight=0",
    )
    assert _run(dirs, tmp_path / "ds", *sets) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # (after transformers' loading bar)
    assert err.startswith("rl grpo: error: dynamic sampling found")
    assert not (tmp_path / "ds" / "model").exists() and not (tmp_path / "ds" / "checkpoints").exists()


def test_constant_reward_warns_grpo_loss_is_zero(tmp_path, dirs):
    from mm.config import load_config
    from rl.trainers import grpo

    model, data = dirs
    cfg = load_config(
        grpo.GRPOConfig, CONFIG,
        [f"init.model={model}", f"data.folder={data}", "data.prompts_per_step=2", "rollout.group_size=2",
         "rollout.max_new_tokens=4", "train.steps=1", "reward.caption_weight=0"],
    )  # fmt: skip
    with pytest.warns(UserWarning, match="GRPO loss is 0"):
        res = grpo.train(cfg, out_dir=tmp_path / "zero", show_progress=False)
    assert (
        res["last"]["zero_std_frac"] == 1.0 and res["last"]["loss"] == 0.0 and res["last"]["adv_std"] == 0.0
    )


def test_monitor_patterns():
    hist = [{"entropy": 2.0, "response_len": 10.0}]
    assert failure_warnings(hist, {"entropy": 1.5, "response_len": 12.0, "zero_std_frac": 0.5}) == []
    kinds = [
        w.split(":")[0]
        for w in failure_warnings(hist, {"entropy": 0.1, "response_len": 25.0, "zero_std_frac": 1.0})
    ]
    assert kinds == ["zero-std", "entropy-collapse", "length-runaway"]
    w = failure_warnings(hist, {"truncated_frac": 0.9}, max_new_tokens=64)
    assert len(w) == 1 and "max_new_tokens=64" in w[0]


def test_resume_gives_the_same_weights(tmp_path, dirs):
    from safetensors.torch import load_file

    from mm.config import load_config
    from rl.trainers import grpo

    sets = ["train.steps=3", "algo.overlong_penalty=true", "algo.overlong_cache=6"]
    assert _run(dirs, tmp_path / "straight", *sets) == 0
    model, data = dirs
    cfg = load_config(
        grpo.GRPOConfig, CONFIG,
        [f"init.model={model}", f"data.folder={data}", "data.prompts_per_step=2", "rollout.group_size=3",
         "rollout.max_new_tokens=6", "train.checkpoint_every=1", "optim.lr=0.01",
         "data.tasks=[caption,question]"] + sets,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        grpo.train(cfg, out_dir=tmp_path / "killed", show_progress=False, stop_after=1)
    assert _run(dirs, tmp_path / "killed", *sets) == 0
    a = load_file(str(tmp_path / "straight" / "checkpoints" / "step-00000003" / "model.safetensors"))
    b = load_file(str(tmp_path / "killed" / "checkpoints" / "step-00000003" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = _records(tmp_path / "straight"), _records(tmp_path / "killed")
    assert [r["reward_mean"] for r in ra] == [r["reward_mean"] for r in rb]


@pytest.mark.parametrize(
    "override, message",
    [
        ("rollout.group_size=1", "group_size must be >= 2"),
        ("algo.scale=std", "algo.scale must be one of"),
        ("algo.dual_clip=0.5", "algo.dual_clip must be > 1"),
        ("algo.overlong_penalty=true algo.overlong_cache=100", "must be <= rollout.max_new_tokens"),
        ("data.tasks=[chat]", "data.tasks must be"),
        ("algo.betta=0.1", "unknown key"),
        ("algo.mention_credit=1 algo.level=sequence", "needs algo.level=token"),
    ],
)
def test_config_errors_exit_2_with_one_line(tmp_path, dirs, capsys, override, message):
    assert _run(dirs, tmp_path / "out", *override.split()) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert not (tmp_path / "out" / "model").exists()


@pytest.mark.parametrize("path", sorted(CONFIG.parent.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_load(path):
    from mm.config import load_config
    from rl.trainers.dpo import DPOConfig
    from rl.trainers.grpo import GRPOConfig
    from rl.trainers.grpo_files_config import GRPOFilesConfig

    if path.name.startswith(("dpo", "grpo")):
        cls = GRPOFilesConfig if path.name.startswith("grpo_files") else GRPOConfig
        cfg = load_config(DPOConfig if path.name.startswith("dpo") else cls, path)
        assert cfg.train.steps >= 1


def test_pope_question_prompts_show_one_image(tmp_path, dirs):
    """``data.tasks=[pope_question]``: POPE-style prompts about one image of a note (adversarial
    negatives), scored by the yes/no reward; a short run trains on them."""
    from mm.config import load_config
    from mm.data.format import read_notes
    from mm.model.processing import NoteProcessor
    from rl.trainers import grpo

    model, data = dirs
    cfg = load_config(
        grpo.GRPOConfig,
        CONFIG,
        [f"init.model={model}", f"data.folder={data}", "data.tasks=[caption, pope_question]"],
    )
    notes = [n for n in read_notes(data) if n.split == "train"]
    ps = grpo.PromptSet(processor=NoteProcessor.from_pretrained(model), notes=notes, root=data, cfg=cfg.data)
    pope = [p for p in ps.prompts if p.image is not None]
    assert pope and all(p.label in ("yes", "no") and p.text.endswith("in this note?") for p in pope)
    per_note = {}
    for p in pope:
        per_note[p.note] = per_note.get(p.note, 0) + 1
    assert max(per_note.values()) <= cfg.data.questions_per_note
    k = ps.prompts.index(pope[0])
    one = ps.batch([k])
    assert int(one["image_mask"].sum()) == 1  # one image shown
    assert _run(dirs, tmp_path / "pq", "data.tasks=[pope_question]", "rollout.max_new_tokens=4") == 0
    assert _records(tmp_path / "pq")[-1]["step"] == 2


def test_prompts_that_do_not_split_over_the_processes_are_refused(tmp_path, dirs, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")  # what torchrun / accelerate launch set in every process
    assert _run(dirs, tmp_path / "o", "data.prompts_per_step=3") == 2
    err = capsys.readouterr().err.strip()
    assert "data.prompts_per_step=3 must be divisible by 2 processes" in err and "\n" not in err
    assert not (tmp_path / "o").exists()  # refused before writing anything

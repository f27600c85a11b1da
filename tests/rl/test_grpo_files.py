"""`rl grpo --model DIR --prompts P.jsonl`: two steps on tiny LLaVA, Qwen2-VL, Idefics3 and NoteVLM folders
with a built-in and a ``module:function`` reward; the saved model loads with transformers alone; bad
reward specs, prompt files and vocabularies fail in one line before anything is written."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import warnings

import pytest

from rl.cli import main
from tests.mm.adapter_helpers import build_family, random_image

FAMILIES = ["llava", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "gemma3", "internvl", "idefics3", "notevlm"]
RECORDS = [
    {"id": "cap", "image": "0.png", "question": "Describe the image.", "objects": ["fork", "cup"], "note": 1},
    {"image": ["1.png", "2.png"], "question": "Is there a dog in the second image?", "answer": "no"},
    {"id": "cap2", "image": "2.png", "question": "What is in it?", "objects": [["dog"], ["plate"]]},
]
REWARD_MODULE = '''
def length_bonus(prompt, completion, record):
    """Longer completions score more; a caption record scores one more (uses the record)."""
    return len(completion) / 10.0 + ("objects" in record)
'''
KEYS = ("loss", "reward_mean", "zero_std_frac", "adv_std", "clip_frac_high", "approx_kl", "entropy",
        "response_len", "truncated_frac", "grad_norm")  # fmt: skip


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo_files")
    (root / "imgs").mkdir()
    for i in range(3):
        random_image(24 + 8 * i, 16 + 8 * i, seed=i).save(root / "imgs" / f"{i}.png")
    (root / "p.jsonl").write_text("\n".join(json.dumps(r) for r in RECORDS) + "\n")
    models = {}
    for fam in FAMILIES:
        if fam == "notevlm":
            from tests.helpers.eval_model import make_model_dir

            models[fam] = make_model_dir(root / "nv")
        else:
            models[fam] = build_family(fam, root / fam)
    return root, models


def _run(root, model, out, reward, *sets, prompts=None):
    args = ["grpo", "--model", str(model), "--prompts", str(prompts or root / "p.jsonl"), "--image-folder",
            str(root / "imgs"), "--reward", reward, "--out", str(out), "--no-progress"]  # fmt: skip
    base = ["train.steps=2", "train.device=cpu", "data.prompts_per_step=2", "rollout.group_size=2",
            "rollout.max_new_tokens=4", "optim.lr=0.01", "algo.overlong_penalty=true",
            "algo.overlong_cache=4"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return main(args + [x for s in (*base, *sets) for x in ("--set", s)])


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


TIS_FAMILIES = ("qwen2_vl", "notevlm")
"""Families run with top-k sampling (off the trainer's distribution: the importance correction is on)."""


@pytest.fixture(scope="module")
def builtin_runs(files, tmp_path_factory):
    """Two steps of every family with the built-in reward: family -> OUT."""
    root, models = files
    outs = {}
    for family in FAMILIES:
        out = tmp_path_factory.mktemp(f"run_{family}")
        extra = ("rollout.top_k=5",) if family in TIS_FAMILIES else ()
        assert _run(root, models[family], out, "hallucination", *extra) == 0, family
        outs[family] = out
    return outs


@pytest.mark.parametrize("family", FAMILIES)
def test_two_steps_builtin_reward(builtin_runs, family):
    out = builtin_runs[family]
    recs = _records(out)
    assert [r["step"] for r in recs] == [1, 2]
    for r in recs:
        assert all(k in r and math.isfinite(r[k]) for k in KEYS), r
        # the correction applies only off the trainer's distribution; 0 < w <= cap (3.0)
        assert ("is_weight_mean" in r) == (family in TIS_FAMILIES)
        if family in TIS_FAMILIES:
            assert 0 < r["is_weight_min"] <= r["is_weight_max"] <= 3.0
    result = json.loads((out / "result.json").read_text())
    assert result["family"] == family and result["engine"] == "local" and result["step"] == 2
    assert (out / "model" / "config.json").is_file()


def test_saved_models_load_with_transformers_alone(builtin_runs):
    """OUT/model of each transformers family loads in an isolated interpreter (no notelens on the path)."""
    code = (
        "import sys\n"
        "from transformers import AutoModelForImageTextToText, AutoProcessor\n"
        "for d in sys.argv[1:]:\n"
        "    m = AutoModelForImageTextToText.from_pretrained(d); AutoProcessor.from_pretrained(d)\n"
        "    print(m.config.model_type)\n"
    )
    fams = [f for f in FAMILIES if f != "notevlm"]
    dirs = [str(builtin_runs[f] / "model") for f in fams]
    proc = subprocess.run([sys.executable, "-I", "-c", code, *dirs], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == fams


@pytest.mark.parametrize("family", FAMILIES)
def test_two_steps_module_function_reward(tmp_path, files, family, monkeypatch):
    root, models = files
    monkeypatch.chdir(tmp_path)  # the reward module is importable from the current folder
    (tmp_path / f"my_rewards_{family}.py").write_text(REWARD_MODULE)
    out = tmp_path / "run"
    sets = ("lora.enabled=true", "lora.r=2", "algo.beta=0.04") if family in ("llava", "notevlm") else ()
    assert _run(root, models[family], out, f"my_rewards_{family}:length_bonus", *sets) == 0
    recs = _records(out)
    assert len(recs) == 2 and all(math.isfinite(r["loss"]) for r in recs)
    assert recs[0]["reward_mean"] > 0.4  # length_bonus: 1 on the caption records plus a length term
    assert recs[0]["grad_norm"] > 0  # rewards differ within groups: a real gradient
    assert json.loads((out / "result.json").read_text())["reference"] == ("adapter" if sets else "none")
    assert (out / "model" / "adapter").is_dir() == bool(sets)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("nonsense", "neither a built-in"),
        ("no_such_module_xyz:f", "cannot import module"),
        ("bad_rewards:missing", "has no 'missing'"),
        ("bad_rewards:two_args", "must take (prompt: str, completion: str, record: dict)"),
        ("bad_rewards:CONSTANT", "non-callable"),
    ],
)
def test_bad_reward_spec_is_one_line_and_writes_nothing(tmp_path, files, capsys, monkeypatch, spec, message):
    root, models = files
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad_rewards.py").write_text(
        "CONSTANT = 1\n\ndef two_args(prompt, completion):\n    return 0.0\n"
    )
    out = tmp_path / "run"
    capsys.readouterr()
    assert _run(root, models["llava"], out, spec) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not out.exists()


def test_reward_returning_a_non_number_is_one_line(tmp_path, files, capsys, monkeypatch):
    root, models = files
    monkeypatch.chdir(tmp_path)
    (tmp_path / "text_rewards.py").write_text("def words(prompt, completion, record):\n    return 'good'\n")
    capsys.readouterr()
    assert _run(root, models["llava"], tmp_path / "run", "text_rewards:words") == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' loading progress bar
    assert last == "rl grpo: error: reward words returned 'good' (str); it must return a float"


@pytest.mark.parametrize(
    "record, vocab, message",
    [
        ({"image": "0.png", "question": "Describe."}, "auto",
         "p.jsonl:1: reward 'hallucination' (chair): no objects"),
        ({"image": "0.png", "question": "Q?", "answer": "maybe"}, "auto", "answer must be 'yes' or 'no'"),
        ({"image": "0.png", "question": "Describe.", "objects": ["unicorn"]}, "auto",
         "neither the world nor"),
        ({"image": "0.png", "question": "Describe.", "objects": ["cat", "chair"]}, "world",
         "outside the world vocabulary: ['cat', 'chair']; they are coco names: set reward.vocab=coco"),
        ({"image": "missing.png", "question": "Describe.", "objects": []}, "auto", "image(s) not found"),
        ({"image": "0.png", "objects": []}, "auto", "needs a non-empty 'question'"),
    ],
)  # fmt: skip
def test_bad_records_and_vocabulary_fail_before_writing(tmp_path, files, capsys, record, vocab, message):
    root, models = files
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps(record) + "\n")
    out = tmp_path / "run"
    capsys.readouterr()
    assert _run(root, models["llava"], out, "hallucination", f"reward.vocab={vocab}", prompts=prompts) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not out.exists()


def test_coco_names_follow_the_data(tmp_path, files):
    """COCO object names (``cat``, ``chair``) resolve to the COCO vocabulary under ``reward.vocab=auto``."""
    root, models = files
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"image": "0.png", "question": "Describe.", "objects": ["cat", "chair"]}))
    out = tmp_path / "run"
    assert _run(root, models["qwen2_vl"], out, "chair", "train.steps=1", prompts=prompts) == 0
    assert [r["step"] for r in _records(out)] == [1]


def test_vllm_engine_without_vllm_is_one_line(tmp_path, files, capsys):
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("vLLM is installed: the missing-extra message cannot be checked")
    root, models = files
    capsys.readouterr()
    assert _run(root, models["llava"], tmp_path / "run", "hallucination", "rollout.engine=vllm") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "rollout.engine=vllm needs vLLM" in err and "notelens[vllm]" in err


def test_dapo_gspo_options_on_files(tmp_path, files, monkeypatch):
    """Dynamic sampling, GSPO sequence ratios, two inner updates and sequence-level TIS on Qwen2-VL."""
    root, models = files
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dapo_rewards.py").write_text(REWARD_MODULE)
    out = tmp_path / "run"
    sets = ("algo.dynamic_sampling=true", "algo.level=sequence", "algo.agg=seq-mean-token-mean",
            "algo.num_iterations=2", "rollout.top_p=0.7", "rollout.tis_level=sequence")  # fmt: skip
    assert _run(root, models["qwen2_vl"], out, "dapo_rewards:length_bonus", *sets) == 0
    recs = _records(out)
    assert len(recs) == 2 and all(r["sample_batches"] >= 1 and r["zero_std_frac"] < 1 for r in recs)
    assert all(0 < r["is_weight_min"] <= r["is_weight_max"] <= 3.0 for r in recs)


def _coco_notes(root):
    """A note folder whose objects carry COCO names (``mm data coco`` output)."""
    from mm.data.format import Note, ObjectAnnotation, write_notes

    d = root / "coco"
    (d / "images").mkdir(parents=True)
    random_image(16, 16).save(d / "images" / "c0.png")
    cats = ["cat", "couch"]
    note = Note(id="c0", images=["images/c0.png"], text="A cat on a couch.", split="train", source="coco",
                objects=[[ObjectAnnotation(category=c, bbox=(0, 0, 4, 4)) for c in cats]])  # fmt: skip
    write_notes([note], d)
    return d


@pytest.mark.parametrize("vocab, rc", [("world", 2), ("auto", 0)])
def test_world_form_on_coco_names(tmp_path, files, capsys, vocab, rc):
    """``rl grpo --config`` on notes with COCO names: world vocabulary -> one line naming the fix; auto ->
    the COCO vocabulary follows the data and the run goes through."""
    from pathlib import Path

    from tests.helpers.eval_model import make_model_dir

    config = Path(__file__).resolve().parents[2] / "configs" / "rl" / "grpo_tiny.yaml"
    data, model = _coco_notes(tmp_path), make_model_dir(tmp_path)
    sets = [f"init.model={model}", "data.prompts_per_step=1", "rollout.group_size=2",
            "rollout.max_new_tokens=3", "train.steps=1", "train.device=cpu",
            f"reward.vocab={vocab}"]  # fmt: skip
    args = [
        "grpo",
        "--config",
        str(config),
        "--out",
        str(tmp_path / "run"),
        "--data",
        str(data),
        "--no-progress",
    ]
    capsys.readouterr()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert main(args + [x for s in sets for x in ("--set", s)]) == rc
    if rc:
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1, err
        assert (
            "outside the world vocabulary: ['cat', 'couch']; they are coco names: set reward.vocab=coco"
            in err
        )
    else:
        assert json.loads((tmp_path / "run" / "result.json").read_text())["step"] == 1

"""`rl grpo` data parallel: 2 gloo processes == 1 process on the global batch (weights at every step, logged
metrics), for the world form (``accelerate launch``) and the prompt-file form (``torchrun``); per-prompt
seeded sampling draws the same tokens whatever the batch; sharded losses average to the global loss."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from rl.cli import main
from tests.helpers.eval_model import make_data_dir, make_model_dir
from tests.helpers.launch import (
    EPS,
    checkpoints,
    launch,
    moved,
    one_process,
    records,
    same_records,
    same_weights,
)

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "rl" / "grpo_tiny.yaml"
COMPARED = (
    "loss", "reward_mean", "reward_std", "zero_std_frac", "group_reward_std", "adv_std", "clip_frac_low",
    "clip_frac_high", "approx_kl", "entropy", "response_len", "truncated_frac", "sample_batches",
)  # fmt: skip
"""Logged metrics that must be the global batch's under 2 processes."""
REWARD_MODULE = '''
def varied(prompt, completion, record):
    """0 on a "flat" record (its group has equal rewards), else a number that differs between texts."""
    return 0.0 if record.get("flat") else sum(map(ord, completion)) % 97 / 97
'''


def _same_runs(one: Path, two: Path, steps: int) -> None:
    """Weights of every step to 1e-5, every compared metric to 1e-5, one record per step (rank 0 logs)."""
    same_records(one, two, COMPARED, steps)
    weights = same_weights(one, two, checkpoints(steps))
    moved(weights[0], weights[-1])


def _same_saved_model(one: Path, two: Path) -> None:
    """The saved (merged) model folders hold the same weights to 1e-5."""
    from safetensors.torch import load_file

    a, b = load_file(str(one / "model.safetensors")), load_file(str(two / "model.safetensors"))
    assert a.keys() == b.keys() and not any("lora" in k for k in a)
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) < 1e-5


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo_dp")
    return make_model_dir(root), make_data_dir(root, split="train")


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True])
def test_world_form_two_processes_equal_one(tmp_path, world, fsdp):
    """accelerate launch, 2 ranks x 2 prompts == 1 process x 4 prompts: DAPO dynamic sampling (which
    groups are kept is a global decision), batch-std advantages, token-mean over the global token count,
    two updates per rollout (clipping metrics) and a KL to a frozen copy; data parallel and FSDP."""
    model, data = world
    sets = [
        f"init.model={model}", "data.prompts_per_step=4", "data.tasks=[caption,question]",
        "rollout.group_size=3", "rollout.max_new_tokens=6", "algo.overlong_penalty=true",
        "algo.overlong_cache=6", "algo.dynamic_sampling=true", "algo.scale=batch", "algo.num_iterations=2",
        "algo.beta=0.04", "train.steps=2", "train.checkpoint_every=1", "train.device=cpu", "train.threads=1",
        "optim.lr=0.001", EPS,
    ]  # fmt: skip
    args = ["grpo", "--config", str(CONFIG), "--data", str(data), "--no-progress"]
    args += [x for s in sets for x in ("--set", s)]
    one_process([*args, "--out", str(tmp_path / "one")])
    work = tmp_path / "work"
    work.mkdir()
    fsdp_args = ["--set", "train.fsdp=true"] if fsdp else []
    proc = launch(work, "accelerate", *args, *fsdp_args, "--out", str(work / "two"))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert proc.stdout.count('"prompts"') == 1  # rank 0 alone reports
    assert sorted(p.name for p in work.iterdir() if p.name not in (".hf", "__pycache__")) == ["two"]
    assert sorted(p.name for p in (work / "two").iterdir()) == [
        "checkpoints", "config.yaml", "curves.png", "metrics.jsonl", "model", "result.json",
    ]  # fmt: skip
    _same_runs(tmp_path / "one", work / "two", 2)
    assert all("kl" in r for r in records(work / "two"))


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [False, True])
def test_files_form_two_processes_equal_one(tmp_path, monkeypatch, fsdp):
    """torchrun, the prompt-file form on a tiny LLaVA (HF ``generate`` with the seeded sampler), top-k
    sampling (importance weights), GSPO's sequence ratios with a sequence-mean loss and DAPO dynamic
    sampling. Records 1 and 2 get a constant reward; with seed 0 the sampling batches of each step are
    records [0, 1] then [3, 2], so both kept groups are rank 0's and rank 1 trains on none (its loss
    weight is 0). Data parallel, and FSDP (the LM's blocks sharded; the saved model gathered whole)."""
    from tests.mm.adapter_helpers import build_family, random_image

    work = tmp_path / "work"
    work.mkdir()
    (work / "dp_reward.py").write_text(REWARD_MODULE)  # the launched processes import it from their cwd
    monkeypatch.syspath_prepend(str(work))
    (tmp_path / "imgs").mkdir()
    for i in range(4):
        random_image(24 + 8 * i, 16 + 8 * i, seed=i).save(tmp_path / "imgs" / f"{i}.png")
    prompts = [{"image": f"{i}.png", "question": "Describe it.", "flat": i in (1, 2)} for i in range(4)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prompts))
    model = build_family("llava", tmp_path / "llava")
    sets = [
        "train.steps=2", "train.checkpoint_every=1", "train.device=cpu", "train.threads=1",
        "data.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4", "rollout.top_k=5",
        "optim.lr=0.001", "algo.overlong_penalty=true", "algo.overlong_cache=4", "algo.level=sequence",
        "algo.agg=seq-mean-token-mean", "algo.dynamic_sampling=true", EPS,
    ]  # fmt: skip
    args = ["grpo", "--model", str(model), "--prompts", str(tmp_path / "p.jsonl"), "--image-folder",
            str(tmp_path / "imgs"), "--reward", "dp_reward:varied", "--no-progress"]  # fmt: skip
    args += [x for s in sets for x in ("--set", s)]
    one_process([*args, "--out", str(tmp_path / "one")])
    launched = [*args, "--set", "train.fsdp=true"] if fsdp else args
    proc = launch(work, "torchrun", *launched, "--out", str(work / "two"))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    assert proc.stdout.count('"family"') == 1
    _same_runs(tmp_path / "one", work / "two", 2)
    _same_saved_model(tmp_path / "one" / "model", work / "two" / "model")
    recs = records(work / "two")
    assert all("is_weight_mean" in r and r["sample_batches"] == 2 and r["zero_std_frac"] == 0.5 for r in recs)


# ---------------------------------------------------------------- in process: seeded sampling, shard losses

EOS, PAD = 7, 0


def _lm(seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=12, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)  # fmt: skip
    return Qwen2ForCausalLM(cfg).eval()


def _prompts(rows: list[list[int]]) -> dict[str, torch.Tensor]:
    ids = torch.tensor(rows)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


@pytest.mark.parametrize("sampler", ["inverse_cdf", "multinomial"])
def test_seeded_decode_loop_gives_a_prompt_the_same_tokens_in_any_batch(sampler):
    from rl.rollout.seeded import prompt_generators, prompt_seed
    from rl.trainers.rollout import sample_tokens

    lm = _lm()
    a, b = [1, 2, 3], [4, 5, 6]
    kw = dict(group_size=3, max_new_tokens=8, eos_id=EOS, pad_id=PAD, sampler=sampler)
    seeds = [prompt_seed(0, 5, 0, p) for p in (0, 1)]
    with torch.no_grad():
        torch.manual_seed(1)
        both = sample_tokens(lm, _prompts([a, b]), generators=prompt_generators(seeds, "cpu"), **kw)
        torch.manual_seed(2)  # the global RNG plays no part
        alone = sample_tokens(lm, _prompts([b]), generators=prompt_generators(seeds[1:], "cpu"), **kw)
        other = sample_tokens(lm, _prompts([b]), generators=prompt_generators([seeds[0]], "cpu"), **kw)
    assert torch.equal(both[3:, : alone.shape[1]], alone) and (both[3:, alone.shape[1] :] == PAD).all()
    assert not torch.equal(other, alone)  # another seed, another stream


def test_seeded_sampler_inside_generate_gives_a_prompt_the_same_tokens_in_any_batch():
    from rl.rollout.recorder import sampling_processors
    from rl.rollout.seeded import SeededSampler, prompt_generators

    lm = _lm(1)

    def run(rows: list[list[int]], seeds: list[int]) -> torch.Tensor:
        sampler = SeededSampler(prompt_generators(seeds, "cpu"), group_size=2)
        kwargs, _ = sampling_processors(lm, temperature=0.7, top_k=6, top_p=1.0, sampler=sampler)
        with torch.no_grad():
            return lm.generate(**_prompts(rows), num_return_sequences=2, max_new_tokens=6, pad_token_id=PAD,
                               eos_token_id=EOS, **kwargs)  # fmt: skip

    torch.manual_seed(3)
    both = run([[1, 2, 3], [4, 5, 6]], [11, 12])
    torch.manual_seed(4)
    alone = run([[4, 5, 6]], [12])
    assert torch.equal(both[2:, : alone.shape[1]], alone)
    assert not torch.equal(run([[4, 5, 6]], [13]), alone)


def test_draw_seeded_golden_and_bad_inputs():
    from rl.rollout.seeded import draw_seeded, prompt_generators, prompt_seed

    one_hot = torch.zeros(4, 5)
    one_hot[[0, 1, 2, 3], [3, 4, 0, 2]] = 1.0
    gens = prompt_generators([1, 2], "cpu")
    assert draw_seeded(one_hot, gens, group_size=2).tolist() == [3, 4, 0, 2]
    assert prompt_seed(0, 1, 2, 3) == prompt_seed(0, 1, 2, 3) != prompt_seed(0, 1, 2, 4)
    with pytest.raises(ValueError, match="need 2 generators"):
        draw_seeded(one_hot, gens[:1], group_size=2)
    with pytest.raises(ValueError, match="non-negative"):
        prompt_seed(0, -1)


@pytest.mark.parametrize(
    "agg, level",
    [("token-mean", "token"), ("seq-mean-token-mean", "sequence"), ("seq-mean-token-sum-norm", "token")],
)
def test_sharded_losses_average_to_the_global_loss_and_gradient(agg, level):
    """Two shards of a rollout batch (unequal response lengths), each loss weighted by
    ``local count * 2 / global count``: the mean of the shards' losses, gradients and token-averaged metrics
    is the whole batch's (what the skeleton's all-reduce makes of them)."""
    from rl.trainers.common import batch_token_logps
    from rl.trainers.grpo import AlgoConfig, grpo_loss, shard_loss
    from rl.trainers.grpo_shard import counts
    from rl.trainers.rollout import generate_rollout, merge_rollouts

    lm = _lm(2)
    algo = AlgoConfig(agg=agg, level=level, beta=0.1, eps_high=0.28)
    torch.manual_seed(0)
    roll = generate_rollout(lm, _prompts([[1, 2], [3, 4], [5, 6], [7, 8]]), group_size=2, max_new_tokens=6,
                            eos_id=EOS, pad_id=PAD)  # fmt: skip
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 0.3, -0.3])
    parts = [
        merge_rollouts([(roll, [0, 1, 2, 3, 4, 5])], pad_id=PAD),
        merge_rollouts([(roll, [6, 7])], pad_id=PAD),
    ]
    rows = [slice(0, 6), slice(6, 8)]

    def run(r, a, world, total):
        batch = r.batch()
        with torch.no_grad():
            ref = batch_token_logps(_lm(3), batch)[0]
        lm.zero_grad()
        loss, m = grpo_loss(lm, batch, a, algo, ref_logps=ref, horizon=6)
        local = counts(r.response_mask)
        loss, metrics = shard_loss(loss, m, {"counts": (local, total), "metrics": {}}, algo, world)
        loss.backward()
        return float(loss.detach()), metrics, [p.grad.clone() for p in lm.parameters()]

    total = tuple(map(sum, zip(*(counts(p.response_mask) for p in parts))))
    whole = run(roll, adv, 1, counts(roll.response_mask))
    shards = [run(p, adv[s], 2, total) for p, s in zip(parts, rows)]
    assert total == counts(roll.response_mask)
    assert (shards[0][0] + shards[1][0]) / 2 == pytest.approx(whole[0], abs=1e-6)
    for k in ("entropy", "kl", "approx_kl", "clip_frac_high"):
        assert (shards[0][1][k] + shards[1][1][k]) / 2 == pytest.approx(whole[1][k], abs=1e-6), k
    for g, g0, g1 in zip(whole[2], shards[0][2], shards[1][2]):
        assert torch.allclose((g0 + g1) / 2, g, atol=1e-6)


def test_shard_helpers():
    from rl.trainers.grpo_shard import global_stats, local_rows, loss_weight, shard_positions

    assert shard_positions(4, rank=1, world=2) == [2, 3]
    assert local_rows([None, "a", None, "b"], 2).tolist() == [2, 3, 6, 7]
    assert loss_weight(3, 12, world=2) == 0.5 and loss_weight(0, 12, world=2) == 0.0
    assert loss_weight(7, 7, world=1) == 1.0
    out = global_stats({"len": (6.0, 3), "none": (0.0, 0)}, world=1, mins={"w": 0.5}, maxs={"v": 2.0})
    assert out == {"len": 2.0, "w": 0.5, "v": 2.0}


def test_vllm_engine_under_several_processes_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    (tmp_path / "m").mkdir()
    args = ["grpo", "--model", str(tmp_path / "m"), "--prompts", str(tmp_path / "p.jsonl"), "--out",
            str(tmp_path / "o"), "--set", "rollout.engine=vllm", "data.prompts_per_step=2"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "rollout.engine=vllm runs in one process" in err and "\n" not in err
    assert not (tmp_path / "o").exists()


def _eos_prone(folder: Path, scale: float) -> None:
    """Scale the output row of the eos token(s) of a saved model, so that some completions end after a few
    tokens and others run on: the ranks' rollouts end at different steps."""
    from safetensors.torch import load_file, save_file
    from transformers import GenerationConfig

    eos = GenerationConfig.from_pretrained(folder).eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    weights = load_file(str(folder / "model.safetensors"))
    head = next(k for k in weights if k.endswith("lm_head.weight"))
    weights[head][eos] *= scale
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})


@pytest.mark.slow
@pytest.mark.parametrize("family", ["llava", "notevlm"])
def test_fsdp_rollouts_that_end_at_different_steps_on_each_rank(tmp_path, monkeypatch, family):
    """Under FSDP every decode step is a collective: a rank whose completions all ended must keep stepping
    until the other ranks' end (HF ``generate``'s ``synced_gpus``; the NoteVLM decode loop's own check), or
    the run hangs. Completions of many lengths (an eos-prone model), 2 ranks == 1 process."""
    from tests.helpers.eval_model import make_model_dir
    from tests.mm.adapter_helpers import build_family, random_image

    work = tmp_path / "work"
    work.mkdir()
    (work / "dp_reward.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(work))
    (tmp_path / "imgs").mkdir()
    for i in range(4):
        random_image(24 + 8 * i, 16 + 8 * i, seed=i).save(tmp_path / "imgs" / f"{i}.png")
    prompts = [{"image": f"{i}.png", "question": "Describe it."} for i in range(4)]
    (tmp_path / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in prompts))
    if family == "notevlm":
        model = make_model_dir(tmp_path / "nv")
    else:
        model = build_family(family, tmp_path / family)
    _eos_prone(model, 12.0 if family == "notevlm" else 120.0)  # (a 0.02-init LM needs more)
    sets = [
        "train.steps=2", "train.checkpoint_every=1", "train.device=cpu", "train.threads=1",
        "data.prompts_per_step=4", "rollout.group_size=2", "rollout.max_new_tokens=24", "optim.lr=0.001", EPS,
    ]  # fmt: skip
    args = ["grpo", "--model", str(model), "--prompts", str(tmp_path / "p.jsonl"), "--image-folder",
            str(tmp_path / "imgs"), "--reward", "dp_reward:varied", "--no-progress"]  # fmt: skip
    args += [x for s in sets for x in ("--set", s)]
    one_process([*args, "--out", str(tmp_path / "one")])
    stats = [(r["response_len"], r["truncated_frac"]) for r in records(tmp_path / "one")]
    assert all(1 < n < 20 and t < 0.5 for n, t in stats), stats  # of many lengths, most ended by eos
    proc = launch(work, "torchrun", *args, "--set", "train.fsdp=true", "--out", str(work / "two"))
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    _same_runs(tmp_path / "one", work / "two", 2)
    _same_saved_model(tmp_path / "one" / "model", work / "two" / "model")

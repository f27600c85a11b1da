"""Devices, precision, gradient checkpointing and FSDP in the training skeleton (mm.train.devices,
mm.train.fsdp, mm.train.loop): device resolution, nested batch moving, bf16 autocast against fp32 on a
tiny NoteVLM, checkpointed against plain gradients, every trainer's config taking the keys, and FSDP2
over 2 gloo CPU processes against one process (weights, evaluation, checkpoints, resume)."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file
from torch import nn

from mm.config import load_config
from mm.errors import UserError
from mm.train import common, devices, fsdp, loop, sft
from mm.train.config import OptimConfig, RunConfig, build_optimizer, param_groups
from tests.helpers.sft import make_world, tiny_train_config

KEYS = ["train.device=cpu", "train.precision=bf16", "train.gradient_checkpointing=true", "train.fsdp=true"]
"""The skeleton's keys, as overrides every trainer's config must take."""


# ---------------------------------------------------------------- device resolution


def test_auto_resolves_to_cpu_without_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert devices.resolve_device("auto") == torch.device("cpu")
    assert devices.resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("name", ["cuda", "cuda:0"])
def test_unavailable_cuda_is_a_clear_error(monkeypatch, name):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match=f"train.device={name} but no CUDA device is visible"):
        devices.resolve_device(name)


def test_cuda_index_out_of_range_and_pinned_under_a_launch(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with pytest.raises(UserError, match=r"only 2 CUDA device\(s\) are visible; use cuda:0..1"):
        devices.resolve_device("cuda:2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match="pins one GPU for every process"):
        devices.resolve_device("cuda:1")


def test_bad_device_and_precision_values_are_refused():
    with pytest.raises(UserError, match="auto, cpu, cuda or cuda:N, got 'gpu'"):
        devices.resolve_device("gpu")
    with pytest.raises(ValueError, match="train.device must be auto, cpu, cuda or cuda:N, got 'cuda:x'"):
        RunConfig(device="cuda:x")
    with pytest.raises(ValueError, match=r"train.precision must be one of \('fp32', 'bf16'\), got 'fp16'"):
        RunConfig(precision="fp16")
    assert RunConfig(device="cuda:3").device == "cuda:3"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_auto_takes_the_gpu():
    assert devices.resolve_device("auto").type == "cuda"
    assert devices.to_device({"x": torch.ones(2)}, torch.device("cuda"))["x"].is_cuda


# ---------------------------------------------------------------- batch moving


class Pair(NamedTuple):
    a: torch.Tensor
    b: list


@dataclasses.dataclass
class Rows:
    ids: torch.Tensor
    name: str


def test_to_device_moves_every_tensor_of_a_nested_batch():
    batch = {
        "x": torch.ones(2, 3),
        "nested": [torch.zeros(1), (torch.arange(3), "keep", 7)],
        "pair": Pair(torch.ones(1), [torch.ones(2), None]),
        "rows": Rows(ids=torch.tensor([1, 2]), name="r"),
        "n": 4,
    }
    out = devices.to_device(batch, torch.device("meta"))
    assert out["x"].device.type == "meta" and out["x"].shape == (2, 3)
    assert out["nested"][0].is_meta and out["nested"][1][0].is_meta
    assert out["nested"][1][1:] == ("keep", 7) and isinstance(out["nested"][1], tuple)
    assert isinstance(out["pair"], Pair) and out["pair"].a.is_meta and out["pair"].b[0].is_meta
    assert out["pair"].b[1] is None
    assert isinstance(out["rows"], Rows) and out["rows"].ids.is_meta and out["rows"].name == "r"
    assert out["n"] == 4
    assert batch["x"].device.type == "cpu"  # the input is not changed


# ---------------------------------------------------------------- a tiny NoteVLM: bf16, checkpointing


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny NoteVLM (SFT stage, full LM), its training samples and the config path."""
    from mm.data.format import read_notes
    from mm.train.sft_data import SampleSet, load_note_images
    from mm.train.tasks import build_samples

    tmp = tmp_path_factory.mktemp("devices")
    world = make_world(tmp / "notes", notes=10)
    notes = read_notes(world, "train")[:3]
    path = tiny_train_config(tmp / "c.yaml")
    cfg = load_config(sft.TrainConfig, path)
    common.seed_everything(0)
    model, proc, _ = sft.build_model_and_processor(cfg)
    model, _ = sft.prepare_trainable(model, cfg)
    data = SampleSet(
        processor=proc, images=load_note_images(notes, world, proc.image_size), samples=build_samples(notes)
    )
    return model, data.batch([0, 1, 2, 3]), path


def _sft_loss(model: Any, batch: dict[str, Any]) -> torch.Tensor:
    from mm.train.sft.loss import answer_loss, answer_token_divisor

    return answer_loss(model, batch, None, answer_token_divisor(batch["labels"], 1))


def test_bf16_autocast_on_cpu_is_finite_and_close_to_fp32(tiny):
    model, batch, _ = tiny
    cpu = torch.device("cpu")
    with torch.no_grad():
        fp32 = _sft_loss(model, batch)
        with devices.autocast("bf16", cpu):
            bf16 = _sft_loss(model, batch)
            assert model.lm_head(torch.ones(1, 32)).dtype == torch.bfloat16  # autocast is on
    assert torch.isfinite(bf16) and bf16.dtype == torch.float32  # cross-entropy stays float32
    assert float(bf16) == pytest.approx(float(fp32), rel=2e-2)
    assert float(bf16) != float(fp32)  # the matmuls did run in bf16
    with pytest.warns(devices.SlowPrecisionWarning, match="bf16 on the CPU"):
        devices.check_precision("bf16", cpu)


def test_gradient_checkpointing_gives_the_same_gradients(tiny):
    model, batch, _ = tiny
    model.train()

    def grads() -> dict[str, torch.Tensor]:
        model.zero_grad(set_to_none=True)
        _sft_loss(model, batch).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = grads()
    devices.enable_gradient_checkpointing(model)
    assert devices.is_checkpointing(model)
    checkpointed = grads()
    model.activation_checkpointing_disable()
    assert not devices.is_checkpointing(model)
    assert plain.keys() == checkpointed.keys() and any("language_model" in n for n in plain)
    for n in plain:
        torch.testing.assert_close(checkpointed[n], plain[n], atol=1e-5, rtol=0, msg=n)


def test_gradient_checkpointing_on_a_plain_module_names_it():
    with pytest.raises(UserError, match="Sequential has no gradient_checkpointing_enable"):
        devices.enable_gradient_checkpointing(nn.Sequential(nn.Linear(2, 2)))


def test_master_weights_are_cast_to_fp32_frozen_ones_kept():
    model = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2)).to(torch.bfloat16)
    model[1].requires_grad_(False)
    weight = model[0].weight
    assert devices.keep_fp32_master_weights(model) == 2
    assert model[0].weight is weight and weight.dtype == torch.float32  # the same Parameter object
    assert model[1].weight.dtype == torch.bfloat16


# ---------------------------------------------------------------- every trainer takes the keys


def test_every_trainer_config_takes_the_keys():
    from mm.train.pretrain import PretrainConfig
    from rl.trainers.dpo_config import DPOConfig
    from rl.trainers.grpo_config import GRPOConfig

    root = Path(__file__).resolve().parents[2] / "configs"
    cases = [
        (PretrainConfig, root / "mm" / "pretrain_tiny.yaml"),
        (sft.TrainConfig, root / "mm" / "sft_tiny.yaml"),
        (DPOConfig, root / "rl" / "dpo_tiny.yaml"),
        (GRPOConfig, root / "rl" / "grpo_tiny.yaml"),
    ]
    for cls, path in cases:
        cfg = load_config(cls, path, KEYS)
        t = cfg.train
        assert (t.device, t.precision, t.gradient_checkpointing, t.fsdp) == ("cpu", "bf16", True, True), cls
        assert load_config(cls, path, ["train.device=auto"]).train.device == "auto"  # RL's old key and value
        with pytest.raises(ValueError, match="train.precision"):
            load_config(cls, path, ["train.precision=half"])


def test_mm_train_runs_bf16_with_checkpointing_on_cpu(tiny, tmp_path):
    """The real entry point with the new keys: 2 steps, bf16 autocast, checkpointing, finite losses."""
    from mm.cli import main

    *_, path = tiny
    world = path.parent / "notes"
    sets = [
        "train.precision=bf16",
        "train.gradient_checkpointing=true",
        "train.device=cpu",
        "eval.questions=0",
    ]
    threads = torch.get_num_threads()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        code = main(["train", "--config", str(path), "--data", str(world), "--out", str(tmp_path / "o"),
                     "--no-progress", "--set", *sets])  # fmt: skip
    torch.set_num_threads(threads)
    assert code == 0
    assert any(issubclass(w.category, devices.SlowPrecisionWarning) for w in seen)
    recs = common.read_metrics(tmp_path / "o" / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1, 2] and all(torch.isfinite(torch.tensor(r["loss"])) for r in recs)
    saved = load_file(str(tmp_path / "o" / "model" / "model.safetensors"))
    assert all(v.dtype == torch.float32 for v in saved.values())  # master weights stayed float32


def test_pretrain_gradient_checkpointing_is_a_clear_error():
    from mm.train.pretrain import PretrainConfig
    from mm.train.pretrain.model import NoteTextModel

    cfg = load_config(
        PretrainConfig, Path(__file__).resolve().parents[2] / "configs" / "mm" / "pretrain_tiny.yaml"
    )
    model = NoteTextModel(cfg=cfg.model, loss=cfg.loss, vocab_size=64, num_tags=0)
    with pytest.raises(UserError, match="NoteTextModel has no gradient_checkpointing_enable"):
        devices.enable_gradient_checkpointing(model)


# ---------------------------------------------------------------- FSDP2 over 2 gloo processes


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x))


class TinyNet(nn.Module):
    """Two residual blocks (FSDP units through ``_no_split_modules``) and a head (the root unit)."""

    _no_split_modules = ["Block"]

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return self.head(x).squeeze(-1)  # (B,)


class Regression(loop.StepTrainer):
    """Least squares on 32 fixed points, a global batch of 8 per step, this rank's shard of it."""

    def __init__(self, rank: int, world: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(32, 4, generator=g)  # (N, 4)
        self.y = self.x.sum(-1).sin()  # (N,)
        torch.manual_seed(1)
        self.model = TinyNet()
        self.rank, self.world = rank, world

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = common.shard(
            common.batch_indices(32, 8, seed=0, step=step), rank=self.rank, world_size=self.world
        )
        return self.x[idx], self.y[idx]

    def loss(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, dict[str, Any]]:
        x, y = batch
        return ((self.model(x) - y) ** 2).mean(), {}

    def evaluate(self) -> dict[str, Any]:
        with torch.no_grad():
            return {"mse": float(((self.model(self.x) - self.y) ** 2).mean())}


def _regression(out: Path, *, rank: int = 0, world: int = 1, fsdp_on: bool = False, stop_after=None):
    run = RunConfig(steps=4, log_every=1, checkpoint_every=2, keep_last=5, device="cpu", fsdp=fsdp_on)
    trainer = Regression(rank, world)
    opt, sched = build_optimizer(param_groups(trainer.model, 0.01), OptimConfig(lr=0.05, warmup_steps=1), 4)
    result = loop.run(
        trainer, optimizer=opt, scheduler=sched, run=run, out=out, config={"train": {"fsdp": fsdp_on}},
        desc="fsdp", plot_keys=["loss"], eval_every=2, show_progress=False, stop_after=stop_after,
        grad_clip=0.5,
    )  # fmt: skip
    return trainer, result


def _fsdp_worker(rank: int, init: str, tmp: str) -> None:
    from torch.distributed.fsdp import FSDPModule

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        trainer, result = _regression(Path(tmp) / "fsdp", rank=rank, world=2, fsdp_on=True)
        assert fsdp.is_sharded(trainer.model)
        assert isinstance(trainer.model.blocks[0], FSDPModule)  # each block is its own unit
        assert not isinstance(trainer.model, FSDPModule)  # the rest stays whole
        _regression(Path(tmp) / "resumed", rank=rank, world=2, fsdp_on=True, stop_after=2)
        _, resumed = _regression(Path(tmp) / "resumed", rank=rank, world=2, fsdp_on=True)
        if rank == 0:
            torch.save(
                {
                    "final": result.model.state_dict(),
                    "metrics": result.metrics,
                    "resumed": resumed.model.state_dict(),
                },
                Path(tmp) / "result.pt",
            )
        else:
            assert result.model is None and result.metrics == {}
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp_two_gloo_processes_equal_one(tmp_path):
    mp.spawn(_fsdp_worker, args=(f"file://{tmp_path / 'rendezvous'}", str(tmp_path)), nprocs=2, join=True)
    got = torch.load(tmp_path / "result.pt")
    _, ref = _regression(tmp_path / "ref")
    want = ref.model.state_dict()
    for k in want:
        torch.testing.assert_close(got["final"][k], want[k], atol=1e-5, rtol=0, msg=k)
        torch.testing.assert_close(got["resumed"][k], want[k], atol=1e-5, rtol=0, msg=k)
    assert got["metrics"]["mse"] == pytest.approx(ref.metrics["mse"], abs=1e-5)
    for step in (2, 4):  # the checkpoints hold the whole weights, as a one-process run writes them
        a = load_file(str(tmp_path / "fsdp" / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))
        b = load_file(str(tmp_path / "ref" / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))
        assert a.keys() == b.keys() and all((a[k] - b[k]).abs().max() < 1e-5 for k in a)
    recs = common.read_metrics(tmp_path / "fsdp" / "metrics.jsonl")
    ref_recs = common.read_metrics(tmp_path / "ref" / "metrics.jsonl")
    assert [r["loss"] for r in recs] == pytest.approx([r["loss"] for r in ref_recs], abs=1e-5)
    assert recs[-1]["eval/mse"] == pytest.approx(ref_recs[-1]["eval/mse"], abs=1e-5)


def test_fsdp_env_of_accelerate_turns_it_on(monkeypatch):
    monkeypatch.delenv(fsdp.FSDP_ENV, raising=False)
    assert not fsdp.fsdp_requested(False) and fsdp.fsdp_requested(True)
    monkeypatch.setenv(fsdp.FSDP_ENV, "true")
    assert fsdp.fsdp_requested(False)
    assert fsdp.block_classes(TinyNet()) == {"Block"}


def test_fsdp_of_a_model_without_blocks_is_refused():
    model = nn.Sequential(nn.Linear(2, 2))
    opt = torch.optim.AdamW(model.parameters())
    with pytest.raises(UserError, match="Sequential declares no transformer blocks"):
        fsdp.shard_model(model, opt)


@pytest.mark.slow
def test_mm_train_under_accelerate_fsdp_config_equals_one_process(tiny, tmp_path):
    """configs/accelerate/fsdp.yaml launches 2 CPU processes; `mm train` shards the NoteVLM (FSDP2 over
    gloo) and ends where one process ends: checkpoints, final model, losses."""
    import os
    import socket
    import subprocess
    import sys

    from mm.cli import main

    *_, path = tiny
    root = Path(__file__).resolve().parents[2]
    args = ["train", "--config", str(path), "--data", str(path.parent / "notes"), "--no-progress",
            "--set", "train.device=cpu", "eval.questions=0"]  # fmt: skip
    threads = torch.get_num_threads()
    assert main([*args[:1], "--out", str(tmp_path / "ref"), *args[1:]]) == 0
    torch.set_num_threads(threads)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", HF_HOME=str(tmp_path / ".hf"))
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(root / "configs" / "accelerate" / "fsdp.yaml"), "--main_process_port", str(port),
           "-m", "mm", args[0], "--out", str(tmp_path / "fsdp"), *args[1:]]  # fmt: skip
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for step in (1, 2):
        a = load_file(str(tmp_path / "fsdp" / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))
        b = load_file(str(tmp_path / "ref" / "checkpoints" / f"step-{step:08d}" / "model.safetensors"))
        assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5, step
    a = load_file(str(tmp_path / "fsdp" / "model" / "model.safetensors"))
    b = load_file(str(tmp_path / "ref" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and max((a[k] - b[k]).abs().max().item() for k in a) < 1e-5
    recs = common.read_metrics(tmp_path / "fsdp" / "metrics.jsonl")
    ref = common.read_metrics(tmp_path / "ref" / "metrics.jsonl")
    assert [r["loss"] for r in recs] == pytest.approx([r["loss"] for r in ref], abs=1e-5)
    assert recs[-1]["eval/caption_loss"] == pytest.approx(ref[-1]["eval/caption_loss"], abs=1e-4)


def test_resuming_an_fsdp_checkpoint_without_fsdp_is_refused(tmp_path):
    by_name = {"state": {}, "param_groups": [{"params": ["blocks.0.lin.weight"], "lr": 0.1}]}
    by_index = {"state": {}, "param_groups": [{"params": [0, 1], "lr": 0.1}]}
    with pytest.raises(UserError, match="was written FSDP but this run trains without FSDP"):
        loop.check_optimizer_layout(by_name, sharded=False, where=tmp_path)
    with pytest.raises(UserError, match="was written without FSDP but this run trains under FSDP"):
        loop.check_optimizer_layout(by_index, sharded=True, where=tmp_path)
    loop.check_optimizer_layout(by_name, sharded=True, where=tmp_path)
    loop.check_optimizer_layout(by_index, sharded=False, where=tmp_path)


@pytest.mark.parametrize("command", ["dpo", "grpo"])
def test_rl_trainers_run_bf16_with_checkpointing(tmp_path, command):
    """`rl dpo` / `rl grpo` with the skeleton's keys: one step, finite loss, float32 weights saved."""
    from rl.cli import main as rl_main
    from tests.helpers.eval_model import make_data_dir, make_model_dir

    model, data = make_model_dir(tmp_path), make_data_dir(tmp_path, split="train")
    root = Path(__file__).resolve().parents[2] / "configs" / "rl"
    sets = [f"init.model={model}", "train.steps=1", "train.precision=bf16", "train.device=cpu",
            "train.gradient_checkpointing=true"]  # fmt: skip
    if command == "dpo":
        sets += ["data.batch_size=2"]
    else:
        sets += ["data.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4"]
        sets += ["algo.beta=0.04"]  # a reference copy: its log-probs under autocast too
    out = tmp_path / "out"
    args = [command, "--config", str(root / f"{command}_tiny.yaml"), "--out", str(out), "--data", str(data),
            "--no-progress"]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert rl_main(args + [x for s in sets for x in ("--set", s)]) == 0
    recs = common.read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in recs] == [1] and torch.isfinite(torch.tensor(recs[0]["loss"]))
    saved = load_file(str(out / "model" / "model.safetensors"))
    assert all(v.dtype == torch.float32 for v in saved.values())

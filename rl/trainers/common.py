"""Shared pieces of the RL trainers: config sections, policy + reference set-up, token log-probs of a
batch, the optimizer and the final save. The loop is :mod:`mm.train.loop`'s (each trainer is a
:class:`mm.train.loop.StepTrainer`).

Reference model: under LoRA the reference is the *same* model with its adapters
disabled (``PeftModel.disable_adapter()``: LoRA off and the fully trained fusion swapped back to its
SFT copy), so it costs no memory; with full fine-tuning it is a frozen deep copy; with a KL weight of
0 there is none (:class:`Reference` with ``kind="none"``).

Batches are dicts with ``input_ids``/``attention_mask``/``response_mask`` ``(B, T)`` and, for NoteVLM,
``pixel_values`` ``(B, N, 3, S, S)`` + ``image_mask`` ``(B, N)``. Without ``pixel_values`` the same code
drives a plain text causal LM (``Qwen2ForCausalLM``), which is how the benchmarks compare with TRL.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mm.errors import UserError
from mm.model import NoteProcessor, NoteVLMForConditionalGeneration
from mm.model.peft_presets import LoraPreset, apply_lora
from mm.train import loop
from mm.train.config import OptimConfig as SharedOptimConfig
from mm.train.config import RunConfig as SharedRunConfig
from mm.train.config import build_optimizer, param_groups
from mm.train.devices import resolve_device
from mm.train.devices import to_device as to_device  # re-exported: the RL trainers move batches with it
from mm.train.sft import save_final as sft_save_final
from rl.kl import entropy_from_logits
from rl.logprobs import token_logprobs

MODEL_KEYS = ("pixel_values", "image_mask")
"""Optional image inputs passed through to the model when present in a batch."""


@dataclass(kw_only=True)
class InitConfig:
    """Where the policy starts."""

    model: str = "runs/sft/model"
    """SFT checkpoint: a save_pretrained NoteVLM folder with its processor (``mm train`` OUT/model)."""


@dataclass(kw_only=True)
class LoraConfig:
    """LoRA on the LM's linear layers (mm.model.peft_presets); the fusion trains fully."""

    enabled: bool = False
    """Train LoRA adapters (reference = adapters disabled) instead of all LM + fusion weights."""
    r: int = 8
    """LoRA rank."""
    alpha: int = 16
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA input."""


@dataclass(kw_only=True)
class OptimConfig(SharedOptimConfig):
    """:class:`mm.train.config.OptimConfig` (AdamW, warm-up + cosine) with post-training's defaults."""

    lr: float = 1e-5
    """Peak learning rate."""
    warmup_steps: int = 0
    """Linear warm-up steps (0 = start at the peak rate)."""
    min_lr_ratio: float = 1.0
    """Final learning rate as a fraction of lr (1.0 = constant after warm-up)."""


@dataclass(kw_only=True)
class RunConfig(SharedRunConfig):
    """:class:`mm.train.config.RunConfig` (steps, seed, cadence, threads, device, precision, gradient
    checkpointing, FSDP) with post-training's defaults."""

    steps: int = 100
    """Optimizer steps."""
    log_every: int = 1
    """Write a metrics record every n steps (and at the last step)."""
    checkpoint_every: int = 50
    """Write a checkpoint every n steps (and at the last step)."""


@dataclass(kw_only=True)
class EvalRunConfig(RunConfig):
    """:class:`RunConfig` plus a held-out evaluation cadence (``rl rm``: pair accuracy; ``rl distill``:
    CHAIR_i and recall)."""

    eval_every: int = 50
    """Evaluate on the held-out data every n steps (and at the last step)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.eval_every < 1:
            raise ValueError(f"train.eval_every must be >= 1, got {self.eval_every}")


# ---------------------------------------------------------------- policy and reference


def start_run(
    train: RunConfig, out_dir: str | Path, *, global_batch: int | None = None
) -> tuple[Path, torch.device]:
    """Join the process group, set torch threads and every RNG from ``train`` (:func:`mm.train.loop.setup`),
    create OUT (rank 0); returns (out, device)."""
    rank, _ = loop.setup(train, global_batch=global_batch)
    out = Path(out_dir)
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
    return out, resolve_device(train.device)  # the device loop.run moves the model and batches to


def load_policy(init: InitConfig, lora: LoraConfig, device: torch.device) -> tuple[Any, Any]:
    """The SFT NoteVLM (LoRA-wrapped when enabled, vision tower frozen) and its processor."""
    d = Path(init.model)
    if not (d / "config.json").is_file() or not (d / "note_processor.json").is_file():
        raise UserError(
            f"init.model={d} is not a saved NoteVLM (config.json + note_processor.json); pass the "
            "OUT/model folder written by `mm train` (SFT)"
        )
    model = NoteVLMForConditionalGeneration.from_pretrained(str(d))
    processor = NoteProcessor.from_pretrained(d)
    for p in model.vision_tower.parameters():
        p.requires_grad_(False)
    if lora.enabled:
        model = apply_lora(model, LoraPreset(r=lora.r, alpha=lora.alpha, dropout=lora.dropout))
    return model.to(device), processor


class Reference:
    """The reference policy pi_ref: ``"adapter"`` (LoRA off), ``"copy"`` (frozen copy) or ``"none"``."""

    def __init__(self, *, model: Any, needed: bool) -> None:
        self.policy = model
        self.copy = None
        if not needed:
            self.kind = "none"
        elif hasattr(model, "disable_adapter") and hasattr(model, "peft_config"):
            self.kind = "adapter"
        else:
            self.kind = "copy"
            self.copy = copy.deepcopy(model).eval()
            for p in self.copy.parameters():
                p.requires_grad_(False)

    @contextlib.contextmanager
    def model(self) -> Iterator[Any]:
        """The reference module to run under ``torch.no_grad()``."""
        if self.kind == "none":
            raise RuntimeError("no reference model (KL weight 0): do not ask for reference log-probs")
        if self.kind == "copy":
            yield self.copy
            return
        with self.policy.disable_adapter():
            yield self.policy

    def token_logps(self, batch: dict[str, torch.Tensor], *, temperature: float = 1.0) -> torch.Tensor:
        """Reference log-probs of the batch's response tokens (see :func:`batch_token_logps`)."""
        with torch.no_grad(), self.model() as ref:
            return batch_token_logps(ref, batch, temperature=temperature)[0]


def response_window(response_mask: torch.Tensor) -> int:
    """First column holding a response token in any row (the logits before it are never needed)."""
    cols = response_mask.any(dim=0).nonzero()
    if len(cols) == 0:
        raise ValueError("response_mask is all 0: the batch has no response token to score")
    start = int(cols[0])
    if start < 1:
        raise ValueError("a response cannot start at position 0: every sequence needs a prompt token")
    return start


def batch_token_logps(
    model: Any,
    batch: dict[str, torch.Tensor],
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Log-probs of the response tokens of ``batch`` under ``model`` (one forward, KV cache off).

    Only the logits from the first response column on are computed (``logits_to_keep``), and the
    position ids are ``cumsum(attention_mask) - 1`` exactly as ``generate`` builds them for left-padded
    prompts, so the log-probs equal the ones at sampling time.

    Returns ``(logps, mask, entropy)``, each ``(B, W)`` where ``W = T - start``: ``logps[:, w]`` scores
    ``input_ids[:, start + w]``; ``logps`` is 0 where ``mask`` is 0; ``entropy`` (nats, detached) of the
    predictive distribution at each scored position when ``with_entropy`` else None.
    """
    ids, attn, resp = batch["input_ids"], batch["attention_mask"], batch["response_mask"]  # (B, T)
    start = response_window(resp)
    keep = ids.shape[1] - start + 1
    position_ids = (attn.long().cumsum(-1) - 1).clamp(min=0)  # (B, T)
    extra = {k: batch[k] for k in MODEL_KEYS if k in batch}
    out = model(
        input_ids=ids,
        attention_mask=attn,
        position_ids=position_ids,
        logits_to_keep=keep,
        use_cache=False,
        **extra,
    )
    logits = out.logits[:, -keep:-1]  # (B, W, V): position start-1+w predicts ids[:, start+w]
    targets = ids[:, start:]  # (B, W)
    mask = resp[:, start:]  # (B, W)
    logps = token_logprobs(logits, targets, temperature=temperature).masked_fill(mask == 0, 0.0)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach() / temperature)  # (B, W)
    return logps, mask, entropy


# ---------------------------------------------------------------- optimizer, resume, save


def make_optimizer(model: Any, cfg: OptimConfig, steps: int) -> tuple[Any, Any]:
    """AdamW over trainable parameters (decay on matrices only) and its LambdaLR schedule."""
    return build_optimizer(param_groups(model, cfg.weight_decay), cfg, steps)


def save_final(model: Any, processor: Any, out: Path, *, lora: bool) -> Path:
    """``out/model`` as save_pretrained + processor (LoRA: adapter in ``out/adapter``, then merged).

    Merging changes the in-memory model, so call it last.
    """
    return sft_save_final(model, processor, out, lora=lora)


def note_pixels(images_u8: torch.Tensor, processor: Any) -> torch.Tensor:
    """uint8 note images ``(n, 3, S, S)`` -> the processor's normalised float pixels ``(n, 3, S, S)``."""
    mean = torch.tensor(processor.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(processor.image_std).view(1, 3, 1, 1)
    return (images_u8.float().div(255.0) - mean) / std


def trained_adapter(adapter: Any, model: torch.nn.Module | None) -> Any:
    """The adapter over the weights to save after :func:`mm.train.loop.run`: ``adapter`` itself, or under
    FSDP (whose live weights are shards) the whole weights the loop gathered on rank 0 (``LoopResult.model``,
    a plain copy) with ``adapter``'s processor."""
    if model is None or model is adapter.model:
        return adapter
    from mm.model.adapter import load_adapter

    return load_adapter(model, adapter.processor)

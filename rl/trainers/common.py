"""Shared pieces of the RL trainers: config sections, policy + reference set-up, token log-probs of a
batch, optimizer/schedule, resume checks and the final save.

Reference model (issue 6 sec. 3): under LoRA the reference is the *same* model with its adapters
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
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mm.errors import UserError
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
class OptimConfig:
    """AdamW with linear warm-up and cosine decay to ``min_lr_ratio * lr``."""

    lr: float = 1e-5
    """Peak learning rate."""
    weight_decay: float = 0.0
    """Decoupled weight decay on matrices."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    warmup_steps: int = 0
    """Linear warm-up steps."""
    min_lr_ratio: float = 1.0
    """Final learning rate as a fraction of lr (1.0 = constant after warm-up)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables (the norm is still logged)."""

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.grad_clip < 0 or self.warmup_steps < 0:
            raise ValueError(
                f"need optim.lr > 0, grad_clip >= 0, warmup_steps >= 0; got {self.lr}, {self.grad_clip}, "
                f"{self.warmup_steps}"
            )


@dataclass(kw_only=True)
class RunConfig:
    """Length of the run, seed, logging and checkpoint cadence."""

    steps: int = 100
    """Optimizer steps."""
    seed: int = 0
    """Seed of data order and sampling."""
    log_every: int = 1
    """Write a metrics record every n steps."""
    checkpoint_every: int = 50
    """Write a checkpoint every n steps (and at the end)."""
    keep_last: int = 2
    """How many checkpoints to keep."""
    threads: int = 0
    """torch.set_num_threads; 0 leaves the default."""
    device: str = "auto"
    """``auto`` (cuda when available), ``cpu`` or ``cuda``."""

    def __post_init__(self) -> None:
        for name in ("steps", "log_every", "checkpoint_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"train.device must be auto, cpu or cuda, got {self.device!r}")


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available else cpu; ``cuda`` without a GPU is a clear error."""
    if name == "cuda" and not torch.cuda.is_available():
        raise UserError("train.device=cuda but no CUDA device is visible; use train.device=auto or cpu")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


# ---------------------------------------------------------------- policy and reference


def start_run(train: Any, out_dir: str | Path) -> tuple[Path, torch.device]:
    """Create OUT, set torch threads and every RNG from ``train`` (a TrainConfig); returns (out, device)."""
    from mm.train.common import seed_everything

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if train.threads:
        torch.set_num_threads(train.threads)
    seed_everything(train.seed)
    return out, resolve_device(train.device)


def load_policy(init: InitConfig, lora: LoraConfig, device: torch.device) -> tuple[Any, Any]:
    """The SFT NoteVLM (LoRA-wrapped when enabled, vision tower frozen) and its processor."""
    from mm.model import NoteProcessor, NoteVLMForConditionalGeneration
    from mm.model.peft_presets import LoraPreset, apply_lora

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
    from mm.train.sft import lr_lambda, param_groups

    groups = param_groups(model, cfg.weight_decay)
    if not any(g["params"] for g in groups):
        raise UserError("nothing to train: every parameter is frozen")
    opt = torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg, steps))


def clip_and_norm(model: Any, max_norm: float) -> float:
    """Clip the global gradient norm (when ``max_norm`` > 0) and return the norm before clipping."""
    params = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
    if not params:
        return 0.0
    limit = max_norm if max_norm > 0 else float("inf")
    return float(torch.nn.utils.clip_grad_norm_(params, limit))


def check_resume_config(saved: dict[str, Any], now: dict[str, Any], where: Path) -> None:
    """Refuse to resume from a checkpoint written with another config (only train.steps may differ)."""

    def norm(d: dict[str, Any]) -> Any:
        d = json.loads(json.dumps(d))
        d.get("train", {}).pop("steps", None)
        return d

    if norm(saved) != norm(now):
        diff = sorted(k for k in set(norm(saved)) | set(norm(now)) if norm(saved).get(k) != norm(now).get(k))
        raise UserError(
            f"{where} was written with a different config (sections {diff} differ); use the same config "
            "to resume, choose a new --out folder, or pass --no-resume"
        )


def save_final(model: Any, processor: Any, out: Path, *, lora: bool) -> Path:
    """``out/model`` as save_pretrained + processor (LoRA: adapter in ``out/adapter``, then merged).

    Merging changes the in-memory model, so call it last.
    """
    from mm.train.sft import save_final as sft_save_final

    return sft_save_final(model, processor, out, lora=lora)


def note_pixels(images_u8: torch.Tensor, processor: Any) -> torch.Tensor:
    """uint8 note images ``(n, 3, S, S)`` -> the processor's normalised float pixels ``(n, 3, S, S)``."""
    mean = torch.tensor(processor.image_mean).view(1, 3, 1, 1)
    std = torch.tensor(processor.image_std).view(1, 3, 1, 1)
    return (images_u8.float().div(255.0) - mean) / std


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """Every tensor of ``batch`` moved to ``device``."""
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


# ---------------------------------------------------------------- the loop


@dataclass(kw_only=True)
class LoopResult:
    """What :func:`train_loop` reports."""

    step: int
    """Last optimizer step done."""
    seconds: float
    """Wall time of the loop."""
    step_seconds: float
    """Mean seconds per step of this process."""
    last: dict[str, Any]
    """The last metrics record."""


def train_loop(
    *,
    out: Path,
    config: dict[str, Any],
    model: Any,
    optimizer: Any,
    scheduler: Any,
    run: RunConfig,
    step_fn: Any,
    desc: str,
    state: dict[str, Any],
    plot_keys: list[str],
    monitor: Any = None,
    resume: bool = True,
    show_progress: bool = True,
    stop_after: int | None = None,
) -> LoopResult:
    """Run ``step_fn(step) -> metrics`` for ``run.steps`` steps with resume, JSONL, tqdm and checkpoints.

    ``state`` is mutable trainer state saved in every checkpoint (``extra``) and restored on resume
    (e.g. BCO's running mean). ``monitor(history, record) -> list[str]`` returns failure-pattern
    warnings; each kind is raised once as :class:`RLTrainingWarning` and every step's list is logged.
    ``stop_after`` ends after that many steps without plots (simulates a kill, for tests).
    """
    import time
    import warnings

    from mm.train import common as C

    ckpt_dir = out / "checkpoints"
    start = 0
    last_ckpt = C.find_last_checkpoint(ckpt_dir) if resume else None
    if last_ckpt is not None:
        info = C.load_checkpoint(last_ckpt, model=model, optimizer=optimizer, scheduler=scheduler)
        check_resume_config(info["config"], config, last_ckpt)
        state.update(info["extra"])
        start = info["step"]
    logger = C.MetricsLogger(out / "metrics.jsonl", resume_step=start if start else None)
    history = C.read_metrics(out / "metrics.jsonl")
    bar = C.progress(run.steps, initial=start, desc=desc, enabled=show_progress)
    warned: set[str] = set()
    t0 = time.perf_counter()
    record: dict[str, Any] = history[-1] if history else {}
    done = start
    for step in range(start, run.steps):
        ts = time.perf_counter()
        metrics = step_fn(step)
        done = step + 1
        record = {
            "step": done,
            **metrics,
            "lr": scheduler.get_last_lr()[0],
            "step_s": time.perf_counter() - ts,
        }
        alerts = monitor(history, record) if monitor is not None else []
        for text in alerts:
            kind = text.split(":", 1)[0]
            if kind not in warned:
                warned.add(kind)
                warnings.warn(text, RLTrainingWarning, stacklevel=2)
        if alerts:
            record["warnings"] = alerts
        history.append(record)
        if done % run.log_every == 0 or done == run.steps:
            logger.log(record)
        bar.update(1)
        bar.set_postfix(loss=f"{record['loss']:.4f}")
        if done % run.checkpoint_every == 0 or done == run.steps:
            C.save_checkpoint(
                ckpt_dir, step=done, model=model, optimizer=optimizer, scheduler=scheduler, config=config,
                extra=dict(state), keep_last=run.keep_last,
            )  # fmt: skip
        if stop_after is not None and done >= stop_after:
            break
    bar.close()
    seconds = time.perf_counter() - t0
    if stop_after is None or done < stop_after:
        C.plot_metrics(C.read_metrics(out / "metrics.jsonl"), plot_keys, out / "curves.png", title=desc)
    return LoopResult(step=done, seconds=seconds, step_seconds=seconds / max(1, done - start), last=record)


class RLTrainingWarning(UserWarning):
    """A known failure pattern showed up in the training metrics (zero-std groups, entropy collapse, ...)."""

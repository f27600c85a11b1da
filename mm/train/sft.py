"""NoteVLM align / SFT: the LLaVA two-stage recipe (Liu et al., 2023, "Visual Instruction Tuning") on notes.

Stage ``align`` trains the fusion module only (vision tower + LM frozen) on captions; stage ``sft`` trains
fusion + LM (full, or LoRA adapters on the LM's linear layers with the fusion trained whole; Hu et al.,
2021) on captions and yes/no questions. Loss: next-token cross-entropy on the answer tokens only.

Deviations from LLaVA: a note has 1-4 images; tiny models from scratch (the LM is random-init unless
``init.model`` names a trained NoteVLM); ``align`` starts the vision tower + fusion from an InfoNCE
checkpoint (:mod:`mm.train.init_from_pretrain`) instead of CLIP; data order is a pure function of
``(seed, step)`` so a resumed run ends with the same weights as an uninterrupted one.

Evaluation on held-out notes: teacher-forced caption loss; greedy captions (batched, KV cache) scored with
CHAIR on the world vocabulary (:mod:`mm.train.caption_eval`); yes/no accuracy when questions are trained.
"""

from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from mm.errors import UserError
from mm.fusion import FusionConfig
from mm.model.configuration import TINY_TEXT_CONFIG
from mm.train import common
from mm.train.tasks import ANSWER_STYLES, CAPTION_PROMPT, IMAGE_CAPTION_PROMPT, TASK_KINDS
from mm.train.token_loss import answer_positions_loss, token_weights, weighted_token_loss
from mm.vision import VisionConfig

STAGES = ("align", "sft")


@dataclass
class ModelConfig:
    """The NoteVLM built when ``init.model`` is not set (vision/fusion come from ``init.pretrain`` if set)."""

    vision: VisionConfig = field(default_factory=VisionConfig)
    """Vision tower (mm.vision.VisionConfig); replaced by the pretraining checkpoint's when init.pretrain."""
    fusion: FusionConfig = field(default_factory=FusionConfig)
    """Fusion kind and budget K (mm.fusion.FusionConfig); replaced by the checkpoint's when init.pretrain."""
    text: dict = field(default_factory=lambda: dict(TINY_TEXT_CONFIG))
    """Causal LM config (transformers fields, model_type qwen2/llama); vocab_size comes from the tokenizer."""
    max_images: int = 4
    """Image slots per note."""
    max_length: int = 256
    """Longest token sequence (images included); longer answers are cut, cut images are an error."""
    tokenizer: str | None = None
    """Tokenizer folder (save_pretrained); None = the project tokenizer (mm.data.tokenizer.load_tokenizer)."""
    image_index_embeddings: bool = False
    """Add a learned per-image index embedding to each image's fusion tokens (NoteVLMConfig field)."""


@dataclass
class InitConfig:
    """What the run starts from (at most one of the two)."""

    pretrain: str | None = None
    """`mm pretrain` run folder or checkpoint: its vision tower + fusion initialise the NoteVLM."""
    model: str | None = None
    """A saved NoteVLM folder (e.g. an align run's OUT/model) to continue from; model.* is then unused."""

    def __post_init__(self) -> None:
        if self.pretrain and self.model:
            raise ValueError(
                "set init.pretrain or init.model, not both (init.model already holds a vision tower)"
            )


@dataclass
class LoraConfig:
    """LoRA on the LM's linear layers (stage sft only); the fusion trains fully."""

    enabled: bool = False
    """Train LoRA adapters instead of the full LM."""
    r: int = 8
    """LoRA rank."""
    alpha: int = 16
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA input."""


@dataclass
class TaskConfig:
    """Which samples are made from each note (mm.train.tasks)."""

    kinds: list[str] = field(default_factory=lambda: ["caption", "question"])
    """Task kinds: caption, image_caption, question, pope_question, conversation."""
    caption_prompt: str = CAPTION_PROMPT
    """Prompt of the captioning task (training and evaluation)."""
    image_caption_prompt: str = IMAGE_CAPTION_PROMPT
    """Prompt of the per-image captioning task (kind image_caption)."""
    questions_per_note: int = 6
    """Most yes/no questions per note used for training."""
    question_weight: float = 1.0
    """Loss weight of a yes/no answer's tokens against a caption token's 1 (mm.train.token_loss): a question
    has 1 answer token to a caption's ~40, so in a plain token mean the questions get ~5% of the gradient."""
    pope_questions_per_note: int = 1
    """POPE-style one-image questions per note (kind pope_question: mm.train.tasks.pope_question_samples)."""
    answer_style: str = "word"
    """How yes/no answers are written (mm.train.tasks.yes_no_answer): "word" ("yes") or "object" ("A fork:
    yes", the object first: the tiny 3-layer LM learns to answer that way, README)."""

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in TASK_KINDS]
        if bad or not self.kinds:
            raise ValueError(f"tasks.kinds must be a non-empty subset of {TASK_KINDS}, got {self.kinds}")
        if not (self.question_weight > 0 and math.isfinite(self.question_weight)):
            raise ValueError(f"tasks.question_weight must be a finite number > 0, got {self.question_weight}")
        if self.pope_questions_per_note < 0:
            n = self.pope_questions_per_note
            raise ValueError(f"tasks.pope_questions_per_note must be >= 0, got {n}")
        if self.answer_style not in ANSWER_STYLES:
            raise ValueError(f"tasks.answer_style must be one of {ANSWER_STYLES}, got {self.answer_style!r}")


@dataclass
class OptimConfig:
    """AdamW with linear warm-up and cosine decay to ``min_lr_ratio * lr``."""

    lr: float = 1e-3
    """Peak learning rate."""
    weight_decay: float = 0.0
    """Decoupled weight decay on matrices (not on biases / norms / embeddings of rank < 2)."""
    betas: tuple[float, float] = (0.9, 0.95)
    """AdamW betas."""
    warmup_steps: int = 20
    """Linear warm-up steps."""
    min_lr_ratio: float = 0.1
    """Final learning rate as a fraction of lr."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables."""


@dataclass
class RunConfig:
    """Stage, length of the run, logging, evaluation and checkpoint cadence."""

    stage: str = "sft"
    """align (fusion only) or sft (fusion + LM, or LoRA)."""
    steps: int = 300
    """Optimizer steps."""
    batch_size: int = 32
    """Global batch size (samples); split evenly across DDP ranks."""
    seed: int = 0
    """Seed of the model init and the data order."""
    log_every: int = 10
    """Write a metrics record every n steps."""
    eval_every: int = 100
    """Evaluate on held-out notes every n steps (and at the end)."""
    checkpoint_every: int = 100
    """Write a checkpoint every n steps (and at the end)."""
    keep_last: int = 2
    """How many checkpoints to keep."""
    threads: int = 0
    """torch.set_num_threads; 0 leaves the default."""
    gradient_checkpointing: bool = False
    """Activation checkpointing of the LM blocks."""
    train_vision: bool = False
    """Stage sft, full parameters: also train the vision tower (LLaVA keeps it frozen; a tiny tower from
    a short InfoNCE run sees small objects better when tuned on captions)."""
    group_by_length: bool = False
    """Batches of samples of similar length (transformers' ``group_by_length``;
    :class:`mm.train.common.LengthGroupedBatches`): a caption, a note question and a one-image question
    differ ~3x in length, and a random batch pads all to the longest. The loss is then divided by the
    training set's mean (weighted) answer tokens per batch rather than the batch's own count, so a batch of
    short answers weighs what it would inside a random batch: the same objective in expectation."""

    def __post_init__(self) -> None:
        if self.stage not in STAGES:
            raise ValueError(f"train.stage must be one of {STAGES}, got {self.stage!r}")
        for name in ("steps", "batch_size", "log_every", "eval_every", "checkpoint_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class DataConfig:
    """Notes to train and evaluate on; the world is generated into ``folder`` when it is missing."""

    folder: str = "runs/data/world_pretrain"
    """Note folder (notes.jsonl + images)."""
    generate_notes: int = 20000
    """Notes to generate when the folder is missing."""
    generate_seed: int = 0
    """World seed used when generating."""
    train_split: str = "train"
    """Split to train on."""
    train_notes: int = 0
    """Use the first n training notes; 0 = all."""
    eval_split: str = "test"
    """Held-out split."""


@dataclass
class EvalConfig:
    """Held-out evaluation."""

    notes: int = 200
    """Held-out notes (first n of data.eval_split) for caption loss and generated captions."""
    questions: int = 200
    """Held-out yes/no questions answered (0 = skip)."""
    batch_size: int = 64
    """Generation batch size."""
    max_new_tokens: int = 96
    """Longest generated caption."""


@dataclass
class TrainConfig:
    """Everything `mm train` needs."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The NoteVLM (when not loaded from init.model)."""
    init: InitConfig = field(default_factory=InitConfig)
    """Starting weights."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA (sft only)."""
    tasks: TaskConfig = field(default_factory=TaskConfig)
    """Training samples."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    train: RunConfig = field(default_factory=RunConfig)
    """Stage, steps, batch, cadence."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training and held-out notes."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Held-out evaluation."""

    def __post_init__(self) -> None:
        if self.lora.enabled and self.train.stage != "sft":
            raise ValueError("lora.enabled needs train.stage: sft (align trains the fusion only)")
        if self.train.train_vision and (self.train.stage != "sft" or self.lora.enabled):
            raise ValueError(
                "train.train_vision needs train.stage: sft with lora.enabled: false "
                "(align trains the fusion only; the LoRA preset keeps the vision tower frozen)"
            )


# ---------------------------------------------------------------- model


def load_tokenizer(path: str | None) -> Any:
    """The tokenizer at ``path`` (a save_pretrained folder) or the project tokenizer."""
    if path is not None:
        from transformers import PreTrainedTokenizerFast

        if not Path(path).is_dir():
            raise UserError(
                f"model.tokenizer={path!r} is not a folder; give a save_pretrained tokenizer folder"
            )
        return PreTrainedTokenizerFast.from_pretrained(path)
    try:
        from mm.data.tokenizer import load_tokenizer as project_tokenizer
    except ImportError as e:
        raise UserError(f"the project tokenizer is unavailable ({e}); set model.tokenizer to a folder") from e
    return project_tokenizer()


def build_model_and_processor(cfg: TrainConfig) -> tuple[Any, Any, dict[str, Any]]:
    """The NoteVLM, its NoteProcessor and a note of where the weights came from (seed set by the caller)."""
    from mm.config import to_dict
    from mm.model import NoteProcessor, NoteVLMConfig, NoteVLMForConditionalGeneration
    from mm.train import init_from_pretrain

    if cfg.init.model:
        d = Path(cfg.init.model)
        if not (d / "config.json").is_file():
            raise UserError(
                f"init.model={d} has no config.json; pass a folder written by `mm train` (OUT/model)"
            )
        model = NoteVLMForConditionalGeneration.from_pretrained(str(d))
        return model, NoteProcessor.from_pretrained(d), {"init": "model", "from": str(d)}
    tok = load_tokenizer(cfg.model.tokenizer)
    vision, fusion = to_dict(cfg.model.vision), cfg.model.fusion
    parts = {
        "vision_config": vision,
        "fusion_kind": fusion.kind,
        "fusion_budget": fusion.budget,
        "fusion_kwargs": fusion.kind_kwargs(),
    }
    origin: dict[str, Any] = {"init": "random"}
    if cfg.init.pretrain:
        pre = init_from_pretrain.pretrain_parts(cfg.init.pretrain)
        parts = {k: pre[k] for k in parts}
        hidden = int(cfg.model.text.get("hidden_size", 0))
        if hidden != pre["d_model"]:
            raise UserError(
                f"model.text.hidden_size={hidden} but the pretrained fusion outputs {pre['d_model']}; "
                f"set model.text.hidden_size={pre['d_model']}"
            )
    text = {**cfg.model.text, "vocab_size": len(tok)}
    config = NoteVLMConfig(
        **parts,
        text_config=text,
        image_token_id=tok.convert_tokens_to_ids("<image>"),
        max_images=cfg.model.max_images,
        image_index_embeddings=cfg.model.image_index_embeddings,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    model = NoteVLMForConditionalGeneration(config)
    if cfg.init.pretrain:
        loaded = init_from_pretrain.load_pretrained_parts(model, cfg.init.pretrain)
        origin = {"init": "pretrain", "from": str(pre["checkpoint"]), "tensors": loaded}
    image_size = config.vision_config.get("image_size") or VisionConfig().image_size
    processor = NoteProcessor(
        tokenizer=tok,
        image_size=int(image_size),
        tokens_per_image=config.fusion_budget,
        max_length=cfg.model.max_length,
        max_images=cfg.model.max_images,
    )
    return model, processor, origin


def prepare_trainable(model: Any, cfg: TrainConfig) -> tuple[Any, dict[str, int]]:
    """Freeze for the stage (or wrap with LoRA); returns the model to train and trainable counts."""
    from mm.model.peft_presets import (
        LoraPreset,
        apply_lora,
        enable_checkpointing,
        freeze_for_stage,
        trainable_counts,
    )

    if cfg.lora.enabled:
        preset = LoraPreset(r=cfg.lora.r, alpha=cfg.lora.alpha, dropout=cfg.lora.dropout)
        model = apply_lora(model, preset, gradient_checkpointing=cfg.train.gradient_checkpointing)
        return model, trainable_counts(model)
    counts = freeze_for_stage(model, cfg.train.stage)
    if cfg.train.train_vision:
        for p in model.vision_tower.parameters():
            p.requires_grad_(True)
        counts = trainable_counts(model)
    if cfg.train.gradient_checkpointing:
        enable_checkpointing(model)
    return model, counts


def param_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Trainable parameters: decay on matrices, none on vectors (biases, norms)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def lr_lambda(cfg: OptimConfig, steps: int):
    """Linear warm-up then cosine decay to min_lr_ratio (a multiplier of lr, for LambdaLR)."""

    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, steps - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    return f


# ---------------------------------------------------------------- evaluation


@dataclass
class EvalData:
    """Held-out notes: images, caption samples, object sets, yes/no questions."""

    images: list[torch.Tensor]
    """Per note uint8 (n, 3, S, S)."""
    captions: Any
    """SampleSet of the caption samples (teacher-forced loss)."""
    objects: list[set[str]]
    """Present categories per note."""
    questions: list[tuple[int, str, str]]
    """(note index, question, answer)."""


@torch.no_grad()
def evaluate(model: Any, processor: Any, data: EvalData, cfg: TrainConfig) -> dict[str, float]:
    """Caption loss, CHAIR / recall / precision of greedy captions, yes/no accuracy on held-out notes."""
    from mm.eval.generate import answer_questions, generate_captions
    from mm.eval.pope import parse_vlmevalkit
    from mm.train.caption_eval import caption_object_metrics
    from mm.train.sft_data import to_unit

    was = model.training
    model.eval()
    total = count = 0.0
    n = len(data.captions)
    for start in range(0, n, cfg.eval.batch_size):
        b = data.captions.batch(range(start, min(n, start + cfg.eval.batch_size)))
        out = model(**b)
        tokens = int((b["labels"][:, 1:] != -100).sum())
        total += float(out.loss) * tokens
        count += tokens
    items = [to_unit(im) for im in data.images]
    caps = generate_captions(
        model, processor, items, cfg.tasks.caption_prompt, cfg.eval.batch_size, cfg.eval.max_new_tokens
    )
    metrics: dict[str, Any] = {"caption_loss": total / max(count, 1.0)}
    m = caption_object_metrics(caps, data.objects)
    metrics.update({k: v for k, v in m.items() if isinstance(v, (int, float))})
    if data.questions and "question" in cfg.tasks.kinds:
        qs = data.questions
        answers = answer_questions(
            model, processor, [items[i] for i, _, _ in qs], [q for _, q, _ in qs], cfg.eval.batch_size, 8
        )
        ok = [parse_vlmevalkit(a) == gold for a, (_, _, gold) in zip(answers, qs)]  # "no" or "A fork: no"
        metrics["yesno_acc"] = sum(ok) / len(ok)
    model.train(was)
    metrics["_captions"] = caps[:5]
    return metrics


def load_eval_data(notes: list[Any], root: Path, processor: Any, cfg: TrainConfig) -> EvalData:
    """Held-out notes of the eval split (first ``eval.notes``) in memory."""
    from mm.train.sft_data import SampleSet, load_note_images
    from mm.train.tasks import build_samples

    notes = notes[: cfg.eval.notes]
    if not notes:
        raise UserError(
            f"no notes in split {cfg.data.eval_split!r}; generate more notes or change data.eval_split"
        )
    images = load_note_images(notes, root, processor.image_size)
    caps = SampleSet(
        processor=processor,
        images=images,
        samples=build_samples(notes, kinds=("caption",), caption_prompt=cfg.tasks.caption_prompt),
    )
    questions = [(i, q.question, q.answer) for i, n in enumerate(notes) for q in n.questions]
    return EvalData(
        images=images,
        captions=caps,
        objects=[n.categories for n in notes],
        questions=questions[: cfg.eval.questions],
    )


# ---------------------------------------------------------------- training


@dataclass
class TrainResult:
    """What a finished run reports."""

    step: int
    """Last optimizer step."""
    metrics: dict[str, Any]
    """Final held-out metrics."""
    seconds: float
    """Wall time of this process's training loop (evaluation included)."""
    trainable: dict[str, int]
    """Trainable parameters per part."""
    step_seconds: float
    """Mean seconds per optimizer step (evaluation excluded)."""


def train(
    cfg: TrainConfig,
    *,
    out_dir: str | Path,
    train_notes: list[Any],
    eval_notes: list[Any],
    root: str | Path,
    resume: bool = True,
    show_progress: bool = True,
    stop_after: int | None = None,
) -> TrainResult:
    """Train (resuming from ``out_dir/checkpoints``); writes metrics, plots, checkpoints and ``out/model``.

    ``train_notes`` / ``eval_notes`` are notes of the folder ``root`` (image paths relative to it).
    ``stop_after`` ends after that many steps without the final evaluation or save (simulates a kill).
    """
    from mm.config import to_dict
    from mm.train.sft_data import SampleSet, load_note_images
    from mm.train.tasks import build_samples

    out = Path(out_dir)
    rank, world = common.init_distributed()
    main = rank == 0
    if cfg.train.batch_size % world:
        raise UserError(f"train.batch_size={cfg.train.batch_size} must be divisible by {world} processes")
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    common.seed_everything(cfg.train.seed)
    model, processor, origin = build_model_and_processor(cfg)
    model, trainable = prepare_trainable(model, cfg)
    samples = build_samples(
        train_notes, kinds=cfg.tasks.kinds, caption_prompt=cfg.tasks.caption_prompt,
        questions_per_note=cfg.tasks.questions_per_note, image_caption_prompt=cfg.tasks.image_caption_prompt,
        answer_style=cfg.tasks.answer_style, pope_questions_per_note=cfg.tasks.pope_questions_per_note,
        seed=cfg.train.seed,
    )  # fmt: skip
    images = load_note_images(train_notes, root, processor.image_size)
    train_data = SampleSet(processor=processor, images=images, samples=samples)
    eval_data = load_eval_data(eval_notes, Path(root), processor, cfg)
    if trainable["total"] == 0:
        raise UserError("nothing to train: every parameter is frozen")
    opt = torch.optim.AdamW(
        param_groups(model, cfg.optim.weight_decay), lr=cfg.optim.lr, betas=tuple(cfg.optim.betas)
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg.optim, cfg.train.steps))
    start = 0
    ckpt_dir = out / "checkpoints"
    last = common.find_last_checkpoint(ckpt_dir) if resume else None
    if last is not None:
        info = common.load_checkpoint(last, model=model, optimizer=opt, scheduler=sched)
        _check_resume_config(info["config"], to_dict(cfg), last)
        start = info["step"]
    ddp = nn.parallel.DistributedDataParallel(model) if world > 1 else model
    logger = common.MetricsLogger(out / "metrics.jsonl", resume_step=start if start else None, enabled=main)
    stage = cfg.train.stage + ("-lora" if cfg.lora.enabled else "")
    bar = common.progress(cfg.train.steps, initial=start, desc=stage, enabled=main and show_progress)
    metrics: dict[str, Any] = {}
    t0 = time.perf_counter()
    step_time = 0.0
    done = start
    model.train()
    grouped = None
    if cfg.train.group_by_length:
        lengths = [len(ids) for ids in train_data.input_ids]
        grouped = common.LengthGroupedBatches(lengths, cfg.train.batch_size, seed=cfg.train.seed)
        fixed_divisor = torch.tensor(mean_answer_tokens(train_data, cfg.tasks) * cfg.train.batch_size / world)
    for step in range(start, cfg.train.steps):
        ts = time.perf_counter()
        if grouped is None:
            idx = common.batch_indices(len(train_data), cfg.train.batch_size, seed=cfg.train.seed, step=step)
        else:
            idx = grouped.indices(step)
        shard = common.shard(idx, rank=rank, world_size=world)
        batch = train_data.batch(shard)
        weights = None if cfg.tasks.question_weight == 1.0 else sample_weights(train_data, shard, cfg.tasks)
        divisor = answer_token_divisor(batch["labels"], world, weights) if grouped is None else fixed_divisor
        if world > 1:  # DDP must run the forward itself: logits at every position
            labels = batch.pop("labels")
            loss = weighted_token_loss(ddp(**batch).logits, labels, weights, divisor)
        else:  # one process: the LM head only on answer positions (same loss, ~35% less step time)
            loss = answer_loss(model, batch, weights, divisor)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        params = [p for p in model.parameters() if p.requires_grad]
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(params, cfg.optim.grad_clip)
            if cfg.optim.grad_clip > 0
            else torch.tensor(float("nan"))
        )
        opt.step()
        sched.step()
        step_time += time.perf_counter() - ts
        done = step + 1
        bar.update(1)
        record: dict[str, Any] = {}
        if done % cfg.train.log_every == 0 or done == cfg.train.steps:
            record = {
                "step": done,
                "loss": common.all_reduce_sum(loss).item() / world,  # the global batch's token mean
                "lr": sched.get_last_lr()[0],
                "grad_norm": float(grad_norm),
                "time_s": round(time.perf_counter() - t0, 3),
            }
            bar.set_postfix(loss=f"{record['loss']:.3f}")
        if done % cfg.train.eval_every == 0 or done == cfg.train.steps:
            if main and (stop_after is None or done < stop_after):
                metrics = evaluate(common.unwrap(model), processor, eval_data, cfg)
                scalars = {f"eval/{k}": v for k, v in metrics.items() if not k.startswith("_")}
                record = {"step": done, **record, **scalars}
                bar.set_postfix(loss=f"{loss.item():.3f}", recall=f"{metrics['recall']:.2f}")
            common.barrier()
        if record:
            logger.log(record)
        if done % cfg.train.checkpoint_every == 0 or done == cfg.train.steps:
            if main:
                common.save_checkpoint(
                    ckpt_dir, step=done, model=model, optimizer=opt, scheduler=sched,
                    config=to_dict(cfg), keep_last=cfg.train.keep_last,
                )  # fmt: skip
            common.barrier()
        if stop_after is not None and done >= stop_after:
            break
    bar.close()
    seconds = time.perf_counter() - t0
    n_steps = max(1, done - start)
    if main and (stop_after is None or done < stop_after):
        if not metrics:  # resumed at the last step: evaluate the loaded weights
            metrics = evaluate(common.unwrap(model), processor, eval_data, cfg)
        save_final(model, processor, out, lora=cfg.lora.enabled)
        write_plots(out)
        metrics["origin"] = origin
        metrics["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return TrainResult(
        step=done, metrics=metrics, seconds=seconds, trainable=trainable, step_seconds=step_time / n_steps
    )


def answer_loss(
    model: Any, batch: dict[str, Any], weights: torch.Tensor | None, divisor: torch.Tensor
) -> torch.Tensor:
    """The SFT loss of ``batch`` (collated, with ``labels``) with logits computed at answer positions only.

    Equals ``model(**batch, num_items_in_batch=divisor).loss`` (or :func:`weighted_token_loss` with
    ``weights``); a PEFT model is unwrapped to its base, whose modules hold the adapters.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    hidden = base.model(**inputs).last_hidden_state  # (B, T, D)
    return answer_positions_loss(hidden, base.lm_head, batch["labels"], weights, divisor)


QUESTION_KINDS = ("question", "pope_question")
"""Sample kinds whose answer tokens get ``tasks.question_weight``."""


def sample_weights(data: Any, indices: Any, tasks: TaskConfig) -> torch.Tensor:
    """(B,) loss weight of each sample of a batch: ``tasks.question_weight`` for yes/no questions, else 1."""
    w = [tasks.question_weight if data.samples[i].kind in QUESTION_KINDS else 1.0 for i in indices]
    return torch.tensor(w, dtype=torch.float32)


def mean_answer_tokens(data: Any, tasks: TaskConfig) -> float:
    """Mean answer tokens of a training sample, each weighted as :func:`sample_weights` weighs it (what a
    random batch's :func:`answer_token_divisor` is, per sample, in expectation)."""
    weights = sample_weights(data, range(len(data.samples)), tasks).double()  # (N,)
    tokens = torch.tensor([int((labels[1:] != -100).sum()) for labels in data.labels], dtype=torch.float64)
    return max(float((weights * tokens).mean()), 1.0)


def answer_token_divisor(
    labels: torch.Tensor, world: int, sample_weights: torch.Tensor | None = None
) -> torch.Tensor:
    """What this rank divides its summed token loss by, so that training matches one process.

    ``labels`` (B, T) of this rank's shard (-100 = ignored; the loss predicts ``labels[:, 1:]``). With N
    answer tokens in the global batch (summed over ranks), the divisor is N / world: rank r's loss is
    sum_r / (N / W), DDP averages the W gradients, and the result is the gradient of sum / N, the token
    mean over the global batch that one process computes. (A per-rank token mean would weight a token of
    a rank with few answer tokens more than one of a rank with many.) At least 1 token is assumed.
    With ``sample_weights`` (B,), N is the weighted token count (mm.train.token_loss.token_weights).
    """
    if sample_weights is None:
        n = (labels[:, 1:] != -100).sum().to(torch.float32)
    else:
        n = token_weights(labels, sample_weights.to(torch.float32)).sum()
    n = common.all_reduce_sum(n)  # N over all ranks
    return n.clamp(min=1.0) / world


def save_final(model: Any, processor: Any, out: Path, *, lora: bool) -> Path:
    """Write ``out/model`` (save_pretrained + processor); LoRA runs also write ``out/adapter``, then merge."""
    import shutil

    target = out / "model"
    tmp = out / ".model.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    model = common.unwrap(model)
    if lora:
        model.save_pretrained(str(out / "adapter"))
        model = model.merge_and_unload()
    model.save_pretrained(str(tmp))
    processor.save_pretrained(tmp)
    if target.exists():
        shutil.rmtree(target)
    tmp.replace(target)
    return target


def write_plots(out_dir: str | Path) -> Path:
    """curves.png: loss, lr, held-out caption loss, object recall, CHAIR_i against step."""
    recs = common.read_metrics(Path(out_dir) / "metrics.jsonl")
    keys = ["loss", "lr", "eval/caption_loss", "eval/recall", "eval/chair_i"]
    return common.plot_metrics(recs, keys, Path(out_dir) / "curves.png", title="mm train")


def _check_resume_config(saved: dict[str, Any], now: dict[str, Any], where: Path) -> None:
    """Refuse to resume a checkpoint written with another config (only train.steps may change)."""
    import json

    def norm(d: dict[str, Any]) -> Any:
        d = json.loads(json.dumps(d))
        d.get("train", {}).pop("steps", None)
        return d

    if norm(saved) != norm(now):
        raise UserError(
            f"{where} was written with a different config; use the same config to resume, "
            "or choose a new --out folder (or pass --no-resume)"
        )

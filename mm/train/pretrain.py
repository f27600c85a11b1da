"""CLIP-style contrastive pretraining of a note encoder (vision tower -> fusion -> pooled note) against a
tiny text encoder, with retrieval evaluation on held-out notes.

Model (Radford et al. 2021, CLIP, with a multi-image note side):

    pixel_values (B, N, 3, H, W) -> vision tower -> patches (B, N, P, Dv) -> fusion (any kind, budget K)
    -> tokens (B, N, K, D) -> mean over K -> per-image MLP (+ image index embedding) -> masked mean over
    images -> projection -> L2-normalised note embedding (B, E)
    text ids (B, T) -> TextEncoder -> projection -> L2-normalised text embedding (B, E)

Loss: :mod:`mm.contrastive` (CLIP InfoNCE or SigLIP, optional multi-positive over a note's images, label
smoothing, learnable or fixed temperature). Under torchrun / accelerate (DDP) the features of every rank
are gathered with gradients, so each step's loss equals the single-process loss on the global batch.

Deviations from CLIP: tiny towers trained from scratch; notes pool several images; the data order is a
pure function of (seed, step) (:func:`mm.train.common.batch_indices`) so resume is exact.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from mm import contrastive as C
from mm.errors import UserError
from mm.fusion import FusionConfig, build_fusion_from_config
from mm.train import common
from mm.train.text_encoder import TextEncoder, TextEncoderConfig
from mm.vision import VisionConfig, build_vision_tower

LOSS_KINDS = ("clip", "siglip")


@dataclass
class PretrainModelConfig:
    """The note encoder (vision + fusion + pooling) and the text encoder."""

    vision: VisionConfig = field(default_factory=VisionConfig)
    """Vision tower (see mm.vision.VisionConfig)."""
    fusion: FusionConfig = field(default_factory=FusionConfig)
    """Fusion module turning each image's patches into K tokens (see mm.fusion.FusionConfig)."""
    text: TextEncoderConfig = field(default_factory=TextEncoderConfig)
    """Text tower (see mm.train.text_encoder.TextEncoderConfig)."""
    d_model: int = 128
    """Width of the fusion output tokens and of the per-image note features."""
    embed_dim: int = 128
    """Width of the shared (contrastive) embedding space."""
    max_images: int = 4
    """Image slots per note (notes with more images are an error, fewer are padded)."""


@dataclass
class LossConfig:
    """Which contrastive loss and how its temperature behaves."""

    kind: str = "clip"
    """"clip" (symmetric InfoNCE) or "siglip" (pairwise sigmoid)."""
    init_temperature: float = 0.07
    """Initial temperature; the learnable log-scale starts at ln(1 / init_temperature)."""
    learn_temperature: bool = True
    """False = keep the temperature fixed at init_temperature."""
    label_smoothing: float = 0.0
    """Label smoothing of the InfoNCE targets (clip only)."""
    multi_positive: bool = False
    """Use per-image embeddings: every image of a note is a positive for its text."""
    tag_weight: float = 0.0
    """Weight of an auxiliary object-tagging loss added to the contrastive one (0 = off): a linear head
    on each fusion token, max over the image's tokens (multiple-instance), predicts which world
    categories the image shows (multi-label BCE against the notes' object annotations). Note-level
    InfoNCE on colour-rich captions is solved mostly by colours; the tags make the tower learn
    categories, which captioning needs. The head is dropped after pretraining (only vision and fusion
    are copied into a NoteVLM)."""
    contrastive_weight: float = 1.0
    """Weight of the contrastive loss. Below 1 it leaves more of the tower to the tags (the two compete
    for the same 64-d tokens); 0 with ``tag_weight`` > 0 pretrains an object tagger only."""

    def __post_init__(self) -> None:
        if self.kind not in LOSS_KINDS:
            raise ValueError(f"loss.kind must be one of {LOSS_KINDS}, got {self.kind!r}")
        if self.init_temperature <= 0:
            raise ValueError(f"loss.init_temperature must be > 0, got {self.init_temperature}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"loss.label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.tag_weight < 0 or self.contrastive_weight < 0:
            raise ValueError(
                f"loss.tag_weight and loss.contrastive_weight must be >= 0, got {self.tag_weight}, "
                f"{self.contrastive_weight}"
            )
        if self.tag_weight == 0 and self.contrastive_weight == 0:
            raise ValueError("loss.contrastive_weight and loss.tag_weight are both 0: nothing to train")
        if self.kind == "siglip" and self.label_smoothing:
            raise ValueError("loss.label_smoothing applies to kind 'clip' only; set it to 0 for siglip")


@dataclass
class OptimConfig:
    """AdamW with linear warm-up and cosine decay to ``min_lr_ratio * lr``."""

    lr: float = 1e-3
    """Peak learning rate."""
    weight_decay: float = 0.1
    """Decoupled weight decay on matrices (not on biases, norms or the temperature)."""
    betas: tuple[float, float] = (0.9, 0.98)
    """AdamW betas (CLIP uses beta2 = 0.98)."""
    eps: float = 1e-6
    """AdamW epsilon."""
    warmup_steps: int = 20
    """Linear warm-up steps."""
    min_lr_ratio: float = 0.05
    """Final learning rate as a fraction of lr."""
    grad_clip: float = 1.0
    """Global gradient-norm clip; 0 disables."""


@dataclass
class RunConfig:
    """Length of the run and how often to evaluate, log and checkpoint."""

    steps: int = 300
    """Optimizer steps."""
    batch_size: int = 128
    """Global batch size (notes); split evenly across DDP ranks."""
    seed: int = 0
    """Seed of the model init and the data order."""
    log_every: int = 10
    """Write a metrics record every n steps."""
    eval_every: int = 100
    """Evaluate retrieval on held-out notes every n steps (and at the end)."""
    checkpoint_every: int = 100
    """Write a checkpoint every n steps (and at the end)."""
    keep_last: int = 2
    """How many checkpoints to keep."""
    threads: int = 0
    """torch.set_num_threads; 0 leaves the default."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "log_every", "eval_every", "checkpoint_every", "keep_last"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class DataConfig:
    """Where the notes come from; the synthetic world is generated there when the folder is missing."""

    folder: str = "runs/data/world_pretrain_21k"
    """Note folder (notes.jsonl + images). Generated with `mm data world` when it does not exist."""
    generate_notes: int = 21000
    """Notes to generate when the folder is missing (the world puts ~5% in the test split)."""
    generate_seed: int = 0
    """World seed used when generating."""
    world_config: str | None = None
    """WorldConfig YAML for generation (None = the built-in default world)."""
    train_split: str = "train"
    """Split to train on."""
    eval_split: str = "test"
    """Held-out split for retrieval evaluation."""
    eval_notes: int = 1000
    """Held-out notes to evaluate on (the first n of eval_split)."""


@dataclass
class PretrainConfig:
    """Everything `mm pretrain` needs."""

    model: PretrainModelConfig = field(default_factory=PretrainModelConfig)
    """Note and text encoders."""
    loss: LossConfig = field(default_factory=LossConfig)
    """Contrastive loss."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    train: RunConfig = field(default_factory=RunConfig)
    """Steps, batch, logging, checkpoints."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training and held-out notes."""


# ---------------------------------------------------------------- model


class NoteTextModel(nn.Module):
    """Note encoder + text encoder + temperature; ``forward`` returns normalised embeddings."""

    def __init__(
        self, *, cfg: PretrainModelConfig, loss: LossConfig, vocab_size: int, num_tags: int = 0
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.vision = build_vision_tower(cfg.vision)
        self.fusion = build_fusion_from_config(
            cfg.fusion, d_vision=self.vision.dim, d_model=cfg.d_model, grid=self.vision.grid
        )
        self.image_index = nn.Embedding(cfg.max_images, cfg.d_model)
        self.image_mlp = nn.Sequential(
            nn.LayerNorm(cfg.d_model),
            nn.Linear(cfg.d_model, cfg.d_model),
            nn.GELU(),
            nn.Linear(cfg.d_model, cfg.d_model),
        )
        self.note_proj = nn.Linear(cfg.d_model, cfg.embed_dim, bias=False)
        self.text = TextEncoder(cfg=cfg.text, vocab_size=vocab_size)
        self.text_proj = nn.Linear(cfg.text.width, cfg.embed_dim, bias=False)
        init = torch.tensor(C.init_logit_scale(loss.init_temperature))
        if loss.learn_temperature:
            self.log_scale = nn.Parameter(init)
        else:
            self.register_buffer("log_scale", init)
        if loss.kind == "siglip":
            self.logit_bias = nn.Parameter(torch.tensor(C.init_logit_bias()))
        else:
            self.logit_bias = None
        self.tag_head = nn.Linear(cfg.d_model, num_tags) if num_tags else None

    def encode_images(
        self, pixel_values: torch.Tensor, image_mask: torch.Tensor, *, tags: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """(B, N, 3, H, W), (B, N) -> per-image features (B, N, D) (zeros at padded slots); with ``tags``
        also the tag logits (B, N, C) of the tag head."""
        B, N = image_mask.shape
        if N > self.cfg.max_images:
            raise ValueError(f"notes have {N} image slots, model.max_images is {self.cfg.max_images}")
        patches = self.vision(pixel_values, image_mask)  # (B, N, P, Dv)
        tokens, token_mask = self.fusion(patches, image_mask)  # (B, N, K, D), (B, N, K)
        token_mask = token_mask.to(torch.bool)
        m = token_mask[..., None].to(tokens.dtype)  # (B, N, K, 1)
        per_image = (tokens * m).sum(2) / m.sum(2).clamp(min=1.0)  # (B, N, D)
        idx = self.image_index.weight[:N][None]  # (1, N, D)
        per_image = per_image + self.image_mlp(per_image + idx)  # (B, N, D)
        per_image = per_image * image_mask[..., None].to(per_image.dtype)
        if not tags:
            return per_image
        if self.tag_head is None:
            raise ValueError("this model has no tag head (built with num_tags=0)")
        # multiple-instance tagging: a class is in the image when ANY token says so, so each token's own
        # logits are max-pooled (a Linear over max-pooled features cannot single out one token's object:
        # it plateaued at tag loss 0.13, the tower reading only the theme; per-token logits reach ~0.02)
        logits = self.tag_head(tokens)  # (B, N, K, C)
        logits = logits.masked_fill(~token_mask[..., None], float("-inf")).amax(2)  # (B, N, C)
        logits = torch.where(image_mask[..., None], logits, torch.zeros_like(logits))  # no -inf at padding
        return per_image, logits  # (B, N, D), (B, N, C)

    def encode_note(
        self, pixel_values: torch.Tensor, image_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalised note embeddings (B, E) and per-image embeddings (B, N, E)."""
        return self._pool(self.encode_images(pixel_values, image_mask), image_mask)

    def _pool(self, per_image: torch.Tensor, image_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        w = image_mask[..., None].to(per_image.dtype)  # (B, N, 1)
        pooled = (per_image * w).sum(1) / w.sum(1).clamp(min=1.0)  # (B, D)
        note = F.normalize(self.note_proj(pooled), dim=-1)  # (B, E)
        images = F.normalize(self.note_proj(per_image), dim=-1) * w  # (B, N, E)
        return note, images

    def encode_text(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """(B, T), (B, T) -> normalised text embeddings (B, E)."""
        return F.normalize(self.text_proj(self.text(input_ids, attention_mask)), dim=-1)

    def forward(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        if self.tag_head is not None:
            per_image, out["tag_logits"] = self.encode_images(
                batch["pixel_values"], batch["image_mask"], tags=True
            )
        else:
            per_image = self.encode_images(batch["pixel_values"], batch["image_mask"])
        out["note"], out["images"] = self._pool(per_image, batch["image_mask"])
        out["text"] = self.encode_text(batch["input_ids"], batch["attention_mask"])
        return out


def tag_loss(
    logits: torch.Tensor, tags: torch.Tensor, image_mask: torch.Tensor, *, count: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean multi-label BCE over the real images: logits (B, N, C), tags (B, N, C) in {0, 1}, mask (B, N).

    ``count`` replaces the number of real images the sum is divided by (default: this batch's). Under DDP
    pass (real images of the global batch) / world, so that DDP's gradient average is the global mean.
    """
    per = F.binary_cross_entropy_with_logits(logits, tags.to(logits.dtype), reduction="none").mean(
        -1
    )  # (B, N)
    m = image_mask.to(per.dtype)
    return (per * m).sum() / (m.sum() if count is None else count).clamp(min=1.0)


def contrastive_loss(
    out: dict[str, torch.Tensor],
    image_mask: torch.Tensor,
    *,
    log_scale: torch.Tensor,
    logit_bias: torch.Tensor | None,
    cfg: LossConfig,
) -> torch.Tensor:
    """The configured loss on features gathered (with gradients) across DDP ranks."""
    scale = log_scale.exp()
    text = C.gather_with_grad(out["text"])  # (W*B, E)
    if cfg.multi_positive:
        images = C.gather_with_grad(out["images"])  # (W*B, N, E)
        mask = C.gather_no_grad(image_mask)  # (W*B, N)
        if cfg.kind == "clip":
            return C.multi_positive_clip_loss(images, mask, text, scale, label_smoothing=cfg.label_smoothing)
        flat, valid = images.flatten(0, 1), mask.flatten()  # (W*B*N, E), (W*B*N,)
        owner = torch.arange(mask.shape[0], device=mask.device).repeat_interleave(mask.shape[1])
        pos = owner[valid][:, None] == torch.arange(text.shape[0], device=mask.device)[None, :]
        return C.siglip_loss(flat[valid], text, scale, logit_bias, positive_mask=pos)
    note = C.gather_with_grad(out["note"])  # (W*B, E)
    if cfg.kind == "clip":
        return C.clip_loss(note, text, scale, label_smoothing=cfg.label_smoothing)
    return C.siglip_loss(note, text, scale, logit_bias)


# ---------------------------------------------------------------- data


@dataclass
class NoteTensors:
    """A split held in memory: uint8 images, image mask, token ids (all indexed by note)."""

    pixels: torch.Tensor
    """(M, N, 3, H, W) uint8."""
    image_mask: torch.Tensor
    """(M, N) bool."""
    input_ids: torch.Tensor
    """(M, T) long."""
    attention_mask: torch.Tensor
    """(M, T) long."""
    tags: torch.Tensor | None = None
    """(M, N, C) bool: which of ``tag_classes`` each image shows (None = not loaded)."""

    def __len__(self) -> int:
        return self.pixels.shape[0]

    def batch(self, idx: list[int] | torch.Tensor) -> dict[str, torch.Tensor]:
        """Model inputs for notes ``idx``: pixels scaled to [-1, 1]."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        ids, am = self.input_ids[idx], self.attention_mask[idx]
        t = int(am.sum(1).max())  # trim padding shared by the whole batch
        out = {
            "pixel_values": self.pixels[idx].float().div_(127.5).sub_(1.0),  # (B, N, 3, H, W)
            "image_mask": self.image_mask[idx],
            "input_ids": ids[:, :t],
            "attention_mask": am[:, :t],
        }
        if self.tags is not None:
            out["tags"] = self.tags[idx]  # (B, N, C)
        return out


def load_split(
    folder: str | Path,
    split: str,
    *,
    tokenizer: Any,
    max_images: int,
    max_len: int,
    limit: int | None = None,
    tag_classes: Sequence[str] | None = None,
) -> NoteTensors:
    """Read a split of a note folder into memory (images decoded once, texts tokenized once).

    Notes are padded to ``max_images`` image slots; a note with more images is a :class:`UserError`.
    With ``tag_classes`` the per-image object tags are loaded too (an object of another category, or a
    note without object annotations, is a :class:`UserError`).
    """
    from mm.data.dataset import NoteDataset

    ds = NoteDataset(folder, split=split, limit=limit)  # decodes only the notes used
    n = len(ds)
    if n == 0:
        raise UserError(
            f"{folder} has no notes in split {split!r}; generate more notes or choose another split"
        )
    first = ds.pixels_uint8(0)  # (N_img, 3, H, W)
    pixels = torch.zeros(n, max_images, *first.shape[1:], dtype=torch.uint8)  # (M, N, 3, H, W)
    mask = torch.zeros(n, max_images, dtype=torch.bool)  # (M, N)
    for i in range(n):
        px = ds.pixels_uint8(i)
        if px.shape[0] > max_images or px.shape[1:] != first.shape[1:]:
            raise UserError(
                f"note {ds.notes[i].id} in {folder}: {px.shape[0]} images of shape {tuple(px.shape[1:])}; "
                f"expected at most model.max_images={max_images} of shape {tuple(first.shape[1:])}"
            )
        pixels[i, : px.shape[0]] = px
        mask[i, : px.shape[0]] = True
    tags = None if tag_classes is None else _load_tags(ds.notes, folder, tag_classes, max_images)
    texts = [ds.notes[i].text for i in range(n)]
    # pad to the longest text only: batch() trims padding per batch anyway
    enc = tokenizer(texts, padding="longest", truncation=True, max_length=max_len, return_tensors="pt")
    return NoteTensors(
        pixels=pixels,
        image_mask=mask,
        input_ids=enc["input_ids"].long(),
        attention_mask=enc["attention_mask"].long(),
        tags=tags,
    )


def tag_classes(cfg: PretrainConfig) -> list[str] | None:
    """The tag classes ``load_split`` needs for ``cfg``: the world's categories when ``loss.tag_weight``
    is on, else None (no tags loaded)."""
    if cfg.loss.tag_weight <= 0:
        return None
    from mm.world.vocab import CATEGORY_NAMES

    return list(CATEGORY_NAMES)


def _load_tags(
    notes: Sequence[Any], folder: str | Path, classes: Sequence[str], max_images: int
) -> torch.Tensor:
    index = {c: i for i, c in enumerate(classes)}
    tags = torch.zeros(len(notes), max_images, len(classes), dtype=torch.bool)  # (M, N, C)
    for i, note in enumerate(notes):
        if not note.objects:
            raise UserError(
                f"note {note.id} in {folder} has no object annotations, which loss.tag_weight > 0 needs; "
                "use notes with objects (world or COCO) or set loss.tag_weight: 0"
            )
        for k, objs in enumerate(note.objects[:max_images]):
            for o in objs:
                if o.category not in index:
                    raise UserError(
                        f"note {note.id} in {folder}: object category {o.category!r} is not a tag class "
                        f"({len(classes)} world categories); set loss.tag_weight: 0 for other vocabularies"
                    )
                tags[i, k, index[o.category]] = True
    return tags


# ---------------------------------------------------------------- evaluation


@torch.no_grad()
def embed_split(
    model: NoteTextModel, data: NoteTensors, batch_size: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """Note and text embeddings (M, E) of a whole split, in eval mode."""
    was = model.training
    model.eval()
    notes, texts = [], []
    for start in range(0, len(data), batch_size):
        b = data.batch(list(range(start, min(len(data), start + batch_size))))
        out = model(b)
        notes.append(out["note"])
        texts.append(out["text"])
    model.train(was)
    return torch.cat(notes), torch.cat(texts)


def evaluate(model: NoteTextModel, data: NoteTensors) -> dict[str, float]:
    """R@1/5/10 note->text and text->note on ``data``."""
    from mm.eval.retrieval import retrieval_metrics

    notes, texts = embed_split(model, data)
    return retrieval_metrics(notes, texts)


# ---------------------------------------------------------------- training


def lr_lambda(cfg: OptimConfig, steps: int):
    """Linear warm-up then cosine decay to min_lr_ratio (a multiplier of lr, for LambdaLR)."""

    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, steps - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))

    return f


@dataclass
class TrainResult:
    """What a finished (or resumed-and-finished) run reports."""

    step: int
    """Last optimizer step."""
    metrics: dict[str, float]
    """Final retrieval metrics on the held-out notes."""
    seconds: float
    """Wall time of this process's training (excluding data loading)."""
    cpu_seconds: float = 0.0
    """CPU time (all threads) of this process's training (excluding data loading)."""


def train(
    cfg: PretrainConfig,
    *,
    out_dir: str | Path,
    train_data: NoteTensors,
    eval_data: NoteTensors,
    vocab_size: int,
    resume: bool = True,
    show_progress: bool = True,
    stop_after: int | None = None,
) -> TrainResult:
    """Train (resuming from ``out_dir/checkpoints`` when ``resume``); writes metrics, plots, checkpoints.

    ``stop_after`` ends the process after that many steps without a final evaluation (simulates a kill,
    for tests); the checkpoint cadence is unchanged.
    """
    from mm.config import to_dict

    out = Path(out_dir)
    rank, world = common.init_distributed()
    main = rank == 0
    if cfg.train.batch_size % world:
        raise UserError(f"train.batch_size={cfg.train.batch_size} must be divisible by {world} processes")
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    common.seed_everything(cfg.train.seed)
    num_tags = 0
    if cfg.loss.tag_weight > 0:
        if train_data.tags is None:
            raise UserError("loss.tag_weight > 0 needs object tags: load the data with tag_classes")
        num_tags = int(train_data.tags.shape[-1])
    model = NoteTextModel(cfg=cfg.model, loss=cfg.loss, vocab_size=vocab_size, num_tags=num_tags)
    opt = torch.optim.AdamW(
        C.param_groups(model, weight_decay=cfg.optim.weight_decay),
        lr=cfg.optim.lr,
        betas=tuple(cfg.optim.betas),
        eps=cfg.optim.eps,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg.optim, cfg.train.steps))
    start = 0
    ckpt_dir = out / "checkpoints"
    last = common.find_last_checkpoint(ckpt_dir) if resume else None
    if last is not None:
        _check_resume_config(common.read_checkpoint_meta(last)["config"], to_dict(cfg), last)
        start = common.load_checkpoint(last, model=model, optimizer=opt, scheduler=sched)["step"]
    ddp = model
    if world > 1:
        ddp = nn.parallel.DistributedDataParallel(model)
    logger = common.MetricsLogger(out / "metrics.jsonl", resume_step=start if start else None, enabled=main)
    bar = common.progress(cfg.train.steps, initial=start, desc="pretrain", enabled=main and show_progress)
    metrics: dict[str, float] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    model.train()
    done = start
    for step in range(start, cfg.train.steps):
        idx = common.batch_indices(len(train_data), cfg.train.batch_size, seed=cfg.train.seed, step=step)
        batch = train_data.batch(common.shard(idx, rank=rank, world_size=world))
        feats = ddp(batch)
        c_loss = contrastive_loss(
            feats, batch["image_mask"], log_scale=model.log_scale, logit_bias=model.logit_bias, cfg=cfg.loss
        )
        loss = cfg.loss.contrastive_weight * c_loss
        t_loss = None
        if num_tags:
            images = common.all_reduce_sum(batch["image_mask"].sum().to(torch.float32)) / world  # (N / W)
            t_loss = tag_loss(feats["tag_logits"], batch["tags"], batch["image_mask"], count=images)
            loss = loss + cfg.loss.tag_weight * t_loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
            if cfg.optim.grad_clip > 0
            else torch.tensor(float("nan"))
        )
        opt.step()
        sched.step()
        if isinstance(model.log_scale, nn.Parameter):
            C.clamp_logit_scale_(model.log_scale)
        done = step + 1
        bar.update(1)
        record: dict[str, Any] = {}
        if done % cfg.train.log_every == 0 or done == cfg.train.steps:
            record = {
                "step": done,
                "loss": common.all_reduce_sum(loss).item() / world,  # the global batch's loss
                "temperature": math.exp(-model.log_scale.item()),
                "logit_scale": math.exp(model.log_scale.item()),
                "lr": sched.get_last_lr()[0],
                "grad_norm": float(grad_norm),
                "time_s": round(time.perf_counter() - t0, 3),
                "cpu_s": round(time.process_time() - c0, 3),
            }
            if t_loss is not None:
                record["tag_loss"] = common.all_reduce_sum(t_loss).item() / world
                record["contrastive_loss"] = common.all_reduce_sum(c_loss.detach()).item() / world
            bar.set_postfix(loss=f"{record['loss']:.3f}", T=f"{record['temperature']:.4f}")
        if done % cfg.train.eval_every == 0 or done == cfg.train.steps:
            if main:
                metrics = evaluate(model, eval_data)
                record = {"step": done, **record, **{f"eval/{k}": v for k, v in metrics.items()}}
                bar.set_postfix(loss=f"{loss.item():.3f}", R1=f"{metrics['text2note_R@1']:.3f}")
            common.barrier()
        if record:
            logger.log(record)
        if done % cfg.train.checkpoint_every == 0 or done == cfg.train.steps:
            if main:
                common.save_checkpoint(
                    ckpt_dir,
                    step=done,
                    model=model,
                    optimizer=opt,
                    scheduler=sched,
                    config=to_dict(cfg),
                    keep_last=cfg.train.keep_last,
                )
            common.barrier()
        if stop_after is not None and done >= stop_after:
            break
    if start >= cfg.train.steps and main:  # a finished run was resumed: report its final metrics
        metrics = evaluate(model, eval_data)
    bar.close()
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    if main:
        write_plots(out)
    return TrainResult(step=done, metrics=metrics, seconds=seconds, cpu_seconds=cpu_seconds)


def write_plots(out_dir: str | Path) -> Path:
    """curves.png: loss, temperature and text->note / note->text R@1 against step."""
    recs = common.read_metrics(Path(out_dir) / "metrics.jsonl")
    keys = ["loss", "temperature", "eval/text2note_R@1", "eval/note2text_R@1"]
    return common.plot_metrics(recs, keys, Path(out_dir) / "curves.png", title="mm pretrain")


def _check_resume_config(saved: dict[str, Any], now: dict[str, Any], where: Path) -> None:
    """Refuse to resume a checkpoint written with a different config (steps may change)."""
    a = {k: v for k, v in saved.items() if k != "train"}
    b = {k: v for k, v in now.items() if k != "train"}
    sa = {k: v for k, v in saved.get("train", {}).items() if k != "steps"}
    sb = {k: v for k, v in now.get("train", {}).items() if k != "steps"}
    if _jsonable(a) != _jsonable(b) or _jsonable(sa) != _jsonable(sb):
        raise UserError(
            f"{where} was written with a different config; use the same config to resume, "
            "or choose a new --out folder (or pass --no-resume)"
        )


def _jsonable(x: Any) -> Any:
    import json

    return json.loads(json.dumps(x))

"""Config of ``mm pretrain``: model, contrastive loss, optimiser, run and data sections."""

from __future__ import annotations

from dataclasses import dataclass, field

from mm.fusion import FusionConfig
from mm.train.config import BatchRunConfig
from mm.train.config import OptimConfig as SharedOptimConfig
from mm.train.text_encoder import TextEncoderConfig
from mm.vision import VisionConfig

LOSS_KINDS = ("clip", "siglip")
TAG_COLOUR_KINDS = ("none", "colour", "pair")
TAG_SCOPES = ("image", "token", "both")


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
    tag_colours: str = "none"
    """Colour classes beside the category classes of the tagging loss (needs ``tag_weight`` > 0 and
    notes whose objects carry a colour, as the world's do): "none" = categories only; "colour" = also
    one class per world colour (the image shows an object of that colour); "pair" = also the colour
    classes and one class per (category, colour) pair ("red fork"). With one object per patch, the
    per-token head makes each fusion token say which colour its object has, which the captioner
    needs to bind colours to objects; the category-only tagger leaves colours to the contrastive loss."""
    tag_scope: str = "image"
    """Where the tags are: "image" = per image, read as the max over the image's fusion tokens
    (multiple-instance: any token may carry an object); "token" = per fusion token, each token told the
    classes of the objects on its own grid cell (an object's box covers the cell's centre, or the box's
    centre lies in the cell), so a token carries its own object's category and colour together, which the
    captioner needs to bind a colour to its object. "token" needs fusion tokens on the patch grid (mlp
    fusion, budget = patches) and a tower with ``image_size`` and ``patch_size`` set. "both" = the two
    losses summed, from the same per-token logits: each token its own object, and the image's max over
    its tokens every object of the image (the per-token loss alone, a mean over mostly empty cells, gave
    captioners that name fewer of the objects there)."""
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
        if self.tag_colours not in TAG_COLOUR_KINDS:
            raise ValueError(f"loss.tag_colours must be one of {TAG_COLOUR_KINDS}, got {self.tag_colours!r}")
        if self.tag_scope not in TAG_SCOPES:
            raise ValueError(f"loss.tag_scope must be one of {TAG_SCOPES}, got {self.tag_scope!r}")
        if self.tag_colours != "none" and self.tag_weight == 0:
            raise ValueError(
                f"loss.tag_colours={self.tag_colours!r} adds classes to the tagging loss, which is off "
                "(tag_weight 0); set loss.tag_weight > 0 or loss.tag_colours: none"
            )
        if self.tag_weight == 0 and self.contrastive_weight == 0:
            raise ValueError("loss.contrastive_weight and loss.tag_weight are both 0: nothing to train")
        if self.kind == "siglip" and self.label_smoothing:
            raise ValueError("loss.label_smoothing applies to kind 'clip' only; set it to 0 for siglip")


@dataclass(kw_only=True)
class OptimConfig(SharedOptimConfig):
    """:class:`mm.train.config.OptimConfig` with CLIP's defaults."""

    weight_decay: float = 0.1
    """Decoupled weight decay on matrices (not on biases, norms or the temperature)."""
    betas: tuple[float, float] = (0.9, 0.98)
    """AdamW betas (CLIP uses beta2 = 0.98)."""
    eps: float = 1e-6
    """AdamW epsilon."""
    min_lr_ratio: float = 0.05
    """Final learning rate as a fraction of lr."""


@dataclass(kw_only=True)
class RunConfig(BatchRunConfig):
    """:class:`mm.train.config.BatchRunConfig` (steps, batch, seed, cadence) with pretraining's defaults."""

    batch_size: int = 128
    """Global batch size (notes); split evenly across DDP ranks."""


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

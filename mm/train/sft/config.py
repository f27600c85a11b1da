"""Config of ``mm train`` (align / SFT): model, init, LoRA, tasks, optimiser, run, data and evaluation."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mm.fusion import FusionConfig
from mm.model.configuration import TINY_TEXT_CONFIG
from mm.model.pretrained_lm import check_text_section
from mm.multi_image import VISIBILITY_MODES
from mm.train.config import BatchRunConfig, OptimConfig
from mm.train.tasks import ANSWER_STYLES, CAPTION_PROMPT, IMAGE_CAPTION_PROMPT, TASK_KINDS
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
    """Causal LM: transformers config fields (model_type qwen2/llama; vocab_size comes from the tokenizer),
    or ``pretrained: DIR``, a local AutoModelForCausalLM folder whose config, weights, tokenizer and chat
    template are used (mm.model.pretrained_lm). Keys that are not fields of the LM's config are errors."""
    max_images: int = 4
    """Image slots per note."""
    max_length: int = 256
    """Longest token sequence (images included); longer answers are cut, cut images are an error."""
    tokenizer: str | None = None
    """Tokenizer folder (save_pretrained); None = the project tokenizer (mm.data.tokenizer.load_tokenizer)."""
    image_index_embeddings: bool = False
    """Add a learned per-image index embedding to each image's fusion tokens (NoteVLMConfig field)."""
    token_position_embeddings: bool = False
    """Add a learned embedding of each fusion token's place among an image's K tokens (NoteVLMConfig
    field), so a token's content says where in the photo it lies."""
    visibility: str = "all"
    """LM visibility of a note's photos: "all" or "own" (NoteVLMConfig field; mm.multi_image)."""

    def __post_init__(self) -> None:
        check_text_section(self.text)
        if self.visibility not in VISIBILITY_MODES:
            raise ValueError(f"model.visibility must be one of {VISIBILITY_MODES}, got {self.visibility!r}")
        if self.text.get("pretrained") is not None and self.tokenizer is not None:
            raise ValueError(
                "model.text.pretrained brings its own tokenizer; drop model.tokenizer or "
                "model.text.pretrained (one of the two)"
            )


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
    """Task kinds: caption, image_caption, question, pope_question, attribute_question, colour_answer,
    count_answer, conversation."""
    caption_prompt: str = CAPTION_PROMPT
    """Prompt of the captioning task (training and evaluation)."""
    image_caption_prompt: str = IMAGE_CAPTION_PROMPT
    """Prompt of the per-image captioning task (kind image_caption)."""
    questions_per_note: int = 6
    """Most yes/no questions per note used for training."""
    question_weight: float = 1.0
    """Loss weight of a yes/no answer's tokens against a caption token's 1 (mm.train.token_loss): a question
    has 1 answer token to a caption's ~40, so in a plain token mean the questions get ~5% of the gradient."""
    colour_weight: float = 1.0
    """Loss weight of the colour words' tokens in every answer (:func:`mm.train.sft.loss.colour_token_ids`)
    against 1 for the other tokens. A caption's colours are a few tokens of ~40, and the lookup that reads
    them from the image is learnt late or not at all (docs/results.md, "Colour after the noun")."""
    pope_questions_per_note: int = 1
    """POPE-style one-image questions per note (kind pope_question: mm.train.tasks.pope_question_samples)."""
    attribute_questions_per_note: int = 1
    """Colour yes/no one-image questions per note (kind attribute_question:
    mm.train.tasks.attribute_question_samples; world notes, or any note whose objects have colours)."""
    colour_answers_per_note: int = 1
    """Open colour questions per note (kind colour_answer: mm.train.tasks.colour_answer_samples; world
    notes, or any note whose objects have colours)."""
    count_answers_per_note: int = 1
    """Open count questions per note (kind count_answer: mm.train.tasks.count_answer_samples; any note with
    object annotations)."""
    answer_style: str = "word"
    """How yes/no answers are written (mm.train.tasks.yes_no_answer): "word" ("yes") or "object" ("A fork:
    yes", the object first: the tiny 3-layer LM learns to answer that way, README)."""

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in TASK_KINDS]
        if bad or not self.kinds:
            raise ValueError(f"tasks.kinds must be a non-empty subset of {TASK_KINDS}, got {self.kinds}")
        if not (self.question_weight > 0 and math.isfinite(self.question_weight)):
            raise ValueError(f"tasks.question_weight must be a finite number > 0, got {self.question_weight}")
        if not (self.colour_weight > 0 and math.isfinite(self.colour_weight)):
            raise ValueError(f"tasks.colour_weight must be a finite number > 0, got {self.colour_weight}")
        if self.pope_questions_per_note < 0:
            n = self.pope_questions_per_note
            raise ValueError(f"tasks.pope_questions_per_note must be >= 0, got {n}")
        if self.attribute_questions_per_note < 0:
            n = self.attribute_questions_per_note
            raise ValueError(f"tasks.attribute_questions_per_note must be >= 0, got {n}")
        if self.colour_answers_per_note < 0:
            n = self.colour_answers_per_note
            raise ValueError(f"tasks.colour_answers_per_note must be >= 0, got {n}")
        if self.count_answers_per_note < 0:
            n = self.count_answers_per_note
            raise ValueError(f"tasks.count_answers_per_note must be >= 0, got {n}")
        if self.answer_style not in ANSWER_STYLES:
            raise ValueError(f"tasks.answer_style must be one of {ANSWER_STYLES}, got {self.answer_style!r}")


@dataclass(kw_only=True)
class RunConfig(BatchRunConfig):
    """Stage, plus :class:`mm.train.config.BatchRunConfig` (steps, batch, seed, cadence, threads, device,
    precision, gradient checkpointing, FSDP)."""

    stage: str = "sft"
    """align (fusion only) or sft (fusion + LM, or LoRA)."""
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
        super().__post_init__()
        if self.stage not in STAGES:
            raise ValueError(f"train.stage must be one of {STAGES}, got {self.stage!r}")


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

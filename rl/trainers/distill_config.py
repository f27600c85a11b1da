"""Config of ``rl distill``: student and teacher folders, the prompts, sampling, the distillation loss,
optimiser and run (unknown keys are errors, as every config of :func:`mm.config.load_config`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from rl.trainers.common import EvalRunConfig, OptimConfig
from rl.trainers.dpo_config import FilesLoraConfig, ModelConfig

LOSS_KINDS = ("reverse_kl", "gjsd", "sft_on_teacher")
"""``loss.kind``: on-policy reverse KL, GKD's generalised JSD, or off-policy KD (SFT on teacher samples)."""
ESTIMATORS = ("full", "sampled")
"""``loss.estimator`` of ``reverse_kl``: the exact KL over the vocabulary, or the sampled-token advantage."""
OFF_POLICY_SOURCES = ("teacher", "dataset")
"""Where the answers of the rows the student does not sample come from (``data.off_policy``)."""


@dataclass(kw_only=True)
class TeacherConfig(ModelConfig):
    """The teacher: any folder :func:`mm.model.adapter.load_adapter` takes, with the student's tokenizer."""

    batch_size: int = 8
    """Rows per teacher forward (no gradient) when scoring a rollout; lower it to save memory."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.batch_size < 1:
            raise ValueError(f"teacher.batch_size must be >= 1, got {self.batch_size}")


@dataclass(kw_only=True)
class DistillLoraConfig(FilesLoraConfig):
    """LoRA on the student's LM projections (the adapter's family defaults); off by default."""

    enabled: bool = False
    """Train LoRA adapters on the student; false = full fine-tuning of all but the vision tower."""


@dataclass(kw_only=True)
class DistillDataConfig:
    """Prompts: caption requests about the world's notes (default), or a prompt file (``--prompts``)."""

    folder: str = "runs/data/world"
    """Note folder (notes.jsonl + images) of the world form (``--data``)."""
    split: str = "train"
    """Split the training prompts come from (world form)."""
    notes: int = 0
    """Use the first n notes (0 = all; world form)."""
    caption_prompt: str = "Describe the note."
    """The caption request (the SFT prompt; world form)."""
    prompts: str = ""
    """Prompt file (``--prompts``), the ``rl grpo --prompts`` format plus an optional ``answer`` per record
    (the dataset answer); "" = the world form."""
    image_folder: str = ""
    """Folder the prompt file's image paths start from (``--image-folder``; "" = the file's folder)."""
    batch_size: int = 8
    """Sequences per optimizer step."""
    lmbda: float = 1.0
    """Share of each batch's sequences the student samples itself (TRL GKD's lmbda; 1 = fully on-policy,
    0 = off-policy distillation only). The rows are fixed per batch: round(lmbda * batch_size)."""
    off_policy: str = "teacher"
    """Answers of the other rows: teacher (sampled from the teacher, TRL's seq_kd) or dataset (the notes'
    captions, the prompt file's ``answer``)."""
    eval_split: str = "val"
    """Split of the held-out notes (world form)."""
    eval_notes: int = 0
    """Held-out notes captioned greedily every train.eval_every steps for CHAIR_i and recall (0 = none)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.lmbda <= 1.0:
            raise ValueError(
                f"data.lmbda (share of student-sampled sequences) must be in [0, 1], got {self.lmbda}"
            )
        if self.off_policy not in OFF_POLICY_SOURCES:
            raise ValueError(f"data.off_policy must be one of {OFF_POLICY_SOURCES}, got {self.off_policy!r}")
        if self.batch_size < 1 or self.notes < 0 or self.eval_notes < 0:
            raise ValueError("need data.batch_size >= 1, data.notes >= 0 and data.eval_notes >= 0")
        if self.eval_notes and self.prompts:
            raise ValueError("data.eval_notes captions held-out world notes: set it to 0 with --prompts")


@dataclass(kw_only=True)
class DistillRolloutConfig:
    """Sampling of the student's (and the teacher's) answers."""

    max_new_tokens: int = 64
    """Longest sampled answer (dataset answers are cut to it too)."""
    temperature: float = 1.0
    """Sampling temperature of the student and the teacher."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1 or self.temperature <= 0:
            raise ValueError(
                f"need rollout.max_new_tokens >= 1 and rollout.temperature > 0, got {self.max_new_tokens}, "
                f"{self.temperature}"
            )


@dataclass(kw_only=True)
class DistillLossConfig:
    """The distillation loss (:mod:`rl.distill_losses`)."""

    kind: str = "reverse_kl"
    """reverse_kl (KL(student || teacher) per token), gjsd (GKD's generalised JSD with beta) or
    sft_on_teacher (off-policy KD: every row a teacher sample, the student's NLL; lmbda is not used)."""
    estimator: str = "full"
    """reverse_kl: full (exact over the vocabulary) or sampled (the on-policy distillation recipe: the
    per-token advantage -(log p_s - log p_t) of the sampled token in a policy-gradient loss; needs
    data.lmbda=1)."""
    beta: float = 0.5
    """gjsd: interpolation in [0, 1]; 0 = forward KL(teacher || student), 1 = reverse KL (TRL's beta)."""
    temperature: float = 1.0
    """Softmax temperature of both models' distributions in the loss (TRL's temperature)."""

    def __post_init__(self) -> None:
        if self.kind not in LOSS_KINDS:
            raise ValueError(f"loss.kind must be one of {LOSS_KINDS}, got {self.kind!r}")
        if self.estimator not in ESTIMATORS:
            raise ValueError(f"loss.estimator must be one of {ESTIMATORS}, got {self.estimator!r}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"loss.beta must be in [0, 1] (0 forward KL, 1 reverse KL), got {self.beta}")
        if self.temperature <= 0:
            raise ValueError(f"loss.temperature must be > 0, got {self.temperature}")


DistillRunConfig = EvalRunConfig
"""Steps, seed, cadence and device, plus the held-out evaluation cadence."""


@dataclass(kw_only=True)
class DistillConfig:
    """Everything ``rl distill --student DIR --teacher DIR`` needs."""

    student: ModelConfig = field(default_factory=ModelConfig)
    """The model trained (``--student``): its folder and dtype."""
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """The frozen teacher (``--teacher``): its folder, dtype and scoring batch."""
    lora: DistillLoraConfig = field(default_factory=DistillLoraConfig)
    """LoRA on the student, or full fine-tuning (the default)."""
    data: DistillDataConfig = field(default_factory=DistillDataConfig)
    """Prompts, batch, lmbda and the off-policy answers."""
    rollout: DistillRolloutConfig = field(default_factory=DistillRolloutConfig)
    """Sampling."""
    loss: DistillLossConfig = field(default_factory=DistillLossConfig)
    """The distillation loss."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    train: DistillRunConfig = field(default_factory=DistillRunConfig)
    """Steps, seed, cadence, device."""

    def __post_init__(self) -> None:
        if self.loss.kind == "reverse_kl" and self.loss.estimator == "sampled" and self.data.lmbda != 1.0:
            raise ValueError(
                "loss.estimator=sampled is a policy gradient on the student's own samples: set data.lmbda=1 "
                f"(got {self.data.lmbda}), or use loss.estimator=full"
            )

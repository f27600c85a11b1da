"""Config of ``rl dpo``: the DPO-family loss with mDPO's terms, the preference pairs, optimiser and run."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mm.train.tasks import ANSWER_STYLES
from rl.corrupt import KINDS
from rl.losses import DPO_LOSS_TYPES
from rl.trainers.common import InitConfig, LoraConfig, OptimConfig, RunConfig


@dataclass(kw_only=True)
class LossConfig:
    """The DPO-family loss and mDPO's extra terms."""

    loss_type: str = "sigmoid"
    """One of rl.losses.DPO_LOSS_TYPES (sigmoid, ipo, hinge, robust, bco_pair, ..., sigmoid_norm)."""
    beta: float = 0.1
    """DPO temperature (KL strength to the reference); > 0."""
    label_smoothing: float = 0.0
    """cDPO / robust DPO label-flip rate in [0, 0.5)."""
    sft_weight: float = 0.0
    """Weight of the chosen answer's NLL mixed in (RPO); 0 = off."""
    conditional_weight: float = 0.0
    """mDPO conditional term weight (chosen answer with true vs corrupted images); 0 = off."""
    anchor_weight: float = 0.0
    """mDPO anchor term weight (chosen implicit reward kept above anchor_delta); 0 = off."""
    anchor_delta: float = 0.0
    """mDPO anchor threshold delta (0 in the paper)."""
    corruption: str = "crop"
    """rl.corrupt kind for mDPO's conditional rows: noise, crop, patch_shuffle or blank."""

    def __post_init__(self) -> None:
        if self.loss_type not in DPO_LOSS_TYPES:
            raise ValueError(f"loss.loss_type must be one of {DPO_LOSS_TYPES}, got {self.loss_type!r}")
        if self.beta <= 0:
            raise ValueError(f"loss.beta must be > 0 for DPO (it scales the log-ratios), got {self.beta}")
        if not 0 <= self.label_smoothing < 0.5:
            raise ValueError(f"loss.label_smoothing must be in [0, 0.5), got {self.label_smoothing}")
        if min(self.sft_weight, self.conditional_weight, self.anchor_weight) < 0:
            raise ValueError("loss.sft_weight, conditional_weight and anchor_weight must be >= 0")
        if self.corruption not in KINDS:
            raise ValueError(f"loss.corruption must be one of {KINDS}, got {self.corruption!r}")


BUILDS = ("injection", "corrupt", "correction", "onpolicy", "none")
"""Pair kinds ``rl dpo`` builds itself (``data.build``)."""


@dataclass(kw_only=True)
class DataConfig:
    """Preference pairs: a JSONL from ``rl pairs``, or injection/corrupt pairs built from the notes."""

    folder: str = "runs/data/world"
    """Note folder (notes.jsonl + images); pair image paths are relative to it."""
    pairs: str | None = None
    """Pairs JSONL written by ``rl pairs``; None = build ``build`` pairs from ``split`` notes."""
    build: str = "injection"
    """Pairs to build when ``pairs`` is None: injection (POVID/HA-DPO), corrupt (mDPO), correction
    (RLHF-V: the starting policy's own greedy captions minus their hallucinated objects), onpolicy
    (RLAIF-V: best vs worst by the scene reward of ``samples`` captions sampled from the starting policy)
    or none (only the pairs of ``colour_corrections`` / ``question_ratio``). correction and onpolicy
    generate with the policy first, so they need ``notes`` > 0."""
    samples: int = 4
    """onpolicy: captions sampled per note."""
    temperature: float = 1.0
    """onpolicy: sampling temperature."""
    scorer: str = "scene"
    """onpolicy: what ranks the samples: scene (the notes' ground-truth objects) or labeler (claims verified
    by the labeler VLM ``labeler``: no ground truth; rl.labeler_reward)."""
    labeler: str = ""
    """onpolicy with scorer labeler: the labeler model folder (e.g. the SFT checkpoint: self-feedback)."""
    labeler_soft: bool = True
    """onpolicy with scorer labeler: credit each claim with the labeler's P(yes) (true) or with its verdict
    P(yes) >= labeler_threshold (false: the scene reward's trade-off, up to the labeler's errors)."""
    labeler_threshold: float = 0.5
    """onpolicy with scorer labeler and labeler_soft false: P(yes) at or above which a claim is supported."""
    hallucination_weight: float = 1.0
    """onpolicy: weight of the hallucinated-mention penalty in the reward that ranks the samples (the
    covered-object fraction has weight 1; :class:`rl.rewards.RewardConfig`). RLAIF-V ranks by
    hallucinations; at 1 the best sample is often the one that names more objects, hallucinations too."""
    attribute_weight: float = 0.0
    """onpolicy: weight of the wrong-colour penalty in the reward that ranks the samples
    (:attr:`rl.rewards.RewardConfig.attribute_weight`: colours claimed of present objects that have no
    object of that colour, judged on the notes' colour truth with scorer scene, by the labeler with scorer
    labeler, :func:`rl.labeler_reward.colour_values`; 0 = off)."""
    attribute_coverage_weight: float = 0.0
    """onpolicy: weight of the right-colour term in the reward that ranks the samples
    (:attr:`rl.rewards.RewardConfig.attribute_coverage_weight`: distinct (object, colour) claimed right, as
    ``attribute_weight`` judges them; 0 = off)."""
    colour_corrections: bool = False
    """Add colour-correction pairs (:func:`rl.pairs.colour_correction_pairs`): per note whose greedy caption
    states a colour ``colour_judge`` rejects, that caption (rejected) against itself without those colours
    (chosen). Needs the policy (``notes`` > 0); they join the ``build`` pairs (``build: none`` for them
    alone)."""
    colour_judge: str = "self"
    """colour_corrections: which colours to cut: self (those the policy gave its colour word probability
    below ``colour_threshold``: learnable, no ground truth), labeler (P(yes) of the labeler ``labeler`` to
    "Is there a red fork ...?" below ``colour_threshold``) or scene (wrong by the notes' colour truth)."""
    colour_threshold: float = 0.5
    """colour_corrections with colour_judge self or labeler: the probability under which a colour is cut."""
    colour_keep_pairs: bool = False
    """colour_corrections: per note with a colour left after the cut, also the corrected caption (chosen)
    against it with every colour cut (rejected), so that the pairs ask for the sure colours as well as
    against the unsure ones."""
    split: str = "train"
    """Note split pairs are built from."""
    notes: int = 0
    """Use the first n notes (0 = all)."""
    prompt: str = "Describe the note."
    """Caption prompt (the SFT caption prompt)."""
    batch_size: int = 8
    """Pairs per optimizer step."""
    question_ratio: float = 0.0
    """Add POPE-style yes/no pairs (:func:`rl.pairs.question_pairs`, one "yes" and one adversarial "no" per
    image of the ``split`` notes), this many per caption pair, drawn at random (0 = none; also with
    ``pairs``). They teach the model to say "no" to the absent partner that a caption pair punishes."""
    question_batch_size: int = 0
    """POPE-style yes/no pairs (:func:`rl.pairs.question_pairs` on the notes the caption pairs come from,
    one "yes" and one adversarial "no" per image) trained in a batch of their own beside every step's
    pairs (0 = none); their loss (same loss type, beta and SFT term) is added with weight 1, metrics under
    ``question/``. A question pair is ~3x shorter than a caption pair, which a mixed batch
    (``question_ratio``) pads to caption length, so many cost little this way."""
    answer_style: str = "word"
    """How the yes/no pairs' answers are written: the SFT model's ``tasks.answer_style`` ("word": "yes";
    "object": "A fork: yes"; :func:`mm.train.tasks.yes_no_answer`); the labeler scorer reads it too."""
    ground_truth: bool = True
    """false: the pair builder gets the notes stripped of their ground truth (rl.ground_truth): the pairs
    must need none (build onpolicy with scorer labeler, question_ratio 0); a read of it raises."""

    def __post_init__(self) -> None:
        if self.question_ratio < 0 or self.question_batch_size < 0:
            raise ValueError(
                "data.question_ratio and data.question_batch_size must be >= 0, got "
                f"{self.question_ratio} and {self.question_batch_size}"
            )
        if self.answer_style not in ANSWER_STYLES:
            raise ValueError(f"data.answer_style must be one of {ANSWER_STYLES}, got {self.answer_style!r}")
        if self.scorer not in ("scene", "labeler") or (self.scorer == "labeler" and not self.labeler):
            raise ValueError(
                f"data.scorer must be scene or labeler (labeler needs data.labeler, a model folder such as "
                f"the SFT checkpoint), got {self.scorer!r} with data.labeler={self.labeler!r}"
            )
        if self.build not in BUILDS:
            raise ValueError(f"data.build must be one of {', '.join(BUILDS)}, got {self.build!r}")
        builds_own = self.build in ("correction", "onpolicy") and self.pairs is None
        if (builds_own or self.colour_corrections) and self.notes == 0:
            what = "colour_corrections=true" if self.colour_corrections else f"build={self.build}"
            raise ValueError(
                f"data.{what} captions every note with the policy first; set data.notes to how "
                "many (e.g. 600)"
            )
        hw = self.hallucination_weight
        if not (hw >= 0 and math.isfinite(hw)):
            raise ValueError(f"data.hallucination_weight must be a finite number >= 0, got {hw}")
        aw, acw = self.attribute_weight, self.attribute_coverage_weight
        if not (aw >= 0 and math.isfinite(aw) and acw >= 0 and math.isfinite(acw)):
            raise ValueError(
                f"data.attribute_weight and data.attribute_coverage_weight must be finite numbers >= 0, got "
                f"{aw} and {acw}"
            )
        if self.colour_judge not in ("self", "labeler", "scene"):
            raise ValueError(f"data.colour_judge must be self, labeler or scene, got {self.colour_judge!r}")
        if not 0.0 < self.colour_threshold < 1.0:
            raise ValueError(f"data.colour_threshold must be in (0, 1), got {self.colour_threshold}")
        if self.colour_corrections and self.colour_judge == "labeler" and not self.labeler:
            raise ValueError(
                "data.colour_judge labeler needs data.labeler, a model folder (e.g. the SFT model)"
            )
        if self.colour_corrections and self.colour_judge == "scene" and not self.ground_truth:
            raise ValueError(
                "data.colour_judge scene judges colours on the notes' colour truth, which data.ground_truth "
                "false withholds; set data.colour_judge self or labeler"
            )
        if self.build == "none" and self.pairs is None and not self.colour_corrections:
            raise ValueError(
                "data.build none builds no caption pairs; set data.colour_corrections true or another build"
            )
        if (aw > 0 or acw > 0) and (
            self.build != "onpolicy" or (self.scorer == "scene" and not self.ground_truth)
        ):
            raise ValueError(
                f"data.attribute_weight={aw} / attribute_coverage_weight={acw} rank on-policy samples by "
                "their colours, judged on the notes' colour truth (data.scorer scene, data.ground_truth "
                "true) or by the labeler (data.scorer labeler): they need data.build onpolicy; set them to 0"
            )
        if self.samples < 2 or self.temperature <= 0:
            raise ValueError(
                f"need data.samples >= 2 and data.temperature > 0, got {self.samples}, {self.temperature}"
            )
        if self.batch_size < 1 or self.notes < 0:
            raise ValueError(
                f"need data.batch_size >= 1 and data.notes >= 0, got {self.batch_size}, {self.notes}"
            )


@dataclass(kw_only=True)
class DPOConfig:
    """Everything ``rl dpo`` needs."""

    init: InitConfig = field(default_factory=InitConfig)
    """SFT checkpoint to start from."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA (reference = adapters off) or full fine-tuning (reference = frozen copy)."""
    loss: LossConfig = field(default_factory=LossConfig)
    """DPO-family loss and mDPO terms."""
    data: DataConfig = field(default_factory=DataConfig)
    """Preference pairs."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    train: RunConfig = field(default_factory=RunConfig)
    """Steps, seed, cadence."""


# ---------------------------------------------------------------- your model and pair files


@dataclass(kw_only=True)
class ModelConfig:
    """The model to post-train: any folder :func:`mm.model.adapter.load_adapter` takes."""

    path: str = ""
    """Model folder (``--model``): a NoteVLM folder or a transformers image-text-to-text folder with its
    processor (e.g. one downloaded with ``huggingface-cli download llava-hf/llava-1.5-7b-hf --local-dir``)."""
    dtype: str | None = None
    """Weights' dtype: None = as saved; float32, bfloat16 or float16."""

    def __post_init__(self) -> None:
        if self.dtype not in (None, "float32", "bfloat16", "float16"):
            raise ValueError(f"model.dtype must be null, float32, bfloat16 or float16, got {self.dtype!r}")


@dataclass(kw_only=True)
class FilesDataConfig:
    """Preference pairs read from your JSONL file (``docs/byo.md``, "DPO on your files")."""

    pairs: str = ""
    """Pairs JSONL (``--pairs``): one object per line with image, question, chosen, rejected, optional id."""
    image_folder: str = ""
    """Folder the records' image paths are relative to (``--image-folder``; "" = the pairs file's folder)."""
    pairs_format: str = "auto"
    """Record layout (``--pairs-format``): native, rlaif-v, rlhf-v, or auto (from the first record's keys)."""
    batch_size: int = 8
    """Pairs per optimizer step (all processes together)."""
    max_answer_tokens: int = 0
    """Cut each answer to this many tokens (eos included) before scoring; 0 = keep whole answers."""

    def __post_init__(self) -> None:
        if self.pairs_format not in ("auto", "native", "rlaif-v", "rlhf-v"):
            raise ValueError(
                f"data.pairs_format must be auto, native, rlaif-v or rlhf-v, got {self.pairs_format!r}"
            )
        if self.batch_size < 1 or self.max_answer_tokens < 0:
            raise ValueError(
                f"need data.batch_size >= 1 and data.max_answer_tokens >= 0, got {self.batch_size}, "
                f"{self.max_answer_tokens}"
            )


@dataclass(kw_only=True)
class FilesLoraConfig(LoraConfig):
    """LoRA on the LM's attention and MLP projections (the adapter's family defaults), on by default."""

    enabled: bool = True
    """Train LoRA adapters (reference = adapters off); false = full fine-tuning of all but the vision
    tower (reference = a frozen copy: twice the weights in memory)."""


@dataclass(kw_only=True)
class FilesDPOConfig:
    """Everything ``rl dpo --model DIR --pairs PAIRS.jsonl`` needs (defaults: configs/rl/dpo_files.yaml)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The model folder and its dtype."""
    lora: FilesLoraConfig = field(default_factory=FilesLoraConfig)
    """LoRA (the default) or full fine-tuning."""
    loss: LossConfig = field(default_factory=LossConfig)
    """DPO-family loss and mDPO terms (conditional rows corrupt the original images, before the
    processor)."""
    data: FilesDataConfig = field(default_factory=FilesDataConfig)
    """The pairs file."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    train: RunConfig = field(default_factory=RunConfig)
    """Steps, seed, cadence, device."""

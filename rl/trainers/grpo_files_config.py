"""Config of ``rl grpo --model DIR --prompts P.jsonl``: GRPO on any model folder and a prompt file."""

from __future__ import annotations

from dataclasses import dataclass, field

from rl.importance import IS_LEVELS
from rl.labeler import LabelerConfig
from rl.rewards import RewardConfig
from rl.rollout.base import ENGINES
from rl.trainers.common import OptimConfig, RunConfig
from rl.trainers.grpo_config import AlgoConfig

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""Weight dtypes ``model.dtype`` takes (``auto``: as saved)."""


@dataclass(kw_only=True)
class ModelConfig:
    """The policy: any folder :func:`mm.model.adapter.load_adapter` takes."""

    path: str = ""
    """Model folder: a NoteVLM folder (``mm train`` OUT/model) or a transformers image-text-to-text folder
    (LLaVA, Qwen2-VL, Idefics3, ...) with its processor. ``rl grpo --model DIR`` sets it."""
    dtype: str = "auto"
    """Weights' dtype: auto (as saved), float32, bfloat16 or float16."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"model.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")


@dataclass(kw_only=True)
class FilesLoraConfig:
    """LoRA through the adapter (:meth:`VLMAdapter.apply_lora`): the LM's projections only."""

    enabled: bool = False
    """Train LoRA adapters (reference = adapters disabled) instead of every LM weight."""
    r: int = 8
    """LoRA rank."""
    alpha: int = 16
    """LoRA scaling numerator (scale = alpha / r)."""
    dropout: float = 0.0
    """Dropout on the LoRA input."""
    target_modules: list[str] | None = None
    """Leaf names inside the LM (e.g. [q_proj, v_proj]); null = the family's attention + MLP projections."""


@dataclass(kw_only=True)
class FilesDataConfig:
    """The prompt file and where its images are."""

    prompts: str = ""
    """JSONL, one prompt a line: ``image`` (a path or a list), ``question``, optional ``id`` and any other
    fields (the reward gets the whole record). ``rl grpo --prompts`` sets it."""
    image_folder: str = ""
    """Folder relative image paths start from ("" = the prompt file's folder). ``--image-folder`` sets it."""
    prompts_per_step: int = 4
    """Prompts (groups) per step; the batch is prompts_per_step * group_size completions."""

    def __post_init__(self) -> None:
        if self.prompts_per_step < 1:
            raise ValueError(f"data.prompts_per_step must be >= 1, got {self.prompts_per_step}")


@dataclass(frozen=True, kw_only=True)
class FilesRewardConfig(RewardConfig):
    """The reward: a built-in (:data:`rl.trainers.grpo_rewards.BUILTIN`) or ``module:function``, and the
    built-ins' weights (:class:`rl.rewards.RewardConfig`)."""

    fn: str = "hallucination"
    """Built-in name (hallucination, chair, yesno: they read the record's ``objects`` / ``answer``), a reward
    without ground truth (labeler: claims verified by a labeler VLM; rm:DIR: an ``rl rm`` reward model; see
    :mod:`rl.trainers.grpo_files_sourced`) or a Python callable ``module:function`` taking ``(prompt: str,
    completion: str, record: dict) -> float``. ``rl grpo --reward`` sets it."""
    vocab: str = "auto"
    """Object vocabulary of the CHAIR-style built-ins and of the labeler's claims: auto (world when it names
    every record's objects, else coco; coco for the labeler), world or coco."""
    labeler: LabelerConfig = field(default_factory=LabelerConfig)
    """The labeler of ``fn: labeler`` (its model "" = the policy's starting checkpoint)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.attribute_weight > 0 or self.attribute_coverage_weight > 0:
            raise ValueError(
                "reward.attribute_weight / attribute_coverage_weight judge colours against a note's colour "
                "truth, which prompt files do not carry (objects are names); set them to 0, or train on "
                "notes with rl grpo --config"
            )


@dataclass(kw_only=True)
class FilesRolloutConfig:
    """Sampling, the engine and the importance-sampling correction."""

    group_size: int = 8
    """G: completions per prompt."""
    max_new_tokens: int = 64
    """Longest completion; longer ones are cut (truncated)."""
    temperature: float = 1.0
    """Sampling temperature (the trainer's log-probs use the same)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = off); < 1 samples off the trainer's distribution: TIS corrects it."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off); > 0 samples off the trainer's distribution (TIS corrects)."""
    engine: str = "local"
    """local (the trainer's model, in process) or vllm (the ``vllm`` extra and a CUDA GPU)."""
    tis_cap: float = 3.0
    """Truncated importance sampling cap C: weights min(pi_trainer / pi_rollout, C) (TRL clip_max 3.0)."""
    tis_level: str = "token"
    """Importance weight per token (TRL token_truncate) or per sequence (sequence_truncate)."""
    vllm_gpu_memory_utilization: float = 0.3
    """vLLM: fraction of GPU memory for its weights and KV cache (the trainer shares the GPU)."""
    vllm_max_model_len: int | None = None
    """vLLM: longest prompt + completion (null = the model's)."""

    def __post_init__(self) -> None:
        checks = [
            (self.group_size >= 2, f"group_size must be >= 2 (a group needs a baseline): {self.group_size}"),
            (self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}"),
            (self.temperature > 0, f"temperature must be > 0, got {self.temperature}"),
            (0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}"),
            (self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}"),
            (self.engine in ENGINES, f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}"),
            (self.tis_cap > 0, f"tis_cap must be > 0, got {self.tis_cap}"),
            (self.tis_level in IS_LEVELS, f"tis_level must be one of {IS_LEVELS}, got {self.tis_level!r}"),
            (0 < self.vllm_gpu_memory_utilization <= 1, "vllm_gpu_memory_utilization must be in (0, 1]"),
        ]  # fmt: skip
        for ok, message in checks:
            if not ok:
                raise ValueError(f"rollout.{message}")


@dataclass(kw_only=True)
class GRPOFilesConfig:
    """Everything ``rl grpo --model DIR --prompts P.jsonl`` needs."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy folder."""
    lora: FilesLoraConfig = field(default_factory=FilesLoraConfig)
    """LoRA (reference = adapters off) or full fine-tuning (reference = frozen copy)."""
    data: FilesDataConfig = field(default_factory=FilesDataConfig)
    """Prompts."""
    rollout: FilesRolloutConfig = field(default_factory=FilesRolloutConfig)
    """Sampling, engine, importance correction."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantages, loss, KL, DAPO options (mention_credit must stay 0: it needs the world's notes)."""
    reward: FilesRewardConfig = field(default_factory=FilesRewardConfig)
    """The reward function and the built-ins' weights."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    train: RunConfig = field(default_factory=RunConfig)
    """Steps, seed, cadence."""

    def __post_init__(self) -> None:
        if self.algo.mention_credit != 0:
            raise ValueError("algo.mention_credit needs the world's notes; keep it 0 with --prompts")
        if self.algo.overlong_penalty and self.algo.overlong_cache > self.rollout.max_new_tokens:
            raise ValueError(
                f"algo.overlong_cache={self.algo.overlong_cache} must be <= rollout.max_new_tokens="
                f"{self.rollout.max_new_tokens}"
            )

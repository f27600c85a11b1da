"""Config of ``rl rm``: the model, LoRA or full fine-tuning, the pairs, the loss, optimiser and run."""

from __future__ import annotations

from dataclasses import dataclass, field

from rl.trainers.common import EvalRunConfig, OptimConfig
from rl.trainers.dpo_config import FilesDataConfig, FilesLoraConfig, ModelConfig


@dataclass(kw_only=True)
class RMDataConfig(FilesDataConfig):
    """Preference pairs (the files ``rl dpo --pairs`` reads) and the held-out share."""

    heldout: float = 0.1
    """Fraction of the pairs held out (seeded) to log pair accuracy on (0 = none; at least one pair when
    > 0)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.heldout < 1:
            raise ValueError(f"data.heldout must be in [0, 1), got {self.heldout}")


@dataclass(kw_only=True)
class RMLossConfig:
    """The Bradley-Terry loss (:func:`rl.trainers.rm_model.bt_loss`)."""

    center_weight: float = 0.0
    """Weight of mean((r_chosen + r_rejected)^2), which pins the reward's offset near 0 (TRL's
    center_rewards_coefficient; 0 = off)."""

    def __post_init__(self) -> None:
        if self.center_weight < 0:
            raise ValueError(f"loss.center_weight must be >= 0, got {self.center_weight}")


@dataclass(kw_only=True)
class RMLoraConfig(FilesLoraConfig):
    """LoRA on the LM's attention and MLP projections (the adapter's family defaults), on by default."""

    enabled: bool = True
    """Train LoRA adapters (and the value head); false = full fine-tuning of all but the vision tower."""


RMRunConfig = EvalRunConfig
"""Steps, seed, cadence and device, plus the held-out evaluation cadence."""


@dataclass(kw_only=True)
class RMConfig:
    """Everything ``rl rm --model DIR --pairs PAIRS.jsonl`` needs."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The VLM folder under the value head, and its dtype."""
    lora: RMLoraConfig = field(default_factory=RMLoraConfig)
    """LoRA (the default) or full fine-tuning (all but the vision tower); the head always trains."""
    loss: RMLossConfig = field(default_factory=RMLossConfig)
    """Bradley-Terry loss options."""
    data: RMDataConfig = field(default_factory=RMDataConfig)
    """The pairs file and the held-out share."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    train: RMRunConfig = field(default_factory=RMRunConfig)
    """Steps, seed, cadence, device."""

"""Config of ``rl ppo``: the GRPO sections (prompts, rollout, algo, reward, optim, run) plus the critic, the
PPO update (GAE, epochs, minibatches, value loss) and where the KL goes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from rl.labeler_reward import SourcedRewardConfig
from rl.trainers.common import InitConfig, LoraConfig, OptimConfig, RunConfig
from rl.trainers.grpo_config import AlgoConfig, DataConfig, RolloutConfig
from rl.trainers.value_head import CRITIC_KINDS

KL_MODES = ("reward", "loss")
"""Where ``algo.beta`` * KL to the reference goes: a per-token reward penalty, or a term of the loss."""

GRPO_ONLY = ("advantage", "scale", "level", "num_iterations", "dynamic_sampling")
"""``algo`` fields PPO does not read (its advantages come from GAE, its updates from ``ppo``): only their
defaults are accepted."""


@dataclass(kw_only=True)
class PPOSection:
    """GAE, the PPO epochs and minibatches, and the value loss."""

    gamma: float = 1.0
    """GAE discount (1 = none: rewards of a caption count fully wherever they fall)."""
    lam: float = 0.95
    """GAE lambda: 1 = Monte-Carlo returns, 0 = one-step TD targets."""
    epochs: int = 2
    """Passes over each rollout batch (old log-probs and old values fixed at the rollout)."""
    minibatches: int = 2
    """Minibatches per pass; the rollout's rows (prompts_per_step * group_size) must divide by it."""
    vf_coef: float = 0.1
    """Weight of the value loss added to the policy loss."""
    vf_clip: float | None = 0.5
    """Value clipping range c: the clipped term keeps V within old V +- c (null = plain squared error)."""
    whiten_advantages: bool = True
    """Whiten the GAE advantages over the batch's response tokens (mean 0, std 1)."""
    critic_lr_scale: float = 10.0
    """Learning rate of the value head (and of a separate critic) as a multiple of optim.lr: a head trained
    from scratch needs a faster rate than the policy it sits on (verl's critic runs 10x the actor's)."""

    def __post_init__(self) -> None:
        if not (0 <= self.gamma <= 1 and 0 <= self.lam <= 1):
            raise ValueError(f"need 0 <= ppo.gamma <= 1 and 0 <= ppo.lam <= 1; got {self.gamma}, {self.lam}")
        if self.epochs < 1 or self.minibatches < 1:
            raise ValueError(f"need ppo.epochs >= 1 and ppo.minibatches >= 1; got {self.epochs}, "
                             f"{self.minibatches}")  # fmt: skip
        if self.vf_coef < 0 or self.critic_lr_scale <= 0:
            raise ValueError(f"need ppo.vf_coef >= 0 and ppo.critic_lr_scale > 0; got {self.vf_coef}, "
                             f"{self.critic_lr_scale}")  # fmt: skip
        if self.vf_clip is not None and self.vf_clip <= 0:
            raise ValueError(f"ppo.vf_clip must be > 0 (null turns value clipping off), got {self.vf_clip}")


@dataclass(kw_only=True)
class KLConfig:
    """Where the KL to the reference (weight ``algo.beta``, estimator ``algo.kl_estimator``) enters."""

    mode: str = "reward"
    """reward: ``-beta * kl_t`` added to each token's reward before GAE (from the rollout's log-probs);
    loss: ``beta * agg(kl)`` added to the loss of every update, as GRPO."""

    def __post_init__(self) -> None:
        if self.mode not in KL_MODES:
            raise ValueError(f"kl.mode must be one of {', '.join(KL_MODES)}, got {self.mode!r}")


@dataclass(kw_only=True)
class PPOConfig:
    """Everything ``rl ppo`` needs."""

    init: InitConfig = field(default_factory=InitConfig)
    """SFT checkpoint the policy (and a separate critic) start from."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA (reference = adapters off; a separate critic gets its own adapters) or full fine-tuning."""
    critic: str = "shared"
    """shared: a value head on the policy's trunk; separate: a critic model built from init.model."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts (as rl grpo)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling (as rl grpo); group_size responses per prompt, no group baseline."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """The clipped policy loss, its entropy remedies, the KL weight and the dense credit weight (rl grpo's
    section; advantage, scale, level, num_iterations and dynamic_sampling keep their defaults)."""
    ppo: PPOSection = field(default_factory=PPOSection)
    """GAE, epochs, minibatches, value loss."""
    kl: KLConfig = field(default_factory=KLConfig)
    """KL as reward shaping or as a loss term."""
    reward: SourcedRewardConfig = field(default_factory=SourcedRewardConfig)
    """Hallucination reward weights and source (as rl grpo)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule (policy, head and critic together)."""
    train: RunConfig = field(default_factory=RunConfig)
    """Steps, seed, cadence."""

    def __post_init__(self) -> None:
        if self.critic not in CRITIC_KINDS:
            raise ValueError(f"critic must be one of {', '.join(CRITIC_KINDS)}, got {self.critic!r}")
        defaults = AlgoConfig()
        for name in GRPO_ONLY:
            if getattr(self.algo, name) != getattr(defaults, name):
                raise ValueError(
                    f"algo.{name} is rl grpo's; rl ppo takes its advantages from GAE and its updates from "
                    f"ppo.epochs / ppo.minibatches: remove algo.{name}"
                )
        rows = self.data.prompts_per_step * self.rollout.group_size
        if rows % self.ppo.minibatches:
            raise ValueError(
                f"the rollout's {rows} rows (data.prompts_per_step * rollout.group_size) do not split into "
                f"ppo.minibatches={self.ppo.minibatches}; pick a divisor of {rows}"
            )
        if self.reward.source.startswith("rm:") and self.algo.mention_credit > 0:
            raise ValueError("reward.source rm:DIR gives one reward per response: set algo.mention_credit=0")
        if self.algo.overlong_penalty and self.algo.overlong_cache > self.rollout.max_new_tokens:
            raise ValueError(
                f"algo.overlong_cache={self.algo.overlong_cache} must be <= rollout.max_new_tokens="
                f"{self.rollout.max_new_tokens}"
            )

    def loss_algo(self) -> AlgoConfig:
        """``algo`` as the policy loss reads it: without the KL term when the KL is a reward penalty."""
        return self.algo if self.kl.mode == "loss" else dataclasses.replace(self.algo, beta=0.0)

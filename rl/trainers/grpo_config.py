"""Config of ``rl grpo``: prompts, rollout, the GRPO/DAPO/GSPO algorithm, reward, optimiser and run."""

from __future__ import annotations

from dataclasses import dataclass, field

from rl.advantages import ADVANTAGE_SCALES
from rl.importance import IS_LEVELS
from rl.kl import KL_KINDS
from rl.labeler_reward import SourcedRewardConfig
from rl.losses import AGG_MODES
from rl.trainers.common import InitConfig, LoraConfig, OptimConfig, RunConfig
from rl.trainers.rollout import SAMPLERS

PROMPT_KINDS = ("caption", "question", "pope_question")
"""What :class:`PromptSet` can ask."""


@dataclass(kw_only=True)
class DataConfig:
    """Prompts: captions and/or yes/no object questions about the notes of a split."""

    folder: str = "runs/data/world"
    """Note folder (notes.jsonl + images)."""
    split: str = "train"
    """Split the prompts come from."""
    notes: int = 0
    """Use the first n notes with objects (0 = all)."""
    tasks: list[str] = field(default_factory=lambda: ["caption"])
    """Prompt kinds: caption (scene reward), question (the notes' yes/no questions) and/or pope_question
    (POPE-style questions about one image, adversarial negatives: mm.train.tasks.pope_question_samples);
    questions get the yes/no reward."""
    caption_prompt: str = "Describe the note."
    """The captioning prompt (the SFT one)."""
    questions_per_note: int = 2
    """Most yes/no questions per note used as prompts (of each question kind)."""
    prompts_per_step: int = 4
    """Prompts (groups) per step; the batch is prompts_per_step * group_size responses."""
    ground_truth: bool = True
    """false: the prompts' notes come stripped of their ground truth (rl.ground_truth): the reward must
    need none (reward.source labeler or rm:DIR, data.tasks [caption]); a read of it raises."""

    def __post_init__(self) -> None:
        bad = [t for t in self.tasks if t not in PROMPT_KINDS]
        if bad or not self.tasks:
            raise ValueError(
                f"data.tasks must be a non-empty subset of {list(PROMPT_KINDS)}, got {self.tasks}"
            )
        if self.prompts_per_step < 1 or self.notes < 0 or self.questions_per_note < 0:
            raise ValueError("need data.prompts_per_step >= 1, data.notes >= 0, data.questions_per_note >= 0")


@dataclass(kw_only=True)
class RolloutConfig:
    """Sampling of the responses."""

    group_size: int = 8
    """G: responses per prompt."""
    max_new_tokens: int = 64
    """Longest response; longer ones are cut (truncated)."""
    temperature: float = 1.0
    """Sampling temperature (the log-probs use the same)."""
    top_p: float = 1.0
    """Nucleus sampling mass (1 = off); < 1 samples off the trainer's distribution (TIS corrects it)."""
    top_k: int = 0
    """Keep the k most likely tokens (0 = off); > 0 samples off the trainer's distribution (TIS corrects)."""
    tis_cap: float = 3.0
    """Truncated importance sampling cap C (rl.importance): when the sampling distribution is not the
    trainer's, each token's loss is weighted by min(pi_old / pi_sampling, C)."""
    tis_level: str = "token"
    """Importance weight per token (TRL token_truncate) or per sequence (sequence_truncate)."""
    sampler: str = "inverse_cdf"
    """How a token is drawn (``rl.trainers.rollout.SAMPLERS``): ``inverse_cdf`` (fast, the same
    distribution) or ``multinomial`` (exactly HF ``generate``'s tokens for the same seed)."""

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS:
            raise ValueError(f"rollout.sampler must be one of {', '.join(SAMPLERS)}, got {self.sampler!r}")
        if self.group_size < 2:
            raise ValueError(
                f"rollout.group_size must be >= 2 (a group needs a baseline), got {self.group_size}"
            )
        if self.max_new_tokens < 1 or self.temperature <= 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("need rollout.max_new_tokens >= 1, temperature > 0, 0 < top_p <= 1, top_k >= 0")
        if self.tis_cap <= 0 or self.tis_level not in IS_LEVELS:
            raise ValueError(f"need rollout.tis_cap > 0 and tis_level in {IS_LEVELS}; got {self.tis_cap}, "
                             f"{self.tis_level!r}")  # fmt: skip


@dataclass(kw_only=True)
class AlgoConfig:
    """Advantages, the clipped loss, KL and DAPO options."""

    advantage: str = "grpo"
    """grpo (group mean baseline, scaled by `scale`) or rloo (leave-one-out baseline)."""
    scale: str = "group"
    """GRPO advantage scaling: group (std of the group), batch (std of the batch) or none (Dr. GRPO)."""
    eps_low: float = 0.2
    """Lower clip range: ratio >= 1 - eps_low."""
    eps_high: float = 0.2
    """Upper clip range: ratio <= 1 + eps_high (DAPO clip-higher: 0.28)."""
    dual_clip: float | None = None
    """Dual-clip constant c > 1 for negative advantages (verl clip_ratio_c = 3); null = off."""
    level: str = "token"
    """Importance ratio per token (GRPO) or per sequence (GSPO)."""
    agg: str = "token-mean"
    """Loss aggregation: token-mean, seq-mean-token-mean, seq-mean-token-sum, seq-mean-token-sum-norm."""
    beta: float = 0.0
    """KL weight to the reference (0 = no reference model at all, as DAPO / Dr. GRPO)."""
    kl_estimator: str = "k3"
    """KL estimator: k1, k2, k3 or low_var_kl."""
    num_iterations: int = 1
    """Updates per rollout batch (mu); > 1 computes old log-probs before the first update."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling: drop all-equal-reward groups and sample more prompts to fill the batch."""
    max_sample_batches: int = 4
    """Dynamic sampling budget: prompt batches sampled per step at most."""
    overlong_penalty: bool = False
    """DAPO soft overlong penalty added to the reward."""
    overlong_cache: int = 16
    """Length of the penalty window before max_new_tokens (tokens)."""
    overlong_factor: float = 1.0
    """Penalty at max_new_tokens (reward - factor)."""
    mention_credit: float = 0.0
    """Weight of the dense per-mention credit (:func:`rl.rewards.mention_credits`: the caption reward
    spread over the words that earned it) added to each caption token's advantage, in reward units
    (0 = off, plain GRPO; needs ``level: token``)."""
    colour_in_sequence: bool = True
    """With the colour terms on (``reward.attribute_weight`` / ``_coverage_weight``, scene or labeler):
    true = they count in each caption's reward (its group advantage) and in the per-token credit; false =
    in the per-token credit only, on the colour words, so a caption is not pushed to name fewer objects
    to state fewer colours (needs ``mention_credit`` > 0)."""
    loss_mode: str = "clip"
    """Policy loss (:mod:`rl.entropy`): clip (PPO-clip), clip_cov or kl_cov (verl's Clip-Cov / KL-Cov,
    entropy-collapse remedies; need ``level: token``; ignore ``dual_clip``; kl_cov ignores the clip range)."""
    clip_cov_ratio: float = 0.0002
    """Clip-Cov: share of response tokens whose gradient is dropped (verl clip_cov_ratio)."""
    clip_cov_lb: float = 1.0
    """Clip-Cov: lower bound of the covariance window tokens are drawn from (verl clip_cov_lb)."""
    clip_cov_ub: float = 5.0
    """Clip-Cov: upper bound of that window (verl clip_cov_ub)."""
    kl_cov_ratio: float = 0.0002
    """KL-Cov: share of response tokens (largest covariance) given the |log-ratio| penalty
    (verl kl_cov_ratio)."""
    ppo_kl_coef: float = 1.0
    """KL-Cov: weight of that penalty (verl ppo_kl_coef)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus subtracted from the loss (0 = off)."""
    forking_top: float = 1.0
    """Train only on this top share of response tokens by entropy, per batch (1 = all; 0.2 as Wang et al.)."""

    def __post_init__(self) -> None:
        checks = [
            (
                self.advantage in ("grpo", "rloo"),
                f"algo.advantage must be grpo or rloo, got {self.advantage!r}",
            ),
            (
                self.scale in ADVANTAGE_SCALES,
                f"algo.scale must be one of {ADVANTAGE_SCALES}, got {self.scale!r}",
            ),
            (
                self.level in ("token", "sequence"),
                f"algo.level must be token or sequence, got {self.level!r}",
            ),
            (self.agg in AGG_MODES, f"algo.agg must be one of {AGG_MODES}, got {self.agg!r}"),
            (self.kl_estimator in KL_KINDS, f"algo.kl_estimator must be one of {KL_KINDS}"),
            (
                0 <= self.eps_low < 1 and self.eps_high >= 0,
                "need 0 <= algo.eps_low < 1 and algo.eps_high >= 0",
            ),
            (
                self.dual_clip is None or self.dual_clip > 1,
                f"algo.dual_clip must be > 1, got {self.dual_clip}",
            ),
            (self.beta >= 0, f"algo.beta (KL weight) must be >= 0, got {self.beta}"),
            (
                self.num_iterations >= 1 and self.max_sample_batches >= 1,
                "need num_iterations, max_sample_batches >= 1",
            ),
            (self.overlong_cache >= 1, f"algo.overlong_cache must be >= 1, got {self.overlong_cache}"),
            (self.mention_credit >= 0, f"algo.mention_credit must be >= 0, got {self.mention_credit}"),
            (
                self.colour_in_sequence or self.mention_credit > 0,
                "algo.colour_in_sequence=false puts the colour terms in the per-token credit only: it needs "
                "algo.mention_credit > 0",
            ),
            (
                self.mention_credit == 0 or self.level == "token",
                "algo.mention_credit gives token-level advantages: it needs algo.level=token",
            ),
        ]
        checks += [
            (
                self.loss_mode in ("clip", "clip_cov", "kl_cov"),
                f"algo.loss_mode must be clip, clip_cov or kl_cov, got {self.loss_mode!r}",
            ),
            (
                self.loss_mode == "clip" or self.level == "token",
                f"algo.loss_mode={self.loss_mode} works on token ratios: it needs algo.level=token",
            ),
            (
                self.clip_cov_ratio > 0 and self.kl_cov_ratio > 0 and self.clip_cov_lb < self.clip_cov_ub,
                "need algo.clip_cov_ratio > 0, algo.kl_cov_ratio > 0 and algo.clip_cov_lb < algo.clip_cov_ub",
            ),
            (self.ppo_kl_coef >= 0, f"algo.ppo_kl_coef must be >= 0, got {self.ppo_kl_coef}"),
            (self.entropy_coef >= 0, f"algo.entropy_coef must be >= 0, got {self.entropy_coef}"),
            (0 < self.forking_top <= 1, f"algo.forking_top must be in (0, 1], got {self.forking_top}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass(kw_only=True)
class GRPOConfig:
    """Everything ``rl grpo`` needs."""

    init: InitConfig = field(default_factory=InitConfig)
    """SFT checkpoint to start from."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA (reference = adapters off) or full fine-tuning (reference = frozen copy)."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantages, loss, KL, DAPO options."""
    reward: SourcedRewardConfig = field(default_factory=SourcedRewardConfig)
    """Hallucination reward weights (rl.rewards.RewardConfig) and source: scene, labeler or rm:DIR
    (rl.labeler_reward)."""
    optim: OptimConfig = field(default_factory=OptimConfig)
    """Optimizer and schedule."""
    train: RunConfig = field(default_factory=RunConfig)
    """Steps, seed, cadence."""

    def __post_init__(self) -> None:
        if self.algo.loss_mode == "kl_cov" and self.algo.num_iterations == 1:
            raise ValueError(
                "algo.loss_mode=kl_cov with algo.num_iterations=1 is plain unclipped GRPO: the old log-probs "
                "are the current ones, so the |log pi - log pi_old| penalty is 0 with a 0 gradient; set "
                "algo.num_iterations >= 2 or use clip_cov"
            )
        colours = self.reward.attribute_weight > 0 or self.reward.attribute_coverage_weight > 0
        scene = self.reward.source == "scene"
        if colours and not (self.reward.source == "labeler" or (scene and self.data.ground_truth)):
            raise ValueError(
                "reward.attribute_weight / attribute_coverage_weight judge colours against the notes' ground "
                "truth (reward.source scene, data.ground_truth true) or by asking the labeler (reward.source "
                "labeler); a reward model has no colour term: set them to 0"
            )
        if self.reward.source.startswith("rm:") and self.algo.mention_credit > 0:
            raise ValueError("reward.source rm:DIR gives one reward per response: set algo.mention_credit=0")
        if self.algo.overlong_penalty and self.algo.overlong_cache > self.rollout.max_new_tokens:
            raise ValueError(
                f"algo.overlong_cache={self.algo.overlong_cache} must be <= rollout.max_new_tokens="
                f"{self.rollout.max_new_tokens}"
            )

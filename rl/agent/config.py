"""The typed config of ``rl agent``: policy, world tasks, loop, cold start, baseline, GRPO, PPO, eval.

    cfg = load_config(AgentRunConfig, "configs/rl/agent_tiny.yaml", ["grpo.steps=4"])

Unknown keys and wrong types are errors (``mm.config``); cross-field checks say how to fix a value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from mm.train.devices import DEVICE_PATTERN
from rl.advantages import ADVANTAGE_SCALES
from rl.agent.perception import PERCEPTION_VIEWS
from rl.agent.simulator import SimulatorConfig
from rl.agent.task import KINDS
from rl.agent.world_demos import CAPTION_ZOOMS, CHANGE_ZOOMS, DETAIL_ZOOMS, DIALOGUE_ZOOMS, KNOB_TOOL_MODULES
from rl.agent.world_tasks import SPLITS, WorldTaskConfig
from rl.losses import AGG_MODES
from rl.pipeline import StageSpec
from rl.trainers.grpo_files_config import DTYPES, FilesLoraConfig
from rl.trainers.ppo_config import PPOSection


@dataclass(kw_only=True)
class PolicyConfig:
    """The policy every stage starts from: a NoteVLM built from a spec, or any adapter folder."""

    spec: str = "configs/mm/notevlm_tiny.yaml"
    """NoteVLM spec YAML (``mm.model.factory.NoteVLMSpec``), built at random init (ignored with init)."""
    overrides: list[str] = field(default_factory=lambda: ["max_images=8", "max_length=1024"])
    """``key=value`` overrides of the spec (each zoom adds an image: leave room for the note's and the
    zooms'). With ``init``, a loaded NoteVLM takes only ``max_images`` and ``max_length``, each raised to at
    least that value, and ``image_index_embeddings=true`` (fresh slot embeddings, seeded by ``seed``;
    ``rl.agent.policy_init``); other families take none."""
    init: str | None = None
    """A model folder (NoteVLM or a transformers family the agent backend supports) instead of the spec."""
    seed: int = 0
    """Seed of the random init (and of fresh index rows added to a loaded model)."""
    device: str = "cpu"
    """Where every stage runs the policy: cpu, cuda (the current GPU), cuda:N or auto (cuda when a GPU is
    visible). Not part of what a resumed run must keep."""
    dtype: str = "auto"
    """The policy's weights: auto (as saved), float32, bfloat16 or float16. bfloat16 halves the memory; under
    full fine-tuning AdamW then updates bfloat16 weights, so train large models with ``lora.enabled``."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (transformers' non-reentrant checkpointing): less memory
    for long trajectories of a large model, the same gradients, more time."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"policy.dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not DEVICE_PATTERN.fullmatch(self.device):
            raise ValueError(f"policy.device must be auto, cpu, cuda or cuda:N, got {self.device!r}")


@dataclass(kw_only=True)
class DataConfig:
    """Which world tasks train the policies."""

    kinds: list[str] = field(default_factory=lambda: list(KINDS))
    """Task kinds of the training mix and of the eval (detail, change, caption, dialogue)."""
    train_tasks: int = 256
    """Tasks of the train split (cycling through kinds, one note each) for the SFTs and GRPO."""
    mix: list[str] | None = None
    """The training tasks' cycle of kinds, a kind given k times making k of each cycle's tasks (``[detail,
    detail, change, caption, dialogue]``: two in five are detail tasks); null: ``kinds`` once each. Only the
    training tasks: the eval asks each of ``kinds`` alike."""
    bare_answers: bool = True
    """Detail answers and dialogue replies of the demonstrations state the value only ("It is red.",
    "There are 2 in all."), not the object's name, which a small policy tends to misname."""
    detail_reasoning: bool = False
    """Detail demonstrations answer in two parts: what lies on the zoomed tray, in the world's caption
    grammar (which a note model trained on the world's tray crops already writes), then the value in an
    ``<answer>`` block, the only part that is scored ("On the tray are a tiny red cup and two tiny shells
    (blue and green). <answer>It is red.</answer>"): the policy looks the asked object up in its own words
    instead of among the image tokens."""
    detail_zoom: str = "tray"
    """Where detail demonstrations zoom: "tray" (the tray the tiny objects lie on, findable in the
    downsampled view), "target" (the asked objects' box, a few pixels in the view) or "photo_tray" (in a
    note of several photos, the whole asked photo first, so it is the last image the policy saw before it
    aims at the tray; then the tray), or "tiles" (the ``tiles`` tool, ``rl.agent.tiles`` in ``tool_modules``,
    on the tray, one tile per tray cell, each at the tower's size; the answer first says what each tile
    holds, then gives the value in an ``<answer>`` block; the no-tool baseline answers the value alone), or
    "photo_tiles" (the tiles of the whole asked photo first, then "The tray is in tile k." and the tray's
    tiles, then the same answer), or "objects" (the ``objects`` tool, ``rl.agent.objects`` in
    ``tool_modules``, on the tray: each tiny object cut out alone; the answer first says what each one is,
    then gives the value in an ``<answer>`` block; the no-tool baseline answers the value alone), or
    "photo_objects" (the same on the whole asked photo, its small objects only: no box to find), or "find"
    (the ``find`` tool, ``rl.agent.find`` in ``tool_modules``, on the whole asked photo for the asked thing in
    the question's words: the regions the policy's starting model names so, then the answer)."""
    caption_zoom: str = "objects"
    """Where caption demonstrations zoom: "objects" (the tiny objects' padded box, to the pixel) or "tray"
    (the whole tray, as detail and dialogue demonstrations take it)."""
    change_zoom: str = "object"
    """Where change demonstrations zoom after ``compare``: "object" (the changed object's padded box in each
    photo that has it), "region" (the first region ``compare`` lists, in both photos, its numbers copied
    from the observation) or "compare" (no zoom: ``compare`` with ``"zoom": true`` shows the changed area
    of both photos)."""
    dialogue_zoom: str = "goal"
    """Which photos' trays dialogue demonstrations zoom on: "goal" (those holding the goal's objects, which
    the policy cannot tell from the downsampled view) or "all" (every photo's)."""
    file: str | None = None
    """A task file of your own (``rl.agent.task_file``: a note's images and text, a question, its accepted
    answers, optionally the tool calls of a demonstration) whose tasks train both SFTs and GRPO instead of
    world tasks. Every task of the file trains; ``kinds``, ``train_tasks`` and the ``*_zoom`` settings are
    the world's and do not apply. Needs ``eval.file`` (your held-out tasks)."""
    image_folder: str | None = None
    """Folder the image paths of ``file`` and ``eval.file`` are relative to (default: each file's folder)."""
    max_side: int = 1024
    """Longest side, in pixels, a task file's image is read at (larger photos are shrunk on read; 0 keeps
    them whole): the full resolution ``zoom`` crops from."""
    image_cache: str | None = None
    """A folder where the task files' images are kept decoded (``mm.data.image_cache``), memory-mapped
    instead of held in RAM: for files whose photos do not fit in memory (about ``3 * max_side**2`` bytes
    each), and a resumed or repeated run maps them instead of decoding again. Shared safely between runs;
    null keeps them in memory."""
    dialogue_recovery: float = 0.0
    """Share of dialogue demonstrations that start with a mistake kept out of the loss (zooms on all but the
    last of those photos, a wrong reply, the user's objection) and then recover (the missed zoom, the right
    replies): the state after an objection, which a demonstration that is never wrong does not show.
    Drawn per task from its id, the same for every training seed."""

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in KINDS]
        if bad or not self.kinds:
            raise ValueError(f"data.kinds must be a non-empty subset of {list(KINDS)}, got {self.kinds}")
        if self.mix is not None and (not self.mix or set(self.mix) != set(self.kinds)):
            raise ValueError(
                f"data.mix must name each of data.kinds {self.kinds} at least once and nothing else, got "
                f"{self.mix}"
            )
        if self.detail_zoom not in DETAIL_ZOOMS:
            raise ValueError(f"data.detail_zoom must be one of {DETAIL_ZOOMS}, got {self.detail_zoom!r}")
        if self.caption_zoom not in CAPTION_ZOOMS:
            raise ValueError(f"data.caption_zoom must be one of {CAPTION_ZOOMS}, got {self.caption_zoom!r}")
        if self.change_zoom not in CHANGE_ZOOMS:
            raise ValueError(f"data.change_zoom must be one of {CHANGE_ZOOMS}, got {self.change_zoom!r}")
        if self.dialogue_zoom not in DIALOGUE_ZOOMS:
            raise ValueError(
                f"data.dialogue_zoom must be one of {DIALOGUE_ZOOMS}, got {self.dialogue_zoom!r}"
            )
        if self.train_tasks < 1:
            raise ValueError(f"data.train_tasks must be >= 1, got {self.train_tasks}")
        if not 0.0 <= self.dialogue_recovery <= 1.0:
            raise ValueError(f"data.dialogue_recovery must be in [0, 1], got {self.dialogue_recovery}")
        if self.dialogue_zoom == "find" and self.dialogue_recovery:
            raise ValueError(
                "data.dialogue_zoom=find has no recovery demonstrations; set data.dialogue_recovery=0 or "
                "another dialogue_zoom"
            )
        if self.max_side < 0:
            raise ValueError(f"data.max_side must be >= 0 (0 keeps images whole), got {self.max_side}")


@dataclass(kw_only=True)
class RolloutConfig:
    """Limits of one trajectory (``rl.agent.loop.LoopConfig``)."""

    max_turns: int = 8
    """Most policy turns (tool calls and dialogue replies count)."""
    max_new_tokens: int = 128
    """Most tokens of one policy turn."""
    max_tokens: int = 384
    """Most policy tokens of a trajectory."""
    max_length: int | None = 1024
    """Most ids of a trajectory, prompt and observations included (the model's context); null = no limit."""
    batch_size: int = 16
    """Trajectories generated together."""
    user_patience: int = 2
    """Wrong replies the simulated user tolerates in a dialogue."""
    user_max_turns: int = 4
    """Most replies of the policy the simulated user reads."""

    def simulator(self) -> SimulatorConfig:
        return SimulatorConfig(patience=self.user_patience, max_turns=self.user_max_turns)


@dataclass(kw_only=True)
class DecodeConfig:
    """How the tool models write their turns, in GRPO's rollouts and every eval of a tool model (a late
    section: changing it re-runs GRPO on the run's SFT models)."""

    quote: dict[str, list[str]] = field(default_factory=dict)
    """Tool -> arguments whose values are quotes of the user's words, constrained at decode time
    (:mod:`rl.agent.quote`): ``{find: [object]}``. Empty (the default): free."""
    counts: bool = False
    """Number words in answers copy a count phrase of the trajectory's tool observations, constrained at
    decode time (:mod:`rl.agent.counts`; for tools that count, e.g. ``find`` with ``labels``)."""

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.quote.items() if not v or not all(isinstance(a, str) and a for a in v)}
        if bad:
            raise ValueError(
                f"decode.quote maps a tool to the names of its quoted arguments, e.g. {{find: [object]}}; "
                f"got {bad}"
            )


@dataclass(kw_only=True)
class PerceptionConfig:
    """Single-turn reading of world images (``rl.agent.perception``) before both SFT stages, which start
    from its model: the no-tool baseline can read a zoom crop as well as the tool policy, it never gets
    one."""

    steps: int = 0
    """Optimizer steps (0 skips the stage: both SFTs start from the initial policy)."""
    notes: int = 400
    """Train notes whose photos make the items (every photo, every question of ``views``)."""
    views: list[str] = field(default_factory=lambda: list(PERCEPTION_VIEWS))
    """What items show: "tray" (a tray zoom crop), "target" (a target zoom crop), "view" (the photo)."""
    batch_size: int = 32
    """Items per step."""
    lr: float = 1.0e-3
    """AdamW learning rate (constant)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 = off)."""
    log_every: int = 50
    """Steps between metric records."""
    check_notes: int = 0
    """Further train notes (after the training ones) whose tray and target items the stage answers
    greedily at its end: reading accuracy per view and question, in its result.json (0 = no check)."""

    def __post_init__(self) -> None:
        bad = [v for v in self.views if v not in PERCEPTION_VIEWS]
        if bad or not self.views:
            raise ValueError(
                f"perception.views must be a non-empty subset of {list(PERCEPTION_VIEWS)}, got {self.views}"
            )
        if self.steps < 0 or self.notes < 1 or self.batch_size < 1 or self.log_every < 1:
            raise ValueError(
                "perception needs steps >= 0, notes >= 1, batch_size >= 1 and log_every >= 1; got "
                f"{self.steps}, {self.notes}, {self.batch_size}, {self.log_every}"
            )
        if self.check_notes < 0:
            raise ValueError(f"perception.check_notes must be >= 0, got {self.check_notes}")


SFT_SCHEDULES = ("constant", "cosine")
"""The SFT stages' learning-rate schedules (:attr:`SFTConfig.schedule`)."""


@dataclass(kw_only=True)
class SFTConfig:
    """Supervised training on demonstrations (the tool cold start and the no-tool baseline alike)."""

    steps: int = 200
    """Optimizer steps (the same for both SFT models: the same budget)."""
    batch_size: int = 8
    """Demonstrations per step."""
    lr: float = 1.0e-3
    """AdamW learning rate (the peak under ``schedule: cosine``)."""
    schedule: str = "constant"
    """The learning rate over the steps: ``constant``, or ``cosine`` (linear warm-up over ``warmup_steps``,
    then a cosine decay to 0 at the last step: the same steps end on a lower, less noisy loss)."""
    warmup_steps: int = 0
    """Steps of linear warm-up from ``lr / warmup_steps`` under ``schedule: cosine``."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 = off)."""
    log_every: int = 10
    """Steps between metric records."""
    call_weight: float = 1.0
    """How many times each token of a turn that calls a tool counts in the token mean (the photo and the
    box are a few tokens beside long answers); 1 = a plain token mean. No-tool demonstrations make no
    calls, so it changes only the tool SFT."""
    micro_batch_size: int = 0
    """Trajectories per forward and backward pass, the gradients accumulated to the whole step's
    (``rl.agent.micro``; the same gradient, tested): what a large policy's memory allows. 0 = the whole
    step at once."""
    lead_kinds: list[str] = field(default_factory=list)
    """A curriculum: the first ``lead_steps`` steps draw their demonstrations from the training tasks of
    these kinds only (e.g. ``[detail]``: the copy of the asked thing into the call first); then all."""
    lead_steps: int = 0
    """Steps of the curriculum's lead (0 = none)."""

    def __post_init__(self) -> None:
        if not 0 <= self.lead_steps < self.steps or bool(self.lead_steps) != bool(self.lead_kinds):
            raise ValueError(
                f"sft.lead_steps must be >= 0 and below sft.steps ({self.steps}), and sft.lead_kinds given "
                f"exactly when it is above 0; got {self.lead_steps} and {self.lead_kinds}"
            )
        if self.micro_batch_size < 0:
            raise ValueError(
                f"sft.micro_batch_size must be >= 0 (0 = the whole batch), got {self.micro_batch_size}"
            )
        if self.steps < 1 or self.batch_size < 1 or self.log_every < 1:
            raise ValueError(
                f"sft.steps, sft.batch_size and sft.log_every must be >= 1, got "
                f"{self.steps}, {self.batch_size}, {self.log_every}"
            )
        if self.call_weight <= 0:
            raise ValueError(f"sft.call_weight must be > 0, got {self.call_weight}")
        if self.schedule not in SFT_SCHEDULES:
            raise ValueError(f"sft.schedule must be one of {SFT_SCHEDULES}, got {self.schedule!r}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(
                f"sft.warmup_steps must be >= 0 and below sft.steps ({self.steps}), got {self.warmup_steps}"
            )


@dataclass(kw_only=True)
class GRPOStageConfig:
    """Multi-turn GRPO over whole trajectories, from the tool SFT model."""

    steps: int = 50
    """Optimizer steps (0 skips GRPO: the tool GRPO model is the tool SFT model)."""
    tasks_per_step: int = 4
    """Tasks per step; each is rolled out group_size times."""
    group_size: int = 4
    """Trajectories per task (advantages are centred within the group)."""
    temperature: float = 1.0
    """Sampling temperature of the rollouts."""
    top_p: float = 1.0
    """Nucleus mass of the rollouts."""
    lr: float = 1.0e-4
    """AdamW learning rate (constant)."""
    grad_clip: float = 1.0
    """Global gradient-norm clip (0 = off)."""
    scale: str = "group"
    """Advantage scaling: group, batch or none (``rl.advantages.group_advantages``)."""
    eps_low: float = 0.2
    """Lower ratio clip."""
    eps_high: float | None = 0.28
    """Upper ratio clip (DAPO clip-higher); null = eps_low."""
    agg: str = "token-mean"
    """Token-loss aggregation (``rl.losses.aggregate_loss``)."""
    invalid_call_penalty: float = 0.1
    """Reward subtracted per malformed, unknown or failing tool call."""
    truncation_penalty: float = 0.1
    """Reward subtracted from a trajectory that ends without an answer (out of turns or tokens; a turn that
    runs to its budget inside an unclosed ``<tool>`` is no call, so without this it escapes the call
    penalty)."""
    hallucination_weight: float = 0.5
    """Caption tasks: reward minus this times the share of judged attribute/count claims that are false."""
    count_weight: float = 0.0
    """Caption tasks: reward minus this times the share of judged count claims that are false, beside
    ``hallucination_weight``'s term (where the few count claims weigh little against the many colours;
    0 = off)."""
    turn_reward_weight: float = 0.0
    """Dialogues: reward plus this times the mean turn-level score the simulated user gave (0 = off)."""
    zoom_reward_weight: float = 0.0
    """Tasks that name where their answer is (world detail and caption tasks): reward plus this when the
    first tool call zooms there (``rl.agent.scoring.zoom_on_target``), a shaping term for finding the place
    apart from reading it (0 = off)."""
    turn_credit: float = 0.0
    """Dialogues: turn-level credit. Each turn's tokens get the trajectory's advantage plus this times the
    turn's own (the user's score of the reply that closes it, centred on the group's judged turns:
    ``rl.agent.train.turn_advantages``), so a right first reply is credited apart from a wrong second."""
    checkpoint_every: int = 5
    """Steps between resumable checkpoints (model, optimizer, step)."""
    micro_batch_size: int = 0
    """Trajectories per forward and backward pass, the gradients accumulated to the whole step's
    (``rl.agent.micro``; the same gradient, tested): what a large policy's memory allows. 0 = the whole
    step at once."""

    def __post_init__(self) -> None:
        if self.micro_batch_size < 0:
            raise ValueError(
                f"grpo.micro_batch_size must be >= 0 (0 = the whole batch), got {self.micro_batch_size}"
            )
        if self.steps < 0 or self.tasks_per_step < 1 or self.group_size < 2 or self.checkpoint_every < 1:
            raise ValueError(
                "grpo needs steps >= 0, tasks_per_step >= 1, group_size >= 2 and checkpoint_every >= 1; got "
                f"{self.steps}, {self.tasks_per_step}, {self.group_size}, {self.checkpoint_every}"
            )
        if self.scale not in ADVANTAGE_SCALES:
            raise ValueError(f"grpo.scale must be one of {ADVANTAGE_SCALES}, got {self.scale!r}")
        if self.turn_credit < 0 or self.zoom_reward_weight < 0:
            raise ValueError(
                f"grpo.turn_credit and grpo.zoom_reward_weight must be >= 0, got {self.turn_credit}, "
                f"{self.zoom_reward_weight}"
            )
        if self.agg not in AGG_MODES:
            raise ValueError(f"grpo.agg must be one of {AGG_MODES}, got {self.agg!r}")


@dataclass(kw_only=True)
class AgentPPOConfig(PPOSection):
    """Multi-turn PPO with a critic (a value head on the policy's trunk), from the tool SFT model, beside GRPO
    (``rl.agent.ppo``). Sampling (temperature, top_p) and the trajectory reward are the grpo section's, so
    the two differ only in the advantage: GAE over the policy tokens against GRPO's group baseline."""

    steps: int = 0
    """Rollout steps (0 = no PPO stage: nothing trained or evaluated)."""
    lam: float = 1.0
    """GAE lambda; 1 (verl's default) = Monte-Carlo returns, the head (trained from scratch) a baseline
    rather than a bootstrap."""
    tasks_per_step: int = 4
    """Tasks per step."""
    samples_per_task: int = 4
    """Trajectories sampled per task (GRPO's group size gives the same rollout budget; PPO needs no group)."""
    lr: float = 1.0e-4
    """AdamW learning rate of the policy (constant); the value head's is lr * critic_lr_scale."""
    grad_clip: float = 1.0
    """Global gradient-norm clip of each update (0 = off)."""
    eps_low: float = 0.2
    """Lower ratio clip."""
    eps_high: float | None = 0.28
    """Upper ratio clip (DAPO clip-higher); null = eps_low."""
    agg: str = "token-mean"
    """Token-loss aggregation of the policy loss (``rl.losses.aggregate_loss``)."""
    checkpoint_every: int = 5
    """Steps between resumable checkpoints (model, value head, optimizer, step)."""
    micro_batch_size: int = 0
    """Trajectories per forward pass, in the rollout's value pass and in each update, the gradients
    accumulated to the minibatch's (``rl.agent.ppo``; the same gradient, tested). 0 = a whole minibatch
    at once."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.micro_batch_size < 0:
            raise ValueError(
                f"ppo.micro_batch_size must be >= 0 (0 = the whole minibatch), got {self.micro_batch_size}"
            )
        if (
            self.steps < 0
            or self.tasks_per_step < 1
            or self.samples_per_task < 1
            or self.checkpoint_every < 1
        ):
            raise ValueError(
                "ppo needs steps >= 0, tasks_per_step >= 1, samples_per_task >= 1 and checkpoint_every >= 1; "
                f"got {self.steps}, {self.tasks_per_step}, {self.samples_per_task}, {self.checkpoint_every}"
            )
        rows = self.tasks_per_step * self.samples_per_task
        if rows % self.minibatches:
            raise ValueError(
                f"ppo.minibatches={self.minibatches} must divide the {rows} trajectories of a step "
                "(tasks_per_step * samples_per_task)"
            )
        if self.agg not in AGG_MODES:
            raise ValueError(f"ppo.agg must be one of {AGG_MODES}, got {self.agg!r}")


@dataclass(kw_only=True)
class EvalConfig:
    """Held-out eval on the test split of the world."""

    seeds: list[int] = field(default_factory=lambda: [0])
    """World seeds whose test split is evaluated (the judged report wants 0, 1 and 2)."""
    tasks_per_kind: int = 32
    """Test tasks of each kind per seed."""
    n_boot: int = 1000
    """Bootstrap resamples of the 95% intervals (units: tasks)."""
    transcripts: int = 2
    """Trajectories per kind written to transcripts.md (of the tool GRPO model)."""
    split: str = "test"
    """Notes evaluated: "test" (held out: the judged report) or "train" (a check on the training split,
    e.g. from ``start`` past the training tasks' notes; never a held-out figure)."""
    start: int = 0
    """First note index of the evaluated split (each kind's tasks come from notes start, start + 1, ...)."""
    file: str | None = None
    """A task file of your own (``rl.agent.task_file``) whose tasks are the held-out eval instead of world
    tasks: each task once, read with ``data.image_folder`` and ``data.max_side``; ``seeds``,
    ``tasks_per_kind``, ``split`` and ``start`` then do not apply, and the report has no world targets."""

    def __post_init__(self) -> None:
        if not self.seeds or self.tasks_per_kind < 1 or self.n_boot < 10:
            raise ValueError(
                f"eval needs seeds, tasks_per_kind >= 1 and n_boot >= 10; got {self.seeds}, "
                f"{self.tasks_per_kind}, {self.n_boot}"
            )
        if self.split not in SPLITS or self.start < 0:
            raise ValueError(
                f"eval.split must be one of {SPLITS} and eval.start >= 0; got {self.split!r}, {self.start}"
            )


def _note_stage(config: str) -> Any:
    return field(default_factory=lambda: StageSpec(config=config))


@dataclass(kw_only=True)
class NoteModelConfig:
    """The ``note_model`` stage (:mod:`rl.agent.note_model`): a note model trained on the agent world's own
    photos (``rl.agent.world_export``, then ``mm pretrain``, align, SFT and a second SFT), which the policy
    then starts from; off by default (``policy.init`` or ``policy.spec`` give the start instead)."""

    build: bool = False
    """Build the note model and start the policy from it (then ``policy.init`` must be null)."""
    notes: int = 8000
    """Agent-world notes exported (train and test split, one note folder entry per photo)."""
    workers: int = 2
    """Processes that render the exported photos."""
    pretrain: StageSpec = _note_stage("configs/mm/pretrain.yaml")
    """InfoNCE pretraining (``rl.pipeline.StageSpec`` of a mm.train.pretrain.PretrainConfig)."""
    align: StageSpec = _note_stage("configs/mm/align.yaml")
    """Align stage from the pretraining (StageSpec of a mm.train.sft.TrainConfig, train.stage align)."""
    sft: StageSpec = _note_stage("configs/mm/sft.yaml")
    """SFT from the align model (StageSpec of a TrainConfig, train.stage sft)."""
    tune: StageSpec | None = None
    """A second SFT from the first (e.g. with the tower trainable), or null: the policy starts from the first
    SFT's model."""
    phases: list[StageSpec] = field(default_factory=list)
    """More SFT phases after ``tune`` (or ``sft``), each from the model before it, in ``phase1``, ``phase2``
    ...; the policy starts from the last. E.g. count questions alone, then the whole mix again
    (``configs/rl/agent_world.yaml``)."""

    def __post_init__(self) -> None:
        if self.notes < 1 or self.workers < 1:
            raise ValueError(f"note_model.notes and workers must be >= 1, got {self.notes}, {self.workers}")


@dataclass(kw_only=True)
class AgentRunConfig:
    """``rl agent``: init -> perception -> tool SFT (cold start) and no-tool SFT -> multi-turn GRPO -> eval
    -> report."""

    policy: PolicyConfig = field(default_factory=PolicyConfig)
    """The starting policy."""
    note_model: NoteModelConfig = field(default_factory=NoteModelConfig)
    """A note model built on the task world's photos for the policy to start from (off by default)."""
    world: WorldTaskConfig = field(default_factory=WorldTaskConfig)
    """The task world (its seed is the training world; eval.seeds name the held-out ones)."""
    data: DataConfig = field(default_factory=DataConfig)
    """The training tasks."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Trajectory limits and the simulated user."""
    perception: PerceptionConfig = field(default_factory=PerceptionConfig)
    """The reading stage both SFT stages start from."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Both SFT stages."""
    grpo: GRPOStageConfig = field(default_factory=GRPOStageConfig)
    """The GRPO stage."""
    ppo: AgentPPOConfig = field(default_factory=AgentPPOConfig)
    """The PPO stage (off unless ppo.steps > 0)."""
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    """How the tool models write their turns (GRPO, PPO and the eval)."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """The held-out eval."""
    lora: FilesLoraConfig = field(default_factory=FilesLoraConfig)
    """LoRA on the policy's LM (``VLMAdapter.apply_lora``) instead of training every weight: each stage's
    ``model.pt`` then holds the adapters (and a NoteVLM's image index rows) only, and ``export`` merges
    them into a complete model folder (the adapters in its ``adapter/``)."""
    tool_modules: list[str] = field(default_factory=list)
    """Python modules imported before the run, each registering its own tools with
    ``rl.agent.tools.register_tool`` when imported (from the current folder or ``PYTHONPATH``): they join
    ``zoom`` and ``compare`` in the instructions, the task files' demonstrations and every rollout."""
    tool_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Settings of a tool module of ``tool_modules``, under its name: the options its ``OPTIONS`` declares
    (``{rl.agent.find: {labels: true}}``); given to it with the run's config when the policy's start is
    known."""
    seed: int = 0
    """Seed of data order and sampling (each step reseeds from (seed, step), so a resumed run is exact)."""
    threads: int = 0
    """torch CPU threads (0 = torch's default)."""

    def __post_init__(self) -> None:
        unused = [m for m in self.tool_options if m not in self.tool_modules]
        if unused:
            raise ValueError(
                f"tool_options for {unused}, which tool_modules {self.tool_modules} does not load; add the "
                "module to tool_modules or drop its options"
            )
        stray = [k for k in self.sft.lead_kinds if k not in self.data.kinds]
        if stray:
            raise ValueError(f"sft.lead_kinds {stray} are not among data.kinds {self.data.kinds}")
        for knob, modules in KNOB_TOOL_MODULES.items():
            zoom = getattr(self.data, knob)
            module = modules.get(zoom)
            if module is not None and module not in self.tool_modules:
                raise ValueError(
                    f"data.{knob}={zoom} demonstrates a tool that is off by default; "
                    f"add it with 'tool_modules=[{module}]'"
                )
        if self.note_model.build and self.policy.init is not None:
            raise ValueError(
                f"note_model.build=true trains the policy's start, but policy.init={self.policy.init!r} "
                "names another; set policy.init=null or note_model.build=false"
            )
        if self.data.file is not None:
            if self.eval.file is None:
                raise ValueError(
                    f"data.file={self.data.file!r} trains on your tasks, but the eval would be on world "
                    "tasks; set eval.file to a task file of your held-out tasks"
                )
            world_only = {
                "note_model.build=true": self.note_model.build,
                "perception.steps > 0": self.perception.steps > 0,
                "perception.check_notes > 0": self.perception.check_notes > 0,
            }
            on = [k for k, v in world_only.items() if v]
            if on:
                raise ValueError(
                    f"{', '.join(on)} trains on the world's photos, not on data.file's tasks; with data.file "
                    "set note_model.build=false, perception.steps=0 and perception.check_notes=0, and give "
                    "your own model as policy.init"
                )

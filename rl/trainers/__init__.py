"""Post-training loops for NoteVLM: DPO family (``rl dpo``), GRPO/DAPO/GSPO (``rl grpo``) and PPO with a
critic (``rl ppo``, on GRPO's sampler).

Each trainer is only its batch and its loss (a :class:`mm.train.loop.StepTrainer`) on the pure functions
of :mod:`rl` (see :mod:`rl.trainers.dpo` and :mod:`rl.trainers.grpo` for why not TRL's trainers); the
loop (resume, DDP, metrics, plots, checkpoints) is :mod:`mm.train.loop`. Shared pieces:
:mod:`rl.trainers.common` (config sections, model/reference set-up, token log-probs of a batch, the
optimizer) and :mod:`rl.trainers.rollout` (batched KV-cache sampling that keeps raw token ids and masks).
"""

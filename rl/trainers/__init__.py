"""Post-training loops for NoteVLM: DPO family (``rl dpo``) and GRPO/DAPO/GSPO (``rl grpo``).

Compact loops on the pure functions of :mod:`rl` (see :mod:`rl.trainers.dpo` and
:mod:`rl.trainers.grpo` for why not TRL's trainers). Shared pieces: :mod:`rl.trainers.common`
(model/reference set-up, token log-probs of a batch, optimizer, checkpoints) and
:mod:`rl.trainers.rollout` (batched KV-cache sampling that keeps raw token ids and masks).
"""

"""``rl`` command line: the subcommand table; dispatch lives in :mod:`mm.dispatch`."""

from __future__ import annotations

from mm.dispatch import dispatch

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "dpo": ("rl.trainers.dpo_cli", "DPO post-training: a NoteVLM on the world, or any VLM on your pairs"),
    "grpo": ("rl.trainers.grpo_cli", "GRPO/DAPO post-training of a NoteVLM with hallucination rewards"),
    "ppo": ("rl.trainers.ppo_cli", "PPO with a value head or a separate critic on hallucination rewards"),
    "pairs": ("rl.pairs.cli", "build preference pairs (object injection, on-policy, image-corrupted)"),
    "distill": ("rl.trainers.distill_cli", "on-policy distillation from a teacher (reverse KL, GKD, KD)"),
    "rm": ("rl.trainers.rm_cli", "train a Bradley-Terry reward model on preference pairs"),
    "agent": ("rl.agent.cli", "a tool-using policy: tool SFT, no-tool baseline, multi-turn GRPO, report"),
    "agent-eval": ("rl.agent.eval_cli", "a model's tool use on your task file, without training"),
    "pipeline": ("rl.pipeline", "the main job: data -> pretrain -> align -> SFT -> eval -> DPO/GRPO -> eval"),
}

DESCRIPTION = "notelens post-training against hallucination: DPO, GRPO and the full pipeline."


def main(argv: list[str] | None = None) -> int:
    return dispatch("rl", DESCRIPTION, COMMANDS, argv)

"""``mm`` command line: the subcommand table; dispatch lives in :mod:`mm.dispatch`."""

from __future__ import annotations

from mm.dispatch import dispatch

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("mm.data.cli", "generate the synthetic note world or convert COCO/LLaVA/POPE files"),
    "pretrain": ("mm.train.pretrain_cli", "InfoNCE pretraining of vision tower + fusion + text encoder"),
    "train": ("mm.train.train_cli", "align / SFT a NoteVLM (full or LoRA)"),
    "compare-fusion": ("mm.train.compare_cli", "train the three fusion kinds at equal budget, write a table"),
    "eval": ("mm.eval.cli", "POPE / CHAIR / retrieval on files or on a model"),
    "config": ("mm.config_cli", "show a config file's resolved fields with their docs; list config kinds"),
}

DESCRIPTION = "notelens multimodal: data, pretraining, NoteVLM training and hallucination evals."


def main(argv: list[str] | None = None) -> int:
    return dispatch("mm", DESCRIPTION, COMMANDS, argv)

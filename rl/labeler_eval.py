"""How far a labeler can be trusted: its precision and recall on existence questions whose answer the
ground truth knows.

Per note, the labeler is asked "Is there a {object} in the image?" with the note's images about every
ground-truth object (positives) and about ``negatives`` objects of the vocabulary the note does not
contain (drawn with a seed); a claim counts as supported when P(yes) >= ``threshold``. Precision: of
the objects the labeler supports, the fraction that are there; recall: of the objects that are there,
the fraction it supports (a labeler with low precision lets hallucinations through as rewards).

Colour claims (``--claims colour``): per note and present object with known colours, "Is there a red
fork in the image?" about one colour it has (positive) and about one colour it lacks that another object
of the note has (negative: a binding error, the claim eval's adversarial rule), when there is one.

    python -m rl.labeler_eval --labeler runs/sft/model --data runs/data/world --split test --notes 200
    python -m rl.labeler_eval --labeler runs/sft/model --data runs/data/world --claims colour
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mm.data.images import open_rgb
from mm.errors import UserError
from rl.labeler import Labeler, LabelerConfig
from rl.rewards import vocabulary


def agreement(p_yes: Sequence[float], truth: Sequence[bool], *, threshold: float = 0.5) -> dict[str, Any]:
    """Counts, precision, recall, F1 and accuracy of ``P(yes) >= threshold`` against ``truth``."""
    if len(p_yes) != len(truth) or not truth:
        raise ValueError(f"need one truth per P(yes) and at least one, got {len(p_yes)} and {len(truth)}")
    pred = [p >= threshold for p in p_yes]
    tp = sum(p and t for p, t in zip(pred, truth))
    fp = sum(p and not t for p, t in zip(pred, truth))
    fn = sum(t and not p for p, t in zip(pred, truth))
    tn = len(truth) - tp - fp - fn
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"tp": tp, "fp": fp, "fn": fn, "tn": tn, "precision": precision, "recall": recall, "f1": f1,
            "accuracy": (tp + tn) / len(truth), "threshold": threshold}  # fmt: skip


def labeler_agreement(
    labeler: Labeler, notes: Sequence[Any], root: str | Path, *, vocab: str = "world", negatives: int = 3,
    seed: int = 0,
) -> dict[str, Any]:  # fmt: skip
    """:func:`agreement` of ``labeler`` on existence questions about ``notes`` (images under ``root``)."""

    v = vocabulary(vocab)
    rng = random.Random(seed)
    everything = sorted(v.canonical)
    questions, objects, truth = [], [], []
    for n in notes:
        present = sorted({c for o in n.categories if (c := v.canonicalize(o)) is not None})
        if not present:
            continue
        images = [open_rgb(Path(root) / p) for p in n.images]
        absent = [c for c in everything if c not in present]
        asked = rng.sample(absent, min(negatives, len(absent)))
        for obj, yes in [(o, True) for o in present] + [(o, False) for o in asked]:
            questions.append((images, labeler.question(obj)))
            objects.append(obj)
            truth.append(yes)
    if not questions:
        raise UserError(f"no notes with ground-truth objects in the {vocab} vocabulary to check the labeler")
    result = agreement(labeler.p_yes(questions, objects), truth, threshold=labeler.cfg.threshold)
    return {**result, "questions": len(truth), "positives": sum(truth), "negatives": len(truth) - sum(truth)}


def colour_agreement(
    labeler: Labeler, notes: Sequence[Any], root: str | Path, *, seed: int = 0
) -> dict[str, Any]:
    """:func:`agreement` of ``labeler`` on colour questions about ``notes`` (module docstring)."""

    rng = random.Random(seed)
    questions, objects, truth = [], [], []
    for n in notes:
        colours: dict[str, set[str]] = {}
        for o in (o for objs in n.objects for o in objs):
            colours.setdefault(o.category, set()).add(o.color)
        if not any(None not in cs for cs in colours.values()):
            continue
        images = [open_rgb(Path(root) / p) for p in n.images]
        for obj in sorted(colours):
            own = colours[obj]
            if None in own:
                continue
            others = sorted({c for o, cs in colours.items() if o != obj for c in cs if c and c not in own})
            asked = [(rng.choice(sorted(own)), True)] + ([(rng.choice(others), False)] if others else [])
            for colour, yes in asked:
                questions.append((images, labeler.question(f"{colour} {obj}")))
                objects.append(f"{colour} {obj}")
                truth.append(yes)
    if not questions:
        raise UserError("no notes with object colours to check the labeler's colour verdicts on")
    result = agreement(labeler.p_yes(questions, objects), truth, threshold=labeler.cfg.threshold)
    return {**result, "questions": len(truth), "positives": sum(truth), "negatives": len(truth) - sum(truth)}


def main(argv: list[str] | None = None) -> int:
    from mm.data.format import read_notes

    parser = argparse.ArgumentParser(prog="python -m rl.labeler_eval", description=__doc__.split("\n\n")[0])
    parser.add_argument("--labeler", required=True, metavar="DIR", help="labeler model folder")
    parser.add_argument("--data", required=True, metavar="DIR", help="note folder with ground-truth objects")
    parser.add_argument("--split", default="test", help="note split (default test)")
    parser.add_argument("--notes", type=int, default=0, help="first n notes (0 = all)")
    parser.add_argument("--negatives", type=int, default=3, help="absent objects asked about per note")
    parser.add_argument(
        "--claims", default="exists", choices=["exists", "colour"],
        help="claims to check: exists (objects) or colour (coloured objects, binding-error negatives)",
    )  # fmt: skip
    parser.add_argument("--vocab", default="world", choices=["world", "coco"], help="object vocabulary")
    parser.add_argument("--threshold", type=float, default=0.5, help="P(yes) that counts as yes")
    parser.add_argument("--cache", default="", help="labeler answer cache folder")
    parser.add_argument(
        "--answer-style", default="word", choices=["word", "object"],
        help="how the labeler answers: word ('yes') or object ('A cup: yes', a NoteVLM SFT'd that way)",
    )  # fmt: skip
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args(argv)
    try:
        cfg = LabelerConfig(threshold=args.threshold, cache=args.cache, answer_style=args.answer_style)
        labeler = Labeler.from_folder(args.labeler, cfg, device=args.device)
        notes = read_notes(args.data, split=args.split)
        notes = notes[: args.notes] if args.notes else notes
        if args.claims == "colour":
            res = colour_agreement(labeler, notes, args.data)
        else:
            res = labeler_agreement(labeler, notes, args.data, vocab=args.vocab, negatives=args.negatives)
    except (UserError, ValueError) as e:
        print(f"rl.labeler_eval: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``mm eval claims``: claim-level hallucination (exists / attribute / count) on files or on a model.

    mm eval claims --captions C.json --objects O.json|NOTES_DIR [--extractor world|coco] [--json]
    mm eval claims --objects O.json|NOTES_DIR --build-questions Q.jsonl [--split adversarial] [--seed 0]
    mm eval claims --questions Q.jsonl --answers A.jsonl [--parser original] [--json]
    mm eval claims --model DIR --data DIR [--split adversarial ...] [--json]

Every rate is printed with its bootstrap 95% interval (resampling captions, or images for questions).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from mm.errors import UserError
from mm.eval.claims.extract import CLAIM_KINDS, EXTRACTORS, build_extractor
from mm.eval.claims.generative import generative_scores
from mm.eval.claims.questions import ClaimQuestionConfig, build_claim_questions, discriminative_scores
from mm.eval.claims.truth import read_image_truth, read_truth
from mm.eval.pope import PARSERS, SPLITS


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--captions", help='captions JSON [{"image_id", "caption"}] or {id: caption}')
    p.add_argument(
        "--objects",
        help='ground truth: objects JSON {id: [name | {"category", "color"}]} or a note folder (notes.jsonl)',
    )
    p.add_argument(
        "--extractor",
        default=None,
        choices=tuple(EXTRACTORS),
        help="claim extractor and vocabulary (default: coco on files, world on a model)",
    )
    p.add_argument(
        "--build-questions", metavar="OUT", help="with --objects: write yes/no claim questions (JSONL)"
    )
    p.add_argument("--questions", help="claim questions JSONL (from --build-questions)")
    p.add_argument("--answers", help="answers JSONL (question_id, text)")
    p.add_argument(
        "--parser", default="original", choices=PARSERS, help="yes/no answer parser (default original)"
    )
    p.add_argument("--split", nargs="+", default=["adversarial"], choices=SPLITS,
                   help="negative sampling of built or model questions (default adversarial)")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="question sampling and bootstrap seed (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    g = p.add_argument_group("on a model (instead of files)")
    g.add_argument("--model", help="model folder (a NoteVLM or any transformers image-text-to-text model)")
    g.add_argument("--data", help="note folder whose held-out notes are evaluated")
    g.add_argument("--eval-split", default="test", help="note split to evaluate (default test)")
    g.add_argument("--notes", type=int, default=200, help="at most this many notes (default 200; 0 = all)")
    g.add_argument("--batch-size", type=int, default=32, help="generation batch size (default 32)")
    g.add_argument("--device", default=None, help="cuda or cpu (default: cuda when available)")


def _mode(args: argparse.Namespace) -> str:
    given = {k for k in ("captions", "objects", "build_questions", "questions", "answers", "model", "data")
             if getattr(args, k) is not None}  # fmt: skip
    for mode, need in (
        ("model", {"model", "data"}),
        ("build", {"objects", "build_questions"}),
        ("generative", {"captions", "objects"}),
        ("discriminative", {"questions", "answers"}),
    ):
        if given == need:
            return mode
    flags = " ".join(f"--{k.replace('_', '-')}" for k in sorted(given)) or "nothing"
    raise UserError(
        "mm eval claims takes one of: --captions C --objects O | --objects O --build-questions OUT | "
        f"--questions Q --answers A | --model DIR --data DIR; got {flags}"
    )


def run(args: argparse.Namespace) -> int:
    mode = _mode(args)
    extractor = build_extractor(args.extractor or ("world" if mode == "model" else "coco"))
    warns: list[str] = []
    if mode == "build":
        return _build(args, extractor, warns)
    if mode == "generative":
        from mm.eval.files import read_captions

        caps = [(c["image_id"], c["caption"]) for c in read_captions(args.captions, warns)]
        truth = read_truth(args.objects, extractor.vocabulary, warns)
        try:
            res: dict[str, Any] = {"generative": generative_scores(caps, truth, extractor, seed=args.seed)}
        except ValueError as e:
            raise UserError(f"{args.captions}: {e}") from None
    elif mode == "discriminative":
        from mm.eval.files import read_pope_answers, read_pope_questions

        questions = read_pope_questions(args.questions)  # checks labels and ids; keeps every key
        answers = dict(read_pope_answers(args.answers))
        by_split: dict[str, list[dict[str, Any]]] = {}
        for q in questions:
            by_split.setdefault(str(q.get("split", "file")), []).append(q)
        res = {
            "discriminative": {
                s: discriminative_scores(qs, answers, parser=args.parser) for s, qs in by_split.items()
            }
        }
    else:
        res = _on_model(args, extractor)
    warns += res.pop("warnings", [])
    for w in warns:
        print(f"mm eval claims: warning: {w}", file=sys.stderr)
    if args.json:
        if "generative" in res:
            res["generative"] = {k: v for k, v in res["generative"].items() if k != "units"}
        print(json.dumps(res))
        return 0
    _print(res)
    return 0


def _build(args: argparse.Namespace, extractor: Any, warns: list[str]) -> int:
    from mm.eval.files import write_jsonl

    images = read_image_truth(args.objects, extractor.vocabulary, warns)
    rows = []
    for split in args.split:
        qs, w = build_claim_questions(
            images, ClaimQuestionConfig(split=split, seed=args.seed, where="in the image"),
            categories=sorted(extractor.vocabulary.canonical),
        )  # fmt: skip
        warns += w
        rows += [{**q, "question_id": f"{split}-{q['question_id']}", "split": split} for q in qs]
    for w in warns:
        print(f"mm eval claims: warning: {w}", file=sys.stderr)
    if not rows:
        raise UserError(f"{args.objects}: no image has any object, nothing to ask; nothing written")
    write_jsonl(rows, args.build_questions)
    print(
        f"wrote {len(rows)} claim questions ({', '.join(args.split)}, seed {args.seed}) "
        f"to {args.build_questions}"
    )
    return 0


def _on_model(args: argparse.Namespace, extractor: Any) -> dict[str, Any]:
    # function-level: the model stack imports torch and transformers (seconds); scoring files needs neither
    import torch

    from mm.eval.claims.run import run_claims
    from mm.eval.runners import held_out_notes
    from mm.model.adapter import load_adapter

    notes = held_out_notes(args.data, split=args.eval_split, limit=args.notes or None)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    adapter = load_adapter(args.model, device=device)
    return run_claims(
        adapter, notes, args.data, extractor=extractor, categories=sorted(extractor.vocabulary.canonical),
        splits=args.split, parser=args.parser, seed=args.seed, batch_size=args.batch_size,
    )  # fmt: skip


def _ci(ci: Any) -> str:
    lo, hi = (ci or [None, None])[:2] if isinstance(ci, list) else (ci.get("low"), ci.get("high"))
    return "[n/a]" if lo is None or hi is None else f"[{lo:.3f}, {hi:.3f}]"


def _print(res: dict[str, Any]) -> None:
    g = res.get("generative")
    if g:
        print(
            f"claims (generative), extractor={g['extractor']}, {g['n_captions']} captions; "
            "95% bootstrap intervals"
        )
        print(f"  {'kind':<10} {'claims':>6} {'halluc.':>7}  {'rate':<22} {'coverage':<22} hal_captions")
        for kind in CLAIM_KINDS:
            r = g["kinds"][kind]
            print(
                f"  {kind:<10} {r['claims']:>6} {r['hallucinated']:>7}  "
                f"{r['rate']:.3f} {_ci(r['rate_ci']):<16} {r['coverage']:.3f} {_ci(r['coverage_ci']):<16} "
                f"{r['hal_captions']:.3f} {_ci(r['hal_captions_ci'])}"
            )
    for split, kinds in res.get("discriminative", {}).items():
        print(f"claims (discriminative, {split}); 95% bootstrap intervals over images")
        print(f"  {'kind':<10} {'questions':>9}  {'accuracy':<22} {'f1':<22} yes_ratio")
        for kind, r in kinds.items():
            iv = r["intervals"]
            print(
                f"  {kind:<10} {r['n_questions']:>9}  {r['accuracy']:.3f} {_ci(iv.get('accuracy')):<16} "
                f"{r['f1']:.3f} {_ci(iv.get('f1')):<16} {r['yes_ratio']:.3f}"
            )

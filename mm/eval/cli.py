"""``mm eval``: POPE and CHAIR on files or on a model.

    mm eval pope --questions Q.jsonl --answers A.jsonl --parser original [--json]
    mm eval pope --model DIR --data DIR --split adversarial [--parser original] [--json]
    mm eval pope-build --objects O.json --split adversarial --out Q.jsonl --seed 0
    mm eval chair --captions C.json --objects O.json --vocab coco [--json]
    mm eval chair --model DIR --data DIR [--json]

With ``--model`` the questions / captions come from the held-out notes of ``--data`` and the model
answers them (:mod:`mm.eval.runners`: greedy, batched, KV cache).

Scoring lives in :mod:`mm.eval.pope` / :mod:`mm.eval.chair` and takes plain dicts and lists, so
a model runner only has to produce ``{question_id: answer}`` or ``[{"image_id", "caption"}]``.
Warnings (missing ids, undefined ratios, unknown objects) go to stderr; exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from typing import Any

from mm.errors import UserError
from mm.eval.chair import Vocabulary, chair_scores
from mm.eval.files import (
    read_chair_files,
    read_objects,
    read_pope_answers,
    read_pope_questions,
    write_jsonl,
)
from mm.eval.pope import DEFAULT_TEMPLATE, PopeBuildConfig, build_questions, pope_scores


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="eval_command", required=True, metavar="EVAL")

    p = sub.add_parser("pope", help="score POPE answers against questions", description=_doc("pope"))
    p.add_argument("--questions", help="POPE questions JSONL (question_id, image, text, label)")
    p.add_argument("--answers", help="answers JSONL (question_id, text)")
    p.add_argument(
        "--parser",
        default="original",
        choices=("original", "lmms", "vlmevalkit"),
        help="answer parser convention (default: original POPE evaluate.py)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    _model_args(p)
    p.add_argument(
        "--split",
        default="adversarial",
        choices=("random", "popular", "adversarial"),
        help="with --model: POPE negative sampling (default adversarial)",
    )
    p.add_argument("--seed", type=int, default=0, help="with --model: question sampling seed (default 0)")

    b = sub.add_parser(
        "pope-build", help="build POPE questions from object annotations", description=_doc("build")
    )
    b.add_argument("--objects", required=True, help="objects JSON {image: [objects]} or COCO instances JSON")
    b.add_argument(
        "--split", default="random", choices=("random", "popular", "adversarial"), help="negative sampling"
    )
    b.add_argument("--out", required=True, help="output questions JSONL")
    b.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    b.add_argument("--template", default=None, help="question template with {object} (default: POPE's)")
    b.add_argument("--per-image", type=int, default=None, help="at most N present objects per image")

    c = sub.add_parser("chair", help="CHAIR_s / CHAIR_i / recall of captions", description=_doc("chair"))
    c.add_argument(
        "--captions",
        help='captions JSON [{"image_id", "caption"}] or {id: caption}',
    )
    c.add_argument("--objects", help="ground-truth objects JSON {image_id: [objects]}")
    c.add_argument(
        "--vocab",
        default=None,
        choices=("coco", "world"),
        help="object vocabulary (default: coco on files, world with --model)",
    )
    c.add_argument("--json", action="store_true", help="print one JSON object (with per_caption)")
    _model_args(c)

    from mm.eval.claims import cli as claims_cli

    claims_cli.configure(
        sub.add_parser(
            "claims",
            help="claim-level hallucination: exists / attribute / count",
            description=claims_cli.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
    )  # fmt: skip


def _model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("on a model (instead of files)")
    g.add_argument("--model", help="NoteVLM folder (OUT/model of `mm train` / `rl dpo`)")
    g.add_argument("--data", help="note folder whose held-out notes are evaluated")
    g.add_argument("--eval-split", default="test", help="note split to evaluate (default test)")
    g.add_argument("--notes", type=int, default=200, help="at most this many notes (default 200; 0 = all)")
    g.add_argument("--batch-size", type=int, default=64, help="generation batch size (default 64)")
    g.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help='generation length (default 8 for POPE, room for "A fork: no"; 96 for CHAIR)',
    )


def _mode(args: argparse.Namespace, file_flags: tuple[str, str]) -> str:
    """``"model"`` or ``"files"``; a clear error when the two kinds of input are mixed or incomplete."""
    files = [f for f in file_flags if getattr(args, f) is not None]
    if args.model is not None or args.data is not None:
        if args.model is None or args.data is None or files:
            raise UserError(
                f"on a model pass --model DIR and --data DIR (and not --{' / --'.join(file_flags)}); "
                f"got --model={args.model} --data={args.data}"
                + (f" plus --{', --'.join(files)}" if files else "")
            )
        return "model"
    if len(files) != 2:
        raise UserError(f"pass --{file_flags[0]} and --{file_flags[1]} (files) or --model DIR --data DIR")
    return "files"


def _doc(which: str) -> str:
    return {
        "pope": "Score POPE answers; answers are joined to questions by question_id.",
        "build": "Write POPE questions: present objects as 'yes', as many absent as 'no' (seeded).",
        "chair": "CHAIR_s, CHAIR_i, recall and mean caption length (original CHAIR conventions).",
    }[which]


def run(args: argparse.Namespace) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the same warnings are printed below
        if args.eval_command == "claims":
            from mm.eval.claims import cli as claims_cli

            return claims_cli.run(args)
        return {"pope": _run_pope, "pope-build": _run_build, "chair": _run_chair}[args.eval_command](args)


def _print_warnings(warns: list[str]) -> None:
    for w in warns:
        print(f"mm eval: warning: {w}", file=sys.stderr)


_PARSER_SOURCE = {
    "original": "POPE evaluate.py: first sentence; 'no' iff a word is No/not/no; else 'yes'",
    "lmms": "lmms-eval: lower().strip() must equal yes/no; yes_ratio over predictions",
    "vlmevalkit": "VLMEvalKit YOrN: yes xor no among words; unknown = no for P/R/F1",
}


def _run_pope(args: argparse.Namespace) -> int:
    if _mode(args, ("questions", "answers")) == "model":
        # function-level: the runners import torch and transformers (seconds); scoring files needs neither
        from mm.eval.runners import held_out_notes, load_model, run_pope

        notes = held_out_notes(args.data, split=args.eval_split, limit=args.notes or None)
        model, processor = load_model(args.model)
        res = run_pope(
            model, processor, notes, args.data, split=args.split, parser=args.parser, seed=args.seed,
            batch_size=args.batch_size, max_new_tokens=args.max_new_tokens or 8,
        )  # fmt: skip
        n_questions = res["n_questions"]
        where = f"model {args.model} on {len(notes)} {args.eval_split} notes, split={args.split}"
    else:
        questions = read_pope_questions(args.questions)
        answers = read_pope_answers(args.answers)
        labels = {str(q["question_id"]): q["label"] for q in questions}
        units = {q["question_id"]: q.get("image", q["question_id"]) for q in questions}  # resample images
        res = pope_scores(labels, answers, parser=args.parser, units=units)
        n_questions = len(labels)
        where = ""
    _print_warnings(res["warnings"])
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"POPE  parser={args.parser}  ({_PARSER_SOURCE[args.parser]})" + (f"  [{where}]" if where else ""))
    print(f"scored {res['n_scored']} of {n_questions} questions; unparsed {res['unparsed']}")
    _table(
        [("accuracy", res["accuracy"]), ("precision", res["precision"]), ("recall", res["recall"])]
        + [("f1", res["f1"]), ("yes_ratio", res["yes_ratio"])],
        res.get("intervals"),
    )
    print(f"TP {res['tp']}  FP {res['fp']}  TN {res['tn']}  FN {res['fn']}")
    return 0


def _run_build(args: argparse.Namespace) -> int:
    try:
        cfg = PopeBuildConfig(
            split=args.split,
            seed=args.seed,
            template=args.template if args.template is not None else DEFAULT_TEMPLATE,
            per_image=args.per_image,
        )
    except ValueError as e:
        raise UserError(f"pope-build: {e}") from None
    questions, warns = build_questions(read_objects(args.objects), cfg)
    _print_warnings(warns)
    if not questions:
        raise UserError(f"{args.objects}: no image has any object, nothing to ask; nothing written")
    write_jsonl(questions, args.out)
    n_img = len({q["image"] for q in questions})
    print(f"wrote {len(questions)} questions ({args.split}, seed {args.seed}, {n_img} images) to {args.out}")
    return 0


def _run_chair(args: argparse.Namespace) -> int:
    if _mode(args, ("captions", "objects")) == "model":
        # function-level: the runners import torch and transformers (seconds); scoring files needs neither
        from mm.eval.runners import held_out_notes, load_model, run_chair

        args.vocab = args.vocab or "world"
        notes = held_out_notes(args.data, split=args.eval_split, limit=args.notes or None)
        model, processor = load_model(args.model)
        res = run_chair(
            model, processor, notes, args.data, batch_size=args.batch_size,
            max_new_tokens=args.max_new_tokens or 96, vocab=args.vocab,
        )  # fmt: skip
    else:
        args.vocab = args.vocab or "coco"
        captions, objects, file_warnings = read_chair_files(args.captions, args.objects)
        vocab = Vocabulary.coco() if args.vocab == "coco" else Vocabulary.world()
        res = chair_scores(captions, objects, vocab)
        res["warnings"] = file_warnings + res["warnings"]
    _print_warnings(res["warnings"])
    if args.json:
        print(json.dumps(res))
        return 0
    conv = (
        "original CHAIR rules: nltk-style tokens, Pattern singularize, two-word merges, toilet-seat rule"
        if args.vocab == "coco"
        else "world synonym table, multi-word forms first"
    )
    print(f"CHAIR  vocab={args.vocab}  ({conv}); mentions not de-duplicated")
    print(f"{res['n_captions']} captions, {res['n_mentions']} mentions, {res['n_hallucinated']} hallucinated")
    _table(
        [("chair_s", res["chair_s"]), ("chair_i", res["chair_i"]), ("recall", res["recall"])]
        + [("mean_length", res["mean_length"])],
        res.get("intervals"),
    )
    if "causes" in res:
        c = res["causes"]
        print(f"hallucination causes: partner {c['partner']}  confusion {c['confusion']}  other {c['other']}")
    return 0


def _table(rows: list[tuple[str, Any]], intervals: dict[str, Any] | None = None) -> None:
    """Rows of ``name  value``, with the bootstrap 95% interval (:mod:`mm.eval.bootstrap`) where given."""
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        iv = (intervals or {}).get(k) or {}
        ci = f"  [{iv['low']:.4f}, {iv['high']:.4f}]" if iv.get("low") is not None else ""
        print(f"  {k:<{width}}  {v:.4f}{ci}" if isinstance(v, float) else f"  {k:<{width}}  {v}")

"""``mm eval``: POPE and CHAIR on files.

    mm eval pope --questions Q.jsonl --answers A.jsonl --parser original [--json]
    mm eval pope-build --objects O.json --split adversarial --out Q.jsonl --seed 0
    mm eval chair --captions C.json --objects O.json --vocab coco [--json]

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


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="eval_command", required=True, metavar="EVAL")

    p = sub.add_parser("pope", help="score POPE answers against questions", description=_doc("pope"))
    p.add_argument(
        "--questions",
        required=True,
        help="POPE questions JSONL (question_id, image, text, label)",
    )
    p.add_argument("--answers", required=True, help="answers JSONL (question_id, text)")
    p.add_argument(
        "--parser",
        default="original",
        choices=("original", "lmms", "vlmevalkit"),
        help="answer parser convention (default: original POPE evaluate.py)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")

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
        required=True,
        help='captions JSON [{"image_id", "caption"}] or {id: caption}',
    )
    c.add_argument("--objects", required=True, help="ground-truth objects JSON {image_id: [objects]}")
    c.add_argument("--vocab", default="coco", choices=("coco", "world"), help="object vocabulary")
    c.add_argument("--json", action="store_true", help="print one JSON object (with per_caption)")


def _doc(which: str) -> str:
    return {
        "pope": "Score POPE answers; answers are joined to questions by question_id.",
        "build": "Write POPE questions: present objects as 'yes', as many absent as 'no' (seeded).",
        "chair": "CHAIR_s, CHAIR_i, recall and mean caption length (original CHAIR conventions).",
    }[which]


def run(args: argparse.Namespace) -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the same warnings are printed below
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
    from mm.eval.files import read_pope_answers, read_pope_questions
    from mm.eval.pope import pope_scores

    questions = read_pope_questions(args.questions)
    answers = read_pope_answers(args.answers)
    labels = {str(q["question_id"]): q["label"] for q in questions}
    res = pope_scores(labels, answers, parser=args.parser)
    _print_warnings(res["warnings"])
    if args.json:
        print(json.dumps(res))
        return 0
    print(f"POPE  parser={args.parser}  ({_PARSER_SOURCE[args.parser]})")
    print(f"scored {res['n_scored']} of {len(labels)} questions; unparsed {res['unparsed']}")
    _table(
        [("accuracy", res["accuracy"]), ("precision", res["precision"]), ("recall", res["recall"])]
        + [("f1", res["f1"]), ("yes_ratio", res["yes_ratio"])]
    )
    print(f"TP {res['tp']}  FP {res['fp']}  TN {res['tn']}  FN {res['fn']}")
    return 0


def _run_build(args: argparse.Namespace) -> int:
    from mm.eval.files import read_objects, write_jsonl
    from mm.eval.pope import DEFAULT_TEMPLATE, PopeBuildConfig, build_questions

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
    from mm.eval.chair import Vocabulary, chair_scores
    from mm.eval.files import read_captions, read_objects

    captions = read_captions(args.captions)
    objects = read_objects(args.objects)
    vocab = Vocabulary.coco() if args.vocab == "coco" else Vocabulary.world()
    res = chair_scores(captions, objects, vocab)
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
        + [("mean_length", res["mean_length"])]
    )
    return 0


def _table(rows: list[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v:.4f}" if isinstance(v, float) else f"  {k:<{width}}  {v}")

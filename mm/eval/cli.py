"""``mm eval``: POPE and CHAIR on files or on a model.

    mm eval pope --questions Q.jsonl --answers A.jsonl --parser original [--json]
    mm eval pope --model DIR --questions Q.jsonl --image-folder IMGS [--answers-out A.jsonl] [--json]
    mm eval pope --model DIR --data DIR --split adversarial [--parser original] [--json]
    mm eval pope-build --objects O.json --split adversarial --out Q.jsonl --seed 0
    mm eval chair --captions C.json --objects O.json --vocab coco [--json]
    mm eval chair --model DIR --objects O.json --image-folder IMGS --vocab coco [--captions-out C.json]
    mm eval chair --model DIR --data DIR [--json]

``--model`` is any folder :func:`mm.model.adapter.load_adapter` takes (a NoteVLM, or a transformers
LLaVA / Qwen2-VL / Idefics3 ... with its processor). With ``--questions`` / ``--objects`` the model
answers the user's POPE questions or captions the user's images; with ``--data`` the questions /
captions come from the held-out notes of a world folder. Generation goes through the adapter
(:mod:`mm.eval.runners`: the model's chat template, greedy, batched, KV cache).

Scoring lives in :mod:`mm.eval.pope` / :mod:`mm.eval.chair` and takes plain dicts and lists, so
a model runner only has to produce ``{question_id: answer}`` or ``[{"image_id", "caption"}]``.
Warnings (missing ids, undefined ratios, unknown objects) go to stderr; exit 2 on bad input.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path
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

    p = sub.add_parser(
        "pope", help="score POPE answers, or a model's answers to POPE questions", description=_doc("pope")
    )
    p.add_argument(
        "--questions", help="POPE questions JSONL (question_id, image, text, label); with --model: asked"
    )
    p.add_argument("--answers", help="answers JSONL (question_id, text)")
    p.add_argument(
        "--parser",
        default="original",
        choices=("original", "lmms", "vlmevalkit"),
        help="answer parser convention (default: original POPE evaluate.py)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    _model_args(p)
    _files_model_args(p, "questions")
    p.add_argument(
        "--post-prompt",
        default="",
        help="with --model --questions: text appended to each question (default none; LLaVA-1.5 and "
        "lmms-eval use '\\nAnswer the question using a single word or phrase.')",
    )
    p.add_argument(
        "--answers-out",
        help="with --model: write the answers JSONL (question_id, image, prompt, text, label)",
    )
    p.add_argument(
        "--split",
        default="adversarial",
        choices=("random", "popular", "adversarial"),
        help="with --data: POPE negative sampling (default adversarial)",
    )
    p.add_argument("--seed", type=int, default=0, help="with --data: question sampling seed (default 0)")

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

    c = sub.add_parser(
        "chair", help="CHAIR_s / CHAIR_i / recall of captions, or of a model's", description=_doc("chair")
    )
    c.add_argument(
        "--captions",
        help='captions JSON [{"image_id", "caption"}] or {id: caption}',
    )
    c.add_argument(
        "--objects",
        help="ground-truth objects JSON {image_id: [objects]} or COCO instances; "
        "with --model: the images to caption",
    )
    c.add_argument(
        "--vocab",
        default=None,
        choices=("coco", "world"),
        help="object vocabulary (default: coco on files, world with --model)",
    )
    c.add_argument("--json", action="store_true", help="print one JSON object (with per_caption)")
    _model_args(c)
    _files_model_args(c, "objects")
    c.add_argument(
        "--prompt",
        default=None,
        help="with --model: the captioning prompt (default 'Please describe this image in detail.' with "
        "--objects; the world's caption prompt with --data)",
    )
    c.add_argument("--captions-out", help='with --model: write the captions JSON [{"image_id", "caption"}]')

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
    g.add_argument(
        "--model",
        help="model folder: a NoteVLM (OUT/model of `mm train` / `rl dpo`) or any transformers "
        "image-text-to-text folder with its processor (LLaVA, Qwen2-VL, Idefics3, ...)",
    )
    g.add_argument("--data", help="world note folder whose held-out notes are evaluated (world form)")
    g.add_argument("--eval-split", default="test", help="with --data: note split to evaluate (default test)")
    g.add_argument(
        "--notes", type=int, default=200, help="with --data: at most this many notes (default 200; 0 = all)"
    )
    g.add_argument("--batch-size", type=int, default=64, help="generation batch size (default 64)")
    g.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help='generation length (default 8 for POPE, room for "A fork: no"; 96 for CHAIR)',
    )
    g.add_argument(
        "--device", default=None, help="where the model runs (default cuda when present, else cpu)"
    )
    g.add_argument(
        "--dtype", default=None, help="weights' dtype: float32, bfloat16, float16 (default as saved)"
    )


def _files_model_args(p: argparse.ArgumentParser, source: str) -> None:
    g = p.add_argument_group(f"on a model and your files (--model DIR --{source} FILE)")
    g.add_argument(
        "--image-folder",
        default=None,
        help=f"folder the image paths / ids of --{source} are relative to (default: that file's folder)",
    )
    g.add_argument(
        "--limit", type=int, default=0, help=f"only the first N entries of --{source} (default 0 = all)"
    )


def _mode(args: argparse.Namespace, source: str, scored: str, out_flag: str) -> str:
    """``"files"`` (score files), ``"model-files"`` (a model on the user's files) or ``"world"`` (a model
    on a world folder); a clear error when the kinds of input are mixed or incomplete."""
    src, done = getattr(args, source), getattr(args, scored)
    model_only = [f for f in ("image_folder", out_flag) if getattr(args, f) is not None]
    forms = (
        f"--model DIR --{source} FILE [--image-folder IMGS] (your files) or --model DIR --data DIR (a world)"
    )
    if args.model is None:
        if args.data is not None:
            raise UserError(f"--data {args.data} needs --model DIR: pass --model DIR and --data DIR")
        if model_only:
            flag = model_only[0].replace("_", "-")
            raise UserError(f"--{flag} needs --model DIR: on a model pass {forms}")
        if src is None or done is None:
            first, second = sorted((source, scored), key=lambda f: f != "questions" and f != "captions")
            raise UserError(f"pass --{first} and --{second} (files), or on a model {forms}")
        return "files"
    if done is not None:
        raise UserError(
            f"on a model the model writes the {scored}: got --model {args.model} plus --{scored} {done}; "
            f"drop --{scored} (--{out_flag.replace('_', '-')} FILE saves the model's)"
        )
    if args.data is not None:
        if src is not None or args.image_folder is not None:
            extra = "--" + source if src is not None else "--image-folder"
            raise UserError(
                f"on a model pass --model DIR and --data DIR (a world) or {forms.split(' or ')[0]}; "
                f"got --data {args.data} plus {extra}"
            )
        return "world"
    if src is None:
        raise UserError(f"on a model pass --model DIR and --data DIR (a world), or {forms.split(' or ')[0]}")
    return "model-files"


def _check_out(path: str | None) -> None:
    """Fail before a model runs when an output file cannot be written where asked."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{p} is a folder; pass the path of the file to write")
    if not p.parent.is_dir():
        raise UserError(f"{p}: folder {p.parent} does not exist; create it first")


def _write_json(obj: Any, path: str) -> None:
    """Write ``obj`` as JSON atomically (temp file in the same folder, then rename)."""
    p = Path(path)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1)
            f.write("\n")
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _doc(which: str) -> str:
    return {
        "pope": "Score POPE answers; answers are joined to questions by question_id. "
        "Forms: --questions Q --answers A (files); --model DIR --questions Q [--image-folder IMGS] (the "
        "model answers your POPE questions); --model DIR --data WORLD (questions from held-out world notes). "
        "DIR: a NoteVLM or any transformers image-text-to-text folder with its processor.",
        "build": "Write POPE questions: present objects as 'yes', as many absent as 'no' (seeded).",
        "chair": "CHAIR_s, CHAIR_i, recall and mean caption length (original CHAIR conventions). "
        "Forms: --captions C --objects O (files); --model DIR --objects O [--image-folder IMGS] (the model "
        "captions each image of O); --model DIR --data WORLD (held-out world notes). "
        "DIR: a NoteVLM or any transformers image-text-to-text folder with its processor.",
    }[which]


def run(args: argparse.Namespace) -> int:
    if getattr(args, "model", None) and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return _run_parallel(args)
    return run_alone(args)


def _run_parallel(args: argparse.Namespace) -> int:
    """A model eval under ``torchrun``: each process answers its share of the items on its own GPU
    (:mod:`mm.eval.parallel`); rank 0 alone prints and writes the output files."""
    from mm.eval.parallel import is_writer, join_eval, rank_world

    args.device = join_eval(args.device)
    if is_writer():
        world = rank_world()[1]  # the joined group's
        print(f"mm eval: {world} processes, each answers one item in {world}", file=sys.stderr)
        return run_alone(args)
    for out in ("answers_out", "captions_out"):
        if getattr(args, out, None):
            setattr(args, out, None)
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
        return run_alone(args)


def run_alone(args: argparse.Namespace) -> int:
    """:func:`run` without the launch check."""
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
    mode = _mode(args, "questions", "answers", "answers_out")
    if mode == "files":
        questions = read_pope_questions(args.questions)
        answers = read_pope_answers(args.answers)
        labels = {str(q["question_id"]): q["label"] for q in questions}
        units = {q["question_id"]: q.get("image", q["question_id"]) for q in questions}  # resample images
        res = pope_scores(labels, answers, parser=args.parser, units=units)
        n_questions = len(labels)
        where = ""
    else:
        # function-level: the runners import torch and transformers (seconds); scoring files needs neither
        from mm.eval.model_inputs import pope_items
        from mm.eval.runners import held_out_notes, load_eval_adapter, run_pope, run_pope_files

        _check_out(args.answers_out)
        new_tokens = args.max_new_tokens or 8
        if mode == "world":
            notes = held_out_notes(args.data, split=args.eval_split, limit=args.notes or None)
            adapter = load_eval_adapter(args.model, device=args.device, dtype=args.dtype)
            res = run_pope(
                adapter, None, notes, args.data, split=args.split, parser=args.parser, seed=args.seed,
                batch_size=args.batch_size, max_new_tokens=new_tokens,
            )  # fmt: skip
            where = f"model {args.model} on {len(notes)} {args.eval_split} notes, split={args.split}"
        else:
            # bad input stops here, before the model loads
            pope_items(args.questions, args.image_folder, limit=args.limit or None)
            adapter = load_eval_adapter(args.model, device=args.device, dtype=args.dtype)
            res = run_pope_files(
                adapter, args.questions, args.image_folder, parser=args.parser, post_prompt=args.post_prompt,
                limit=args.limit or None, batch_size=args.batch_size, max_new_tokens=new_tokens,
            )  # fmt: skip
            res["model"], res["questions"] = args.model, args.questions
            where = f"model {args.model} ({adapter.family}) on {args.questions}"
        n_questions = res["n_questions"]
        if args.answers_out:
            write_jsonl(res["answers"], args.answers_out)
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
    mode = _mode(args, "objects", "captions", "captions_out")
    if mode == "files":
        args.vocab = args.vocab or "coco"
        captions, objects, file_warnings = read_chair_files(args.captions, args.objects)
        vocab = Vocabulary.coco() if args.vocab == "coco" else Vocabulary.world()
        res = chair_scores(captions, objects, vocab)
        res["warnings"] = file_warnings + res["warnings"]
    else:
        # function-level: the runners import torch and transformers (seconds); scoring files needs neither
        from mm.eval.model_inputs import chair_items
        from mm.eval.runners import (
            FILES_CAPTION_PROMPT,
            held_out_notes,
            load_eval_adapter,
            run_chair,
            run_chair_files,
        )

        _check_out(args.captions_out)
        new_tokens = args.max_new_tokens or 96
        if mode == "world":
            args.vocab = args.vocab or "world"
            notes = held_out_notes(args.data, split=args.eval_split, limit=args.notes or None)
            adapter = load_eval_adapter(args.model, device=args.device, dtype=args.dtype)
            res = run_chair(
                adapter, None, notes, args.data, prompt=args.prompt, batch_size=args.batch_size,
                max_new_tokens=new_tokens, vocab=args.vocab,
            )  # fmt: skip
        else:
            args.vocab = args.vocab or "coco"
            # bad input stops here, before the model loads
            chair_items(args.objects, args.image_folder, limit=args.limit or None)
            adapter = load_eval_adapter(args.model, device=args.device, dtype=args.dtype)
            res = run_chair_files(
                adapter, args.objects, args.image_folder, vocab=args.vocab,
                prompt=args.prompt or FILES_CAPTION_PROMPT, limit=args.limit or None,
                batch_size=args.batch_size, max_new_tokens=new_tokens,
            )  # fmt: skip
            res["model"], res["objects"] = args.model, args.objects
        if args.captions_out:
            _write_json(
                [{"image_id": r["image_id"], "caption": r["caption"]} for r in res["per_caption"]],
                args.captions_out,
            )
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

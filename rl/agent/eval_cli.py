"""``rl agent-eval``: a model's tool use on a task file, without training (the ``rl agent`` eval alone).

    rl agent-eval --model runs/mine/export/tool_grpo --tasks tasks/test.jsonl --json
    rl agent-eval --model models/my-vlm --tasks tasks/test.jsonl --no-tools --rows-out rows.jsonl
    rl agent-eval --model runs/mine/export/tool_grpo --tasks tasks/test.jsonl --baseline models/my-vlm \\
        --baseline-no-tools                                          # paired gains over the base model

Greedy multi-turn rollouts of every task of ``--tasks`` (``rl.agent.task_file``) with the loop's tools (and
those of ``--tool-module``), or, with ``--no-tools``, answered at once; prints ``accuracy/qa``,
``valid_call_rate``, ``calls_per_task`` and ``zoom_on_target/qa`` with bootstrap 95% intervals over tasks
(``--json``: as JSON). A tool module that needs a model (``rl.agent.find``'s namer) takes ``--tools-start``
(default ``--model``), and its options ``--tool-options``, as ``rl agent`` gives them. ``--rows-out`` writes
one JSON row per task, ``--transcripts-out`` the trajectories. ``--baseline DIR`` (``--baseline-no-tools``:
answering at once) runs another model on the same tasks and adds the paired gains of ``--model`` over it,
with paired bootstrap intervals (as ``rl agent``'s report). ``--quote TOOL.ARG`` and ``--counts`` apply
``rl agent``'s ``decode`` constraints (:mod:`rl.agent.quote`, :mod:`rl.agent.counts`) to the tool model.
``--model`` is any folder the agent loop takes (NoteVLM, LLaVA, LLaVA-NeXT, Qwen2-VL, Qwen2.5-VL, Idefics3,
SmolVLM); ``--limit max_images=N`` / ``max_length=N`` raise a NoteVLM's limits, as ``rl agent``'s
``policy.overrides``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REPORTED = ("accuracy/qa", "score/qa", "valid_call_rate", "calls_per_task", "zoom_on_target/qa")
"""The metrics printed (when defined)."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model folder (policy.init of rl agent)")
    parser.add_argument("--tasks", required=True, help="task file (JSONL, rl.agent.task_file)")
    parser.add_argument(
        "--image-folder", default=None, help="folder of the task images (default: the file's)"
    )
    parser.add_argument("--max-side", type=int, default=1024, help="longest image side read (0 = whole)")
    parser.add_argument(
        "--image-cache",
        default=None,
        help="folder to keep decoded images in, memory-mapped (data.image_cache)",
    )
    parser.add_argument(
        "--no-tools", action="store_true", help="no tool instructions or tools: answer at once"
    )
    parser.add_argument("--tool-module", action="append", default=[], help="module registering your tools")
    parser.add_argument(
        "--tool-options",
        default=None,
        metavar="YAML",
        help="tool modules' options, as rl agent's tool_options: '{rl.agent.find: {labels: true}}'",
    )
    parser.add_argument(
        "--tools-start",
        default=None,
        metavar="DIR",
        help="the model tool modules configure from, as rl agent's policy.init (the find tool's namer: "
        "give the run's policy.init to evaluate as it trained; default --model)",
    )
    parser.add_argument(
        "--limit", action="append", default=[], metavar="KEY=N", help="NoteVLM limit to raise"
    )
    parser.add_argument("--max-turns", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument(
        "--max-length", type=int, default=1024, help="most ids of a trajectory (0 = no limit)"
    )
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (policy.device)")
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="policy.dtype"
    )
    parser.add_argument("--n-boot", type=int, default=1000, help="bootstrap resamples of the intervals")
    parser.add_argument("--rows-out", default=None, help="write one JSON row per task here")
    parser.add_argument("--transcripts-out", default=None, help="write the trajectories here (text)")
    parser.add_argument("--json", action="store_true", help="print the metrics as JSON")
    parser.add_argument(
        "--baseline", default=None, help="another model on the same tasks: paired gains of --model over it"
    )
    parser.add_argument("--baseline-no-tools", action="store_true", help="the baseline answers without tools")
    parser.add_argument(
        "--quote", action="append", default=[], metavar="TOOL.ARG",
        help="a tool argument whose value quotes the user's words, constrained at decode time "
        "(rl agent's decode.quote; repeat for more): --quote find.object",
    )  # fmt: skip
    parser.add_argument(
        "--counts", action="store_true",
        help="number words in answers copy the tools' counts, constrained at decode time (decode.counts)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    import torch

    from mm.errors import UserError
    from mm.train.devices import resolve_device
    from mm.train.metrics import atomic_write_text
    from rl.agent.evaluate import paired_gains, summarise
    from rl.agent.loop import LoopConfig
    from rl.agent.quote import check_quote, quote_of
    from rl.agent.task_file import read_task_file
    from rl.agent.tools import TOOLS, prepare_tool_modules

    if args.n_boot < 10:
        raise UserError(f"--n-boot must be >= 10, got {args.n_boot}")
    device = resolve_device(args.device, key="--device")
    configure_tools(args)
    quote = quote_of(args.quote)
    check_quote(quote, TOOLS)
    tasks = read_task_file(
        args.tasks, image_folder=args.image_folder, max_side=args.max_side, image_cache=args.image_cache
    )
    try:
        loop = LoopConfig(
            max_turns=args.max_turns, max_new_tokens=args.max_new_tokens, max_tokens=args.max_tokens,
            max_length=args.max_length or None, batch_size=args.batch_size, quote=quote,
            counts=args.counts,
        )  # fmt: skip
    except ValueError as e:
        raise UserError(str(e)) from None
    dtype = None if args.dtype == "auto" else getattr(torch, args.dtype)
    if not args.no_tools or (args.baseline is not None and not args.baseline_no_tools):
        prepare_tool_modules(args.tool_module, tasks)  # find's namer names every photo's regions ahead

    def evaluate(model: str, tools: bool) -> tuple[list[dict], list]:
        return _rows(model, tools, tasks, loop, args.limit, device, dtype)

    rows, trajs = evaluate(args.model, not args.no_tools)
    if args.rows_out:
        atomic_write_text(Path(args.rows_out), "".join(json.dumps(r) + "\n" for r in rows))
    if args.transcripts_out:
        atomic_write_text(Path(args.transcripts_out), "\n\n".join(t.transcript() for t in trajs) + "\n")
    result = {
        "model": args.model,
        "tasks": args.tasks,
        "n": len(rows),
        "metrics": _shown(summarise(rows, n_boot=args.n_boot)),
    }
    if args.baseline is not None:
        base_rows, _ = evaluate(args.baseline, not args.baseline_no_tools)
        result["baseline"] = {"model": args.baseline, "tools": not args.baseline_no_tools,
                              "metrics": _shown(summarise(base_rows, n_boot=args.n_boot))}  # fmt: skip
        result["gains"] = paired_gains(base_rows, rows, REPORTED, n_boot=args.n_boot)
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    mode = "no tools" if args.no_tools else "tools"
    print(f"[agent-eval] {args.model} on {args.tasks}: {len(rows)} tasks, {mode}")
    _print(result["metrics"])
    if args.baseline is not None:
        base_mode = "no tools" if args.baseline_no_tools else "tools"
        print(f"[agent-eval] baseline {args.baseline}, {base_mode}:")
        _print(result["baseline"]["metrics"])
        print("[agent-eval] model - baseline, paired over the same tasks:")
        _print(result["gains"], signed=True)
    return 0


def configure_tools(args: argparse.Namespace) -> None:
    """Import ``--tool-module``s, check ``--tool-options`` against what each declares, and configure each
    module as ``rl agent`` does, from ``--tools-start`` (default ``--model``) as the policy's start."""
    from types import SimpleNamespace

    import yaml

    from mm.errors import UserError
    from rl.agent.tools import check_tool_options, configure_tool_modules, import_tool_modules

    import_tool_modules(args.tool_module)
    options = yaml.safe_load(args.tool_options) if args.tool_options else {}
    if not isinstance(options, dict) or not all(isinstance(v, dict) for v in options.values()):
        raise UserError(
            f"--tool-options {args.tool_options!r}: give a mapping of module to options, e.g. "
            "'{rl.agent.find: {labels: true}}'"
        )
    unused = [m for m in options if m not in args.tool_module]
    if unused:
        raise UserError(
            f"--tool-options for {unused}, which no --tool-module loads; add a --tool-module for each"
        )
    check_tool_options(options)
    start = SimpleNamespace(init=args.tools_start or args.model)
    configure_tool_modules(args.tool_module, SimpleNamespace(policy=start, tool_options=options))


def _rows(model: str, tools: bool, tasks, loop, limits, device, dtype) -> tuple[list[dict], list]:
    """Greedy rollouts of ``model`` on ``tasks`` (with the loop's tools or none): eval rows, trajectories."""
    from dataclasses import replace

    from rl.agent.backend import backend_for
    from rl.agent.loop import rollout
    from rl.agent.policy_init import load_policy
    from rl.agent.scoring import eval_row
    from rl.agent.stages import NO_TOOLS
    from rl.agent.tools import TOOLS

    adapter = load_policy(model, list(limits), dtype=dtype)
    adapter.model.to(device)
    trajs = rollout(
        backend_for(adapter),
        tasks,
        replace(loop, instructions=tools, quote=loop.quote if tools else {}, counts=loop.counts and tools),
        registry=TOOLS if tools else NO_TOOLS,
    )
    return [eval_row(t, seed=0) for t in trajs], trajs


def _shown(metrics: dict) -> dict:
    return {k: metrics[k] for k in REPORTED if k in metrics}


def _print(metrics: dict, *, signed: bool = False) -> None:
    for name, m in metrics.items():
        band = f" [{m['low']:+.3f}, {m['high']:+.3f}]" if signed else f" [{m['low']:.3f}, {m['high']:.3f}]"
        value = f"{m['value']:+.3f}" if signed else f"{m['value']:.3f}"
        print(f"  {name}: {value}{band if m.get('low') is not None else ''}")

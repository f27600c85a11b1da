"""Does a tool policy's first ``find`` call copy the asked thing, or name something it sees?

    python benchmarks/copy_probe.py runs/s1-0 --stage sft_tool [--tasks 48] [--quote]

The held-out detail tasks of an ``rl agent`` run (its world and ``eval.start``), and the first turn of the
policy of one stage (``sft_tool``, ``grpo``, ...), greedy, with the run's tool instructions. Three versions of
each task:

- *asked*: the task as it is; ``copies`` counts calls whose ``object`` names the asked thing;
- *other photo*: the question of task i with the photos of task i+1; ``copies`` as before, ``seen`` counts
  calls that name a tiny thing of those photos instead (what the photos suggest, not the question);
- *absent*: the asked thing replaced in the question by a tiny thing of the world that is not on that
  photo's tray; ``copies`` counts calls that name the new thing.

A policy that copies scores ``copies`` on all three; one that names what it sees keeps ``copies`` low on
*asked* and *absent* and ``seen`` high. ``--quote`` decodes with ``decode.quote={find: [object]}``
(``rl.agent.quote``) whatever the run's config says; without it, as the run's config says.

``--timing N``: the constraint's cost instead: the *asked* first turns decoded free and quoted, in turn, N
times each in one process; median seconds of each and their ratio.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

QUOTE = {"find": ["object"]}
_OBJECT = re.compile(r'"object"\s*:\s*"([^"]*)"')


def called_object(text: str) -> str | None:
    """The ``object`` of a turn's call, or None."""
    m = _OBJECT.search(text)
    return m.group(1) if m else None


def names(value: str | None, category: str) -> bool:
    """Whether a call's ``object`` names ``category`` (its name or plural, as a word)."""
    from mm.world import vocab

    if value is None:
        return False
    words = set(re.findall(r"[a-z]+", value.lower()))
    c = vocab.category(category)
    return c.name in words or c.plural in words


def asked_words(task: Any, category: str) -> str:
    """How a detail question names ``category``: the plural for a count, the name for a colour."""
    from mm.world import vocab

    c = vocab.category(category)
    return c.plural if task.meta["ask"] == "count" else c.name


def absent_question(task: Any, categories: Sequence[str], rng: np.random.Generator) -> tuple[str, str]:
    """The question with its thing replaced by one of ``categories`` not on the asked photo's tray."""
    here = {o[0] for o in task.meta["tiny"]}
    other = [c for c in categories if c not in here]
    new = other[int(rng.integers(len(other)))]
    old = f"tiny {asked_words(task, task.meta['object'])}"
    return task.question.replace(old, f"tiny {asked_words(task, new)}"), new


def first_calls(
    backend: Any, cfg: Any, items: Sequence[tuple[Any, str]], quote: dict, batch: int = 16
) -> list:
    """The first turn's text for each ``(photos, question)``."""
    from types import SimpleNamespace

    from rl.agent.backend import Sampling
    from rl.agent.loop import prompt_text
    from rl.agent.stages import loop_config
    from rl.agent.tools import TOOLS

    loop = loop_config(cfg, tools=True)
    texts = [prompt_text(SimpleNamespace(question=q), TOOLS, loop) for _, q in items]
    out = []
    for i in range(0, len(items), batch):
        rows = [backend.prompt(p, t) for (p, _), t in zip(items[i : i + batch], texts[i : i + batch])]
        kw = {"quote": quote, "user_texts": [q for _, q in items[i : i + batch]]} if quote else {}
        out += [t.text for t in backend.generate(rows, max_new_tokens=48, sampling=Sampling(), **kw)]
    return out


def load_run(run: Path, stage: str, n: int) -> tuple[Any, Any, list]:
    """A run's config, the policy of one stage, and its first ``n`` held-out detail tasks."""
    from mm.config import load_config
    from rl.agent.config import AgentRunConfig
    from rl.agent.note_model import starting_from_it
    from rl.agent.stages import build_backend
    from rl.agent.world_tasks import world_tasks

    cfg = load_config(AgentRunConfig, run / "config.yaml")
    if cfg.note_model.build:  # the run built its note model: the policy started from it
        cfg = starting_from_it(cfg, run / "note_model")
    for module in cfg.tool_modules:  # registered for the instructions; no call is run
        importlib.import_module(module)
    backend = build_backend(cfg, run / stage / "model.pt")
    return cfg, backend, list(world_tasks(cfg.world, "detail", "test", n, start=cfg.eval.start))


def timing(run: Path, stage: str, n: int, repeats: int) -> dict[str, Any]:
    """Median seconds of the asked first turns, free and quoted (interleaved), and their ratio."""
    cfg, backend, tasks = load_run(run, stage, n)
    items = [(t.sources, t.question) for t in tasks]
    seconds: dict[str, list[float]] = {"free": [], "quoted": []}
    for _ in range(repeats):
        for name, quote in (("free", {}), ("quoted", QUOTE)):
            t0 = time.perf_counter()
            first_calls(backend, cfg, items, quote)
            seconds[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in seconds.items()}
    return {"run": str(run), "stage": stage, "tasks": n, "repeats": repeats, "median_s": med,
            "quoted_over_free": med["quoted"] / med["free"], "seconds": seconds}  # fmt: skip


def copy_probe(run: Path, stage: str, n: int, *, quote: bool = False, seed: int = 0) -> dict[str, Any]:
    cfg, backend, tasks = load_run(run, stage, n)
    used = QUOTE if quote else cfg.decode.quote
    categories = sorted({o[0] for t in tasks for o in t.meta["tiny"]})
    rng = np.random.default_rng(seed)
    nxt = tasks[1:] + tasks[:1]
    absent = [absent_question(t, categories, rng) for t in tasks]
    asked = first_calls(backend, cfg, [(t.sources, t.question) for t in tasks], used)
    swapped = first_calls(backend, cfg, [(b.sources, a.question) for a, b in zip(tasks, nxt)], used)
    other = first_calls(backend, cfg, [(t.sources, q) for t, (q, _) in zip(tasks, absent)], used)

    def seen(text: str, a: Any, b: Any) -> bool:
        value = called_object(text)
        return not names(value, a.meta["object"]) and any(names(value, o[0]) for o in b.meta["tiny"])

    return {
        "run": str(run), "stage": stage, "tasks": len(tasks), "quote": used,
        "asked": {"copies": sum(names(called_object(c), t.meta["object"]) for c, t in zip(asked, tasks))},
        "other_photo": {
            "copies": sum(names(called_object(c), a.meta["object"]) for c, a in zip(swapped, tasks)),
            "seen": sum(seen(c, a, b) for c, a, b in zip(swapped, tasks, nxt)),
        },
        "absent": {"copies": sum(names(called_object(c), new) for c, (_, new) in zip(other, absent))},
        "examples": [
            {"question": t.question, "asked": called_object(c), "absent": q, "absent_call": called_object(o)}
            for t, c, (q, _), o in list(zip(tasks, asked, absent, other))[:4]
        ],
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="an rl agent run folder (its config.yaml and stage weights)")
    parser.add_argument("--stage", default="sft_tool", help="whose model.pt: sft_tool, grpo, ppo")
    parser.add_argument("--tasks", type=int, default=48, help="held-out detail tasks (default 48)")
    parser.add_argument("--quote", action="store_true", help="decode with decode.quote={find: [object]}")
    parser.add_argument("--timing", type=int, default=0, metavar="N", help="time free vs quoted, N each")
    args = parser.parse_args(argv)
    if args.timing:
        print(json.dumps(timing(args.run, args.stage, args.tasks, args.timing), indent=1))
        return 0
    print(json.dumps(copy_probe(args.run, args.stage, args.tasks, quote=args.quote), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

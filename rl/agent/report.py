"""The ``rl agent`` report: metrics with intervals per model, the targets, transcripts and curves.

Writes ``OUT/report.json`` (every metric of every model with its bootstrap 95% interval, the paired
gains of the tool GRPO model over the no-tool SFT model, and each target with whether it held; with a PPO
model also its gains over the no-tool SFT and the tool GRPO models), ``OUT/report.md`` (the same as
tables), ``OUT/transcripts.md`` (a few held-out trajectories with their tool calls, observations and
simulated-user turns) and ``OUT/sft.png`` / ``OUT/grpo.png`` / ``OUT/ppo.png`` (the curves).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mm.train.metrics import atomic_write_text, plot_metrics, read_metrics
from rl.agent.config import AgentRunConfig
from rl.agent.evaluate import paired_gains, summarise

TARGETS: tuple[tuple[str, str, float], ...] = (
    ("accuracy/detail", "gain>=", 0.15),
    ("accuracy/change", "gain>=", 0.15),
    ("caption/attribute_hallucination", "gain<", 0.0),
    ("caption/count_hallucination", "gain<", 0.0),
    ("valid_call_rate", "value>=", 0.95),
    ("goal_reached", "gain>", 0.0),
)
"""(metric, test, threshold): the tool GRPO model against the no-tool SFT model ("gain") or alone."""
TARGET_RUN_SECONDS = 1200.0
"""Target for the whole run's wall time (sum of stage times, the note model's included): 20 minutes."""
STAGES = ("note_model", "init", "perception", "sft_tool", "sft_notool", "grpo", "ppo", "eval")
"""The stages whose times the report lists, in order."""
SHOWN = ("accuracy/detail", "accuracy/change", "accuracy/caption", "accuracy/dialogue", "score/detail",
         "score/change", "score/caption", "score/dialogue", "caption/attribute_hallucination",
         "caption/count_hallucination", "caption/attribute_claims_per_caption",
         "caption/attribute_false_per_caption", "caption/count_claims_per_caption",
         "caption/count_false_per_caption", "valid_call_rate", "calls_per_task", "goal_reached",
         "zoom_on_target/detail", "zoom_on_target/caption", "accuracy/qa", "zoom_on_target/qa")  # fmt: skip
"""Metrics in the report's table, in order."""


def _read_rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def check_targets(metrics: dict[str, dict], gains: dict[str, dict]) -> list[dict[str, Any]]:
    """Each target of :data:`TARGETS` with the value it is judged on and whether it held."""
    out = []
    for name, test, threshold in TARGETS:
        source = gains if test.startswith("gain") else metrics
        value = source.get(name, {}).get("value")
        op = test.removeprefix("gain").removeprefix("value")
        held = None if value is None else {">=": value >= threshold, "<": value < threshold,
                                           ">": value > threshold}[op]  # fmt: skip
        what = "tool GRPO - no-tool SFT" if test.startswith("gain") else "tool GRPO"
        out.append(
            {"metric": name, "judged_on": what, "test": f"{op} {threshold}", "value": value, "held": held}
        )
    return out


def _fmt(m: dict[str, Any] | None) -> str:
    if not m or m.get("value") is None:
        return "-"
    lo, hi = m.get("low"), m.get("high")
    band = f" [{lo:.3f}, {hi:.3f}]" if lo is not None and hi is not None else ""
    return f"{m['value']:.3f}{band}"


def model_rows(out: Path, models: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Each model's eval rows of run folder ``out``."""
    return {name: _read_rows(out / "eval" / f"{name}.jsonl") for name in models}


GAINS = (("tool_grpo", "notool_sft"), ("tool_ppo", "notool_sft"), ("tool_ppo", "tool_grpo"))
"""(model, baseline) pairs whose paired gains the report gives, where both models were evaluated."""


def compare_models(
    rows: dict[str, list[dict[str, Any]]], n_boot: int, *, targets: bool = True
) -> dict[str, Any]:
    """Metrics per model, paired gains (:data:`GAINS`), the targets (on the GRPO gains over no-tool SFT;
    ``targets=False``, for an eval of a task file, none: they are the world tasks')."""
    metrics = {name: summarise(r, n_boot=n_boot) for name, r in rows.items()}
    names = [n for n, _, _ in TARGETS] + ["accuracy/caption", "accuracy/dialogue"]
    names += [f"caption/{k}_false_per_caption" for k in ("attribute", "count")] + ["zoom_on_target/detail"]
    names += ["accuracy/qa", "zoom_on_target/qa", "calls_per_task"]
    gains = {
        f"gains_{model}_over_{base}": paired_gains(rows[base], rows[model], names, n_boot=n_boot)
        for model, base in GAINS
        if model in rows and base in rows
    }
    checked = check_targets(metrics["tool_grpo"], gains["gains_tool_grpo_over_notool_sft"]) if targets else []
    return {"metrics": metrics, **gains, "targets": checked}


def write_report(cfg: AgentRunConfig, out: Path, models: dict[str, tuple[str, bool]]) -> dict[str, Any]:
    """Write the report files (module docstring); returns a short result for ``report/result.json``."""
    compared = compare_models(model_rows(out, list(models)), cfg.eval.n_boot, targets=cfg.eval.file is None)
    targets = compared["targets"]
    seconds = stage_seconds(out)
    if targets:
        total = round(sum(seconds.values()), 1)
        targets = [*targets, {"metric": "wall_seconds", "judged_on": "sum of stage times",
                              "test": f"<= {TARGET_RUN_SECONDS:.0f}", "value": total,
                              "held": total <= TARGET_RUN_SECONDS}]  # fmt: skip
        compared["targets"] = targets
    report = {
        "seeds": list(cfg.eval.seeds), "split": cfg.eval.split, "tasks_per_kind": cfg.eval.tasks_per_kind,
        "file": cfg.eval.file,
        **compared,
        "stage_seconds": seconds, "reading_check": _reading_check(out),
    }  # fmt: skip
    atomic_write_text(out / "report.json", json.dumps(report, indent=1))
    atomic_write_text(out / "report.md", markdown(report, list(models)))
    _transcripts(out, cfg)
    _curves(out)
    return {
        "targets_held": sum(bool(t["held"]) for t in targets),
        "targets": len(targets),
        "models": list(models),
    }


def stage_seconds(out: Path) -> dict[str, float]:
    """Each finished stage's wall time in seconds; the note model's is the sum of its sub-stages' (none
    listed when the run started from ``policy.init`` and built no note model)."""
    seconds = {}
    for s in STAGES:
        path = out / s / "result.json"
        if not path.exists():
            continue
        res = json.loads(path.read_text())
        if s == "note_model":
            subs = [v["seconds"] for v in res.values() if isinstance(v, dict) and "seconds" in v]
            if subs:
                seconds[s] = round(sum(subs), 1)
        elif res.get("seconds") is not None:
            seconds[s] = res["seconds"]
    return seconds


def _reading_check(out: Path) -> dict[str, Any] | None:
    """The perception stage's reading check on train notes it did not train on (None without one)."""
    path = out / "perception" / "result.json"
    return json.loads(path.read_text()).get("reading_check") if path.exists() else None


def markdown(report: dict[str, Any], models: list[str]) -> str:
    tasks = (
        f"The tasks of {report['file']}"
        if report.get("file")
        else f"World seeds {report['seeds']}, {report.get('split', 'test')} split, "
        f"{report['tasks_per_kind']} tasks per kind per seed"
    )
    lines = [
        "# rl agent: held-out report",
        "",
        f"{tasks}; greedy decoding; bootstrap 95% intervals over tasks.",
        "",
    ]
    pairs = [(m, b) for m, b in GAINS if f"gains_{m}_over_{b}" in report]
    lines += [
        "| metric | " + " | ".join(models) + "".join(f" | {m} - {b}" for m, b in pairs) + " |",
        "|---|" + "---|" * (len(models) + len(pairs)),
    ]
    for name in SHOWN:
        if not any(name in report["metrics"][m] for m in models):
            continue  # a metric of task kinds this eval does not have
        cells = [_fmt(report["metrics"][m].get(name)) for m in models]
        cells += [_fmt(report[f"gains_{m}_over_{b}"].get(name)) for m, b in pairs]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "## Targets", ""]
    if not report["targets"]:
        lines += [
            "None: the targets are the world tasks' (`rl.agent.report.TARGETS`); this eval is a task file."
        ]
    else:
        lines += ["| metric | judged on | test | value | held |", "|---|---|---|---|---|"]
    for t in report["targets"]:
        fmt = ".1f" if t["metric"] == "wall_seconds" else ".3f"
        value = "-" if t["value"] is None else format(t["value"], fmt)
        held = "n/a" if t["held"] is None else ("yes" if t["held"] else "no")
        lines.append(f"| {t['metric']} | {t['judged_on']} | {t['test']} | {value} | {held} |")
    if report.get("reading_check"):
        lines += [
            "", "## Perception: greedy reading of train notes it did not train on", "",
            "| view/question | items | accuracy | share of the most frequent answer |", "|---|---|---|---|",
        ]  # fmt: skip
        for key, r in report["reading_check"].items():
            lines.append(f"| {key} | {r['n']} | {r['accuracy']:.3f} | {r['top_answer_share']:.3f} |")
    secs = ", ".join(f"{k} {v} s" for k, v in report.get("stage_seconds", {}).items())
    lines += ["", f"Stage times: {secs}." if secs else "", ""]
    return "\n".join(lines)


def _transcripts(out: Path, cfg: AgentRunConfig) -> None:
    parts = ["# Held-out transcripts", ""]
    for name in ("tool_grpo", "tool_ppo", "notool_sft"):
        path = out / "eval" / f"{name}.transcripts.md"
        if path.exists():
            parts += [f"## {name}", "", "```", path.read_text(), "```", ""]
    atomic_write_text(out / "transcripts.md", "\n".join(parts))


def _curves(out: Path) -> None:
    sft = [
        dict(r, stage=s) for s in ("sft_tool", "sft_notool") for r in read_metrics(out / s / "metrics.jsonl")
    ]
    if sft:
        tool = [r for r in sft if r["stage"] == "sft_tool"]
        notool = [dict(r, notool_loss=r["loss"]) for r in sft if r["stage"] == "sft_notool"]
        plot_metrics(tool + notool, ["loss", "notool_loss"], out / "sft.png", title="SFT: tool / no-tool")
    grpo = read_metrics(out / "grpo" / "metrics.jsonl")
    if grpo:
        keys = ["reward_mean", "valid_call_rate", "mean_turns", "loss"]
        plot_metrics(grpo, keys, out / "grpo.png", title="multi-turn GRPO")
    ppo = read_metrics(out / "ppo" / "metrics.jsonl")
    if ppo:
        keys = ["reward_mean", "valid_call_rate", "value_loss", "explained_variance"]
        plot_metrics(ppo, keys, out / "ppo.png", title="multi-turn PPO with a critic")

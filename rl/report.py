"""The pipeline's report: ``metrics.json`` (everything machine-readable), ``report.md`` and PNG plots.

:func:`build_metrics` turns the stage records of :mod:`rl.pipeline` into one dict: per-model summaries
(:func:`model_summary`), before/after changes against the SFT model (:func:`changes`) and the pipeline's
targets checked one by one (:func:`target_checks`); :func:`write_report` renders and writes the files.
Everything but the plotting and writing is pure.

Conventions: CHAIR_i change is *relative* ((after - before) / before), recall and POPE F1 changes are
in *points* (x 100, absolute), mean caption length change is in percent. Object precision is
1 - CHAIR_i (the fraction of object mentions that are present).

Uncertainty (:mod:`mm.eval.bootstrap`): every model metric carries its bootstrap 95% interval (resampling
held-out notes for CHAIR, images for POPE; ``intervals`` in a summary), every change against SFT its
*paired* bootstrap interval (the same resampled notes for both models; ``intervals`` in a change), and
every target says whether it holds at the point estimate (``met``) and over its whole interval
(``met_at_interval``: both ends meet the goal; None when the eval records carry no per-note sums).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from rl.report_uncertainty import (
    change_intervals,
    error_bars,
    seed_lines,
    seed_summary,
    summary_intervals,
    without_units,
)

TARGET_PIPELINE_SECONDS = 15 * 60
"""Target for the whole pipeline's wall time (sum of stage times), post-training included."""

SUMMARY_KEYS: tuple[tuple[str, str, str], ...] = (
    ("recall", "object recall", "{:.3f}"),
    ("precision", "object precision", "{:.3f}"),
    ("chair_i", "CHAIR_i", "{:.3f}"),
    ("chair_s", "CHAIR_s", "{:.3f}"),
    ("mean_length", "mean length (words)", "{:.1f}"),
    ("pope_adversarial_f1", "POPE-adv F1", "{:.3f}"),
    ("pope_adversarial_yes_ratio", "POPE-adv yes-ratio", "{:.3f}"),
    ("pope_popular_f1", "POPE-pop F1", "{:.3f}"),
    ("pope_random_f1", "POPE-rand F1", "{:.3f}"),
    ("partner_frac", "partner share of halluc.", "{:.2f}"),
    ("attribute_rate", "attribute halluc. rate", "{:.3f}"),
    ("count_rate", "count halluc. rate", "{:.3f}"),
)
"""(key, header, format) of the before/after table."""

CHANGE_KEYS: tuple[tuple[str, str, str], ...] = (
    ("chair_i_rel_change", "CHAIR_i change (rel.)", "{:+.1%}"),
    ("recall_change_points", "recall change (points)", "{:+.1f}"),
    ("length_change_pct", "length change", "{:+.1f}%"),
    ("pope_adversarial_f1_change_points", "POPE-adv F1 change (points)", "{:+.1f}"),
    ("pope_adversarial_yes_ratio", "POPE-adv yes-ratio", "{:.3f}"),
    ("attribute_rate_rel_change", "attribute halluc. change (rel.)", "{:+.1%}"),
)
"""(key, header, format) of the change table (each post-trained model vs SFT)."""


def model_summary(ev: dict[str, Any]) -> dict[str, Any]:
    """Flat scalars of one :func:`mm.eval.runners.evaluate_model` result."""
    ch = ev["chair"]
    out: dict[str, Any] = {
        "recall": ch["recall"],
        "precision": 1.0 - ch["chair_i"] if ch.get("n_mentions") else 0.0,
        "chair_i": ch["chair_i"],
        "chair_s": ch["chair_s"],
        "mean_length": ch["mean_length"],
        "n_notes": ev.get("n_notes"),
        "n_mentions": ch.get("n_mentions"),
        "n_hallucinated": ch.get("n_hallucinated"),
    }
    for split, p in ev.get("pope", {}).items():
        for k in ("f1", "yes_ratio", "accuracy", "precision", "recall"):
            if k in p:
                out[f"pope_{split}_{k}"] = p[k]
    causes = ev.get("causes") or {}
    for k in ("partner", "confusion", "other", "total", "partner_frac", "confusion_frac", "other_frac"):
        if k in causes:
            out[k] = causes[k]
    for kind in ("attribute", "count"):
        if kind in (ev.get("claims") or {}):
            out[f"{kind}_rate"] = ev["claims"][kind]["rate"]
    out["intervals"] = summary_intervals(ev)
    return out


def _rel(after: float, before: float) -> float | None:
    return (after - before) / before if before else None


def changes(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Changes of a post-trained model's summary against the SFT summary (see module conventions)."""
    rel_len = _rel(after["mean_length"], before["mean_length"])
    out: dict[str, Any] = {
        "chair_i_rel_change": _rel(after["chair_i"], before["chair_i"]),
        "chair_s_rel_change": _rel(after["chair_s"], before["chair_s"]),
        "recall_change_points": 100.0 * (after["recall"] - before["recall"]),
        "length_change_pct": None if rel_len is None else 100.0 * rel_len,
    }
    for split in ("adversarial", "popular", "random"):
        k = f"pope_{split}_f1"
        if k in before and k in after:
            out[f"{k}_change_points"] = 100.0 * (after[k] - before[k])
    if "attribute_rate" in before and "attribute_rate" in after:
        out["attribute_rate_rel_change"] = _rel(after["attribute_rate"], before["attribute_rate"])
    if "pope_adversarial_yes_ratio" in after:
        out["pope_adversarial_yes_ratio"] = after["pope_adversarial_yes_ratio"]
    return out


def _check(
    name: str,
    value: Any,
    goal: str,
    ok: bool | None,
    fmt: str = "{:.3f}",
    *,
    interval: list[float] | None = None,
    holds: Any = None,
) -> dict[str, Any]:
    """One target row; ``holds(x) -> bool`` is the goal, checked at both ends of ``interval`` (a goal
    is a half-line or a band, so both ends meeting it means the whole interval does)."""
    at = None if interval is None or holds is None else bool(holds(interval[0]) and holds(interval[1]))
    return {"target": name, "value": value, "goal": goal, "met": ok, "format": fmt, "interval": interval,
            "met_at_interval": at}  # fmt: skip


def target_checks(
    models: dict[str, dict[str, Any]], deltas: dict[str, dict[str, Any]], pipeline_seconds: float
) -> list[dict[str, Any]]:
    """The pipeline's targets, each with the measured value, the goal and whether it is met."""
    rows = [
        _check("pipeline wall time (s)", round(pipeline_seconds, 1), f"<= {TARGET_PIPELINE_SECONDS}",
               pipeline_seconds <= TARGET_PIPELINE_SECONDS, "{:.0f}"),
    ]  # fmt: skip
    sft = models.get("sft")
    if sft:
        si = sft.get("intervals") or {}
        rows += [
            _check("SFT object recall", sft["recall"], ">= 0.85", sft["recall"] >= 0.85,
                   interval=si.get("recall"), holds=lambda x: x >= 0.85),
            _check("SFT CHAIR_i", sft["chair_i"], ">= 0.10", sft["chair_i"] >= 0.10,
                   interval=si.get("chair_i"), holds=lambda x: x >= 0.10),
            _check("SFT partner share of hallucinated mentions", sft.get("partner_frac"), ">= 0.50",
                   None if sft.get("partner_frac") is None else sft["partner_frac"] >= 0.5),
        ]  # fmt: skip
    for name, d in deltas.items():
        ci, rc, lc = d["chair_i_rel_change"], d["recall_change_points"], d["length_change_pct"]
        di = d.get("intervals") or {}
        mi = models[name].get("intervals") or {}
        rows += [
            _check(
                f"{name}: CHAIR_i change (rel.)", ci, "<= -60%", None if ci is None else ci <= -0.6,
                "{:+.1%}", interval=di.get("chair_i_rel_change"), holds=lambda x: x <= -0.6,
            ),
            _check(f"{name}: recall change (points)", rc, ">= -2", rc >= -2.0, "{:+.1f}",
                   interval=di.get("recall_change_points"), holds=lambda x: x >= -2.0),
            _check(
                f"{name}: mean length change (%)",
                lc,
                "within +-10%",
                None if lc is None else abs(lc) <= 10,
                "{:+.1f}",
                interval=di.get("length_change_pct"),
                holds=lambda x: abs(x) <= 10,
            ),
        ]  # fmt: skip
        f1_before = sft.get("pope_adversarial_f1") if sft else None
        f1_after = models[name].get("pope_adversarial_f1")
        if f1_before is not None and f1_after is not None:
            if f1_before > 0.85:
                goal, ok = ">= 0.95 (SFT already > 0.85)", f1_after >= 0.95
                iv, holds = mi.get("pope_adversarial_f1"), (lambda x: x >= 0.95)
            else:
                goal, ok = "+10 points", f1_after - f1_before >= 0.10
                # the interval of the paired change, shifted to the after-F1 scale of the row
                dv = di.get("pope_adversarial_f1_change_points")
                iv = None if dv is None else [f1_before + dv[0] / 100, f1_before + dv[1] / 100]
                holds = lambda x, b=f1_before: x - b >= 0.10  # noqa: E731
            rows.append(_check(f"{name}: POPE-adv F1", f1_after, goal, ok, interval=iv, holds=holds))
        yr = models[name].get("pope_adversarial_yes_ratio")
        if yr is not None:
            rows.append(
                _check(
                    f"{name}: POPE-adv yes-ratio",
                    yr,
                    "0.50 +- 0.05",
                    abs(yr - 0.5) <= 0.05,
                    interval=mi.get("pope_adversarial_yes_ratio"),
                    holds=lambda x: abs(x - 0.5) <= 0.05,
                )  # fmt: skip
            )
    return rows


def build_metrics(
    stages: dict[str, dict[str, Any]],
    *,
    post: list[str],
    wall_seconds: float,
    rss: dict[str, float],
    load: list[float] | None,
    seed_runs: dict[str, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """metrics.json: stages (time, memory, own metrics), retrieval, models, changes, targets, headline, and
    ``seeds`` (every training-seed run's changes, mean and sd) when ``seed_runs`` is given."""
    models = {
        m: model_summary(stages[f"eval_{m}"]["metrics"]) for m in ["sft", *post] if f"eval_{m}" in stages
    }
    deltas = {m: changes(models["sft"], models[m]) for m in post if m in models and "sft" in models}
    for m, d in deltas.items():
        d["intervals"] = change_intervals(stages["eval_sft"]["metrics"], stages[f"eval_{m}"]["metrics"])
    pipeline_seconds = sum(float(s["seconds"]) for s in stages.values())
    pre = stages.get("pretrain", {}).get("metrics", {})
    retrieval = {k: v for k, v in pre.items() if "R@" in k}
    peak = max([rss["peak_rss_mb"], *(float(s.get("peak_rss_mb", 0)) for s in stages.values())])
    targets = target_checks(models, deltas, pipeline_seconds)
    headline: dict[str, Any] = {
        "pipeline_seconds": round(pipeline_seconds, 1),
        "peak_rss_mb": peak,
        "text2note_R@1": retrieval.get("text2note_R@1"),
        "targets_met": sum(1 for t in targets if t["met"]),
        "targets_met_at_interval": sum(1 for t in targets if t["met_at_interval"]),
        "targets_with_interval": sum(1 for t in targets if t["met_at_interval"] is not None),
        "targets": len(targets),
    }
    for m, s in models.items():
        headline[m] = {k: s.get(k) for k in ("recall", "chair_i", "mean_length", "pope_adversarial_f1")}
    return {
        "pipeline_seconds": pipeline_seconds,
        "wall_seconds_this_run": wall_seconds,
        "peak_rss_mb": peak,
        "peak_rss_children_mb": rss.get("peak_rss_children_mb"),
        "load_avg": load,
        "stages": {
            n: {
                **{k: s.get(k) for k in ("status", "seconds", "peak_rss_mb", "peak_rss_children_mb")},
                "metrics": without_units(s.get("metrics")),
            }
            for n, s in stages.items()
        },
        "retrieval": retrieval,
        "models": models,
        "changes": deltas,
        "targets": targets,
        "headline": headline,
        **({"seeds": seed_summary(seed_runs)} if seed_runs else {}),
    }


# ---------------------------------------------------------------- markdown


def _fmt(v: Any, fmt: str) -> str:
    if v is None:
        return "n/a"
    try:
        return fmt.format(v)
    except (ValueError, TypeError):
        return str(v)


def _fmt_interval(iv: list[float] | None, fmt: str) -> str:
    return "n/a" if not iv else f"[{_fmt(iv[0], fmt)}, {_fmt(iv[1], fmt)}]"


def _brackets(iv: list[float] | None, fmt: str) -> str:
    return "" if not iv else " " + _fmt_interval(iv, fmt)


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def render_markdown(metrics: dict[str, Any], plots: dict[str, str]) -> str:
    """report.md from :func:`build_metrics`' dict; ``plots`` maps a title to a PNG path relative to OUT."""
    lines = ["# notelens pipeline report", ""]
    h = metrics["headline"]
    load = metrics.get("load_avg")
    lines += [
        f"Pipeline time (sum of stage wall times): **{metrics['pipeline_seconds']:.0f} s**; "
        f"peak memory (max RSS of the pipeline process): **{metrics['peak_rss_mb']:.0f} MiB** "
        f"(world-rendering workers: {_fmt(metrics.get('peak_rss_children_mb'), '{:.0f}')} MiB); "
        f"load average at the end {load if load else 'n/a'}. Targets met: {h['targets_met']}/{h['targets']} "
        f"at the point estimate; {h.get('targets_met_at_interval', 0)}/{h.get('targets_with_interval', 0)} "
        "over their whole 95% interval.",
        "",
        "## Before / after (held-out notes)",
        "",
    ]
    models = metrics["models"]
    lines += _table(
        ["model", *(hd for _, hd, _ in SUMMARY_KEYS)],
        [[m, *(_fmt(s.get(k), f) for k, _, f in SUMMARY_KEYS)] for m, s in models.items()],
    )
    if any(s.get("intervals") for s in models.values()):
        lines += ["", "95% bootstrap intervals (resampling held-out notes; images for POPE):", ""]
        lines += _table(
            ["model", *(hd for _, hd, _ in SUMMARY_KEYS)],
            [
                [m, *(_fmt_interval((s.get("intervals") or {}).get(k), f) for k, _, f in SUMMARY_KEYS)]
                for m, s in models.items()
            ],
        )
    if metrics["changes"]:
        lines += ["", "Changes against the SFT model (paired 95% bootstrap interval in brackets):", ""]
        lines += _table(
            ["model", *(hd for _, hd, _ in CHANGE_KEYS)],
            [
                [
                    m,
                    *(
                        _fmt(d.get(k), f) + _brackets((d.get("intervals") or {}).get(k), f)
                        for k, _, f in CHANGE_KEYS
                    ),
                ]
                for m, d in metrics["changes"].items()
            ],
        )
    if metrics.get("seeds"):
        lines += seed_lines(metrics["seeds"])
    lines += ["", "## Targets", ""]
    mark = {True: "met", False: "**missed**", None: "n/a"}
    lines += _table(
        ["target", "measured", "95% interval", "goal", "at the point", "over the interval"],
        [
            [
                t["target"],
                _fmt(t["value"], t["format"]),
                _fmt_interval(t.get("interval"), t["format"]),
                t["goal"],
                mark[t["met"]],
                mark[t.get("met_at_interval")],
            ]
            for t in metrics["targets"]
        ],  # fmt: skip
    )
    if models:
        lines += ["", "## Hallucinated mentions by cause", ""]
        lines += _table(
            ["model", "partner (language prior)", "confusion (look-alike)", "other", "total"],
            [
                [m, *(_fmt(s.get(k), "{}") for k in ("partner", "confusion", "other", "total"))]
                for m, s in models.items()
            ],
        )
    r = metrics["retrieval"]
    if r:
        lines += ["", "## Retrieval (InfoNCE pretraining, held-out notes)", ""]
        lines += _table(list(r), [[_fmt(v, "{:.3f}") for v in r.values()]])
    lines += ["", "## Stages", ""]
    lines += _table(
        ["stage", "status", "wall time (s)", "peak RSS after (MiB)"],
        [
            [n, s["status"], _fmt(s["seconds"], "{:.1f}"), _fmt(s.get("peak_rss_mb"), "{:.0f}")]
            for n, s in metrics["stages"].items()
        ],
    )
    lines += ["", "## Plots", ""]
    for title, path in plots.items():
        lines += [f"### {title}", "", f"![{title}]({path})", ""]
    samples = [(m, metrics["stages"][f"eval_{m}"]["metrics"].get("samples", [])) for m in models]
    if any(s for _, s in samples):
        lines += ["## Sample captions", ""]
        for m, ss in samples:
            for s in ss[:3]:
                hall = ", ".join(s.get("hallucinated", [])) or "none"
                lines.append(f"- **{m}** `{s['id']}`: {s['caption']} (hallucinated: {hall})")
        lines.append("")
    lines += [
        "CHAIR_i change is relative; recall and F1 changes are absolute points; "
        "object precision = 1 - CHAIR_i.",
        "Intervals: percentile bootstrap, 1000 resamples, seed 0 (docs/evals.md); a target holds over the "
        "interval when both ends meet its goal.",
        "Stages marked 'skipped' were finished by an earlier run into the same folder (their times are "
        "from that run).",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- plots and files


def plot_before_after(models: dict[str, dict[str, Any]], path: Path) -> Path:
    """Grouped bars per model: rates (CHAIR, recall, precision, POPE-adv F1 / yes-ratio) and mean length."""
    import matplotlib  # function-level: ~0.4 s to import; only the plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [
        ("chair_i", "CHAIR_i"), ("chair_s", "CHAIR_s"), ("recall", "recall"), ("precision", "precision"),
        ("pope_adversarial_f1", "POPE-adv F1"), ("pope_adversarial_yes_ratio", "POPE-adv yes"),
    ]  # fmt: skip
    names = list(models)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [4, 1]})
    x = np.arange(len(keys))
    w = 0.8 / max(1, len(names))
    for j, m in enumerate(names):
        vals = [models[m].get(k) or 0.0 for k, _ in keys]
        err = error_bars(models[m], keys, vals)  # (2, K)
        bars = ax.bar(x + (j - (len(names) - 1) / 2) * w, vals, w, label=m, yerr=err, capsize=2,
                      error_kw={"lw": 0.8})  # fmt: skip
        ax.bar_label(bars, fmt="%.2f", fontsize=7, padding=6)
    ax.set_xticks(x, [t for _, t in keys])
    ax.set_ylim(0, 1.1)
    ax.axhline(0.5, color="grey", lw=0.5, ls="--")
    ax.set_title(
        "held-out notes: hallucination and POPE with 95% bootstrap intervals (higher recall/F1 is better)"
    )
    ax.legend()
    lens = [models[m].get("mean_length") or 0.0 for m in names]
    len_err = np.concatenate(
        [error_bars(models[m], [("mean_length", "")], [v]) for m, v in zip(names, lens)], axis=1
    )
    bars = ax2.bar(names, lens, color=[f"C{j}" for j in range(len(names))], yerr=len_err, capsize=3)
    ax2.bar_label(bars, fmt="%.1f", fontsize=8)
    ax2.set_title("mean caption length (words)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_causes(models: dict[str, dict[str, Any]], path: Path) -> Path:
    """Stacked bars: hallucinated mentions per cause, per model."""
    import matplotlib  # function-level: ~0.4 s to import; only the plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(models)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    bottom = [0.0] * len(names)
    for cause in ("partner", "confusion", "other"):
        vals = [float(models[m].get(cause) or 0) for m in names]
        ax.bar(names, vals, bottom=bottom, label=cause)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("hallucinated mentions")
    ax.set_title("hallucinated mentions by cause")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_stage_times(stages: dict[str, dict[str, Any]], path: Path) -> Path:
    """Horizontal bars: wall time per stage."""
    import matplotlib  # function-level: ~0.4 s to import; only the plots need it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(stages)[::-1]
    fig, ax = plt.subplots(figsize=(6, 0.35 * len(names) + 1.2))
    bars = ax.barh(names, [float(stages[n]["seconds"]) for n in names])
    ax.bar_label(bars, fmt="%.0f s", fontsize=8)
    ax.set_xlabel("wall time (s)")
    ax.set_title("time per stage")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(out: str | Path, metrics: dict[str, Any]) -> dict[str, Path]:
    """Write OUT/metrics.json, the plots and OUT/report.md (each via a temp file + rename)."""
    out = Path(out)
    plots: dict[str, str] = {}
    made: dict[str, Path] = {}
    if metrics["models"]:
        made["before_after"] = plot_before_after(metrics["models"], out / "before_after.png")
        plots["Before / after"] = "before_after.png"
        made["causes"] = plot_causes(metrics["models"], out / "causes.png")
        plots["Hallucination causes"] = "causes.png"
    made["stage_times"] = plot_stage_times(metrics["stages"], out / "stage_times.png")
    plots["Time per stage"] = "stage_times.png"
    for name in metrics["stages"]:
        if (out / name / "curves.png").is_file():
            plots[f"Training curves: {name}"] = f"{name}/curves.png"
    for name, text in (
        ("metrics.json", json.dumps(metrics, indent=1, default=str) + "\n"),
        ("report.md", render_markdown(metrics, plots)),
    ):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)
        made[name] = out / name
    return made

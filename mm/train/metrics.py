"""Run files every trainer writes: JSONL metrics (tolerant of a torn last line), PNG plots, the progress bar,
and the fsync helpers behind atomic writes."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from mm.errors import UserError


class MetricsLogger:
    """Append one JSON object per line to ``path``; on resume, keeps the records up to ``resume_step``.

    Only the main process writes (others get a no-op logger), so DDP runs produce one file. On resume the
    kept records are rewritten atomically first, so a torn last line (a process killed mid-write) is
    dropped before anything is appended after it.
    """

    def __init__(self, path: str | Path, *, resume_step: int | None = None, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is None:
            self.path.write_text("")
        else:
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def log(self, record: dict[str, Any]) -> None:
        """Write ``record`` (plain numbers/strings; tensors are converted with ``.item()``)."""
        if not self.enabled:
            return
        clean = {k: (v.item() if isinstance(v, torch.Tensor) else v) for k, v in record.items()}
        with self.path.open("a") as f:
            f.write(json.dumps(clean) + "\n")


class TornMetricsWarning(UserWarning):
    """The last line of a metrics file was cut off mid-write (a killed run); it was dropped."""


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All records of a metrics JSONL file ([] when it does not exist).

    A last line that is not a complete JSON object (a run killed while writing it) is dropped with a
    :class:`TornMetricsWarning` naming the file and line; a bad line anywhere else is a
    :class:`~mm.errors.UserError` naming ``file:line``.
    """
    p = Path(path)
    if not p.exists():
        return []
    lines = p.read_text().splitlines()
    records = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"a JSON {type(record).__name__}, not an object")
        except ValueError as e:
            if all(not rest.strip() for rest in lines[n:]):
                warnings.warn(
                    f"{p}:{n}: dropped a torn last line (a run killed mid-write): {line[:60]!r}",
                    TornMetricsWarning,
                    stacklevel=2,
                )
                break
            raise UserError(
                f"{p}:{n}: not a metrics record ({e}); the file is damaged: delete that line, or start the "
                "run over with --no-resume"
            ) from None
        records.append(record)
    return records


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a fsynced temp file and a rename (readers never see half)."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """fsync a folder, so the names created or renamed in it survive a crash (no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def plot_metrics(
    records: Iterable[dict[str, Any]],
    keys: Sequence[str],
    out_png: str | Path,
    *,
    x: str = "step",
    title: str = "",
) -> Path:
    """One panel per key (its records plotted against ``x``), saved as a PNG with matplotlib's Agg backend.

    Keys no record has are drawn as an empty panel labelled "no data" rather than failing.
    """
    import matplotlib  # heavy (~0.5 s): imported only when a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = list(records)
    fig, axes = plt.subplots(1, len(keys), figsize=(4 * len(keys), 3.2), squeeze=False)
    for ax, key in zip(axes[0], keys):
        pts = [(r[x], r[key]) for r in records if key in r and x in r and r[key] is not None]
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="." if len(pts) < 30 else None)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(x)
        ax.set_title(key)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(out_png)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def progress(total: int, *, initial: int = 0, desc: str = "", enabled: bool = True):
    """A tqdm bar over steps (disabled on non-main ranks or when ``enabled`` is False)."""
    return tqdm(total=total, initial=initial, desc=desc, disable=not enabled, dynamic_ncols=True)

"""The stages of ``rl pipeline`` (:mod:`rl.pipeline`), each one library call, and the small file helpers
they share with :mod:`rl.pipeline_seeds`."""

from __future__ import annotations

import json
import resource
import shutil
from pathlib import Path
from typing import Any

from mm.errors import UserError

POST_STAGES: dict[str, tuple[str, str]] = {
    "dpo": ("rl.trainers.dpo", "DPOConfig"),
    "grpo": ("rl.trainers.grpo", "GRPOConfig"),
}
"""Post-training stage -> (module with ``train(cfg, out_dir=, resume=, show_progress=)``, config class)."""


def _rss_mb() -> dict[str, float]:
    """Peak resident memory (MiB) of this process and of its finished children (ru_maxrss is KiB on Linux)."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"peak_rss_mb": round(own, 1), "peak_rss_children_mb": round(kids, 1)}


def _stage_data(c: Any, out: Path, show: bool, spec: Any) -> dict[str, Any]:
    from mm.world.generate import write_world

    notes = write_world(c, out / "world", workers=spec.workers, overwrite=True, progress=show)
    splits: dict[str, int] = {}
    for n in notes:
        splits[n.split] = splits.get(n.split, 0) + 1
    return {"notes": len(notes), "images": sum(len(n.images) for n in notes), "splits": splits}


def stage_pretrain(c: Any, out: Path, show: bool, resume: bool) -> dict[str, Any]:
    from mm.data.tokenizer import load_tokenizer
    from mm.train import pretrain

    tok = load_tokenizer()
    folder, mi, ml = Path(c.data.folder), c.model.max_images, c.model.text.max_len
    train = pretrain.load_split(
        folder,
        c.data.train_split,
        tokenizer=tok,
        max_images=mi,
        max_len=ml,
        tag_classes=pretrain.tag_classes(c),
        tag_grid=pretrain.tag_grid(c),
    )
    held = pretrain.load_split(
        folder, c.data.eval_split, tokenizer=tok, max_images=mi, max_len=ml, limit=c.data.eval_notes
    )
    r = pretrain.train(
        c,
        out_dir=out,
        train_data=train,
        eval_data=held,
        vocab_size=len(tok),
        resume=resume,
        show_progress=show,
    )
    return {"step": r.step, "train_seconds": round(r.seconds, 2), **r.metrics}


def stage_train(c: Any, out: Path, show: bool, resume: bool) -> dict[str, Any]:
    from mm.data.format import read_notes
    from mm.train import sft

    folder = Path(c.data.folder)
    train_notes = read_notes(folder, c.data.train_split)
    if c.data.train_notes:
        train_notes = train_notes[: c.data.train_notes]
    if not train_notes:
        raise UserError(f"{folder} has no notes in split {c.data.train_split!r}")
    r = sft.train(
        c, out_dir=out, train_notes=train_notes, eval_notes=read_notes(folder, c.data.eval_split),
        root=folder, resume=resume, show_progress=show,
    )  # fmt: skip
    m = {k: v for k, v in r.metrics.items() if k not in ("origin", "peak_rss_mb")}
    m["sample_captions"] = m.pop("_captions", [])
    return {
        "step": r.step, "train_seconds": round(r.seconds, 2), "step_seconds": round(r.step_seconds, 4),
        "trainable": r.trainable, **m,
    }  # fmt: skip


def _stage_post(name: str, c: Any, out: Path, show: bool, resume: bool) -> dict[str, Any]:
    import importlib

    module = importlib.import_module(POST_STAGES[name][0])
    return dict(module.train(c, out_dir=out, resume=resume, show_progress=show))


def _stage_eval(model_dir: Path, data_dir: Path, spec: Any, out: Path) -> dict[str, Any]:
    from mm.eval.runners import evaluate_model
    from mm.train.common import is_main_process

    res = evaluate_model(
        model_dir, data_dir, split=spec.split, notes=spec.notes, pope_splits=spec.pope_splits, seed=spec.seed,
        batch_size=spec.batch_size, max_new_tokens=spec.max_new_tokens,
    )  # fmt: skip
    if is_main_process():  # under a launch every rank holds every answer (mm.eval.parallel); one writes
        out.mkdir(parents=True, exist_ok=True)
        _atomic_json(out / "eval.json", res)
    return res


def stage_folder(folder: Path, clear: bool) -> None:
    """``folder`` made when missing, emptied first when ``clear`` (a stage run again)."""
    if clear and folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)


def _atomic_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str) + "\n")
    tmp.replace(path)


def _config_dict(c: Any) -> Any:
    from mm.config import to_dict

    return json.loads(json.dumps(to_dict(c), default=str))

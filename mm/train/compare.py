"""Compare the fusion kinds (mlp, qformer, resampler) at the same token budget K on the same data.

For each kind: a short InfoNCE pretraining (:mod:`mm.train.pretrain`; gives text->note R@1), an align
stage from it (fusion only) and an SFT stage from the aligned model (:mod:`mm.train.sft`), all with the
same recipes, seeds and notes. Only ``fusion.kind`` (and the shared ``budget``) differ between rows.
The table: R@1, held-out caption loss, object recall / precision of greedy captions, CHAIR_i, tokens per
note (K x mean images of the held-out notes), fusion parameters, SFT step time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mm.data.format import read_notes
from mm.data.tokenizer import load_tokenizer
from mm.fusion import FUSION_KINDS, build_fusion_from_config
from mm.train import pretrain, sft
from mm.train.pretrain import PretrainConfig
from mm.train.sft import TrainConfig
from mm.vision import build_vision_tower

TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("kind", "fusion", "{}"),
    ("budget", "K", "{}"),
    ("r_at_1", "R@1 (text->note)", "{:.3f}"),
    ("caption_loss", "caption loss", "{:.3f}"),
    ("recall", "object recall", "{:.3f}"),
    ("precision", "object precision", "{:.3f}"),
    ("chair_i", "CHAIR_i", "{:.3f}"),
    ("tokens_per_note", "tokens/note", "{:.1f}"),
    ("fusion_params", "fusion params", "{:,}"),
    ("step_seconds", "SFT s/step", "{:.3f}"),
)
"""(key, header, format) of each column of compare.md."""


@dataclass
class CompareConfig:
    """Everything `mm compare-fusion` needs: the kinds, the budget and the three stage recipes."""

    kinds: list[str] = field(default_factory=lambda: list(FUSION_KINDS))
    """Fusion kinds to compare."""
    budget: int = 16
    """K, tokens per image, the same for every kind."""
    pretrain: PretrainConfig = field(default_factory=PretrainConfig)
    """InfoNCE recipe (its model.fusion.kind / budget are set per row)."""
    align_steps: int = 100
    """Steps of the align stage (sft.* recipe with stage align, caption task only); 0 skips align."""
    sft: TrainConfig = field(default_factory=TrainConfig)
    """SFT recipe (model.text.hidden_size must equal pretrain.model.d_model)."""

    def __post_init__(self) -> None:
        bad = [k for k in self.kinds if k not in FUSION_KINDS]
        if bad or not self.kinds:
            raise ValueError(f"kinds must be a non-empty subset of {FUSION_KINDS}, got {self.kinds}")
        if self.budget < 1 or self.align_steps < 0:
            raise ValueError(f"need budget >= 1 and align_steps >= 0, got {self.budget}, {self.align_steps}")
        d, h = self.pretrain.model.d_model, self.sft.model.text.get("hidden_size")
        if d != h:
            raise ValueError(
                f"sft.model.text.hidden_size={h} must equal pretrain.model.d_model={d} (the fusion is shared)"
            )


def stage_configs(
    cfg: CompareConfig, kind: str, folder: str
) -> tuple[PretrainConfig, TrainConfig, TrainConfig]:
    """The pretrain, align and SFT configs of one row (same recipe, this kind, budget and data)."""
    p = cfg.pretrain
    fusion = replace(p.model.fusion, kind=kind, budget=cfg.budget)
    pre = replace(p, model=replace(p.model, fusion=fusion), data=replace(p.data, folder=folder))
    s = cfg.sft
    data = replace(s.data, folder=folder)
    align = replace(
        s,
        train=replace(s.train, stage="align", steps=max(1, cfg.align_steps)),
        tasks=replace(s.tasks, kinds=["caption"]),
        lora=replace(s.lora, enabled=False),
        data=data,
    )
    sft = replace(s, train=replace(s.train, stage="sft"), data=data)
    return pre, align, sft


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """compare.md: one row per kind, columns of :data:`TABLE_COLUMNS`."""
    lines = [
        "| " + " | ".join(h for _, h, _ in TABLE_COLUMNS) + " |",
        "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|",
    ]
    for r in rows:
        cells = [fmt.format(r[k]) if r.get(k) is not None else "n/a" for k, _, fmt in TABLE_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_table(rows: list[dict[str, Any]], out: Path, header: str = "") -> tuple[Path, Path]:
    """Write ``out/compare.md`` and ``out/compare.json`` (temp files + rename)."""
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "compare.md", out / "compare.json"
    for path, text in ((md, header + markdown_table(rows)), (js, json.dumps(rows, indent=1) + "\n")):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return md, js


def run_kind(
    cfg: CompareConfig, kind: str, *, folder: Path, out: Path, show_progress: bool = False
) -> dict[str, Any]:
    """Pretrain -> align -> SFT for one kind; returns its table row."""
    pre_cfg, align_cfg, sft_cfg = stage_configs(cfg, kind, str(folder))
    tok = load_tokenizer()
    mi, ml = pre_cfg.model.max_images, pre_cfg.model.text.max_len
    pdata = pre_cfg.data
    train_t = pretrain.load_split(folder, pdata.train_split, tokenizer=tok, max_images=mi, max_len=ml)
    eval_t = pretrain.load_split(
        folder, pdata.eval_split, tokenizer=tok, max_images=mi, max_len=ml, limit=pdata.eval_notes
    )
    pre = pretrain.train(
        pre_cfg, out_dir=out / "pretrain", train_data=train_t, eval_data=eval_t, vocab_size=len(tok),
        show_progress=show_progress,
    )  # fmt: skip
    train_notes = read_notes(folder, sft_cfg.data.train_split)
    if sft_cfg.data.train_notes:
        train_notes = train_notes[: sft_cfg.data.train_notes]
    eval_notes = read_notes(folder, sft_cfg.data.eval_split)
    kw = dict(train_notes=train_notes, eval_notes=eval_notes, root=folder, show_progress=show_progress)
    init_model = None
    if cfg.align_steps > 0:
        align_cfg = replace(align_cfg, init=replace(align_cfg.init, pretrain=str(out / "pretrain")))
        sft.train(align_cfg, out_dir=out / "align", **kw)
        init_model = str(out / "align" / "model")
    init = (
        replace(sft_cfg.init, model=init_model)
        if init_model
        else replace(sft_cfg.init, pretrain=str(out / "pretrain"))
    )
    res = sft.train(replace(sft_cfg, init=init), out_dir=out / "sft", **kw)
    tower = build_vision_tower(pre_cfg.model.vision)
    fusion = build_fusion_from_config(
        pre_cfg.model.fusion, d_vision=tower.dim, d_model=pre_cfg.model.d_model, grid=tower.grid
    )
    n_eval = eval_notes[: sft_cfg.eval.notes]
    mean_images = sum(len(n.images) for n in n_eval) / max(1, len(n_eval))
    m = res.metrics
    return {
        "kind": kind,
        "budget": cfg.budget,
        "r_at_1": pre.metrics.get("text2note_R@1"),
        "caption_loss": m.get("caption_loss"),
        "recall": m.get("recall"),
        "precision": m.get("precision"),
        "chair_i": m.get("chair_i"),
        "halluc_partner_frac": m.get("halluc_partner_frac"),
        "yesno_acc": m.get("yesno_acc"),
        "tokens_per_note": cfg.budget * mean_images,
        "fusion_params": fusion.num_parameters(),
        "step_seconds": res.step_seconds,
        "pretrain_seconds": round(pre.seconds, 2),
        "sft_seconds": round(res.seconds, 2),
    }

"""Compare fusion kinds, fusion scopes and LM visibility modes at the same token budget K on the same data.

Each variant (kind x scope x visibility; mlp has image scope only) runs, per seed: a short InfoNCE
pretraining (:mod:`mm.train.pretrain`; gives text->note R@1; shared by the visibility modes of a kind and
scope), an align stage from it (fusion only) and an SFT stage from the aligned model (:mod:`mm.train.sft`),
all with the same recipes and notes. Then the SFT model is scored on held-out notes: greedy captions
(object recall, recall by photo position 1st vs 2nd-4th, precision, CHAIR_i; :mod:`mm.train.compare_metrics`)
and POPE (adversarial, per-photo questions). The table: means over seeds with 95% t intervals; tokens per
note (K x mean photos of the held-out notes, or K for a budget per note), fusion parameters, fusion FLOPs
for a note of the held-out mean photo count (rounded), SFT step time.

``note_budget`` set: note-scope rows use budget_per "note" with that many tokens per note (e.g. 32, half
of K=16 x 4 photos) while image-scope rows keep K per image: the equal-quality-at-fewer-tokens comparison.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mm.data.format import read_notes
from mm.data.tokenizer import load_tokenizer
from mm.eval.runners import held_out_notes, load_model, run_chair, run_pope
from mm.fusion import FUSION_KINDS, FUSION_SCOPES, build_fusion_from_config
from mm.model.pretrained_lm import text_hidden_size
from mm.multi_image import VISIBILITY_MODES
from mm.train import pretrain, sft
from mm.train.compare_metrics import recall_by_position, summarize
from mm.train.pretrain import PretrainConfig
from mm.train.sft import TrainConfig
from mm.vision import build_vision_tower

TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("kind", "fusion", "{}"),
    ("budget", "K", "{}"),
    ("budget_per", "K per", "{}"),
    ("scope", "scope", "{}"),
    ("visibility", "visibility", "{}"),
    ("seeds", "seeds", "{}"),
    ("tokens_per_note", "tokens/note", "{:.1f}"),
    ("r_at_1", "R@1 (text->note)", "{:.3f}"),
    ("caption_loss", "caption loss", "{:.3f}"),
    ("recall", "object recall", "{:.3f}"),
    ("recall_first", "recall 1st photo", "{:.3f}"),
    ("recall_later", "recall 2nd-4th", "{:.3f}"),
    ("recall_gap", "gap 1st - later", "{:.3f}"),
    ("precision", "object precision", "{:.3f}"),
    ("chair_i", "CHAIR_i", "{:.3f}"),
    ("pope_f1", "POPE F1 (adv.)", "{:.3f}"),
    ("fusion_params", "fusion params", "{:,.0f}"),
    ("fusion_flops_per_note", "fusion GFLOPs/note", "{:.3f}"),
    ("step_seconds", "SFT s/step", "{:.3f}"),
)
"""(key, header, format) of each column of compare.md; averaged columns also show their 95% interval."""

GROUP_KEYS = ("kind", "budget", "budget_per", "scope", "visibility")
"""What makes a variant; rows of the same variant and different seeds are averaged."""
EXACT_KEYS = ("tokens_per_note", "fusion_params", "fusion_flops_per_note")
"""Columns that do not vary with the seed: shown without an interval."""


@dataclass
class CompareConfig:
    """Everything `mm compare-fusion` needs: the variants, the budget, the seeds and the stage recipes."""

    kinds: list[str] = field(default_factory=lambda: list(FUSION_KINDS))
    """Fusion kinds to compare."""
    scopes: list[str] = field(default_factory=lambda: ["image"])
    """Fusion scopes ("image", "note"; mm.fusion.FusionConfig.scope); mlp runs with "image" only."""
    visibilities: list[str] = field(default_factory=lambda: ["all"])
    """LM visibility modes ("all", "own"; sft.model.visibility)."""
    seeds: list[int] = field(default_factory=lambda: [0])
    """Seeds of every stage; the table shows the mean over seeds and a 95% t interval."""
    budget: int = 16
    """K, tokens per image, the same for every variant (but see note_budget)."""
    note_budget: int | None = None
    """None: note-scope rows also yield K tokens per image slot. An int: note-scope rows use fusion
    budget_per "note" with this many tokens per note, whatever its photo count."""
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
        if not self.scopes or any(s not in FUSION_SCOPES for s in self.scopes):
            raise ValueError(f"scopes must be a non-empty subset of {FUSION_SCOPES}, got {self.scopes}")
        if not self.visibilities or any(v not in VISIBILITY_MODES for v in self.visibilities):
            raise ValueError(
                f"visibilities must be a non-empty subset of {VISIBILITY_MODES}, got {self.visibilities}"
            )
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be a non-empty list of distinct ints, got {self.seeds}")
        if not self.variants():
            raise ValueError("no variant to run: mlp has scope 'image' only; add 'image' to scopes")
        if self.note_budget is not None and (self.note_budget < 1 or "note" not in self.scopes):
            raise ValueError(
                f"note_budget={self.note_budget} needs to be >= 1 and 'note' in scopes (it sets the tokens "
                f"per note of note-scope rows), got scopes={self.scopes}; drop note_budget or add scope note"
            )
        if self.budget < 1 or self.align_steps < 0:
            raise ValueError(f"need budget >= 1 and align_steps >= 0, got {self.budget}, {self.align_steps}")
        d, h = self.pretrain.model.d_model, text_hidden_size(self.sft.model.text)
        if d != h:
            raise ValueError(
                f"sft.model.text.hidden_size={h} must equal pretrain.model.d_model={d} (the fusion is shared)"
            )

    def variants(self) -> list[tuple[str, str, str]]:
        """(kind, scope, visibility) of every row, in config order; mlp only with scope "image"."""
        return [
            (k, s, v)
            for k in self.kinds
            for s in self.scopes
            for v in self.visibilities
            if not (k == "mlp" and s != "image")
        ]

    def budget_of(self, scope: str) -> tuple[int, str]:
        """(budget, budget_per) of the rows of ``scope``: (note_budget, "note") for note scope when set."""
        if scope == "note" and self.note_budget is not None:
            return self.note_budget, "note"
        return self.budget, "image"


def variant_folder(kind: str, scope: str, visibility: str, seed: int, note_budget: int | None = None) -> str:
    """Run folder name of a variant: the kind, plus what differs from the defaults ("qformer-note-own-s1";
    "qformer-note32" for note scope with 32 tokens per note)."""
    parts = [kind]
    if scope != "image":
        parts += [scope + (str(note_budget) if note_budget and scope == "note" else "")]
    parts += [visibility] if visibility != "all" else []
    parts += [f"s{seed}"] if seed != 0 else []
    return "-".join(parts)


def stage_configs(
    cfg: CompareConfig,
    kind: str,
    folder: str,
    *,
    scope: str = "image",
    visibility: str = "all",
    seed: int = 0,
) -> tuple[PretrainConfig, TrainConfig, TrainConfig]:
    """The pretrain, align and SFT configs of one row (same recipe; this variant, budget, seed and data)."""
    p = cfg.pretrain
    budget, per = cfg.budget_of(scope)
    fusion = replace(p.model.fusion, kind=kind, budget=budget, scope=scope, budget_per=per)
    pre = replace(
        p,
        model=replace(p.model, fusion=fusion),
        data=replace(p.data, folder=folder),
        train=replace(p.train, seed=seed),
    )
    s = cfg.sft
    data = replace(s.data, folder=folder)
    model = replace(s.model, visibility=visibility)
    align = replace(
        s,
        model=model,
        train=replace(s.train, stage="align", steps=max(1, cfg.align_steps), seed=seed),
        tasks=replace(s.tasks, kinds=["caption"]),
        lora=replace(s.lora, enabled=False),
        data=data,
    )
    sft = replace(s, model=model, train=replace(s.train, stage="sft", seed=seed), data=data)
    return pre, align, sft


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """compare.md: one row per variant (means over its seeds, ``± half-width`` when there are 2+ seeds)."""
    averaged = [k for k, _, _ in TABLE_COLUMNS if k not in GROUP_KEYS and k != "seeds"]
    summary = summarize(rows, group=GROUP_KEYS, keys=averaged)
    lines = [
        "| " + " | ".join(h for _, h, _ in TABLE_COLUMNS) + " |",
        "|" + "|".join("---" for _ in TABLE_COLUMNS) + "|",
    ]
    for r in summary:
        cells = []
        for k, _, fmt in TABLE_COLUMNS:
            value, ci = r.get(k), r.get(f"{k}_ci")
            if k == "fusion_flops_per_note" and value is not None:
                value, ci = value / 1e9, None if ci is None else ci / 1e9
            cell = fmt.format(value) if value is not None else "n/a"
            if ci is not None and k not in EXACT_KEYS:
                cell += " ± " + fmt.format(ci)
            cells.append(cell)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_table(rows: list[dict[str, Any]], out: Path, header: str = "") -> tuple[Path, Path]:
    """Write ``out/compare.md`` (per variant) and ``out/compare.json`` (per variant and seed), atomically."""
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / "compare.md", out / "compare.json"
    for path, text in ((md, header + markdown_table(rows)), (js, json.dumps(rows, indent=1) + "\n")):
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return md, js


def run_variant(
    cfg: CompareConfig,
    kind: str,
    *,
    folder: Path,
    out: Path,
    scope: str = "image",
    visibility: str = "all",
    seed: int = 0,
    pretrained: dict[tuple[str, str, int], tuple[Path, Any]] | None = None,
    show_progress: bool = False,
) -> dict[str, Any]:
    """Pretrain -> align -> SFT -> held-out scores for one variant and seed; returns its table row.

    ``pretrained`` maps (kind, scope, seed) to a finished pretraining (folder, result) so the visibility
    modes of one kind and scope share it (pretraining has no LM); this run adds its own to the map.
    """
    pre_cfg, align_cfg, sft_cfg = stage_configs(
        cfg, kind, str(folder), scope=scope, visibility=visibility, seed=seed
    )
    pretrained = {} if pretrained is None else pretrained
    key = (kind, scope, seed)
    if key not in pretrained:
        tok = load_tokenizer()
        mi, ml = pre_cfg.model.max_images, pre_cfg.model.text.max_len
        pdata = pre_cfg.data
        train_t = pretrain.load_split(folder, pdata.train_split, tokenizer=tok, max_images=mi, max_len=ml)
        eval_t = pretrain.load_split(
            folder, pdata.eval_split, tokenizer=tok, max_images=mi, max_len=ml, limit=pdata.eval_notes
        )
        res = pretrain.train(
            pre_cfg, out_dir=out / "pretrain", train_data=train_t, eval_data=eval_t, vocab_size=len(tok),
            show_progress=show_progress,
        )  # fmt: skip
        pretrained[key] = (out / "pretrain", res)
    pre_dir, pre = pretrained[key]
    train_notes = read_notes(folder, sft_cfg.data.train_split)
    if sft_cfg.data.train_notes:
        train_notes = train_notes[: sft_cfg.data.train_notes]
    eval_notes = read_notes(folder, sft_cfg.data.eval_split)
    kw = dict(train_notes=train_notes, eval_notes=eval_notes, root=folder, show_progress=show_progress)
    init_model = None
    if cfg.align_steps > 0:
        align_cfg = replace(align_cfg, init=replace(align_cfg.init, pretrain=str(pre_dir)))
        sft.train(align_cfg, out_dir=out / "align", **kw)
        init_model = str(out / "align" / "model")
    init = (
        replace(sft_cfg.init, model=init_model)
        if init_model
        else replace(sft_cfg.init, pretrain=str(pre_dir))
    )
    res = sft.train(replace(sft_cfg, init=init), out_dir=out / "sft", **kw)
    scores = held_out_scores(out / "sft" / "model", folder, sft_cfg)
    tower = build_vision_tower(pre_cfg.model.vision)
    fusion = build_fusion_from_config(
        pre_cfg.model.fusion, d_vision=tower.dim, d_model=pre_cfg.model.d_model, grid=tower.grid
    )
    m = res.metrics
    budget, per = cfg.budget_of(scope)
    return {
        "kind": kind,
        "budget": budget,
        "budget_per": per,
        "scope": scope,
        "visibility": visibility,
        "seed": seed,
        "r_at_1": pre.metrics.get("text2note_R@1"),
        "caption_loss": m.get("caption_loss"),
        "yesno_acc": m.get("yesno_acc"),
        **scores,
        "tokens_per_note": budget * (1 if per == "note" else scores["mean_photos"]),
        "fusion_params": fusion.num_parameters(),
        "fusion_flops_per_note": fusion.flops_per_note(max(1, round(scores["mean_photos"]))),
        "step_seconds": res.step_seconds,
        "pretrain_seconds": round(pre.seconds, 2),
        "sft_seconds": round(res.seconds, 2),
    }


def held_out_scores(model_dir: Path, folder: Path, sft_cfg: TrainConfig) -> dict[str, Any]:
    """Captions of the first ``eval.notes`` held-out notes (CHAIR, recall, recall by photo position) and
    POPE adversarial on their photos, from the saved SFT model."""
    model, processor = load_model(model_dir)
    ev = sft_cfg.eval
    notes = held_out_notes(folder, split=sft_cfg.data.eval_split, limit=ev.notes)
    chair = run_chair(
        model, processor, notes, folder, prompt=sft_cfg.tasks.caption_prompt, batch_size=ev.batch_size,
        max_new_tokens=ev.max_new_tokens,
    )  # fmt: skip
    mentioned = [{c for _, c in pc["mentioned"]} for pc in chair["per_caption"]]
    photos = [[{a.category for a in anns} for anns in n.objects] for n in notes]
    pope = run_pope(model, processor, notes, folder, split="adversarial", batch_size=ev.batch_size)
    return {
        "recall": chair["recall"],
        "precision": 1.0 - chair["chair_i"] if chair["n_mentions"] else 0.0,
        "chair_i": chair["chair_i"],
        **recall_by_position(mentioned, photos),
        "pope_f1": pope["f1"],
        "pope_accuracy": pope["accuracy"],
        "eval_notes": len(notes),
        "mean_photos": sum(len(n.images) for n in notes) / len(notes),
    }

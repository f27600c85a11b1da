"""How well a NoteVLM reads colours: where the colour of an object is lost between pixels and caption.

    python benchmarks/colour_reading.py probe --model W0/sft/model --data W0/data/world [--notes 256]
    python benchmarks/colour_reading.py swap-pairs --data W0/data/world --out pairs.jsonl [--notes 1200]
    python benchmarks/colour_reading.py confidence --model W0/sft/model --data W0/data/world [--contrast]
    python benchmarks/colour_reading.py paired --before SFT.json --after GRPO.json --data W0/data/world

``probe`` prints three figures on ``--notes`` held-out notes of a world folder:

- *teacher-forced colour accuracy*: feed the note's own caption and, at every colour word, take the colour
  with the highest probability (both spellings of each colour word summed); the same with every note's
  images swapped for another note's (``control``: what the language prior alone gets);
- *linear probes*: a logistic regression from one image token to the colour, and to the category, of the
  object in that token's grid cell (world grid = patch grid), on the vision tower's tokens and on the
  fusion's (70% of the objects to fit, 30% to score). The world's objects sit one per grid cell, so token
  k is cell k. To tell a fork's colour, the LM must find the fork's token: both must be local.

``swap-pairs`` writes colour-swap preference pairs (POVID-style, :mod:`rl.pairs.injection` for objects):
chosen = a train note's caption, rejected = the same caption with one colour word changed to the colour
of another object of the same photo (a binding error), else to a colour that category lacks there; up to
``--per-note`` pairs per note. ``rl dpo --set data.pairs=FILE`` trains on them.

``confidence`` asks how much a captioner could cut its attribute rate by leaving out the colours it is least
sure of: it captions ``--notes`` held-out notes greedily, judges each colour claim (:mod:`mm.eval.claims`)
and takes the probability the model gave the colour word it wrote; then the attribute rate of the most
confident 25-90% of the claims, and of those at or above a probability. Post-training can only learn such
a choice when the captions it starts from may leave a colour out (world ``colour_prob`` < 1). With
``--contrast`` the score of a colour is how much the note's own images raise its log-probability over
another note's images (the next note of the batch; visual contrastive decoding's contrast): a colour the
model reads rises with its image, one from the language prior does not, and no ground truth is needed
to compute it. Both print ``auc``: the chance that a right colour scores above a wrong one (0.5: the
score does not rank errors).

``paired`` compares two models on the same held-out notes from their ``mm eval claims --json`` outputs
(whose ``per_caption`` rows keep the captions): attribute rate, colour coverage, colour claims per object
mention, CHAIR_i, object recall and caption length of each, and the change with its paired bootstrap 95%
interval (:func:`mm.eval.bootstrap.paired_intervals`; relative for rates and length, in points for
coverage and recall). CHAIR is scored on the same captions, so both halves describe one caption per note.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from mm.data.format import read_notes  # noqa: E402
from mm.eval.claims.extract import build_extractor  # noqa: E402
from mm.world.vocab import CATEGORY_NAMES, COLORS  # noqa: E402
from rl.pairs.files import write_pairs  # noqa: E402
from rl.pairs.record import PreferencePair, caption_pair  # noqa: E402

PROMPT = "Describe the note."


def colour_hits(logits: torch.Tensor, labels: torch.Tensor, forms: torch.Tensor) -> tuple[int, int]:
    """(right, total) over the colour-word labels: the colour whose spellings ``forms`` (C, F) carry the
    most next-token probability is the prediction. ``logits`` (B, T, V) predict ``labels`` (B, T) shifted
    by one, the model's own convention."""
    lab, lg = labels[:, 1:], logits[:, :-1]  # (B, T-1), (B, T-1, V)
    mask = torch.isin(lab, forms.flatten())  # (B, T-1)
    if not mask.any():
        return 0, 0
    colour_of = torch.full((int(forms.max()) + 1,), -1, dtype=torch.long)
    for c, ids in enumerate(forms):
        colour_of[ids] = c
    p = lg[mask].float().softmax(-1)[:, forms].sum(-1)  # (M, C)
    truth = colour_of[lab[mask]]  # (M,)
    return int((p.argmax(-1) == truth).sum()), int(mask.sum())


def cell_index(bbox: Sequence[float], image_size: int, grid: int) -> int:
    """Row-major index of the ``grid`` x ``grid`` cell holding the centre of ``bbox`` (x0, y0, x1, y1)."""
    cx = (bbox[0] + bbox[2]) / 2 / image_size
    cy = (bbox[1] + bbox[3]) / 2 / image_size
    col = min(grid - 1, max(0, int(cx * grid)))
    row = min(grid - 1, max(0, int(cy * grid)))
    return row * grid + col


def linear_probe(x: torch.Tensor, y: torch.Tensor, *, classes: int, steps: int = 800, seed: int = 0) -> float:
    """Held-out accuracy of a logistic regression ``x`` (N, D) -> ``y`` (N,): fit on the first 70%."""
    torch.manual_seed(seed)
    x = (x - x.mean(0)) / (x.std(0) + 1e-6)
    n = int(len(y) * 0.7)
    head = torch.nn.Linear(x.shape[1], classes)
    opt = torch.optim.Adam(head.parameters(), lr=1e-2, weight_decay=1e-4)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(head(x[:n]), y[:n]).backward()
        opt.step()
    with torch.no_grad():
        return float((head(x[n:]).argmax(-1) == y[n:]).float().mean())


def swap_pairs(notes: Sequence[Any], *, per_note: int = 2, seed: int = 0) -> list[PreferencePair]:
    """Colour-swap pairs of ``notes`` (module docstring); world captions, world colours."""
    rng = np.random.default_rng(seed)
    extractor = build_extractor("world")
    out = []
    for note in notes:
        caption = note.text
        claims = [c for c in extractor.extract(caption) if c.kind == "attribute"]
        rng.shuffle(claims)
        for j, c in enumerate(claims[:per_note]):
            objs = note.objects[c.image or 0]
            own = {o.color for o in objs if o.category == c.object}
            others = sorted({o.color for o in objs if o.color and o.color not in own})
            pool = others or [x for x in COLORS if x not in own]
            new = pool[int(rng.integers(len(pool)))]
            rejected = caption[: c.span[0]] + new + caption[c.span[1] :]
            meta = {"mode": "colour", "object": c.object, "image": c.image or 0, "from": c.value, "to": new}
            meta["binding"] = bool(others)
            pair = caption_pair(note, "injection", PROMPT, caption, rejected, None, meta)
            pair.id = f"{note.id}-colour-{j}"
            out.append(pair)
    return out


def probe(model_dir: str, data: str, n: int, batch: int = 32) -> dict[str, float]:
    from mm.eval.runners import load_model

    model, proc = load_model(model_dir, device="cpu")
    tok = proc.tokenizer
    forms = torch.tensor([[tok.convert_tokens_to_ids(c), tok.convert_tokens_to_ids("Ġ" + c)] for c in COLORS])
    notes = read_notes(data, "test")[:n]
    out: dict[str, float] = {}
    for name, shift in (("own images", 0), ("control", 1)):
        right = total = 0
        for s in range(0, len(notes), batch):
            nb = notes[s : s + batch]
            samples = []
            for j, a in enumerate(nb):
                b = nb[(j + shift) % len(nb)]
                images = (b.images if len(b.images) >= len(a.images) else a.images)[: len(a.images)]
                samples.append(proc.encode([Path(data) / im for im in images], PROMPT, a.text))
            inputs = proc.collate(samples)
            labels = inputs.pop("labels")
            with torch.no_grad():
                r, t = colour_hits(model(**inputs).logits, labels, forms)
            right, total = right + r, total + t
        out[f"teacher-forced accuracy, {name}"] = right / max(total, 1)
    out["colour words"] = total
    tower, fused, colours, categories = [], [], [], []
    size = proc.image_size
    for note in notes:
        pv = torch.stack([proc.load_image(Path(data) / im) for im in note.images])[None]  # (1, N, 3, S, S)
        mask = torch.ones(1, len(note.images), dtype=torch.bool)
        with torch.no_grad():
            patches = model.model.vision_tower(pv, mask)  # (1, N, P, Dv)
            tokens, _ = model.get_image_features(pv, mask)  # (1, N, K, D)
        grid = int(round(patches.shape[2] ** 0.5))
        for i, objs in enumerate(note.objects):
            for o in objs:
                k = cell_index(o.bbox, size, grid)
                tower.append(patches[0, i, k])
                if tokens.shape[2] == patches.shape[2]:
                    fused.append(tokens[0, i, k])
                colours.append(COLORS.index(o.color))
                categories.append(CATEGORY_NAMES.index(o.category))
    for what, labels, classes in (("colour", colours, COLORS), ("category", categories, CATEGORY_NAMES)):
        y = torch.tensor(labels)
        out[f"{what} probe, tower token"] = linear_probe(torch.stack(tower), y, classes=len(classes))
        if fused:
            out[f"{what} probe, fusion token"] = linear_probe(torch.stack(fused), y, classes=len(classes))
    return out


KEEP_SHARES = (0.25, 0.5, 0.6, 0.75, 0.9)
KEEP_ABOVE = (0.5, 0.7, 0.9)


def selective_rates(confidence: Sequence[float], wrong: Sequence[bool]) -> dict[str, float]:
    """Attribute rate (share of ``wrong`` claims) over all claims, over the most confident share of them
    (``top 50%``; ties broken by claim order), and over those with ``confidence >= p`` (with the share
    kept); NaN where nothing is kept."""
    conf, bad = np.asarray(confidence, dtype=float), np.asarray(wrong, dtype=bool)
    if conf.shape != bad.shape:
        raise ValueError(f"need one confidence per claim: {conf.shape} against {bad.shape}")
    rate = lambda m: float(bad[m].mean()) if m.any() else float("nan")  # noqa: E731
    out = {"claims": float(len(conf)), "rate": rate(np.ones(len(conf), bool))}
    order = np.argsort(-conf, kind="stable")
    for q in KEEP_SHARES:
        keep = np.zeros(len(conf), bool)
        keep[order[: int(q * len(conf))]] = True
        out[f"rate, top {q:.0%}"] = rate(keep)
    for p in KEEP_ABOVE:
        keep = conf >= p
        out[f"kept, p >= {p}"], out[f"rate, p >= {p}"] = float(keep.mean()) if len(conf) else 0.0, rate(keep)
    return out


def ranking_auc(score: Sequence[float], wrong: Sequence[bool]) -> float:
    """The chance that a right claim scores above a wrong one (ties count half): the area under the ROC
    curve of ``score`` as a detector of right claims; NaN without both kinds."""
    s, bad = np.asarray(score, dtype=float), np.asarray(wrong, dtype=bool)
    right, wrong_ = s[~bad], s[bad]
    if not len(right) or not len(wrong_):
        return float("nan")
    above = (right[:, None] > wrong_[None, :]).sum() + 0.5 * (right[:, None] == wrong_[None, :]).sum()
    return float(above / (len(right) * len(wrong_)))


def colour_confidence(
    model_dir: str, data: str, n: int, batch: int = 32, *, contrast: bool = False
) -> dict[str, float]:
    """:func:`selective_rates` and :func:`ranking_auc` of a model's greedy captions of ``n`` held-out notes,
    scored by the colour word's probability or, with ``contrast``, by its log-probability with the note's
    images minus that with the next note's (the last note's control is the first's)."""
    from PIL import Image

    from mm.data.prompts import CAPTION_PROMPT
    from mm.eval.claims.generative import judge
    from mm.eval.claims.truth import note_truth
    from mm.model.adapter import Sample, load_adapter
    from rl.rewards import char_tokens

    adapter = load_adapter(model_dir, device="cpu")
    extractor = build_extractor("world")
    notes = read_notes(data, "test")[:n]
    confidence, wrong = [], []
    for s in range(0, len(notes), batch):
        nb = notes[s : s + batch]
        samples = [
            Sample(
                images=[Image.open(Path(data) / p).convert("RGB") for p in note.images], text=CAPTION_PROMPT
            )
            for note in nb
        ]
        gen = adapter.generate_ids(samples, max_new_tokens=128)
        ids = [[int(t) for t in row] for row in gen.token_ids]
        with torch.no_grad():
            logps, mask = adapter.answer_logps(samples, ids)  # (B, T) each
            if contrast:  # the same captions with the next note's images
                other = [
                    Sample(images=samples[(b + 1) % len(samples)].images, text=CAPTION_PROMPT)
                    for b in range(len(samples))
                ]
                logps = logps - adapter.answer_logps(other, ids)[0]
        for b, note in enumerate(nb):
            pieces = [adapter.tokenizer.decode([t], skip_special_tokens=True) for t in ids[b]]
            row = logps[b][mask[b].bool()].tolist()  # one log-prob (or its rise) per generated token
            truth = note_truth(note, extractor.vocabulary)
            for claim in extractor.extract("".join(pieces)):
                verdict = judge(claim, truth) if claim.kind == "attribute" else None
                if verdict is not None:
                    value = row[char_tokens(pieces, [claim.span[0]])[0]]
                    confidence.append(value if contrast else math.exp(value))
                    wrong.append(verdict)
    out = selective_rates(confidence, wrong)
    if contrast:  # the thresholds are probabilities
        out = {k: v for k, v in out.items() if "p >=" not in k}
    return {**out, "auc": ranking_auc(confidence, wrong)}


PAIRED_RATIOS: dict[str, tuple[str, str]] = {
    "attribute rate": ("attr_hallucinated", "attr_judged"),
    "colour coverage": ("attr_covered", "attr_facts"),
    "colours per object": ("attr_judged", "mentions"),
    "chair_i": ("hallucinated", "mentions"),
    "recall": ("covered", "gt"),
    "mean_length": ("words", "captions"),
}
"""Metric of :func:`paired_changes` -> (numerator, denominator) of :func:`caption_units`."""
IN_POINTS = {"colour coverage", "recall"}


def caption_units(claims_json: dict[str, Any], categories: dict[str, list[str]]) -> dict[str, list]:
    """Per-caption units of one ``mm eval claims --json`` output: its attribute claim sums and the CHAIR
    sums (:func:`mm.eval.bootstrap.chair_units`) of the same captions against ``categories``."""
    from mm.eval.bootstrap import chair_units
    from mm.eval.chair import Vocabulary, chair_scores

    rows = claims_json["generative"]["per_caption"]
    missing = [r["id"] for r in rows if r["id"] not in categories]
    if missing:
        raise ValueError(
            f"{len(missing)} captioned notes are not in --data, e.g. {missing[:3]}; pass the folder evaluated"
        )
    chair = chair_scores(
        [{"image_id": r["id"], "caption": r["caption"]} for r in rows],
        {r["id"]: categories[r["id"]] for r in rows},
        Vocabulary.world(),
    )
    units: dict[str, list] = chair_units(chair["per_caption"])
    for key in ("hallucinated", "judged", "covered", "facts"):
        units[f"attr_{key}"] = [float(r["units"]["attribute"][key]) for r in rows]
    return units


def paired_changes(before: dict[str, Any], after: dict[str, Any], categories: dict[str, list[str]]) -> dict:
    """``{metric: {"before", "after", "change": Interval json}}`` over the notes both outputs captioned."""
    from mm.eval.bootstrap import paired_intervals

    b, a = caption_units(before, categories), caption_units(after, categories)
    relative = {m: m not in IN_POINTS for m in PAIRED_RATIOS}
    change = paired_intervals(b, a, PAIRED_RATIOS, relative=relative)

    def value(units: dict[str, list], m: str) -> float | None:
        num, den = (sum(units[k]) for k in PAIRED_RATIOS[m])
        return num / den if den else None

    return {m: {"before": value(b, m), "after": value(a, m), "change": change[m]} for m in change}


def _paired_line(metric: str, row: dict[str, Any]) -> str:
    c = row["change"]
    unit = " points" if metric in IN_POINTS else "%"
    fmt = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731
    ch = lambda v: "n/a" if v is None else f"{100 * v:+.1f}"  # noqa: E731
    return (
        f"{metric:20s} {fmt(row['before']):>8s} -> {fmt(row['after']):>8s}   "
        f"{ch(c['value'])}{unit} [{ch(c['low'])}, {ch(c['high'])}]"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("probe", help="teacher-forced colour accuracy and linear probes")
    a.add_argument("--model", required=True)
    a.add_argument("--data", required=True)
    a.add_argument("--notes", type=int, default=256)
    b = sub.add_parser("swap-pairs", help="write colour-swap preference pairs")
    b.add_argument("--data", required=True)
    b.add_argument("--out", required=True)
    b.add_argument("--notes", type=int, default=1200)
    b.add_argument("--per-note", type=int, default=2)
    b.add_argument("--seed", type=int, default=0)
    c = sub.add_parser("confidence", help="attribute rate of the colours a captioner is surest of")
    c.add_argument("--model", required=True)
    c.add_argument("--data", required=True)
    c.add_argument("--notes", type=int, default=200)
    c.add_argument("--contrast", action="store_true", help="score by the rise with the note's own images")
    d = sub.add_parser("paired", help="two models' claims on the same notes: changes with paired intervals")
    d.add_argument("--before", required=True, help="mm eval claims --json output of the model before")
    d.add_argument("--after", required=True, help="the same of the model after")
    d.add_argument("--data", required=True, help="the note folder both were evaluated on")
    d.add_argument("--split", default="test")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    if args.cmd == "paired":
        import json

        cats = {n.id: sorted(n.categories) for n in read_notes(args.data, args.split)}
        rows = paired_changes(*(json.loads(Path(f).read_text()) for f in (args.before, args.after)), cats)
        print(f"{'metric':20s} {'before':>8s}    {'after':>8s}   change [paired 95% interval]")
        for m, row in rows.items():
            print(_paired_line(m, row))
        return 0
    if args.cmd == "probe":
        for k, v in probe(args.model, args.data, args.notes).items():
            print(f"{k:38s} {v:.3f}" if isinstance(v, float) else f"{k:38s} {v}")
        return 0
    if args.cmd == "confidence":
        for k, v in colour_confidence(args.model, args.data, args.notes, contrast=args.contrast).items():
            print(f"{k:20s} {v:.3f}")
        return 0
    pairs = swap_pairs(read_notes(args.data, "train")[: args.notes], per_note=args.per_note, seed=args.seed)
    write_pairs(pairs, args.out)
    print(f"{len(pairs)} pairs ({sum(p.meta['binding'] for p in pairs)} binding errors) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

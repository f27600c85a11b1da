"""Where a note model loses the tray's place: its captions against the tokens it reads them from.

    python benchmarks/tray_finding.py --model runs/aw0/sft2/model --data runs/aw0/data [--notes 96]

The agent's first zoom must name the tray's box; a note model trained on the agent world's photos
(``rl.agent.world_export``) writes that box in each photo's caption ("... and a tray at [0.35, 0.0, 0.65,
0.31]."), one of the few boxes the world's tray spots allow. Two figures on an exported note folder:

- *caption*: the model's greedy caption (the image caption prompt) of the photo of ``--notes`` test
  notes; the share whose tray box is the reference caption's, to the character;
- *probe*: a logistic regression from the photo's fusion tokens to the tray's box (one class per box
  seen), on the first ``--probe`` notes (70% to fit, 30% to score): from the K tokens laid out in their
  order (``tokens``), and from their mean (``mean``: what a token's content alone carries, whatever its
  place in the sequence). ``chance`` is the most frequent box's share.

High ``tokens`` with low ``mean`` says the place is in which token holds the tray, not in any token's
content: an LM with relative positions (RoPE) must then count from ``<im_start>`` to tell it.
``model.token_position_embeddings`` puts the place into the content.

``--tray-probe N`` adds what the zoom on the tray shows the model, from the fusion tokens of the tray
image (the detail demonstrations' zoom) of the first N notes: the category and the colour of the tiny
object a token holds (one shared linear probe over every token whose cell one object alone tags, as the
per-token tags of pretraining do), beside a control that reads them from the mean of the same image's
empty tokens (what the background and the note's theme alone tell) and the most frequent class's share;
and the number of tiny objects on the tray from the mean of the image's tokens.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from colour_reading import linear_probe  # noqa: E402

TRAY = re.compile(r"tray at (\[[^\]]*\])")


def tray_box(caption: str) -> str | None:
    """The tray's box as a caption writes it (``"[0.35, 0.0, 0.65, 0.31]"``), or None."""
    m = TRAY.search(caption)
    return m.group(1) if m else None


def box_hits(references: Sequence[str], captions: Sequence[str]) -> int:
    """How many ``captions`` state the tray box of the reference caption beside them, to the character."""
    if len(references) != len(captions):
        raise ValueError(f"one caption per reference: {len(references)} vs {len(captions)}")
    return sum(tray_box(c) is not None and tray_box(c) == tray_box(r) for r, c in zip(references, captions))


def _rows(data: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in (data / "notes.jsonl").read_text().splitlines()]
    rows = [r for r in rows if r.get("image_captions") and tray_box(r["image_captions"][0])]
    if not rows:
        raise SystemExit(
            f"{data} has no notes whose first image caption states a tray box (rl.agent.world_export)"
        )
    return rows


def caption_hits(adapter: Any, data: Path, notes: int) -> dict[str, Any]:
    from mm.data.prompts import IMAGE_CAPTION_PROMPT
    from mm.eval.generate import generate

    rows = [r for r in _rows(data) if r["split"] == "test"][:notes]
    items = [[str(data / r["images"][0])] for r in rows]
    captions = generate(
        adapter.model, adapter.processor, items, [IMAGE_CAPTION_PROMPT] * len(rows), max_new_tokens=48
    )
    hits = box_hits([r["image_captions"][0] for r in rows], captions)
    return {"notes": len(rows), "box_right": hits, "share": hits / len(rows) if rows else float("nan")}


def image_tokens(
    adapter: Any, data: Path, rows: Sequence[dict[str, Any]], image: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fusion tokens of image ``image`` of each row: laid out in order (N, K * D) and their mean (N, D)."""
    model = adapter.model.eval()
    laid, mean = [], []
    for s in range(0, len(rows), 32):
        chunk = rows[s : s + 32]
        batch = adapter.processor([[str(data / r["images"][image])] for r in chunk], ["x"] * len(chunk))
        with torch.no_grad():
            tokens, _ = model.model.get_image_features(
                batch["pixel_values"], batch.get("image_mask")
            )  # (B, 1, K, D)
        laid.append(tokens.flatten(1).float())  # (B, K * D)
        mean.append(tokens.mean(dim=(1, 2)).float())  # (B, D)
    return torch.cat(laid), torch.cat(mean)


def probe(adapter: Any, data: Path, notes: int) -> dict[str, float]:
    rows = _rows(data)[:notes]
    labels = [tray_box(r["image_captions"][0]) for r in rows]
    boxes = sorted(set(labels))
    y = torch.tensor([boxes.index(b) for b in labels])  # (N,)
    laid, mean = image_tokens(adapter, data, rows, 0)
    n = len(boxes)
    return {
        "boxes": n,
        "tokens": linear_probe(laid, y, classes=n),
        "mean": linear_probe(mean, y, classes=n),
        "chance": float((y == y.mode().values).float().mean()),
    }


def token_labels(
    rows: Sequence[dict[str, Any]], grid: int, size: int
) -> tuple[list[tuple[int, int, str, str]], list[list[int]]]:
    """The tray image's tokens as a probe reads them, on a ``grid`` x ``grid`` token layout of a ``size``-px
    image (the mlp fusion keeps the patch grid): ``(row, token, category, colour)`` of every token whose cell
    one tray object alone tags (``mm.train.pretrain.data.cell_objects``, as the per-token tags of
    pretraining), and per row the tokens no object tags (its background)."""
    from mm.train.pretrain.data import cell_objects

    held, empty = [], []
    for i, r in enumerate(rows):
        cells: dict[int, list[dict[str, Any]]] = {}
        for o in r["objects"][1]:
            for c in cell_objects(o["bbox"], (grid, grid), (size, size)):
                cells.setdefault(c, []).append(o)
        held += [
            (i, k, objs[0]["category"], objs[0]["color"])
            for k, objs in sorted(cells.items())
            if len(objs) == 1
        ]
        empty.append([k for k in range(grid * grid) if k not in cells])
    return held, empty


def tray_probe(adapter: Any, data: Path, notes: int) -> dict[str, dict[str, float]]:
    """Linear probes on the tray image's fusion tokens (module docstring): the category and the colour of
    the object a token holds, from that token and (control) from the mean of its image's empty tokens; the
    number of objects on the tray from the mean of all the tokens."""
    rows = [json.loads(line) for line in (data / "notes.jsonl").read_text().splitlines()][:notes]
    laid, mean = image_tokens(adapter, data, rows, 1)  # (N, K * D), (N, D)
    tokens = laid.view(len(rows), -1, mean.shape[1])  # (N, K, D)
    grid = int(round(tokens.shape[1] ** 0.5))
    size = int(adapter.model.config.vision_config["image_size"])
    held, empty = token_labels(rows, grid, size)
    held = [h for h in held if empty[h[0]]]  # the control needs a background token in the same image
    own = torch.stack([tokens[i, k] for i, k, _, _ in held])  # (M, D)
    background = torch.stack([tokens[i, empty[i]].mean(0) for i, _, _, _ in held])  # (M, D)
    out = {}
    for j, name in ((2, "category"), (3, "colour")):
        values = sorted({h[j] for h in held})
        y = torch.tensor([values.index(h[j]) for h in held])  # (M,)
        out[name] = {
            "token": linear_probe(own, y, classes=len(values)),
            "background": linear_probe(background, y, classes=len(values)),
            "chance": float((y == y.mode().values).float().mean()),
            "tokens": len(held),
        }
    sizes = [len(r["objects"][1]) for r in rows]
    y = torch.tensor([n - min(sizes) for n in sizes])  # (N,)
    chance = float((y == y.mode().values).float().mean())
    out["objects"] = {
        "mean": linear_probe(mean, y, classes=int(y.max()) + 1),
        "chance": chance,
        "images": len(rows),
    }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a NoteVLM folder")
    ap.add_argument("--data", required=True, type=Path, help="a folder written by rl.agent.world_export")
    ap.add_argument("--notes", type=int, default=96, help="test notes to caption")
    ap.add_argument("--probe", type=int, default=900, help="notes for the linear probe (0: skip it)")
    ap.add_argument("--tray-probe", type=int, default=0, help="notes for the tray probes (0: skip them)")
    args = ap.parse_args(argv)
    from mm.model.adapter.load import load_adapter

    torch.set_num_threads(1)
    adapter = load_adapter(args.model)
    out: dict[str, Any] = {"model": args.model, "caption": caption_hits(adapter, args.data, args.notes)}
    if args.probe:
        out["probe"] = probe(adapter, args.data, args.probe)
    if args.tray_probe:
        out["tray_probe"] = tray_probe(adapter, args.data, args.tray_probe)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

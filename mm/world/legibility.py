"""How legible a detail photo's tiny objects are in the tower's view and in a zoom crop.

A *silhouette reader* segments an object's colour pixels (away from the tray colour, not the near-black
glyph) and names the theme category whose silhouette, rendered through the same pipeline (best over
radii and one-pixel shifts, with the true centre given), overlaps them best (IoU). It reads each tiny
object of :func:`mm.world.detail.sample_detail_scene` photos three times: from the ``view_size``
downsample the tower sees (``view``), from a crop of the source around the object resized to
``view_size`` (``zoom``), and from the crop of the whole tray that the agent's demonstrations zoom on
(``tray``: :data:`mm.world.detail.TRAY_PAD` around the tray, resized to ``view_size``; read in a window
around the object). It also answers "what colour is the tiny X" (X once on the tray) with the colour of
the blob that best matches X. Chance is 1/5 or 1/6 for the category. An upper bound for a learned
reader: it is given each object's centre.

    python -m mm.world.legibility --scenes 30 [--set tray_size=48]
"""

from __future__ import annotations

import argparse
import json

import cv2
import numpy as np

from mm.config import ConfigError, load_config
from mm.world import vocab
from mm.world.detail import (
    TRAY_LIFT,
    TRAY_PAD,
    DetailConfig,
    DetailScene,
    crop,
    downsample,
    padded_box,
    render_detail,
    sample_detail_scene,
)
from mm.world.render import THEME_BACKGROUND, glyph_mask, object_box, shape_mask
from mm.world.scene import SceneObject

Box = tuple[int, int, int, int]


def silhouette(patch: np.ndarray, tray: np.ndarray) -> np.ndarray:
    """``(h, w)`` bool: pixels of an object's colour (away from ``tray``, not the near-black glyph)."""
    p = patch.astype(np.int16)  # (h, w, 3)
    return (np.abs(p - tray).max(-1) > 40) & (p.max(-1) > 90)


def template(category: str, cx: float, cy: float, r: float, box: Box, out: tuple[int, int], tray: np.ndarray):
    """Silhouette of ``category`` at ``(cx, cy, r)`` (source pixels) seen through ``box`` resized to
    ``out`` = ``(w, h)``."""
    x0, y0, x1, y1 = box
    hw = (y1 - y0, x1 - x0)
    c = vocab.category(category)
    img = np.tile(tray.astype(np.uint8), (*hw, 1))  # (h, w, 3)
    sm = shape_mask(c.shape, cx - x0, cy - y0, r, hw)
    img[sm] = 245
    if c.glyph != "solid":
        img[glyph_mask(c.glyph, c.shape, cx - x0, cy - y0, r, hw) & sm] = 18
    interp = cv2.INTER_AREA if out[0] < hw[1] else cv2.INTER_LINEAR
    return silhouette(cv2.resize(img, out, interpolation=interp), tray)


def match(
    cfg: DetailConfig, patch: np.ndarray, o: SceneObject, box: Box, out: tuple[int, int], theme: str,
    tray: np.ndarray, window: np.ndarray | None = None,
) -> dict[str, float]:  # fmt: skip
    """Per theme category, the best IoU of its silhouette with the one seen in ``patch`` (within the
    ``(h, w)`` bool ``window`` of ``patch`` if given: the object's surroundings in a crop of several)."""
    seen = silhouette(patch, tray)
    if window is not None:
        seen = seen & window
    score = {}
    for cat in vocab.categories_of_theme(theme):
        best = 0.0
        for r in np.linspace(cfg.tiny_radius_min, cfg.tiny_radius_max, 4):
            for dx in (-1.0, 0.0, 1.0):
                for dy in (-1.0, 0.0, 1.0):
                    t = template(cat, o.cx + dx, o.cy + dy, float(r), box, out, tray)
                    if window is not None:
                        t = t & window
                    best = max(best, float((t & seen).sum() / max(1, (t | seen).sum())))
        score[cat] = best
    return score


def read_scene(cfg: DetailConfig, scene: DetailScene, image: np.ndarray) -> dict[str, list[dict[str, float]]]:
    """Match scores of every tiny object of ``scene``, from the view and from a zoom crop."""
    s = round(cfg.scale)
    if s * cfg.view_size != cfg.source_size:
        raise ValueError(
            f"the reader needs source_size a multiple of view_size, got {cfg.source_size}, {cfg.view_size}"
        )
    tray = np.minimum(np.asarray(THEME_BACKGROUND[scene.theme]) + TRAY_LIFT, 255).astype(np.int16)
    view = downsample(image, cfg.view_size)
    seen: dict[str, list[dict[str, float]]] = {"view": [], "zoom": [], "tray": []}
    tb = padded_box(scene.tray, TRAY_PAD, cfg.source_size)
    tray_zoom = crop(image, tb, cfg.view_size)  # (V, V, 3): what a tray zoom shows
    k = cfg.view_size / (tb[2] - tb[0])  # view pixels per source pixel in it
    for o in scene.tiny:
        zb = padded_box(object_box(o, cfg.source_size), 3, cfg.source_size)
        vb = (zb[0] // s * s, zb[1] // s * s, -(-zb[2] // s) * s, -(-zb[3] // s) * s)  # on the view's grid
        patch = view[vb[1] // s : vb[3] // s, vb[0] // s : vb[2] // s]
        out = ((vb[2] - vb[0]) // s, (vb[3] - vb[1]) // s)
        seen["view"].append(match(cfg, patch, o, vb, out, scene.theme, tray))
        zoom = crop(image, zb, cfg.view_size)
        seen["zoom"].append(match(cfg, zoom, o, zb, (cfg.view_size,) * 2, scene.theme, tray))
        window = np.zeros((cfg.view_size,) * 2, bool)  # the object's padded box in the tray zoom
        window[
            max(0, int((zb[1] - tb[1]) * k)) : int(np.ceil((zb[3] - tb[1]) * k)),
            max(0, int((zb[0] - tb[0]) * k)) : int(np.ceil((zb[2] - tb[0]) * k)),
        ] = True
        seen["tray"].append(match(cfg, tray_zoom, o, tb, (cfg.view_size,) * 2, scene.theme, tray, window))
    return seen


def legibility(cfg: DetailConfig, scenes: int, seed: int = 0) -> dict[str, float]:
    """Reader accuracy over ``scenes`` photos: ``view`` / ``zoom`` / ``tray`` on categories, ``*_color`` on
    colours."""
    hits: dict[str, list[bool]] = {k: [] for w in ("view", "zoom", "tray") for k in (w, f"{w}_color")}
    for i in range(scenes):
        theme = vocab.THEMES[i % len(vocab.THEMES)]
        scene = sample_detail_scene(cfg, theme, np.random.default_rng([seed, i]))
        seen = read_scene(cfg, scene, render_detail(cfg, scene, [seed, i, 1]))
        cats = [o.category for o in scene.tiny]
        for where, scores in seen.items():
            hits[where] += [max(sc, key=sc.__getitem__) == c for sc, c in zip(scores, cats)]
            for x in sorted({c for c in cats if cats.count(c) == 1}):
                pick = int(np.argmax([sc[x] for sc in scores]))
                hits[f"{where}_color"].append(scene.tiny[pick].color == scene.tiny[cats.index(x)].color)
    out = {k: float(np.mean(v)) for k, v in hits.items()}
    out["objects"] = float(len(hits["view"]))
    out["color_questions"] = float(len(hits["view_color"]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m mm.world.legibility", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--scenes", type=int, default=30, help="photos to read (default 30)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the photos (default 0)")
    parser.add_argument(
        "--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="detail photo settings (mm.world.detail.DetailConfig), e.g. tray_size=48",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        cfg = load_config(DetailConfig, None, args.overrides)
    except (ConfigError, ValueError) as err:
        parser.error(str(err))
    print(json.dumps(legibility(cfg, args.scenes, args.seed), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

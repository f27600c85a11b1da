"""Does a captioning model read the agent world's photos? A check of a ``policy.init`` candidate.

    python -m rl.agent.read_probe runs/sft/model --seed 0 --notes 96
    python -m rl.agent.read_probe runs/sft/model --detail --tray-spots 3 --set detail.tiny_radius_min=6
    python -m rl.agent.read_probe runs/sft/model --objects --tray-spots 3 --notes 48
    python -m rl.agent.read_probe runs/sft/model --find --tray-spots 3 --notes 100
    python -m rl.agent.read_probe runs/sft/model --tally --tray-spots 3 --notes 64

The model captions ("Describe the photo.", greedy) each test caption task's photo as a whole and its
tray as a zoom crop returns it; a caption *mentions* an object when it holds the object's name, and its
colour and name ("red car"). Recall of mentions over the photos' objects is set against the same
recall of a caption of another test note of the same theme (the next one in order): a model that
names the theme's usual objects without reading the photo scores the same on both.

``--detail``: the reading a detail task needs once the zoom is right. For each test detail task the model
sees the asked photo's tray as the detail demonstrations' zoom crops it and is asked the question alone,
in the words of the SFT tasks ``colour_answer`` / ``count_answer`` ("What colour is the cup in this
photo?", "How many cups are in this photo?"); accuracy per ask, against the share of the most common true
answer (what one constant answer scores), and the answers the model gives.

``--objects``: how the ``objects`` tool cuts up the asked photos of test detail tasks (the tray's tiny
objects exactly? on the whole photo, every tiny one, and how many other regions?) and whether the model
names the category (and colour) of each tiny object it cuts out of the tray (:func:`object_reading`).

``--find``: the ``find`` tool with the model as its namer on the asked photo of each test detail task, for
the asked thing in the question's words: how many count and colour questions its matches answer
(:func:`find_reading`).

``--tally``: ``find`` for "tiny" on each test caption task's photo, as a caption demonstration calls it, with
the model as its namer: what its ``labels`` tally says against the tray's tiny objects (categories found,
counts of two or more right, whole trays right; :func:`tally_reading`).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from mm.config import ConfigError, load_config
from rl.agent.answers import colors_in, numbers_in
from rl.agent.backend import AgentBackend, Sampling
from rl.agent.world_demos import loop_observation, tray_box, zoom_call
from rl.agent.world_tasks import WorldTaskConfig, world_note, world_tasks

PROMPT = "Describe the photo."
"""The pipeline's image caption prompt."""


def mention_recall(objects: Sequence[Sequence[tuple[str, str]]], captions: Sequence[str]) -> dict[str, Any]:
    """Share of ``(category, colour)`` objects whose name, and whose "colour name", caption ``i`` holds."""
    if len(objects) != len(captions):
        raise ValueError(f"one caption per photo: {len(objects)} photos, {len(captions)} captions")
    pairs = [(o, c, text) for objs, text in zip(objects, captions) for o, c in objs]
    n = len(pairs)
    return {
        "objects": n,
        "name": sum(o in text for o, _, text in pairs) / n if n else float("nan"),
        "colour_name": sum(f"{c} {o}" in text for o, c, text in pairs) / n if n else float("nan"),
    }


def same_theme_other(themes: Sequence[str]) -> list[int]:
    """For each photo, the next other photo (cyclically) of the same theme; itself when it has none."""
    n = len(themes)
    return [next((j % n for j in range(i + 1, i + n) if themes[j % n] == themes[i]), i) for i in range(n)]


def captions(
    backend: AgentBackend,
    images: Sequence[Any],
    *,
    batch_size: int,
    max_new_tokens: int,
    prompts: Sequence[str] | None = None,
) -> list[str]:
    """Greedy answers to ``prompts`` (default: the caption prompt), one image each."""
    rows = [backend.prompt([im], p) for im, p in zip(images, prompts or [PROMPT] * len(images))]
    out: list[str] = []
    for i in range(0, len(rows), batch_size):
        turns = backend.generate(rows[i : i + batch_size], max_new_tokens=max_new_tokens, sampling=Sampling())
        out += [t.text for t in turns]
    return out


def read_probe(
    backend: AgentBackend, cfg: WorldTaskConfig, notes: int, *, batch_size: int = 16, max_new_tokens: int = 64
) -> dict[str, Any]:
    """Mention recall of the large object (whole photo) and the tiny ones (whole photo, tray crop), each
    with its same-theme control (module docstring)."""
    tasks = list(world_tasks(cfg, "caption", "test", notes))
    photos = [t.sources[t.meta["image"] - 1] for t in tasks]
    trays = [p[y0:y1, x0:x1] for p, (x0, y0, x1, y1) in zip(photos, (t.meta["tray"] for t in tasks))]
    themes = [note_of(cfg, t).theme for t in tasks]
    other = same_theme_other(themes)
    large = [t.meta["objects"][0][:1] for t in tasks]
    tiny = [t.meta["objects"][0][1:] for t in tasks]
    kw = {"batch_size": batch_size, "max_new_tokens": max_new_tokens}
    caps = {"photo": captions(backend, photos, **kw), "tray": captions(backend, trays, **kw)}
    result: dict[str, Any] = {"seed": cfg.seed, "photos": len(tasks), "examples": caps["tray"][:3]}
    for name, objs, view in (("large/photo", large, "photo"), ("tiny/photo", tiny, "photo"),
                             ("tiny/tray", tiny, "tray")):  # fmt: skip
        result[name] = mention_recall(objs, caps[view])
        result[name + "/control"] = mention_recall(objs, [caps[view][j] for j in other])
    return result


def detail_question(task: Any) -> str:
    """A detail task's question in the words of the SFT tasks ``colour_answer`` / ``count_answer``."""
    from mm.train.tasks import COLOUR_QUESTION, COUNT_QUESTION, plural

    obj = task.meta["object"]
    if task.meta["ask"] == "color":
        return COLOUR_QUESTION.format(name=obj)
    return COUNT_QUESTION.format(what=plural(obj))


def answer_right(task: Any, text: str) -> bool:
    """True when the first colour (or count) ``text`` names is the task's answer."""
    if task.meta["ask"] == "color":
        return colors_in(text)[:1] == [task.answer]
    return numbers_in(text)[:1] == [int(task.answer)]


def detail_reading(backend: AgentBackend, cfg: WorldTaskConfig, tasks: int, *, batch_size: int = 16) -> dict:
    """Per ask (``color``, ``count``): accuracy on the right tray zoom, the constant-answer share, the
    answers given (module docstring)."""
    items = list(world_tasks(cfg, "detail", "test", tasks))
    calls = [zoom_call(t, t.meta["image"], tray_box(t, t.meta["tray"])) for t in items]
    crops = [loop_observation(call, t)[1] for call, t in zip(calls, items)]
    said = captions(
        backend, crops, batch_size=batch_size, max_new_tokens=8, prompts=[detail_question(t) for t in items]
    )
    out: dict[str, Any] = {"seed": cfg.seed, "tasks": len(items)}
    for ask in ("color", "count"):
        mine = [(t, s) for t, s in zip(items, said) if t.meta["ask"] == ask]
        truth = [t.answer for t, _ in mine]
        out[ask] = {
            "tasks": len(mine),
            "right": sum(answer_right(t, s) for t, s in mine),
            "constant": max(map(truth.count, truth), default=0),
            "answers": dict(sorted(Counter(s.strip() for _, s in mine).items(), key=lambda kv: -kv[1])[:5]),
        }
    return out


def object_reading(backend: AgentBackend, cfg: WorldTaskConfig, tasks: int, *, batch_size: int = 16) -> dict:
    """``--objects``: how the ``objects`` tool (``rl.agent.objects``) cuts up the asked photos of ``tasks``
    test detail tasks, and whether the model names each tiny object it cuts out of the tray.

    ``trays_exact``: trays whose objects are exactly the tiny ones; on the whole photo with
    ``SMALL_OBJECTS`` (``photo_objects``): ``tiny_missed`` and the count of other regions per photo; then
    the share of the tray's cut-outs whose caption ("Describe the photo.") holds the category, and colour
    and category, of the tiny object at its centre."""
    from rl.agent.objects import located, objects
    from rl.agent.world_demos import SMALL_OBJECTS

    def holds(f: Any, o: Sequence) -> bool:  # o: [category, colour, cx, cy]
        return f.box[0] <= o[2] < f.box[2] and f.box[1] <= o[3] < f.box[3]

    items = list(world_tasks(cfg, "detail", "test", tasks))
    images, truth, exact, missed, others = [], [], 0, 0, Counter()
    for t in items:
        tiny = t.meta["tiny"]
        box = zoom_call(t, t.meta["image"], tray_box(t, t.meta["tray"]))["box"]
        found = located(t, t.meta["image"], box)
        exact += len(found) == len(tiny) and all(sum(holds(f, o) for f in found) == 1 for o in tiny)
        obs = objects(t, t.meta["image"], box)
        for f, image in zip(found, getattr(obs, "images", ())):
            inside = [o for o in tiny if holds(f, o)]
            if inside:
                images.append(image)
                truth.append(inside[0][:2])
        whole = located(t, t.meta["image"], None, SMALL_OBJECTS)
        missed += sum(not any(holds(f, o) for f in whole) for o in tiny)
        others[len(whole) - sum(any(holds(f, o) for o in tiny) for f in whole)] += 1
    said = captions(backend, images, batch_size=batch_size, max_new_tokens=24)
    n = max(len(images), 1)
    return {
        "seed": cfg.seed,
        "tasks": len(items),
        "trays_exact": exact,
        "photo": {"tiny_missed": missed, "other_regions": dict(sorted(others.items()))},
        "cutouts": len(images),
        "category": sum(cat in s for (cat, _), s in zip(truth, said)) / n,
        "colour_and_category": sum(f"{col} {cat}" in s for (cat, col), s in zip(truth, said)) / n,
        "examples": said[:3],
    }


def find_reading(backend: AgentBackend, cfg: WorldTaskConfig, tasks: int, *, batch_size: int = 16) -> dict:
    """``--find``: the ``find`` tool (``rl.agent.find``) with the model as its namer, called on the asked
    photo of ``tasks`` test detail tasks for the asked thing in the question's words (as the demonstrations
    call it): a count is right when the matches are as many as the answer, a colour when there is one
    match and the model's description of it holds the answer. What a policy that copies the call reads."""
    from rl.agent import find as tool
    from rl.agent.world_demos import find_call

    def name(images: Sequence[Any]) -> list[str]:
        return captions(backend, images, batch_size=batch_size, max_new_tokens=24)

    before = tool.set_namer(name)
    try:
        out: dict[str, Any] = {"seed": cfg.seed, "tasks": tasks, "regions": 0}
        for t in world_tasks(cfg, "detail", "test", tasks):
            call = find_call(t)
            crops = [crop for _, crop in tool.regions(t, call["image"])]
            said = name(crops) if crops else []
            hits = [s for s in said if tool.matches(call["object"], s)]
            ask = out.setdefault(t.meta["ask"], {"tasks": 0, "right": 0})
            ask["tasks"] += 1
            if t.meta["ask"] == "count":
                ask["right"] += len(hits) == int(t.answer)
            else:
                ask["right"] += len(hits) == 1 and t.answer in colors_in(hits[0])
            out["regions"] += len(crops)
        return out
    finally:
        tool.set_namer(before)


def note_of(cfg: WorldTaskConfig, task: Any) -> Any:
    """The world note a task of world ``cfg`` was made from (its ``meta["note"]``, "aw0-000123")."""
    return world_note(cfg, int(task.meta["note"].rsplit("-", 1)[1]))


def tally_reading(backend: AgentBackend, cfg: WorldTaskConfig, tasks: int, *, batch_size: int = 16) -> dict:
    """``--tally``: per test caption task, the things the namer names among ``find``'s matches for "tiny"
    (:func:`rl.agent.find.tally`) against the tray's tiny objects by category: ``recall`` (tray objects
    whose category is named as often), ``precision`` (names that are a tray object's), ``counts_right``
    (categories of two or more on a tray named that many times), ``trays_right`` (every category's number)."""
    from rl.agent import find as tool
    from rl.agent.world_demos import CAPTION_FIND

    def name(images: Sequence[Any]) -> list[str]:
        return captions(backend, images, batch_size=batch_size, max_new_tokens=24)

    before = tool.set_namer(name)
    try:
        n = Counter()
        for t in world_tasks(cfg, "caption", "test", tasks):
            scene = note_of(cfg, t).scenes[t.meta["photo"] - 1]
            truth = Counter(o.category for o in scene.tiny)
            crops = [crop for _, crop in tool.regions(t, 1)]
            said = [s for s in (name(crops) if crops else []) if tool.matches(CAPTION_FIND["object"], s)]
            named = Counter(map(tool.thing, said))
            n["objects"] += truth.total()
            n["named"] += named.total()
            n["found"] += (truth & named).total()
            groups = [c for c, k in truth.items() if k >= 2]
            n["groups"] += len(groups)
            n["groups_right"] += sum(named[c] == truth[c] for c in groups)
            n["whole_trays"] += named == truth
        return {
            "seed": cfg.seed, "tasks": tasks, **n,
            "recall": n["found"] / n["objects"] if n["objects"] else None,
            "precision": n["found"] / n["named"] if n["named"] else None,
            "counts_right": n["groups_right"] / n["groups"] if n["groups"] else None,
            "trays_right": n["whole_trays"] / tasks if tasks else None,
        }  # fmt: skip
    finally:
        tool.set_namer(before)


def main(argv: Sequence[str] | None = None) -> int:
    from mm.model.adapter.load import load_adapter
    from rl.agent.backend import backend_for

    parser = argparse.ArgumentParser(prog="python -m rl.agent.read_probe", description=__doc__.split("\n")[0])
    parser.add_argument("model", help="model folder (a NoteVLM written by mm train, or a supported family)")
    parser.add_argument("--seed", type=int, default=0, help="world seed (default 0)")
    parser.add_argument("--notes", type=int, default=96, help="test caption tasks (default 96)")
    parser.add_argument(
        "--tray-spots", type=int, default=0, help="the world's detail.tray_spots (agent_world.yaml: 3)"
    )
    parser.add_argument(
        "--detail", action="store_true", help="ask test detail tasks' questions on the right tray zoom"
    )
    parser.add_argument(
        "--objects",
        action="store_true",
        help="the objects tool's cut-outs of the asked tray, named one by one",
    )
    parser.add_argument(
        "--find", action="store_true", help="the find tool on the asked photo, the model as its namer"
    )
    parser.add_argument(
        "--tally", action="store_true", help="find 'tiny' on caption photos: its tally against the tray"
    )
    parser.add_argument(
        "--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="world settings, as rl agent's world: section (detail.tiny_radius_min=6)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    sets = [f"seed={args.seed}", f"detail.tray_spots={args.tray_spots}", *args.overrides]
    try:
        cfg = load_config(WorldTaskConfig, None, sets)
    except ConfigError as err:
        parser.error(str(err))
    backend = backend_for(load_adapter(args.model))
    if args.find:
        result = find_reading(backend, cfg, args.notes)
    elif args.tally:
        result = tally_reading(backend, cfg, args.notes)
    elif args.objects:
        result = object_reading(backend, cfg, args.notes)
    else:
        result = (
            detail_reading(backend, cfg, args.notes) if args.detail else read_probe(backend, cfg, args.notes)
        )
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Scripted expert trajectories for the SFT cold start, one per task, from the world's ground truth.

    turns = demonstration(task)        # list[DemoTurn]

A demonstration is a plain list of :class:`DemoTurn`, in order:

- ``role="user"``: a user message (the task's question first; the note's images come with it, as
  the loop presents them). ``policy=False``.
- ``role="assistant"``: the policy's text: either exactly one tool call in the loop's format,
  ``<tool>{"name": "zoom", "image": 2, "box": [x0, y0, x1, y1]}</tool>`` (``call`` holds the parsed
  dict) or ``<tool>{"name": "compare", "images": [1, 2]}</tool>``, or the final answer (``call`` None).
  ``policy=True``: the only turns a loss may train on.
- ``role="tool"``: the observation of the call before it (``call`` repeats it), rendered by the loop's own
  tools (:func:`loop_observation`, backed by :data:`rl.agent.tools.TOOLS`), so a demonstration shows
  exactly what a rollout shows. For ``zoom``, ``image`` is the crop at full resolution (``(h, w, 3)``
  uint8; the loop encodes it at the tower's size). ``policy=False``: masked out of the loss. Pass
  ``run_tool(call, task) -> (text, image | None)`` to :func:`demonstration` to render them otherwise.

Boxes: the world's task meta holds boxes in source pixels (ends exclusive); the calls here hold them
NORMALISED to [0, 1] as the parser wants (:func:`normalised_box`: two decimals, rounded outwards so the
crop still holds the whole pixel box). :func:`policy_turns` is what the SFT cold start replays through
the loop (``rl.agent.demos.scripted_policy``), and :func:`answer_turns` the same without tool calls (the
no-tool baseline's demonstrations). ``rl.agent.demos.demo_turns`` is the generic script for user tasks
whose ``meta["box"]`` is already normalised; world tasks use this module.

Scripts: ``detail`` zooms on ``meta["box"]`` in the asked photo (or on its tray, or on the whole photo and
then its tray, or takes the tray's ``tiles`` and says what each holds: ``detail_zoom``), then answers;
``change`` calls ``compare`` on photos 1 and 2, zooms on the changed region in each photo where the object
is (or lets ``compare`` show it: ``change_zoom``), then states the change; ``caption`` zooms on the tray,
then gives the reference caption; ``dialogue`` plays against
:class:`rl.agent.simulator.UserSimulator`: zooms on the tray of each photo that holds the goal's
objects (or of every photo: ``dialogue_zoom``), then answers each slot the user asks (and only that
slot) until the user is satisfied; ``qa`` (a task from a user's file) replays the file's own calls, then
its answer (:func:`qa_demo`).
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mm.world import vocab
from mm.world.detail import TRAY_GRID, padded_box
from mm.world.text import article
from rl.agent.parse import ParseError, parse_call
from rl.agent.simulator import SimulatorConfig, UserSimulator
from rl.agent.task import AgentTask
from rl.agent.tools import TOOLS, WHOLE, box_pixels, tile_bounds
from rl.agent.world_tasks import TRAY_PAD, join_phrases

RunTool = Callable[[dict, AgentTask], tuple[str, "np.ndarray | None"]]
"""``(call, task) -> (observation text, image or None)``."""


@dataclass(frozen=True)
class DemoTurn:
    """One turn of a demonstration (module docstring)."""

    role: str
    """``user``, ``assistant`` or ``tool``."""
    text: str
    """The turn's text."""
    policy: bool
    """True exactly for the assistant's turns (the tokens a loss trains on)."""
    call: dict | None = None
    """The tool call an assistant turn makes, or the call a tool turn answers."""
    image: np.ndarray | None = None
    """A ``zoom`` observation's crop at full resolution, ``(h, w, 3)`` uint8."""
    learn: bool = True
    """False for a policy turn kept as context but out of the loss: a recovery demonstration's mistake."""
    plain: str | None = None
    """What the no-tool demonstration answers instead (:func:`answer_turns`), when this answer reads tool
    observations it would not have (the tiles' inventory); None: the same text."""

    def to_json(self) -> dict[str, Any]:
        """The turn as JSON (the image as its shape; it is rebuilt from the call and the task's sources)."""
        return {
            "role": self.role,
            "text": self.text,
            "policy": self.policy,
            "learn": self.learn,
            "call": self.call,
            "plain": self.plain,
            "image_shape": None if self.image is None else list(self.image.shape),
        }


def tool_text(call: dict) -> str:
    """``call`` in the loop's format."""
    return f"<tool>{json.dumps(call)}</tool>"


def checked_call(call: dict, task: AgentTask) -> Any:
    """A demonstration's ``call`` parsed as the loop parses it (a ``ToolCall``); ValueError when invalid."""
    parsed = parse_call(tool_text(call), TOOLS, n_images=len(task.sources))
    if isinstance(parsed, ParseError):
        raise ValueError(
            f"task {task.task_id!r}: the demonstration's call {call} is invalid: {parsed.message}"
        )
    return parsed


def loop_observation(call: dict, task: AgentTask) -> tuple[str, np.ndarray | None]:
    """The observation the agent loop shows for ``call``: the call parsed and run by :data:`TOOLS`."""
    obs = TOOLS.run(checked_call(call, task), task)
    return obs.text, obs.image


def normalised_box(box: list[int], width: int, height: int) -> list[float]:
    """A source-pixel box ``[x0, y0, x1, y1]`` (ends exclusive) as fractions of the image, two decimals,
    rounded outwards (x0, y0 down, x1, y1 up) so the normalised box covers every pixel of ``box``."""
    x0, y0, x1, y1 = box
    down = [math.floor(100 * x0 / width) / 100, math.floor(100 * y0 / height) / 100]
    up = [math.ceil(100 * x1 / width) / 100, math.ceil(100 * y1 / height) / 100]
    return [down[0], down[1], min(up[0], 1.0), min(up[1], 1.0)]


def _use(
    turns: list[DemoTurn], call: dict, task: AgentTask, run_tool: RunTool, learn: bool = True, say: str = ""
) -> None:
    """The assistant's call (after ``say``, text the same turn writes first) and the tool's observation."""
    turns.append(DemoTurn("assistant", say + tool_text(call), True, call, learn=learn))
    text, image = run_tool(call, task)
    turns.append(DemoTurn("tool", text, False, call, image))


def zoom_call(task: AgentTask, image: int, box: list[int]) -> dict[str, Any]:
    """A zoom call on source-pixel ``box`` of note image ``image``, normalised."""
    H, W = task.sources[image - 1].shape[:2]
    return {"name": "zoom", "image": image, "box": normalised_box(box, W, H)}


DETAIL_ZOOMS = ("target", "tray", "photo_tray", "tiles", "photo_tiles", "objects", "photo_objects", "find")
"""Where a detail demonstration zooms: the asked objects' box, or the whole tray they lie on (larger in
the downsampled view, so a small policy can find it), or, in a note of several photos, first the whole
asked photo (:data:`WHOLE`: the photo alone again, as the last image before the policy's next turn) and
then its tray; or ``tiles`` (``rl.agent.tiles``, in ``tool_modules``) of the tray, one per tray cell, and
an answer that first says what each tile holds (:func:`tile_inventory`); or ``photo_tiles``: first the
tiles of the whole asked photo, then "The tray is in tile k." and the tray's tiles, then the same answer
(the tray is found by picking one of the photo's tiles, each shown alone, instead of reading its place
off one downsampled view); or ``objects`` (``rl.agent.objects``, in ``tool_modules``) on the tray: each
tiny object cut out alone, and an answer that first says what each one is (:func:`object_inventory`); or
``photo_objects``: the same on the whole asked photo, objects up to :data:`SMALL_OBJECTS` of its area (the
tiny ones; no box to find); or ``find`` (``rl.agent.find``, in ``tool_modules``) on the whole asked photo,
the asked thing in the question's own words ("tiny towels"): the regions a model names so, then the
answer (no box to find, no object to pick out of the tray)."""

ZOOM_TOOL_MODULES = {
    "tiles": "rl.agent.tiles",
    "photo_tiles": "rl.agent.tiles",
    "objects": "rl.agent.objects",
    "photo_objects": "rl.agent.objects",
    "find": "rl.agent.find",
}
"""The opt-in tool module (``tool_modules``) each detail zoom that calls one needs."""
KNOB_TOOL_MODULES = {
    "detail_zoom": ZOOM_TOOL_MODULES,
    "caption_zoom": {"find": "rl.agent.find"},
    "dialogue_zoom": {"find": "rl.agent.find"},
}
"""Per ``data`` knob, the opt-in tool module each of its values that calls one needs (a caption's ``objects``
zoom is a ``zoom`` on the objects' box, not the ``objects`` tool)."""

SMALL_OBJECTS = 0.005
"""``max_size`` of a ``photo_objects`` call: a share of the photo's area above the tiny objects' (at most
110 of 65,536 source pixels) and below the large ones' (520 and more)."""


def tray_box(task: AgentTask, tray: list[int]) -> list[int]:
    """The tray's source-pixel box, padded by ``TRAY_PAD`` pixels and made square (as dialogue zooms do)."""
    return list(padded_box(tuple(tray), TRAY_PAD, task.sources[0].shape[0]))


def detail_demo(
    task: AgentTask, run_tool: RunTool, zoom: str = "target", bare: bool = False, reasoning: bool = False
) -> list[DemoTurn]:
    """Zoom (``zoom``: one of :data:`DETAIL_ZOOMS`), then answer; with ``reasoning`` the answer first says
    what lies on the tray, in the world's caption grammar, and then gives the value in an ``<answer>``
    block, the only part that is scored: "On the tray are a tiny red cup and two tiny shells (blue and
    green). <answer>It is red.</answer>"."""
    m = task.meta
    turns = [DemoTurn("user", task.question, False)]
    box = m["box"] if zoom == "target" else tray_box(task, m["tray"])
    if zoom == "photo_tray" and len(task.sources) > 1:
        _use(turns, {"name": "zoom", "image": m["image"], "box": WHOLE}, task, run_tool)
    answer = detail_answer(m["ask"], task.answer, m["object"], bare)
    if zoom in ("tiles", "photo_tiles"):
        call = {**zoom_call(task, m["image"], box), "name": "tiles", "grid": TRAY_GRID}
        say = ""
        if zoom == "photo_tiles":
            whole = {"name": "tiles", "image": m["image"], "box": WHOLE, "grid": TRAY_GRID}
            _use(turns, whole, task, run_tool)
            say = f"The tray is in tile {tray_tile(task, whole)}. "
        _use(turns, call, task, run_tool, say=say)
        text = f"{tile_inventory(task, call)} <answer>{answer}</answer>"
        turns.append(DemoTurn("assistant", text, True, plain=answer))
        return turns
    if zoom in ("objects", "photo_objects"):
        call = (
            {**zoom_call(task, m["image"], box), "name": "objects"}
            if zoom == "objects"
            else {"name": "objects", "image": m["image"], "max_size": SMALL_OBJECTS}
        )
        _use(turns, call, task, run_tool)
        text = f"{object_inventory(task, call)} <answer>{answer}</answer>"
        turns.append(DemoTurn("assistant", text, True, plain=answer))
        return turns
    if zoom == "find":
        _use(turns, find_call(task), task, run_tool)
        turns.append(DemoTurn("assistant", answer, True))
        return turns
    _use(turns, zoom_call(task, m["image"], box), task, run_tool)
    if reasoning:
        answer = f"{m['tray_text']} <answer>{answer}</answer>"
    turns.append(DemoTurn("assistant", answer, True))
    return turns


def tile_of(task: AgentTask, call: dict, x: float, y: float) -> int | None:
    """The 0-based tile (row by row) of a ``tiles`` call on the asked photo that holds source pixel
    ``(x, y)``, or None when the call's box does not."""
    H, W = task.sources[task.meta["image"] - 1].shape[:2]
    x0, y0, x1, y1 = box_pixels(call["box"], W, H)
    n = call["grid"]
    c = next((i for i, (a, b) in enumerate(tile_bounds(x0, x1, n)) if a <= x < b), None)
    r = next((i for i, (a, b) in enumerate(tile_bounds(y0, y1, n)) if a <= y < b), None)
    return None if c is None or r is None else r * n + c


def tray_tile(task: AgentTask, call: dict) -> int:
    """The tile (from 1) of a ``tiles`` call on the whole asked photo that holds the tray's centre."""
    x0, y0, x1, y1 = task.meta["tray"]
    k = tile_of(task, call, (x0 + x1) / 2, (y0 + y1) / 2)
    if k is None:
        raise ValueError(f"task {task.task_id!r}: the call {call} does not hold the tray")
    return k + 1


def tile_inventory(task: AgentTask, call: dict) -> str:
    """What each tile of a ``tiles`` call on the asked photo holds, row by row, from the task's tiny
    objects (``meta["tiny"]``: category, colour, centre in source pixels): "tile 1: a red cup. tile 2:
    empty. ..."; an object belongs to the tile its centre lies in."""
    n = call["grid"]
    held: dict[int, str] = {}
    for cat, colour, cx, cy in task.meta["tiny"]:
        k = tile_of(task, call, cx, cy)
        if k is not None:
            held.setdefault(k, f"{article(colour)} {colour} {cat}")
    return " ".join(f"tile {k + 1}: {held.get(k, 'empty')}." for k in range(n * n))


def object_inventory(task: AgentTask, call: dict) -> str:
    """What each object an ``objects`` call on the asked photo shows is, in its order, from the task's tiny
    objects (``meta["tiny"]``: category, colour, centre in source pixels): "object 1: a red cup. object 2:
    a blue shell."; an object whose box holds no tiny object's centre is "something else"."""
    from rl.agent.regions import located

    entries = []
    for k, found in enumerate(located(task, call["image"], call.get("box"), call.get("max_size")), 1):
        x0, y0, x1, y1 = found.box
        inside = [(cat, col) for cat, col, cx, cy in task.meta["tiny"] if x0 <= cx < x1 and y0 <= cy < y1]
        what = f"{article(inside[0][1])} {inside[0][1]} {inside[0][0]}" if inside else "something else"
        entries.append(f"object {k}: {what}.")
    return " ".join(entries)


def find_call(task: AgentTask) -> dict[str, Any]:
    """A ``find`` call on a detail task's asked photo for the asked thing, in the question's words: "the tiny
    towels" for a count, "the tiny towel" for a colour. After "the", "tiny" and the name are the question's
    own tokens (after a quote the tokenizer splits "tiny" into pieces), so the policy copies them."""
    m = task.meta
    c = vocab.category(m["object"])
    name = c.plural if m["ask"] == "count" else c.name
    return {"name": "find", "image": m["image"], "object": f"the tiny {name}"}


def detail_answer(ask: str, value: str, obj: str, bare: bool = False, size: str = "tiny") -> str:
    """The expert's answer to a detail question: ``ask`` "color" ("It is red." / "The tiny cup is red.")
    or "count" ("There are 2." / "There are 2 tiny cups."); ``bare``: without naming the object."""
    if ask == "color":
        return f"It is {value}." if bare else f"The {size} {obj} is {value}."
    if ask != "count":
        raise ValueError(f"ask must be 'color' or 'count', got {ask!r}")
    n = int(value)
    c = vocab.category(obj)
    what = "" if bare else f" {size} {c.name if n == 1 else c.plural}"
    return f"There {'is' if n == 1 else 'are'} {n}{what}."


CHANGE_ZOOMS = ("object", "region", "compare")
"""Where a change demonstration zooms after ``compare``: on the changed object in each photo that has it
(its padded box, which the policy would have to work out from the regions), on the first changed
region as ``compare`` lists it, in both photos (its numbers copied from the observation), or nowhere:
``compare`` itself with ``"zoom": true`` shows the changed area of both photos."""
_REGION = re.compile(r"\[(\d\.\d\d), (\d\.\d\d), (\d\.\d\d), (\d\.\d\d)\]")


def listed_regions(observation: str) -> list[list[float]]:
    """The normalised boxes a ``compare`` observation lists, in order ("1 region changed: [0.49, ...]")."""
    return [[float(v) for v in m.groups()] for m in _REGION.finditer(observation)]


def change_demo(task: AgentTask, run_tool: RunTool, zoom: str = "object") -> list[DemoTurn]:
    m = task.meta
    turns = [DemoTurn("user", task.question, False)]
    compare = {"name": "compare", "images": [1, 2]}
    _use(turns, {**compare, "zoom": True} if zoom == "compare" else compare, task, run_tool)
    if zoom == "compare":
        calls = []
    elif zoom == "region":
        regions = listed_regions(turns[-1].text)
        calls = [{"name": "zoom", "image": image, "box": regions[0]} for image in (1, 2)] if regions else []
    else:
        sides = ((1, "before_box"), (2, "after_box"))
        calls = [zoom_call(task, i, m[key]) for i, key in sides if m[key] is not None]
    for call in calls:
        _use(turns, call, task, run_tool)
    turns.append(DemoTurn("assistant", task.answer[0].upper() + task.answer[1:] + ".", True))
    return turns


CAPTION_ZOOMS = ("objects", "tray", "find")
"""Where a caption demonstration looks: a zoom on the tiny objects' padded box (anywhere on the tray, to the
pixel), or on the whole tray (one of few boxes when the world puts trays at ``detail.tray_spots``); or
``find`` for "tiny" on the whole photo (:data:`CAPTION_FIND`: each small region the namer calls tiny, cut
out; ``rl.agent.find``)."""
CAPTION_FIND = {"name": "find", "image": 1, "object": "tiny"}
"""The call of a ``find`` caption demonstration (the same for every caption)."""


def caption_demo(task: AgentTask, run_tool: RunTool, zoom: str = "objects") -> list[DemoTurn]:
    """A caption demonstration: one look at the tray (module docstring of :data:`CAPTION_ZOOMS`), then the
    reference caption; after a ``find`` whose text counts what it found (its ``labels`` option), the tray's
    groups in the order of that count (:func:`tray_in_order`), so the caption follows what the tool said."""
    turns = [DemoTurn("user", task.question, False)]
    answer = task.answer
    if zoom == "find":
        _use(turns, dict(CAPTION_FIND), task, run_tool)
        counted = re.search(r"\(([^()]*)\):$", turns[-1].text)
        if counted:
            answer = tray_in_order(answer, counted.group(1))
    else:
        box = task.meta["box"] if zoom == "objects" else tray_box(task, task.meta["tray"])
        _use(turns, zoom_call(task, 1, box), task, run_tool)
    turns.append(DemoTurn("assistant", answer, True))
    return turns


def _phrases(text: str) -> list[str]:
    """``"a cup, two forks (red and blue) and a jar"`` -> its three phrases (an "and" in brackets is kept)."""
    hidden = re.sub(r"\([^)]*\)", lambda m: m.group(0).replace(" and ", "\0"), text)
    return [p.replace("\0", " and ") for p in re.split(r", | and ", hidden)]


def _noun(phrase: str) -> str:
    return re.findall(r"[a-z]+", re.sub(r"\([^)]*\)", "", phrase).lower())[-1]


def tray_in_order(caption: str, counted: str) -> str:
    """``caption`` with its tray sentence's groups in the order of ``counted`` ("a towel, two cups and a
    fork": a ``find`` tally); groups whose thing it does not name keep their order after the others."""
    from mm.train.tasks import plural

    head, sep, tray = caption.partition(" On the tray ")
    if not sep:
        return caption
    verb, _, listed = tray.rstrip(".").partition(" ")
    order = [_noun(p) for p in _phrases(counted)]

    def rank(group: str) -> int:
        noun = _noun(group)
        same = [i for i, t in enumerate(order) if noun in (t, plural(t)) or plural(noun) == t]
        return same[0] if same else len(order)

    groups = sorted(_phrases(listed), key=rank)  # stable: unnamed groups keep their order
    return f"{head}{sep}{verb} {join_phrases(groups)}."


def slot_answer(goal: dict, slot: str, bare: bool = False) -> str:
    """The expert's reply stating one goal slot (``bare``: without naming the object)."""
    c = vocab.category(goal["object"])
    if slot == "count":
        n = goal["count"]
        what = "" if bare else f" tiny {c.name if n == 1 else c.plural}"
        return f"There {'is' if n == 1 else 'are'} {n}{what} in all."
    cols = goal["colors"]
    if len(cols) > 1 and not bare:
        return f"The tiny {c.plural} are {' and '.join(cols)}."
    return f"They are {' and '.join(cols)}."


DIALOGUE_ZOOMS = ("goal", "all", "find")
"""Which photos' trays a dialogue demonstration zooms on before answering: those that hold the goal's
objects (known from the ground truth only: the tiny objects are not legible in the downsampled view),
or every photo's; or one ``find`` over every photo for the asked thing in the user's words
(:func:`goal_find_call`, ``rl.agent.find``): its text says how many there are in all."""


def goal_find_call(task: AgentTask) -> dict[str, Any]:
    """A dialogue's ``find`` call: every photo of the note (no ``image``), for "the tiny X" with X the goal's
    plural, the user's own word ("What colours are the tiny buckets in these photos?")."""
    c = vocab.category(task.meta["goal"]["object"])
    return {"name": "find", "object": f"the tiny {c.plural}"}


def wrong_slot_answer(goal: dict, slot: str, rng: np.random.Generator, bare: bool = False) -> str:
    """A reply stating ``slot`` wrongly, as a policy that missed a photo would: a count one off (one more
    when the count is 1), or the colours with one swapped for a colour the goal's objects lack."""
    if slot == "count":
        n = goal["count"]
        wrong = n + 1 if n == 1 or rng.random() < 0.5 else n - 1
        return slot_answer({**goal, "count": wrong}, slot, bare)
    cols = list(goal["colors"])
    others = [c for c in vocab.COLORS if c not in cols]
    cols[int(rng.integers(len(cols)))] = others[int(rng.integers(len(others)))]
    return slot_answer({**goal, "colors": sorted(cols)}, slot, bare)


def dialogue_demo(
    task: AgentTask,
    run_tool: RunTool,
    seed: int = 0,
    bare: bool = False,
    zoom: str = "goal",
    recovery: bool = False,
    user: SimulatorConfig | None = None,
) -> list[DemoTurn]:
    user = user or SimulatorConfig()
    if recovery and (user.patience < 1 or user.max_turns < 3):
        raise ValueError(
            f"task {task.task_id!r}: a recovery demonstration needs a user who objects once and then hears "
            f"both slots (patience >= 1, max_turns >= 3), got patience {user.patience}, max_turns "
            f"{user.max_turns}; raise rollout.user_patience / rollout.user_max_turns or set "
            "data.dialogue_recovery=0"
        )
    sim = UserSimulator(task, seed=seed, cfg=user)
    goal = task.meta["goal"]
    turns = [DemoTurn("user", sim.opening(), False)]
    zooms = [(image, box) for image, box in task.meta["zooms"] if zoom == "all" or image in goal["images"]]
    if zoom == "find":
        if recovery:
            raise ValueError(
                f"task {task.task_id!r}: dialogue_zoom=find has no recovery demonstration; set "
                "data.dialogue_recovery=0"
            )
        _use(turns, goal_find_call(task), task, run_tool)
        zooms = []
    if recovery:
        # the mistake, kept as context out of the loss: zooms on all but the last of those photos, a
        # wrong reply, the user's objection; then the rest of the zooms and the right replies
        rng = np.random.default_rng([seed, zlib.crc32(task.task_id.encode()), 1])
        missed = zooms[-1][0]
        for image, box in zooms[:-1]:
            _use(turns, zoom_call(task, image, box), task, run_tool, learn=False)
        text = wrong_slot_answer(goal, sim.asked, rng, bare)
        turns.append(DemoTurn("assistant", text, True, learn=False))
        turns.append(DemoTurn("user", sim.reply(text).text, False))
        zooms = [(image, box) for image, box in zooms if image == missed]
    for image, box in zooms:
        _use(turns, zoom_call(task, image, box), task, run_tool)
    while not sim.done:
        text = slot_answer(goal, sim.asked, bare)
        turns.append(DemoTurn("assistant", text, True))
        turns.append(DemoTurn("user", sim.reply(text).text, False))
    return turns


def demonstration(
    task: AgentTask,
    run_tool: RunTool | None = None,
    *,
    seed: int = 0,
    detail_zoom: str = "target",
    caption_zoom: str = "objects",
    change_zoom: str = "object",
    dialogue_zoom: str = "goal",
    bare_answers: bool = False,
    detail_reasoning: bool = False,
    recovery: bool = False,
    user: SimulatorConfig | None = None,
) -> list[DemoTurn]:
    """The expert trajectory for ``task`` (module docstring); ``seed`` is the simulator's for dialogues;
    ``detail_zoom``, ``caption_zoom``, ``change_zoom``, ``dialogue_zoom``: one of :data:`DETAIL_ZOOMS`,
    :data:`CAPTION_ZOOMS`, :data:`CHANGE_ZOOMS`, :data:`DIALOGUE_ZOOMS`;
    ``bare_answers``: detail answers and dialogue replies state the value without naming the object ("It
    is red.", "There are 2 in all."), so a policy is not scored 0 for misnaming an object it was told;
    ``detail_reasoning``: a detail answer first says what is on the tray (:func:`detail_demo`);
    ``recovery``: a dialogue starts with a mistake out of the loss (:func:`dialogue_demo`); ``user``: the
    simulated user's patience and turns (the loop's, so a replayed dialogue ends as the script does)."""
    if detail_zoom not in DETAIL_ZOOMS:
        raise ValueError(f"detail_zoom must be one of {DETAIL_ZOOMS}, got {detail_zoom!r}")
    if caption_zoom not in CAPTION_ZOOMS:
        raise ValueError(f"caption_zoom must be one of {CAPTION_ZOOMS}, got {caption_zoom!r}")
    if change_zoom not in CHANGE_ZOOMS:
        raise ValueError(f"change_zoom must be one of {CHANGE_ZOOMS}, got {change_zoom!r}")
    if dialogue_zoom not in DIALOGUE_ZOOMS:
        raise ValueError(f"dialogue_zoom must be one of {DIALOGUE_ZOOMS}, got {dialogue_zoom!r}")
    run = run_tool or loop_observation
    if task.kind == "detail":
        return detail_demo(task, run, detail_zoom, bare_answers, detail_reasoning)
    if task.kind == "change":
        return change_demo(task, run, change_zoom)
    if task.kind == "caption":
        return caption_demo(task, run, caption_zoom)
    if task.kind == "dialogue":
        return dialogue_demo(task, run, seed, bare_answers, dialogue_zoom, recovery, user)
    if task.kind == "qa":
        return qa_demo(task, run)
    raise ValueError(f"task {task.task_id!r}: no demonstration for kind {task.kind!r}")


def qa_demo(task: AgentTask, run_tool: RunTool) -> list[DemoTurn]:
    """The demonstration a user's task file gives (``rl.agent.task_file``): each call of ``meta["demo"]``
    with the observation the tools give it, then ``meta["demo_answer"]``; a task without calls is answered
    at once."""
    turns = [DemoTurn("user", task.question, False)]
    for call in task.meta["demo"]:
        _use(turns, call, task, run_tool)
    return [*turns, DemoTurn("assistant", task.meta["demo_answer"], True)]


def policy_turns(turns: list[DemoTurn]) -> list[str]:
    """The assistant's turns of a demonstration, in order: what a scripted policy replays."""
    return [t.text for t in turns if t.policy]


def answer_turns(turns: list[DemoTurn]) -> list[str]:
    """The assistant's turns without tool calls: the same task answered without looking closer (a turn's
    ``plain`` text where it has one)."""
    return [t.text if t.plain is None else t.plain for t in turns if t.policy and t.call is None]


def unlearned(turns: list[DemoTurn], *, tools: bool = True) -> set[int]:
    """Indices into :func:`policy_turns` (``tools``) or :func:`answer_turns` of the turns out of the loss."""
    kept = [t for t in turns if t.policy and (tools or t.call is None)]
    return {k for k, t in enumerate(kept) if not t.learn}

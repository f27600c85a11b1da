"""The agent's tools and their registry: ``zoom``, ``compare`` (imgdiff), and user tools.

    from rl.agent.tools import register_tool

    def count_pixels(task, image, colour):          # task: the AgentTask; JSON arguments by keyword
        return f"{...} pixels"                      # a str, or an Observation with an image

    register_tool("count_pixels", count_pixels, {
        "type": "object",
        "properties": {"image": {"type": "integer", "x-image": True},
                       "colour": {"type": "string", "enum": ["red", "blue"]}},
        "required": ["image", "colour"],
    }, description="count pixels of a colour")

``rl agent`` imports the modules of its ``tool_modules`` setting before it starts
(:func:`import_tool_modules`), so a module that calls ``register_tool`` when imported puts its tools in
the policy's instructions, in the task files' demonstrations and in every rollout.

A tool is called with the task and its validated arguments (``rl.agent.schema``); it returns a text or an
:class:`Observation` (text plus an optional image the policy's processor encodes at the tower's input
size). An exception in a tool becomes an error observation; the loop goes on. Coordinates are normalised
note coordinates (``rl.agent.parse``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rl.agent.parse import ParseError, ToolCall
from rl.agent.schema import check_schema, validate_args
from rl.agent.task import AgentTask

MAX_LISTED_REGIONS = 8
"""``compare`` lists at most this many changed regions (the largest first)."""


@dataclass(frozen=True)
class Observation:
    """What a tool returns to the policy: text, and optionally images (``(h, w, 3)`` uint8 each)."""

    text: str
    image: np.ndarray | None = None
    """The image shown after the text (``zoom``'s crop)."""
    more_images: tuple[np.ndarray, ...] = ()
    """Further images shown after ``image``, in order (``compare`` with ``zoom``: the changed area of
    the second photo after the first's)."""
    labels: tuple[str, ...] = ()
    """Text shown right before each image, one per image (``tiles``: " tile 1:", ...), or none."""

    def __post_init__(self) -> None:
        if self.labels and len(self.labels) != len(self.images):
            raise ValueError(
                f"an observation with labels needs one per image: {len(self.labels)} labels, "
                f"{len(self.images)} images"
            )

    @property
    def images(self) -> tuple[np.ndarray, ...]:
        """Every image of the observation, in order."""
        return ((self.image,) if self.image is not None else ()) + tuple(self.more_images)


@dataclass(frozen=True)
class Tool:
    """A registered tool: ``fn(task, **args) -> str | Observation`` with a JSON schema of ``args``."""

    name: str
    fn: Callable[..., str | Observation]
    schema: dict[str, Any]
    description: str = ""
    check: Callable[[dict[str, Any]], ParseError | None] | None = None
    """Extra check after the schema (e.g. zoom's box order): a ParseError, or None when fine."""


class ToolRegistry:
    """Tools by name; validates calls (:meth:`validate`) and runs them (:meth:`run`)."""

    def __init__(self, tools: Iterator[Tool] | list[Tool] = ()) -> None:
        self._tools: dict[str, Tool] = {}
        for tool in tools:
            self.add(tool)

    def add(self, tool: Tool) -> None:
        if not tool.name.isidentifier():
            raise ValueError(f"tool name {tool.name!r} must be an identifier (letters, digits, _)")
        if tool.name in self._tools:
            raise ValueError(f"tool {tool.name!r} is already registered; pick another name")
        if not callable(tool.fn):
            raise TypeError(f"tool {tool.name!r}: fn must be callable, got {type(tool.fn).__name__}")
        check_schema(tool.schema, where=f"tool {tool.name!r}")
        self._tools[tool.name] = tool

    def register(
        self,
        name: str,
        fn: Callable[..., str | Observation],
        schema: dict[str, Any],
        *,
        description: str = "",
        check: Callable[[dict[str, Any]], ParseError | None] | None = None,
    ) -> Tool:
        """Add a tool (see the module docstring); returns it."""
        tool = Tool(name=name, fn=fn, schema=schema, description=description, check=check)
        self.add(tool)
        return tool

    def copy(self) -> ToolRegistry:
        return ToolRegistry(list(self._tools.values()))

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    @property
    def names(self) -> list[str]:
        return list(self._tools)

    def validate(self, name: str, args: dict[str, Any], *, n_images: int) -> ParseError | None:
        """The first problem of a call's arguments (schema, then the tool's check), or None."""
        tool = self._tools[name]
        problem = validate_args(tool.schema, args, n_images=n_images)
        if problem is None and tool.check is not None:
            return tool.check(args)
        return problem

    def run(self, call: ToolCall, task: AgentTask) -> Observation:
        """Run a validated call; a tool's exception becomes an error observation."""
        try:
            out = self._tools[call.name].fn(task, **call.args)
        except Exception as e:  # a tool's failure is the policy's observation, never the loop's crash
            return Observation(f"error: {call.name} failed: {type(e).__name__}: {e}")
        return out if isinstance(out, Observation) else Observation(str(out))

    def describe(self) -> str:
        """One line per tool for the policy's instructions: name, description, arguments."""
        lines = []
        for tool in self._tools.values():
            args = ", ".join(tool.schema.get("properties", {}))
            lines.append(f"{tool.name}({args}): {tool.description}".rstrip(": "))
        return "\n".join(lines)


# ---------------------------------------------------------------------------- zoom
ZOOM_SCHEMA = {
    "type": "object",
    "properties": {
        "image": {"type": "integer", "x-image": True, "description": "note image, from 1"},
        "box": {
            "type": "array",
            "items": {"type": "number"},
            "minItems": 4,
            "maxItems": 4,
            "description": "[x0, y0, x1, y1], normalised to [0, 1]",
        },
    },
    "required": ["image", "box"],
}


def check_box(args: dict[str, Any]) -> ParseError | None:
    """A box lies in [0, 1] and is non-empty: x0 < x1 and y0 < y1 (its length is the schema's)."""
    x0, y0, x1, y1 = args["box"]
    if not all(0.0 <= v <= 1.0 for v in args["box"]):
        return ParseError(
            "bad_box", f"box {args['box']} is out of bounds; coordinates are fractions in [0, 1]"
        )
    if not (x0 < x1 and y0 < y1):
        return ParseError(
            "bad_box", f"box {args['box']} is empty; give [x0, y0, x1, y1] with x0 < x1, y0 < y1"
        )
    return None


def box_pixels(box: list[float], width: int, height: int) -> tuple[int, int, int, int]:
    """Normalised ``[x0, y0, x1, y1]`` -> pixel slice bounds (x0, y0, x1, y1), at least 1 px each way."""
    x0, x1 = math.floor(box[0] * width), math.ceil(box[2] * width)
    y0, y1 = math.floor(box[1] * height), math.ceil(box[3] * height)
    x0, y0 = min(max(x0, 0), width - 1), min(max(y0, 0), height - 1)
    return x0, y0, max(min(x1, width), x0 + 1), max(min(y1, height), y0 + 1)


def tile_bounds(x0: int, x1: int, n: int) -> list[tuple[int, int]]:
    """``[x0, x1)`` cut into ``n`` consecutive pixel spans as even as rounding allows, none empty (a span
    repeats a pixel when the range is shorter than ``n``): the columns or rows of ``rl.agent.tiles``."""
    edges = [x0 + round(i * (x1 - x0) / n) for i in range(n + 1)]
    return [(a, max(b, a + 1)) for a, b in zip(edges, edges[1:])]


WHOLE = [0.0, 0.0, 1.0, 1.0]
"""The normalised box of a whole image: a zoom on it shows that photo again, alone."""


def zoom(task: AgentTask, image: int, box: list[float]) -> Observation:
    """Crop ``box`` of note image ``image`` from its full-resolution source."""
    src = task.sources[image - 1]  # (H, W, 3)
    H, W = src.shape[:2]
    x0, y0, x1, y1 = box_pixels(box, W, H)
    crop = np.ascontiguousarray(src[y0:y1, x0:x1])  # (h, w, 3)
    text = f"zoom of image {image} at {format_box(box)} ({x1 - x0}x{y1 - y0} px of the source):"
    return Observation(text, crop)


# ---------------------------------------------------------------------------- compare
COMPARE_SCHEMA = {
    "type": "object",
    "properties": {
        "images": {
            "type": "array",
            "items": {"type": "integer", "x-image": True},
            "minItems": 2,
            "maxItems": 2,
            "description": "the two note images to compare, e.g. [1, 2]",
        },
        "zoom": {
            "type": "boolean",
            "description": "also show the changed area of both images at full resolution",
        },
    },
    "required": ["images"],
}


def check_pair(args: dict[str, Any]) -> ParseError | None:
    a, b = args["images"]
    return (
        ParseError("bad_value", f"compare needs two different images, got {args['images']}")
        if a == b
        else None
    )


COMPARE_ZOOM_PAD = 3
"""Pixels of context around the changed area that ``compare`` with ``zoom`` shows."""


COMPARE_ASPECT_TOLERANCE = 0.01
"""Two photos of different sizes are compared when their aspect ratios differ by at most this share (one is
a resized copy of the other's view, e.g. sent through a messenger); else the call is an error."""


def same_view(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray] | str:
    """``a`` and ``b`` at one size: as they are, or the larger resized (area-averaged) to the smaller's
    size when their aspect ratios agree within ``COMPARE_ASPECT_TOLERANCE``; else why not (a message)."""
    (ha, wa), (hb, wb) = a.shape[:2], b.shape[:2]
    if (ha, wa) == (hb, wb):
        return a, b
    if abs((wa / ha) / (wb / hb) - 1) > COMPARE_ASPECT_TOLERANCE:
        return f"{wa}x{ha} vs {wb}x{hb}: other shapes, so not one view"
    import cv2

    if ha * wa > hb * wb:
        return cv2.resize(np.asarray(a), (wb, hb), interpolation=cv2.INTER_AREA), b
    return a, cv2.resize(np.asarray(b), (wa, ha), interpolation=cv2.INTER_AREA)


def compare(task: AgentTask, images: list[int], zoom: bool = False) -> str | Observation:
    """imgdiff (robust mode) on two note images: the changed regions, largest first, normalised (fractions
    of either image). Photos of one view at two sizes are compared at the smaller size (:func:`same_view`).

    ``zoom``: also the smallest square around every listed region (padded by ``COMPARE_ZOOM_PAD`` px of
    the compared size), cut from both images at their own full resolution, the first image's crop first:
    what two zoom calls on that box would show, without copying its numbers."""
    import imgdiff

    i, j = images
    src = task.sources[i - 1], task.sources[j - 1]
    pair = same_view(*src)
    if isinstance(pair, str):
        return f"error: images {i} and {j} differ in size ({pair}); compare needs two photos of one view"
    a, b = pair
    result = imgdiff.diff(a, b)
    if result.same:
        return f"no change between image {i} and image {j}"
    H, W = a.shape[:2]
    regions = sorted(result.regions, key=lambda r: -r.pixels)[:MAX_LISTED_REGIONS]
    boxes = [
        format_box([r.bbox[0] / W, r.bbox[1] / H, (r.bbox[2] + 1) / W, (r.bbox[3] + 1) / H]) for r in regions
    ]
    n = len(result.regions)
    more = f" (+{n - MAX_LISTED_REGIONS} smaller)" if n > MAX_LISTED_REGIONS else ""
    text = f"{n} region{'s' if n != 1 else ''} changed: {' '.join(boxes)}{more}"
    if not zoom:
        return text
    x0, y0, x1, y1 = changed_square([r.bbox for r in regions], W, H)  # pixel bounds, ends exclusive
    crops = [np.ascontiguousarray(s[_scaled((x0, y0, x1, y1), (W, H), s)]) for s in src]  # 2 x (h, w, 3)
    box = format_box([x0 / W, y0 / H, x1 / W, y1 / H])
    return Observation(f"{text}; image {i} then image {j} at {box}:", crops[0], (crops[1],))


def _scaled(box: tuple[int, ...], size: tuple[int, int], image: np.ndarray) -> tuple[slice, slice]:
    """Row and column slices in ``image`` of pixel ``box`` (ends exclusive) of an image of ``size`` (W, H)
    showing the same view: the box itself at that size, else scaled and rounded outwards."""
    (W, H), (h, w) = size, image.shape[:2]
    x0, y0, x1, y1 = box
    if (w, h) != (W, H):
        x0, y0 = x0 * w // W, y0 * h // H
        x1, y1 = min(-(-x1 * w // W), w), min(-(-y1 * h // H), h)
    return slice(y0, y1), slice(x0, x1)


def changed_square(bboxes: list[tuple[int, int, int, int]], width: int, height: int) -> tuple[int, ...]:
    """Pixel bounds ``(x0, y0, x1, y1)`` (ends exclusive) of the smallest square around inclusive
    ``bboxes``, padded by ``COMPARE_ZOOM_PAD``, moved (not cut) to lie in the image where it fits."""
    x0 = min(b[0] for b in bboxes) - COMPARE_ZOOM_PAD
    y0 = min(b[1] for b in bboxes) - COMPARE_ZOOM_PAD
    x1 = max(b[2] for b in bboxes) + 1 + COMPARE_ZOOM_PAD
    y1 = max(b[3] for b in bboxes) + 1 + COMPARE_ZOOM_PAD
    side = min(max(x1 - x0, y1 - y0), width, height)
    cx, cy = (x0 + x1) // 2, (y0 + y1) // 2
    x0 = min(max(cx - side // 2, 0), width - side)
    y0 = min(max(cy - side // 2, 0), height - side)
    return x0, y0, x0 + side, y0 + side


def format_box(box: list[float]) -> str:
    """``[0.12, 0.5, 0.25, 0.75]`` with two decimals (the form the policy writes back into calls)."""
    return "[" + ", ".join(f"{v:.2f}" for v in box) + "]"


def default_registry() -> ToolRegistry:
    """A fresh registry with ``zoom`` and ``compare``."""
    registry = ToolRegistry()
    registry.register(
        "zoom", zoom, ZOOM_SCHEMA, description="crop a box of an image at full resolution", check=check_box
    )
    registry.register(
        "compare",
        compare,
        COMPARE_SCHEMA,
        description="regions that changed between two images (zoom: true also shows them)",
        check=check_pair,
    )
    return registry


TOOLS = default_registry()
"""The registry the loop uses by default; :func:`register_tool` adds to it."""


def register_tool(
    name: str,
    fn: Callable[..., str | Observation],
    schema: dict[str, Any],
    *,
    description: str = "",
    check: Callable[[dict[str, Any]], ParseError | None] | None = None,
    registry: ToolRegistry | None = None,
) -> Tool:
    """Register a user tool in :data:`TOOLS` (or ``registry``); see the module docstring."""
    return (registry if registry is not None else TOOLS).register(
        name, fn, schema, description=description, check=check
    )


def import_tool_modules(names: list[str], registry: ToolRegistry | None = None) -> list[str]:
    """Import each module of ``names`` (from the current folder or ``PYTHONPATH``), whose import registers
    its tools with :func:`register_tool` (``rl agent``'s ``tool_modules``); returns the tools it added. A
    module that cannot be imported, or adds no tool on its first import, is a one-line UserError."""
    import importlib
    import os
    import sys

    from mm.errors import UserError

    registry = registry if registry is not None else TOOLS
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    added: list[str] = []
    for name in names:
        before, fresh = set(registry.names), name not in sys.modules
        try:
            importlib.import_module(name)
        except ImportError as e:
            raise UserError(
                f"tool module {name!r} cannot be imported ({e}); put it in the current folder or on "
                "PYTHONPATH"
            ) from None
        new = [t for t in registry.names if t not in before]
        if fresh and not new:
            raise UserError(
                f"tool module {name!r} registered no tool; call rl.agent.tools.register_tool(name, fn, "
                "schema) when it is imported"
            )
        added += new
    return added


def check_tool_options(options: dict[str, dict[str, Any]]) -> None:
    """Each module's ``tool_options`` (``rl agent``'s config) against the ``OPTIONS`` it declares (option
    name -> type; a module that declares none takes none): an unknown option or a value of another type is
    a one-line UserError. The modules are imported (:func:`import_tool_modules` first)."""
    import importlib

    from mm.errors import UserError

    for name, given in options.items():
        declared: dict[str, type] = getattr(importlib.import_module(name), "OPTIONS", {})
        for key, value in given.items():
            if key not in declared:
                raise UserError(
                    f"tool_options: tool module {name!r} has no option {key!r}; its options: "
                    f"{sorted(declared) or 'none'}"
                )
            if type(value) is not declared[key]:  # exact: true is not an int, 1 is not a bool
                raise UserError(
                    f"tool_options: {name!r} option {key!r} takes a {declared[key].__name__}, got {value!r}"
                )


def configure_tool_modules(names: list[str], cfg: Any) -> None:
    """Call ``configure(cfg)`` of each module of ``names`` that defines one, once the run knows the policy's
    start (``rl agent``'s config, ``policy.init`` filled in): a tool that needs a model takes it there
    (``rl.agent.find``'s namer), and a module reads its ``tool_options`` there. ``rl agent-eval`` passes an
    object with those two attributes alone (``policy.init``, ``tool_options``)."""
    import importlib

    for name in names:
        hook = getattr(importlib.import_module(name), "configure", None)
        if callable(hook):
            hook(cfg)


def prepare_tool_modules(names: Sequence[str], tasks: Sequence[Any]) -> None:
    """Call ``prepare(tasks)`` of each module of ``names`` that defines one, before rollouts of ``tasks`` (a
    stage's demonstrations, its RL tasks, an eval's held-out tasks): a tool whose calls are costly does
    their work ahead, in batches (``rl.agent.find`` names the regions of every photo). Under data parallel
    every rank calls it with the same tasks, and a module may share the work out over the ranks."""
    import importlib

    for name in names:
        hook = getattr(importlib.import_module(name), "prepare", None)
        if callable(hook):
            hook(tasks)

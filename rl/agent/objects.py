"""``objects``: the separate objects inside a box of a note image, each cut out on its own at full
resolution (a built-in tool that is off unless named in ``tool_modules``).

    rl agent --config configs/rl/agent_world.yaml --out runs/o0 \\
        --set 'tool_modules=[rl.agent.objects]' data.detail_zoom=objects

    <tool>{"name": "objects", "image": 2, "box": [0.36, 0.36, 0.66, 0.66]}</tool>
    -> "3 objects in image 2 at [0.36, 0.36, 0.66, 0.66], in reading order:" object 1: [img] ... object 3:
       [img]
    <tool>{"name": "objects", "image": 2, "max_size": 0.005}</tool>      # the whole image, small objects only

The regions are :mod:`rl.agent.regions`' (a plain region proposer, no model: connected regions that differ
from the box's median colour, not cut by its edge, in reading order, at most ``MAX_OBJECTS``). Each object
is shown as its padded square cut from the full-resolution image and encoded at the tower's input size:
an object 8 px wide in the source fills a third of the view, where a ``zoom`` of a whole tray shows it 7 px
wide in 64; each comes after its own label (" object k:").

Importing this module registers the tool in :data:`rl.agent.tools.TOOLS` (``tool_modules``); without it
every other run is unchanged.
"""

from __future__ import annotations

import numpy as np

from rl.agent.parse import ParseError
from rl.agent.regions import MAX_OBJECTS, Found, cutout_box, find_objects, located  # noqa: F401 (re-exported)
from rl.agent.task import AgentTask
from rl.agent.tools import TOOLS, WHOLE, ZOOM_SCHEMA, Observation, check_box, format_box

OBJECTS_SCHEMA = {
    "type": "object",
    "properties": {
        **ZOOM_SCHEMA["properties"],  # image, box: as zoom takes them
        "max_size": {
            "type": "number",
            "minimum": 0.0,
            "maximum": 1.0,
            "description": "largest object shown, as a share of the box's area (default: any size)",
        },
    },
    "required": ["image"],  # without a box: the whole image
}


def objects(
    task: AgentTask, image: int, box: list[float] | None = None, max_size: float | None = None
) -> str | Observation:
    """The objects inside ``box`` (default: the whole image) of note image ``image``, none larger than
    ``max_size`` of the box's area when given, each cut out at full resolution."""
    src = task.sources[image - 1]  # (H, W, 3)
    H, W = src.shape[:2]
    found = located(task, image, box, max_size)
    box = box or WHOLE
    where = f"in image {image} at {format_box(box)}"
    if not found:
        return f"no objects {where}"
    crops = []
    for f in found:
        a0, b0, a1, b1 = cutout_box(f.box, W, H)
        crops.append(np.ascontiguousarray(src[b0:b1, a0:a1]))  # (s, s, 3)
    labels = tuple(f" object {k}:" for k in range(1, len(crops) + 1))
    text = f"{len(found)} object{'s' if len(found) != 1 else ''} {where}, in reading order:"
    return Observation(text, crops[0], tuple(crops[1:]), labels)


def _check_box(args: dict) -> ParseError | None:
    return check_box(args) if "box" in args else None


def register(registry=TOOLS) -> None:
    """Add ``objects`` to ``registry`` (the loop's by default); a registry that has it is left as is."""
    if "objects" not in registry:
        registry.register(
            "objects",
            objects,
            OBJECTS_SCHEMA,
            description="cut out each separate object inside a box of an image (default: all of it), at full "
            "resolution",
            check=_check_box,
        )


register()

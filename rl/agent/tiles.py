"""``tiles``: a box of a note image cut into an n x n grid, each tile at full resolution (a built-in tool
that is off unless named in ``tool_modules``).

    rl agent --config configs/rl/agent_world.yaml --out runs/t0 \\
        --set 'tool_modules=[rl.agent.tiles]' data.detail_zoom=tiles

    <tool>{"name": "tiles", "image": 2, "box": [0.36, 0.36, 0.66, 0.66], "grid": 3}</tool>
    -> "tiles of image 2 at [0.36, 0.36, 0.66, 0.66], 3 x 3, row by row:" tile 1: [img] ... tile 9: [img]

Each tile is encoded at the tower's input size, so a tile of a third of a box is seen three times larger
than a ``zoom`` of the whole box shows it: objects a few pixels wide in the zoom become as large as the
objects the tower reads in whole photos. Every tile comes after its own label ("tile k:"), so a policy
can describe the tiles in order, each next to its label, and count in its own words (the world's detail
demonstrations with ``data.detail_zoom: tiles``, ``rl.agent.world_demos``).

Importing this module registers the tool in :data:`rl.agent.tools.TOOLS` (``tool_modules``); without it
the instructions, demonstrations and rollouts of every other run are unchanged.
"""

from __future__ import annotations

import numpy as np

from rl.agent.task import AgentTask
from rl.agent.tools import TOOLS, ZOOM_SCHEMA, Observation, box_pixels, check_box, format_box, tile_bounds

GRID_MAX = 4
"""Most tiles per side (16 tiles: each is one image of the model's context)."""

TILES_SCHEMA = {
    "type": "object",
    "properties": {
        **ZOOM_SCHEMA["properties"],  # image, box: as zoom takes them
        "grid": {"type": "integer", "minimum": 2, "maximum": GRID_MAX, "description": "tiles per side"},
    },
    "required": ["image", "box", "grid"],
}


def tiles(task: AgentTask, image: int, box: list[float], grid: int) -> Observation:
    """Crop ``box`` of note image ``image`` from its full-resolution source and cut it into ``grid`` x
    ``grid`` tiles, row by row from the top left."""
    src = task.sources[image - 1]  # (H, W, 3)
    H, W = src.shape[:2]
    x0, y0, x1, y1 = box_pixels(box, W, H)
    # clamp to the image: a span past a 1-px box edge would be empty
    cols = [(a, min(b, W)) for a, b in tile_bounds(x0, x1, grid)]
    rows = [(a, min(b, H)) for a, b in tile_bounds(y0, y1, grid)]
    crops = [np.ascontiguousarray(src[r0:r1, c0:c1]) for r0, r1 in rows for c0, c1 in cols]  # (h, w, 3) each
    labels = tuple(f" tile {k}:" for k in range(1, len(crops) + 1))
    text = f"tiles of image {image} at {format_box(box)}, {grid} x {grid}, row by row:"
    return Observation(text, crops[0], tuple(crops[1:]), labels)


def register(registry=TOOLS) -> None:
    """Add ``tiles`` to ``registry`` (the loop's by default); a registry that has it is left as is."""
    if "tiles" not in registry:
        registry.register(
            "tiles",
            tiles,
            TILES_SCHEMA,
            description="cut a box of an image into grid x grid tiles at full resolution",
            check=check_box,
        )


register()

"""The tile-reading benchmark: entry scores (golden), and a whole run's transcripts scored against the
demonstrations' own inventories (a transcript that writes the truth reads every tile right)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from tests.helpers.bench import load_benchmark


@pytest.fixture(scope="module")
def tr():
    return load_benchmark("tile_reading")


def test_entry_scores_golden(tr):
    truth = {"1": "empty", "2": "a red cup", "3": "a blue jar", "4": "empty", "5": "an orange cup"}
    said = {"1": "empty", "2": "a red jar", "3": "a blue jar", "4": "a red cup"}  # tile 5 not written
    assert tr.entry_scores(truth, said) == Counter(
        empty_tiles=2, empty_right=1, object_tiles=3, category_right=1, colour_right=2, both_right=1
    )


def test_a_transcript_of_the_truth_reads_every_tile(tr, tmp_path):
    from mm.config import load_config
    from rl.agent.config import AgentRunConfig
    from rl.agent.world_demos import tile_inventory, tray_box, zoom_call
    from rl.agent.world_tasks import WorldTaskConfig, world_tasks

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text("world: {seed: 0, detail: {tray_spots: 3}}\n")
    world = load_config(AgentRunConfig, run / "config.yaml").world
    assert world == load_config(WorldTaskConfig, None, ["seed=0", "detail.tray_spots=3"])
    blocks = []
    for k, task in enumerate(world_tasks(world, "detail", "test", 4)):
        call = {
            **zoom_call(task, task.meta["image"], tray_box(task, task.meta["tray"])),
            "name": "tiles",
            "grid": 3,
        }
        if k == 3:  # a call elsewhere: the tray is missed
            call["box"] = [0.0, 0.0, 0.1, 0.1]
        blocks.append(
            f"[task {task.task_id}] {task.question}\n[policy 1] <tool>{json.dumps(call)}</tool>\n"
            f"[policy 2] {tile_inventory(task, call)} <answer>x</answer>\n[end] answer: x"
        )
    (run / "eval/tool_sft.transcripts.md").write_text("\n\n".join(blocks) + "\n")
    c = tr.run_scores(run, "tool_sft")
    assert c["tasks"] == 4 and c["tray_missed"] == 1 and c["object_tiles"] >= 9
    assert c["category_right"] == c["colour_right"] == c["both_right"] == c["object_tiles"]
    assert c["empty_right"] == c["empty_tiles"] == 27 - c["object_tiles"]

"""``rl agent``: a tool-using policy end to end on the world's tasks, or on your own task files.

    rl agent --config configs/rl/agent_tiny.yaml --out runs/agent_tiny
    rl agent --config configs/rl/agent.yaml --out runs/agent --set eval.seeds=[0,1,2]
    rl agent --config configs/rl/agent_files.yaml --out runs/mine --set policy.init=MODEL \
        data.file=tasks/train.jsonl eval.file=tasks/test.jsonl           # rl.agent.task_file

Stages (``rl.agent.run``): policy init, tool SFT cold start, no-tool SFT baseline, multi-turn GRPO,
held-out eval, report. Re-running with the same OUT resumes: finished stages are skipped and GRPO
continues from its last checkpoint; ``--no-resume`` deletes OUT's stage folders first. Writes
OUT/config.yaml, OUT/<stage>/result.json, OUT/export/tool_grpo/ (the trained policy, a model folder),
OUT/report.md, OUT/report.json, OUT/transcripts.md,
OUT/sft.png, OUT/grpo.png and each stage's metrics.jsonl.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import yaml

from mm.config import load_config, to_dict


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML file: rl.agent.config.AgentRunConfig")
    parser.add_argument("--out", default=None, help="output folder (default runs/rl/<config name>)")
    parser.add_argument(
        "--set", dest="overrides", action="extend", nargs="+", default=[], metavar="KEY=VALUE",
        help="override config keys, e.g. --set grpo.steps=10 eval.seeds=[0,1,2] (repeatable)",
    )  # fmt: skip
    parser.add_argument("--no-resume", action="store_true", help="start over: delete OUT's stage folders")


def run(args: argparse.Namespace) -> int:
    from mm.train.devices import resolve_device
    from mm.train.metrics import atomic_write_text
    from rl.agent.config import AgentRunConfig
    from rl.agent.parallel import barrier, is_writer, join
    from rl.agent.run import STAGES, check_inputs, check_training_config, run_agent

    cfg = load_config(AgentRunConfig, args.config, list(args.overrides))
    check_inputs(cfg)  # before OUT is written: a bad task file or tool module leaves nothing behind
    join(resolve_device(cfg.policy.device, key="policy.device"))  # under torchrun: rank 0 writes
    out = Path(args.out) if args.out else Path("runs/rl") / Path(args.config).stem
    if args.no_resume and is_writer():
        for stage in STAGES:
            shutil.rmtree(out / stage, ignore_errors=True)
        (out / "training_config.json").unlink(missing_ok=True)
    barrier()
    out.mkdir(parents=True, exist_ok=True)
    check_training_config(cfg, out)  # before OUT/config.yaml is rewritten
    barrier()
    if is_writer():
        atomic_write_text(out / "config.yaml", yaml.safe_dump(to_dict(cfg), sort_keys=False))
    report = run_agent(cfg, out)
    if report is not None and is_writer():
        held = sum(bool(t["held"]) for t in report["targets"])
        targets = (
            f"{held}/{len(report['targets'])} targets held"
            if report["targets"]
            else "a task file: no targets"
        )
        print(f"[agent] report: {out / 'report.md'} ({targets})")
    return 0

"""Shared pieces of the agent tests: a tiny NoteVLM with the project's byte-level tokenizer (so tool-call
JSON encodes), agent tasks with full-resolution sources, and a scripted policy."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from rl.agent.backend import NoteVLMBackend, Sampling, Segment, Turn, cut_turn
from rl.agent.task import AgentTask
from tests.helpers.model import IMAGE_SIZE, K, tiny_config


def tiny_notevlm(seed: int = 0, max_images: int = 4):
    """A tiny random NoteVLM + NoteProcessor on the shipped tokenizer, behind the adapter."""
    import torch

    from mm.data.tokenizer import load_tokenizer
    from mm.model import NoteProcessor, NoteVLMForConditionalGeneration
    from mm.model.adapter.notevlm import NoteVLMAdapter

    tok = load_tokenizer()
    text = dict(tiny_config().text_config.to_dict())
    text.update(vocab_size=(len(tok) + 15) // 16 * 16, max_position_embeddings=1024)
    config = tiny_config(
        text_config=text, image_token_id=tok.convert_tokens_to_ids("<image>"), max_images=max_images
    )
    torch.manual_seed(seed)
    model = NoteVLMForConditionalGeneration(config).eval()
    proc = NoteProcessor(tokenizer=tok, image_size=IMAGE_SIZE, tokens_per_image=K, max_length=1024)
    return NoteVLMAdapter(model=model, processor=proc)


def note_images(n: int, size: tuple[int, int] = (48, 64), seed: int = 0) -> tuple[np.ndarray, ...]:
    """``n`` random (H, W, 3) uint8 sources."""
    rng = np.random.default_rng(seed)
    return tuple(rng.integers(0, 256, size=(*size, 3), dtype=np.uint8) for _ in range(n))


def change_pair(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A flat grey photo and the same photo with two coloured squares added."""
    a = np.full((40, 80, 3), 128, dtype=np.uint8)
    b = a.copy()
    b[4:12, 8:16] = (255, 0, 0)
    b[20:36, 60:76] = (0, 0, 255)
    return a, b


def task(n_images: int = 2, kind: str = "detail", task_id: str = "t0") -> AgentTask:
    return AgentTask(
        task_id=task_id,
        kind=kind,
        sources=note_images(n_images),
        question="what colour is the cup",
        answer="red",
    )


class ScriptedBackend(NoteVLMBackend):
    """NoteVLM encoding with a scripted policy. ``script[question]`` lists the turns of the task whose
    question it is; the turn index is the number of observations so far (a policy only continues after
    one). A turn's text is tokenised as it stands, eos appended unless it ends a tool call, and cut to
    the turn budget as a generated turn is. ``calls`` records the rows of every generate call."""

    def __init__(self, adapter, script: dict[str, Sequence[str]]) -> None:
        super().__init__(adapter)
        self.script = script
        self.calls: list[int] = []

    def generate(self, rows: Sequence[Segment], *, max_new_tokens: int, sampling: Sampling) -> list[Turn]:
        self.calls.append(len(rows))
        turns = []
        for row in rows:
            ids = script_turn(self, self.script, row.ids)
            ids, stop = cut_turn(ids[:max_new_tokens], self.eos_token_ids, self.decode)
            turns.append(Turn(ids, [0.0] * len(ids), stop, self.decode(ids)))
        return turns


def script_turn(backend, script: dict[str, Sequence[str]], prefix_ids: Sequence[int]) -> list[int]:
    """The ids of the next scripted turn for a trajectory whose ids so far are ``prefix_ids``."""
    text = backend.decode(prefix_ids)
    question = next(q for q in script if q in text)
    lines = script[question]
    line = lines[min(text.count("<obs>"), len(lines) - 1)]
    return backend.text_ids(line) + ([] if line.endswith("</tool>") else [backend.eos_token_ids[0]])


class ForceScript:
    """A logits processor that makes the real model emit the scripted turns (raw logits, and so the
    recorded log-probs, are the model's own)."""

    def __init__(self, backend, script: dict[str, Sequence[str]], prompt_length: int) -> None:
        self.backend, self.script, self.P = backend, script, prompt_length
        self.turns: dict[int, list[int]] = {}

    def __call__(self, input_ids, scores):
        t = input_ids.shape[1] - self.P
        scores = scores.clone()  # generate keeps the raw logits it passed in: never edit them in place
        for b in range(input_ids.shape[0]):
            if b not in self.turns:
                row = [i for i in input_ids[b, : self.P].tolist() if i != self.backend.adapter.pad_token_id]
                self.turns[b] = script_turn(self.backend, self.script, row)
            ids = self.turns[b]
            target = ids[t] if t < len(ids) else self.backend.eos_token_ids[0]
            keep = scores[b, target].clone()
            scores[b] = float("-inf")
            scores[b, target] = keep
        return scores


def forced(backend_cls, adapter, script: dict[str, Sequence[str]]):
    """A real backend of ``backend_cls`` whose model is forced to follow ``script``."""
    from transformers import LogitsProcessorList

    class Forced(backend_cls):
        def generate_kwargs(self, prompt_length):
            return {"logits_processor": LogitsProcessorList([ForceScript(self, script, prompt_length)])}

    return Forced(adapter)


def run_tool_module(tmp_path, config, sets: Sequence[str]):
    """A two-step ``rl agent`` run of ``config`` with ``sets`` (a tool module's demonstrations), checked to
    evaluate every kind; returns its config and its tool demonstrations' detail trajectories."""
    import json

    from mm.config import load_config
    from rl.agent.config import AgentRunConfig
    from rl.agent.stages import build_backend, demo_trajectories, train_tasks
    from rl.cli import main

    out = tmp_path / "run"
    short = ["data.train_tasks=4", "sft.steps=2", "grpo.steps=1", "eval.n_boot=20"]
    assert main(["agent", "--config", str(config), "--out", str(out), "--set", *short, *sets]) == 0
    rows = [json.loads(x) for x in (out / "eval/tool_sft.jsonl").read_text().splitlines()]
    assert {r["kind"] for r in rows} == {"caption", "change", "detail", "dialogue"}
    cfg = load_config(AgentRunConfig, out / "config.yaml")
    trajs = demo_trajectories(build_backend(cfg), cfg, train_tasks(cfg), tools=True)
    return cfg, [t for t in trajs if t.task.kind == "detail"]


def tool_module(monkeypatch, name: str):
    """A fixture's body: tool module ``name`` imported afresh (registering its tools) into a copy of the
    loop's registry; the registry is restored and the module forgotten at the test's end."""
    import importlib
    import sys

    from rl.agent.tools import TOOLS

    monkeypatch.setattr(TOOLS, "_tools", dict(TOOLS._tools))
    sys.modules.pop(name, None)
    yield importlib.import_module(name)
    sys.modules.pop(name, None)


def tray_detail_tasks(n: int) -> list[AgentTask]:
    """The first ``n`` train detail tasks of world 0 with trays at 3 x 3 spots (``agent_world.yaml``)."""
    from mm.config import load_config
    from rl.agent.world_tasks import WorldTaskConfig, world_tasks

    cfg = load_config(WorldTaskConfig, None, ["seed=0", "detail.tray_spots=3"])
    return list(world_tasks(cfg, "detail", "train", n))


def recorded_before(cfg, out, section: str) -> None:
    """``out``'s ``training_config.json`` for ``cfg`` as a run from before the config had ``section`` wrote
    it (the section left out)."""
    import json

    from rl.agent.run import check_training_config

    check_training_config(cfg, out)
    path = out / "training_config.json"
    older = json.loads(path.read_text())
    del older[section]
    path.write_text(json.dumps(older))


class Push:
    """A logits processor that adds a large bias to the script's next token (others keep their logits, so a
    constraint after it still has a choice)."""

    def __init__(self, backend, text: str, prompt_length: int) -> None:
        self.ids, self.P = backend.text_ids(text), prompt_length

    def __call__(self, input_ids, scores):
        t = input_ids.shape[1] - self.P
        scores = scores.clone()
        if t < len(self.ids):
            scores[:, self.ids[t]] += 100.0
        return scores


def pushed_notevlm(text: str) -> NoteVLMBackend:
    """A tiny NoteVLM backend whose every turn is pushed towards ``text`` (:class:`Push`)."""
    from transformers import LogitsProcessorList

    class Pushed(NoteVLMBackend):
        def generate_kwargs(self, prompt_length):
            return {"logits_processor": LogitsProcessorList([Push(self, text, prompt_length)])}

    return Pushed(tiny_notevlm())


def painted_namer(find_module, named: list | None = None):
    """A ``find_module.ModelNamer`` (``find_module``: the fixture's fresh ``rl.agent.find``) whose model is a
    stand-in: it names a cut-out "It is a tiny <r> <g> <b> thing." by its brightest pixel, and appends each
    ``generate`` batch's size to ``named``; cache and batching are the real ones."""
    from types import SimpleNamespace

    class Backend:
        def prompt(self, images, text):
            return images[0]

        def generate(self, rows, **kw):
            if named is not None:
                named.append(len(rows))
            said = []
            for im in rows:
                r, g, b = im.reshape(-1, 3)[im.reshape(-1, 3).astype(int).sum(axis=1).argmax()]
                said.append(SimpleNamespace(text=f"It is a tiny {r} {g} {b} thing."))
            return said

    class Painted(find_module.ModelNamer):
        def _loaded(self):
            return Backend()

    return Painted("no model", batch_size=4)

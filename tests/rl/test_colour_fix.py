"""Colour-correction pairs: the colour cut (golden), the three judges (scene truth, the policy's own
confidence equal to a manual forward, a labeler), the pairs, and their config checks."""

from __future__ import annotations

import pytest
import torch

from mm.data.format import Note, ObjectAnnotation, read_notes
from rl.pairs import (
    colour_correction_pairs,
    labeler_colour_judge,
    scene_colour_judge,
    self_colour_judge,
    strip_colours,
)
from rl.pairs.colour_fix import _colour_spans
from tests.helpers.eval_model import make_data_dir, make_model_dir

CAPTION = (
    "Three photos. In the first photo, a large blue automobile, an orange bike in the middle and a "
    "helmet (white). In the second photo, two bikes (red, green and white) and an umbrella (cyan)."
)


def _spans(caption: str, *words: str) -> list[tuple[int, int]]:
    """The colour-claim spans of ``caption`` whose text is one of ``words``, in order."""
    return [(s, e) for s, e, _, c in _colour_spans(caption, "world").values() if c in words]


@pytest.mark.parametrize(
    "cut, want",
    [
        (("blue",), "a large automobile, an orange bike"),
        (("orange",), "a large blue automobile, a bike in the middle"),  # the article follows the word
        (("white",), "and a helmet. In the second photo, two bikes (red and green) and"),  # both brackets
        (("red", "green"), "two bikes (white) and an umbrella (cyan)."),
        (("cyan",), "and an umbrella."),
    ],
)
def test_strip_colours_golden(cut, want):
    out = strip_colours(CAPTION, _spans(CAPTION, *cut))
    assert want in out
    assert {c for *_, c in _colour_spans(out, "world").values()}.isdisjoint(cut)
    kept = [c for *_, c in _colour_spans(CAPTION, "world").values() if c not in cut]
    assert [c for *_, c in _colour_spans(out, "world").values()] == kept  # every other colour stays


def test_strip_colours_edges():
    assert strip_colours("An orange crab.", _spans("An orange crab.", "orange")) == "A crab."
    every = strip_colours(CAPTION, [v[:2] for v in _colour_spans(CAPTION, "world").values()])
    assert every == (
        "Three photos. In the first photo, a large automobile, a bike in the middle and a helmet. "
        "In the second photo, two bikes and an umbrella."
    )
    assert strip_colours(CAPTION, []) == CAPTION
    with pytest.raises(ValueError, match="not inside"):
        strip_colours("a red cup", [(6, 40)])


def _coloured_note() -> Note:
    objs = [
        [ObjectAnnotation(category="cup", bbox=(0, 0, 4, 4), color="red")],
        [ObjectAnnotation(category="fork", bbox=(0, 0, 4, 4), color="blue")],
    ]
    return Note(id="c0", images=["a.png", "b.png"], text="", split="train", objects=objs)


def test_scene_judge_cuts_exactly_the_wrong_colours():
    cap = "In the first photo, a red cup and a green cup. In the second photo, a fork (blue and red)."
    got = scene_colour_judge()(_coloured_note(), cap)
    assert [cap[s:e] for s, e in got] == ["green", "red"]
    assert got[1][0] == cap.index("red)")  # the bracket's "red" (no red fork), not the cup's
    assert strip_colours(cap, got) == (
        "In the first photo, a red cup and a cup. In the second photo, a fork (blue)."
    )


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from mm.eval.runners import load_model

    root = tmp_path_factory.mktemp("colourfix")
    model_dir, data = make_model_dir(root), make_data_dir(root, split="train")
    model, processor = load_model(model_dir, device="cpu")
    return model, processor, data


def _manual_colour_probs(model, processor, images, prompt, caption):
    """P(first token of each colour word) by one plain forward over prompt + caption."""
    s = processor.encode(images, prompt, caption)
    batch = processor.collate([s])
    labels = batch.pop("labels")[0]
    with torch.no_grad():
        probs = model(**batch).logits[0].softmax(-1)
    tok = processor.tokenizer
    out = {}
    for t in range(1, len(labels)):
        if labels[t] >= 0 and tok.decode([int(labels[t])]) in ("red", "blue"):
            out[tok.decode([int(labels[t])])] = probs[t - 1, labels[t]].item()
    return out


def test_self_judge_reads_the_policy_probability_of_each_colour(tiny):
    from mm.data.images import open_rgb
    from mm.eval.generate import note_images

    model, processor, data = tiny
    note = read_notes(data)[0]
    cap = "a red cup a blue fork"  # the tiny model's word vocabulary
    images = [open_rgb(p) for p in note_images(note, data)]
    p = _manual_colour_probs(model, processor, images, "describe", cap)
    assert set(p) == {"red", "blue"} and p["red"] != p["blue"]
    lo, hi = sorted(p.values())
    words = lambda spans: [cap[s:e] for s, e in spans]  # noqa: E731
    judge = lambda t: self_colour_judge(model, processor, data, prompt="describe", threshold=t)  # noqa: E731
    assert words(judge(lo / 2)(note, cap)) == []
    assert words(judge((lo + hi) / 2)(note, cap)) == [min(p, key=p.get)]  # only the less sure colour
    assert words(judge(min(1.0, hi * 1.5) if hi < 0.66 else 0.999)(note, cap)) == ["red", "blue"]
    assert judge(0.999)(note, "a red <unk> cup") == []  # not spelled back by the tokenizer: no cut


class _Labeler:
    """Says yes (P = 0.9) to a red cup only."""

    asked: list[str] = []

    def verify_objects(self, images, objects):
        self.asked.extend(objects)
        return {o: 0.9 if o == "red cup" else 0.1 for o in objects}


def test_labeler_judge_cuts_what_the_labeler_doubts(tiny):
    _, _, data = tiny
    note = read_notes(data)[0]
    lab = _Labeler()
    cap = "It shows a red cup and a blue fork."
    got = labeler_colour_judge(lab, data, threshold=0.5)(note, cap)
    assert [cap[s:e] for s, e in got] == ["blue"] and sorted(lab.asked) == ["blue fork", "red cup"]
    assert labeler_colour_judge(lab, data, threshold=0.95)(note, cap) == _spans(cap, "red", "blue")


def test_pairs_differ_only_at_the_cut_colours(tiny, monkeypatch):
    import mm.eval.generate as gen

    model, processor, data = tiny
    notes = read_notes(data)
    caps = ["It shows a red cup and a blue fork.", "It shows a dog."]
    monkeypatch.setattr(gen, "generate_captions", lambda *a, **k: caps)
    judge = lambda note, cap: _spans(cap, "blue")  # noqa: E731
    pairs = colour_correction_pairs(model, processor, notes, data, prompt="describe", judge=judge)
    assert len(pairs) == 1  # the second caption states no colour to cut
    assert pairs[0].kind == "colourfix" and pairs[0].rejected == caps[0]
    assert pairs[0].chosen == "It shows a red cup and a fork." and pairs[0].meta["removed"] == ["blue"]
    assert pairs[0].objects == sorted(notes[0].categories)
    both = colour_correction_pairs(
        model, processor, notes, data, prompt="describe", judge=judge, keep_pairs=True, with_objects=False
    )
    assert [(p.chosen, p.rejected) for p in both] == [
        ("It shows a red cup and a fork.", caps[0]),
        ("It shows a red cup and a fork.", "It shows a cup and a fork."),  # the sure colour is asked for
    ]
    assert all(p.objects == [] for p in both)


def test_config_checks():
    from rl.trainers.dpo_config import DataConfig

    ok = DataConfig(build="none", colour_corrections=True, notes=10)
    assert ok.colour_judge == "self"
    with pytest.raises(ValueError, match="build none"):
        DataConfig(build="none")
    with pytest.raises(ValueError, match="set data.notes"):
        DataConfig(build="none", colour_corrections=True)
    with pytest.raises(ValueError, match="colour_judge"):
        DataConfig(build="none", colour_corrections=True, notes=10, colour_judge="oracle")
    with pytest.raises(ValueError, match="colour_threshold"):
        DataConfig(build="none", colour_corrections=True, notes=10, colour_threshold=1.0)
    with pytest.raises(ValueError, match="needs data.labeler"):
        DataConfig(build="none", colour_corrections=True, notes=10, colour_judge="labeler")
    with pytest.raises(ValueError, match="ground_truth"):
        DataConfig(build="none", colour_corrections=True, notes=10, colour_judge="scene", ground_truth=False)

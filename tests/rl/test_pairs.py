"""Preference pairs: injection properties, on-policy ranking, corrupt pairs, logps, JSONL I/O, `rl pairs`."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from mm.data.format import Note, ObjectAnnotation, read_notes  # noqa: E402
from mm.world import text as wtext  # noqa: E402
from mm.world import vocab  # noqa: E402
from rl.pairs import (  # noqa: E402
    PreferencePair,
    add_logps,
    choose_injected,
    correction_pairs,
    corrupt_pairs,
    injection_pairs,
    onpolicy_pairs,
    pair_images,
    policy_logps,
    question_pairs,
    rank_pair,
    read_pairs,
    strip_objects,
    write_pairs,
)
from rl.rewards import score, vocabulary  # noqa: E402
from tests.helpers.eval_model import make_data_dir, make_model_dir  # noqa: E402


def _world_notes(n: int, seed: int = 0) -> list[Note]:
    rng = np.random.default_rng(seed)
    notes = []
    for i in range(n):
        theme = vocab.THEMES[i % len(vocab.THEMES)]
        pool = list(vocab.categories_of_theme(theme))
        k_img = int(rng.integers(1, 3))
        objs = []
        for _ in range(k_img):
            cats = rng.choice(pool, size=int(rng.integers(1, 4)), replace=False)
            objs.append(
                [
                    ObjectAnnotation(category=str(c), bbox=(0, 0, 8, 8), color="red", size="small")
                    for c in cats
                ]
            )
        text = wtext.note_caption(theme, objs, size=64, rng=rng, synonym_prob=0.3)
        notes.append(
            Note(id=f"w{i}", images=[f"images/w{i}_{k}.png" for k in range(k_img)], text=text, objects=objs)
        )
    return notes


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    return make_model_dir(root), make_data_dir(root, split="train")


@pytest.fixture(scope="module")
def loaded(dirs):
    from mm.eval.runners import load_model

    return load_model(dirs[0], device="cpu")


# ---- injection ---------------------------------------------------------------------------------
def test_injected_object_is_absent_mentioned_and_lowers_the_reward():
    notes = _world_notes(60)
    pairs = injection_pairs(notes, prompt="Describe the note.", seed=1)
    assert len(pairs) >= 55
    v = vocabulary("world")
    by_id = {n.id: n for n in notes}
    modes = set()
    for p in pairs:
        present = by_id[p.note_id].categories
        inj = p.meta["injected"]
        assert inj not in present
        assert inj in {c for _, c in v.mentions(p.rejected)}
        assert inj not in {c for _, c in v.mentions(p.chosen)}
        assert p.chosen == by_id[p.note_id].text
        assert p.chosen_reward > p.rejected_reward
        assert p.rejected_reward == score(p.rejected, sorted(present)).total
        for name in vocab.CATEGORY_NAMES:  # articles stay right
            assert f" a {name}" not in p.rejected or name[0] not in "aeiou"
        modes.add(p.meta["mode"])
    assert modes == {"add", "swap"}


def test_partners_are_preferred():
    rng = np.random.default_rng(0)
    picks = [choose_injected({"fork", "cup"}, rng)[0] for _ in range(50)]
    assert set(picks) == {"knife", "saucer"}
    picks = [choose_injected({"fork", "knife"}, rng)[0] for _ in range(50)]  # no absent partner left
    assert "fork" not in picks and "knife" not in picks and len(set(picks)) > 5
    never = [choose_injected({"fork", "cup"}, rng, partner_prob=0.0)[1] for _ in range(30)]
    assert never == [None] * 30
    notes = _world_notes(60, seed=2)
    pairs = injection_pairs(notes, prompt="p", seed=0)
    with_partner = [p for p in pairs if any(q not in p.objects for c in p.objects for q in vocab.partners(c))]
    assert with_partner and all(p.meta["partner_of"] in p.objects for p in with_partner)
    assert all(p.meta["injected"] in vocab.partners(p.meta["partner_of"]) for p in with_partner)


def test_injection_swap_golden():
    note = Note(
        id="g",
        images=["a.png"],
        text="A photo from a kitchen. It shows a fork and an umbrella.",
        objects=[[ObjectAnnotation(category=c, bbox=(0, 0, 1, 1)) for c in ("fork", "umbrella")]],
    )
    (p,) = injection_pairs([note], prompt="p", seed=0, swap_prob=1.0)
    assert p.meta == {"injected": "knife", "mode": "swap", "replaced": "fork", "partner_of": "fork"}
    noun = p.rejected.split("It shows a ")[1].split(" and")[0]
    assert noun in ("knife", "table knife", "blade")
    (q,) = injection_pairs([note], prompt="p", seed=0, swap_prob=0.0)
    assert q.rejected.startswith("A photo from a kitchen. It shows a fork and an umbrella. ")
    assert q.meta["mode"] == "add"


# ---- ranking and on-policy ---------------------------------------------------------------------
def test_question_pairs_are_pope_style_and_balanced():
    notes = _world_notes(30)
    pairs = question_pairs(notes, per_image=1, seed=0)
    by_image = {}
    for pr in pairs:
        assert pr.kind == "question" and len(pr.images) == 1
        assert {pr.chosen, pr.rejected} == {"yes", "no"}
        note = next(n for n in notes if n.id == pr.note_id)
        k = note.images.index(pr.images[0])
        present = {a.category for a in note.objects[k]}
        obj = pr.meta["object"]
        assert pr.prompt == f"Is there {'an' if obj[0] in 'aeiou' else 'a'} {obj} in this note?"
        assert (pr.chosen == "yes") == (obj in present), pr  # the label is the truth about THAT image
        by_image.setdefault(pr.images[0], []).append(pr.chosen)
    assert all(sorted(v) == ["no", "yes"] for v in by_image.values())  # one yes + one no per image
    assert len(by_image) == sum(len(n.images) for n in notes)
    # adversarial negatives co-occur with the image's objects more than random ones (POPE's rule)
    from mm.eval.pope import cooccurrence, objects_from_notes

    _, co = cooccurrence(objects_from_notes(notes))

    def mean_co(prs):
        negs = [pr for pr in prs if pr.chosen == "no"]
        return sum(sum(co[(c, pr.meta["object"])] for c in pr.objects) for pr in negs) / len(negs)

    assert mean_co(pairs) > 1.5 * mean_co(question_pairs(notes, split="random", seed=0))
    assert len(question_pairs(notes, per_image=2, seed=0)) > len(pairs)
    with pytest.raises(ValueError, match="per_image"):
        question_pairs(notes, per_image=0)
    styled = question_pairs(notes, per_image=1, seed=0, answer_style="object")  # same pairs, object first
    assert [(p.prompt, p.meta["label"]) for p in styled] == [(p.prompt, p.meta["label"]) for p in pairs]
    for p, o in zip(styled, pairs):
        obj = p.meta["object"]
        art = "An" if obj[0] in "aeiou" else "A"
        assert (p.chosen, p.rejected) == (f"{art} {obj}: {o.chosen}", f"{art} {obj}: {o.rejected}")
    back = PreferencePair.from_json(pairs[0].to_json())
    assert back == pairs[0]


@pytest.mark.parametrize(
    ("caption", "drop", "want"),
    [
        (
            "Two photos from a bathroom. In the first photo, a yellow toothbrush, a yellow toothpaste and a "
            "yellow soap. In the second photo, a white towel.",
            {"soap", "towel"},
            "Two photos from a bathroom. In the first photo, a yellow toothbrush and a yellow toothpaste.",
        ),
        (
            "A photo from the beach. It shows a cyan bucket, a cyan spade and a cyan shell.",
            {"bucket"},
            "A photo from the beach. It shows a cyan spade and a cyan shell.",
        ),
        (  # "and" inside parentheses is not a list separator; synonyms and plurals count
            "It shows a cyan bucket, two spades (blue and red) and a small cyan seashell on the left.",
            {"shell"},
            "It shows a cyan bucket and two spades (blue and red).",
        ),
        ("A red fork and a knife.", {"fork"}, "A knife."),
        ("There is a red fork. Here: a cup.", {"cup"}, "There is a red fork."),
        ("There is a red fork.", {"cup"}, None),
    ],
)
def test_strip_objects_golden(caption, drop, want):
    assert strip_objects(caption, drop) == want


def subs_order(names):
    from mm.world.text import CATEGORY_INDEX

    return sorted(names, key=CATEGORY_INDEX.__getitem__)


def test_correction_pairs_cut_exactly_the_hallucinations(dirs, loaded, monkeypatch):
    import mm.eval.generate as gen

    model, processor = loaded
    notes = [n for n in read_notes(dirs[1]) if n.categories]
    notes = [notes[0], notes[0], notes[-1]]
    absent = [c for c in vocab.CATEGORY_NAMES if c not in notes[0].categories][:2]
    present = sorted(notes[0].categories)
    captions = [
        f"A photo. It shows a red {present[0]}, a blue {absent[0]} and a green {absent[1]}.",
        "A photo. It shows nothing.",  # no hallucination -> no pair
        f"A photo. It shows a {sorted(notes[2].categories)[0]}.",
    ]
    monkeypatch.setattr(gen, "generate_captions", lambda *a, **k: captions)
    cut = correction_pairs(model, processor, notes, dirs[1], prompt="Describe the note.", substitute=False)
    assert [p.note_id for p in cut] == [notes[0].id]
    pr = cut[0]
    assert pr.kind == "correction" and pr.rejected == captions[0]
    assert pr.chosen == f"A photo. It shows a red {present[0]}."
    assert set(pr.meta["removed"]) == set(absent)
    assert pr.chosen_reward > pr.rejected_reward
    # default: each hallucinated item is replaced by an object the caption missed, in world order; a
    # caption with more hallucinations than missed objects gives no pair (it would list fewer objects)
    note = max(notes, key=lambda n: len(n.categories))
    have = sorted(note.categories)
    assert len(have) >= 2, "the fixture needs a note with two categories"
    miss = [c for c in vocab.CATEGORY_NAMES if c not in have]
    caps = [
        f"A photo. It shows a red {have[0]} and a blue {miss[0]}.",
        f"It shows a {' and a '.join(miss[:9])}.",
    ]
    monkeypatch.setattr(gen, "generate_captions", lambda *a, **k: caps)
    got = correction_pairs(model, processor, [note, note], dirs[1], prompt="Describe the note.")
    assert len(got) == 1
    pr = got[0]
    w = vocabulary("world")
    subs = pr.meta["substitutes"]
    assert [{c for _, c in w.mentions(x)} for x in subs] == [{c} for c in subs_order(have[1:])]
    assert pr.chosen == f"A photo. It shows a red {have[0]} and {subs[0]}."
    assert pr.chosen_reward > pr.rejected_reward


def test_rank_pair():
    assert rank_pair(["a", "b", "c"], [0.5, 1.0, -1.0]) == (1, 2)
    assert rank_pair(["a", "b", "c"], [1.0, 1.0, 0.0]) == (0, 2)  # first of equals
    assert rank_pair(["a", "b"], [0.25, 0.25]) is None  # ties are skipped
    with pytest.raises(ValueError):
        rank_pair(["a"], [1.0])


def test_onpolicy_pairs_rank_by_reward_and_keep_ids(dirs, loaded):
    model, proc = loaded
    notes = read_notes(dirs[1])
    pairs = onpolicy_pairs(
        model, proc, notes, dirs[1], prompt="describe", num_samples=6, max_new_tokens=8, seed=0
    )
    assert pairs, "random tiny model should produce untied samples"
    for p in pairs:
        assert p.chosen_reward > p.rejected_reward
        assert p.chosen_reward == max(p.meta["rewards"]) and p.rejected_reward == min(p.meta["rewards"])
        assert p.chosen_ids and p.rejected_ids and len(p.chosen_ids) <= 8
        assert proc.tokenizer.decode(p.chosen_ids, skip_special_tokens=True).strip() == p.chosen
    again = onpolicy_pairs(
        model, proc, notes, dirs[1], prompt="describe", num_samples=6, max_new_tokens=8, seed=0
    )
    assert [p.to_json() for p in again] == [p.to_json() for p in pairs]  # seeded


# ---- log-probs ---------------------------------------------------------------------------------
def test_policy_logps_text_equals_raw_ids_and_manual(dirs, loaded):
    model, proc = loaded
    img = [str(Path(dirs[1]) / "images/n0_0.png")]
    text = "a fork and a cup"
    ids = proc.tokenizer(text, add_special_tokens=False)["input_ids"] + [proc.tokenizer.eos_token_id]
    a, b = policy_logps(model, proc, [img, img], ["describe", "describe"], [text, ids])
    assert a == pytest.approx(b, abs=1e-6)
    # manual: mean over the response tokens of log softmax at the previous position
    s = proc.collate([proc.encode(img, "describe", text)])
    with torch.no_grad():
        logits = model(**{k: v for k, v in s.items() if k != "labels"}).logits[0].double()  # (T, V)
    lp = torch.log_softmax(logits, -1)
    n = len(ids)
    T = s["input_ids"].shape[1]
    manual = sum(float(lp[t - 1, s["input_ids"][0, t]]) for t in range(T - n, T)) / n
    assert a == pytest.approx(manual, abs=1e-5)
    # batching does not change the numbers
    c = policy_logps(
        model, proc, [img, img, img], ["describe", "describe", "a"], [text, ids, "cup"], batch_size=1
    )
    assert c[:2] == pytest.approx([a, b], abs=1e-5)


def test_corrupt_pairs_differ_in_images_and_record_logps(dirs, loaded):
    model, proc = loaded
    notes = read_notes(dirs[1])
    pairs = corrupt_pairs(notes, prompt="describe", corruption="noise", seed=0)
    assert [p.kind for p in pairs] == ["corrupt", "corrupt"] and all(p.chosen == p.rejected for p in pairs)
    p = pairs[1]
    clean = pair_images(p, dirs[1])
    bad = pair_images(p, dirs[1], rejected=True)
    assert len(clean) == len(bad) == 2
    from rl.pairs import load_pixels

    assert all((load_pixels(c) - b).abs().mean() > 0.05 for c, b in zip(clean, bad))
    assert torch.equal(torch.stack(bad), torch.stack(pair_images(p, dirs[1], rejected=True)))  # seeded
    add_logps(model, proc, pairs, dirs[1])
    for q in pairs:
        assert math.isfinite(q.chosen_logp) and math.isfinite(q.rejected_logp)
        assert q.chosen_logp != q.rejected_logp  # same text, different images


def test_injection_logps_recorded(dirs, loaded):
    model, proc = loaded
    pairs = injection_pairs(read_notes(dirs[1]), prompt="describe", seed=0)
    add_logps(model, proc, pairs, dirs[1])
    assert pairs and all(p.chosen_logp < 0 and p.rejected_logp < 0 for p in pairs)


# ---- I/O and CLI -------------------------------------------------------------------------------
def test_jsonl_round_trip_and_errors(tmp_path):
    pairs = injection_pairs(_world_notes(5), prompt="p", seed=0)
    pairs[0].chosen_logp, pairs[0].rejected_logp = -1.5, -2.0
    path = write_pairs(pairs, tmp_path / "p.jsonl")
    back = read_pairs(path)
    assert [p.to_json() for p in back] == [p.to_json() for p in pairs]
    lines = path.read_text().splitlines()
    bad = json.loads(lines[1])
    bad["extra"] = 1
    (tmp_path / "bad.jsonl").write_text(lines[0] + "\n" + json.dumps(bad) + "\n")
    from mm.errors import UserError

    with pytest.raises(UserError, match=r"bad.jsonl:2: unknown key"):
        read_pairs(tmp_path / "bad.jsonl")
    (tmp_path / "bad2.jsonl").write_text("{not json\n")
    with pytest.raises(UserError, match=r"bad2.jsonl:1"):
        read_pairs(tmp_path / "bad2.jsonl")
    with pytest.raises(ValueError, match="corruption spec"):
        PreferencePair(
            id="x", kind="corrupt", note_id="n", images=["a"], prompt="p", chosen="c", rejected="c"
        )


@pytest.mark.parametrize("kind", ["injection", "onpolicy", "corrupt"])
def test_cli_writes_pairs(dirs, tmp_path, kind, capsys):
    from rl.cli import main

    out = tmp_path / "pairs.jsonl"
    argv = ["pairs", "--model", str(dirs[0]), "--data", str(dirs[1]), "--kind", kind, "--out", str(out)]
    assert main([*argv, "--max-new-tokens", "6", "--samples", "6"]) == 0
    pairs = read_pairs(out)
    assert pairs and all(p.kind == kind for p in pairs)
    assert all(math.isfinite(p.chosen_logp) and math.isfinite(p.rejected_logp) for p in pairs)
    assert f"{kind} pairs" in capsys.readouterr().out


def test_cli_bad_inputs(dirs, tmp_path, capsys):
    from rl.cli import main

    out = tmp_path / "p.jsonl"
    base = ["pairs", "--model", str(dirs[0]), "--data", str(dirs[1]), "--out", str(out)]
    assert main([*base, "--kind", "injection", "--split", "test"]) == 2
    assert "no 'test' notes" in capsys.readouterr().err
    assert main([*base, "--kind", "onpolicy", "--samples", "1"]) == 2
    assert "--samples >= 2" in capsys.readouterr().err
    assert main([*base[:-1], str(tmp_path / "nope" / "p.jsonl"), "--kind", "corrupt"]) == 2
    assert not out.exists()


def test_package_exports_every_builder_name_from_its_module():
    import importlib
    import inspect

    import rl.pairs

    for module, names in rl.pairs._EXPORTS.items():
        mod = importlib.import_module(module)
        defined = {
            n
            for n, v in vars(mod).items()
            if not n.startswith("_")
            and (inspect.isfunction(v) or inspect.isclass(v))
            and v.__module__ == module
        }
        assert defined <= set(names), f"{module} defines {sorted(defined - set(names))}, not re-exported"
        for name in names:
            assert getattr(rl.pairs, name) is getattr(mod, name)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        rl.pairs.nope  # noqa: B018

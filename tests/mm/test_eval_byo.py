"""`mm eval pope|chair --model DIR` on a user's files, for tiny LLaVA, Qwen2-VL, Idefics3 and a NoteVLM.

Each family answers POPE questions and captions images named by an objects file; the answers / captions
written by ``--answers-out`` / ``--captions-out`` score to the same numbers through the file form; the
CLI's answers are the adapter's greedy answers, batched or one by one; bad inputs are one line with
``FILE:LINE`` and exit code 2, before any model is loaded.
"""

from __future__ import annotations

import json

import pytest

from mm.cli import main
from mm.eval.model_inputs import chair_items, find_image
from mm.eval.runners import load_eval_adapter
from mm.model.adapter import Sample
from tests.helpers.eval_model import make_data_dir, make_model_dir
from tests.mm.adapter_helpers import BUILDERS, build_family, random_image

FAMILIES = [*BUILDERS, "notevlm"]
QUESTIONS = [
    {"question_id": 1, "image": "kitchen.png", "text": "Is there a cup in the image?", "label": "yes"},
    {"question_id": 2, "image": "kitchen.png", "text": "Is there a dog in the image?", "label": "no"},
    {"question_id": 3, "image": "sub/street.jpg", "text": "Is there a car in the image?", "label": "yes"},
    {"question_id": 4, "image": "sub/street.jpg", "text": "Is there a fork in the image?", "label": "no"},
    {"question_id": 5, "image": "COCO_val2014_000000000139.jpg", "text": "Is there a tv?", "label": "YES"},
]
OBJECTS = {"kitchen": ["cup", "fork"], "sub/street.jpg": ["car"], "139": ["tv", "chair"]}
POPE_KEYS = {"accuracy", "precision", "recall", "f1", "yes_ratio", "tp", "fp", "tn", "fn", "unparsed"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("evalbyo")
    out = {f: build_family(f, root / f) for f in BUILDERS}
    out["notevlm"] = make_model_dir(root / "nv")
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """POPE questions, an objects file and their images (PNG, JPEG in a sub-folder, a COCO file name)."""
    root = tmp_path_factory.mktemp("evalfiles")
    imgs = root / "images"
    (imgs / "sub").mkdir(parents=True)
    random_image(32, 24, seed=1).save(imgs / "kitchen.png")
    random_image(24, 32, seed=2).save(imgs / "sub" / "street.jpg")
    random_image(32, 32, seed=3).save(imgs / "COCO_val2014_000000000139.jpg")
    q = root / "pope.jsonl"
    q.write_text("".join(json.dumps(x) + "\n" for x in QUESTIONS))
    o = root / "objects.json"
    o.write_text(json.dumps(OBJECTS, indent=1))
    return {"root": root, "images": imgs, "questions": q, "objects": o}


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param


def _run(argv, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_pope_on_files_round_trips_through_answers_out(folders, files, family, tmp_path, capsys):
    ans = tmp_path / "answers.jsonl"
    argv = ["eval", "pope", "--model", str(folders[family]), "--questions", str(files["questions"])]
    argv += ["--image-folder", str(files["images"]), "--answers-out", str(ans), "--max-new-tokens", "4"]
    code, out, err = _run([*argv, "--json", "--batch-size", "2"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert POPE_KEYS <= set(res) and res["n_questions"] == 5 and res["n_scored"] == 5
    assert res["tp"] + res["fp"] + res["tn"] + res["fn"] + res["unparsed"] == 5
    rows = [json.loads(line) for line in ans.read_text().splitlines()]
    assert [r["question_id"] for r in rows] == ["1", "2", "3", "4", "5"]
    assert [r["label"] for r in rows] == ["yes", "no", "yes", "no", "yes"]  # "YES" normalised
    assert rows[0]["prompt"] == QUESTIONS[0]["text"] and rows[2]["image"] == "sub/street.jpg"
    # the written answers score to the same numbers through the file form
    code, out, err = _run(
        ["eval", "pope", "--questions", str(files["questions"]), "--answers", str(ans), "--json"], capsys
    )
    again = json.loads(out)
    assert code == 0 and {k: again[k] for k in POPE_KEYS} == {k: res[k] for k in POPE_KEYS}
    # the CLI's answers are the adapter's greedy answers, one sample at a time
    adapter = load_eval_adapter(folders[family], device="cpu")
    from PIL import Image

    for r in rows[:3]:
        with Image.open(files["images"] / r["image"]) as im:
            sample = Sample(images=[im.convert("RGB")], text=r["prompt"])
        assert adapter.generate([sample], max_new_tokens=4) == [r["text"]]
    # and the table names the model's family
    code, out, _ = _run(argv, capsys)
    assert code == 0 and "scored 5 of 5 questions" in out and f"({adapter.family})" in out


def test_chair_on_files_round_trips_through_captions_out(folders, files, family, tmp_path, capsys):
    caps = tmp_path / "captions.json"
    argv = ["eval", "chair", "--model", str(folders[family]), "--objects", str(files["objects"])]
    argv += ["--image-folder", str(files["images"]), "--vocab", "coco", "--captions-out", str(caps)]
    code, out, err = _run([*argv, "--max-new-tokens", "6", "--json", "--batch-size", "3"], capsys)
    assert code == 0, err
    res = json.loads(out)
    assert res["n_captions"] == 3 and res["vocab"] == "coco"
    assert [r["image_id"] for r in res["per_caption"]] == ["kitchen", "sub/street.jpg", "139"]
    written = json.loads(caps.read_text())
    assert written == [{"image_id": r["image_id"], "caption": r["caption"]} for r in res["per_caption"]]
    code, out, err = _run(
        ["eval", "chair", "--captions", str(caps), "--objects", str(files["objects"]), "--json"], capsys
    )
    again = json.loads(out)
    for k in ("chair_s", "chair_i", "recall", "mean_length", "n_mentions", "n_hallucinated"):
        assert again[k] == res[k]
    # batching does not change greedy captions
    code, out, _ = _run([*argv[:-2], "--max-new-tokens", "6", "--json", "--batch-size", "1"], capsys)
    assert [r["caption"] for r in json.loads(out)["per_caption"]] == [
        r["caption"] for r in res["per_caption"]
    ]


def test_world_form_takes_a_transformers_model(folders, tmp_path, capsys):
    data = make_data_dir(tmp_path)
    code, out, err = _run(
        [
            "eval",
            "pope",
            "--model",
            str(folders["llava"]),
            "--data",
            str(data),
            "--max-new-tokens",
            "2",
            "--json",
        ],
        capsys,
    )
    assert code == 0, err
    assert json.loads(out)["n_questions"] == 10


def test_image_lookup_for_objects(files, tmp_path):
    imgs = files["images"]
    assert find_image(imgs, "kitchen")[0] == imgs / "kitchen.png"
    assert find_image(imgs, "139")[0] == imgs / "COCO_val2014_000000000139.jpg"
    assert find_image(imgs, "140")[0] is None
    coco = {
        "images": [{"id": 7, "file_name": "sub/street.jpg"}, {"id": 139, "file_name": "nope.jpg"}],
        "annotations": [{"image_id": 7, "category_id": 3}],
        "categories": [{"id": 3, "name": "car"}],
    }
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(coco, indent=1))
    items = chair_items(path, imgs)
    assert [(it.image_id, it.image.name, it.objects) for it in items] == [
        ("7", "street.jpg", ["car"]),
        ("139", "COCO_val2014_000000000139.jpg", []),  # file_name missing: the COCO name is found
    ]
    assert [it.image_id for it in chair_items(path, imgs, limit=1)] == ["7"]


def _bad(tmp_path, files, name, rows):
    path = tmp_path / name
    path.write_text(
        "".join(json.dumps(r) + "\n" for r in rows) if name.endswith("jsonl") else json.dumps(rows)
    )
    return str(path)


@pytest.mark.parametrize(
    "rows, match",
    [
        ([QUESTIONS[0], {**QUESTIONS[1], "image": "missing.png"}], ":2: image 'missing.png' not found"),
        (
            [{k: v for k, v in QUESTIONS[0].items() if k != "text"}],
            ":1: question needs a non-empty string 'text'",
        ),
        ([QUESTIONS[0], {**QUESTIONS[1], "label": "maybe"}], ":2: label must be 'yes' or 'no'"),
        ([QUESTIONS[0], {**QUESTIONS[1], "image": "broken.png"}], ":2: cannot read image"),
    ],
)
def test_pope_bad_questions_name_file_and_line(folders, files, tmp_path, capsys, rows, match):
    (files["images"] / "broken.png").write_text("not an image")
    q = _bad(tmp_path, files, "q.jsonl", rows)
    argv = [
        "eval",
        "pope",
        "--model",
        str(folders["llava"]),
        "--questions",
        q,
        "--image-folder",
        str(files["images"]),
    ]
    code, out, err = _run(argv, capsys)
    assert code == 2 and out == "" and match in err and err.count("\n") == 1 and q in err


def test_chair_bad_objects_name_file_and_line(folders, files, tmp_path, capsys):
    o = tmp_path / "o.json"
    o.write_text('{\n "kitchen": ["cup"],\n "nowhere": ["dog"]\n}\n')
    argv = [
        "eval",
        "chair",
        "--model",
        str(folders["llava"]),
        "--objects",
        str(o),
        "--image-folder",
        str(files["images"]),
    ]
    code, _, err = _run(argv, capsys)
    assert code == 2 and f"{o}:3: image_id 'nowhere': no image file in" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "extra, match",
    [
        (["--answers", "a.jsonl"], "plus --answers a.jsonl"),
        (["--data", "d", "--questions", "q.jsonl"], "plus --questions"),
        (
            ["--answers-out", "no/such/folder/a.jsonl", "--questions", "Q"],
            "folder no/such/folder does not exist",
        ),
    ],
)
def test_pope_mixed_inputs(folders, files, capsys, extra, match):
    argv = ["eval", "pope", "--model", str(folders["llava"]), *extra]
    argv = [str(files["questions"]) if a == "Q" else a for a in argv]
    code, _, err = _run(argv, capsys)
    assert code == 2 and match in err


def test_model_only_flags_need_a_model(files, capsys):
    code, _, err = _run(
        ["eval", "pope", "--questions", str(files["questions"]), "--answers-out", "a.jsonl"], capsys
    )
    assert code == 2 and "--answers-out needs --model DIR" in err
    code, _, err = _run(["eval", "chair", "--objects", str(files["objects"]), "--image-folder", "x"], capsys)
    assert code == 2 and "--image-folder needs --model DIR" in err


def test_help_names_both_model_forms(capsys):
    for sub, flags in (
        ("pope", ["--answers-out", "--image-folder", "--post-prompt"]),
        ("chair", ["--captions-out", "--prompt"]),
    ):
        with pytest.raises(SystemExit):
            main(["eval", sub, "--help"])
        out = capsys.readouterr().out
        assert all(f in out for f in flags) and "transformers" in out


def test_world_form_answers_equal_the_direct_notevlm_path(folders, tmp_path):
    """The world form now generates through the adapter; its answers and captions are the ones the
    direct NoteVLM path (`mm.eval.generate`, used before) gives, so its numbers are unchanged."""
    from mm.data.prompts import CAPTION_PROMPT
    from mm.eval.generate import answer_questions, generate_captions, note_images
    from mm.eval.runners import held_out_notes, load_model, pope_questions, run_chair, run_pope

    data = make_data_dir(tmp_path)
    notes = held_out_notes(data)
    model, processor = load_model(folders["notevlm"], device="cpu")
    res = run_pope(model, processor, notes, data, split="random", seed=1, max_new_tokens=4, batch_size=3)
    questions, _ = pope_questions(notes, split="random", seed=1)
    items = [[str(data / q["image"])] for q in questions]
    direct = answer_questions(model, processor, items, [q["text"] for q in questions], 3, 4)
    assert [a["text"] for a in res["answers"]] == direct and len(direct) == 10
    chair = run_chair(model, processor, notes, data, max_new_tokens=6, batch_size=2)
    caps = generate_captions(model, processor, [note_images(n, data) for n in notes], CAPTION_PROMPT, 2, 6)
    assert [r["caption"] for r in chair["per_caption"]] == caps


def _torchrun_mm(cwd, *args: str):
    """2 CPU processes of ``python -m mm ARGS`` under torchrun."""
    return _torchrun_mm_module(cwd, "mm", *args)


def _torchrun_mm_module(cwd, module: str, *args: str):
    """2 CPU processes of ``python -m MODULE ARGS`` under torchrun, with the repository importable."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.helpers.launch import free_port

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(root))
    head = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
            "127.0.0.1", "--master_port", str(free_port())]  # fmt: skip
    return subprocess.run([*head, "-m", module, *args], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


@pytest.mark.slow
def test_two_processes_evaluate_as_one(folders, files, tmp_path, capsys):
    """torchrun: each process answers every other item (strided, 5 questions and 3 images over 2 ranks),
    rank 0 alone prints and writes; the answers, captions and scores are one process's."""
    model = str(folders["qwen2_vl"])
    imgs = ["--image-folder", str(files["images"]), "--json", "--batch-size", "2"]
    pope = ["eval", "pope", "--model", model, "--questions", str(files["questions"]), *imgs]
    chair = ["eval", "chair", "--model", model, "--objects", str(files["objects"]), *imgs]
    chair += ["--max-new-tokens", "12"]
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    for args, out_flag, name in (
        (pope, "--answers-out", "answers.jsonl"),
        (chair, "--captions-out", "c.json"),
    ):
        capsys.readouterr()
        assert main([*args, out_flag, str(one / name)]) == 0
        alone = json.loads(capsys.readouterr().out)
        proc = _torchrun_mm(two, *args, out_flag, str(two / name))
        assert proc.returncode == 0, proc.stderr[-3000:]
        lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
        assert len(lines) == 1  # rank 0 alone prints
        assert proc.stderr.count("mm eval: 2 processes, each answers one item in 2") == 1
        both = json.loads(lines[0])
        assert (two / name).read_text() == (one / name).read_text()
        for key in ("answers", "per_caption"):
            if key in alone:
                assert both[key] == alone[key]
        numbers = {k: v for k, v in alone.items() if isinstance(v, (int, float))}
        assert numbers and {k: both[k] for k in numbers} == numbers
    data = make_data_dir(tmp_path / "world")  # the claims eval: captions and claim questions of notes
    claims = ["eval", "claims", "--model", model, "--data", str(data), "--json", "--batch-size", "2"]
    capsys.readouterr()
    assert main(claims) == 0
    alone = json.loads(capsys.readouterr().out)
    proc = _torchrun_mm(two, *claims)
    assert proc.returncode == 0, proc.stderr[-3000:]
    both = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith("{")))
    assert both == alone and alone["discriminative"]


@pytest.mark.slow
def test_strided_map_over_two_processes_orders_results_and_shares_a_failure(tmp_path):
    """Rank r of 2 computes items r, r + 2, ...; every rank gets the results in item order; when rank 1
    fails, rank 1 raises its own error and rank 0 a UserError naming it (neither waits forever)."""
    proc = _torchrun_mm_module(tmp_path, "tests.mm.eval_parallel_worker", str(tmp_path / "out.json"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads((tmp_path / f"out{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in rows] == [2, 2]
    assert rows[0]["seen"] == [0, 2, 4, 6] and rows[1]["seen"] == [1, 3, 5]
    assert rows[0]["results"] == rows[1]["results"] == [i * i for i in range(7)]
    assert rows[1]["error"] == "MemoryError: out of memory on this one"
    assert rows[0]["error"] == (
        "UserError: process 1 of 2 failed on its share of the items: MemoryError: out of memory on this one"
    )

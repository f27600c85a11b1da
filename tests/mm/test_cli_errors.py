"""Disk trouble in the ``mm`` and ``rl`` commands: one line on stderr naming the path, exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mm.cli import main as mm_main
from mm.errors import UserError, check_out_path, describe_os_error
from rl.cli import main as rl_main

ROOT = Path(__file__).resolve().parents[2]


def _one_line(capsys, prefix: str) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(prefix), err
    return err[0]


@pytest.mark.parametrize(
    "main, argv",
    [
        (mm_main, ["train", "--config", "configs/mm/sft_tiny.yaml"]),
        (mm_main, ["pretrain", "--config", "configs/mm/pretrain_test.yaml"]),
        (rl_main, ["dpo", "--config", "configs/rl/dpo_tiny.yaml"]),
        (rl_main, ["grpo", "--config", "configs/rl/grpo_tiny.yaml"]),
        (rl_main, ["pipeline", "--config", "configs/rl/pipeline.yaml"]),
    ],
)
def test_out_under_a_regular_file(tmp_path, capsys, monkeypatch, main, argv):
    monkeypatch.chdir(ROOT)
    blocker = tmp_path / "a_file"
    blocker.write_text("keep me")
    assert main([*argv, "--out", str(blocker / "run"), "--no-progress"]) == 2
    line = _one_line(capsys, f"{'mm' if main is mm_main else 'rl'} {argv[0]}: error: ")
    assert f"--out {blocker / 'run'}: {blocker} is a file, not a folder" in line
    assert blocker.read_text() == "keep me"


def test_output_file_under_a_regular_file(tmp_path, capsys):
    objects = tmp_path / "o.json"
    objects.write_text('{"1": ["dog"], "2": ["cat"]}')
    (tmp_path / "f").write_text("")
    argv = ["eval", "pope-build", "--objects", str(objects), "--out", str(tmp_path / "f" / "q.jsonl")]
    assert mm_main(argv) == 2
    assert "is a file, not a folder" in _one_line(capsys, "mm eval: error: --out ")


def test_unwritable_out_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("mm.errors.os.access", lambda path, mode: False)  # root may write anywhere
    monkeypatch.chdir(ROOT)
    out = tmp_path / "new" / "run"
    assert mm_main(["train", "--config", "configs/mm/sft_tiny.yaml", "--out", str(out)]) == 2
    line = _one_line(capsys, "mm train: error: ")
    assert f"folder {tmp_path} is not writable" in line
    assert not (tmp_path / "new").exists()


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a user that permissions apply to")
def test_unwritable_out_folder_for_real(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        with pytest.raises(UserError, match="is not writable"):
            check_out_path(locked / "run")
    finally:
        locked.chmod(0o700)


def test_check_out_path_accepts_new_and_existing_folders_and_creates_nothing(tmp_path):
    check_out_path(tmp_path / "a" / "b" / "c")
    check_out_path(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_missing_inputs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert mm_main(["train", "--config", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "nope.yaml does not exist" in _one_line(capsys, "mm train: error: ")
    argv = ["eval", "pope", "--questions", str(tmp_path / "q.jsonl"), "--answers", str(tmp_path / "a.jsonl")]
    assert mm_main(argv) == 2
    assert "q.jsonl: no such file" in _one_line(capsys, "mm eval: error: ")
    assert not (tmp_path / "o").exists()


def test_os_error_raised_inside_a_command_is_one_line(tmp_path, capsys, monkeypatch):
    """An OSError no early check can foresee (here a full disk) is one line too, and leaves no file."""
    import errno

    def full_disk(src, dst):
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    monkeypatch.setattr("mm.eval.files.os.replace", full_disk)
    objects = tmp_path / "o.json"
    objects.write_text('{"1": ["dog"], "2": ["cat"]}')
    argv = ["eval", "pope-build", "--objects", str(objects), "--out", str(tmp_path / "q.jsonl")]
    assert mm_main(argv) == 2
    line = _one_line(capsys, "mm eval: error: ")
    fix = "free some space or choose another disk"
    assert line.endswith(f"cannot replace {tmp_path / 'q.jsonl'}: no space left on the disk; {fix}")
    assert [p.name for p in tmp_path.iterdir()] == ["o.json"]  # the temporary file is removed


def test_output_path_that_is_a_folder(tmp_path, capsys):
    objects = tmp_path / "o.json"
    objects.write_text('{"1": ["dog"], "2": ["cat"]}')
    (tmp_path / "q.jsonl").mkdir()
    argv = ["eval", "pope-build", "--objects", str(objects), "--out", str(tmp_path / "q.jsonl")]
    assert mm_main(argv) == 2
    assert "q.jsonl is a folder; pass the path of the file to write" in _one_line(capsys, "mm eval: error: ")


def test_describe_os_error_names_operation_path_and_fix(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(OSError) as e:
        (tmp_path / "f" / "x").mkdir(parents=True)
    msg = describe_os_error(e.value)
    assert msg.startswith(f"cannot create folder {tmp_path / 'f'}")
    assert "a part of the path is a file, not a folder" in msg
    with pytest.raises(OSError) as e:
        (tmp_path / "missing.txt").read_text()
    assert (
        describe_os_error(e.value)
        == f"cannot open {tmp_path / 'missing.txt'}: no such file or folder; check the path"
    )
    with pytest.raises(OSError) as e:
        os.replace(tmp_path / "missing.txt", tmp_path / "x.txt")
    assert describe_os_error(e.value).startswith(f"cannot replace {tmp_path / 'missing.txt'} -> ")
    assert describe_os_error(FileNotFoundError("no notes in split 'train'")) == "no notes in split 'train'"

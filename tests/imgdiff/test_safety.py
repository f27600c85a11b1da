"""imgdiff never writes onto its inputs: every refusal is one line, exit 2, before any image is read, and
leaves every file byte-for-byte as it was; outputs honour the umask, are synced and all-or-nothing."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from imgdiff import io as iio
from imgdiff import pair_rows, write
from imgdiff.cli import main

CHANGE = (10, 5, 17, 9)  # inclusive x0, y0, x1, y1 of the change in B


def _image(change: bool) -> np.ndarray:
    yy, xx = np.mgrid[0:32, 0:48]
    img = np.stack([40 + 2 * xx, 60 + 3 * yy, 100 + xx + yy], axis=2).astype(np.uint8)  # (H, W, 3)
    if change:
        x0, y0, x1, y1 = CHANGE
        img[y0 : y1 + 1, x0 : x1 + 1] ^= 0x80
    return img


def _pair(folder) -> tuple[str, str]:
    folder.mkdir(parents=True, exist_ok=True)
    a, b = folder / "a.png", folder / "b.png"
    Image.fromarray(_image(False)).save(a)
    Image.fromarray(_image(True)).save(b)
    return str(a), str(b)


def _folders(root):
    """Batch folders ``A`` and ``B`` under ``root``: ``same.png`` and ``sub/diff.png`` in both."""
    da, db = root / "A", root / "B"
    for d in (da / "sub", db / "sub"):
        d.mkdir(parents=True)
    for d in (da, db):
        Image.fromarray(_image(False)).save(d / "same.png")
    Image.fromarray(_image(False)).save(da / "sub" / "diff.png")
    Image.fromarray(_image(True)).save(db / "sub" / "diff.png")
    return da, db


def _snapshot(root) -> dict[str, tuple[bytes | str, int]]:
    """Every entry under ``root`` (hidden ones too): bytes (or a link's target) and mode."""
    got = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                got[rel] = (os.readlink(path), 0)
            elif os.path.isfile(path):
                got[rel] = (open(path, "rb").read(), stat.S_IMODE(os.stat(path).st_mode))
            else:
                got[rel] = (b"<dir>", 0)
    return got


@pytest.fixture
def no_reads(monkeypatch):
    """Record every call of imgdiff's readers: a refusal must come before any of them."""
    calls = []
    readers = [(iio, name) for name in ("probe", "read_pair", "identical_pair", "read_image")]
    for module, name in [*readers, (pair_rows, "read_pair_rows")]:
        real = getattr(module, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(module, name, spy)
    return calls


def _trouble(capsys, *argv, words=()) -> str:
    code = main([str(x) for x in argv])
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert err.count("\n") == 1 and err.startswith("imgdiff: error: "), err
    assert "Traceback" not in err and "unexpected" not in err and out == ""
    for word in words:
        assert str(word) in err, (word, err)
    return err


# --------------------------------------------------------------------- 1. an output is never an input


@pytest.mark.parametrize("kind", ["same path", "other spelling", "symlink", "hard link", "mask-out"])
def test_output_that_is_an_input_file_is_refused_before_reading(tmp_path, capsys, no_reads, kind):
    a, b = _pair(tmp_path)
    (tmp_path / "sub").mkdir()
    flag, out, named = "--out", b, b
    if kind == "other spelling":
        out = str(tmp_path / "sub" / ".." / "b.png")
    elif kind == "symlink":
        out = str(tmp_path / "link.png")
        os.symlink(b, out)
    elif kind == "hard link":
        out, named = str(tmp_path / "hard.png"), a
        os.link(a, out)
    elif kind == "mask-out":
        flag, out, named = "--mask-out", a, a
    before = _snapshot(tmp_path)
    _trouble(capsys, a, b, flag, out, words=[flag, repr(out), repr(named), "same file"])
    assert _snapshot(tmp_path) == before and no_reads == []


@pytest.mark.parametrize("kind", ["same path", "other spelling", "symlink to the file", "symlinked folder"])
def test_out_and_mask_out_naming_one_file(tmp_path, capsys, no_reads, kind):
    a, b = _pair(tmp_path)
    out = mask = str(tmp_path / "o.png")
    if kind == "other spelling":
        mask = os.path.join(str(tmp_path), ".", "o.png")  # pathlib would drop the "."
    elif kind == "symlink to the file":
        Image.fromarray(_image(False)).save(out)
        mask = str(tmp_path / "m.png")
        os.symlink(out, mask)
    elif kind == "symlinked folder":
        os.symlink(tmp_path, tmp_path / "alias")
        mask = str(tmp_path / "alias" / "o.png")
    before = _snapshot(tmp_path)
    _trouble(capsys, a, b, "--out", out, "--mask-out", mask, words=[repr(out), repr(mask), "same file"])
    assert _snapshot(tmp_path) == before and no_reads == []


@pytest.mark.parametrize(
    "outputs, words",
    [
        (["--out", "A"], ["is input folder A"]),
        (["--out", "A/sub"], ["is inside input folder A"]),
        (["--mask-out", "B/new"], ["is inside input folder B"]),
        (["--out", "."], ["input folder A", "is inside --out"]),
        (["--out", "X", "--mask-out", "X"], ["same folder"]),
        (["--out", "X", "--mask-out", "X/masks"], ["nested folders"]),
    ],
)
def test_batch_output_folder_overlapping_an_input_folder(tmp_path, capsys, no_reads, outputs, words):
    da, db = _folders(tmp_path)
    before = _snapshot(tmp_path)
    argv = [x if x.startswith("--") else tmp_path / x for x in outputs]
    _trouble(capsys, da, db, *argv, words=words)
    assert _snapshot(tmp_path) == before and no_reads == []  # nothing read, no folder created


def test_batch_links_inside_the_folders(tmp_path, capsys, no_reads):
    """Folders apart, but links make an output file an input: a symlinked output subfolder, an input
    that is a symlink to an output file, an output hard-linked to an input."""
    da, db = _folders(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(da / "sub", out / "sub")  # out/sub/diff.png is A/sub/diff.png
    before = _snapshot(tmp_path)
    _trouble(capsys, da, db, "--out", out, words=[repr(str(out / "sub" / "diff.png")), "input"])
    assert _snapshot(tmp_path) == before
    os.remove(out / "sub")
    Image.fromarray(_image(False)).save(out / "same.png")
    os.remove(da / "same.png")
    os.symlink(out / "same.png", da / "same.png")  # A's input is the output file
    before = _snapshot(tmp_path)
    _trouble(capsys, da, db, "--out", out, words=[repr(str(out / "same.png"))])
    assert _snapshot(tmp_path) == before
    os.remove(da / "same.png")
    Image.fromarray(_image(False)).save(da / "same.png")
    os.remove(out / "same.png")
    os.link(db / "same.png", out / "same.png")  # the output is a hard link to B's input
    before = _snapshot(tmp_path)
    _trouble(capsys, da, db, "--mask-out", out, words=[repr(str(db / "same.png"))])
    assert _snapshot(tmp_path) == before and no_reads == []


def test_batch_two_pairs_one_output_file(tmp_path, capsys, no_reads):
    da, db = _folders(tmp_path)
    for d in (da, db):
        Image.fromarray(_image(False)).save(d / "same.bmp")  # same.bmp and same.png -> out/same.png
    before = _snapshot(tmp_path)
    _trouble(capsys, da, db, "--out", tmp_path / "out", words=["'same.bmp'", "'same.png'", "both"])
    assert _snapshot(tmp_path) == before and no_reads == []


def test_outputs_elsewhere_still_work(tmp_path, capsys):
    a, b = _pair(tmp_path / "in")
    assert main([a, b, "--out", str(tmp_path / "o.png"), "--mask-out", str(tmp_path / "m.png")]) == 1
    da, db = _folders(tmp_path / "batch")
    assert main([str(da), str(db), "--out", str(tmp_path / "ov"), "--mask-out", str(tmp_path / "mk")]) == 1
    capsys.readouterr()
    assert (tmp_path / "ov" / "sub" / "diff.png").exists() and (tmp_path / "mk" / "same.png").exists()


def test_symlink_output_is_replaced_and_its_target_left_alone(tmp_path, capsys):
    a, b = _pair(tmp_path)
    other = tmp_path / "other.png"
    other.write_bytes(b"not an input")
    os.symlink(other, tmp_path / "o.png")
    assert main([a, b, "--out", str(tmp_path / "o.png")]) == 1
    capsys.readouterr()
    assert other.read_bytes() == b"not an input" and not os.path.islink(tmp_path / "o.png")
    assert iio.read_image(tmp_path / "o.png").shape == (32, 48, 3)


# ----------------------------------------------------------------------------- 2. modes and the umask


@pytest.fixture
def umask():
    """Set the process umask for one test and restore it after."""
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.parametrize("mask, want", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_new_output_gets_the_umask_mode(tmp_path, umask, mask, want):
    umask(mask)
    write.atomic_write(tmp_path / "new.json", b"{}\n")
    assert _mode(tmp_path / "new.json") == want


@pytest.mark.parametrize("mask, old_mode", [(0o022, 0o640), (0o077, 0o604), (0o022, 0o600)])
def test_overwritten_output_keeps_its_mode(tmp_path, umask, mask, old_mode):
    target = tmp_path / "old.json"
    target.write_bytes(b"old")
    target.chmod(old_mode)
    umask(mask)
    write.atomic_write(target, b"new")
    assert target.read_bytes() == b"new" and _mode(target) == old_mode


def test_cli_outputs_are_0644_under_umask_022(tmp_path, capsys, umask):
    a, b = _pair(tmp_path)
    out, mask = tmp_path / "o.png", tmp_path / "m.png"
    assert main([a, b, "--out", str(out), "--mask-out", str(mask)]) == 1
    capsys.readouterr()
    assert _mode(out) == _mode(mask) == 0o644
    assert [p for p in os.listdir(tmp_path) if p.endswith(".tmp")] == []


# ------------------------------------------------------------------------------------ 3. --threshold


@pytest.mark.parametrize(
    "value", ["inf", "-inf", "nan", "1e400", "-1", "-0.5", "255.5", "256", "65535", "abc"]
)
def test_bad_thresholds_are_one_line(tmp_path, capsys, no_reads, value):
    a, b = _pair(tmp_path)
    before = _snapshot(tmp_path)
    words = ["0 to 255", repr(value)]
    _trouble(capsys, a, b, f"--threshold={value}", "--out", tmp_path / "o.png", words=words)  # = for "-inf"
    assert _snapshot(tmp_path) == before and no_reads == []


def test_threshold_units_are_0_255_at_16_bits(tmp_path, capsys):
    """Why no threshold above 255 is accepted, even for 16-bit images: a 16-bit delta d counts as
    d/257, so a raw delta of 1000 (3.89 levels) is a change at threshold 3, not at 4, and a full-scale
    delta is not a change at 255."""
    import cv2

    a = np.full((8, 12), 20000, np.uint16)  # (H, W) 16-bit gray
    b = a.copy()
    b[2, 3] += 1000
    b[5, 7] = 65535
    cv2.imwrite(str(tmp_path / "a.png"), a)
    cv2.imwrite(str(tmp_path / "b.png"), b)
    run = [str(tmp_path / "a.png"), str(tmp_path / "b.png"), "--mode", "exact", "--json", "--threshold"]
    assert main([*run, "3"]) == 1
    assert '"changed_pixels": 2' in capsys.readouterr().out
    assert main([*run, "4"]) == 1
    assert '"changed_pixels": 1' in capsys.readouterr().out
    assert main([*run, "255"]) == 0
    capsys.readouterr()
    _trouble(capsys, *run, "300", words=["16-bit", "d/257"])


# --------------------------------------------------------------------------- 4. unwritable outputs


def test_output_under_a_regular_file_or_a_missing_folder(tmp_path, capsys, no_reads):
    a, b = _pair(tmp_path)
    before = _snapshot(tmp_path)
    _trouble(capsys, a, b, "--out", os.path.join(a, "o.png"), words=[repr(a), "is a file, not a folder"])
    _trouble(capsys, a, b, "--mask-out", tmp_path / "no" / "m.png", words=["does not exist"])
    da, db = _folders(tmp_path / "batch")
    before = _snapshot(tmp_path)
    _trouble(capsys, da, db, "--out", os.path.join(a, "out"), words=[repr(a), "is a file, not a folder"])
    _trouble(capsys, da, db, "--out", a, words=["is a folder, and this is a file"])
    assert _snapshot(tmp_path) == before and no_reads == []


def _fail_temp_files(monkeypatch, error: OSError, *, after: int = 0):
    """Make ``os.open`` of imgdiff's temporary files raise ``error`` from the ``after + 1``-th one on."""
    real, seen = os.open, []

    def fake(path, flags, mode=0o777, **kwargs):
        if str(path).endswith(".tmp"):
            seen.append(path)
            if len(seen) > after:
                raise error
        return real(path, flags, mode, **kwargs)

    monkeypatch.setattr(os, "open", fake)


@pytest.mark.parametrize(
    "error, words",
    [
        (PermissionError(13, "Permission denied"), ["Permission denied", "not writable"]),
        (OSError(28, "No space left on device"), ["No space left", "free some disk space"]),
    ],
)
def test_unwritable_folder_leaves_nothing(tmp_path, capsys, monkeypatch, error, words):
    a, b = _pair(tmp_path)
    out = tmp_path / "o.png"
    out.write_bytes(b"old overlay")
    _fail_temp_files(monkeypatch, error)
    before = _snapshot(tmp_path)
    _trouble(capsys, a, b, "--out", out, "--mask-out", tmp_path / "m.png", words=["nothing written", *words])
    assert _snapshot(tmp_path) == before  # no temporary file, the old output untouched


def test_a_failing_second_output_writes_neither(tmp_path, capsys, monkeypatch):
    a, b = _pair(tmp_path)
    _fail_temp_files(monkeypatch, PermissionError(13, "Permission denied"), after=1)  # the mask's temp
    before = _snapshot(tmp_path)
    _trouble(capsys, a, b, "--out", tmp_path / "o.png", "--mask-out", tmp_path / "m.png", words=["m.png"])
    assert _snapshot(tmp_path) == before  # the overlay was written to a temp file, then removed


def test_failed_or_interrupted_write_removes_its_temp_file(tmp_path, monkeypatch):
    target = tmp_path / "o.json"
    target.write_bytes(b"old")
    real_write = os.write

    def short_then_full_disk(fd, data):
        if len(data) > 3:
            return real_write(fd, data[:3])  # a short write: the rest must still be written
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", short_then_full_disk)
    with pytest.raises(iio.ImageIOError, match="No space left"):
        write.atomic_write(target, b"new bytes")
    monkeypatch.setattr(os, "write", lambda fd, data: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        write.atomic_write(target, b"new bytes")
    assert os.listdir(tmp_path) == ["o.json"] and target.read_bytes() == b"old"


def test_short_writes_are_completed(tmp_path, monkeypatch):
    real_write = os.write
    monkeypatch.setattr(os, "write", lambda fd, data: real_write(fd, data[:2]))
    write.atomic_write(tmp_path / "o.bin", b"0123456789")
    assert (tmp_path / "o.bin").read_bytes() == b"0123456789"


# ------------------------------------------------------------------------------------ 5. durability


def test_file_synced_before_rename_and_folder_after(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src, dst):
        events.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    write.atomic_write_all([(tmp_path / "a.bin", b"a"), (tmp_path / "b.bin", b"b")])
    assert events == ["fsync file", "fsync file", "replace", "replace", "fsync folder"]


# ------------------------------------------------------------------------------------ the module split


def test_io_reexports_the_writers_lazily(tmp_path):
    for name in iio._WRITERS:
        assert getattr(iio, name) is getattr(write, name)
    with pytest.raises(AttributeError, match="no_such_name"):
        iio.no_such_name  # noqa: B018
    a, b = _pair(tmp_path)
    code = (
        "import sys; from imgdiff.cli import _main; code = _main(sys.argv[1:]); "
        "print(code, 'imgdiff.write' in sys.modules, 'tempfile' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code, a, b, "--json"], capture_output=True, text=True)
    assert proc.stdout.split()[-3:] == ["1", "False", "False"], proc  # the plain CLI path pays for neither

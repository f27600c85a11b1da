"""imgdiff's outputs (PNG overlay, PNG mask, JSON): where they may go, and how they are written.

Inputs are never touched. Before any image is read, the CLI checks (a few ``stat`` calls):

* :func:`check_outputs`: an output is not an input file, neither by path once symlinks are resolved
  (``realpath``) nor as the same file (device and inode: hard links, bind mounts), and two outputs
  do not name one file;
* :func:`check_output_folders` (batch mode): an output folder is not an input folder, does not lie
  inside one and does not hold one, and two output folders do not overlap;
* :func:`check_targets` (batch mode): no output file is an input file (symlinks or hard links inside
  the folders) and no two pairs write one output file (``x.png`` and ``x.jpg`` both give ``x.png``);
* :func:`check_writable` / :func:`check_folder_writable`: the destination folder exists (batch: can
  be created) and is writable, with a message that says which part of the path is wrong.

Writes are atomic (:func:`atomic_write`, :func:`atomic_write_all`): the bytes are encoded in memory,
written to a hidden temporary file in the destination folder (``.NAME.XXXXXXXX.tmp``), flushed to
disk (``fsync``), moved into place with :func:`os.replace`, and then the folder is synced. On any
error every temporary file is removed and the destinations are untouched. The temporary file is
created with mode 0666 less the umask (a new output is 0644 under umask 022), and an overwritten
file keeps its mode. A symlink named as an output is replaced by the new file; its target is left
alone.
"""

from __future__ import annotations

import os
import stat

from imgdiff.io_errors import ImageIOError

TYPE_CHECKING = False  # not typing.TYPE_CHECKING: importing typing costs the CLI ~2 ms of start-up
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    import numpy as np


class OutputClash(ImageIOError):
    """An output would overwrite an input, or two outputs name one file; the message names both paths."""


# ------------------------------------------------------------------------------------ where outputs go


def _identity(path: str) -> tuple[int, int] | None:
    """``(device, inode)`` of the file ``path`` names (symlinks followed), None when there is none."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_dev, st.st_ino


def _within(child: str, parent: str) -> bool:
    """Whether the resolved path ``child`` is ``parent`` or lies under it."""
    return child == parent or child.startswith(parent if parent.endswith(os.sep) else parent + os.sep)


def check_outputs(inputs: dict[str, str], outputs: dict[str, str | None]) -> None:
    """Raise :class:`OutputClash` when an output file is one of the ``inputs`` or two outputs are one file.

    ``inputs``: label -> path (``{"input A": "a.png"}``); ``outputs``: flag -> path or None (not
    asked for). A path matches when the resolved paths are equal or both exist as the same file."""
    named = [(flag, os.fspath(path)) for flag, path in outputs.items() if path is not None]
    if not named:
        return
    ins = [(label, os.fspath(p), os.path.realpath(p), _identity(p)) for label, p in inputs.items()]
    seen: list[tuple[str, str, str, tuple[int, int] | None]] = []
    for flag, path in named:
        real, ident = os.path.realpath(path), _identity(path)
        for label, in_path, in_real, in_ident in ins:
            if real == in_real or (ident is not None and ident == in_ident):
                raise OutputClash(
                    f"{flag} {path!r} is {label} {in_path!r} (the same file); writing it would "
                    "overwrite the input; give another output path"
                )
        for other, other_path, other_real, other_ident in seen:
            if real == other_real or (ident is not None and ident == other_ident):
                raise OutputClash(
                    f"{flag} {path!r} and {other} {other_path!r} are the same file; give two different paths"
                )
        seen.append((flag, path, real, ident))


def check_output_folders(inputs: dict[str, str], outputs: dict[str, str | None]) -> None:
    """Batch mode: raise :class:`OutputClash` when an output folder is an input folder, lies inside one
    or holds one, or when two output folders are one or nested (their files would collide).

    ``inputs``: label -> folder; ``outputs``: flag -> folder or None. Folders are compared resolved
    (``realpath``) and, when both exist, as the same directory (device and inode)."""
    named = [(flag, os.fspath(path)) for flag, path in outputs.items() if path is not None]
    ins = [(label, os.fspath(p), os.path.realpath(p), _identity(p)) for label, p in inputs.items()]
    seen: list[tuple[str, str, str]] = []
    for flag, path in named:
        real, ident = os.path.realpath(path), _identity(path)
        for label, in_path, in_real, in_ident in ins:
            if real == in_real or (ident is not None and ident == in_ident):
                where = f"{flag} {path!r} is {label} {in_path!r}"
            elif _within(real, in_real):
                where = f"{flag} {path!r} is inside {label} {in_path!r}"
            elif _within(in_real, real):
                where = f"{label} {in_path!r} is inside {flag} {path!r}"
            else:
                continue
            raise OutputClash(f"{where}; outputs could overwrite inputs; pick a folder outside both inputs")
        for other, other_path, other_real in seen:
            if _within(real, other_real) or _within(other_real, real):
                how = "the same folder" if real == other_real else "nested folders"
                raise OutputClash(
                    f"{flag} {path!r} and {other} {other_path!r} are {how}; their files would collide; "
                    "give two separate folders"
                )
        seen.append((flag, path, real))


def check_targets(inputs: Iterable[str], targets: Iterable[tuple[str, str, str]]) -> None:
    """Batch mode: raise :class:`OutputClash` when an output file is an input file or two pairs write
    one output file.

    ``inputs``: every input file path; ``targets``: ``(flag, pair name, output path)``. One ``realpath``
    and one ``stat`` per path."""
    in_real: dict[str, str] = {}
    in_ident: dict[tuple[int, int], str] = {}
    for path in inputs:
        in_real.setdefault(os.path.realpath(path), path)
        ident = _identity(path)
        if ident is not None:
            in_ident.setdefault(ident, path)
    written: dict[str, tuple[str, str]] = {}
    for flag, name, path in targets:
        real, ident = os.path.realpath(path), _identity(path)
        hit = in_real.get(real) or (in_ident.get(ident) if ident is not None else None)
        if hit is not None:
            raise OutputClash(
                f"{flag} file {path!r} (for {name!r}) is the input {hit!r} (the same file, through a "
                "link); writing it would overwrite the input; pick another output folder"
            )
        if real in written:
            other_flag, other_name = written[real]
            raise OutputClash(
                f"{flag} file {path!r} would be written for both {other_name!r} ({other_flag}) and "
                f"{name!r}; rename one of the inputs or give --out and --mask-out separate folders"
            )
        written[real] = (flag, name)


def _blocking_file(folder: str) -> str | None:
    """The nearest existing ancestor of the missing ``folder`` when it is not a directory, else None."""
    parent = folder
    while not os.path.exists(parent):
        up = os.path.dirname(parent)
        if up == parent:
            return None
        parent = up
    return None if os.path.isdir(parent) else parent


def check_writable(path: str | os.PathLike) -> None:
    """Fail before any work when the file ``path`` cannot be written: it is a directory, its folder is
    missing or is a file, or the folder is not writable."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise ImageIOError(f"cannot write {path!r}: it is a directory; give a file name")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        blocker = _blocking_file(folder)
        if blocker is not None:
            raise ImageIOError(
                f"cannot write {path!r}: {blocker!r} is a file, not a folder; pick another place"
            )
        raise ImageIOError(f"cannot write {path!r}: folder {folder!r} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise ImageIOError(f"cannot write {path!r}: folder {folder!r} is not writable; pick another place")


def check_folder_writable(folder: str | os.PathLike, flag: str) -> None:
    """Batch mode: fail when the output ``folder`` (created if missing) is a file, sits under a file,
    or cannot be written to."""
    folder = os.fspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ImageIOError(f"{flag} {folder!r}: in batch mode {flag} is a folder, and this is a file")
    blocker = _blocking_file(os.path.abspath(folder))
    if blocker is not None:
        raise ImageIOError(f"{flag} {folder!r}: {blocker!r} is a file, not a folder; pick another place")
    parent = os.path.abspath(folder)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK):
        raise ImageIOError(f"{flag} {folder!r}: folder {parent!r} is not writable; pick another place")


def make_folders(folder: str | os.PathLike) -> None:
    """``os.makedirs(folder, exist_ok=True)`` with a one-line :class:`ImageIOError` on failure."""
    folder = os.fspath(folder)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        blocker = _blocking_file(os.path.abspath(folder))
        why = f"{blocker!r} is a file, not a folder" if blocker is not None else (e.strerror or str(e))
        raise ImageIOError(f"cannot create folder {folder!r}: {why}; pick another place") from None


# --------------------------------------------------------------------------------------- atomic writes


def _create_temp(path: str) -> tuple[int, str]:
    """A new hidden file next to ``path``, opened for writing: ``(fd, name)``. Mode 0666 less the umask
    (the kernel applies it), or ``path``'s own mode when it exists."""
    folder, name = os.path.split(os.path.abspath(path))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = os.path.join(folder, f".{name}.{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
        break
    else:  # pragma: no cover - 100 random names taken
        raise FileExistsError(17, "no free temporary file name", folder)
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError:  # a new file: the umask's mode stands
        return fd, tmp
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, mode)  # before any byte is written: never readable more widely than the old file
    except BaseException:
        os.close(fd)
        os.unlink(tmp)
        raise
    return fd, tmp


def _write_all(fd: int, data: bytes) -> None:
    """Write every byte of ``data`` to ``fd``, flush it to disk, close ``fd``."""
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)  # the bytes are on disk before the rename makes them the file
    finally:
        os.close(fd)


def _sync_folders(folders: Iterable[str]) -> None:
    """``fsync`` each folder so that the renames are on disk too; skipped where a folder cannot be opened
    or synced (some file systems, other platforms)."""
    for folder in folders:
        try:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)


def _write_error(path: str, e: OSError) -> ImageIOError:
    if isinstance(e, PermissionError):
        fix = "the folder is not writable; pick another place or fix its permissions"
    elif e.errno == 28:  # ENOSPC
        fix = "free some disk space"
    else:
        fix = "check the path, free space and permissions"
    return ImageIOError(f"cannot write {path!r} (nothing written): {e.strerror or e}; {fix}")


def atomic_write_all(files: Sequence[tuple[str | os.PathLike, bytes]]) -> None:
    """Write each ``(path, data)`` atomically: every temporary file is written and synced first, then
    they are renamed into place in order, so an error before the renames (no space, no rights) writes
    nothing at all. Raises :class:`ImageIOError` (one line) on an ``OSError``."""
    files = [(os.fspath(path), data) for path, data in files]
    for path, _ in files:
        check_writable(path)
    temps: list[str] = []
    renamed = 0
    current = files[0][0] if files else ""
    try:
        for current, data in files:
            fd, tmp = _create_temp(current)
            temps.append(tmp)
            _write_all(fd, data)
        for tmp, (current, _) in zip(temps, files):
            os.replace(tmp, current)
            renamed += 1
    except BaseException as e:
        for tmp in temps[renamed:]:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        if isinstance(e, OSError):
            raise _write_error(current, e) from None
        raise
    _sync_folders(dict.fromkeys(os.path.dirname(os.path.abspath(path)) for path, _ in files))


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` via a synced temporary file in the same folder and :func:`os.replace`."""
    atomic_write_all([(path, data)])


# ------------------------------------------------------------------------------------ encoding, drawing


def _opencv():
    """OpenCV with its logging silenced (the CLI's one-line errors are the only thing on stderr)."""
    os.environ.setdefault("OPENCV_LOG_LEVEL", "SILENT")
    import cv2

    cv2.utils.logging.setLogLevel(cv2.utils.logging.LOG_LEVEL_SILENT)
    return cv2


def encode_png(image: np.ndarray) -> bytes:
    """PNG bytes of an RGB(A)/gray uint8/uint16 array (fast zlib level 1)."""
    cv2 = _opencv()
    if image.ndim == 3 and image.shape[2] == 3:
        image = cv2.cvtColor(image, cv2.COLOR_RGB2BGR)
    elif image.ndim == 3 and image.shape[2] == 4:
        image = cv2.cvtColor(image, cv2.COLOR_RGBA2BGRA)
    ok, buf = cv2.imencode(".png", image, [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:  # pragma: no cover - OpenCV only fails on unsupported dtypes, excluded by callers
        raise ImageIOError(f"cannot encode a {image.dtype} {image.shape} array as PNG")
    return buf.tobytes()


def write_png(path: str | os.PathLike, image: np.ndarray) -> None:
    """Atomically write an RGB(A)/gray uint8/uint16 array as PNG."""
    atomic_write(path, encode_png(image))


def encode_mask_png(mask: np.ndarray) -> bytes:
    """PNG bytes of a boolean ``(H, W)`` change mask as 8-bit gray: changed 255, unchanged 0."""
    import numpy as np

    return encode_png(np.where(mask, np.uint8(255), np.uint8(0)))


def write_mask_png(path: str | os.PathLike, mask: np.ndarray) -> None:
    """Atomically write a boolean ``(H, W)`` change mask as an 8-bit PNG: changed 255, unchanged 0."""
    atomic_write(path, encode_mask_png(mask))


def write_json(path: str | os.PathLike, obj) -> None:
    """Atomically write ``obj`` as JSON (one object, newline-terminated)."""
    import json

    atomic_write(path, (json.dumps(obj) + "\n").encode())


OVERLAY_COLOR = (255, 0, 255)
"""Box colour on overlays (RGB magenta: rare in photos and screenshots)."""


def render_overlay(image: np.ndarray, boxes: Sequence[Sequence[int]]) -> np.ndarray:
    """Image ``image`` as 8-bit RGB with every inclusive ``(x0, y0, x1, y1)`` box drawn on it.

    16-bit input is scaled to 8 bits; gray becomes RGB; alpha is dropped so boxes stay visible on
    transparent areas. The line width grows with the image (1 px up to 500 px, 4 px at 4K).
    """
    import numpy as np

    cv2 = _opencv()
    img = image
    if img.dtype == np.uint16:
        img = (img >> 8).astype(np.uint8)
    if img.ndim == 2:
        img = np.repeat(img[:, :, None], 3, axis=2)  # (H, W, 3)
    img = np.array(img[:, :, :3], order="C", copy=True)  # (H, W, 3), our own copy to draw on
    thickness = max(1, min(img.shape[:2]) // 500)
    for x0, y0, x1, y1 in boxes:
        cv2.rectangle(img, (int(x0), int(y0)), (int(x1), int(y1)), OVERLAY_COLOR, thickness)
    return img

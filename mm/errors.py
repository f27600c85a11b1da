"""Errors a user can fix. CLIs print them as one line on stderr and exit 2."""

from __future__ import annotations

import errno
import os
import re
import traceback
from pathlib import Path


class UserError(Exception):
    """Bad input, config or state; the message says what, why and how to fix it."""


_WHY = {
    errno.ENOENT: "no such file or folder",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EISDIR: "it is a folder, a file was expected",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EEXIST: "it already exists",
    errno.ENOSPC: "no space left on the disk",
    errno.EROFS: "the file system is read-only",
    errno.ENOTEMPTY: "the folder is not empty",
    errno.ENAMETOOLONG: "the name is too long",
}

_FIX = {
    errno.ENOENT: "check the path",
    errno.ENOTDIR: "choose a path whose parents are folders",
    errno.EISDIR: "pass a file",
    errno.EACCES: "choose a folder you can write to, or fix its permissions",
    errno.EPERM: "choose a folder you can write to, or fix its permissions",
    errno.ENOSPC: "free some space or choose another disk",
    errno.EROFS: "choose a writable location",
}

# Functions of the standard library whose name says what was being done to the path.
_OPERATIONS = {
    "mkdir": "create folder", "makedirs": "create folder", "open": "open", "read_text": "read",
    "read_bytes": "read", "write_text": "write", "write_bytes": "write", "rename": "rename",
    "replace": "replace", "unlink": "delete", "rmdir": "delete folder", "rmtree": "delete folder",
    "_rmtree_safe_fd": "delete folder", "copyfile": "copy", "copy2": "copy", "link": "link",
    "symlink_to": "link", "mkstemp": "create a temporary file in", "mkdtemp": "create a temporary folder in",
    "iterdir": "list folder", "scandir": "list folder", "listdir": "list folder", "stat": "read",
    "touch": "create",
}  # fmt: skip


def _operation(e: OSError) -> str:
    """What was being done when ``e`` was raised: the innermost known call in its traceback.

    A Python-level call (``Path.mkdir``, ``shutil.rmtree``) shows as a frame's name; a builtin
    (``open``, ``os.replace``) only in the source line of the frame that called it.
    """
    for frame in reversed(traceback.extract_tb(e.__traceback__)):
        if frame.name in _OPERATIONS:
            return _OPERATIONS[frame.name]
        for name in reversed(re.findall(r"(\w+)\(", frame.line or "")):
            if name in _OPERATIONS:
                return _OPERATIONS[name]
    return "access"


def describe_os_error(e: OSError) -> str:
    """One line naming the operation, the path, why it failed and how to fix it."""
    if e.filename is None:
        return str(e) if str(e) else type(e).__name__
    path = os.fsdecode(e.filename)
    why = _WHY.get(e.errno or 0, e.strerror or type(e).__name__)
    target = f"{path} -> {os.fsdecode(e.filename2)}" if e.filename2 is not None else path
    fix = _FIX.get(e.errno or 0)
    return f"cannot {_operation(e)} {target}: {why}" + (f"; {fix}" if fix else "")


def check_out_path(out: str | Path) -> None:
    """Fail early, creating nothing, when ``out`` (a file or folder to write) cannot be made.

    Its nearest existing ancestor must be a folder the user can write to; ``out`` itself, if it is
    a folder, must be writable.
    """
    p = Path(out)
    if p.is_dir():
        if not os.access(p, os.W_OK | os.X_OK):
            raise UserError(
                f"--out {out}: folder {p} is not writable; choose another --out or fix its permissions"
            )
        return
    parent = p.parent
    while not parent.exists() and parent != parent.parent:
        if parent.is_symlink():  # a dangling link: mkdir would fail on it
            raise UserError(f"--out {out}: {parent} is a broken link; choose another --out")
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"--out {out}: {parent} is a file, not a folder; choose another --out")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(
            f"--out {out}: folder {parent} is not writable; choose another --out or fix its permissions"
        )

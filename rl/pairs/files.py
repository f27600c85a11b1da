"""Pairs on disk: JSONL written atomically, read back with errors that name ``file:line``."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from mm.errors import UserError
from rl.pairs.record import PreferencePair


def write_pairs(pairs: Sequence[PreferencePair], path: str | Path) -> Path:
    """Write pairs as JSONL atomically (temp file + rename): readers never see half a file."""
    p = Path(path)
    if not p.parent.is_dir():
        raise UserError(f"{p}: folder {p.parent} does not exist; create it first")
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for pair in pairs:
                f.write(json.dumps(pair.to_json(), ensure_ascii=False) + "\n")
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return p


def read_pairs(path: str | Path) -> list[PreferencePair]:
    """Read a pairs JSONL; a bad line raises :class:`UserError` naming ``file:line``."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p}: no such file; build pairs with `rl pairs`")
    out = []
    for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(PreferencePair.from_json(json.loads(line)))
        except (json.JSONDecodeError, ValueError, TypeError) as e:
            raise UserError(f"{p}:{i}: {e}") from None
    return out

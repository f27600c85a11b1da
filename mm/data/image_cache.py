"""Decoded images on disk, memory-mapped: a task file of many photos without holding them all in RAM.

    cache = ImageCache("cache/images")
    pixels = cache.get(path, "max_side=1024", lambda: read_image(path, 1024))   # (H, W, 3) uint8, read-only

The first ``get`` of a file decodes it (``make``) and writes the array as ``<key>.npy``; every later
``get``, in this process or another, maps that file instead of decoding again. The key is the sha256 of
the image file's bytes and ``how`` (the decoding settings), so an edited photo or other settings make a
new entry and a stale one is never read. Writes go through a temporary file and ``os.replace``: a run
killed mid-write leaves no half-written entry, and two runs sharing the folder agree. An entry that does
not load (a truncated disk, a file from elsewhere) is decoded and written again.

The mapped pages belong to the page cache: processes that read the same photos share them, and the
kernel drops them under memory pressure, where arrays in RAM would be the process's own.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from mm.errors import UserError

VERSION = "1"
"""Part of every key: bump it when the decoding changes, so old entries are not read."""


class ImageCache:
    """Content-addressed ``.npy`` files of decoded images in ``folder`` (module docstring)."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(
                f"cannot create the image cache folder {self.folder} ({e}); choose another"
            ) from None
        self.decoded = 0
        """How many ``get`` calls decoded (the rest mapped an entry)."""

    def key(self, path: str | Path, how: str) -> str:
        """The entry name of image file ``path`` decoded with settings ``how``."""
        h = hashlib.sha256(f"{VERSION}\0{how}\0".encode())
        h.update(Path(path).read_bytes())
        return h.hexdigest()

    def get(self, path: str | Path, how: str, make: Callable[[], np.ndarray]) -> np.ndarray:
        """``make()``'s array for this file and ``how``, memory-mapped read-only from the cache."""
        entry = self.folder / f"{self.key(path, how)}.npy"
        if entry.is_file():
            try:
                return np.load(entry, mmap_mode="r")
            except (OSError, ValueError):
                pass  # an unreadable entry: decode and write it again
        array = np.ascontiguousarray(make())
        self.decoded += 1
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=".npy")
        try:
            with os.fdopen(fd, "wb") as f:
                np.save(f, array)
            os.replace(tmp, entry)
        except OSError as e:
            Path(tmp).unlink(missing_ok=True)
            raise UserError(
                f"cannot write to the image cache {self.folder} ({e}); free space or choose another"
            ) from None
        return np.load(entry, mmap_mode="r")

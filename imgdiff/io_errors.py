"""The error every imgdiff file operation raises, shared by the readers and writers.

:mod:`imgdiff.io` (reading), :mod:`imgdiff.pair_rows` (a pair's rows) and :mod:`imgdiff.write`
(outputs) all raise :class:`ImageIOError`; it lives here, below all three, so that none of them
imports another for it. Imports nothing.
"""


class ImageIOError(Exception):
    """A file could not be read or written; the one-line message names the file, the problem and the fix."""


def read_error(path: str, problem: str, fix: str) -> ImageIOError:
    """The error for a file that cannot be read: ``cannot read 'a.png': <problem>; <fix>``."""
    return ImageIOError(f"cannot read {path!r}: {problem}; {fix}")

"""SIGTERM stops a command the way Ctrl-C does: by unwinding, not by dying on the spot.

    with sigterm_unwinds():
        run_the_command()

A job scheduler's stop, ``kill PID`` or ``timeout`` sends SIGTERM, whose default action ends the process
at once: ``finally`` blocks and ``with`` exits never run, so a staged output folder
(:func:`mm.data.format.staged_folder`) stays behind as ``.OUT-xxxx`` and a worker pool's processes keep
rendering until their chunk ends. Inside ``sigterm_unwinds`` SIGTERM raises ``SystemExit(143)`` (128 +
15, the shell's code for a process ended by SIGTERM) in the main thread, so every cleanup on the way out
runs and the exit code still says what happened. A process forked from inside the block inherits the
handler; in it SIGTERM keeps its default action, which is how ``multiprocessing.Pool.terminate`` stops
its workers. Outside the main thread (where handlers cannot be set) the block changes nothing.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

EXIT_CODE = 128 + signal.SIGTERM
"""The exit code of a command stopped by SIGTERM."""


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """Within the block, SIGTERM raises ``SystemExit(EXIT_CODE)`` in this process (module docstring)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a forked worker: die as SIGTERM's default would have it
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        raise SystemExit(EXIT_CODE)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

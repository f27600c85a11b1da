"""SIGTERM unwinds a command (mm.signals): cleanups run, staged outputs and worker pools do not outlive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mm.signals import EXIT_CODE, sigterm_unwinds


def test_sigterm_raises_system_exit_inside_and_default_after():
    before = signal.getsignal(signal.SIGTERM)
    cleaned = []
    with pytest.raises(SystemExit) as info:
        with sigterm_unwinds():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # the handler runs before this returns
            finally:
                cleaned.append(True)
    assert info.value.code == EXIT_CODE == 143
    assert cleaned == [True]
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_forked_child_dies_as_by_default():
    with sigterm_unwinds():
        pid = os.fork()
        if pid == 0:  # the child: wait to be killed; exit 0 would mean the signal was swallowed
            time.sleep(30)
            os._exit(0)
        time.sleep(0.2)
        os.kill(pid, signal.SIGTERM)
        _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM


def _children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(c) for c in text.split()]


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state not in ("Z", "X")


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")
def test_world_export_stopped_by_sigterm_leaves_no_staging_folder_and_no_workers(tmp_path):
    out = tmp_path / "photos"
    cmd = [sys.executable, "-m", "rl.agent.world_export", "--out", str(out), "--notes", "4000"]
    cmd += ["--workers", "2"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        staged: list[Path] = []
        while time.monotonic() < deadline and proc.poll() is None:
            staged = list(tmp_path.glob(".photos-*"))
            workers = _children(proc.pid)
            if len(workers) >= 2 and staged and any((staged[0] / "images").glob("*.png")):
                break
            time.sleep(0.1)
        assert proc.poll() is None and len(workers) >= 2 and staged, "the export did not get going"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == EXIT_CODE, err
    assert not out.exists()
    assert not list(tmp_path.iterdir()), "the staging folder was left behind"
    deadline = time.monotonic() + 10
    while any(_running(w) for w in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(w) for w in workers), "workers (or the tracker) outlived the command"


def configure(parser):  # this module doubles as a dispatch command: stop yourself mid-write
    parser.add_argument("--out", required=True)


def run(args):
    from mm.data.format import staged_folder

    with staged_folder(args.out) as tmp:
        (tmp / "part.txt").write_text("half")
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    return 0


def test_dispatch_unwinds_a_command_on_sigterm(tmp_path):
    from mm.dispatch import dispatch

    before = signal.getsignal(signal.SIGTERM)
    out = tmp_path / "notes"
    with pytest.raises(SystemExit) as info:
        dispatch("mm", "test", {"stop": (__name__, "stops itself")}, ["stop", "--out", str(out)])
    assert info.value.code == EXIT_CODE
    assert not list(tmp_path.iterdir()), "the staged folder outlived the command"
    assert signal.getsignal(signal.SIGTERM) is before

"""The shared CLI dispatch: help lists every command, user errors are one line and exit 2."""

import subprocess
import sys

import pytest

from mm.cli import COMMANDS as MM_COMMANDS
from mm.cli import main as mm_main
from rl.cli import COMMANDS as RL_COMMANDS


@pytest.mark.parametrize("pkg, commands", [("mm", MM_COMMANDS), ("rl", RL_COMMANDS)])
def test_help_lists_every_command_without_importing_torch(pkg, commands):
    code = (
        f"import sys; from {pkg}.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('TORCH' if 'torch' in sys.modules else 'NOTORCH')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    for name in commands:
        assert name in out
    assert out.strip().endswith("NOTORCH")


def test_user_error_is_one_line_and_exit_2(tmp_path, capsys):
    rc = mm_main(
        ["eval", "chair", "--captions", str(tmp_path / "nope.json"), "--objects", str(tmp_path / "o.json")]
    )
    assert rc == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mm eval")

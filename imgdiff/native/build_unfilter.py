"""Rebuild ``unfilter_x86_64.hex`` from ``unfilter.c`` (a developer's tool; needs gcc and binutils).

``python -m imgdiff.native.build_unfilter``

The C source is compiled for baseline x86-64 (SSE2) into one ``.text`` section, which is checked to
hold nothing that would need a loader: no relocation, no other section with bytes (data, constants,
jump tables), no call, and the one function at offset 0. The section's bytes are written as hex
below two header lines: the SHA-256 of the source, which ``tests/imgdiff`` compares with the source
so that the two cannot drift apart, and the compiler's version (with the same gcc, the tests rebuild
the code and compare it byte for byte).
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "unfilter.c")
OUTPUT = os.path.join(HERE, "unfilter_x86_64.hex")
SYMBOL = "imgdiff_unfilter"
CFLAGS = (
    "-O2", "-march=x86-64", "-fPIC", "-ffreestanding", "-fno-builtin", "-fno-jump-tables",
    "-fno-asynchronous-unwind-tables", "-fno-stack-protector", "-fcf-protection=none",
    "-fno-reorder-blocks-and-partition",
)  # fmt: skip
"""gcc flags: position-independent code with no tables, no unwind data, no stack checks, no calls."""


def source_digest(path: str = SOURCE) -> str:
    """SHA-256 (hex) of the C source, as recorded in the header of the hex file."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def compiler() -> str:
    """First line of ``gcc --version``, as recorded in the header of the hex file."""
    return _run("gcc", "--version").splitlines()[0].strip()


def _run(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def build() -> bytes:
    """The machine code of ``unfilter.c``; raises RuntimeError when it would need a loader."""
    with tempfile.TemporaryDirectory() as tmp:
        obj, text = os.path.join(tmp, "unfilter.o"), os.path.join(tmp, "unfilter.bin")
        _run("gcc", *CFLAGS, "-c", "-o", obj, SOURCE)
        if "R_X86_64" in _run("objdump", "-r", obj):
            raise RuntimeError("the code has relocations: it would need a loader")
        sized = re.findall(r"^\s*\d+\s+(\S+)\s+([0-9a-f]+)\s", _run("objdump", "-h", obj), re.MULTILINE)
        extra = [name for name, size in sized if int(size, 16) and name not in (".text", ".comment")]
        extra = [name for name in extra if not name.startswith(".note")]
        if extra:
            raise RuntimeError(f"sections other than .text hold bytes: {extra}")
        if re.search(r"\bcall|jmp\s+\*", _run("objdump", "-d", obj)):
            raise RuntimeError("the code calls out (a libc builtin or a jump table)")
        if not re.search(rf"^0+ T {SYMBOL}$", _run("nm", obj), re.MULTILINE):
            raise RuntimeError(f"{SYMBOL} is not the first function of .text")
        _run("objcopy", "-O", "binary", "--only-section=.text", obj, text)
        with open(text, "rb") as f:
            return f.read()


def main() -> int:
    code = build()
    lines = [code[i : i + 32].hex() for i in range(0, len(code), 32)]
    with open(OUTPUT, "w") as f:
        f.write(f"# sha256 of unfilter.c: {source_digest()}\n# compiler: {compiler()}\n")
        f.write("\n".join(lines) + "\n")
    print(f"wrote {len(code)} bytes of machine code to {OUTPUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A bench row's command line refusing a bad option, as a user meets it: :func:`refused`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def refused(module: str, options: list[str], out: Path) -> str:
    """Run ``python -m module *options --json out``; assert it was refused as a usage error
    (exit 2, one line on stderr, no traceback, nothing run nor written); the line."""
    done = subprocess.run(
        [sys.executable, "-m", module, *options, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, lines
    assert done.stdout == "" and not out.exists()  # nothing ran, nothing was written
    return lines[0]

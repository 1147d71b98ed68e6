"""A/B of the lifecycle row: this checkout's ``MultiConnector`` against another version's, in one
process, interleaved (the ``ab_loop`` way, for the core)::

    git worktree add /tmp/before REV
    .venv/bin/python -m bench.ab_lifecycle /tmp/before

The other checkout's package is copied under another name and loaded beside this one; both run
the lifecycle row's loop (``bench.run.lifecycles_ours``: begin, request_finished, three reports,
take) on 2,000 ids, alternating which goes first, in CPU time. It prints the median ratio
other ÷ this checkout, with its interquartile range (above 1: this checkout is faster).
"""

from __future__ import annotations

import argparse
import importlib
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

from .baselines import TrivialConnector
from .common import NAMES
from .run import lifecycles_ours


def _load_as(checkout: Path, name: str, into: Path) -> ModuleType:
    """The ``multiconnector`` package of ``checkout``, imported as ``name``."""
    target = into / name
    shutil.copytree(checkout / "multiconnector", target)
    for path in target.rglob("*.py"):
        text = path.read_text()
        renamed = re.sub(r"\b(from|import) multiconnector\b", rf"\1 {name}", text)
        if renamed != text:
            path.write_text(renamed)
    sys.path.insert(0, str(into))
    return importlib.import_module(name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab_lifecycle", description=__doc__)
    parser.add_argument("other", type=Path, help="a checkout of another version")
    parser.add_argument("--repeats", type=int, default=60)
    args = parser.parse_args(argv)
    import multiconnector as this  # noqa: PLC0415 - beside the other, after argument checks

    with tempfile.TemporaryDirectory() as tmp:
        other = _load_as(args.other, "mc_ab_other", Path(tmp))
        ids = [f"life-{i}" for i in range(2000)]
        runs = {}
        for label, package in (("other", other), ("this", this)):
            registry = package.ConnectorRegistry({n: TrivialConnector(n) for n in NAMES})
            runs[label] = lifecycles_ours(package.MultiConnector(registry), ids)
            runs[label]()  # warm up
        ratios = []
        for k in range(args.repeats):
            took = {}
            for label in ("other", "this") if k % 2 else ("this", "other"):
                start = time.process_time()
                runs[label]()
                took[label] = time.process_time() - start
            ratios.append(took["other"] / took["this"])
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    print(
        f"{args.other} ÷ this checkout: {statistics.median(ratios):.3f} (IQR {q1:.3f}-{q3:.3f}), "
        f"{args.repeats} interleaved repeats of {len(ids):,} lifecycles, CPU time"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Mutation testing of the core with mutmut: ``make mutate`` (see docs/mutation.md).

Runs mutmut (configured under ``[tool.mutmut]`` in pyproject.toml) in a fresh copy of the project
under ``build/mutate``, one module at a time, and writes ``build/mutation.json`` and a readable
``build/mutation.txt``: per module the mutants, killed, survived, timed out, the survivors listed
in docs/mutation.md as equivalent (with their reason) and the survivors nobody explained. A mutant
is killed only by a failing test: one whose tests ended in a collection or internal error of
pytest is an error, not a kill. Exits 1 when a survivor is unexplained or a mutant is an error, 2
on a bad argument.

    python tools/mutate.py                  # machine, _table, health, rule, params, registry,
                                            # aggregator
    python tools/mutate.py --module params  # one module
    python tools/mutate.py --module aggregator  # the whole subpackage multiconnector/aggregator/
    python tools/mutate.py --report-only    # the report again, after re-testing some mutants
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

try:  # the mutate extra
    from mutmut import __version__ as MUTMUT_VERSION
    from mutmut.stats import status_by_exit_code
except ImportError:  # pragma: no cover - said in main()
    MUTMUT_VERSION = None

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("machine", "_table", "health", "rule", "params", "registry", "aggregator")
#: A row of the equivalent-mutants table in docs/mutation.md: | `mutant name` | reason |
EQUIVALENT_ROW = re.compile(r"^\|\s*`(multiconnector\.[^`]+__mutmut_\d+)`\s*\|(.+)\|\s*$")
#: The status of a mutant whose tests ended without a verdict (see NOT_A_VERDICT).
ERROR = "error (no test verdict)"
#: mutmut's statuses, as this report groups them.
GROUPS = {
    "killed": "killed",
    "caught by type check": "killed",
    "survived": "survived",
    "timeout": "timed_out",
    "no tests": "no_tests",
    "not checked": "not_checked",
    ERROR: "errors",
}
#: pytest's exit codes that are no test's verdict: 2 (interrupted, as by an error while
#: collecting) and 3 (an internal error, which mutmut counts as killed). A mutant whose tests
#: ended so is neither killed nor survived: it is an error, and the report fails.
NOT_A_VERDICT = frozenset({2, 3})


def equivalents(doc: Path) -> dict[str, str]:
    """The mutants docs/mutation.md explains as equivalent, each with its reason."""
    found: dict[str, str] = {}
    if doc.exists():
        for line in doc.read_text(encoding="utf-8").splitlines():
            match = EQUIVALENT_ROW.match(line)
            if match:
                found[match.group(1)] = match.group(2).strip()
    return found


def prepare(work: Path) -> None:
    """A fresh copy of what the oracle needs: the package, the tests, the docs some tests read
    (``also_copy`` in ``[tool.mutmut]`` copies them on into ``mutants/``), the configuration."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis")
    for name in ("multiconnector", "tests", "docs"):
        shutil.copytree(ROOT / name, work / name, ignore=ignore)
    shutil.copy2(ROOT / "pyproject.toml", work / "pyproject.toml")


def mutmut(work: Path, *args: str, capture: bool = False) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the mutants, never the sources, are imported
    env["HYPOTHESIS_PROFILE"] = "mutate"
    # A planted bug whose source line a mutant changed is skipped, not an error (see
    # tests/broken_aggregators.py): a mutant is killed only by a test that fails.
    env["MULTICONNECTOR_MUTATING"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "mutmut", *args],
        cwd=work,
        env=env,
        text=True,
        capture_output=capture,
        check=False,
    )


def sources(module: str) -> str:
    """What ``module`` names under ``multiconnector/``: a file, or a subpackage's folder."""
    return f"{module}/" if (ROOT / "multiconnector" / module).is_dir() else f"{module}.py"


def statuses(work: Path, module: str) -> dict[str, str]:
    """Each mutant of ``module`` (every file of it, when a subpackage) and mutmut's status."""
    base = work / "mutants" / "multiconnector"
    folder = base / module
    metas = sorted(folder.glob("*.py.meta")) if folder.is_dir() else [base / f"{module}.py.meta"]
    codes: dict[str, int | None] = {}
    for meta in metas:
        if meta.exists():
            codes.update(json.loads(meta.read_text())["exit_code_by_key"])
    return {
        name: ERROR if code in NOT_A_VERDICT else status_by_exit_code[code]
        for name, code in sorted(codes.items())
    }


def report_module(
    work: Path, module: str, seconds: float, explained: dict[str, str]
) -> dict[str, Any]:
    found = statuses(work, module)
    groups = Counter(GROUPS.get(status, "other") for status in found.values())
    survivors = [name for name, status in found.items() if status == "survived"]
    equivalent = {name: explained[name] for name in survivors if name in explained}
    unexplained = [name for name in survivors if name not in explained]
    diffs = {name: mutmut(work, "show", name, capture=True).stdout.strip() for name in unexplained}
    return {
        "mutants": len(found),
        "killed": groups["killed"],
        "survived": groups["survived"],
        "timed_out": groups["timed_out"],
        "no_tests": groups["no_tests"],
        "not_checked": groups["not_checked"],
        "errors": groups["errors"],
        "other": groups["other"],
        "equivalent": len(equivalent),
        "unexplained": len(unexplained),
        "seconds": round(seconds, 1),
        "equivalent_mutants": equivalent,
        "unexplained_mutants": diffs,
        "error_mutants": [name for name, status in found.items() if status == ERROR],
    }


def summary(result: dict[str, Any]) -> str:
    head = f"{'module':<12}{'mutants':>9}{'killed':>8}{'timeout':>9}{'equiv.':>8}"
    head += f"{'unexpl.':>9}{'other':>7}{'time (s)':>10}"
    lines = [f"mutmut {result['mutmut']}, {result['max_children']} worker(s)", head]
    for module, m in result["modules"].items():
        other = m["no_tests"] + m["not_checked"] + m["errors"] + m["other"]
        lines.append(
            f"{module:<12}{m['mutants']:>9}{m['killed']:>8}{m['timed_out']:>9}"
            f"{m['equivalent']:>8}{m['unexplained']:>9}{other:>7}{m['seconds']:>10}"
        )
    for module, m in result["modules"].items():
        for name, diff in m["unexplained_mutants"].items():
            lines += ["", f"unexplained survivor in {module}: {name}", diff]
    for module, m in result["modules"].items():
        for name in m["error_mutants"]:
            lines += ["", f"no test verdict (pytest error, not a failing test) in {module}: {name}"]
    verdict = result["unexplained"]
    lines += ["", f"{verdict} unexplained survivor(s)" if verdict else "no unexplained survivor"]
    if result["errors"]:
        lines.append(f"{result['errors']} mutant(s) without a test verdict")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", action="append", choices=MODULES, help="repeatable")
    parser.add_argument("--max-children", type=int, default=1, help="mutmut workers (default 1)")
    parser.add_argument("--build", type=Path, default=ROOT / "build")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="no mutmut run: report on the mutants already in BUILD/mutate (after re-testing "
        "some with `mutmut run NAME...` there), each module's time taken from the last report",
    )
    args = parser.parse_args(argv)
    if args.max_children < 1:
        parser.error(f"--max-children={args.max_children} must be at least 1")
    if MUTMUT_VERSION is None:
        print("mutmut is missing: install the mutate extra (make mutate does)", file=sys.stderr)
        return 2
    modules = tuple(args.module or MODULES)
    work = args.build / "mutate"
    explained = equivalents(ROOT / "docs" / "mutation.md")
    result: dict[str, Any] = {"mutmut": MUTMUT_VERSION, "max_children": args.max_children}
    result["modules"] = {}
    if args.report_only:
        if not (work / "mutants").is_dir():
            print(f"--report-only: no mutmut run in {work} to report on", file=sys.stderr)
            return 2
        last = args.build / "mutation.json"
        before = json.loads(last.read_text())["modules"] if last.exists() else {}
        for module in modules:
            seconds = before.get(module, {}).get("seconds", 0.0)
            result["modules"][module] = report_module(work, module, seconds, explained)
        return write_report(args.build, result)
    prepare(work)
    for module in modules:
        print(f"== mutating multiconnector/{sources(module)}", flush=True)
        started = time.monotonic()
        done = mutmut(
            work, "run", "--max-children", str(args.max_children), f"multiconnector.{module}.*"
        )
        seconds = time.monotonic() - started
        if done.returncode != 0:
            print(f"mutmut run failed for {module} (exit {done.returncode})", file=sys.stderr)
            return done.returncode
        result["modules"][module] = report_module(work, module, seconds, explained)
    return write_report(args.build, result)


def write_report(build: Path, result: dict[str, Any]) -> int:
    """Write build/mutation.json and build/mutation.txt, print the summary, and give the exit
    status: 1 when a survivor is unexplained or a mutant's tests ended without a verdict."""
    result["unexplained"] = sum(m["unexplained"] for m in result["modules"].values())
    result["errors"] = sum(m["errors"] for m in result["modules"].values())
    build.mkdir(parents=True, exist_ok=True)
    (build / "mutation.json").write_text(json.dumps(result, indent=2) + "\n")
    text = summary(result)
    (build / "mutation.txt").write_text(text)
    print(text, end="")
    return 1 if result["unexplained"] or result["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())

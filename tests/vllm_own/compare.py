"""Compare the runs of vLLM's own ``test_multi_connector.py`` (``make test-vllm-own``).

``python tests/vllm_own/compare.py RESULTS`` reads ``RESULTS/<label>-vllm.xml`` and
``RESULTS/<label>-ours.xml`` (pytest's JUnit XML) for every label (a vLLM version), prints what
each class passed, failed, skipped and xfailed, and exits 1 unless, for every label, every test
that passes for vLLM's class passes for ours or is a strict xfail of ours (a private contract we
refuse: docs/vllm.md, "vLLM's own tests"), and ours fails no test that vLLM's class passes.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed")


def outcomes(junit: Path) -> dict[str, str]:
    """Each test case's outcome (one of :data:`OUTCOMES`), by ``classname::name``."""
    found: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag: child for child in case}
        if "error" in kinds:
            found[test] = "error"
        elif "failure" in kinds:
            found[test] = "failed"
        elif "skipped" in kinds:
            xfail = kinds["skipped"].get("type") == "pytest.xfail"
            found[test] = "xfailed" if xfail else "skipped"
        else:
            found[test] = "passed"
    return found


def shortfalls(vllm: dict[str, str], ours: dict[str, str]) -> list[str]:
    """The tests vLLM's class passes that ours neither passes nor xfails (strictly)."""
    return sorted(
        f"{test}: {ours.get(test, 'not run')} for ours"
        for test, outcome in vllm.items()
        if outcome == "passed" and ours.get(test) not in ("passed", "xfailed")
    )


def summary(found: dict[str, str]) -> str:
    counts = Counter(found.values())
    return ", ".join(f"{counts[o]} {o}" for o in OUTCOMES if counts[o])


def main(argv: list[str]) -> int:
    results = Path(argv[1])
    labels = sorted(p.name.removesuffix("-vllm.xml") for p in results.glob("*-vllm.xml"))
    if not labels:
        print(f"no runs in {results}", file=sys.stderr)
        return 1
    missing: list[str] = []
    for label in labels:
        vllm = outcomes(results / f"{label}-vllm.xml")
        ours = outcomes(results / f"{label}-ours.xml")
        print(f"{label}: vLLM's class: {summary(vllm)}; ours: {summary(ours)}")
        missing += [f"{label}: {line}" for line in shortfalls(vllm, ours)]
    for line in missing:
        print(f"  passes for vLLM's class only: {line}", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

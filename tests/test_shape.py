"""The package's shape, held: no function past 80 lines, no module past 800.

A function that long is several decisions in one (the checker's ``explore`` took 27 parameters
before its :class:`~multiconnector.SearchConfig`); a module that long is several concepts in
one (the vLLM scheduler's lookups became :mod:`multiconnector.vllm.lookups`). Docstrings count:
a docstring that needs more room belongs in the docs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "multiconnector"
MODULES = sorted(PACKAGE.rglob("*.py"))
MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 800


def _functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        (node.name, node.end_lineno - node.lineno + 1)  # type: ignore[operator]
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]


def test_the_package_is_read() -> None:
    assert len(MODULES) > 50
    assert "check_aggregator" in dict(_functions(PACKAGE / "check" / "run.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_function_is_longer_than_80_lines(path: Path) -> None:
    long = [(name, n) for name, n in _functions(path) if n > MAX_FUNCTION_LINES]
    assert long == []


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_is_longer_than_800_lines(path: Path) -> None:
    assert len(path.read_text(encoding="utf-8").splitlines()) <= MAX_MODULE_LINES

"""Each decision of :mod:`multiconnector.rule` is made there alone: a check of the package's
source, read with :mod:`ast`.

The decisions checked: refining a stranger's ``phantom`` report (``unknown_connector``,
``not_ready``), the capped counter (:data:`~multiconnector.rule.COUNTER_LIMIT`, and counting
under an ``(outcome, name)`` key), "the load is still owed" (a test of a record's ``loaded`` or
``loader_gone``) and "safe to hand back" (a test that reads what a record awaits, or its load
being in flight, together with its loader). ``rule.py`` makes them; ``outcome.py`` and
``machine.py`` define what they read (``machine.load_owed`` is beside the record whose
``in_flight`` reads it). ``check/reference.py`` is the model checker's independent oracle and
restates the refinement on purpose; the rest of ``check/`` keeps the checker's own ledger and
expected counts (uncapped, over a bounded alphabet), restated on purpose too, to catch ours.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "multiconnector"

#: Where each decision is made or defined.
DECIDERS = frozenset({"rule.py", "outcome.py", "machine.py"})
ORACLE = "check/reference.py"
CHECKER = "check/"


def modules(root: Path = PACKAGE) -> Iterator[tuple[str, ast.Module]]:
    for path in sorted(root.rglob("*.py")):
        yield path.relative_to(root).as_posix(), ast.parse(path.read_text(), str(path))


def _attribute(node: ast.AST) -> str | None:
    return node.attr if isinstance(node, ast.Attribute) else None


def _names(node: ast.AST) -> set[str]:
    """The attribute and variable names read anywhere in ``node``."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute):
            found.add(sub.attr)
        elif isinstance(sub, ast.Name):
            found.add(sub.id)
    return found


def _record_fields(node: ast.AST) -> set[str]:
    """The fields of a ``record`` that ``node`` reads itself: not the arguments of a call (a
    call of the rule's predicates hands them over)."""
    if isinstance(node, ast.Call):
        return set()
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "record"
    ):
        return {node.attr}
    found: set[str] = set()
    for child in ast.iter_child_nodes(node):
        found |= _record_fields(child)
    return found


def _tests(tree: ast.Module) -> Iterator[ast.AST]:
    """The expressions ``tree`` tests for truth: if/while/ternary/assert tests, the operands of
    ``and``/``or`` and of ``not``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If | ast.While | ast.IfExp | ast.Assert):
            yield node.test
        elif isinstance(node, ast.BoolOp):
            yield node
            yield from node.values
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node.operand


def refinements(relative: str, tree: ast.Module) -> list[str]:
    """Outcomes of the refinement built outside the rule."""
    if relative in DECIDERS or relative == ORACLE:
        return []
    return [
        f"{relative}:{node.lineno} Outcome.{node.attr}"
        for node in ast.walk(tree)
        if _attribute(node) in {"unknown_connector", "not_ready"}
        and isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "Outcome"
    ]


def _outcome_key(node: ast.AST) -> bool:
    """Whether ``node`` builds ``(outcome, <name>)``."""
    return (
        isinstance(node, ast.Tuple)
        and len(node.elts) == 2
        and isinstance(node.elts[0], ast.Name)
        and node.elts[0].id == "outcome"
    )


def counters(relative: str, tree: ast.Module) -> list[str]:
    """Capped counting outside the rule: COUNTER_LIMIT read, or a count kept under an
    ``(outcome, name)`` key built here (a subscript's key, or a variable ``key``)."""
    if relative in DECIDERS or relative.startswith(CHECKER):
        return []
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Name) and node.id == "COUNTER_LIMIT") or (
            isinstance(node, ast.Attribute) and node.attr == "COUNTER_LIMIT"
        ):
            found.append(f"{relative}:{node.lineno} COUNTER_LIMIT")
        keyed = (isinstance(node, ast.Subscript) and _outcome_key(node.slice)) or (
            isinstance(node, ast.Assign)
            and _outcome_key(node.value)
            and any(isinstance(t, ast.Name) and t.id == "key" for t in node.targets)
        )
        if keyed:
            found.append(f"{relative}:{node.lineno} an (outcome, name) counter key")
    return found


def owed(relative: str, tree: ast.Module) -> list[str]:
    """Tests of "the load is still owed" (a record's ``loaded`` or ``loader_gone``) and of
    "safe to hand back" (``awaiting`` or ``in_flight`` tested with ``loader``) outside the
    rule."""
    if relative in DECIDERS or relative.startswith(CHECKER):
        return []
    found = []
    for test in _tests(tree):
        attributes = _record_fields(test)
        if attributes & {"loaded", "loader_gone"}:
            found.append(f"{relative}:{getattr(test, 'lineno', 0)} a load owed, tested here")
        elif "loader" in attributes and attributes & {"awaiting", "in_flight"}:
            found.append(f"{relative}:{getattr(test, 'lineno', 0)} safe to hand back, tested here")
    return sorted(set(found))


def violations(root: Path = PACKAGE) -> list[str]:
    found: list[str] = []
    for relative, tree in modules(root):
        found += refinements(relative, tree) + counters(relative, tree) + owed(relative, tree)
    return found


def test_the_refinement_of_a_strangers_report_is_the_rules() -> None:
    assert [v for r, t in modules() for v in refinements(r, t)] == []


def test_the_capped_counter_is_the_rules() -> None:
    assert [v for r, t in modules() for v in counters(r, t)] == []


def test_owed_and_safe_to_hand_back_are_the_rules() -> None:
    assert [v for r, t in modules() for v in owed(r, t)] == []


def test_the_check_sees_the_restatements_it_forbids() -> None:
    """Each check finds what it looks for, on a module written the way the package's were."""
    source = """
def stranger(entry):
    return Outcome.unknown_connector if entry is None else Outcome.not_ready

def tally(counts, outcome, name):
    key = (outcome, name)
    if len(counts) >= COUNTER_LIMIT:
        key = (outcome, OTHER_NAMES)
    counts[key] = counts.get(key, 0) + 1

def pending(record):
    return record.loader is not None and not record.loaded

def settle(record, done):
    if completes and (record.loader is None or not record.in_flight):
        done.append(record)
"""
    tree = ast.parse(source)
    assert len(refinements("m.py", tree)) == 2
    assert len(counters("m.py", tree)) == 3
    assert [v.split(" ", 1)[1] for v in owed("m.py", tree)] == [
        "a load owed, tested here",
        "safe to hand back, tested here",
    ]
    assert violations(PACKAGE) == []

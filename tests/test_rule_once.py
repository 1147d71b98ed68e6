"""Each decision of :mod:`multiconnector.rule` is made there alone: a check of the package's
source, read with :mod:`ast`.

The decisions checked: refining a stranger's ``phantom`` report (``unknown_connector``,
``not_ready``), the capped counter (:data:`~multiconnector.rule.COUNTER_LIMIT`, and counting
under an ``(outcome, name)`` key), "the load is still owed" (a test of a record's ``loaded`` or
``loader_gone``) and "safe to hand back" (a test that reads what a record awaits, or its load
being in flight, together with its loader), an outcome chosen by a conditional (``Outcome.x if
... else Outcome.y``: a decision of the rule's, restated), a ``DECISIONS`` entry applied
(``rule.decide`` applies them all) and "in flight" spelled again (``machine.in_flight_of`` is
its one spelling, read by ``rule.safe_to_hand_back`` and the record's ``in_flight``).
``rule.py`` makes them; ``outcome.py`` and ``machine.py`` define what they read
(``machine.load_owed`` is beside the record whose ``in_flight`` reads it).
``check/reference.py`` is the model checker's independent oracle and restates the refinement
and the outcomes on purpose (as the workload simulation, ``_workload/``, restates the outcomes
it expects); the rest of ``check/`` keeps the checker's own ledger and expected counts
(uncapped, over a bounded alphabet), restated on purpose too, to catch ours.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable, Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "multiconnector"

#: Where each decision is made or defined.
DECIDERS = frozenset({"rule.py", "outcome.py", "machine.py"})
ORACLE = "check/reference.py"
#: The oracles, which restate the rule's decisions on purpose, to catch ours.
ORACLES = frozenset({ORACLE})
#: The workload simulation (``multiconnector simulate``), whose expectations are an oracle too.
SIMULATION = "_workload/"
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


def _read(node: ast.AST) -> set[str]:
    """The attribute and variable names ``node`` reads itself: not in the arguments of a call
    (handing fields to the rule's predicates is not restating them), but a function called."""
    if isinstance(node, ast.Call):
        return _read(node.func)
    if isinstance(node, ast.Attribute):
        return {node.attr} | _read(node.value)
    if isinstance(node, ast.Name):
        return {node.id}
    found: set[str] = set()
    for child in ast.iter_child_nodes(node):
        found |= _read(child)
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


def _is_outcome(node: ast.AST, aliases: Collection[str]) -> bool:
    """Whether ``node`` is an outcome: ``Outcome.<member>``, a name the package binds to one
    (``_APPLIED``), or a conditional choosing between such."""
    if isinstance(node, ast.Attribute):
        return isinstance(node.value, ast.Name) and node.value.id == "Outcome"
    if isinstance(node, ast.Name):
        return node.id in aliases
    if isinstance(node, ast.IfExp):
        return _is_outcome(node.body, aliases) and _is_outcome(node.orelse, aliases)
    return False


def outcome_aliases(trees: Iterable[ast.Module]) -> frozenset[str]:
    """The module-level names bound to an outcome (``_APPLIED: Final = Outcome.applied``):
    another module imports them by these names."""
    found: set[str] = set()
    for tree in trees:
        for node in tree.body:
            value = getattr(node, "value", None)
            if isinstance(node, ast.Assign | ast.AnnAssign) and value and _is_outcome(value, ()):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found |= {t.id for t in targets if isinstance(t, ast.Name)}
    return frozenset(found)


def restated_outcomes(
    relative: str, tree: ast.Module, aliases: Collection[str] = frozenset()
) -> list[str]:
    """An outcome chosen by a conditional outside the rule (``Outcome.unknown_request if owing
    is None else Outcome.phantom``): a decision of the rule's, restated. The oracles restate
    them on purpose: the checker's reference and the workload simulation's expectations."""
    if relative in DECIDERS or relative in ORACLES or relative.startswith(SIMULATION):
        return []
    known = aliases or outcome_aliases([tree])
    return [
        f"{relative}:{node.lineno} an outcome chosen here"
        for node in ast.walk(tree)
        if isinstance(node, ast.IfExp) and _is_outcome(node, known)
    ]


def decisions_applied(relative: str, tree: ast.Module) -> list[str]:
    """A ``DECISIONS`` entry applied outside the rule (``rule.decide``): ``machine.step``
    called, an entry read for a state (``DECISIONS[event][state]``), or a guard unpacked from an
    entry and called (``guard, yes, no = ...[state]``, then ``guard(record, arg)``)."""
    if relative in DECIDERS or relative in ORACLES:
        return []
    unpacked: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Subscript)
            and any(isinstance(t, ast.Tuple) for t in node.targets)
        ):
            unpacked |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    lines = []
    for node in ast.walk(tree):
        called = isinstance(node, ast.Call) and (
            (isinstance(node.func, ast.Name) and node.func.id in unpacked | {"step"})
            or _attribute(node.func) == "step"
        )
        read = (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Subscript)
            and "DECISIONS" in _names(node.value.value)
        )
        if called or read:
            lines.append(getattr(node, "lineno", 0))
    return [f"{relative}:{line} a decision applied here" for line in sorted(lines)]


def in_flight_spelled(relative: str, tree: ast.Module) -> list[str]:
    """ "In flight" (the half of "safe to hand back" a record's fields decide) spelled outside
    ``machine.in_flight_of``: a test that reads what a request awaits together with what its
    load owes (``parts_owed``, ``loading``, ``load_owed``, ``loaded``, ``loader_gone``)."""
    if relative == "machine.py" or relative.startswith(CHECKER):
        return []
    found = []
    for test in _tests(tree):
        names = _read(test)
        if "awaiting" in names and names & {
            "parts_owed",
            "loading",
            "load_owed",
            "loaded",
            "loader_gone",
        }:
            found.append(f"{relative}:{getattr(test, 'lineno', 0)} in flight, spelled here")
    return sorted(set(found))


def violations(root: Path = PACKAGE) -> list[str]:
    found: list[str] = []
    trees = list(modules(root))
    aliases = outcome_aliases(tree for _, tree in trees)
    for relative, tree in trees:
        found += refinements(relative, tree) + counters(relative, tree) + owed(relative, tree)
        found += restated_outcomes(relative, tree, aliases) + decisions_applied(relative, tree)
        found += in_flight_spelled(relative, tree)
    return found


def test_the_refinement_of_a_strangers_report_is_the_rules() -> None:
    assert [v for r, t in modules() for v in refinements(r, t)] == []


def test_the_capped_counter_is_the_rules() -> None:
    assert [v for r, t in modules() for v in counters(r, t)] == []


def test_owed_and_safe_to_hand_back_are_the_rules() -> None:
    assert [v for r, t in modules() for v in owed(r, t)] == []


def test_outcomes_are_chosen_by_the_rule() -> None:
    trees = list(modules())
    aliases = outcome_aliases(tree for _, tree in trees)
    assert [v for r, t in trees for v in restated_outcomes(r, t, aliases)] == []


def test_decisions_are_applied_by_the_rule() -> None:
    assert [v for r, t in modules() for v in decisions_applied(r, t)] == []


def test_in_flight_is_spelled_once() -> None:
    assert [v for r, t in modules() for v in in_flight_spelled(r, t)] == []


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
    assert len(restated_outcomes("m.py", tree)) == 1  # the refinement, chosen here too
    assert decisions_applied("m.py", tree) == []
    assert len(refinements("m.py", tree)) == 2
    assert len(counters("m.py", tree)) == 3
    assert [v.split(" ", 1)[1] for v in owed("m.py", tree)] == [
        "a load owed, tested here",
        "safe to hand back, tested here",
    ]
    assert violations(PACKAGE) == []


def test_the_check_sees_the_restated_decisions_it_forbids() -> None:
    """The restatements issue 47 found, each planted as the package had it: an outcome chosen
    by a conditional (vllm/worker.py, then vllm/counted.py), an alias's too (aggregator's
    ``_refuse_finish``); a DECISIONS entry applied (``_books``' unregistering, ``saving``'s
    request_finished, ``lifecycle``'s cancel through ``machine.step``); "in flight" spelled
    again (``rule.safe_to_hand_back``)."""
    source = """
_PHANTOM: Final = Outcome.phantom

def ignored(owing, name):
    outcome = Outcome.unknown_request if owing is None else _PHANTOM
    count(counts, outcome, name)

def refuse(record):
    return _TERMINAL if record.state in TERMINAL else _DUPLICATE

def gone(record, name):
    guard, yes, no = _ON_GONE[record.state]
    dest = yes if guard is None or guard(record, name) else no

def finish(record, awaited):
    return DECISIONS["request_finished"][record.state]

def cancel(record):
    return step(record, "cancel", None)

def safe(state, awaiting, loader, loaded, loader_gone, parts_owed):
    return state in TERMINAL and not awaiting and not parts_owed and not load_owed(
        loader, loaded, loader_gone
    )
"""
    tree = ast.parse(source)
    aliases = outcome_aliases([tree]) | {"_TERMINAL", "_DUPLICATE"}  # imported, as in saving.py
    assert [v.split(" ", 1)[0] for v in restated_outcomes("m.py", tree, aliases)] == [
        "m.py:5",
        "m.py:9",
    ]
    assert [v.split(" ", 1)[0] for v in decisions_applied("m.py", tree)] == [
        "m.py:13",
        "m.py:16",
        "m.py:19",
    ]
    assert [v.split(" ", 1)[0] for v in in_flight_spelled("rule.py", tree)] == ["rule.py:22"]
    # The oracles restate outcomes on purpose; the rule and the machine decide them.
    assert restated_outcomes("check/reference.py", tree, aliases) == []
    assert restated_outcomes("_workload/simulation.py", tree, aliases) == []
    assert decisions_applied("rule.py", tree) == in_flight_spelled("machine.py", tree) == []

"""Random small declarations: the checker's verdicts against a plain graph computation.

For each generated machine, the reference below works on the declaration alone: which
transitions can fire when guards are free (the first candidate whose guards hold wins, as in
``transitions``), then breadth-first reachability from the initial state, backward reachability
from the final states (traps), the never-fired transitions and the deadlocks. The checker must
agree on every one.
"""

from __future__ import annotations

import itertools
from collections import deque
from typing import Any

from hypothesis import given, settings

from multiconnector.usermachine import NO_DEADLOCK, NO_TRAP, STATES_REACHED, check_machine
from tests.strategies import GUARD_NAMES, machine_declarations

#: At least 200 machines, in every profile (ci, dev); the deep profile asks for more.
EXAMPLES = max(200, settings().max_examples)

Triple = tuple[str, str, str]


def _dest(t: dict[str, Any]) -> str:
    return t["source"] if t["dest"] in (None, "=") else t["dest"]


def reference(decl: dict[str, Any]) -> dict[str, Any]:
    states = decl["states"]
    ts = decl["transitions"]
    finals = set(decl.get("final", ()))
    if not finals:  # none declared: the states with no transition to another state
        finals = {s for s in states if all(_dest(t) == t["source"] for t in ts if t["source"] == s)}
    # Which (source, trigger, dest) can fire: some guard values make it the first that holds.
    edges: set[Triple] = set()
    for values in itertools.product((True, False), repeat=len(GUARD_NAMES)):
        truth = dict(zip(GUARD_NAMES, values, strict=True))
        taken: set[tuple[str, str]] = set()
        for t in ts:
            key = (t["source"], t["trigger"])
            holds = all(truth[g] for g in t["conditions"]) and not any(
                truth[g] for g in t["unless"]
            )
            if key not in taken and holds:
                taken.add(key)
                edges.add((t["source"], t["trigger"], _dest(t)))
    depth = {decl["initial"]: 0}
    todo = deque([decl["initial"]])
    while todo:
        s = todo.popleft()
        for src, _, dst in sorted(edges):
            if src == s and dst not in depth:
                depth[dst] = depth[s] + 1
                todo.append(dst)
    good = set(finals)
    changed = True
    while changed:
        changed = False
        for src, _, dst in edges:
            if dst in good and src not in good:
                good.add(src)
                changed = True
    declared = {(t["source"], t["trigger"], _dest(t)) for t in ts}
    return {
        "finals": finals,
        "reached": set(depth),
        "depth": depth,
        "traps": {s for s in depth if s not in good},
        "dead": {t for t in declared if t[0] not in depth or t not in edges},
        "deadlocks": {s for s in depth if s not in finals and not any(e[0] == s for e in edges)},
    }


@settings(max_examples=EXAMPLES)
@given(machine_declarations())
def test_verdicts_match_a_plain_graph_computation(decl: dict[str, Any]) -> None:
    want = reference(decl)
    report = check_machine(decl)
    assert set(report.states_reached) == want["reached"]
    never = {(c.source, c.event, c.dest) for c in report.coverage if c.count == 0}
    assert never == want["dead"]
    assert all(c.declared for c in report.coverage)
    assert report.result(STATES_REACHED).passed == (want["reached"] == set(decl["states"]))
    deadlock = report.result(NO_DEADLOCK)
    assert deadlock.passed == (not want["deadlocks"])
    if want["deadlocks"]:
        assert deadlock.counterexample is not None
        assert len(deadlock.counterexample) == min(want["depth"][s] for s in want["deadlocks"])
    if not want["finals"]:  # no final state, declared or taken: there is no trap check
        assert NO_TRAP not in {p.name for p in report.properties}
        return
    trap = report.result(NO_TRAP)
    assert trap.passed == (not want["traps"])
    if want["traps"]:
        assert trap.counterexample is not None
        end = trap.counterexample.steps[-1].state if trap.counterexample.steps else "s0"
        assert end in want["traps"]
        assert len(trap.counterexample) == min(want["depth"][s] for s in want["traps"])

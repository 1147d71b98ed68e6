"""The transfer report rule (multiconnector.rule): its verdicts, and their memo."""

from __future__ import annotations

import itertools

import pytest

from multiconnector import MultiConnector, Outcome, State
from multiconnector.machine import STATES
from multiconnector.rule import SHARED_LIMIT, Verdicts, transfer_report

NAMES = ("a", "b", "c")
SUBSETS = [tuple(c) for k in range(4) for c in itertools.combinations(NAMES, k)]


def test_each_outcome_in_its_order() -> None:
    finishing, cancelled = State.finishing, State.cancelled
    assert transfer_report(None, (), (), (), "a") == (Outcome.unknown_request, None, (), False)
    assert transfer_report(finishing, ("a", "b"), ("a", "b"), (), "a") == (
        Outcome.applied,
        finishing,
        ("b",),
        False,
    )
    assert transfer_report(finishing, ("b",), ("a", "b"), (), "b") == (
        Outcome.applied,
        State.finished,
        (),
        True,
    )
    assert transfer_report(cancelled, ("b",), ("b",), (), "b") == (
        Outcome.drained,
        cancelled,
        (),
        False,
    )
    # Ignored: terminal first, then unregistered, then duplicate, else phantom.
    assert transfer_report(cancelled, (), ("a",), ("a",), "a")[0] is Outcome.terminal
    assert transfer_report(finishing, ("b",), ("a", "b"), ("a",), "a")[0] is Outcome.unregistered
    assert transfer_report(finishing, ("b",), ("a", "b"), (), "a")[0] is Outcome.duplicate
    assert transfer_report(finishing, ("b",), ("b",), (), "a") == (
        Outcome.phantom,
        None,
        ("b",),
        False,
    )
    assert transfer_report(State.pending, (), (), (), "a")[0] is Outcome.phantom


@pytest.mark.parametrize("state", STATES)
def test_the_memo_gives_the_rules_verdict_whatever_else_the_request_holds(state: State) -> None:
    """A remembered verdict is keyed by (state, awaited, name): it must not depend on what the
    request expects or abandoned, which is true of transfer_finished's guards (is_last)."""
    verdicts = Verdicts()
    for awaiting, expected, abandoned, name in itertools.product(
        SUBSETS, SUBSETS, SUBSETS, (*NAMES, "zz")
    ):
        got = verdicts.of(state, awaiting, expected, abandoned, name)
        assert got == transfer_report(state, awaiting, expected, abandoned, name)
        known = verdicts.by_state[state].get(awaiting, {}).get(name)
        assert known is None or known == got
        assert (known is not None) == (name in awaiting and got[1] is not None)


def test_the_memo_is_bounded() -> None:
    verdicts = Verdicts()
    for i in range(SHARED_LIMIT + 10):
        names = (f"n{i}", "x")
        verdicts.of(State.finishing, names, names, (), "x")
    assert verdicts.kept == SHARED_LIMIT
    assert len(verdicts.interned) <= SHARED_LIMIT
    assert sum(len(v) for by in verdicts.by_state.values() for v in by.values()) == SHARED_LIMIT


def test_the_aggregator_shares_the_rules_tuples() -> None:
    mc = MultiConnector()
    assert isinstance(mc._verdicts, Verdicts)

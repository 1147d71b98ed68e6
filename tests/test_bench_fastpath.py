"""The optimised hot path keeps every rule: it only skips work, never a check.

What the benchmarks made faster — per-event decisions compiled from the declaration, the plain-dict
merge done inline, shared awaiting tuples, counters by name, the registry-snapshot test — each
gets a test here that can fail: the fast form agrees with the general one, and falls back to it
whenever the common case does not hold.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import pytest

from multiconnector import (
    ConnectorRegistry,
    InvalidNameError,
    InvalidParamsError,
    KeyClashError,
    MultiConnector,
    Outcome,
    State,
    merge_transfer_params,
)
from multiconnector._table import decision as _decision
from multiconnector.machine import (
    DECISIONS,
    EVENTS,
    STATES,
    TABLE,
    RequestTransferState,
    step,
)
from tests.strategies import GUARD_SCENARIOS

SCENARIOS = GUARD_SCENARIOS


def decide(record: RequestTransferState, event: str, arg: Any) -> State | None:
    """What the aggregator's inlined hot path computes."""
    guard, yes, no = DECISIONS[event][record.state]
    return yes if guard is None or guard(record, arg) else no


@pytest.mark.parametrize(("state", "event"), list(itertools.product(STATES, EVENTS)))
def test_decisions_agree_with_step(state: State, event: str) -> None:
    for awaiting, arg in SCENARIOS:
        if (event == "request_finished") != isinstance(arg, tuple):
            continue
        record = RequestTransferState("r", state=state, awaiting=awaiting)
        assert decide(record, event, arg) == step(record, event, arg), (awaiting, arg)


def test_every_pair_of_the_declaration_compiles_to_one_guard_call() -> None:
    for event, state in itertools.product(EVENTS, STATES):
        assert state in DECISIONS[event], (event, state)


def _yes(record: RequestTransferState, arg: Any) -> bool:
    return True


def _no(record: RequestTransferState, arg: Any) -> bool:
    return False


def test_a_chain_that_needs_a_walk_has_no_decision() -> None:
    """(The module refuses to load then: see test_machine.py.)"""
    finished, cancelled, pending = State.finished, State.cancelled, State.pending
    assert (
        _decision(((_no, True, finished), (_yes, True, cancelled), (None, True, pending))) is None
    )
    assert _decision(((_no, True, finished), (_no, False, cancelled))) == (_no, finished, cancelled)
    assert _decision(((_no, False, finished), (None, True, cancelled))) == (
        _no,
        cancelled,
        finished,
    )
    assert _decision(((_yes, False, finished),)) == (_yes, None, finished)
    assert _decision(()) == (None, None, None)
    assert _decision(((None, True, finished), (_no, True, cancelled))) == (None, finished, None)


def test_decisions_are_derived_from_the_table() -> None:
    for event, state in itertools.product(EVENTS, STATES):
        candidates = TABLE[state].get(event, ())
        guards = {g for g, _, _ in candidates if g is not None}
        decision = DECISIONS[event][state]
        assert decision[0] in guards | {None}
        assert {decision[1], decision[2]} - {None} <= {d for _, _, d in candidates}


# -- the aggregator ---------------------------------------------------------------------------


class Saver:
    def __init__(self, params: Any = None, saves: bool = True) -> None:
        self.params = params
        self.saves = saves

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, Any]:
        return self.saves, self.params


def three(**params: Any) -> MultiConnector:
    return MultiConnector({n: Saver(params.get(n)) for n in ("a", "b", "c")})


@pytest.mark.parametrize(
    "contributions",
    [
        {"a": {"x": 1}, "b": {"y": 2}, "c": {"z": 3}},
        {"a": None, "b": None, "c": None},
        {"a": {}, "b": None, "c": None},
        {"a": {"x": 1, "w": 0}, "b": {}, "c": {"y": [1]}},
        {"a": OrderedDict(x=1), "b": {"y": 2}, "c": None},
    ],
)
def test_inline_merge_gives_what_merge_transfer_params_gives(
    contributions: dict[str, Any],
) -> None:
    mc = three(**contributions)
    mc.begin("r")
    outcome, params = mc.request_finished("r")
    expected = merge_transfer_params(list(contributions.items()))
    assert outcome is Outcome.applied
    assert params == expected
    assert params is None or list(params) == list(expected or {})
    for given in contributions.values():
        assert params is None or params is not given  # a new dict, never an input


def test_inline_merge_hands_a_clash_to_the_general_merge() -> None:
    mc = three(a={"k": 1}, b={"k": 2})
    mc.begin("r")
    with pytest.raises(KeyClashError):
        mc.request_finished("r")
    record = mc.get("r")
    assert record is not None
    assert (record.state, record.awaiting, record.params) == (
        State.finishing,
        ("a", "b", "c"),
        None,
    )


def test_inline_merge_hands_equal_values_to_the_general_merge() -> None:
    mc = MultiConnector({"a": Saver({"k": 1}), "b": Saver({"k": 1})}, allow_equal_params=True)
    mc.begin("r")
    assert mc.request_finished("r") == (Outcome.applied, {"k": 1})


def test_inline_merge_hands_a_non_str_key_to_the_general_merge() -> None:
    mc = three(a={1: "x"})
    mc.begin("r")
    with pytest.raises(InvalidParamsError):
        mc.request_finished("r")


def test_awaiting_tuples_are_shared_and_shrink_in_any_order() -> None:
    mc = three()
    for rid in ("r1", "r2"):
        mc.begin(rid)
        mc.request_finished(rid)
    one, two = mc.get("r1"), mc.get("r2")
    assert one is not None and two is not None
    assert one.awaiting is two.awaiting == ("a", "b", "c")
    for order in (("c", "a", "b"), ("b", "c", "a")):
        rid = "r1" if order[0] == "c" else "r2"
        left = ["a", "b", "c"]
        for name in order:
            assert mc.transfer_finished(rid, name) is Outcome.applied
            left.remove(name)
            record = mc.get(rid)
            assert record is not None
            assert record.awaiting == tuple(left)
            assert mc.transfer_finished(rid, name) is (
                Outcome.duplicate if left else Outcome.terminal
            )
    assert [r.request_id for r in mc.take()] == ["r1", "r2"]


def test_a_connector_registered_while_asking_does_not_abandon_the_savers() -> None:
    registry = ConnectorRegistry()

    class Registers(Saver):
        def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, Any]:
            registry.register("late", Saver())
            return True, None

    registry.register("a", Registers())
    registry.register("b", Saver())
    mc = MultiConnector(registry)
    mc.begin("r")
    mc.request_finished("r")
    record = mc.get("r")
    assert record is not None
    assert (record.awaiting, record.abandoned) == (("a", "b"), ())


def test_a_saver_unregistered_while_asking_is_abandoned() -> None:
    registry = ConnectorRegistry()

    class Unregisters(Saver):
        def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, Any]:
            registry.unregister("a")
            return True, None

    registry.register("a", Saver())
    registry.register("b", Unregisters())
    mc = MultiConnector(registry)
    mc.begin("r")
    mc.request_finished("r")
    record = mc.get("r")
    assert record is not None
    assert (record.awaiting, record.expected, record.abandoned) == (("b",), ("a", "b"), ("a",))


def test_counters_include_the_fast_paths() -> None:
    mc = three()
    mc.begin("r")
    mc.request_finished("r")
    mc.request_finished("r")
    for name in ("a", "a", "b", "c", "c"):
        mc.transfer_finished("r", name)
    assert mc.counts() == {Outcome.applied: 4, Outcome.duplicate: 2, Outcome.terminal: 1}
    assert mc.connector_counts() == {
        "a": {Outcome.applied: 1, Outcome.duplicate: 1},
        "b": {Outcome.applied: 1},
        "c": {Outcome.applied: 1, Outcome.terminal: 1},
    }


def test_a_str_subclass_name_is_a_name() -> None:
    class Name(str):
        pass

    mc = three()
    mc.begin("r")
    mc.request_finished("r")
    assert mc.transfer_finished("r", Name("a")) is Outcome.applied
    assert mc.load_finished("r", Name("zz")) is Outcome.unknown_connector
    with pytest.raises(InvalidNameError):
        mc.transfer_finished("r", 0)  # type: ignore[arg-type]
    with pytest.raises(InvalidNameError):
        mc.load_finished("r", b"a")  # type: ignore[arg-type]

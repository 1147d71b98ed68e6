"""The one declaration: the compiled runtime table agrees with a real transitions.Machine."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from transitions import MachineError

from multiconnector.machine import (
    EVENTS,
    STATES,
    TABLE,
    TERMINAL,
    TRANSITIONS,
    RequestTransferState,
    State,
    build_machine,
    step,
)
from tests.strategies import GUARD_SCENARIOS

SCENARIOS = GUARD_SCENARIOS


def machine_says(state: State, event: str, awaiting: tuple[str, ...], arg: Any) -> State | None:
    machine = build_machine()
    model = RequestTransferState("r", state=state, awaiting=awaiting)
    try:
        fired = machine.events[event].trigger(model, arg)
    except MachineError:
        return None
    except TypeError:  # a guard given an argument of another event's shape
        raise
    return State(model.state) if fired else None


@pytest.mark.parametrize(("state", "event"), list(itertools.product(STATES, EVENTS)))
def test_runtime_table_agrees_with_transitions_machine(state: State, event: str) -> None:
    for awaiting, arg in SCENARIOS:
        if event == "request_finished" and not isinstance(arg, tuple):
            continue
        if event in {"transfer_finished", "connector_gone"} and not isinstance(arg, str):
            continue
        record = RequestTransferState("r", state=state, awaiting=awaiting)
        assert step(record, event, arg) == machine_says(state, event, awaiting, arg), (
            state,
            event,
            awaiting,
            arg,
        )
        assert record.state is state  # step only computes


def test_terminal_states_are_absorbing() -> None:
    assert {State.finished, State.cancelled} == TERMINAL
    assert dict(TABLE[State.finished]) == {}
    # cancelled only drains: a report from, or the unregistering of, a name it awaits keeps it
    # cancelled; nothing leaves it.
    assert set(TABLE[State.cancelled]) == {"transfer_finished", "connector_gone"}
    for state in TERMINAL:
        for event in EVENTS:
            record = RequestTransferState("r", state=state, awaiting=("a",))
            assert step(record, event, "a") in (None, state)


def test_declaration_names_only_declared_states_and_every_state() -> None:
    mentioned: set[str] = set()
    for t in TRANSITIONS:
        sources = [t["source"]] if isinstance(t["source"], str) else t["source"]
        mentioned.update(sources)
        if t["dest"] != "=":
            mentioned.add(t["dest"])
    assert mentioned == {s.value for s in STATES}
    assert set(build_machine().states) == {s.value for s in STATES}


def test_guards_are_record_methods_used_by_both() -> None:
    for t in TRANSITIONS:
        for key in ("conditions", "unless"):
            if key in t:
                assert callable(getattr(RequestTransferState, t[key]))


def test_records_are_small_and_slotted() -> None:
    record = RequestTransferState("r")
    assert not hasattr(record, "__dict__")
    with pytest.raises(AttributeError):
        record.extra = 1  # type: ignore[attr-defined]


def test_lifecycle_through_the_table() -> None:
    record = RequestTransferState("r")
    assert step(record, "request_finished", ("a", "b")) is State.finishing
    record.state, record.awaiting = State.finishing, ("a", "b")
    assert step(record, "transfer_finished", "a") is State.finishing
    record.awaiting = ("b",)
    assert step(record, "transfer_finished", "b") is State.finished
    assert step(record, "cancel", None) is State.cancelled

"""The one declaration: the compiled runtime table agrees with a real transitions.Machine."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import pytest
from transitions import Machine, MachineError

from multiconnector import MultiConnector
from multiconnector import machine as machine_module
from multiconnector._table import as_list, compile_table, events_of, guard_of
from multiconnector._table import decision as decision_of
from multiconnector._table import decisions as decisions_of
from multiconnector.errors import InvalidMachineError
from multiconnector.machine import (
    CALL_EVENTS,
    EVENTS,
    STATES,
    TABLE,
    TERMINAL,
    TRANSITIONS,
    RequestTransferState,
    State,
    build_machine,
    in_flight_of,
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


# -- the tables are built at import time: build them again here, so that what builds them is
# -- tested too (a mutation test, which imports the module once, would not see it otherwise).


def walk(candidates: tuple[Any, ...], record: RequestTransferState, arg: Any) -> State | None:
    """step's rule: the first candidate whose guard returns what it must."""
    for guard, want, dest in candidates:
        if guard is None or guard(record, arg) is want:
            return dest
    return None


def decide(decision: Any, record: RequestTransferState, arg: Any) -> State | None:
    """The aggregator's hot-path use of a decision."""
    guard, yes, no = decision
    return yes if guard is None or guard(record, arg) else no


def test_tables_built_again_agree_with_transitions_machine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert events_of(TRANSITIONS) == tuple(build_machine().events) == EVENTS
    table = compile_table(TRANSITIONS, State, RequestTransferState)
    assert set(table) == set(STATES)
    monkeypatch.setattr(machine_module, "TABLE", table)
    for state, event in itertools.product(STATES, EVENTS):
        for awaiting, arg in SCENARIOS:
            if event == "request_finished" and not isinstance(arg, tuple):
                continue
            if event in {"transfer_finished", "connector_gone"} and not isinstance(arg, str):
                continue
            record = RequestTransferState("r", state=state, awaiting=awaiting)
            expected = machine_says(state, event, awaiting, arg)
            assert step(record, event, arg) == expected, (state, event, awaiting, arg)
            decision = decision_of(table[state].get(event, ()))
            assert decision is not None  # the declaration needs no walk anywhere
            assert decide(decision, record, arg) == expected, (state, event, awaiting, arg)
            assert machine_module.DECISIONS[event][state] == decision
    # Rebuilt inside a test (the module's tables are built at import, before a mutant is on).
    rebuilt = compile_table(machine_module.TRANSITIONS, State, RequestTransferState)
    assert decisions_of(rebuilt, EVENTS, STATES) == machine_module.DECISIONS


def yes(record: RequestTransferState, arg: Any) -> bool:
    return bool(arg)


def other(record: RequestTransferState, arg: Any) -> bool:
    return not arg


@pytest.mark.parametrize(
    ("candidates", "walkable"),
    [
        ((), True),
        (((None, True, State.finished),), True),
        (((yes, True, State.finished),), True),
        (((yes, False, State.finished),), True),
        (((yes, True, State.finished), (yes, False, State.cancelled)), True),
        (((yes, False, State.finished), (yes, True, State.cancelled)), True),
        (((yes, True, State.finished), (None, True, State.cancelled)), True),
        (((yes, False, State.finished), (None, True, State.cancelled)), True),
        # Candidates one guard call cannot decide: the caller walks them.
        (((yes, True, State.finished), (other, True, State.cancelled)), False),
        (((yes, True, State.finished), (yes, True, State.cancelled)), False),
    ],
)
def test_a_decision_takes_exactly_the_walks_choices(candidates: Any, walkable: bool) -> None:
    decision = decision_of(candidates)
    assert (decision is not None) is walkable
    if decision is not None:
        record = RequestTransferState("r")
        for arg in (True, False):
            assert decide(decision, record, arg) == walk(candidates, record, arg), arg


@pytest.mark.parametrize(
    ("conds", "unless", "arg", "awaiting", "holds"),
    [
        ([], [], "a", (), True),
        (["is_last"], [], "a", ("a",), True),
        (["is_last"], [], "a", ("a", "b"), False),
        ([], ["is_last"], "a", ("a",), False),
        ([], ["is_last"], "a", ("a", "b"), True),
    ],
)
def test_a_guard_holds_exactly_when_the_transition_may_fire(
    conds: list[str], unless: list[str], arg: str, awaiting: tuple[str, ...], holds: bool
) -> None:
    guard, want = guard_of(RequestTransferState, conds, unless)
    record = RequestTransferState("r", state=State.finishing, awaiting=awaiting)
    assert (guard is None or guard(record, arg) is want) is holds


@pytest.mark.parametrize(
    ("conds", "unless"), [(["is_last", "is_last"], []), (["is_last"], ["has_savers"])]
)
def test_a_transition_with_several_guards_is_refused(conds: list[str], unless: list[str]) -> None:
    # The message names the guards, so the declaration's author finds the transition.
    names = re.escape(f"several guards ({', '.join(conds + unless)})")
    with pytest.raises(InvalidMachineError, match=names):
        guard_of(RequestTransferState, conds, unless)


@pytest.mark.parametrize(
    ("fields", "owed", "owes"),
    [
        ({}, False, {}),
        ({"awaiting": ("s",)}, True, {"s": False}),
        ({"parts_owed": ("p",)}, True, {"p": True, "l": False}),
        ({"loader": "l"}, True, {"l": True, "p": False}),
        ({"loader": "l", "loaded": True}, False, {"l": False}),
        ({"loader": "l", "loader_gone": True}, False, {"l": False}),
        ({"loader": "l", "loaded": True, "parts_owed": ("p",)}, True, {"l": False, "p": True}),
    ],
)
def test_a_request_is_in_flight_while_a_save_a_part_or_its_load_is_owed(
    fields: dict[str, Any], owed: bool, owes: dict[str, bool]
) -> None:
    record = RequestTransferState("r", state=State.finishing, **fields)
    assert record.in_flight is owed
    assert (
        in_flight_of(
            record.awaiting, record.parts_owed, record.loader, record.loaded, record.loader_gone
        )
        is owed
    )
    for name, expected in owes.items():
        assert record.owes_load(name) is expected, name


def _load_machine_with(old: str, new: str) -> None:
    """Execute machine.py's source with ``old`` replaced by ``new``, as a module of the package
    (its imports resolve), as an import would."""
    path = Path(machine_module.__file__)
    source = path.read_text(encoding="utf-8")
    assert source.count(old) == 1, old
    namespace: dict[str, Any] = {
        "__name__": "multiconnector._machine_variant",
        "__package__": "multiconnector",
    }
    exec(compile(source.replace(old, new), str(path), "exec"), namespace)


def test_the_real_declaration_loads() -> None:
    _load_machine_with("INITIAL: Final = State.pending", "INITIAL: Final = State.pending")


def test_a_declaration_whose_decisions_are_incomplete_does_not_load() -> None:
    """A (state, event) pair one guard call cannot decide is an import error: DECISIONS is
    complete whenever the module loaded, so no caller needs a fallback."""
    with pytest.raises(InvalidMachineError, match="transfer_finished from finishing"):
        _load_machine_with(
            """{"trigger": "transfer_finished", "source": "finishing", "dest": "=",
     "unless": "is_last"},""",
            """{"trigger": "transfer_finished", "source": "finishing", "dest": "=",
     "conditions": "has_savers"},""",
        )


def test_a_declaration_with_two_guards_on_a_transition_does_not_load() -> None:
    with pytest.raises(InvalidMachineError, match="several guards"):
        _load_machine_with(
            '"conditions": "has_savers"},', '"conditions": ["has_savers", "has_savers"]},'
        )


def test_as_list_reads_every_spelling_of_a_declaration_field() -> None:
    assert as_list(None) == []
    assert as_list("pending") == ["pending"]
    assert as_list(["pending", "finishing"]) == ["pending", "finishing"]
    assert as_list(("pending",)) == ["pending"]


def test_build_machine_is_the_declaration_and_nothing_more() -> None:
    machine = build_machine()
    assert list(machine.states) == [s.value for s in STATES]
    assert machine.initial == State.pending.value
    assert list(machine.events) == list(EVENTS)  # no auto transitions (to_pending, ...)
    assert machine.models == []
    model = RequestTransferState("r", state=State.finished)
    with pytest.raises(MachineError):  # invalid triggers are errors, not silently ignored
        machine.events["cancel"].trigger(model, None)
    assert (
        len(TRANSITIONS)
        == sum(len(t) for e in machine.events.values() for t in e.transitions.values()) - 1
    )  # cancel is declared once for two sources

    class Recording(Machine):
        pass

    built = build_machine(machine_cls=Recording, name="named")
    assert type(built) is Recording and built.name == "named: "


def test_build_machine_drives_the_model_it_is_given() -> None:
    class Model:
        pass

    model = Model()
    machine = build_machine(model=model)
    assert machine.models == [model]
    assert model.state == State.pending.value  # type: ignore[attr-defined]


def test_the_compiler_honours_unless_in_any_declaration_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # In the real declaration each "unless" transition follows its "conditions" twin, so a
    # compiler that dropped "unless" would still walk to the same states; declared the other
    # way round, it would not.
    reordered = (
        {"trigger": "request_finished", "source": "pending", "dest": "finished",
         "unless": "has_savers"},
        {"trigger": "request_finished", "source": "pending", "dest": "finishing",
         "conditions": "has_savers"},
    )  # fmt: skip
    monkeypatch.setattr(machine_module, "TRANSITIONS", reordered)
    monkeypatch.setattr(
        machine_module, "TABLE", compile_table(reordered, State, RequestTransferState)
    )
    record = RequestTransferState("r")
    assert step(record, "request_finished", ("a",)) is State.finishing
    assert step(record, "request_finished", ()) is State.finished


def test_every_event_is_fired_by_an_aggregator_call_the_table_names() -> None:
    # CALL_EVENTS, beside the declaration: each call is the aggregator's, each event declared,
    # and no declared event lacks a call (the checker would think it unreachable).
    assert all(callable(getattr(MultiConnector, call, None)) for call in CALL_EVENTS)
    assert set(CALL_EVENTS.values()) == set(EVENTS)

"""Split loads on the core books: one request's tokens loaded from several connectors.

``choose_loader(request_id, name, parts=(...))`` records ``name`` as the loader of the first
range and ``parts`` as the loaders of the next ones; each owes a report. The rule written here,
independently of :func:`multiconnector.rule.part_report`: ``take()`` hands a terminal record
back once every loader reported or was unregistered (and every save came back), exactly once,
whatever the order of the reports, a cancel and an unregistering.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from multiconnector import (
    ConnectorRegistry,
    InvalidArgumentError,
    InvalidNameError,
    MultiConnector,
    Outcome,
    Role,
    RoleError,
    State,
    UnknownConnectorError,
)
from tests.connectors import Scripted


def make(*names: str, roles: dict[str, Role] | None = None) -> MultiConnector:
    registry = ConnectorRegistry({name: Scripted(saves=False) for name in names}, roles=roles or {})
    return MultiConnector(registry)


def test_every_part_owes_its_report_and_the_record_is_loading_until_the_last() -> None:
    mc = make("fast", "slow", "far")
    mc.begin("r")
    mc.choose_loader("r", "fast", parts=("slow", "far"))
    record = mc.peek("r")
    assert record is not None
    assert (record.loader, record.parts, record.parts_owed) == (
        "fast",
        ("slow", "far"),
        ("slow", "far"),
    )
    assert record.loading and record.in_flight
    assert mc.load_finished("r", "far") is Outcome.applied
    assert mc.load_finished("r", "far") is Outcome.duplicate
    assert mc.load_finished("r", "fast") is Outcome.applied
    assert mc.peek("r").loading  # type: ignore[union-attr]
    assert mc.load_finished("r", "slow") is Outcome.applied
    assert not mc.peek("r").loading  # type: ignore[union-attr]
    mc.request_finished("r")
    assert [t.request_id for t in mc.take()] == ["r"]


def test_a_cancelled_split_load_drains_every_part_before_take() -> None:
    mc = make("fast", "slow")
    mc.begin("r")
    mc.choose_loader("r", "fast", parts=("slow",))
    mc.cancel("r")
    assert mc.take() == []
    assert mc.load_finished("r", "slow") is Outcome.drained
    assert mc.take() == []  # the loader still owes its report
    assert mc.load_finished("r", "slow") is Outcome.terminal
    assert mc.load_finished("r", "fast") is Outcome.drained
    assert [t.state for t in mc.take()] == [State.cancelled]


def test_an_unregistered_part_is_over_and_its_late_report_is_unregistered() -> None:
    mc = make("fast", "slow")
    mc.begin("r")
    mc.choose_loader("r", "fast", parts=("slow",))
    mc.load_finished("r", "fast")
    mc.registry.unregister("slow")
    record = mc.peek("r")
    assert record is not None and not record.loading and "slow" in record.abandoned
    assert mc.load_finished("r", "slow") is Outcome.unregistered


def test_a_part_registered_with_none_owes_nothing() -> None:
    registry = ConnectorRegistry({"fast": Scripted(saves=False), "dead": None})
    mc = MultiConnector(registry)
    mc.begin("r")
    mc.choose_loader("r", "fast", parts=("dead",))
    record = mc.peek("r")
    assert record is not None and record.parts == ("dead",) and record.parts_owed == ()


@pytest.mark.parametrize(
    ("parts", "error", "match"),
    [
        ("slow", InvalidArgumentError, "parts"),
        (["slow", "slow"], InvalidArgumentError, "distinct"),
        (["fast"], InvalidArgumentError, "distinct"),
        ([7], InvalidNameError, "parts"),
        (["nope"], UnknownConnectorError, "'nope'"),
        (["store"], RoleError, "'store'"),
    ],
)
def test_bad_parts_are_refused_and_change_nothing(
    parts: Any, error: type[Exception], match: str
) -> None:
    mc = make("fast", "slow", "store", roles={"store": Role.save})
    mc.begin("r")
    before = mc.peek("r")
    with pytest.raises(error, match=match):
        mc.choose_loader("r", "fast", parts=parts)
    assert mc.peek("r") == before


def test_parts_without_a_loader_are_refused() -> None:
    mc = make("fast", "slow")
    mc.begin("r")
    with pytest.raises(InvalidArgumentError, match="needs a loader"):
        mc.choose_loader("r", None, parts=("slow",))


#: Every event a split load of "r" (loader "a", parts "b" and "c") may meet.
EVENTS = (
    ("load", "a"),
    ("load", "b"),
    ("load", "c"),
    ("load", "b"),  # a duplicate, or b's drain when it comes first after a cancel
    ("cancel", None),
    ("gone", "c"),
)


def _owed(done: set[str]) -> bool:
    """The reference: some loader has neither reported nor been unregistered."""
    return bool({"a", "b", "c"} - done)


@pytest.mark.parametrize("order", list(itertools.permutations(range(len(EVENTS)))))
def test_every_order_hands_the_record_back_once_after_the_last_part(order: tuple[int, ...]) -> None:
    mc = make("a", "b", "c")
    mc.begin("r")
    mc.choose_loader("r", "a", parts=("b", "c"))
    done: set[str] = set()
    cancelled = False
    taken: list[str] = []
    for i in order:
        kind, name = EVENTS[i]
        if kind == "load":
            outcome = mc.load_finished("r", name)  # type: ignore[arg-type]
            if name not in done and name in ({"a", "b", "c"} - done):
                expected = Outcome.drained if cancelled else Outcome.applied
                if name == "c" and "c" in done:
                    expected = Outcome.unregistered
                assert outcome is expected, (EVENTS[i], outcome)
                done.add(name)  # type: ignore[arg-type]
            else:
                assert outcome is not Outcome.applied and outcome is not Outcome.drained
        elif kind == "cancel":
            mc.cancel("r")
            cancelled = True
        else:
            mc.registry.unregister("c")
            done.add("c")
        got = [t.request_id for t in mc.take()]
        taken += got
        if got:
            assert cancelled and not _owed(done), order
    assert taken == ["r"]
    assert "r" not in mc

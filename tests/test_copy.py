"""``copy.deepcopy(mc)``: the aggregator's own copy, which the model check forks its worlds with.

Every attribute of the books is copied or shared by a line of ``Books.__deepcopy__``: one added
to ``Books.__slots__`` without its line is unset in the copy, and
:func:`test_every_slot_of_the_books_is_set_in_the_copy` fails. A copy behaves as the original
would, from the state copied on, and changes nothing of it.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from multiconnector import ConnectorRegistry, MultiConnector, Outcome
from multiconnector.aggregator import _books
from multiconnector.check import halves
from tests.connectors import Scripted

#: What the copy shares with the original on purpose: nobody changes them (the caches' values
#: are functions of their keys; a claim is a token compared by identity).
SHARED = frozenset({"_lookup", "_verdicts", "_ready_names", "_closed", "_trace", "_allow_equal"})


def busy() -> tuple[MultiConnector, tuple[Any, ...]]:
    """An aggregator with something in every table: held and queued records, a call between
    its halves with an early report kept, a match between its halves, counts, a parked cancel."""
    mc = MultiConnector(
        ConnectorRegistry({"a": Scripted(), "b": Scripted(tokens=1), "none": None}), stripes=4
    )
    for rid in ("done", "asked", "matched", "parked"):
        mc.begin(rid)
    mc.request_finished("done", [1])
    mc.transfer_finished("done", "a")
    mc.transfer_finished("done", "b")
    mc.transfer_finished("done", "ghost")
    asked = halves.ask(mc, "asked", [2])
    assert mc.transfer_finished("asked", "a") is Outcome.early
    matched = halves.match_ask(mc, "matched")
    assert mc.load_finished("matched", "b") is Outcome.early
    parked = halves.ask(mc, "parked", [])
    assert mc.cancel("parked") is Outcome.applied  # parked: its call still asks
    return mc, (asked, matched, parked)


def test_every_slot_of_the_books_is_set_in_the_copy() -> None:
    mc, _ = busy()
    twin = copy.deepcopy(mc)
    slots = _books._SLOTS - {"__weakref__"}
    assert slots == set(_books.Books.__slots__) - {"__weakref__"}
    missing = sorted(s for s in slots if not hasattr(twin, s))
    assert missing == [], f"Books.__deepcopy__ has no line for {missing}"
    for slot in sorted(slots - SHARED):
        mine, its = getattr(mc, slot), getattr(twin, slot)
        if isinstance(mine, dict | list | set | tuple) and mine:
            assert mine is not its, f"{slot} is shared, not copied"


def test_a_subclass_with_slots_of_its_own_is_not_copied() -> None:
    sub = type("Sub", (MultiConnector,), {"__slots__": ("extra",)})
    with pytest.raises(copy.Error, match="attributes of its own"):
        copy.deepcopy(sub())


def test_a_copy_goes_on_as_the_original_would_and_leaves_it_alone() -> None:
    mc, (asked, matched, parked) = busy()
    twin = copy.deepcopy(mc)
    before = {rid: mc.peek(rid) for rid in mc.request_ids()}
    copies = {rid: twin.peek(rid) for rid in twin.request_ids()}
    assert copies == before and all(copies[r] is not before[r] for r in before)
    memo: dict[int, Any] = {}
    twin = copy.deepcopy(mc, memo)

    def halves_of(asked: tuple[Any, ...]) -> tuple[Any, ...]:
        return (memo[id(asked[0])], *asked[1:])  # the copy's record, the same answers

    results = []
    for agg, own in ((mc, lambda t: t), (twin, halves_of)):
        outcome = (
            halves.answer(agg, own(asked)),
            halves.match_answer(agg, own(matched)),
            halves.answer(agg, own(parked)),
            agg.transfer_finished("asked", "b"),
            agg.load_finished("matched", "b"),
            agg.transfer_finished("parked", "a"),
            agg.transfer_finished("parked", "b"),
            [(r.request_id, r.state, r.awaiting, r.abandoned) for r in agg.take()],
            agg.counts(),
            agg.connector_counts(),
            sorted(agg.request_ids()),
        )
        results.append(outcome)
    assert results[0] == results[1]
    assert results[0][7]  # something was handed back


def test_a_registry_with_another_listener_is_not_copied() -> None:
    mc = MultiConnector({"a": Scripted()})
    mc.registry.subscribe(lambda entry: None)
    with pytest.raises(copy.Error, match="other listeners"):
        copy.deepcopy(mc)

"""Shutting down drains (docs/concepts.md, "Shutting down"): after ``shutdown()`` no new work is
taken, every report is still accepted, and no request is stranded nor handed back early.

The stateful test drives the aggregator through arbitrary orders of ``begin``,
``request_finished``, ``match_tokens``, reports, ``cancel``, ``shutdown`` (from outside, or
from inside a connector's own ``request_finished``), ``unregister`` and ``take``, against what
the connectors themselves know they owe; then drains as the documented order says and checks
that nothing is left held.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from multiconnector import (
    ConnectorRegistry,
    MultiConnector,
    Outcome,
    RequestTransferState,
    ShutDownError,
    State,
)

REQUESTS = ("r0", "r1", "r2")


class Store:
    """A connector that knows what it owes: the saves it promised and the loads it was chosen
    for, until it reports them. ``flushes``: its ``shutdown()`` reports every save and load it
    still owes (a store flushing its last writes); ``shuts_inside``: its next
    ``request_finished`` calls the aggregator's ``shutdown()`` before it answers."""

    def __init__(self, name: str, *, flushes: bool) -> None:
        self.name = name
        self.flushes = flushes
        self.mc: MultiConnector | None = None
        self.saves = False
        self.tokens = 0
        self.shuts_inside = False
        self.owed_saves: set[str] = set()
        self.owed_loads: set[str] = set()
        #: The saves it reported as applied or drained: these completed.
        self.completed: set[str] = set()
        self.shut = 0

    def request_finished(
        self, request_id: str, blocks: Sequence[int]
    ) -> tuple[bool, Mapping[str, Any] | None]:
        if self.shuts_inside:
            self.shuts_inside = False
            assert self.mc is not None
            self.mc.shutdown()
        if self.saves:
            self.owed_saves.add(request_id)
        return self.saves, None

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int:
        if self.tokens:
            self.owed_loads.add(request_id)
        return self.tokens

    def report_save(self, request_id: str) -> Outcome:
        assert self.mc is not None
        outcome = self.mc.transfer_finished(request_id, self.name)
        if request_id in self.owed_saves:
            # A promised save's report is applied or drained (or kept early: made from inside
            # another connector's request_finished, and applied once the answers are in).
            assert outcome in (Outcome.applied, Outcome.drained, Outcome.early), outcome
            self.owed_saves.discard(request_id)
            self.completed.add(request_id)
        return outcome

    def report_load(self, request_id: str) -> Outcome:
        assert self.mc is not None
        outcome = self.mc.load_finished(request_id, self.name)
        if request_id in self.owed_loads:
            assert outcome in (Outcome.applied, Outcome.drained, Outcome.early), outcome
            self.owed_loads.discard(request_id)
        return outcome

    def shutdown(self) -> None:
        self.shut += 1
        if self.flushes:
            for request_id in sorted(self.owed_saves):
                self.report_save(request_id)
            for request_id in sorted(self.owed_loads):
                self.report_load(request_id)


class ShutdownMachine(RuleBasedStateMachine):
    """Every order of the events around ``shutdown()``; the connectors' own books are the
    truth a handed-back record is checked against."""

    ACTIONS = (
        "begin", "begin", "finish", "finish", "look_up", "report", "report", "report",
        "cancel", "shutdown", "shutdown_inside", "unregister", "take",
    )  # fmt: skip

    def __init__(self) -> None:
        super().__init__()
        self.stores = {
            "a": Store("a", flushes=True),
            "b": Store("b", flushes=True),
            "c": Store("c", flushes=False),  # reports only when told: from outside, later
        }
        self.mc = MultiConnector(ConnectorRegistry(dict(self.stores)))
        for store in self.stores.values():
            store.mc = self.mc
        self.gone: dict[str, Store] = {}  # unregistered: their promises are void
        self.taken: list[RequestTransferState] = []

    @property
    def shut(self) -> bool:
        return any(store.shut for store in (*self.stores.values(), *self.gone.values()))

    @rule(data=st.data())
    def act(self, data: st.DataObject) -> None:
        action = data.draw(st.sampled_from(self.ACTIONS), label="action")
        rid = data.draw(st.sampled_from(REQUESTS), label="rid")
        getattr(self, action)(data, rid)

    def refused_after_shutdown(self, call: Any) -> bool:
        """Run ``call``; after shutdown it must raise ShutDownError and change nothing."""
        if not self.shut:
            call()
            return False
        before = {r: self.mc.get(r) for r in self.mc.request_ids()}
        with pytest.raises(ShutDownError, match="cancel"):  # the message says what to do
            call()
        assert {r: self.mc.get(r) for r in self.mc.request_ids()} == before
        return True

    def begin(self, data: st.DataObject, rid: str) -> None:
        if rid not in self.mc:
            self.refused_after_shutdown(lambda: self.mc.begin(rid))

    def finish(self, data: st.DataObject, rid: str) -> None:
        savers = data.draw(st.sets(st.sampled_from(("a", "b", "c"))), label="savers")
        for name, store in self.stores.items():
            store.saves = name in savers
        self.refused_after_shutdown(lambda: self.mc.request_finished(rid, [1]))

    def shutdown_inside(self, data: st.DataObject, rid: str) -> None:
        """A connector's ``request_finished`` shuts the aggregator down before it answers."""
        if self.shut or not self.stores:
            return
        name = data.draw(st.sampled_from(sorted(self.stores)), label="shuts")
        self.stores[name].shuts_inside = True
        try:
            self.finish(data, rid)
        finally:
            self.stores[name].shuts_inside = False

    def look_up(self, data: st.DataObject, rid: str) -> None:
        record = self.mc.peek(rid)
        if record is None or record.state is not State.pending or record.loader is not None:
            return  # choose a loader once a request, as vLLM does
        loader = data.draw(st.sampled_from(["", *sorted(self.stores)]), label="loader")
        for name, store in self.stores.items():
            store.tokens = 16 if name == loader else 0
        self.refused_after_shutdown(lambda: self.mc.match_tokens(rid))

    def report(self, data: st.DataObject, rid: str) -> None:
        """A registered connector reports (an owed report, mostly); never refused."""
        if not self.stores:
            return
        store = self.stores[data.draw(st.sampled_from(sorted(self.stores)), label="reporter")]
        owed = sorted(store.owed_saves | store.owed_loads)
        if owed and data.draw(st.integers(0, 3), label="aim"):
            rid = data.draw(st.sampled_from(owed), label="owed")
        if rid in store.owed_loads and data.draw(st.booleans(), label="load"):
            store.report_load(rid)
        else:
            store.report_save(rid)

    def cancel(self, data: st.DataObject, rid: str) -> None:
        self.mc.cancel(rid)

    def shutdown(self, data: st.DataObject, rid: str) -> None:
        self.mc.shutdown()

    def unregister(self, data: st.DataObject, rid: str) -> None:
        """Only a shut-down connector is unregistered (it touches no block any more)."""
        if not self.shut or not self.stores:
            return
        name = data.draw(st.sampled_from(sorted(self.stores)), label="unregister")
        self.gone[name] = self.stores.pop(name)
        self.mc.unregister(name)

    def take(self, data: st.DataObject, rid: str) -> None:
        self.taken.extend(self.check_taken(self.mc.take()))

    def check_taken(self, records: list[RequestTransferState]) -> list[RequestTransferState]:
        """Nothing handed back is owed by a registered connector, and no save that completed
        is counted abandoned."""
        for record in records:
            rid = record.request_id
            for name, store in self.stores.items():
                assert rid not in store.owed_saves, f"{rid} handed back while {name} saves"
                assert rid not in store.owed_loads, f"{rid} handed back while {name} loads"
            for name in record.abandoned:
                store = self.stores.get(name) or self.gone[name]
                assert name in self.gone, f"{name} abandoned while registered"
                if record.state is State.finished:
                    assert name not in record.reported
            for name in record.reported:
                store = self.stores.get(name) or self.gone[name]
                assert rid in store.completed
                store.completed.discard(rid)  # the id may be begun again
        return records

    @invariant()
    def everything_awaited_can_still_report(self) -> None:
        """No request waits on a connector that is gone (it would be stranded), and every save
        a registered connector owes is awaited by its request: nothing freed early."""
        for rid in self.mc.request_ids():
            record = self.mc.peek(rid)
            assert record is not None
            assert set(record.awaiting) <= set(self.stores), (rid, record.awaiting)
            assert set(record.owed_loads) <= set(self.stores), (rid, record.owed_loads)
        for name, store in self.stores.items():
            for rid in store.owed_saves:
                record = self.mc.peek(rid)
                assert record is not None and name in record.awaiting, (name, rid)

    def teardown(self) -> None:
        """The documented order: stop new work (cancel what will not finish), shut down, let
        the owed reports arrive, unregister whatever will never report, take: nothing held."""
        for rid in self.mc.request_ids():
            record = self.mc.peek(rid)
            if record is not None and record.state is State.pending:
                self.mc.cancel(rid)
        self.mc.shutdown()
        for store in list(self.stores.values()):
            if store.name == "c":  # one that never reports: unregistered
                self.gone[store.name] = self.stores.pop(store.name)
                self.mc.unregister(store.name)
                continue
            for rid in sorted(store.owed_saves):
                store.report_save(rid)
            for rid in sorted(store.owed_loads):
                store.report_load(rid)
        self.check_taken(self.mc.take())
        assert len(self.mc) == 0, self.mc.oldest(len(self.mc))


# One failure shrunk, not each distinct one: a regression fails in well under the time limit.
ShutdownMachine.TestCase.settings = settings(
    settings(),
    stateful_step_count=40,
    max_examples=settings().max_examples,
    report_multiple_bugs=False,
)
TestShutdown = pytest.mark.timeout(120)(ShutdownMachine.TestCase)


# -- the acceptance cases, one by one ------------------------------------------------------------


def flushing_world() -> tuple[MultiConnector, Store, Store]:
    disk, pd = Store("disk", flushes=True), Store("pd", flushes=True)
    mc = MultiConnector(ConnectorRegistry({"disk": disk, "pd": pd}))
    disk.mc = pd.mc = mc
    return mc, disk, pd


def test_a_connector_flushing_its_saves_from_its_shutdown_releases_every_request() -> None:
    mc, disk, pd = flushing_world()
    disk.saves = pd.saves = True
    for rid in REQUESTS:
        mc.begin(rid)
        mc.request_finished(rid)
    assert mc.take() == []
    mc.shutdown()  # each flushes its owed saves from inside its shutdown()
    taken = mc.take()
    assert [r.request_id for r in taken] == list(REQUESTS)
    assert all(r.state is State.finished and r.abandoned == () for r in taken)
    assert all(r.reported == ("disk", "pd") for r in taken)
    assert len(mc) == 0


def test_reports_after_shutdown_are_applied_and_completed_saves_never_abandoned() -> None:
    mc, disk, pd = flushing_world()
    disk.flushes = pd.flushes = False
    disk.saves = pd.saves = True
    mc.begin("r")
    mc.request_finished("r")
    mc.shutdown()
    assert disk.report_save("r") is Outcome.applied  # after shutdown: still accepted
    mc.unregister("pd")  # pd will never report
    (record,) = mc.take()
    assert (record.state, record.reported, record.abandoned) == ("finished", ("disk",), ("pd",))
    assert mc.connector_counts()["disk"] == {Outcome.applied: 1}


def test_a_shutdown_from_inside_request_finished_does_not_strand_the_request() -> None:
    mc, disk, _ = flushing_world()
    disk.saves = True
    disk.shuts_inside = True  # shuts the aggregator down, then promises its save
    mc.begin("r")
    assert mc.request_finished("r") == (Outcome.applied, None)
    record = mc.peek("r")
    assert record is not None and record.state is State.finishing
    assert disk.report_save("r") is Outcome.applied  # its last save, reported later
    assert [r.request_id for r in mc.take()] == ["r"]


def test_a_load_owed_at_shutdown_is_flushed_and_released() -> None:
    mc, _, pd = flushing_world()
    pd.tokens = 16
    mc.begin("r")
    assert mc.match_tokens("r") == 16
    assert mc.cancel("r") is Outcome.applied  # stop new work: its load is still in flight
    assert mc.take() == []
    mc.shutdown()  # pd flushes the load
    (record,) = mc.take()
    assert (record.state, record.loaded) == ("cancelled", True)


@pytest.mark.parametrize(
    "call",
    [
        lambda mc: mc.begin("n"),
        lambda mc: mc.request_finished("p"),
        lambda mc: mc.match_tokens("p"),
    ],
    ids=["begin", "request_finished", "match_tokens"],
)
def test_new_work_after_shutdown_is_refused_saying_how_to_drain(call: Any) -> None:
    mc, _, _ = flushing_world()
    mc.begin("p")
    mc.shutdown()
    with pytest.raises(ShutDownError) as info:
        call(mc)
    message = str(info.value)
    for words in ("shut down", "cancel()", "reports", "unregister()", "take()"):
        assert words in message, message

"""Early reports: a connector may report a save before its request_finished answer is recorded.

A connector that completes the save on a thread it starts inside ``request_finished``, or that
reports from inside ``request_finished`` itself, reports while the aggregator is still asking.
The report is kept (``Outcome.early``) and decided once the answers are recorded: applied when
the connector said it saves, counted as what it would have been after the answers otherwise.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pytest

from multiconnector import (
    ConnectorFailures,
    ConnectorRegistry,
    MultiConnector,
    Outcome,
    State,
)
from multiconnector.rule import transfer_report
from tests.test_threads import frequent_switches


class Reporting:
    """Answers ``request_finished`` with ``saves``, after calling ``report`` (if any) from
    inside the call: what a connector that completes its save at once, or on a thread it
    starts there, does."""

    def __init__(self, saves: bool = True, raises: Exception | None = None) -> None:
        self.saves = saves
        self.raises = raises
        self.report: Callable[[str], Any] | None = None
        self.got: list[Any] = []
        self.on_finished_calls: list[tuple[str, tuple[int, ...]]] = []

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, None]:
        if self.report is not None:
            self.got.append(self.report(request_id))
        return self.saves, None

    def on_finished(self, request_id: str, blocks: Sequence[int]) -> None:
        self.on_finished_calls.append((request_id, tuple(blocks)))
        if self.raises is not None:
            raise self.raises


def aggregator(**connectors: Reporting | None) -> MultiConnector:
    return MultiConnector(ConnectorRegistry(connectors))


def test_the_rule_keeps_a_report_it_cannot_decide_yet() -> None:
    pending = State.pending
    assert transfer_report(pending, (), (), (), "a", early=()) == (
        Outcome.early,
        None,
        (),
        False,
    )
    assert transfer_report(pending, (), (), (), "a", early=("a",))[0] is Outcome.duplicate
    assert transfer_report(State.cancelled, (), (), (), "a", early=("b",))[0] is Outcome.early
    # An awaited report is applied whatever else is asked.
    assert transfer_report(State.finishing, ("a",), ("a",), (), "a", early=())[0] is (
        Outcome.applied
    )
    assert transfer_report(pending, (), (), (), "a")[0] is Outcome.phantom


def test_a_report_from_inside_request_finished_completes_the_request() -> None:
    a = Reporting()
    mc = aggregator(a=a)
    a.report = lambda rid: mc.transfer_finished(rid, "a", [7])
    mc.begin("r")
    assert mc.request_finished("r", [7]) == (Outcome.applied, None)
    assert a.got == [Outcome.early]
    assert a.on_finished_calls == [("r", (7,))]  # called back once the answer is recorded
    (done,) = mc.take()
    assert done.state is State.finished and done.awaiting == () and done.expected == ("a",)
    assert mc.counts() == {Outcome.applied: 2}  # request_finished, and a's report: once
    assert mc.connector_counts()["a"] == {Outcome.applied: 1}


def test_an_early_report_of_no_save_is_counted_as_the_phantom_it_is() -> None:
    a, b = Reporting(saves=True), Reporting(saves=False)
    mc = aggregator(a=a, b=b)
    b.report = lambda rid: mc.transfer_finished(rid, "b")
    mc.begin("r")
    mc.request_finished("r")
    assert b.got == [Outcome.early]
    record = mc.peek("r")
    assert record is not None and record.state is State.finishing and record.awaiting == ("a",)
    assert mc.connector_counts()["b"] == {Outcome.phantom: 1}
    assert b.on_finished_calls == []
    assert mc.transfer_finished("r", "a") is Outcome.applied
    assert [r.request_id for r in mc.take()] == ["r"]


def test_early_reports_are_decided_on_the_answers_alone() -> None:
    # b reports after a, both before the answers: b is a phantom of a finishing request, not a
    # terminal report because a's report (decided too) finished it.
    a, b = Reporting(saves=True), Reporting(saves=False)
    mc = aggregator(a=a, b=b)
    a.report = lambda rid: mc.transfer_finished(rid, "a")
    b.report = lambda rid: mc.transfer_finished(rid, "b")
    mc.begin("r")
    mc.request_finished("r")
    assert a.got == b.got == [Outcome.early]
    assert mc.connector_counts() == {"a": {Outcome.applied: 1}, "b": {Outcome.phantom: 1}}
    assert [r.state for r in mc.take()] == [State.finished]


def test_a_second_early_report_is_a_duplicate_counted_at_once() -> None:
    a = Reporting()
    mc = aggregator(a=a)
    a.report = lambda rid: (mc.transfer_finished(rid, "a"), mc.transfer_finished(rid, "a"))
    mc.begin("r")
    mc.request_finished("r")
    assert a.got == [(Outcome.early, Outcome.duplicate)]
    assert mc.connector_counts()["a"] == {Outcome.applied: 1, Outcome.duplicate: 1}
    assert a.on_finished_calls == [("r", ())]


def test_unknown_and_not_ready_names_are_decided_at_once() -> None:
    a = Reporting()
    mc = aggregator(a=a, dead=None)
    a.report = lambda rid: (mc.transfer_finished(rid, "ghost"), mc.transfer_finished(rid, "dead"))
    mc.begin("r")
    mc.request_finished("r")
    assert a.got == [(Outcome.unknown_connector, Outcome.not_ready)]
    assert mc.peek("r") is not None  # still awaits a


def test_a_batch_from_inside_request_finished_is_kept_per_request() -> None:
    a = Reporting()
    mc = aggregator(a=a)
    mc.begin("other")
    a.report = lambda rid: mc.transfer_finished_many("a", [rid, "other", rid], [3])
    mc.begin("r")
    mc.request_finished("r")
    assert a.got == [[Outcome.early, Outcome.phantom, Outcome.duplicate]]
    assert a.on_finished_calls == [("r", (3,))]
    assert [r.request_id for r in mc.take()] == ["r"]
    assert mc.connector_counts()["a"] == {
        Outcome.applied: 1,
        Outcome.phantom: 1,
        Outcome.duplicate: 1,
    }


def test_an_early_report_drains_a_request_a_cancel_overtook() -> None:
    a = Reporting()
    mc = aggregator(a=a)

    def cancel_then_report(rid: str) -> Outcome:
        assert mc.cancel(rid) is Outcome.applied
        assert mc.take() == []  # kept back while asked
        return mc.transfer_finished(rid, "a")

    a.report = cancel_then_report
    mc.begin("r")
    assert mc.request_finished("r") == (Outcome.overtaken, None)
    assert a.got == [Outcome.early]
    (done,) = mc.take()
    assert done.state is State.cancelled and done.awaiting == ()
    assert mc.connector_counts()["a"] == {Outcome.drained: 1}
    assert a.on_finished_calls == []  # a drain is not called back


def test_request_finished_by_decides_the_reports_that_came_while_it_was_claimed() -> None:
    a = Reporting()
    mc = aggregator(a=a)
    mc.begin("r")
    record = mc.peek("r")
    assert record is not None
    claim = object()
    mc._asking[id(record)] = claim  # a request_finished_by between its claim and its update
    assert mc.transfer_finished("r", "a", [1]) is Outcome.early
    del mc._asking[id(record)]
    assert mc.request_finished_by("r", ["a"]) is Outcome.applied
    assert a.on_finished_calls == [("r", (1,))]
    assert [r.state for r in mc.take()] == [State.finished]


def test_an_early_reports_raising_callback_is_raised_after_the_answers_are_applied() -> None:
    a = Reporting(raises=RuntimeError("boom"))
    mc = aggregator(a=a)
    a.report = lambda rid: mc.transfer_finished(rid, "a")
    mc.begin("r")
    with pytest.raises(ConnectorFailures) as caught:
        mc.request_finished("r")
    assert caught.value.failed == ("a",)
    assert caught.value.result == (Outcome.applied, None)
    assert [r.state for r in mc.take()] == [State.finished]


# -- threads ---------------------------------------------------------------------------------

#: Where in the window a saver's report comes: inside request_finished, from a thread started
#: there (racing the answer), or after request_finished returned.
WHEN = ("inside", "racing", "after")


class Racing:
    """A saver that reports each request at a random point of the window."""

    def __init__(self, name: str, mc: Callable[[], MultiConnector], seed: int) -> None:
        self.name = name
        self.mc = mc
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.delivered: set[str] = set()  # marked before the report is sent
        self.later: list[str] = []
        self.threads: list[threading.Thread] = []
        self.outcomes: list[Outcome] = []

    def deliver(self, rid: str) -> None:
        with self.lock:
            self.delivered.add(rid)
        outcome = self.mc().transfer_finished(rid, self.name)
        with self.lock:
            self.outcomes.append(outcome)

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, None]:
        with self.lock:
            when = self.rng.choice(WHEN)
        if when == "inside":
            self.deliver(request_id)
        elif when == "racing":
            thread = threading.Thread(target=self.deliver, args=(request_id,))
            with self.lock:
                self.threads.append(thread)
            thread.start()
        else:
            with self.lock:
                self.later.append(request_id)
        return True, None


@pytest.mark.parametrize("stripes", [1, 4])
def test_reports_from_every_point_of_the_window_strand_nothing_and_free_nothing_early(
    stripes: int, factory: Callable[..., MultiConnector] = MultiConnector
) -> None:
    names = ("a", "b", "c")
    box: list[MultiConnector] = []
    savers = {n: Racing(n, lambda: box[0], seed) for seed, n in enumerate(names)}
    mc = factory(ConnectorRegistry(savers), stripes=stripes)
    box.append(mc)
    workers, per_worker = 8, 60
    taken: list[tuple[str, set[str]]] = []
    taken_lock = threading.Lock()
    errors: list[BaseException] = []

    def take() -> None:
        for record in mc.take():
            owed = {n for n, s in savers.items() if record.request_id not in s.delivered}
            with taken_lock:
                taken.append((record.request_id, owed))

    def worker(w: int) -> None:
        try:
            for k in range(per_worker):
                rid = f"w{w}-r{k}"
                mc.begin(rid)
                assert mc.request_finished(rid)[0] is Outcome.applied
                take()
                for saver in savers.values():
                    with saver.lock:
                        later, saver.later = saver.later, []
                    for pending in later:
                        saver.deliver(pending)
                take()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    with frequent_switches():
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for saver in savers.values():
            for t in saver.threads:
                t.join()
            for pending in saver.later:
                saver.deliver(pending)
        take()
    assert errors == []
    total = workers * per_worker
    # Nothing freed early: every record was handed back after all its saves were delivered.
    assert [rid for rid, owed in taken if owed] == []
    # Nothing stranded: every request was handed back, exactly once.
    assert sorted(rid for rid, _ in taken) == sorted(
        f"w{w}-r{k}" for w in range(workers) for k in range(per_worker)
    )
    assert len(mc) == 0 and mc._early == {} and mc._asking == {}
    # Every report counted once, as applied: none was lost, none counted twice.
    counts: Mapping[str, Mapping[Outcome, int]] = mc.connector_counts()
    assert {n: dict(counts[n]) for n in names} == {n: {Outcome.applied: total} for n in names}
    assert mc.counts()[Outcome.applied] == total * (len(names) + 1)
    # The window was hit: some reports came early, the others after the answers.
    returned = {o for s in savers.values() for o in s.outcomes}
    assert returned == {Outcome.early, Outcome.applied}

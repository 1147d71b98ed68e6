"""Early load reports: a connector may report its load before match_tokens recorded it.

A connector that starts its load inside ``get_num_new_matched_tokens`` (or on a thread it
starts there) may call ``load_finished`` before ``match_tokens`` returns, so before the
aggregator recorded it as the loader. The report is kept (``Outcome.early``) and decided once
the loader is recorded, as if it arrived right after: applied when it is the chosen loader,
counted as what it then is otherwise.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from multiconnector import (
    ConnectorFailures,
    ConnectorRegistry,
    MultiConnector,
    Outcome,
    State,
)
from multiconnector.rule import load_report


class Loader:
    """Answers ``get_num_new_matched_tokens`` with ``tokens``, after calling ``report`` (if
    any) from inside the call."""

    def __init__(self, tokens: int | None = 4, raises: Exception | None = None) -> None:
        self.tokens = tokens
        self.raises = raises
        self.report: Callable[[str], Any] | None = None
        self.got: list[Any] = []
        self.loads: list[str] = []

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, None]:
        return False, None

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int | None:
        if self.report is not None:
            self.got.append(self.report(request_id))
        return self.tokens

    def on_load_finished(self, request_id: str) -> None:
        self.loads.append(request_id)
        if self.raises is not None:
            raise self.raises


def aggregator(**connectors: Loader | None) -> MultiConnector:
    mc = MultiConnector(ConnectorRegistry(connectors))
    mc.begin("r")
    return mc


def test_the_load_rule_keeps_a_report_it_cannot_decide_yet() -> None:
    pending, cancelled = State.pending, State.cancelled
    assert load_report(pending, None, "a", early=()) == (Outcome.early, False)
    assert load_report(pending, None, "a", early=("a",))[0] is Outcome.duplicate
    assert load_report(cancelled, "a", "a", early=("b",))[0] is Outcome.early
    # Decided: the chosen loader's report applied once, a terminal request's drained once.
    assert load_report(pending, "a", "a") == (Outcome.applied, True)
    assert load_report(pending, "a", "a", loaded=True) == (Outcome.duplicate, True)
    assert load_report(pending, "a", "a", loaded=True, abandoned=("a",))[0] is (
        Outcome.unregistered
    )
    assert load_report(pending, "a", "a", loader_gone=True)[0] is Outcome.unregistered
    assert load_report(pending, "a", "b")[0] is Outcome.phantom
    assert load_report(cancelled, "a", "a") == (Outcome.drained, True)
    assert load_report(cancelled, "a", "a", loaded=True)[0] is Outcome.terminal
    assert load_report(cancelled, "a", "a", loader_gone=True)[0] is Outcome.terminal
    assert load_report(cancelled, "a", "b")[0] is Outcome.terminal
    assert load_report(None, "a", "a") == (Outcome.unknown_request, False)


def test_a_load_reported_from_inside_the_match_is_applied_once_the_loader_is_recorded() -> None:
    a = Loader()
    mc = aggregator(a=a)
    a.report = lambda rid: mc.load_finished(rid, "a")
    assert mc.match_tokens("r") == 4
    assert a.got == [Outcome.early]
    assert a.loads == ["r"]  # called back once the loader is recorded
    record = mc.peek("r")
    assert record is not None and record.loader == "a" and record.loaded
    assert mc.connector_counts()["a"] == {Outcome.applied: 1}
    assert mc._matching == {} and mc._early_loads == {}
    # Its load is not in flight: finished at once, handed back.
    mc.request_finished("r")
    assert [r.request_id for r in mc.take()] == ["r"]


def test_an_early_load_report_of_a_connector_not_chosen_is_a_phantom() -> None:
    a, b = Loader(tokens=4), Loader(tokens=2)
    mc = aggregator(a=a, b=b)
    b.report = lambda rid: mc.load_finished(rid, "b")
    assert mc.match_tokens("r") == 4
    assert b.got == [Outcome.early]
    assert b.loads == []
    assert mc.connector_counts()["b"] == {Outcome.phantom: 1}
    assert mc.load_finished("r", "a") is Outcome.applied


def test_a_second_early_load_report_is_a_duplicate_counted_at_once() -> None:
    a = Loader()
    mc = aggregator(a=a)
    a.report = lambda rid: (mc.load_finished(rid, "a"), mc.load_finished(rid, "a"))
    mc.match_tokens("r")
    assert a.got == [(Outcome.early, Outcome.duplicate)]
    assert mc.connector_counts()["a"] == {Outcome.applied: 1, Outcome.duplicate: 1}
    assert a.loads == ["r"]


def test_unknown_and_not_ready_names_are_decided_at_once() -> None:
    a = Loader()
    mc = aggregator(a=a, dead=None)
    a.report = lambda rid: (mc.load_finished(rid, "ghost"), mc.load_finished(rid, "dead"))
    mc.match_tokens("r")
    assert a.got == [(Outcome.unknown_connector, Outcome.not_ready)]


def test_a_none_answer_decides_the_early_report_against_the_loader_recorded_before() -> None:
    a, b = Loader(tokens=4), Loader(tokens=None)
    mc = aggregator(a=a, b=b)
    a.report = lambda rid: mc.load_finished(rid, "a")
    assert mc.match_tokens("r") is None  # b does not know yet: nothing recorded
    assert a.got == [Outcome.early]
    assert mc.connector_counts()["a"] == {Outcome.phantom: 1}  # no loader was recorded
    record = mc.peek("r")
    assert record is not None and record.loader is None
    # A loader chosen before: its report during a later None match is applied after it.
    b.tokens = 0
    a.report = None
    assert mc.match_tokens("r") == 4
    b.tokens = None
    a.report = lambda rid: mc.load_finished(rid, "a")
    assert mc.match_tokens("r") is None
    assert a.got[-1] is Outcome.early
    assert mc.connector_counts()["a"] == {Outcome.phantom: 1, Outcome.applied: 1}
    assert a.loads == ["r"]


def test_an_overtaking_cancel_keeps_the_request_until_the_match_returns() -> None:
    a = Loader()
    mc = aggregator(a=a)

    def cancel_then_report(rid: str) -> Outcome:
        assert mc.cancel(rid) is Outcome.applied
        assert mc.take() == []  # kept back while asked
        return mc.load_finished(rid, "a")

    a.report = cancel_then_report
    assert mc.match_tokens("r") == 4
    assert a.got == [Outcome.early]
    (done,) = mc.take()
    assert done.state is State.cancelled and done.loader is None  # no loader recorded
    assert mc.connector_counts()["a"] == {Outcome.terminal: 1}
    assert a.loads == []


def test_an_early_report_drains_the_load_of_a_loader_chosen_before_a_cancel() -> None:
    a = Loader()
    mc = aggregator(a=a)
    assert mc.match_tokens("r") == 4  # a chosen, its load in flight

    def cancel_then_report(rid: str) -> Outcome:
        mc.cancel(rid)
        assert mc.take() == []  # its load is in flight, and it is asked again
        return mc.load_finished(rid, "a")

    a.report = cancel_then_report
    assert mc.match_tokens("r") == 4
    assert a.got == [Outcome.early]
    (done,) = mc.take()
    assert done.state is State.cancelled and done.loaded
    assert mc.connector_counts()["a"] == {Outcome.drained: 1}
    assert a.loads == []  # a drain is not called back


def test_a_loader_unregistered_while_asked_reports_early_as_unregistered() -> None:
    a = Loader()
    mc = aggregator(a=a)

    def gone_then_report(rid: str) -> Outcome:
        outcome = mc.load_finished(rid, "a")
        mc.unregister("a")
        return outcome

    a.report = gone_then_report
    assert mc.match_tokens("r") == 4
    assert a.got == [Outcome.early]
    record = mc.peek("r")
    assert record is not None and record.loader == "a" and record.loader_gone
    assert mc.connector_counts()["a"] == {Outcome.unregistered: 1}


def test_an_early_reports_raising_callback_is_raised_after_the_loader_is_recorded() -> None:
    a = Loader(raises=RuntimeError("boom"))
    mc = aggregator(a=a)
    a.report = lambda rid: mc.load_finished(rid, "a")
    with pytest.raises(ConnectorFailures) as caught:
        mc.match_tokens("r")
    assert caught.value.failed == ("a",)
    assert caught.value.result == 4
    record = mc.peek("r")
    assert record is not None and record.loaded


def test_a_match_interrupted_while_asking_decides_its_early_reports() -> None:
    class Interrupting(Loader):
        def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int:
            self.got.append(mc.load_finished(request_id, "a"))
            raise KeyboardInterrupt

    a = Interrupting()
    mc = aggregator(a=a)
    with pytest.raises(KeyboardInterrupt):
        mc.match_tokens("r")
    assert a.got == [Outcome.early]
    assert mc._matching == {} and mc._early_loads == {}
    assert mc.connector_counts()["a"] == {Outcome.phantom: 1}  # nothing was recorded


def test_a_load_reported_from_a_thread_started_in_the_match_is_never_lost() -> None:
    a = Loader()
    mc = aggregator(a=a)
    threads: list[threading.Thread] = []

    def on_a_thread(rid: str) -> None:
        thread = threading.Thread(target=lambda: a.got.append(mc.load_finished(rid, "a")))
        threads.append(thread)
        thread.start()

    a.report = on_a_thread
    for _ in range(50):
        mc.match_tokens("r")
        threads[-1].join()
        record = mc.peek("r")
        assert record is not None and record.loaded, a.got  # early or after: applied
    assert set(a.got) - {None} <= {Outcome.early, Outcome.applied}
    assert mc.connector_counts()["a"] == {Outcome.applied: 50}
    assert len(a.loads) == 50


def test_an_early_report_of_a_request_taken_meanwhile_is_an_unknown_request() -> None:
    a = Loader(tokens=4)
    mc = aggregator(a=a)

    def report_finish_take(rid: str) -> Outcome:
        outcome = mc.load_finished(rid, "a")
        mc.request_finished(rid)  # no saver: finished, nothing in flight
        assert [r.request_id for r in mc.take()] == [rid]
        return outcome

    a.report = report_finish_take
    assert mc.match_tokens("r") == 4  # no longer pending when recorded: nothing recorded
    assert a.got == [Outcome.early]
    assert mc.connector_counts()["a"] == {Outcome.unknown_request: 1}
    assert a.loads == []

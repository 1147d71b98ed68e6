"""MultiConnector: the guarded aggregation rules, one behaviour per test."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import pytest

from multiconnector import (
    ConnectorFailures,
    ConnectorRegistry,
    DuplicateRequestError,
    InvalidAnswerError,
    InvalidArgumentError,
    KeyClashError,
    MultiConnector,
    Outcome,
    State,
    UnknownConnectorError,
    UnknownRequestError,
)
from tests.connectors import Scripted


def make(**connectors: Any) -> MultiConnector:
    return MultiConnector(ConnectorRegistry(connectors))


def finishing(mc: MultiConnector, rid: str = "r") -> None:
    mc.begin(rid)
    mc.request_finished(rid, [1, 2])


def test_none_slot_never_raises() -> None:
    mc = make(a=Scripted(), dead=None)
    finishing(mc)
    assert mc.transfer_finished("r", "dead") is Outcome.not_ready
    assert mc.load_finished("r", "dead") is Outcome.not_ready
    assert mc.get("r").awaiting == ("a",)  # type: ignore[union-attr]
    assert mc.transfer_finished("r", "a") is Outcome.applied


def test_after_cancel_late_events_change_no_state_and_reports_only_drain() -> None:
    mc = make(a=Scripted(), b=Scripted())
    finishing(mc)
    assert mc.cancel("r") is Outcome.applied
    before = mc.get("r")
    for event in (
        lambda: mc.load_finished("r", "a"),
        lambda: mc.cancel("r"),
        lambda: mc.request_finished("r")[0],
        lambda: mc.transfer_finished("r", "ghost"),
    ):
        assert event().ignored
    assert vars_equal(mc.get("r"), before)
    assert mc.take() == []  # a and b may still be reading its blocks
    assert mc.transfer_finished("r", "a") is Outcome.drained
    assert mc.transfer_finished("r", "a") is Outcome.terminal  # no longer awaited
    assert mc.take() == []
    assert mc.transfer_finished("r", "b", [9]) is Outcome.drained
    (taken,) = mc.take()
    assert taken.state is State.cancelled and taken.awaiting == ()
    assert taken.expected == ("a", "b") and taken.reported == ("a", "b")
    assert mc.transfer_finished("r", "a") is Outcome.unknown_request


def vars_equal(a: Any, b: Any) -> bool:
    return attrs.asdict(a) == attrs.asdict(b)


def test_every_awaited_connector_finished_means_awaiting_empty() -> None:
    mc = make(a=Scripted(), b=Scripted(saves=False), c=Scripted())
    finishing(mc)
    record = mc.get("r")
    assert record is not None and record.awaiting == ("a", "c") and record.expected == ("a", "c")
    mc.transfer_finished("r", "c")
    mc.transfer_finished("r", "a")
    (done,) = mc.take()
    assert done.state is State.finished and done.awaiting == () and done.reported == ("a", "c")


@pytest.mark.parametrize("reporter", ["a", "b", "dead", "ghost", "A"])
def test_duplicate_and_phantom_reports_never_finish_early(reporter: str) -> None:
    mc = make(a=Scripted(), b=Scripted(saves=False), c=Scripted(), dead=None)
    finishing(mc)
    if reporter == "a":
        assert mc.transfer_finished("r", "a") is Outcome.applied
    for _ in range(5):
        outcome = mc.transfer_finished("r", reporter)
        assert outcome.ignored
    assert mc.take() == []
    assert mc.get("r").state is State.finishing  # type: ignore[union-attr]
    expected = {
        "a": Outcome.duplicate,
        "b": Outcome.phantom,
        "dead": Outcome.not_ready,
        "ghost": Outcome.unknown_connector,
        "A": Outcome.unknown_connector,
    }[reporter]
    assert mc.connector_counts()[reporter][expected] == 5


def test_no_async_saver_finishes_at_once() -> None:
    mc = make(a=Scripted(saves=False, params={"x": 1}))
    mc.begin("r")
    assert mc.request_finished("r") == (Outcome.applied, {"x": 1})
    (done,) = mc.take()
    assert done.state is State.finished and done.params == {"x": 1}


def test_begin_twice_is_an_error_and_changes_nothing() -> None:
    mc = make(a=Scripted())
    finishing(mc)
    before = mc.get("r")
    with pytest.raises(DuplicateRequestError, match="request_id='r'"):
        mc.begin("r")
    assert vars_equal(mc.get("r"), before)
    mc.cancel("r")
    with pytest.raises(DuplicateRequestError):
        mc.begin("r")  # terminal, draining: still held
    assert mc.transfer_finished("r", "a") is Outcome.drained
    with pytest.raises(DuplicateRequestError):
        mc.begin("r")  # terminal but not yet taken: still held
    mc.take()
    mc.begin("r")  # taken: the id may be used again
    assert mc.get("r").state is State.pending  # type: ignore[union-attr]


def test_request_finished_twice_is_a_duplicate_and_asks_nobody() -> None:
    a = Scripted()
    mc = make(a=a)
    finishing(mc)
    assert mc.request_finished("r") == (Outcome.duplicate, None)
    assert len(a.finished_calls) == 1
    assert mc.request_finished("nope") == (Outcome.unknown_request, None)


def test_params_from_several_connectors_are_merged_without_mutation() -> None:
    pa, pb = {"a": 1}, {"b": 2}
    mc = make(a=Scripted(params=pa), b=Scripted(params=pb), n=Scripted(params=None))
    mc.begin("r")
    _, params = mc.request_finished("r")
    assert params == {"a": 1, "b": 2} and pa == {"a": 1} and params is not pa


def test_clash_leaves_request_finishing_awaiting_every_saver() -> None:
    mc = make(
        a=Scripted(params={"k": 1}),
        b=Scripted(saves=False, params={"k": 2, "j": 0}),
        c=Scripted(params={"j": 1}),
    )
    mc.begin("r")
    with pytest.raises(KeyClashError) as info:
        mc.request_finished("r")
    assert info.value.clashes == {"k": ("a", "b"), "j": ("b", "c")}
    record = mc.get("r")
    assert record is not None
    assert (record.state, record.awaiting, record.params) == (State.finishing, ("a", "c"), None)
    # later events follow the normal rules
    assert mc.request_finished("r")[0] is Outcome.duplicate
    assert mc.transfer_finished("r", "b") is Outcome.phantom
    assert mc.transfer_finished("r", "a") is Outcome.applied
    assert mc.take() == []
    assert mc.transfer_finished("r", "c") is Outcome.applied
    assert [r.state for r in mc.take()] == [State.finished]


def test_raising_connector_does_not_stop_the_others() -> None:
    boom = RuntimeError("disk full")
    a, bad, c = Scripted(params={"a": 1}), Scripted(raises=boom), Scripted(params={"c": 1})
    mc = make(a=a, bad=bad, c=c)
    mc.begin("r")
    with pytest.raises(ConnectorFailures) as info:
        mc.request_finished("r")
    assert info.value.exceptions == (boom,) and info.value.failed == ("bad",)
    assert str(info.value).startswith("1 failure(s) while finishing request 'r'")
    assert info.value.result == (Outcome.applied, {"a": 1, "c": 1})
    assert len(a.finished_calls) == len(c.finished_calls) == 1
    record = mc.get("r")
    assert record is not None and record.awaiting == ("a", "c")  # the failed one made no promise
    assert mc.transfer_finished("r", "bad") is Outcome.phantom


@pytest.mark.parametrize(
    "answer",
    [
        True,
        None,
        (True,),
        (True, None, 1),
        [True, None],
        ("yes", None),
        (1, None),
        (False, 5),
        (True, [1]),
    ],
    ids=repr,
)
def test_every_garbage_answer_is_awaited_its_params_dropped_and_reported(answer: Any) -> None:
    class Garbage:
        def request_finished(self, request_id: str, blocks: Sequence[int]) -> Any:
            return answer

    mc = make(g=Garbage(), a=Scripted(params={"k": 1}))  # type: ignore[arg-type]
    mc.begin("r")
    with pytest.raises(ConnectorFailures) as info:
        mc.request_finished("r")
    assert info.value.failed == ("g",)
    (error,) = info.value.exceptions
    assert isinstance(error, InvalidAnswerError) and isinstance(error, InvalidArgumentError)
    assert error.connector == "g" and error.answer is answer
    assert "'g'" in str(error) and repr(answer)[:8] in str(error)
    # g may have started a save: it is awaited, its params dropped, a's kept.
    assert info.value.result == (Outcome.applied, {"k": 1})
    record = mc.get("r")
    assert record is not None and record.awaiting == ("g", "a")
    assert mc.transfer_finished("r", "a") is Outcome.applied
    assert mc.take() == []  # not freed while g may be saving
    assert mc.transfer_finished("r", "g") is Outcome.applied
    assert [r.state for r in mc.take()] == [State.finished]


def test_a_generator_answer_is_garbage_too() -> None:
    class Lazy:
        def request_finished(self, request_id: str, blocks: Sequence[int]) -> Any:
            yield True
            yield None

    mc = make(lazy=Lazy())  # type: ignore[arg-type]
    mc.begin("r")
    with pytest.raises(ConnectorFailures) as info:
        mc.request_finished("r")
    assert isinstance(info.value.exceptions[0], InvalidAnswerError)
    assert mc.get("r").awaiting == ("lazy",)  # type: ignore[union-attr]


def test_a_raising_connector_next_to_garbage_is_not_awaited() -> None:
    class NotATuple:
        def request_finished(self, request_id: str, blocks: Sequence[int]) -> Any:
            return None

    mc = make(n=NotATuple(), bad=Scripted(raises=RuntimeError("x")))  # type: ignore[arg-type]
    mc.begin("r")
    with pytest.raises(ConnectorFailures) as info:
        mc.request_finished("r")
    assert info.value.failed == ("n", "bad")
    assert mc.get("r").awaiting == ("n",)  # type: ignore[union-attr]


def test_unregister_releases_requests_awaiting_it() -> None:
    mc = make(a=Scripted(), b=Scripted())
    finishing(mc, "r1")
    finishing(mc, "r2")
    mc.transfer_finished("r2", "a")
    mc.unregister("b")
    r1 = mc.get("r1")
    assert r1 is not None and (r1.state, r1.awaiting, r1.abandoned) == (
        State.finishing,
        ("a",),
        ("b",),
    )
    (r2,) = mc.take()
    assert (r2.request_id, r2.state, r2.abandoned) == ("r2", State.finished, ("b",))
    assert mc.transfer_finished("r1", "b") is Outcome.unregistered
    mc.register("b", Scripted())  # a new registration does not revive the old promise
    assert mc.transfer_finished("r1", "b") is Outcome.unregistered
    assert mc.transfer_finished("r1", "a") is Outcome.applied
    assert [r.request_id for r in mc.take()] == ["r1"]


def test_unregister_directly_on_the_registry_applies_the_rule_too() -> None:
    registry = ConnectorRegistry({"a": Scripted()})
    mc = MultiConnector(registry)
    finishing(mc)
    registry.unregister("a")
    assert [r.state for r in mc.take()] == [State.finished]


def test_connector_unregistered_while_being_asked_is_not_awaited() -> None:
    holder: dict[str, MultiConnector] = {}

    class Leaving(Scripted):
        def request_finished(
            self, request_id: str, blocks: Sequence[int]
        ) -> tuple[bool, Mapping[str, Any] | None]:
            holder["mc"].unregister("leaving")  # re-entrant call: no lock is held
            return True, None

    mc = make(a=Scripted(), leaving=Leaving())
    holder["mc"] = mc
    finishing(mc)
    record = mc.get("r")
    assert record is not None
    assert (record.awaiting, record.expected, record.abandoned) == (
        ("a",),
        ("a", "leaving"),
        ("leaving",),
    )


def test_connector_reporting_from_inside_a_callback_does_not_deadlock() -> None:
    mc = make(a=Scripted(), b=Scripted())
    finishing(mc, "other")

    class Chatty(Scripted):
        def on_finished(self, request_id: str, blocks: Sequence[int]) -> None:
            super().on_finished(request_id, blocks)
            mc.transfer_finished("other", "b")

    mc.register("c", Chatty())
    finishing(mc, "r")
    assert mc.transfer_finished("r", "c") is Outcome.applied
    assert mc.get("other").awaiting == ("a",)  # type: ignore[union-attr]


def test_ranks_are_plain_names() -> None:
    mc = make(**{"pd@0": Scripted(), "pd@1": Scripted(saves=True)})
    finishing(mc)
    assert mc.transfer_finished("r", "pd@0") is Outcome.applied
    assert mc.transfer_finished("r", "pd@0") is Outcome.duplicate
    assert mc.take() == []
    assert mc.transfer_finished("r", "pd@1") is Outcome.applied
    assert len(mc.take()) == 1


def test_take_hands_each_terminal_request_back_once_in_order() -> None:
    mc = make(a=Scripted())
    for rid in ("r1", "r2", "r3"):
        finishing(mc, rid)
    mc.transfer_finished("r2", "a")
    mc.cancel("r3")  # draining: a may still read its blocks
    mc.transfer_finished("r3", "a")  # drained: safe to free
    mc.transfer_finished("r1", "a")
    assert [(r.request_id, r.state) for r in mc.take()] == [
        ("r2", State.finished),
        ("r3", State.cancelled),
        ("r1", State.finished),
    ]
    assert mc.take() == [] and len(mc) == 0 and mc.request_ids() == []


def test_on_finished_called_once_after_the_update() -> None:
    a = Scripted()
    mc = make(a=a)
    finishing(mc)
    mc.transfer_finished("r", "a", [4, 5])
    mc.transfer_finished("r", "a", [4, 5])
    assert a.on_finished_calls == [("r", (4, 5))]


def test_failing_callback_is_raised_after_the_state_changed() -> None:
    class Failing(Scripted):
        def on_finished(self, request_id: str, blocks: Sequence[int]) -> None:
            raise OSError("callback")

    mc = make(a=Failing())
    finishing(mc)
    with pytest.raises(ConnectorFailures) as info:
        mc.transfer_finished("r", "a")
    assert info.value.failed == ("a",)
    assert [r.state for r in mc.take()] == [State.finished]


def test_load_selection_by_name() -> None:
    a, b, c = Scripted(tokens=0), Scripted(tokens=8), Scripted(tokens=16)
    mc = make(a=a, dead=None, b=b, c=c)
    mc.begin("r")
    assert mc.match_tokens("r", 4) == 8
    assert mc.get("r").loader == "b"  # type: ignore[union-attr]
    assert mc.load_finished("r", "c") is Outcome.phantom
    assert mc.load_finished("r", "b") is Outcome.applied
    assert mc.load_finished("r", "b") is Outcome.duplicate
    assert b.loads == ["r"]
    mc.cancel("r")
    assert mc.load_finished("r", "b") is Outcome.terminal
    assert mc.load_finished("nope", "b") is Outcome.unknown_request


def test_load_not_known_yet_remembers_nothing() -> None:
    a, b = Scripted(tokens=8), Scripted(tokens=None)
    mc = make(a=a, b=b)
    mc.begin("r")
    assert mc.match_tokens("r") is None
    assert mc.get("r").loader is None  # type: ignore[union-attr]
    b.tokens = 0
    assert mc.match_tokens("r") == 8
    a.tokens = 0
    assert mc.match_tokens("r") == 0 and mc.get("r").loader is None  # type: ignore[union-attr]
    with pytest.raises(UnknownRequestError):
        mc.match_tokens("nope")


def test_load_fan_out_isolation() -> None:
    boom = ValueError("boom")
    mc = make(bad=Scripted(raises=boom), b=Scripted(tokens=3))
    mc.begin("r")
    with pytest.raises(ConnectorFailures) as info:
        mc.match_tokens("r")
    assert info.value.result == 3 and info.value.failed == ("bad",)
    assert mc.get("r").loader == "b"  # type: ignore[union-attr]


def test_stats_keyed_by_registration_name() -> None:
    one, two = Scripted(), Scripted(saves=False)  # same class, two names
    mc = make(one=one, two=two, dead=None)
    finishing(mc)
    assert mc.stats() == {"one": {"finished": 1}, "two": {"finished": 1}}


def test_shutdown_attempts_every_connector_and_reports_every_failure() -> None:
    e1, e2 = RuntimeError("one"), OSError("two")
    a, b, c = Scripted(raises=e1), Scripted(), Scripted(raises=e2)
    mc = make(a=a, b=b, c=c)
    with pytest.raises(ConnectorFailures) as info:
        mc.shutdown()
    assert (a.shut, b.shut, c.shut) == (1, 1, 1)
    assert info.value.exceptions == (e1, e2) and info.value.failed == ("a", "c")
    assert isinstance(info.value, ExceptionGroup)


def test_history_is_opt_in() -> None:
    mc = make(a=Scripted())
    finishing(mc)
    assert mc.get("r").history is None  # type: ignore[union-attr]
    traced = MultiConnector(ConnectorRegistry({"a": Scripted()}), trace=True)
    finishing(traced)
    traced.transfer_finished("r", "a")
    traced.transfer_finished("r", "a")  # ignored: not in the history
    (done,) = traced.take()
    assert [(s.event, s.source, s.dest, s.name) for s in done.history or ()] == [
        ("request_finished", State.pending, State.finishing, None),
        ("transfer_finished", State.finishing, State.finished, "a"),
    ]


def test_counts_per_kind_and_connector(caplog: pytest.LogCaptureFixture) -> None:
    mc = make(a=Scripted())
    finishing(mc)
    with caplog.at_level(logging.DEBUG, logger="multiconnector"):
        mc.transfer_finished("r", "zz")
        mc.transfer_finished("r", "a")
        mc.transfer_finished("r", "a")
    counts = mc.counts()
    assert counts[Outcome.unknown_connector] == 1 and counts[Outcome.terminal] == 1
    assert mc.connector_counts()["a"] == {Outcome.applied: 1, Outcome.terminal: 1}
    ignored = [r.getMessage() for r in caplog.records]
    assert len(ignored) == 2 and "unknown_connector" in ignored[0] and "'zz'" in ignored[0]


def test_a_load_report_racing_its_loaders_unregistering_is_unregistered() -> None:
    mc = make(a=Scripted(tokens=4))
    mc.begin("r")
    assert mc.match_tokens("r") == 4
    mc.cancel("r")
    assert mc.take() == []  # a's load may still write its blocks
    mc.unregister("a")  # shut down: the load is over
    (record,) = mc.take()
    # Its load is over, unreported: loaded says only a reported load, loader_gone says this.
    assert (record.state, record.loader, record.loaded) == (State.cancelled, "a", False)
    assert record.loader_gone and not record.in_flight
    assert record.abandoned == ("a",)


def test_a_cancelled_request_drains_its_load() -> None:
    mc = make(a=Scripted(tokens=4))
    mc.begin("r")
    assert mc.match_tokens("r") == 4
    mc.cancel("r")
    assert mc.take() == [] and mc.held() == {"live": 0, "draining": 1, "queued": 0}
    assert [r.request_id for r in mc.oldest(draining=True)] == ["r"]
    assert mc.load_finished("r", "a") is Outcome.drained
    assert mc.load_finished("r", "a") is Outcome.terminal
    (record,) = mc.take()
    assert (record.state, record.loaded, record.loader_gone) == (State.cancelled, True, False)


def test_a_pending_requests_loader_unregistered_then_its_late_load_report() -> None:
    mc = make(a=Scripted(tokens=4))
    mc.begin("r")
    mc.match_tokens("r")
    mc.unregister("a")
    assert mc.load_finished("r", "a") is Outcome.unregistered


def test_a_finished_request_with_its_load_in_flight_is_held() -> None:
    mc = make(a=Scripted(saves=False, tokens=4))
    mc.begin("r")
    mc.match_tokens("r")
    assert mc.request_finished("r") == (Outcome.applied, None)
    assert mc.get("r").state is State.finished  # type: ignore[union-attr]
    assert mc.take() == []
    assert mc.load_finished("r", "a") is Outcome.drained
    assert [r.state for r in mc.take()] == [State.finished]


# -- reading the books: held, oldest, peek, stats, shutdown ---------------------------------------


class Bare:
    """A connector with ``request_finished`` alone: no shutdown, stats, tokens or callbacks."""

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, None]:
        return False, None


def six_requests() -> MultiConnector:
    """p1, p2 pending; f finishing; c cancelled while a saves (draining); q finished (queued);
    ld cancelled while its loader loads (draining)."""
    mc = make(a=Scripted(), ld=Scripted(saves=False, tokens=3))
    for rid in ("p1", "p2", "f", "c", "q", "ld"):
        mc.begin(rid)
    for rid in ("f", "c", "q"):
        mc.request_finished(rid)
    assert mc.cancel("c") is Outcome.applied
    assert mc.transfer_finished("q", "a") is Outcome.applied
    assert mc.match_tokens("ld") == 3
    assert mc.cancel("ld") is Outcome.applied
    return mc


def test_held_tells_live_draining_and_queued_apart() -> None:
    mc = six_requests()
    assert mc.held() == {"live": 3, "draining": 2, "queued": 1}
    assert len(mc) == 6


def test_oldest_reads_in_begin_order_and_filters_the_draining() -> None:
    mc = six_requests()
    assert [r.request_id for r in mc.oldest()] == ["p1"]  # one by default
    assert [r.request_id for r in mc.oldest(3)] == ["p1", "p2", "f"]
    assert [r.request_id for r in mc.oldest(99)] == ["p1", "p2", "f", "c", "q", "ld"]
    assert mc.oldest(0) == []
    assert [r.request_id for r in mc.oldest(99, draining=True)] == ["c", "ld"]
    assert [r.request_id for r in mc.oldest(draining=True)] == ["c"]
    copy = mc.oldest(1, draining=True)[0]
    copy.awaiting = ()  # a copy: the held record keeps awaiting a
    assert mc.get("c").awaiting == ("a",)  # type: ignore[union-attr]


def test_oldest_names_a_bad_argument() -> None:
    mc = six_requests()
    with pytest.raises(InvalidArgumentError) as info:
        mc.oldest(-1)
    assert str(info.value) == "count=-1 (type int) must be an int >= 0"
    with pytest.raises(InvalidArgumentError) as info:
        mc.oldest(1, draining=1)  # type: ignore[arg-type]
    assert str(info.value) == "draining=1 (type int) must be a bool"


def test_peek_refuses_an_empty_request_id() -> None:
    mc = make(a=Scripted())
    with pytest.raises(InvalidArgumentError, match="request_id=''"):
        mc.peek("")


def test_stats_skip_a_connector_without_them_and_report_a_failure_with_the_others() -> None:
    down = RuntimeError("down")
    mc = make(bare=Bare(), bad=Scripted(raises=down), one=Scripted(), dead=None)  # type: ignore[arg-type]
    with pytest.raises(ConnectorFailures) as info:
        mc.stats()
    assert info.value.message == "connectors failed to give stats (connector: bad)"
    assert info.value.exceptions == (down,) and info.value.failed == ("bad",)
    assert info.value.result == {"one": {"finished": 0}}


def test_shutdown_skips_a_connector_without_shutdown_and_names_every_failure() -> None:
    a, c, last = Scripted(raises=RuntimeError("one")), Scripted(raises=OSError("two")), Scripted()
    mc = make(a=a, bare=Bare(), c=c, last=last)  # type: ignore[arg-type]
    with pytest.raises(ConnectorFailures) as info:
        mc.shutdown()
    assert (a.shut, c.shut, last.shut) == (1, 1, 1)
    assert info.value.message == "2 connector(s) failed to shut down: a, c"
    assert info.value.failed == ("a", "c")


# -- what is logged and recorded for the rarer paths -----------------------------------------------


def test_ignored_load_reports_and_savers_given_are_logged_applied_ones_not(
    caplog: pytest.LogCaptureFixture,
) -> None:
    mc = make(a=Scripted(tokens=2))
    mc.begin("r")
    mc.match_tokens("r")
    with caplog.at_level(logging.DEBUG, logger="multiconnector"):
        assert mc.load_finished("r", "a") is Outcome.applied
        assert mc.load_finished("r", "ghost") is Outcome.unknown_connector
        assert mc.request_finished_by("r", ["a"]) is Outcome.applied
        assert mc.request_finished_by("r", ["a"]) is Outcome.duplicate
    assert [r.getMessage() for r in caplog.records] == [
        "ignored load_finished for request 'r' from 'ghost': unknown_connector",
        "ignored request_finished for request 'r' from None: duplicate",
    ]


def test_a_drained_report_is_in_the_history() -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted()}), trace=True)
    finishing(mc)
    mc.cancel("r")
    assert mc.transfer_finished("r", "a") is Outcome.drained
    (done,) = mc.take()
    assert [(s.event, s.source, s.dest, s.name) for s in done.history or ()] == [
        ("request_finished", State.pending, State.finishing, None),
        ("cancel", State.finishing, State.cancelled, None),
        ("transfer_finished", State.cancelled, State.cancelled, "a"),
    ]
    assert mc.counts()[Outcome.drained] == 1
    assert mc.connector_counts() == {"a": {Outcome.drained: 1}}


def test_a_garbage_answer_is_explained_in_full() -> None:
    class Garbage:
        def request_finished(self, request_id: str, blocks: Sequence[int]) -> Any:
            return "yes"

    mc = make(g=Garbage())  # type: ignore[arg-type]
    mc.begin("r")
    with pytest.raises(ConnectorFailures) as info:
        mc.request_finished("r")
    assert str(info.value.exceptions[0]) == (
        "connector 'g' answered request_finished with 'yes' (type str); it must answer a "
        "(saves: bool, params: Mapping | None) pair. It is awaited, in case it started a save, "
        "and its params are dropped"
    )


def test_an_unregistered_saver_given_is_explained() -> None:
    mc = make(a=Scripted())
    mc.begin("r")
    with pytest.raises(UnknownConnectorError) as info:
        mc.request_finished_by("r", ["a", "ghost"])
    assert str(info.value) == (
        "an item of savers='ghost' is not registered (pass allow_unregistered=True if it may "
        "have been unregistered)"
    )
    assert mc.get("r").state is State.pending  # type: ignore[union-attr]


def test_request_finished_by_after_the_registry_changed_awaits_only_who_can_report() -> None:
    # The ready names are cached per registry snapshot: a change must not reuse stale names.
    mc = make(a=Scripted(), b=Scripted())
    mc.begin("r1")
    mc.request_finished("r1")
    mc.unregister("b")
    mc.begin("r2")
    assert mc.request_finished_by("r2", ["a", "b"], allow_unregistered=True) is Outcome.applied
    record = mc.get("r2")
    assert record is not None
    assert (record.awaiting, record.expected, record.abandoned) == (("a",), ("a", "b"), ("b",))
    mc.begin("r3")  # every ready connector saves: the cached names, now (a,)
    assert mc.request_finished("r3") == (Outcome.applied, None)
    assert mc.get("r3").awaiting == ("a",)  # type: ignore[union-attr]
    assert mc.transfer_finished("r2", "a") is Outcome.applied
    assert [r.request_id for r in mc.take()] == ["r2"]


class _Id(str):
    """A str subclass request id."""


def test_contains_is_false_for_ids_not_held_and_for_non_str() -> None:
    mc = make(a=Scripted())
    mc.begin("3")
    assert "3" in mc and _Id("3") in mc
    assert "4" not in mc and _Id("4") not in mc
    assert 3 not in mc and [] not in mc


def test_a_loader_that_also_saves_is_abandoned_once_when_unregistered() -> None:
    mc = make(a=Scripted(tokens=2), b=Scripted(saves=False))
    mc.begin("r")
    assert mc.match_tokens("r") == 2
    mc.request_finished("r")
    mc.unregister("a")
    (record,) = mc.take()
    assert (record.state, record.awaiting, record.loaded) == (State.finished, (), False)
    assert record.loader_gone and record.abandoned == ("a",)


def test_unregistered_savers_are_in_the_history_and_the_counts() -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(), "b": Scripted()}), trace=True)
    finishing(mc)
    mc.unregister("a")
    mc.unregister("b")
    (done,) = mc.take()
    assert [(s.event, s.source, s.dest, s.name) for s in done.history or ()] == [
        ("request_finished", State.pending, State.finishing, None),
        ("connector_gone", State.finishing, State.finishing, "a"),
        ("connector_gone", State.finishing, State.finished, "b"),
    ]
    assert mc.connector_counts() == {"a": {Outcome.abandoned: 1}, "b": {Outcome.abandoned: 1}}


def test_unregistering_the_last_saver_a_cancelled_request_awaits_hands_it_back() -> None:
    mc = make(a=Scripted(), b=Scripted())
    finishing(mc)
    mc.cancel("r")
    mc.unregister("a")
    assert mc.take() == []  # b may still read its blocks
    mc.unregister("b")
    (record,) = mc.take()
    assert (record.state, record.awaiting, record.abandoned) == (State.cancelled, (), ("a", "b"))


def test_an_ignored_cancel_is_logged_an_applied_one_not(caplog: pytest.LogCaptureFixture) -> None:
    mc = make(a=Scripted())
    mc.begin("r")
    with caplog.at_level(logging.DEBUG, logger="multiconnector"):
        assert mc.cancel("r") is Outcome.applied
        assert mc.cancel("r") is Outcome.terminal
        assert mc.cancel("nope") is Outcome.unknown_request
    assert [r.getMessage() for r in caplog.records] == [
        "ignored cancel for request 'r' from None: terminal",
        "ignored cancel for request 'nope' from None: unknown_request",
    ]


def test_get_copies_the_history_too() -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted()}), trace=True)
    finishing(mc)
    copy = mc.get("r")
    assert copy is not None and copy.history is not None
    assert [(s.event, s.dest) for s in copy.history] == [("request_finished", State.finishing)]
    copy.history.clear()
    assert len(mc.get("r").history or ()) == 1  # type: ignore[union-attr]


def test_an_ignored_report_is_logged_in_full(caplog: pytest.LogCaptureFixture) -> None:
    mc = make(a=Scripted())
    finishing(mc)
    with caplog.at_level(logging.DEBUG, logger="multiconnector"):
        assert mc.transfer_finished("r", "zz") is Outcome.unknown_connector
    assert [r.getMessage() for r in caplog.records] == [
        "ignored transfer_finished for request 'r' from 'zz': unknown_connector"
    ]


def test_the_last_report_of_a_request_whose_load_is_in_flight_holds_it() -> None:
    mc = make(a=Scripted(tokens=2))
    mc.begin("r")
    assert mc.match_tokens("r") == 2
    finishing(mc, "s")  # another request, no load: handed back at once
    mc.request_finished("r")
    assert mc.transfer_finished("r", "a") is Outcome.applied
    assert mc.transfer_finished("s", "a") is Outcome.applied
    assert mc.get("r").state is State.finished  # type: ignore[union-attr]
    assert [r.request_id for r in mc.take()] == ["s"]  # a may still be loading r's blocks
    assert mc.load_finished("r", "a") is Outcome.drained
    assert [r.request_id for r in mc.take()] == ["r"]


def test_a_clash_next_to_a_failing_connector_is_raised_inside_connector_failures() -> None:
    boom = RuntimeError("boom")
    mc = make(a=Scripted(params={"k": 1}), b=Scripted(params={"k": 2}), c=Scripted(raises=boom))
    mc.begin("r")
    with pytest.raises(ConnectorFailures) as info:
        mc.request_finished("r")
    first, clash = info.value.exceptions
    assert first is boom and isinstance(clash, KeyClashError)
    assert info.value.failed == ("c",)
    assert info.value.result == (Outcome.applied, None)
    assert clash.result == (Outcome.applied, None)
    record = mc.get("r")
    assert record is not None and (record.awaiting, record.params) == (("a", "b"), None)


def test_a_refused_request_finished_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    mc = make(a=Scripted())
    with caplog.at_level(logging.DEBUG, logger="multiconnector"):
        assert mc.request_finished("nope") == (Outcome.unknown_request, None)
    assert [r.getMessage() for r in caplog.records] == [
        "ignored request_finished for request 'nope' from None: unknown_request"
    ]


class Params(Mapping[str, Any]):
    """A read-only Mapping that is not a dict (and has no ``copy``)."""

    def __init__(self, **items: Any) -> None:
        self._items = items

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Any:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


def test_params_that_are_any_mapping_are_merged() -> None:
    mc = make(a=Scripted(params=Params(k=1)), b=Scripted(params={"j": 2}))
    mc.begin("r")
    assert mc.request_finished("r") == (Outcome.applied, {"k": 1, "j": 2})


def test_the_record_shares_no_params_with_a_connector() -> None:
    theirs = {"k": 1}
    mc = make(a=Scripted(params={}), b=Scripted(params=theirs))
    mc.begin("r")
    assert mc.request_finished("r") == (Outcome.applied, {"k": 1})
    theirs["k"] = 2  # the connector reuses its dict
    assert mc.get("r").params == {"k": 1}  # type: ignore[union-attr]


def test_a_raising_connector_then_garbage_are_both_reported() -> None:
    class Garbage:
        def request_finished(self, request_id: str, blocks: Sequence[int]) -> Any:
            return None

    boom = RuntimeError("boom")
    mc = make(a=Scripted(raises=boom), g=Garbage())  # type: ignore[arg-type]
    mc.begin("r")
    with pytest.raises(ConnectorFailures) as info:
        mc.request_finished("r")
    assert info.value.failed == ("a", "g")
    assert info.value.exceptions[0] is boom
    assert isinstance(info.value.exceptions[1], InvalidAnswerError)


def test_equal_values_for_one_key_clash_unless_allowed() -> None:
    mc = make(a=Scripted(params={"k": 1}), b=Scripted(params={"k": 1}))
    mc.begin("r")
    with pytest.raises(KeyClashError):
        mc.request_finished("r")
    registry = ConnectorRegistry({"a": Scripted(params={"k": 1}), "b": Scripted(params={"k": 1})})
    allowing = MultiConnector(registry, allow_equal_params=True)
    allowing.begin("r")
    assert allowing.request_finished("r") == (Outcome.applied, {"k": 1})


def test_a_bad_registry_is_explained() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        MultiConnector(5)  # type: ignore[arg-type]
    assert str(info.value) == "registry=5 (type int) must be a ConnectorRegistry, a Mapping or None"

"""``transfer_finished_many`` against the single-event path it batches; ``peek``."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from multiconnector import (
    ConnectorFailures,
    ConnectorRegistry,
    InvalidArgumentError,
    InvalidNameError,
    MultiConnector,
    Outcome,
    State,
    UnknownConnectorError,
)
from tests.connectors import Scripted

REQUESTS = ("r0", "r1", "r2", "r3")
NAMES = ("a", "b", "quiet", "dead")
REPORTERS = (*NAMES, "ghost")

ops = st.one_of(
    st.tuples(st.just("begin"), st.sampled_from(REQUESTS)),
    st.tuples(st.just("finish"), st.sampled_from(REQUESTS)),
    st.tuples(st.just("cancel"), st.sampled_from(REQUESTS)),
    st.tuples(st.just("take"), st.none()),
    st.tuples(st.just("unregister"), st.sampled_from(NAMES)),
    st.tuples(st.just("register"), st.sampled_from(NAMES)),
    st.tuples(
        st.just("reports"),
        st.tuples(
            st.sampled_from(REPORTERS),
            st.lists(st.sampled_from((*REQUESTS, "unknown")), max_size=8),
        ),
    ),
)


def connector(name: str) -> Scripted | None:
    """``a`` and ``b`` save asynchronously, ``quiet`` does not, ``dead`` is a None slot."""
    return None if name == "dead" else Scripted(saves=name != "quiet")


def run(program: list[tuple[str, Any]], batched: bool, stripes: int = 64) -> dict[str, Any]:
    """Run ``program`` on a fresh aggregator; reports batched or one call each."""
    made: list[Scripted] = []

    def fresh(name: str) -> Scripted | None:
        c = connector(name)
        if c is not None:
            made.append(c)
        return c

    mc = MultiConnector(
        ConnectorRegistry({n: fresh(n) for n in NAMES}), trace=True, stripes=stripes
    )
    seen: list[Any] = []
    for op, arg in program:
        if op == "begin":
            if arg not in mc:
                mc.begin(arg)
        elif op == "finish":
            seen.append(mc.request_finished(arg, [1]))
        elif op == "cancel":
            seen.append(mc.cancel(arg))
        elif op == "take":
            seen.append([(r.request_id, r.state, r.awaiting, r.abandoned) for r in mc.take()])
        elif op == "unregister":
            if arg in mc.registry:
                mc.unregister(arg)
        elif op == "register":
            if arg not in mc.registry:
                mc.register(arg, fresh(arg))
        else:
            name, ids = arg
            if batched:
                seen.append(mc.transfer_finished_many(name, ids, [7]))
            else:
                seen.append([mc.transfer_finished(rid, name, [7]) for rid in ids])
    held = {}
    for rid in mc.request_ids():
        record = mc.get(rid)
        assert record is not None
        held[rid] = (
            record.state,
            record.awaiting,
            record.expected,
            record.abandoned,
            record.history,
        )
    return {
        "seen": seen,
        "held": held,
        "done": [r.request_id for r in mc._done],
        "counts": mc.counts(),
        "per_connector": mc.connector_counts(),
        "callbacks": [c.on_finished_calls for c in made],
    }


@pytest.mark.parametrize("stripes", [64, 4])
@settings(max_examples=300, deadline=None)
@given(program=st.lists(ops, max_size=40))
def test_batched_reports_match_one_call_each(program: list[tuple[str, Any]], stripes: int) -> None:
    # With 4 stripes a batch of 2 or more ids takes every stripe lock at once, a smaller one
    # takes one lock per report: both ways must be the single-event path, report for report.
    assert run(program, batched=True, stripes=stripes) == run(program, batched=False)


def test_a_batch_releases_a_step_of_requests() -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(), "b": Scripted()}))
    ids = [f"r{i}" for i in range(5)]
    for rid in ids:
        mc.begin(rid)
        mc.request_finished(rid)
    assert mc.transfer_finished_many("a", ids) == [Outcome.applied] * 5
    assert mc.transfer_finished_many("a", ids[:2]) == [Outcome.duplicate] * 2
    assert mc.take() == []
    # A set, as vLLM's get_finished returns: a duplicate id cannot occur, any order is fine.
    assert mc.transfer_finished_many("b", set(ids)) == [Outcome.applied] * 5
    assert sorted(r.request_id for r in mc.take()) == ids
    assert mc.counts() == {Outcome.applied: 15, Outcome.duplicate: 2}


def test_any_iterable_of_ids() -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted()}))
    mc.begin("r")
    mc.request_finished("r")

    def ids() -> Iterator[str]:
        yield "r"
        yield "r"

    assert mc.transfer_finished_many("a", ids()) == [Outcome.applied, Outcome.terminal]
    assert mc.transfer_finished_many("a", []) == []


class _RequestId(str):
    """A str subclass: a valid request id, but not a plain str."""


@pytest.mark.parametrize(
    ("name", "request_ids", "blocks", "error", "argument"),
    [
        (3, ["r"], (), InvalidNameError, "name="),
        ("", [], (), InvalidNameError, "name=''"),  # checked even for an empty batch
        ("a", [""], (), InvalidArgumentError, "an item of request_ids=''"),
        ("a", [_RequestId("r"), 3], (), InvalidArgumentError, "an item of request_ids=3 "),
        ("a", ["r"], {1: 2}, InvalidArgumentError, r"^blocks=\{1: 2\} "),
        ("a", "r", (), InvalidArgumentError, "request_ids="),
        ("a", b"r", (), InvalidArgumentError, "request_ids="),
        ("a", 5, (), InvalidArgumentError, "request_ids="),
        ("a", ["r", 5], (), InvalidArgumentError, "request_ids="),
        ("a", ("r", None), (), InvalidArgumentError, "request_ids="),
        ("a", ["r"], "blocks", InvalidArgumentError, "blocks="),
    ],
)
def test_bad_arguments_change_nothing(
    name: Any, request_ids: Any, blocks: Any, error: type[Exception], argument: str
) -> None:
    saver = Scripted()
    mc = MultiConnector(ConnectorRegistry({"a": saver}))
    mc.begin("r")
    mc.request_finished("r")
    before = mc.get("r")
    with pytest.raises(error, match=argument):
        mc.transfer_finished_many(name, request_ids, blocks)
    after = mc.get("r")
    assert before is not None and after is not None
    assert (after.state, after.awaiting) == (before.state, before.awaiting)
    assert (after.state, after.awaiting) == (State.finishing, ("a",))
    assert mc.counts() == {Outcome.applied: 1}
    assert saver.on_finished_calls == []


class Failing(Scripted):
    """Its ``on_finished`` raises for ids that end in ``!``."""

    def on_finished(self, request_id: str, blocks: Any) -> None:
        super().on_finished(request_id, blocks)
        if request_id.endswith("!"):
            raise OSError(f"no ack for {request_id}")


def test_callback_failures_raised_together_after_every_report() -> None:
    saver = Failing()
    mc = MultiConnector(ConnectorRegistry({"a": saver}))
    ids = ["r1!", "r2", "r3!", "r4"]
    for rid in ids:
        mc.begin(rid)
        mc.request_finished(rid)
    with pytest.raises(ConnectorFailures) as caught:
        mc.transfer_finished_many("a", [*ids, "nope"])
    assert caught.value.result == [Outcome.applied] * 4 + [Outcome.unknown_request]
    assert caught.value.failed == ("a", "a")
    assert [str(e) for e in caught.value.exceptions] == ["no ack for r1!", "no ack for r3!"]
    assert [rid for rid, _ in saver.on_finished_calls] == ids
    assert [r.request_id for r in mc.take()] == ids


@pytest.mark.parametrize("size", [2, 40])  # one lock per report; every stripe at once
@pytest.mark.parametrize("kind", [set, list])
def test_callbacks_run_after_every_report_and_may_change_the_callers_ids(
    size: int, kind: type[Any]
) -> None:
    ids = kind(f"r{i}" for i in range(size))
    given = list(ids)
    seen: list[tuple[str, int]] = []

    class Reporter(Scripted):
        def on_finished(self, request_id: str, blocks: Any) -> None:
            seen.append((request_id, len(mc.take())))  # every report already applied
            ids.clear()  # the caller's ids, changed by a callback while the batch runs

    mc = MultiConnector(ConnectorRegistry({"a": Reporter()}))
    for rid in ids:
        mc.begin(rid)
        mc.request_finished(rid)
    outcomes = mc.transfer_finished_many("a", ids)
    assert outcomes == [Outcome.applied] * size
    assert [rid for rid, _ in seen] == given  # each id called back once, in the given order
    assert seen[0][1] == size and all(n == 0 for _, n in seen[1:])


@pytest.mark.parametrize("size", [3, 40])
def test_a_connector_unregistered_by_a_callback_is_not_called_back_again(size: int) -> None:
    ids = [f"r{i}" for i in range(size)]

    class Leaver(Scripted):
        def on_finished(self, request_id: str, blocks: Any) -> None:
            super().on_finished(request_id, blocks)
            if mc.registry.entry("a") is not None:
                mc.unregister("a")  # shut down after its first callback

    leaver = Leaver()
    mc = MultiConnector(ConnectorRegistry({"a": leaver, "b": Scripted()}))
    for rid in ids:
        mc.begin(rid)
        mc.request_finished(rid)
    # Every report was applied before the first callback; only that callback reached it.
    assert mc.transfer_finished_many("a", ids) == [Outcome.applied] * size
    assert leaver.on_finished_calls == [("r0", ())]
    assert all(mc.peek(rid).awaiting == ("b",) for rid in ids)  # type: ignore[union-attr]


def test_peek_is_the_held_record_get_a_copy() -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted()}))
    assert mc.peek("r") is None
    mc.begin("r")
    mc.request_finished("r")
    record = mc.peek("r")
    assert record is not None and record is mc.peek("r")
    copy = mc.get("r")
    assert copy is not record and copy is not None
    assert (copy.state, copy.awaiting) == (record.state, record.awaiting)
    mc.transfer_finished("r", "a")
    assert record.state is State.finished  # the live record moved on; the copy did not
    assert copy.state is State.finishing
    assert mc.take() == [record]
    assert mc.peek("r") is None


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.sampled_from(("a", "b", "c")), max_size=4),
    st.sampled_from(("pending", "finishing", "cancelled", "unknown")),
)
def test_request_finished_by_matches_asking_the_connectors(savers: list[str], state: str) -> None:
    """Told who saves, the same outcome and record as when the connectors answer it."""

    def made(by: bool) -> tuple[Any, Any]:
        connectors = {n: Scripted(saves=n in savers) for n in ("a", "b", "c")}
        mc = MultiConnector(ConnectorRegistry(connectors), trace=True)
        if state != "unknown":
            mc.begin("r")
        if state == "finishing":
            mc.request_finished("r")
        elif state == "cancelled":
            mc.cancel("r")
        if by:
            outcome = mc.request_finished_by("r", savers)
        else:
            outcome, _ = mc.request_finished("r")
        record = mc.get("r")
        shown = None
        if record is not None:
            shown = (record.state, record.awaiting, record.expected, record.abandoned)
            shown = (*shown, record.history)
        return outcome, (shown, mc.counts(), [r.request_id for r in mc.take()])

    assert made(by=True) == made(by=False)


def test_request_finished_by_abandons_names_that_cannot_report() -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(), "dead": None, "b": Scripted()}))
    mc.begin("r")
    saves = ["ghost", "b", "dead", "a", "b"]
    with pytest.raises(UnknownConnectorError, match="savers='ghost' is not registered"):
        mc.request_finished_by("r", saves)  # a typo, far more often than a saver just gone
    assert mc.peek("r").state is State.pending and mc.counts() == {}  # type: ignore[union-attr]
    assert mc.request_finished_by("r", saves, allow_unregistered=True) is Outcome.applied
    record = mc.peek("r")
    assert record is not None
    assert record.awaiting == ("a", "b")  # registration order
    assert record.expected == ("a", "b", "ghost", "dead")
    assert record.abandoned == ("ghost", "dead")
    assert record.params is None
    assert mc.transfer_finished_many("b", ["r"]) == [Outcome.applied]
    assert mc.transfer_finished_many("ghost", ["r"]) == [Outcome.unregistered]
    assert mc.transfer_finished_many("a", ["r"]) == [Outcome.applied]
    assert [r.state for r in mc.take()] == [State.finished]
    mc.begin("s")
    assert mc.request_finished_by("s", ()) is Outcome.applied
    assert mc.take()[0].state is State.finished
    assert mc.request_finished_by("s", ()) is Outcome.unknown_request


@pytest.mark.parametrize(
    ("request_id", "savers", "error", "argument"),
    [
        (5, ["a"], InvalidArgumentError, "request_id="),
        ("r", "a", InvalidArgumentError, "savers="),
        ("r", 3, InvalidArgumentError, "savers="),
        ("r", ["a", 3], InvalidNameError, "savers="),
        ("r", ("a", ""), InvalidNameError, "savers="),
    ],
)
def test_request_finished_by_bad_arguments_change_nothing(
    request_id: Any, savers: Any, error: type[Exception], argument: str
) -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted()}))
    mc.begin("r")
    with pytest.raises(error, match=argument):
        mc.request_finished_by(request_id, savers)
    record = mc.peek("r")
    assert record is not None and record.state is State.pending
    assert mc.counts() == {}


class _Name(str):
    """A str subclass: a valid connector name, but not a plain str."""


def test_str_subclass_names_are_plain_str_in_the_books() -> None:
    # The hot paths skip the name check for a registered plain str only: a subclass equal to a
    # registered name is still checked and made a plain str, in the records and the counters.
    m = MultiConnector({"a": Scripted(saves=True), "b": Scripted(saves=True)})
    m.begin("r")
    assert m.request_finished_by("r", (_Name("a"), "b")) is Outcome.applied
    record = m.peek("r")
    assert record is not None
    assert record.awaiting == ("a", "b")
    assert all(name.__class__ is str for name in record.awaiting)
    assert m.transfer_finished_many(_Name("a"), ["r"]) == [Outcome.applied]
    assert m.transfer_finished_many(_Name("a"), ["r"]) == [Outcome.duplicate]
    assert m.transfer_finished_many("b", ["r"]) == [Outcome.applied]
    counts = m.connector_counts()
    assert all(name.__class__ is str for name in counts)
    assert counts["a"][Outcome.applied] == 1
    assert counts["a"][Outcome.duplicate] == 1
    assert [taken.request_id for taken in m.take()] == ["r"]


def test_str_subclass_savers_that_cannot_report_are_plain_str_in_the_books() -> None:
    # Registered subclass names, one not ready (abandoned), alone or next to an unregistered
    # plain name: the books hold plain str either way.
    m = MultiConnector({"a": Scripted(saves=True), "dead": None})
    for rid, savers, gone in [
        ("r", (_Name("a"), _Name("dead")), ("dead",)),
        ("s", (_Name("a"), _Name("dead"), "gone"), ("dead", "gone")),
    ]:
        m.begin(rid)
        assert m.request_finished_by(rid, savers, allow_unregistered=True) is Outcome.applied
        record = m.peek(rid)
        assert record is not None
        assert (record.awaiting, record.expected, record.abandoned) == (
            ("a",),
            ("a", *gone),
            gone,
        )
        assert all(n.__class__ is str for n in (*record.expected, *record.abandoned))


def test_str_subclass_request_ids_are_called_back_as_plain_str() -> None:
    saver = Scripted()
    mc = MultiConnector(ConnectorRegistry({"a": saver}))
    mc.begin("r")
    mc.request_finished("r")
    assert mc.transfer_finished_many("a", [_RequestId("r")], range(2)) == [Outcome.applied]
    assert saver.on_finished_calls == [("r", (0, 1))]
    assert saver.on_finished_calls[0][0].__class__ is str


class NoCallback:
    """Saves, and has no ``on_finished``."""

    def request_finished(self, request_id: str, blocks: Any) -> tuple[bool, None]:
        return True, None


def test_a_batch_drains_a_cancelled_request_and_logs_what_it_did_not_apply(
    caplog: pytest.LogCaptureFixture,
) -> None:
    a = Scripted()
    mc = MultiConnector(ConnectorRegistry({"a": a, "b": NoCallback()}), trace=True)
    for rid in ("r", "s"):
        mc.begin(rid)
        mc.request_finished(rid)
    mc.cancel("r")
    with caplog.at_level(logging.DEBUG, logger="multiconnector"):
        assert mc.transfer_finished_many("ghost", ["r", "nope"]) == [
            Outcome.terminal,
            Outcome.unknown_request,
        ]
        assert mc.transfer_finished_many("a", ["r", "s"]) == [Outcome.drained, Outcome.applied]
        assert mc.transfer_finished_many("b", ["r"]) == [Outcome.drained]
    assert [r.getMessage() for r in caplog.records] == [
        "ignored transfer_finished for request 'r' from 'ghost': terminal",
        "ignored transfer_finished for request 'nope' from 'ghost': unknown_request",
        "ignored transfer_finished for request 'r' from 'a': drained",
        "ignored transfer_finished for request 'r' from 'b': drained",
    ]
    assert a.on_finished_calls == [("s", ())]
    (record,) = mc.take()
    assert (record.request_id, record.state, record.awaiting) == ("r", State.cancelled, ())
    assert [(s.event, s.source, s.dest, s.name) for s in record.history or ()][-2:] == [
        ("transfer_finished", State.cancelled, State.cancelled, "a"),
        ("transfer_finished", State.cancelled, State.cancelled, "b"),
    ]
    assert mc.connector_counts()["a"] == {Outcome.drained: 1, Outcome.applied: 1}


def test_a_batch_that_finishes_a_request_whose_load_is_in_flight_holds_it() -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(tokens=2)}))
    mc.begin("r")
    assert mc.match_tokens("r") == 2
    mc.request_finished("r")
    assert mc.transfer_finished_many("a", ["r"]) == [Outcome.applied]
    assert mc.get("r").state is State.finished  # type: ignore[union-attr]
    assert mc.take() == []  # a may still be loading its blocks
    assert mc.load_finished("r", "a") is Outcome.drained
    assert [r.request_id for r in mc.take()] == ["r"]


def test_a_str_subclass_name_reporting_one_request_is_a_plain_str_in_the_books() -> None:
    saver = Scripted()
    m = MultiConnector({"a": saver})
    m.begin("r")
    m.request_finished("r")
    assert m.transfer_finished("r", _Name("a")) is Outcome.applied
    assert m.transfer_finished("r", _Name("a")) is Outcome.terminal
    counts = m.connector_counts()
    assert counts == {"a": {Outcome.applied: 1, Outcome.terminal: 1}}
    assert all(name.__class__ is str for name in counts)

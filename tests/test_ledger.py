"""The core :class:`SaveLedger` and the aggregator against the transfer report rule, and each
other, driven as a vLLM worker drives them (no vLLM needed).

The reference is a :class:`multiconnector.MultiConnector` over the worker's children (all ready,
in configuration order), driven as ``bind_connector_metadata`` and ``get_finished`` drove it
before the ledger: a request the scheduler names is begun if not held, then
``request_finished_by(request_id, savers)``; a child's finished saves are
``transfer_finished_many(name, ids)`` followed by ``take()``, and the requests taken (all
``finished``) are the ones released. After every event both must agree on everything one can
read: who is held, what each awaits, what was released, the per-child outcome counts, and the
ignored events as logged (``request_finished`` duplicates, counted under no name, included).
Both must also agree with :func:`multiconnector.rule.transfer_report` itself, applied to a plain
model of the held requests (:class:`RuleModel`): every report's outcome and every release.

One difference is on purpose (:func:`test_no_savers_is_not_held`): a request with no savers
owes nothing, so the ledger does not hold it and never releases it, where the aggregator
finished it and handed it back to be reported as finished sending.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multiconnector import (
    ConnectorRegistry,
    InvalidArgumentError,
    InvalidNameError,
    InvalidValueError,
    MultiConnector,
    Outcome,
    SaveLedger,
    State,
    UnknownConnectorError,
)
from multiconnector.rule import transfer_report

CHILDREN = ("a", "b", "c")


class Saver:
    """A child as the registry sees it: the worker never asks it anything."""

    def request_finished(self, request_id: str, blocks: Any) -> tuple[bool, None]:
        raise AssertionError("a worker's children are never asked request_finished")


class Reference:
    """The aggregator, driven as the vLLM worker drove it before the ledger."""

    def __init__(self, children: Iterable[str]) -> None:
        self.agg = MultiConnector(ConnectorRegistry({name: Saver() for name in children}))

    def expect(self, savers: Mapping[str, tuple[str, ...]]) -> list[Outcome]:
        agg = self.agg
        outcomes = []
        for request_id, names in savers.items():
            if not names and request_id not in agg:
                continue  # the one difference on purpose: see test_no_savers_is_not_held
            if request_id not in agg:
                agg.begin(request_id)
            outcomes.append(agg.request_finished_by(request_id, names))
        return outcomes

    def report(self, name: str, request_ids: Iterable[str]) -> tuple[list[Outcome], set[str]]:
        outcomes = self.agg.transfer_finished_many(name, request_ids)
        taken = self.agg.take()
        assert all(record.state is State.finished for record in taken)
        return outcomes, {record.request_id for record in taken}

    def held(self) -> dict[str, tuple[str, ...]]:
        """Each held request with what it awaits; every one of them still in ``finishing``."""
        held = {}
        for request_id in self.agg.request_ids():
            record = self.agg.get(request_id)
            assert record is not None and record.state is State.finishing
            held[request_id] = record.awaiting
        return held

    def records(self) -> frozenset[tuple[str, State, tuple[str, ...], tuple[str, ...], Any]]:
        """Every held record's decision state (what its next events depend on)."""
        found = set()
        for request_id in self.agg.request_ids():
            r = self.agg.get(request_id)
            assert r is not None
            found.add((request_id, r.state, r.awaiting, r.expected, r.abandoned))
        return frozenset(found)


class Ignored(logging.Handler):
    """The ``ignored ...`` debug lines of the ``multiconnector`` logger, in order."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("ignored "):
            self.lines.append(message)

    def take(self) -> list[str]:
        lines, self.lines = self.lines, []
        return lines


@contextmanager
def ignored_lines() -> Iterator[Ignored]:
    """Debug logging of the ``multiconnector`` logger on, to this handler only."""
    logger = logging.getLogger("multiconnector")
    handler = Ignored()
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


class RuleModel:
    """The held requests as plain data, changed only by :func:`transfer_report`'s verdicts: what
    the rule itself says each report does (the ``phantom`` of a name that is no child refined
    into ``unknown_connector``, as both sides refine it)."""

    def __init__(self, children: Iterable[str]) -> None:
        self.order = {name: i for i, name in enumerate(children)}
        #: request id -> (awaited, expected), each in configuration order.
        self.held: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}

    def expect(self, savers: Mapping[str, tuple[str, ...]]) -> None:
        for request_id, names in savers.items():
            if names and request_id not in self.held:
                ordered = tuple(sorted(set(names), key=self.order.__getitem__))
                self.held[request_id] = (ordered, ordered)

    def report(self, name: str, ids: Iterable[str], released: set[str]) -> list[Outcome]:
        outcomes = []
        for request_id in ids:
            awaiting, expected = self.held.get(request_id, ((), ()))
            if request_id in self.held:
                state: State | None = State.finishing
            else:
                state = State.finished if request_id in released else None
            outcome, dest, rest, completes = transfer_report(state, awaiting, expected, (), name)
            if outcome is Outcome.phantom and name not in self.order:
                outcome = Outcome.unknown_connector
            if outcome is Outcome.applied:
                assert dest is not None
                if completes:
                    assert dest is State.finished and rest == ()
                    del self.held[request_id]
                    released.add(request_id)
                else:
                    assert dest is State.finishing and rest
                    self.held[request_id] = (rest, expected)
            outcomes.append(outcome)
        return outcomes


Event = tuple[str, Any]

#: The ledger's counters (only ever added to, never read by a decision) and its cache of the
#: rule's verdicts (a function of its keys): not part of the state a decision reads.
COUNTERS = frozenset({"_applied", "_ignored", "_verdicts"})


class Pair:
    """A ledger and its reference, fed the same events and compared after each."""

    def __init__(self, children: tuple[str, ...], log: Ignored, watched: Iterable[str]) -> None:
        self.ledger = SaveLedger(children)
        self.ref = Reference(children)
        self.rule = RuleModel(children)
        self.log = log
        self.watched = tuple(watched)

    def feed(self, events: Iterable[Event]) -> None:
        """Feed ``events`` to both sides, comparing nothing (a sequence already compared)."""
        for kind, arg in events:
            if kind == "expect":
                self.ledger.expect(arg)
                self.ref.expect(arg)
                self.rule.expect(arg)
            else:
                self.ledger.report(*arg, set())
                self.ref.report(*arg)
                self.rule.report(*arg, set())

    def apply(self, event: Event, released: set[str] | None = None) -> None:
        """Feed ``event`` to both sides; compare everything afterwards. ``released`` is the
        set the ledger adds to (a fresh one by default): what it held before must stay."""
        kind, arg = event
        ledger, ref = self.ledger, self.ref
        self.log.take()
        if kind == "expect":
            ledger.expect(arg)
            mine = self.log.take()
            outcomes = ref.expect(arg)
            theirs = self.log.take()
            self.rule.expect(arg)
            # Only duplicates are refused: a worker's requests are never cancelled.
            assert set(outcomes) <= {Outcome.applied, Outcome.duplicate}, outcomes
        else:
            name, ids = arg
            before = set() if released is None else set(released)
            got = set(before) if released is None else released
            ledger.report(name, ids, got)
            mine = self.log.take()
            outcomes, taken = ref.report(name, ids)
            theirs = self.log.take()
            said = set(before)
            assert self.rule.report(name, list(ids), said) == outcomes, (event, outcomes)
            assert said == got, (event, said, got)
            assert got - before == taken, (event, got, taken)
            assert before <= got
            assert len(outcomes) == len(list(ids))
        assert mine == theirs, (event, mine, theirs)
        self.compare()

    def compare(self) -> None:
        ledger, ref = self.ledger, self.ref
        held = ref.held()
        assert ledger.held() == held
        assert {r: awaited for r, (awaited, _) in self.rule.held.items()} == held
        assert len(ledger) == len(ref.agg) == len(held)
        for request_id in self.watched:
            assert (request_id in ledger) == (request_id in ref.agg), request_id
            assert ledger.awaiting(request_id) == held.get(request_id, ()), request_id
        assert ledger.connector_counts() == ref.agg.connector_counts()

    def key(self) -> tuple[Any, ...]:
        """Everything the next events' effects depend on, on both sides: the ledger's whole
        state but its counters, and the aggregator's held records."""
        mine = []
        for slot in SaveLedger.__slots__:
            if slot in COUNTERS:
                continue
            value = getattr(self.ledger, slot)
            if slot == "_since":  # when each began to wait: only the order tells the events
                mine.append(tuple(value))
                continue
            mine.append(frozenset(value.items()) if isinstance(value, dict) else value)
        return (*mine, self.ref.records())


# -- every sequence over a bounded alphabet ----------------------------------------------------

REQUESTS = ("r1", "r2")
#: Every non-empty saver tuple in configuration order, one out of it, one with a repeat.
SAVER_TUPLES = (
    ("a",),
    ("b",),
    ("c",),
    ("a", "b"),
    ("a", "c"),
    ("b", "c"),
    ("a", "b", "c"),
    ("b", "a"),
    ("a", "a"),
)
ALPHABET: tuple[Event, ...] = (
    *(("expect", {r: names}) for r in REQUESTS for names in SAVER_TUPLES),
    *(
        ("report", (name, ids))
        for name in CHILDREN
        for ids in (frozenset({"r1"}), frozenset({"r2"}), frozenset({"r1", "r2"}))
    ),
    ("report", ("a", frozenset({"r9"}))),
    ("report", ("b", frozenset({"r1", "r9"}))),
)
DEPTH = 5


@pytest.mark.slow  # left to `make test-slow`; the random sequences below stay in `make test`
@pytest.mark.timeout(180)  # about 8 s of CPU; the wall time on a busy 2-core machine is more
def test_every_sequence_of_the_alphabet() -> None:
    """Every sequence of up to DEPTH events of ALPHABET, compared after every event.

    Two sequences that reach the same joint state (the ledger's whole state but its counters,
    and the aggregator's held records) behave alike from there on, and counters are only ever
    added to: so each joint state is expanded once, at the least depth that reaches it, by
    replaying the sequence that first reached it on a fresh pair, and every event's effect on
    the counters is compared (absolute counts after it, equal before it). That covers every
    sequence of up to DEPTH events.
    """
    watched = (*REQUESTS, "r9")
    awaited: set[tuple[tuple[str, ...], ...]] = set()
    met: set[Outcome] = set()
    with ignored_lines() as log:
        start = Pair(CHILDREN, log, watched)
        start.compare()
        seen = {start.key()}
        frontier: list[tuple[Event, ...]] = [()]
        for _ in range(DEPTH):
            following: list[tuple[Event, ...]] = []
            for path in frontier:
                for event in ALPHABET:
                    pair = Pair(CHILDREN, log, watched)
                    pair.feed(path)
                    pair.apply(event)
                    awaited.add(tuple(pair.ledger.awaiting(r) for r in REQUESTS))
                    for per in pair.ledger.connector_counts().values():
                        met.update(per)
                    key = pair.key()
                    if key not in seen:
                        seen.add(key)
                        following.append((*path, event))
            frontier = following
    # The search went somewhere: each request was seen awaiting each subset of the children
    # (and nothing), in every combination with the other's, and every kind of report outcome
    # a worker can meet was met.
    assert len(awaited) == 8 * 8
    assert met == {Outcome.applied, Outcome.duplicate, Outcome.phantom, Outcome.unknown_request}
    assert frontier, "no new state at depth DEPTH: DEPTH is needlessly large"


# -- longer random sequences -------------------------------------------------------------------

MANY_CHILDREN = ("p", "q", "r", "s", "t")
MANY_REQUESTS = tuple(f"req-{i}" for i in range(6))
#: A few tuple objects, shared between requests as a step's metadata shares them, and equal
#: tuples that are other objects.
SHARED = (("p", "q"), ("t", "p", "p"), ("s",), ("p", "q", "r", "s", "t"))

saver_tuples = st.one_of(
    st.sampled_from(SHARED),
    st.lists(st.sampled_from(MANY_CHILDREN), min_size=1, max_size=7).map(tuple),
)
report_ids = st.lists(st.sampled_from((*MANY_REQUESTS, "never", "req-9")), max_size=10)


def expects(tuples: st.SearchStrategy[tuple[str, ...]]) -> st.SearchStrategy[Event]:
    """One step's savers: a few requests, each with a tuple of ``tuples``."""
    return st.tuples(
        st.just("expect"),
        st.dictionaries(st.sampled_from(MANY_REQUESTS), tuples, min_size=1, max_size=4),
    )


reports = st.tuples(
    st.just("report"),
    st.tuples(
        st.sampled_from(MANY_CHILDREN),
        st.one_of(
            report_ids,  # repeats and unknown ids: as a list, a tuple, a set
            report_ids.map(tuple),
            report_ids.map(set),
            report_ids.map(frozenset),
        ),
    ),
)
events = st.one_of(expects(saver_tuples), reports)


@given(st.lists(events, max_size=60), st.booleans())
def test_random_sequences(program: list[Event], prefilled: bool) -> None:
    """Longer sequences, more requests and children, batches with repeated and unknown ids;
    ``released`` fresh, or holding what an earlier child's report of the step released (the
    worker passes one set to every child's report of a step): that must stay."""
    with ignored_lines() as log:
        pair = Pair(MANY_CHILDREN, log, (*MANY_REQUESTS, "never"))
        for event in program:
            pair.apply(event, {"released earlier"} if prefilled else None)


@given(st.lists(st.one_of(expects(st.one_of(st.just(()), saver_tuples)), reports), max_size=40))
def test_random_sequences_with_no_savers(program: list[Event]) -> None:
    """As above, with requests that have no savers among the others: the reference skips
    them when not held (the difference on purpose), and both refuse them when held."""
    with ignored_lines() as log:
        pair = Pair(MANY_CHILDREN, log, (*MANY_REQUESTS, "never"))
        for event in program:
            pair.apply(event)


# -- bad input ---------------------------------------------------------------------------------

BAD_IDS = (
    ["r1", 3],
    ["r1", ""],
    ["r1", None],
    ("r1", b"r2"),
    {"r1", 7},
    frozenset({"r1", ""}),
    [""],
)


def _id(ids: Iterable[Any]) -> str:
    """A test id that does not depend on a set's iteration order (which differs between
    processes, and pytest-xdist's workers must collect the same ids)."""
    return f"{type(ids).__name__}-{'-'.join(sorted(map(repr, ids)))}"


@pytest.mark.parametrize("ids", BAD_IDS, ids=_id)
def test_bad_request_ids_change_nothing(ids: Iterable[Any]) -> None:
    """An item of ``request_ids`` that is not a request id raises InvalidArgumentError naming
    it, before any report is applied (valid ids before it included), as the aggregator does."""
    with ignored_lines() as log:
        pair = Pair(CHILDREN, log, ("r1", "r2"))
        pair.apply(("expect", {"r1": ("a",), "r2": ("a", "b")}))
        counts = pair.ledger.connector_counts()
        released = {"earlier"}
        with pytest.raises(InvalidArgumentError, match="request_ids") as raised:
            pair.ledger.report("a", ids, released)
        assert "an item of request_ids" in str(raised.value)
        with pytest.raises(InvalidArgumentError, match="an item of request_ids"):
            pair.ref.report("a", ids)
        assert log.take() == []
        assert released == {"earlier"}
        assert pair.ledger.connector_counts() == counts == {}
        assert pair.ledger.held() == {"r1": ("a",), "r2": ("a", "b")}
        pair.compare()
        # Still usable, and nothing was half applied: r1 is released by its one report.
        pair.apply(("report", ("a", ["r1", "r2"])), released)
        assert released == {"earlier", "r1"}


# -- the difference on purpose -----------------------------------------------------------------


def test_no_savers_is_not_held() -> None:
    """A request with no savers owes nothing: the ledger does not hold it and never releases
    it. The aggregator, driven as the worker drove it, finished it and handed it back by
    take(), which the worker reported as finished sending although vLLM never delayed its
    free."""
    agg = MultiConnector(ConnectorRegistry({name: Saver() for name in CHILDREN}))
    agg.begin("r1")
    assert agg.request_finished_by("r1", ()) is Outcome.applied
    assert [(r.request_id, r.state) for r in agg.take()] == [("r1", State.finished)]

    ledger = SaveLedger(CHILDREN)
    ledger.expect({"r1": ()})
    assert "r1" not in ledger
    assert len(ledger) == 0
    assert ledger.awaiting("r1") == ()
    released: set[str] = set()
    ledger.report("a", ["r1"], released)
    assert released == set()
    assert ledger.connector_counts() == {"a": {Outcome.unknown_request: 1}}

    # Among requests with savers, in either order (one step's tuples are shared objects).
    for savers in ({"r1": (), "r2": ("a",)}, {"r2": ("a",), "r1": ()}):
        ledger = SaveLedger(CHILDREN)
        ledger.expect(savers)
        assert ledger.held() == {"r2": ("a",)}
        released = set()
        ledger.report("a", {"r1", "r2"}, released)
        assert released == {"r2"}

    # Held already: a duplicate finish, for both, whatever the (empty) savers.
    with ignored_lines() as log:
        pair = Pair(CHILDREN, log, ("r1",))
        pair.apply(("expect", {"r1": ("a", "b")}))
        pair.apply(("expect", {"r1": ()}))
        assert pair.ledger.awaiting("r1") == ("a", "b")


def test_a_repeat_after_release_is_terminal_as_to_the_aggregator() -> None:
    """An id repeated in one batch after the report that released it: the aggregator holds the
    finished record until take() and counts the repeat ``terminal``; so does the ledger, for a
    request in the step's ``released``."""
    agg = Reference(CHILDREN)
    agg.expect({"r1": ("a",)})
    outcomes, taken = agg.report("a", ["r1", "r1"])
    assert outcomes == [Outcome.applied, Outcome.terminal]
    assert taken == {"r1"}

    ledger = SaveLedger(CHILDREN)
    ledger.expect({"r1": ("a",)})
    released: set[str] = set()
    ledger.report("a", ["r1", "r1"], released)
    assert released == {"r1"}
    assert ledger.connector_counts() == agg.agg.connector_counts()


def test_one_step_of_every_childs_reports_matches_one_take_per_step() -> None:
    """The worker passes one ``released`` set to every child's report of a step, as it took
    from the aggregator once per step: a later child's report for a request an earlier child's
    report released that step is ``terminal`` on both; in the next step, ``unknown_request``."""
    agg = MultiConnector(ConnectorRegistry({name: Saver() for name in CHILDREN}))
    ledger = SaveLedger(CHILDREN)
    for request_id, names in {"r1": ("a",), "r2": ("a", "b")}.items():
        agg.begin(request_id)
        agg.request_finished_by(request_id, names)
    ledger.expect({"r1": ("a",), "r2": ("a", "b")})
    step = [("a", {"r1", "r2"}), ("b", {"r1", "r2"}), ("c", {"r2"})]
    released: set[str] = set()
    for name, ids in step:
        agg.transfer_finished_many(name, ids)
        ledger.report(name, ids, released)
    assert released == {record.request_id for record in agg.take()} == {"r1", "r2"}
    assert ledger.connector_counts() == agg.connector_counts()
    assert agg.connector_counts()["c"] == {Outcome.terminal: 1}
    agg.transfer_finished_many("b", ["r2"])
    ledger.report("b", ["r2"], set())
    assert ledger.connector_counts() == agg.connector_counts()
    assert ledger.connector_counts()["b"][Outcome.unknown_request] == 1


@pytest.mark.parametrize("ids", ["r1", b"r1", None, 3], ids=repr)
def test_request_ids_that_are_no_collection(ids: Any) -> None:
    """``request_ids`` that is a ``str`` (or bytes), or not iterable, is refused with
    InvalidArgumentError naming it, by the aggregator and the ledger alike; nothing changes."""
    ledger = SaveLedger(CHILDREN)
    ledger.expect({"r1": ("a",)})
    with pytest.raises(InvalidArgumentError, match="request_ids"):
        Reference(CHILDREN).report("a", ids)
    released: set[str] = set()
    with pytest.raises(InvalidArgumentError, match="request_ids"):
        ledger.report("a", ids, released)
    assert ledger.connector_counts() == {}
    assert released == set()
    assert ledger.held() == {"r1": ("a",)}


def test_a_report_from_a_name_that_is_no_child() -> None:
    """Outside a worker's situation (its children report under their own names), as to the
    aggregator: ``unknown_connector`` for a held request, ``unknown_request`` for another,
    and :class:`InvalidNameError` for what is not a connector name, with nothing changed."""
    ref = Reference(CHILDREN)
    ledger = SaveLedger(CHILDREN)
    ref.expect({"r1": ("a",)})
    ledger.expect({"r1": ("a",)})
    ref.report("zz", ["r1", "r9"])
    ledger.report("zz", ["r1", "r9"], set())
    assert ledger.connector_counts() == ref.agg.connector_counts()
    assert ledger.connector_counts()["zz"] == {
        Outcome.unknown_connector: 1,
        Outcome.unknown_request: 1,
    }
    for bad in ("", "a b", 3, None):
        with pytest.raises(InvalidNameError):
            ref.report(bad, ["r1"])  # type: ignore[arg-type]
        with pytest.raises(InvalidNameError):
            ledger.report(bad, ["r1"], set())  # type: ignore[arg-type]
    assert ledger.connector_counts() == ref.agg.connector_counts()
    assert ledger.held() == ref.held() == {"r1": ("a",)}


def test_expect_checks_every_saver_before_anything_changes() -> None:
    """A saver that is not a child raises :class:`UnknownConnectorError` naming it, one that is
    not a connector name :class:`InvalidNameError`, and savers that are not a tuple
    :class:`InvalidArgumentError`; the requests before it in the step are not held either."""
    ledger = SaveLedger(CHILDREN)
    cases: list[tuple[Any, type[Exception]]] = [
        (("a", "zz"), UnknownConnectorError),
        (("a", ""), InvalidNameError),
        (("a", 3), InvalidNameError),
        (["a"], InvalidArgumentError),
        ((["a"],), InvalidNameError),
    ]
    for bad, error in cases:
        with pytest.raises(error, match="savers"):
            ledger.expect({"r1": ("a",), "r2": bad})
        assert len(ledger) == 0
        assert ledger.connector_counts() == {}


def test_membership_of_what_is_no_request_id() -> None:
    ledger = SaveLedger(CHILDREN)
    ledger.expect({"r1": ("a",)})
    assert "r1" in ledger
    for other in ([], 1, None, b"r1"):
        assert other not in ledger
        assert other not in MultiConnector()


def test_held_lists_the_longest_waiting_first() -> None:
    """``held()`` keeps the order the requests finished in, whatever reports came since."""
    ledger = SaveLedger(CHILDREN)
    ledger.expect({"r1": ("a", "b")})
    ledger.expect({"r2": ("a",), "r3": ("b", "c")})
    released: set[str] = set()
    ledger.report("b", ["r3", "r1"], released)
    ledger.report("a", ["r2"], released)
    assert released == {"r2"}
    assert list(ledger.held()) == ["r1", "r3"]
    assert ledger.held() == {"r1": ("a",), "r3": ("c",)}


@pytest.mark.parametrize("bad", ["", 3, None], ids=repr)
def test_expect_checks_the_request_ids_before_anything_changes(bad: Any) -> None:
    ledger = SaveLedger(CHILDREN)
    with pytest.raises(InvalidArgumentError, match="request id of savers"):
        ledger.expect({"r1": ("a",), bad: ("a",)})
    assert len(ledger) == 0


class Id(str):
    pass


def test_str_subclasses_are_held_and_released_as_plain_str() -> None:
    """As the aggregator keeps them: a subclass id or name (from a decoder, say) is a plain
    ``str`` in the books and in what is released; savers may be a tuple subclass."""
    ledger = SaveLedger(CHILDREN)
    ledger.expect({Id("r1"): (Id("b"), "a")})
    assert [type(k) for k in ledger.held()] == [str]
    assert ledger.awaiting("r1") == ("a", "b")
    assert all(type(name) is str for name in ledger.awaiting("r1"))
    released: set[str] = set()
    ledger.report("a", ["r1"], released)
    ledger.report(Id("b"), [Id("r1")], released)
    assert released == {"r1"}
    assert [type(r) for r in released] == [str]


def test_take_overdue_takes_each_request_once_oldest_first_with_its_owing_savers() -> None:
    ledger = SaveLedger(CHILDREN)
    ledger.expect({"r1": ("a", "b")})
    ledger.expect({"r2": ("a",), "r3": ("b", "c")})
    released: set[str] = set()
    ledger.report("b", ["r1"], released)  # r1 owes a alone now
    ledger.report("a", ["r2"], released)  # r2 released: never overdue
    assert released == {"r2"}
    now = time.monotonic()
    assert ledger.take_overdue(3600.0, now) == []  # nobody waited an hour
    taken = ledger.take_overdue(0.0, now + 10)
    assert [(r, owing) for r, owing, _ in taken] == [("r1", ("a",)), ("r3", ("b", "c"))]
    assert all(9.9 < seconds < 11 for _, _, seconds in taken)
    assert ledger.take_overdue(0.0, now + 20) == []  # each taken once
    assert ledger.held() == {"r1": ("a",), "r3": ("b", "c")}  # and still held
    ledger.expect({"r4": ("c",)})
    assert [r for r, _, _ in ledger.take_overdue(0.0, now + 30)] == ["r4"]


def test_take_overdue_stops_at_the_first_request_not_overdue() -> None:
    ledger = SaveLedger(CHILDREN)
    ledger.expect({"r1": ("a",)})
    began = time.monotonic()
    ledger.expect({"r2": ("a",)})
    # r1 and r2 began within the same instant or r1 first: at a cutoff before r2 began, r2 is
    # not taken, and neither is anything after it
    assert [r for r, _, _ in ledger.take_overdue(5.0, began + 5.0)] in (["r1"], ["r1", "r2"])
    ledger.take_overdue(0.0, began + 100)
    assert ledger.take_overdue(0.0, began + 200) == []


@pytest.mark.parametrize(
    ("older_than", "error"),
    [
        (-1.0, InvalidValueError),
        (float("nan"), InvalidValueError),
        ("1", InvalidArgumentError),
        (None, InvalidArgumentError),
        (True, InvalidArgumentError),
    ],
    ids=repr,
)
def test_take_overdue_checks_its_argument_and_changes_nothing(
    older_than: Any, error: type[Exception]
) -> None:
    ledger = SaveLedger(CHILDREN)
    ledger.expect({"r1": ("a",)})
    with pytest.raises(error, match="older_than"):
        ledger.take_overdue(older_than)
    assert [r for r, _, _ in ledger.take_overdue(0.0, time.monotonic() + 1)] == ["r1"]

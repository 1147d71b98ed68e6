"""How one event of the scenario is applied to a world: :func:`_apply`.

It calls the real aggregator (:func:`_call`), and records on the world what the checker saw
on its own (:func:`_observe`) and, while exploring (not replaying), what the event did
(:class:`~.scenario._Last`), for the properties that judge a transition.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..aggregator import MultiConnector
from ..errors import (
    ConnectorFailures,
    InvalidAnswerError,
    KeyClashError,
    RoleError,
    UnknownRequestError,
)
from ..machine import TERMINAL, RequestTransferState, State
from ..outcome import Outcome
from ..rule import counted_name
from . import halves
from .breaker import HEALTH_EVENTS, apply_health, gate, probed, states
from .events import cannot_report
from .reference import counted_rank, settle_loads, settled_early
from .scenario import (
    _ABANDONED,
    _APPLY_ANSWERS,
    _HELD,
    _LOADING,
    _MATCH_ANSWER,
    _PENDING,
    _PER_REQUEST,
    _TAKEN,
    COUNTED_LOAD,
    COUNTED_SAVE,
    GARBAGE,
    LOADER,
    LOADING,
    RAISES,
    ConnectorCrash,
    Event,
    _held,
    _Last,
    _Load,
    _Request,
    _Scenario,
    _World,
    role_of,
)

_EARLY = Outcome.early
_APPLIED = Outcome.applied


def _apply(world: _World, event: Event) -> None:
    """no event raises, except the ConnectorFailures a raising connector documents"""
    kind = event[0]
    world.applied += 1
    requests = world.requests
    request = requests[event[1]] if kind in _PER_REQUEST else None
    if (kind == _APPLY_ANSWERS and request is not None and request.early) or (
        kind == _MATCH_ANSWER and request is not None and request.load_early
    ):
        world.sync()  # the reference decides the early reports from the state before
    if world.dirty:  # replaying a path: nothing reads what happened in between
        last = world.last = None
    else:
        last = world.last = _Last(
            event=event,
            before=tuple(r.view for r in requests),
            phases=tuple(r.phase for r in requests),
            lengths=tuple(
                len(r.record.history or ()) if r.record is not None else 0 for r in requests
            ),
            taken=[],
            registry=world.registry,
            claimed=request is not None and bool(request.asking),
            early=tuple(r.early if r.asking else None for r in requests),
            health=states(world),
        )
        if kind == _APPLY_ANSWERS and request is not None:
            entry = world.mc.registry.entry
            last.savers = tuple(
                (e.name, entry(e.name) is e) for e in halves.savers_asked(request.asking[0])
            )
            if request.early:
                last.settled = settled_early(last, request.early)
        if kind == _MATCH_ANSWER and request is not None and request.load_early:
            last.settled_loads = settle_loads(world, request)
    world.dirty = True
    world.raw = None
    pad = world.scenario.pad
    pad.asked = []
    if pad.finished:
        pad.finished = []
    if kind in HEALTH_EVENTS:
        apply_health(world, event)
        return
    if kind in _LOADING or kind == COUNTED_LOAD:
        assert request is not None
        _apply_load(world, request, event)
        return
    called = _call(world, request, event)
    _observe(world, request, event, called)
    if last is not None:
        last.taken = called.taken
        last.outcomes = called.outcomes
        last.result = called.result
        last.clash = called.clash
        last.answers = called.answers
        last.called = tuple(pad.finished)


class _Called:
    """What the aggregator's call for one event (not a load event) returned or raised."""

    __slots__ = ("abandoned", "answers", "clash", "named", "outcomes", "result", "taken")

    def __init__(self) -> None:
        #: The records ``take()`` handed back.
        self.taken: list[RequestTransferState] = []
        #: As :attr:`_Last.outcomes`.
        self.outcomes: tuple[Outcome, ...] | None = None
        #: The params request_finished returned (or its error's ``result`` carried).
        self.result: Any = None
        #: The params error it raised (a ``KeyClashError``), if any.
        self.clash: BaseException | None = None
        #: The saver answers (choices, answered) a second half applied, with params.
        self.answers: Any = None
        #: For ``unregister``: how many held requests awaited the name.
        self.abandoned = 0
        #: For a counted report: the name the world applied it to (the rule's pick).
        self.named = ""


def _call(world: _World, request: _Request | None, event: Event) -> _Called:
    """Calls the aggregator for ``event``; the errors a connector of the scenario documents
    (it raises, it answers garbage, params clash when checked) are caught and recorded."""
    scenario = world.scenario
    mc = world.mc
    kind = event[0]
    pad = scenario.pad
    called = _Called()
    try:
        if kind == "transfer_finished":
            assert request is not None
            called.outcomes = (mc.transfer_finished(request.request_id, event[2]),)
        elif kind == COUNTED_SAVE:  # as the vLLM adapter applies it: to the rule's pick
            assert request is not None
            record = mc.peek(request.request_id)
            called.named = counted_name(scenario.ranks[event[2]], record, load=False)
            called.outcomes = (mc.transfer_finished(request.request_id, called.named),)
        elif kind == "request_finished":
            assert request is not None
            _request_finished(world, request, event, called)
        elif kind == _APPLY_ANSWERS:
            assert request is not None
            asked, request.asking = request.asking[0], request.asking[1:]
            if request.answers:
                called.answers, request.answers = request.answers[0], request.answers[1:]
            called.result = halves.answer(mc, asked)
            called.outcomes = (called.result[0],)
        elif kind == "request_finished_by":
            assert request is not None
            savers = event[2]
            if len(event) > 3:  # and every name that cannot report, as the registry is now
                ready = ((n, c is not None) for n, c in mc.registry.items())
                savers = (*savers, *cannot_report(scenario, ready))
            called.outcomes = (
                mc.request_finished_by(request.request_id, savers, allow_unregistered=True),
            )
        elif kind == "transfer_finished_many":
            ids = [world.requests[i].request_id for i in event[2]]
            called.outcomes = tuple(mc.transfer_finished_many(event[1], ids))
        elif kind == "cancel":
            assert request is not None
            called.outcomes = (mc.cancel(request.request_id),)
        elif kind == "begin":
            assert request is not None
            mc.begin(request.request_id)
        elif kind == "take":
            called.taken = mc.take()
        elif kind == "unregister":
            name = event[1]
            called.abandoned = sum(1 for r in _held(mc).values() if name in r.awaiting)
            mc.unregister(name)
        elif kind == "register":
            name = event[1]
            mc.register(name, scenario.connectors[name], role_of(scenario.kinds[name]))
        else:  # pragma: no cover - events come from _events
            raise AssertionError(f"unknown event {event!r}")
    except ConnectorFailures as exc:
        # Documented: a connector that raises counts as not saving; the others are applied.
        called.clash = _documented(scenario, exc)
        _carried(called, exc.result)
    except KeyClashError as exc:
        # Checked by "params merged": whether a clash was due, and raised by the right half.
        if not scenario.params:
            raise
        called.clash = exc
        _carried(called, exc.result)
    finally:
        pad.savers = frozenset()
        if pad.params:
            pad.params = {}
    return called


def _request_finished(world: _World, request: _Request, event: Event, called: _Called) -> None:
    """A ``request_finished`` event: the savers' answers chosen, then the call driven whole
    (a subclass with its own request_finished) or its first half (claim and ask; a later
    event applies the answers)."""
    scenario = world.scenario
    mc = world.mc
    pad = scenario.pad
    pad.savers = frozenset(event[2])
    if scenario.params:
        pad.params = dict(event[3])
        pad.answered = []
    if scenario.atomic:
        called.result = mc.request_finished(request.request_id, ())
        called.outcomes = (called.result[0],)
        return
    asked = halves.ask(mc, request.request_id, ())
    if len(asked) != 2:
        request.asking = (*request.asking, asked)
        if scenario.params:
            request.answers = (*request.answers, (event[3], tuple(pad.answered)))
        called.outcomes = ()
    else:
        called.outcomes = (asked[0],)


def _documented(scenario: _Scenario, exc: ConnectorFailures) -> BaseException | None:
    """The params clash ``exc`` carries last (with params), when every other failure is one
    the scenario documents (a raising connector's crash, a garbage answer); else re-raised."""
    errors = list(exc.exceptions)
    clash = None
    if scenario.params:
        clashes = [e for e in errors if isinstance(e, KeyClashError)]
        if len(clashes) == 1 and errors[-1] is clashes[0]:
            clash = errors.pop()
    expected = all(
        (scenario.kinds.get(n) == RAISES and isinstance(e, ConnectorCrash))
        or (scenario.kinds.get(n) == GARBAGE and isinstance(e, InvalidAnswerError))
        or (scenario.kinds.get(n) == LOADER and isinstance(e, RoleError) and e.connector == n)
        for n, e in zip(exc.failed, errors, strict=False)
    ) and len(exc.failed) == len(errors)
    if not expected:
        raise exc
    return clash


def _carried(called: _Called, result: Any) -> None:
    """The result an error carried: an ``(outcome, params)`` pair gives the outcome."""
    called.result = result
    if isinstance(result, tuple) and len(result) == 2:
        called.outcomes = (result[0],)


def _observe(world: _World, request: _Request | None, event: Event, called: _Called) -> None:
    """What the checker saw, independently of the aggregator's bookkeeping: the promised
    saves still owed, the outcomes tallied, the phases of the requests, the records taken."""
    scenario = world.scenario
    requests = world.requests
    tally = world.tally
    kind = event[0]
    outcomes = called.outcomes
    if kind == "request_finished":
        assert request is not None
        # A load-only connector's promise is none: its role rules the save out.
        kinds = scenario.kinds
        request.owed |= {n for n, saves in scenario.pad.asked if saves and kinds.get(n) != LOADER}
        if scenario.params and called.answers is None:
            called.answers = (event[3], tuple(scenario.pad.answered))
        if outcomes:
            tally[outcomes[0], None] = tally.get((outcomes[0], None), 0) + 1
    elif kind == "transfer_finished":
        assert request is not None
        request.owed -= {event[2]}
        assert outcomes is not None
        if outcomes[0] is _EARLY:  # kept: counted when its request_finished applies
            request.early = (*request.early, event[2])
        else:
            tally[outcomes[0], event[2]] = tally.get((outcomes[0], event[2]), 0) + 1
    elif kind == COUNTED_SAVE:
        assert request is not None
        _counted_save(world, request, event, called)
    elif kind == "request_finished_by":
        assert request is not None and outcomes is not None
        # The savers told: each ready one saves (the caller learned so); awaited once applied.
        if outcomes[0] is _APPLIED:
            ready = world.mc.registry.entry
            request.owed |= {n for n in event[2] if (e := ready(n)) and e.connector is not None}
        tally[outcomes[0], None] = tally.get((outcomes[0], None), 0) + 1
    elif kind == _APPLY_ANSWERS:
        assert request is not None
        if outcomes:
            tally[outcomes[0], None] = tally.get((outcomes[0], None), 0) + 1
        if request.early:  # the early reports, decided now: counted as the reference says
            last = world.last
            assert last is not None  # made with the state read first (see _apply)
            for name, outcome in last.settled:
                tally[outcome, name] = tally.get((outcome, name), 0) + 1
            request.early = ()
    elif kind == "transfer_finished_many":
        assert outcomes is not None
        name = event[1]
        for i, outcome in zip(event[2], outcomes, strict=False):
            requests[i].owed -= {name}
            if outcome is _EARLY:
                requests[i].early = (*requests[i].early, name)
            else:
                tally[outcome, name] = tally.get((outcome, name), 0) + 1
    elif kind == "unregister":
        if called.abandoned:
            key = (_ABANDONED, event[1])
            tally[key] = tally.get(key, 0) + called.abandoned
        for r in requests:
            r.owed -= {event[1]}
            if r.load_owed == event[1]:
                r.load_owed = None
            if r.loader == event[1]:
                r.loaded = True  # its load is over: the connector is gone
                r.loader_gone = True
            if r.part == event[1]:
                r.part_owed = False  # its part is over: the connector is gone
    elif kind == "cancel":
        assert request is not None and outcomes is not None
        tally[outcomes[0], None] = tally.get((outcomes[0], None), 0) + 1
        if request.phase == _HELD:
            request.cancelled = True
    elif kind == "begin":
        assert request is not None
        request.phase = _HELD
    for record in called.taken:
        i = world.index.get(record.request_id)
        if i is not None:
            requests[i].phase = _TAKEN
            requests[i].record = record


def _apply_load(world: _World, request: _Request, event: Event) -> None:
    """A load event; the checker's own record of the chosen loader follows what it saw."""
    mc = world.mc
    # Only the machine state is read from the aggregator (never its loader bookkeeping): it
    # decides whether the request is pending (a match counts) or live (a load is due).
    before = mc.peek(request.request_id)
    state = before.state if before is not None else None
    if event[0] == "match_tokens":
        _match(world, request, event, state)
        return
    if event[0] == _MATCH_ANSWER:
        _match_answer(world, request, state)
        return
    if event[0] == "split_load":
        world.mc.choose_loader(request.request_id, event[2], parts=[event[3]])
        if state is _PENDING:  # (else the record keeps what it had)
            _chosen(request, event[2], True)
            if world.last is not None:
                world.last.chose = (event[2], event[3])
            request.part, request.part_owed = event[3], True
        return
    name, routed = _counted_load(world, request, before, event)
    pad = world.scenario.pad
    pad.loads = []
    live = state is not None and state not in TERMINAL
    loader, loaded, gone, owed = (
        request.loader,
        request.loaded,
        request.loader_gone,
        request.load_owed,
    )
    part, part_owed = request.part, request.part_owed
    early = request.load_early if request.matching else None
    outcome = mc.load_finished(request.request_id, name)
    if request.matching and world.scenario.kinds.get(name) in LOADING:
        request.window_loads |= {name}
    if outcome is _EARLY:  # kept: decided (and counted) when its match records the loader
        request.load_early = (*request.load_early, name)
    else:
        tally = world.tally
        tally[outcome, name] = tally.get((outcome, name), 0) + 1
        if not request.matching:  # while asked, the kept report is what the ledger decides
            _delivered(request, name if routed is None else routed, live)
    last = world.last
    if last is not None:
        last.routed = routed
        last.outcomes = (outcome,)
        last.load = _Load(
            request.request_id,
            name,
            live,
            loader,
            loaded,
            gone,
            outcome,
            tuple(pad.loads),
            owed,
            early,
            part,
            part_owed,
        )
        last.called = tuple(pad.finished)


def _counted_save(world: _World, request: _Request, event: Event, called: _Called) -> None:
    """The checker's ledger after a counted connector's save report: it settles the name the
    reference picks (:func:`.reference.counted_rank`), whatever name the world applied it to
    (counted under that one)."""
    assert called.outcomes is not None
    routed = counted_rank(world.scenario.ranks[event[2]], request.owed)
    request.owed -= {routed}
    key = (called.outcomes[0], called.named)
    world.tally[key] = world.tally.get(key, 0) + 1
    if world.last is not None:
        world.last.routed = routed


def _counted_load(
    world: _World, request: _Request, before: RequestTransferState | None, event: Event
) -> tuple[str, str | None]:
    """For a ``load_finished``, its name and ``None``; for a counted connector's load report,
    the name the world applies it to (the rule's pick, on the record ``before``, as the vLLM
    adapter applies it) and the one the checker's ledger says it settles (the reference's)."""
    if event[0] != COUNTED_LOAD:
        return event[2], None
    ranks = world.scenario.ranks[event[2]]
    owing = [request.load_owed, request.part if request.part_owed else None]
    return counted_name(ranks, before, load=True), counted_rank(ranks, [n for n in owing if n])


def _delivered(request: _Request, name: str, live: bool) -> None:
    """The checker's ledger after ``name`` delivered a load report (decided now)."""
    if live and name == request.loader and not request.loader_gone:
        request.loaded = True
    if request.load_owed == name:  # delivered: that connector is done with the blocks
        request.load_owed = None
    if request.part == name and name != request.loader:  # a part delivered, or drained
        request.part_owed = False


def _match(world: _World, request: _Request, event: Event, state: State | None) -> None:
    """match_tokens with the answers ``event`` scripts: its first half (mark and ask; a later
    event records the loader), or the call whole when the factory's class has its own."""
    scenario = world.scenario
    mc = world.mc
    pad = scenario.pad
    pad.tokens = dict(event[2])
    pad.matched = []
    pad.loads = []
    whole = scenario.atomic or type(mc).match_tokens is not MultiConnector.match_tokens
    gate(world)
    try:
        if whole:
            _documented_match(scenario, lambda: mc.match_tokens(request.request_id), state)
        else:
            asked = halves.match_ask(mc, request.request_id)
            if len(asked) != 1:
                request.matching = asked
    finally:
        pad.tokens = {}
        probed(world, pad.matched)
    answers = pad.matched
    if world.last is not None:
        world.last.matched = tuple(n for n, _ in answers)
    decisive = all(tokens is not None for _, tokens in answers)
    chose = next((n for n, tokens in answers if tokens), None) if decisive else None
    entry = mc.registry.entry
    seen = (decisive, chose, tuple((n, entry(n)) for n, _ in answers))
    if request.matching:
        request.match_seen = seen
    elif state is _PENDING and decisive:
        _chosen(request, chose, True)
        if world.last is not None and chose is not None:
            world.last.chose = (chose,)


def _chosen(request: _Request, chose: str | None, current: bool) -> None:
    """The checker's ledger after a decisive match of a pending request chose ``chose``
    (``current``: still the connector it asked)."""
    request.loader = chose
    request.loaded = False
    request.loader_gone = chose is not None and not current
    request.load_owed = chose if current and chose not in request.window_loads else None
    request.part, request.part_owed = None, False  # a choice anew: no part of the old one


def _match_answer(world: _World, request: _Request, state: State | None) -> None:
    """match_tokens' second half: the aggregator records the loader and decides the load
    reports that came early; the checker's ledger follows what it saw (the state now, the
    answers its first half scripted) and the reference's outcomes for those reports."""
    scenario = world.scenario
    mc = world.mc
    pad = scenario.pad
    pad.loads = []
    asked, request.matching = request.matching, ()
    decisive, chose, entries = request.match_seen
    _documented_match(scenario, lambda: halves.match_answer(mc, asked), state)
    if state is _PENDING and decisive:
        current = chose is not None and mc.registry.entry(chose) is dict(entries)[chose]
        _chosen(request, chose, current)
        if world.last is not None and chose is not None:
            world.last.chose = (chose,)
    last = world.last
    assert last is not None or not request.load_early  # made with the state read (see _apply)
    settled = last.settled_loads if last is not None else ()
    tally = world.tally
    live = state is not None and state not in TERMINAL
    for name, outcome in settled:
        tally[outcome, name] = tally.get((outcome, name), 0) + 1
        _delivered(request, name, live)
    request.load_early = ()
    request.match_seen = ()
    request.window_loads = frozenset()
    if last is not None:
        last.called = tuple(pad.finished)
        last.load_called = tuple(pad.loads)


def _documented_match(scenario: _Scenario, call: Callable[[], Any], state: State | None) -> None:
    """Call a match half; the errors the scenario documents (a raising connector counts as 0;
    a request not held) are caught."""
    try:
        call()
    except UnknownRequestError:
        if state is not None:
            raise
    except ConnectorFailures as exc:  # documented: a raising connector counts as 0
        if not all(scenario.kinds.get(n) == RAISES for n in exc.failed) or not all(
            isinstance(e, ConnectorCrash) for e in exc.exceptions
        ):
            raise

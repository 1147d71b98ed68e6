"""``multiconnector check``: an exhaustive model check of the transfer machine, on the real code.

Hypothesis samples interleavings; this explores *every* state of a bounded scenario, the way TLC
does for a TLA+ specification, but it drives the real :class:`~multiconnector.MultiConnector`
rather than a second model that could drift from it. The scenario:

* connector names, each a scripted saver (its ``request_finished`` answer is chosen by the
  event: "request finished with every subset of savers"), a ``None`` slot, or one whose calls
  raise; plus names never registered;
* request ids, each begun at most once;
* the default event alphabet (:data:`ALPHABET`): ``begin``; ``request_finished`` with every subset
  of the registered savers; ``transfer_finished`` for every (request, name), which covers
  duplicates, phantoms, ``None`` slots and unknown names; ``cancel``; ``unregister`` and
  ``register`` of every name; ``take``;
* opt-in, the load side (:data:`LOAD_EVENTS`): ``match_tokens`` for every held request with
  every combination of the ready savers' token answers (0, 1 or ``None``), and
  ``load_finished`` for every (request, name).

A state is the canonical snapshot of what the aggregator shows: the registry's (name, ready)
list, each held request's record (state, awaiting, expected, abandoned), the order requests are
held in, and what :meth:`~multiconnector.MultiConnector.take` would hand back. Each request also
carries what the checker observed on its own, independently of the aggregator's bookkeeping:
which connectors promised an asynchronous save (they answered ``True`` when asked) and have not
yet reported or been unregistered, whether the caller cancelled it, and (load side) which
loader the token answers it scripted chose and whether that loader's completion was delivered
while the request was live. Request ids are
interchangeable, so snapshots are canonicalized over their permutations (symmetry reduction;
``symmetry=False`` turns it off). States, events and the declared transitions come from
:mod:`multiconnector.machine`.

Properties (each PASS or FAIL, with a shortest counterexample):

``no exception``
    No event raises, except the :class:`~multiconnector.ConnectorFailures` a raising connector
    documents.
``terminal absorbing``
    A finished or cancelled request never changes again: not its state, not its bookkeeping.
``no early free``
    A request is ``finished`` (and handed back by ``take()`` as finished) only when every
    connector that promised a save reported it or was unregistered (the unregister rule);
    ``take()`` hands back only terminal requests, each once, as cancelled only if cancelled.
``no leak``
    A request handed back is no longer held; a terminal request is queued for ``take()``; no
    request vanishes without being handed back; once every begun request was handed back the
    aggregator holds nothing.
``load once`` (only with a load event in the alphabet)
    A ``load_finished`` is applied (its ``Outcome``, the connector's ``on_load_finished``)
    exactly when it is the first completion from the loader the latest decisive match chose,
    while the request is live and that loader was not unregistered since it was chosen: at most
    once per match, never from another name, never after terminal, never from an unregistered
    loader or a new connector registered under its name (``unregistered``, no callback); and
    the chosen loader's completion is not lost.
``no trap``
    From every reachable state, events other than ``cancel`` can bring every live request to a
    terminal state (``cancel`` would rescue any trap, so it does not count).
``states reached`` / ``transitions fired``
    Every declared state is entered, every declared (source, event, dest) transition fires, and
    no undeclared one does.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Callable, Collection, Hashable, Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from ._args import Parser, name_list, output_file, split_list
from ._explore import (
    FAIL,
    INCONCLUSIVE,
    NO_EXCEPTION,
    NO_TRAP,
    PASS,
    STATES_REACHED,
    TRANSITIONS_FIRED,
    CheckReport,
    Counterexample,
    PropertyResult,
    TraceStep,
    TransitionCoverage,
    declared_transitions,
    explore,
)
from ._validate import check_bool, check_name, shown
from .aggregator import MultiConnector
from .errors import (
    ConnectorFailures,
    InvalidAnswerError,
    InvalidArgumentError,
    MultiConnectorError,
    UnknownRequestError,
)
from .machine import TERMINAL, RequestTransferState, State, build_machine
from .outcome import Outcome
from .registry import ConnectorRegistry
from .usermachine import validate
from .usermachine.command import add_check_arguments, run_check_cli

__all__ = [
    "ALPHABET",
    "DEFAULT_CONNECTORS",
    "EXIT_STATUS",
    "LOAD_EVENTS",
    "LOAD_ONCE",
    "PROPERTIES",
    "CheckReport",
    "Counterexample",
    "PropertyResult",
    "TraceStep",
    "TransitionCoverage",
    "check_aggregator",
    "declared_transitions",
    "explore",
    "independent",
    "reachable_in",
    "run_cli",
    "validate",
]

#: The kinds of events the aggregator scenario applies.
ALPHABET: Final[tuple[str, ...]] = (
    "begin",
    "request_finished",
    "transfer_finished",
    "cancel",
    "unregister",
    "register",
    "take",
)
#: The load side, opt-in (``events=ALPHABET + LOAD_EVENTS``, or ``--load``): ``match_tokens`` with
#: every answer (0, 1 or ``None``) from each ready saver, and ``load_finished`` for every
#: (request, name). Off by default: it multiplies the default bound's states.
LOAD_EVENTS: Final[tuple[str, ...]] = ("match_tokens", "load_finished")
#: Connector kinds: a scripted saver, one whose calls raise, or ``None`` (a not-ready slot).
SAVER: Final = "saver"
RAISES: Final = "raises"
#: A connector whose ``request_finished`` answers a bare ``True``: not a ``(bool, params)``
#: pair, so it may have started a save (the aggregator must await it) and its answer is
#: reported as an ``InvalidAnswerError``.
GARBAGE: Final = "garbage"
#: The default bound's connectors: two savers (two are needed for a request to wait for a second
#: report). Since request_finished is explored in its two halves, a ``None`` slot (``"none":
#: None``) makes the two-request search about four times larger, and a connector that raises
#: more still; the tests check both with one request.
DEFAULT_CONNECTORS: Final[Mapping[str, str | None]] = {"a": SAVER, "b": SAVER}
DEFAULT_UNKNOWN: Final[tuple[str, ...]] = ("ghost",)

TERMINAL_ABSORBING: Final = "terminal absorbing"
NO_EARLY_FREE: Final = "no early free"
NO_LEAK: Final = "no leak"
#: Reported only when a load event is in the alphabet, after ``no leak``.
LOAD_ONCE: Final = "load once"
#: Every property the aggregator check reports, in report order.
PROPERTIES: Final[tuple[str, ...]] = (
    NO_EXCEPTION,
    TERMINAL_ABSORBING,
    NO_EARLY_FREE,
    NO_LEAK,
    NO_TRAP,
    STATES_REACHED,
    TRANSITIONS_FIRED,
)

_UNBORN, _HELD, _TAKEN = 0, 1, 2
_FINISHED: Final = State.finished
_NOTHING: Final[frozenset[str]] = frozenset()
_CANCELLED: Final = State.cancelled
_PENDING: Final = State.pending
_APPLIED: Final = Outcome.applied
_GONE: Final = Outcome.unregistered

#: What the checker reads of a held record: state, awaiting, expected, abandoned.
View = tuple[State, tuple[str, ...], tuple[str, ...], tuple[str, ...]]
Event = tuple[Any, ...]


class ConnectorCrash(RuntimeError):
    """What a connector of kind ``"raises"`` raises when asked anything."""


@attrs.define(slots=True, eq=False)
class _Pad:
    """Shared by a scenario's connectors: the answer the current event chose, and who was asked."""

    savers: frozenset[str] = frozenset()
    asked: list[tuple[str, bool]] = attrs.field(factory=list)
    #: The token answers the current ``match_tokens`` event chose, by name (absent: 0).
    tokens: Mapping[str, int | None] = attrs.field(factory=dict)
    #: Who was asked for tokens, and what each answered, in the order asked.
    matched: list[tuple[str, int | None]] = attrs.field(factory=list)
    #: Whose ``on_load_finished`` was called (an applied load's callback).
    loads: list[str] = attrs.field(factory=list)


class _Scripted:
    """Saves asynchronously exactly when the current event says so."""

    def __init__(self, name: str, pad: _Pad) -> None:
        self.name, self.pad = name, pad

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, None]:
        saves = self.name in self.pad.savers
        self.pad.asked.append((self.name, saves))
        return saves, None

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int | None:
        tokens = self.pad.tokens.get(self.name, 0)
        self.pad.matched.append((self.name, tokens))
        return tokens

    def on_load_finished(self, request_id: str) -> None:
        self.pad.loads.append(self.name)

    def __repr__(self) -> str:
        return f"scripted {self.name}"


class _Garbage:
    """Answers ``request_finished`` with a bare ``True``: it may have started a save."""

    def __init__(self, name: str, pad: _Pad) -> None:
        self.name, self.pad = name, pad

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> Any:
        self.pad.asked.append((self.name, True))
        return True

    def __repr__(self) -> str:
        return f"garbage {self.name}"


class _Raising:
    """Raises whenever it is asked."""

    def __init__(self, name: str, pad: _Pad) -> None:
        self.name, self.pad = name, pad

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, None]:
        self.pad.asked.append((self.name, False))
        raise ConnectorCrash(f"connector {self.name!r} failed")

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int | None:
        self.pad.matched.append((self.name, 0))  # a connector that raises counts as 0
        raise ConnectorCrash(f"connector {self.name!r} failed")

    def __repr__(self) -> str:
        return f"raising {self.name}"


@attrs.define(slots=True, eq=False)
class _Request:
    """One request id: what the checker saw happen to it, and the aggregator's record of it."""

    request_id: str
    phase: int = _UNBORN
    #: Names that promised a save (answered True) and neither reported nor were unregistered.
    owed: frozenset[str] = frozenset()
    #: Whether ``cancel`` was called while it was held.
    cancelled: bool = False
    #: The aggregator's record while it holds one; the record take() handed back once taken.
    record: RequestTransferState | None = None
    #: ``record``'s (state, awaiting, expected, abandoned) while held, else ``None``.
    view: View | None = None
    #: ``record``'s (loader, loaded, loader_gone) while held: not a property's input, but part
    #: of the state.
    load_view: tuple[str | None, bool, bool] = (None, False, False)
    #: The loader the latest decisive ``match_tokens`` chose, as the checker saw the answers.
    loader: str | None = None
    #: Whether that loader's completion was delivered while the request was live.
    loaded: bool = False
    #: Whether that loader was unregistered since it was chosen: no completion of it is due.
    loader_gone: bool = False
    #: The loader whose load is owed: chosen by the latest decisive match, neither delivered
    #: (at any time) nor unregistered since. ``no early free``'s ledger of the load side.
    load_owed: str | None = None
    #: request_finished calls that asked and have not applied their answers yet (the first
    #: half's result, see MultiConnector._ask), oldest first.
    asking: tuple[tuple[Any, ...], ...] = ()


@attrs.define(slots=True, eq=False)
class _Last:
    """What the latest event did, for the properties that concern a transition."""

    event: Event
    before: tuple[View | None, ...]
    phases: tuple[int, ...]
    lengths: tuple[int, ...]
    taken: list[RequestTransferState]
    fired: list[tuple[str, str, str]] = attrs.field(factory=list)
    load: _Load | None = None


@attrs.frozen(slots=True)
class _Load:
    """One ``load_finished`` as the checker saw it: what was due, and what the aggregator did."""

    request_id: str
    name: str
    #: The request was held and not terminal when the completion arrived.
    live: bool
    #: The checker's chosen loader and whether its completion was already delivered, before.
    loader: str | None
    loaded: bool
    #: Whether the chosen loader was unregistered since it was chosen, before.
    loader_gone: bool
    outcome: Outcome
    #: Whose ``on_load_finished`` the aggregator called.
    callbacks: tuple[str, ...]


@attrs.frozen(kw_only=True)
class _Scenario:
    names: tuple[str, ...]
    kinds: Mapping[str, str | None]
    unknown: tuple[str, ...]
    ids: tuple[str, ...]
    alphabet: frozenset[str]
    factory: Callable[..., MultiConnector]
    pad: _Pad
    connectors: Mapping[str, Any]
    #: Renamings of request indices and connector names under which the scenario is unchanged.
    symmetries: tuple[tuple[tuple[int, ...], Mapping[str, str]], ...]
    interner: _Interner
    #: Drive request_finished whole instead of in its two halves (a factory whose class
    #: overrides request_finished itself: its halves may not be MultiConnector's).
    atomic: bool = False

    def fresh(self) -> _World:
        registry = ConnectorRegistry({n: self.connectors[n] for n in self.names})
        mc = self.factory(registry, trace=True, stripes=1)
        if not isinstance(mc, MultiConnector):
            raise InvalidArgumentError(
                f"factory returned {shown(mc)}; it must return a MultiConnector"
            )
        return _World(self, mc)


class _World:
    """The aggregator under check, plus the checker's own observations.

    What the aggregator shows is read lazily (:meth:`sync`), so replaying a path to a state
    costs only the events themselves.
    """

    __slots__ = (
        "applied",
        "dirty",
        "entries",
        "index",
        "last",
        "log",
        "mc",
        "order",
        "queue",
        "registry",
        "requests",
        "scenario",
    )

    def __init__(self, scenario: _Scenario, mc: MultiConnector) -> None:
        self.scenario = scenario
        self.mc = mc
        self.requests = [_Request(i) for i in scenario.ids]
        self.index = {r: i for i, r in enumerate(scenario.ids)}
        self.last: _Last | None = None
        self.registry: tuple[tuple[str, bool], ...] = ()
        self.order: tuple[int, ...] = ()
        self.queue: tuple[int, ...] = ()
        #: Events applied, and what each fired per request as the checker applied it: (step
        #: number, request index, event, the new steps of that request's history). Complete
        #: when every event was applied with a :meth:`sync` in between (as a trace is replayed).
        self.applied = 0
        self.log: list[tuple[int, int, Event, list[Any]]] = []
        #: The registry's published entries ``registry`` was read from (it publishes a new
        #: mapping on every change), so that an unchanged registry is not read again.
        self.entries: object = None
        # Read lazily: a model being replayed is read only once its path is applied.
        self.dirty = True

    def sync(self) -> None:
        """Read what the aggregator shows, if an event ran since the last read."""
        if not self.dirty:
            return
        self.dirty = False
        mc = self.mc
        index = self.index
        held = _held(mc)
        entries = _entries(mc)
        if entries is not self.entries or entries is None:
            self.entries = entries
            self.registry = tuple((n, c is not None) for n, c in mc.registry.items())
        self.order = tuple(index.get(r, -1) for r in held)
        self.queue = tuple(index.get(r.request_id, -1) for r in _take_queue(mc))
        for r in self.requests:
            record = held.get(r.request_id)
            if record is not None:
                r.record = record
                r.view = (record.state, record.awaiting, record.expected, record.abandoned)
                r.load_view = (record.loader, record.loaded, record.loader_gone)
            else:
                r.view = None
                r.load_view = (None, False, False)
        last = self.last
        if last is not None:
            for i, (r, n) in enumerate(zip(self.requests, last.lengths, strict=True)):
                history = r.record.history if r.record is not None else None
                if history and len(history) > n:
                    new = history[n:]
                    last.fired += [(s.source.value, s.event, s.dest.value) for s in new]
                    self.log.append((self.applied, i, last.event, new))


def _entries(mc: MultiConnector) -> object:
    """The registry's current entries mapping (replaced, never changed, on every change)."""
    return getattr(mc.registry, "_entries", None)


def _held(mc: MultiConnector) -> Mapping[str, RequestTransferState]:
    """The records the aggregator holds, by request id (read, never written)."""
    return mc._requests


def _take_queue(mc: MultiConnector) -> Sequence[RequestTransferState]:
    """What ``take()`` would hand back now, without taking it.

    Read from the aggregator's queue of terminal records, which ``take()`` empties in order:
    taking would be an event, not an observation.
    """
    return mc._done


def _apply(world: _World, event: Event) -> None:
    """no event raises, except the ConnectorFailures a raising connector documents"""
    scenario = world.scenario
    mc = world.mc
    requests = world.requests
    kind = event[0]
    world.applied += 1
    if world.dirty:  # replaying a path: nothing reads what happened in between
        world.last = None
    else:
        world.last = _Last(
            event=event,
            before=tuple(r.view for r in requests),
            phases=tuple(r.phase for r in requests),
            lengths=tuple(
                len(r.record.history or ()) if r.record is not None else 0 for r in requests
            ),
            taken=[],
        )
    world.dirty = True
    pad = scenario.pad
    pad.asked = []
    request = requests[event[1]] if kind in _PER_REQUEST else None
    taken: list[RequestTransferState] = []
    if kind in _LOADING:
        assert request is not None
        _apply_load(world, request, event)
        return
    try:
        if kind == "transfer_finished":
            assert request is not None
            mc.transfer_finished(request.request_id, event[2])
        elif kind == "request_finished":
            assert request is not None
            pad.savers = frozenset(event[2])
            if scenario.atomic:  # a subclass with its own request_finished: driven whole
                mc.request_finished(request.request_id, ())
            else:  # the first half: claim and ask; the answers are applied by a later event
                asked = mc._ask(request.request_id, ())
                if len(asked) != 2:
                    request.asking = (*request.asking, asked)
        elif kind == _APPLY_ANSWERS:
            assert request is not None
            asked, request.asking = request.asking[0], request.asking[1:]
            mc._answer(asked)
        elif kind == "cancel":
            assert request is not None
            mc.cancel(request.request_id)
        elif kind == "begin":
            assert request is not None
            mc.begin(request.request_id)
        elif kind == "take":
            taken = mc.take()
        elif kind == "unregister":
            mc.unregister(event[1])
        elif kind == "register":
            mc.register(event[1], scenario.connectors[event[1]])
        else:  # pragma: no cover - events come from _events
            raise AssertionError(f"unknown event {event!r}")
    except ConnectorFailures as exc:
        # Documented: a connector that raises counts as not saving; the others are applied.
        expected = all(
            (scenario.kinds.get(n) == RAISES and isinstance(e, ConnectorCrash))
            or (scenario.kinds.get(n) == GARBAGE and isinstance(e, InvalidAnswerError))
            for n, e in zip(exc.failed, exc.exceptions, strict=False)
        ) and len(exc.failed) == len(exc.exceptions)
        if not expected:
            raise
    finally:
        pad.savers = frozenset()
    # What the checker saw, independently of the aggregator's bookkeeping.
    if kind == "request_finished":
        assert request is not None
        request.owed |= {name for name, saves in pad.asked if saves}
    elif kind == "transfer_finished":
        assert request is not None
        request.owed -= {event[2]}
    elif kind == "unregister":
        for r in requests:
            r.owed -= {event[1]}
            if r.load_owed == event[1]:
                r.load_owed = None
            if r.loader == event[1]:
                r.loaded = True  # its load is over: the connector is gone
                r.loader_gone = True
    elif kind == "cancel":
        assert request is not None
        if request.phase == _HELD:
            request.cancelled = True
    elif kind == "begin":
        assert request is not None
        request.phase = _HELD
    for record in taken:
        i = world.index.get(record.request_id)
        if i is not None:
            requests[i].phase = _TAKEN
            requests[i].record = record
    if world.last is not None:
        world.last.taken = taken


def _apply_load(world: _World, request: _Request, event: Event) -> None:
    """A load event; the checker's own record of the chosen loader follows what it saw."""
    scenario = world.scenario
    mc = world.mc
    pad = scenario.pad
    # Only the machine state is read from the aggregator (never its loader bookkeeping): it
    # decides whether the request is pending (a match counts) or live (a load is due).
    before = mc.peek(request.request_id)
    state = before.state if before is not None else None
    if event[0] == "match_tokens":
        pad.tokens = dict(event[2])
        pad.matched = []
        try:
            mc.match_tokens(request.request_id)
        except UnknownRequestError:
            if before is not None:
                raise
        except ConnectorFailures as exc:  # documented: a raising connector counts as 0
            if not all(scenario.kinds.get(n) == RAISES for n in exc.failed) or not all(
                isinstance(e, ConnectorCrash) for e in exc.exceptions
            ):
                raise
        finally:
            pad.tokens = {}
        answers = pad.matched
        if state is _PENDING and all(tokens is not None for _, tokens in answers):
            request.loader = next((n for n, tokens in answers if tokens), None)
            request.loaded = False
            request.loader_gone = False
            request.load_owed = request.loader
        return
    name = event[2]
    pad.loads = []
    live = state is not None and state not in TERMINAL
    loader, loaded, gone = request.loader, request.loaded, request.loader_gone
    outcome = mc.load_finished(request.request_id, name)
    if live and name == loader and not gone:
        request.loaded = True
    if request.load_owed == name:  # delivered: that connector is done with the blocks
        request.load_owed = None
    if world.last is not None:
        world.last.load = _Load(
            request.request_id, name, live, loader, loaded, gone, outcome, tuple(pad.loads)
        )


#: The second half of a request_finished: it applies the answers its first half gathered.
_APPLY_ANSWERS: Final = "request_finished_apply"
_PER_REQUEST: Final = frozenset(
    {
        "begin",
        "request_finished",
        _APPLY_ANSWERS,
        "transfer_finished",
        "cancel",
        "match_tokens",
        "load_finished",
    }
)
_LOADING: Final = frozenset(LOAD_EVENTS)
_KINDS: Final = ALPHABET + LOAD_EVENTS


def _events(world: _World) -> list[Event]:
    world.sync()
    scenario = world.scenario
    alphabet = scenario.alphabet
    ids = range(len(world.requests))
    out: list[Event] = []
    if "begin" in alphabet:
        out += [("begin", i) for i in ids if world.requests[i].phase == _UNBORN]
    if "request_finished" in alphabet:
        savers = [n for n, ready in world.registry if ready and scenario.kinds.get(n) == SAVER]
        subsets = [c for k in range(len(savers) + 1) for c in itertools.combinations(savers, k)]
        out += [("request_finished", i, s) for i in ids for s in subsets]
        out += [(_APPLY_ANSWERS, i) for i in ids if world.requests[i].asking]
    if "transfer_finished" in alphabet:
        names = scenario.names + scenario.unknown
        out += [("transfer_finished", i, n) for i in ids for n in names]
    if "cancel" in alphabet:
        out += [("cancel", i) for i in ids]
    if "match_tokens" in alphabet:
        savers = [n for n, ready in world.registry if ready and scenario.kinds.get(n) == SAVER]
        answers = [
            tuple(zip(savers, choice, strict=True))
            for choice in itertools.product((0, 1, None), repeat=len(savers))
        ]
        held = [i for i in ids if world.requests[i].phase == _HELD]
        out += [("match_tokens", i, a) for i in held for a in answers]
    if "load_finished" in alphabet:
        names = scenario.names + scenario.unknown
        out += [("load_finished", i, n) for i in ids for n in names]
    registered = {n for n, _ in world.registry}
    if "unregister" in alphabet:
        out += [("unregister", n) for n in scenario.names if n in registered]
    if "register" in alphabet:
        out += [("register", n) for n in scenario.names if n not in registered]
    if "take" in alphabet:
        out.append(("take",))
    return out


class _Interner:
    """Numbers the distinct request parts and registries, and their renamings, once each.

    Snapshots are then tuples of small ints: cheap to hash, compare and keep.
    """

    def __init__(self, symmetries: Sequence[tuple[tuple[int, ...], Mapping[str, str]]]) -> None:
        self.renamings = [rename for _, rename in symmetries]
        self.ids: dict[Any, int] = {}
        #: renamed[k][id]: the id of the thing numbered ``id``, renamed by renaming ``k``.
        self.renamed: list[dict[int, int]] = [{} for _ in self.renamings]
        #: The canonical key of each raw key (registry, parts, order, queue) met so far: most
        #: events lead to a state already seen, whose canonical form is then a dict look-up.
        self.canonical: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def number(self, thing: Any) -> int:
        found = self.ids.get(thing)
        if found is None:
            found = self.ids[thing] = len(self.ids)
        return found

    def rename(self, k: int, thing: Any, number: int, how: Callable[..., Any]) -> int:
        table = self.renamed[k]
        found = table.get(number)
        if found is None:
            rename = self.renamings[k]
            found = table[number] = self.number(how(thing, rename) if rename else thing)
        return found


def _rename_part(part: Any, rename: Mapping[str, str]) -> Any:
    kind, phase, view, owed, cancelled, load, asking = part
    if load is not None:  # (tag, names and flags): rename the names, keep the flags
        load = tuple(rename.get(x, x) if isinstance(x, str) else x for x in load)
    if asking:
        asking = tuple(
            tuple(sorted((rename.get(n, n), current) for n, current in one)) for one in asking
        )
    if view is not None:
        view = (
            view[0],
            _names_key(rename.get(n, n) for n in view[1]),
            _names_key(rename.get(n, n) for n in view[2]),
            _names_key(rename.get(n, n) for n in view[3]),
        )
    return (
        kind,
        phase,
        view,
        frozenset(rename.get(n, n) for n in owed),
        cancelled,
        load,
        asking,
    )


def _names_key(names: Iterable[str]) -> tuple[str, ...]:
    """A set of names as a key: sorted, each once (see :func:`_part`)."""
    return tuple(sorted(set(names)))


def _part(r: _Request, entry: Callable[[str], Any]) -> tuple[Any, ...]:
    """One request's part of the state: exactly what its future and the properties read.

    Soundness (two states with equal parts have the same futures and the same verdicts):

    * ``awaiting``, ``expected`` and ``abandoned`` are kept as sets (sorted, each name once).
      The aggregator reads them only by membership and emptiness (``name in``, ``is_last`` is
      ``awaiting == (name,)``) and writes them by removing or appending names; ``terminal
      absorbing`` compares a record with itself one event earlier, and its drain rule as
      sets. Their order and repeats are history: ``abandoned`` lists a loader unregistered
      while pending and later the same name unregistered as an awaited saver twice, and
      ``expected`` keeps the registry order of the ask, which the registry part holds anyway.
    * The load side of a live request: the aggregator's (loader, loaded, loader_gone) and the
      checker's own (loader, loaded, loader_gone, load_owed), which ``load once`` compares.
    * The load side of a terminal request: only the loader whose load it drains (the
      aggregator's loader while not ``loaded``: ``load_finished`` and ``take()`` read nothing
      else of a terminal record; ``loader_gone`` is set only while live) and the checker's
      ``load_owed`` (what ``no early free`` reads). ``load once`` reads the checker's loader,
      ``loaded`` and ``loader_gone`` only for a live request (``due`` and the unregistered
      loader's rule), and a terminal request never becomes live again without failing
      ``terminal absorbing`` on that very event.
    * A request handed back keeps no promises: ``no early free`` judged them when ``take()``
      handed it back.
    """
    view = r.view
    load: tuple[Any, ...] | None = None
    if view is not None:
        loader, loaded, gone = r.load_view
        if view[0] in TERMINAL:
            draining = loader if loader is not None and not loaded else None
            if draining is not None or r.load_owed is not None:
                load = ("drain", draining, r.load_owed)
        elif loader is not None or r.loader is not None or r.load_owed is not None:
            load = ("live", loader, loaded, gone, r.loader, r.loaded, r.loader_gone, r.load_owed)
        view = (view[0], _names_key(view[1]), _names_key(view[2]), _names_key(view[3]))
    # A call between its halves: the savers it asked, and whether each is still the
    # connector registered under its name (what its answers' application reads), as a set:
    # the order asked only orders the names it will write to the sets above.
    asking = tuple(
        tuple(sorted((e.name, entry(e.name) is e) for e in asked[4])) for asked in r.asking
    )
    if r.phase == _TAKEN:
        return ("request", r.phase, view, _NOTHING, r.cancelled, None, asking)
    return ("request", r.phase, view, r.owed, r.cancelled, load, asking)


def _rename_registry(registry: Any, rename: Mapping[str, str]) -> Any:
    return (registry[0], tuple((rename.get(n, n), ready) for n, ready in registry[1]))


def _snapshot(world: _World) -> Hashable:
    """The canonical state: the least renaming of the observed state under the symmetries."""
    world.sync()
    scenario = world.scenario
    numbers = scenario.interner
    requests = world.requests
    registry = ("registry", world.registry)
    reg_id = numbers.number(registry)
    part_ids = []
    parts = []
    entry = world.mc.registry.entry
    for r in requests:
        part = _part(r, entry)
        parts.append(part)
        part_ids.append(numbers.number(part))
    # Which requests are held and queued for take() matters, not in what order: no property
    # reads the order (take()'s list is judged record by record), and requests are assumed
    # not to interact except through the registry and take() (docs/check.md, "Reductions").
    # Queued as a set: a request queued twice fails "no early free" on the event that queued
    # it again (take() would hand it back twice), and beyond that the copies differ in no
    # verdict. Without this a bug that re-queues a record on every event (a drain applied
    # again) has no end of states.
    order, queue = tuple(sorted(world.order)), tuple(sorted(set(world.queue)))
    raw = (reg_id, tuple(part_ids), order, queue)
    known = numbers.canonical.get(raw)
    if known is not None:
        return known
    best: tuple[Any, ...] | None = None
    for k, (perm, _) in enumerate(scenario.symmetries):
        moved = [0] * len(requests)
        for i, part in enumerate(parts):
            moved[perm[i]] = numbers.rename(k, part, part_ids[i], _rename_part)
        key = (
            numbers.rename(k, registry, reg_id, _rename_registry),
            tuple(moved),
            tuple(sorted(perm[i] if i >= 0 else -1 for i in order)),
            tuple(sorted(perm[i] if i >= 0 else -1 for i in queue)),
        )
        if best is None or key < best:
            best = key
    assert best is not None
    numbers.canonical[raw] = best
    return best


def _symmetries(
    kinds: Mapping[str, str | None], requests: int, on: bool
) -> tuple[tuple[tuple[int, ...], Mapping[str, str]], ...]:
    """Request-index permutations times renamings of connectors of one kind."""
    identity: tuple[tuple[tuple[int, ...], Mapping[str, str]], ...] = (
        (tuple(range(requests)), {}),
    )
    if not on:
        return identity
    groups: dict[str | None, list[str]] = {}
    for name, kind in kinds.items():
        groups.setdefault(kind, []).append(name)
    renamings: list[dict[str, str]] = [{}]
    for group in groups.values():
        renamings = [
            {**base, **{a: b for a, b in zip(group, p, strict=True) if a != b}}
            for base in renamings
            for p in itertools.permutations(group)
        ]
    return tuple(
        (perm, rename) for perm in itertools.permutations(range(requests)) for rename in renamings
    )


# -- properties ---------------------------------------------------------------------------------


def _terminal_absorbing(world: _World) -> str | None:
    """a finished or cancelled request never changes state; it only drains"""
    world.sync()
    last = world.last
    if last is None:
        return None
    taken = {r.request_id: r for r in last.taken}
    event = last.event
    for i, (r, before) in enumerate(zip(world.requests, last.before, strict=True)):
        if before is None or before[0] not in TERMINAL:
            continue
        record = taken.get(r.request_id)
        now = r.view if record is None else _view(record)
        if now is None or now == before:
            continue
        change = f"{r.request_id} was {_show_view(before)}, then became {_show_view(now)}"
        if now[0] is not before[0]:
            return change
        # The drain: fewer awaited names, each reported or moved to abandoned.
        drained = (
            set(now[1]) <= set(before[1]) and now[2] == before[2] and set(now[3]) >= set(before[3])
        )
        # A request_finished a cancel overtook records its savers, once, when it applies.
        overtaken = (
            event[0] == _APPLY_ANSWERS
            and event[1] == i
            and before[0] is _CANCELLED
            and not before[2]
        )
        if not drained and not overtaken:
            return change
    for source, kind, dest in last.fired:
        if State(source) in TERMINAL and dest != source:
            return f"a request left {source}: {source} --{kind}--> {dest}"
    return None


def _owes(r: _Request) -> list[str]:
    """What the checker's ledger says connectors still owe for ``r``."""
    owing = sorted(r.owed)
    if r.load_owed is not None:
        owing.append(f"{r.load_owed} (load)")
    return owing


def _no_early_free(world: _World) -> str | None:
    """nothing is handed back (or queued for take) while a connector owes a report for it"""
    world.sync()
    if len(set(world.queue)) != len(world.queue):
        twice = sorted({world.requests[i].request_id for i in world.queue if i >= 0})
        return f"{', '.join(twice)} queued for take() more than once: handed back twice"
    for k, r in enumerate(world.requests):
        if r.view is not None and r.view[0] is _FINISHED and r.owed:
            return (
                f"{r.request_id} is finished while {_names(r.owed)} promised a save and has "
                "not reported it"
            )
        if r.view is not None and k in world.queue and _owes(r):
            return (
                f"{r.request_id} is {r.view[0].value} and queued for take() (to be freed) "
                f"while {', '.join(_owes(r))} may still touch its blocks"
            )
    last = world.last
    if last is None:
        return None
    if len({id(record) for record in last.taken}) != len(last.taken):
        return "take() handed back a request twice"
    for record in last.taken:
        i = world.index.get(record.request_id)
        if i is None or last.phases[i] != _HELD:
            what = "an unknown request" if i is None else "a request not held"
            return f"take() handed back {record.request_id}, {what}"
        r = world.requests[i]
        if record.state not in TERMINAL:
            return f"take() handed back {r.request_id} while it was {record.state.value}"
        if _owes(r):
            return (
                f"take() handed back {r.request_id} ({record.state.value}) to be freed while "
                f"{', '.join(_owes(r))} may still touch its blocks"
            )
        if record.state is _CANCELLED and not r.cancelled:
            return f"take() handed back {r.request_id} as cancelled; it was never cancelled"
    return None


def _no_leak(world: _World) -> str | None:
    """no state outlives its request, and no terminal request is stranded"""
    world.sync()
    mc = world.mc
    for i, r in enumerate(world.requests):
        if r.phase == _TAKEN and r.request_id in mc:
            return f"{r.request_id} was handed back by take() but is still held"
        if r.phase == _HELD and r.view is None:
            return f"{r.request_id} is no longer held but take() never handed it back"
        view = r.view
        if view is None or view[0] not in TERMINAL or i in world.queue or r.asking:
            continue
        loader, loaded, _ = r.load_view
        if not view[1] and (loader is None or loaded):  # terminal, nothing in flight
            return f"{r.request_id} is {view[0].value} but take() will never hand it back"
    if -1 in world.order:
        return f"the aggregator holds requests that were never begun: {mc.request_ids()}"
    begun = [r for r in world.requests if r.phase != _UNBORN]
    if begun and all(r.phase == _TAKEN for r in begun) and (len(mc) or world.queue):
        return (
            f"every request was handed back, yet {len(mc)} are held and "
            f"{len(world.queue)} queued for take()"
        )
    return None


def _load_once(world: _World) -> str | None:
    """load applied at most once per match, only from the chosen loader, never after terminal"""
    last = world.last
    load = last.load if last is not None else None
    if load is None:
        return None
    rid, name = load.request_id, load.name
    applied = load.outcome is _APPLIED
    due = load.live and name == load.loader and not load.loaded and not load.loader_gone
    if applied and not due:
        if not load.live:
            why = "after it was terminal or handed back"
        elif load.loader is None:
            why = "though no connector was chosen to load it"
        elif name != load.loader:
            why = f"from {name}, though {load.loader} was chosen to load it"
        elif load.loader_gone:
            why = f"from {name}, though it was unregistered after it was chosen to load it"
        else:
            why = f"twice from {name}, its chosen loader"
        return f"load_finished({rid}, {name}) was applied {why}"
    if load.callbacks and not applied:
        return f"load_finished({rid}, {name}) was {load.outcome.value}, yet on_load_finished ran"
    if len(load.callbacks) > 1 or set(load.callbacks) - {name}:
        return f"load_finished({rid}, {name}) called on_load_finished of {list(load.callbacks)}"
    if load.live and name == load.loader and load.loader_gone and load.outcome is not _GONE:
        return (
            f"load_finished({rid}, {name}) from its chosen loader, unregistered since, was "
            f"{load.outcome.value}, not unregistered"
        )
    if due and not applied:
        return (
            f"load_finished({rid}, {name}) from its chosen loader was {load.outcome.value}, "
            "not applied: the load never completes"
        )
    return None


def _no_live_request(world: _World) -> bool:
    """every request finished, cancelled, handed back or not begun"""
    world.sync()
    return all(r.view is None or r.view[0] in TERMINAL for r in world.requests)


def _not_cancel(event: Event) -> bool:
    """cancel excluded: it would rescue any trap"""
    return bool(event[0] != "cancel")


def _fired(world: _World) -> list[tuple[str, str, str]]:
    world.sync()
    return world.last.fired if world.last is not None else []


def _view(record: RequestTransferState) -> View:
    return (record.state, record.awaiting, record.expected, record.abandoned)


def _names(names: Collection[str]) -> str:
    return ", ".join(sorted(names))


def _show_view(view: View) -> str:
    state, awaiting, expected, abandoned = view
    text = state.value
    if awaiting:
        text += f" awaiting {', '.join(awaiting)}"
    elif expected:
        text += f" (saved by {', '.join(expected)})"
    if abandoned:
        text += f" (abandoned {', '.join(abandoned)})"
    return text


def _describe(world: _World) -> str:
    world.sync()
    parts = []
    for i, r in enumerate(world.requests):
        if r.view is not None:
            text = _show_view(r.view)
            if i in world.queue:
                text += ", queued for take"
        else:
            text = {_UNBORN: "not begun", _HELD: "GONE", _TAKEN: "taken"}[r.phase]
        if r.asking:
            text += ", request_finished asking"
        owing = _owes(r)
        if owing and (r.view is None or set(r.view[1]) != r.owed or r.load_owed is not None):
            text += f" [owed: {', '.join(owing)}]"
        parts.append(f"{r.request_id} {text}")
    registry = " ".join(n if ready else f"{n}(None)" for n, ready in world.registry)
    return f"{'; '.join(parts)} | registry: {registry or '-'}"


def _label(world: _World) -> Callable[[Event], str]:
    ids = world.scenario.ids

    def label(event: Event) -> str:
        kind = event[0]
        if kind == "request_finished":
            savers = ", ".join(event[2]) or "none"
            return f"request_finished({ids[event[1]]}) asks; saving: {savers}"
        if kind == _APPLY_ANSWERS:
            return f"request_finished({ids[event[1]]}) applies its answers"
        if kind in ("transfer_finished", "load_finished"):
            return f"{kind}({ids[event[1]]}, {event[2]})"
        if kind == "match_tokens":
            tokens = ", ".join(f"{n}: {t}" for n, t in event[2]) or "nobody asked"
            return f"match_tokens({ids[event[1]]}) tokens: {tokens}"
        if kind in _PER_REQUEST:
            return f"{kind}({ids[event[1]]})"
        if kind == "take":
            return "take()"
        return f"{kind}({event[1]})"

    return label


def _data(ids: tuple[str, ...]) -> Callable[[Event], Any]:
    def data(event: Event) -> Any:
        if event[0] == "match_tokens":
            return [event[0], ids[event[1]], dict(event[2])]
        if event[0] in _PER_REQUEST:
            return [event[0], ids[event[1]], *event[2:]]
        return list(event)

    return data


def _annotate(world: _World) -> dict[str, Any]:
    """Each request's path, as ``[event, source, dest, name]`` steps (for the diagrams).

    The path is the one the trace applied, event for event: each step is a transition the
    request's record took, with the connector the *applied* event named (the reporting
    connector of a ``transfer_finished``, the unregistered one of a ``connector_gone``), not a
    name the aggregator may have substituted; ``path_steps`` gives the trace step of each.
    """
    world.sync()
    begun = [i for i, r in enumerate(world.requests) if r.phase != _UNBORN]
    paths: dict[str, list[list[Any]]] = {world.requests[i].request_id: [] for i in begun}
    numbers: dict[str, list[int]] = {world.requests[i].request_id: [] for i in begun}
    for step, i, event, new in world.log:
        rid = world.requests[i].request_id
        named = _named(event)
        for s in new:
            paths.setdefault(rid, []).append(
                [s.event, s.source.value, s.dest.value, named if named is not None else s.name]
            )
            numbers.setdefault(rid, []).append(step)
    return {"paths": paths, "path_steps": numbers}


def _named(event: Event) -> str | None:
    """The connector an applied event names, if it names one."""
    kind = event[0]
    if kind in ("unregister", "register"):
        return str(event[1])
    if kind in _PER_REQUEST and len(event) > 2 and isinstance(event[2], str):
        return event[2]
    return None


# -- the public entry point ---------------------------------------------------------------------


def check_aggregator(
    connectors: Mapping[str, str | None] | None = None,
    *,
    requests: int = 2,
    unknown: Sequence[str] = DEFAULT_UNKNOWN,
    events: Collection[str] | None = None,
    factory: Callable[..., MultiConnector] = MultiConnector,
    symmetry: bool = True,
    max_states: int | None = None,
    max_depth: int | None = None,
    progress: bool = False,
    max_seconds: float | None = None,
    strict_coverage: bool = False,
    reduction: bool = True,
) -> CheckReport:
    """Model-check the real aggregator on a bounded scenario: every reachable state, every event.

    ``connectors`` maps each name to its kind: ``"saver"`` (a scripted connector; every subset
    of the registered savers is tried at ``request_finished``), ``"raises"`` (its calls raise)
    or ``None`` (a slot that is not ready). Use your own names: ranks of one connector are
    names such as ``"pd@0"``, ``"pd@1"``. Default: :data:`DEFAULT_CONNECTORS`. ``unknown``
    names are never registered; reports under them are events too. ``requests`` is how many
    request ids take part. ``events`` chooses the alphabet among :data:`ALPHABET` (the default)
    and :data:`LOAD_EVENTS`; with a load event, scripted savers also answer ``match_tokens``
    (0, 1 or ``None`` each, every combination tried) and the report adds :data:`LOAD_ONCE`.
    ``factory(registry, trace=True, stripes=1)`` builds the aggregator: pass a subclass, or a
    ``functools.partial`` with your options. ``max_states``/``max_depth``/``max_seconds`` bound
    the search (default: none, so it finishes); see :func:`explore` for the rest.

    Coverage (``states reached``, ``transitions fired``) fails only for what the configuration
    can reach (:func:`reachable_in`: e.g. a request waits for a second report only with two
    savers); ``strict_coverage=True`` requires every declared state and transition.
    ``reduction`` (default on) is partial-order reduction: events of different requests
    commute (:func:`independent`), so their interleavings are not all applied; the verdicts,
    the states found and the counterexamples' lengths are the same without it.

    Returns a :class:`CheckReport` with one result per name in :data:`PROPERTIES` (and
    :data:`LOAD_ONCE` after ``no leak`` when the alphabet has a load event).

    .. versionadded:: 0.1.0
    .. versionchanged:: 0.1.0
       ``events`` may include the load side, :data:`LOAD_EVENTS`; ``max_seconds`` and
       ``strict_coverage``.
    """
    if connectors is None:
        connectors = DEFAULT_CONNECTORS
    if not isinstance(connectors, Mapping) or not connectors:
        raise InvalidArgumentError(
            f"connectors={shown(connectors)} must be a non-empty Mapping of name to kind"
        )
    kinds: dict[str, str | None] = {}
    for name, kind in connectors.items():
        check_name(name, "connectors key")
        if kind not in (SAVER, RAISES, GARBAGE, None):
            raise InvalidArgumentError(
                f"connectors[{name!r}]={shown(kind)} must be 'saver', 'raises', 'garbage' or None"
            )
        kinds[name] = kind
    if isinstance(unknown, str) or not isinstance(unknown, Sequence):
        raise InvalidArgumentError(f"unknown={shown(unknown)} must be a sequence of names")
    for name in unknown:
        check_name(name, "unknown item")
        if name in kinds:
            raise InvalidArgumentError(f"unknown={shown(unknown)} names a connector: {name!r}")
    if type(requests) is not int or not 1 <= requests <= 6:
        raise InvalidArgumentError(f"requests={shown(requests)} must be an int from 1 to 6")
    if events is None:
        alphabet = frozenset(ALPHABET)
    else:
        if isinstance(events, str) or not isinstance(events, Collection):
            raise InvalidArgumentError(f"events={shown(events)} must be a collection of str")
        alphabet = frozenset(events)
        bad = sorted(str(e) for e in alphabet if e not in _KINDS)
        if bad:
            raise InvalidArgumentError(
                f"events={shown(events)} has unknown kinds {bad}; choose from {list(_KINDS)}"
            )
    if not callable(factory):
        raise InvalidArgumentError(f"factory={shown(factory)} must be callable")
    check_bool(symmetry, "symmetry")
    check_bool(strict_coverage, "strict_coverage")
    check_bool(reduction, "reduction")
    pad = _Pad()
    made: dict[str, Any] = {}
    for name, kind in kinds.items():
        made[name] = _Scripted(name, pad) if kind == SAVER else None
        if kind == RAISES:
            made[name] = _Raising(name, pad)
        elif kind == GARBAGE:
            made[name] = _Garbage(name, pad)
    symmetries = _symmetries(kinds, requests, symmetry)
    scenario = _Scenario(
        names=tuple(kinds),
        kinds=kinds,
        unknown=tuple(unknown),
        ids=tuple(f"r{i}" for i in range(1, requests + 1)),
        alphabet=alphabet,
        factory=factory,
        pad=pad,
        connectors=made,
        symmetries=symmetries,
        interner=_Interner(symmetries),
    )
    probe = scenario.fresh()
    if type(probe.mc).request_finished is not MultiConnector.request_finished:
        scenario = attrs.evolve(scenario, atomic=True)
    shown_kinds = {SAVER: "saver", RAISES: "raises", GARBAGE: "garbage", None: "None slot"}
    bounds = {
        "connectors": [f"{n} ({shown_kinds[k]})" for n, k in kinds.items()],
        "unknown names": list(unknown),
        "requests": requests,
        "events": [e for e in _KINDS if e in alphabet],
        "symmetry": f"{len(scenario.symmetries)} renamings of request ids and same-kind names"
        if len(scenario.symmetries) > 1
        else "off",
        "max states": max_states if max_states is not None else "unbounded",
        "max depth": max_depth if max_depth is not None else "unbounded",
        "reduction": "sleep sets (events of different requests commute)" if reduction else "off",
    }
    if max_seconds is not None:
        bounds["max seconds"] = max_seconds
    factory_name = getattr(factory, "__qualname__", type(probe).__qualname__)
    invariants: dict[str, Callable[[_World], object]] = {
        TERMINAL_ABSORBING: _terminal_absorbing,
        NO_EARLY_FREE: _no_early_free,
        NO_LEAK: _no_leak,
    }
    if alphabet & _LOADING:
        invariants[LOAD_ONCE] = _load_once
    return explore(
        scenario.fresh,
        _events,
        _apply,
        _snapshot,
        invariants,
        goal=_no_live_request,
        ways_out=_not_cancel,
        machine=build_machine(),
        fired=_fired,
        describe=_describe,
        label=_label(probe),
        data=_data(scenario.ids),
        annotate=_annotate,
        max_states=max_states,
        max_depth=max_depth,
        max_seconds=max_seconds,
        expected=None if strict_coverage else reachable_in(kinds, alphabet),
        independent=independent if reduction else None,
        progress=progress,
        bounds=bounds,
        title=f"multiconnector check: the transfer machine, on the real {factory_name}",
    )


def independent(a: Event, b: Event) -> bool:
    """Whether two events of the scenario commute: per-request events of different requests.

    Every kind in ``_PER_REQUEST`` names its request at ``event[1]``; registry events
    (``register``, ``unregister``) and ``take`` touch every request, so they are independent
    of nothing. This is the assumption partial-order reduction rests on: the aggregator lets
    requests interact only through the registry and ``take()`` (docs/check.md, "Reductions").

    .. versionadded:: 0.1.0
    """
    return a[0] in _PER_REQUEST and b[0] in _PER_REQUEST and a[1] != b[1]


def reachable_in(
    connectors: Mapping[str, str | None], events: Collection[str]
) -> Callable[[tuple[str, str, str]], bool]:
    """Whether a declared (source, event, dest) transition can fire in this configuration.

    Every transition needs ``begin``; its own event kind (``connector_gone`` is fired by
    ``unregister``); one touching ``finishing`` needs a saver and ``request_finished`` (the way
    into ``finishing``); one staying in ``finishing`` needs two savers (a request awaits a
    second report, or a second connector's unregistering). One touching ``cancelled`` needs
    ``cancel``; a drain (``cancelled`` to itself) also needs a saver and ``request_finished``,
    so that a cancelled request awaits a report. A transition of an event the scenario does not
    know is assumed reachable.

    .. versionadded:: 0.1.0
    """
    savers = sum(1 for kind in connectors.values() if kind == SAVER)
    alphabet = frozenset(events)
    finishing = State.finishing.value
    cancelled = State.cancelled.value

    def reachable(triple: tuple[str, str, str]) -> bool:
        source, event, dest = triple
        needs = {"begin", "unregister" if event == "connector_gone" else event}
        needs &= set(_KINDS)
        least = 0
        if finishing in (source, dest):
            needs.add("request_finished")
            least = 2 if source == dest else 1
        if cancelled in (source, dest):
            needs.add("cancel")
            if source == dest:
                needs.add("request_finished")
                least = max(least, 1)
        return needs <= alphabet and savers >= least

    return reachable


# -- the command --------------------------------------------------------------------------------


def _parse_connectors(text: str) -> dict[str, str | None]:
    kinds: dict[str, str | None] = {}
    for item in split_list(text, "NAME or NAME=saver|none|raises|garbage"):
        name, equals, kind = (part.strip() for part in item.partition("="))
        kind = kind.lower() if equals else SAVER
        if kind not in (SAVER, RAISES, GARBAGE, "none"):
            raise argparse.ArgumentTypeError(
                f"{item!r}: expected NAME or NAME=saver|none|raises|garbage, comma-separated"
            )
        (name,) = name_list(name)
        if name in kinds:
            raise argparse.ArgumentTypeError(f"{name!r} is given twice")
        kinds[name] = None if kind == "none" else kind
    return kinds


def _parse_list(text: str) -> list[str]:
    return split_list(text, "event kinds")


def _default_unknown(connectors: Collection[str]) -> list[str]:
    """``ghost``, or the first of ``ghost1``, ``ghost2``, ... that is not a connector's name."""
    more = (f"{DEFAULT_UNKNOWN[0]}{i}" for i in itertools.count(1))
    for name in itertools.chain(DEFAULT_UNKNOWN, more):
        if name not in connectors:
            return [name]
    raise AssertionError("unreachable")  # pragma: no cover


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of seconds above 0")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="multiconnector check",
        description="Explore every reachable state of a bounded scenario on the real "
        "MultiConnector and check its properties. Exit status: 0 PASS (every property "
        "holds; with --max-depth, within that depth), 1 FAIL (a property fails), 2 bad "
        "arguments, 3 INCONCLUSIVE (--max-states or --max-seconds cut the search short "
        "before any violation was found).",
    )
    default = ",".join(
        n if k == SAVER else f"{n}={k or 'none'}" for n, k in DEFAULT_CONNECTORS.items()
    )
    parser.add_argument(
        "--connectors",
        type=_parse_connectors,
        default=dict(DEFAULT_CONNECTORS),
        metavar="SPEC",
        help=f"NAME[=saver|none|raises|garbage],... (default: {default})",
    )
    parser.add_argument(
        "--unknown",
        type=name_list,
        default=None,
        metavar="NAMES",
        help="names never registered, comma-separated (default: ghost, or the first of ghost1, "
        "ghost2, ... that --connectors does not name)",
    )
    parser.add_argument(
        "--requests", type=_positive, default=2, metavar="N", help="request ids (default: 2)"
    )
    parser.add_argument(
        "--events",
        type=_parse_list,
        default=None,
        metavar="KINDS",
        help=f"choose the alphabet among: {', '.join(ALPHABET + LOAD_EVENTS)} "
        "(default: all but the load events)",
    )
    parser.add_argument(
        "--load",
        action="store_true",
        help="add the load side (match_tokens, load_finished) to the alphabet and check "
        "that a load is applied at most once, only from the chosen loader",
    )
    parser.add_argument(
        "--max-states",
        type=_positive,
        default=None,
        metavar="N",
        help="stop after N distinct states: the result is INCONCLUSIVE (exit 3) unless a "
        "property fails",
    )
    parser.add_argument(
        "--max-depth",
        type=_positive,
        default=None,
        metavar="N",
        help="explore event sequences of up to N events only: an accepted bound, so the "
        "result PASSes (bounded) when no property fails within it",
    )
    parser.add_argument(
        "--max-seconds",
        type=_seconds,
        default=None,
        metavar="N",
        help="a time budget for CI: stop cleanly after N seconds; the result is INCONCLUSIVE "
        "(exit 3) unless a property fails, and says up to which depth the search is complete",
    )
    parser.add_argument(
        "--no-reduction",
        action="store_true",
        help="apply every interleaving of different requests' events (no partial-order "
        "reduction): the same verdicts, more time",
    )
    parser.add_argument(
        "--strict-coverage",
        action="store_true",
        help="fail when any declared state or transition is not reached, even one this "
        "configuration cannot reach (default: only the reachable ones)",
    )
    parser.add_argument(
        "--no-symmetry",
        action="store_true",
        help="do not merge states that differ only by request ids or same-kind connector names",
    )
    parser.add_argument(
        "--json",
        type=output_file,
        default=None,
        metavar="FILE",
        help="also write the report as JSON to FILE (checked before the search starts; its "
        "folder must exist)",
    )
    parser.add_argument("--no-progress", action="store_true", help="never show progress")
    add_check_arguments(parser)
    return parser


def _alphabet(events: list[str] | None, load: bool) -> list[str] | None:
    if not load:
        return events
    return [*(ALPHABET if events is None else events), *LOAD_EVENTS]


#: The command's exit status for each verdict (2 is for bad arguments).
EXIT_STATUS: Final[Mapping[str, int]] = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}


def run_cli(argv: Sequence[str]) -> int:
    """``multiconnector check``: 0 PASS, 1 FAIL, 2 bad input, 3 INCONCLUSIVE (cut short)."""
    parser = _parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # argparse exits 2 on errors, 0 for --help
        return exc.code if isinstance(exc.code, int) else 2
    if args.machine is not None or args.model is not None or args.invariant or args.free_guards:
        return run_check_cli(args, parser)
    unknown = args.unknown
    if unknown is None:
        unknown = _default_unknown(args.connectors)
    elif clash := [n for n in unknown if n in args.connectors]:
        names = ", ".join(clash)
        print(f"{parser.prog}: error: --unknown {names}: also in --connectors", file=sys.stderr)
        return 2
    try:
        report = check_aggregator(
            args.connectors,
            requests=args.requests,
            unknown=unknown,
            events=_alphabet(args.events, args.load),
            symmetry=not args.no_symmetry,
            max_states=args.max_states,
            max_depth=args.max_depth,
            max_seconds=args.max_seconds,
            strict_coverage=args.strict_coverage,
            reduction=not args.no_reduction,
            progress=not args.no_progress,
        )
    except MultiConnectorError as exc:
        print(f"multiconnector check: error: {exc}", file=sys.stderr)
        return 2
    print(report.to_text())
    if args.json is not None:
        try:
            args.json.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        except OSError as exc:
            print(f"multiconnector check: error: cannot write --json: {exc}", file=sys.stderr)
            return 2
        print(f"report written to {args.json}")
    return EXIT_STATUS[report.verdict]

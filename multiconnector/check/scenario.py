"""The scenario the aggregator check drives: scripted connectors, the world, the events.

A :class:`_World` is the real :class:`~multiconnector.MultiConnector` under check plus what the
checker observed on its own (:class:`_Request`); :func:`.apply._apply` applies one event of
the alphabet (:func:`_events`) to it. The other modules read a world: :mod:`.snapshot` keys it,
:mod:`.properties` judges it, :mod:`.trace` describes it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs

from .._validate import shown
from ..aggregator import MultiConnector
from ..errors import (
    InvalidArgumentError,
)
from ..healthbook import HealthBook
from ..machine import RequestTransferState, State
from ..outcome import Outcome
from ..registry import ConnectorRegistry, Role
from . import halves

if TYPE_CHECKING:
    from .canonical import Fixed, Raw, _Interner, _Symmetry

#: The kinds of events the aggregator scenario applies.
ALPHABET: Final[tuple[str, ...]] = (
    "begin",
    "request_finished",
    "transfer_finished",
    "cancel",
    "unregister",
    "register",
    "take",
    "transfer_finished_many",
    "request_finished_by",
)
#: The load side, opt-in (``events=ALPHABET + LOAD_EVENTS``, or ``--load``): ``match_tokens`` with
#: every answer (0, 1 or ``None``) from each ready saver, and ``load_finished`` for every
#: (request, name). Off by default: it multiplies the default bound's states.
LOAD_EVENTS: Final[tuple[str, ...]] = ("match_tokens", "load_finished")
#: Split loads, opt-in with the load side (``events=ALPHABET + LOAD_EVENTS + SPLIT_EVENTS``, or
#: ``--split``): ``split_load`` for every pending request and every ordered pair of ready
#: connectors that may load, ``choose_loader(request_id, a, parts=[b])``: two loaders for one
#: request, each owing its report.
SPLIT_EVENTS: Final[tuple[str, ...]] = ("split_load",)
#: The told path, in :data:`ALPHABET` (the finish entry the vLLM adapter uses):
#: ``request_finished_by`` for every request with every subset of the ready savers (a counted
#: connector's report names, as the vLLM adapter tells them), and once with every ready saver
#: and every name that cannot report (a ``None`` slot, a name unregistered or never registered:
#: ``allow_unregistered=True``), each abandoned at once. The core is told the savers, as the
#: vLLM adapter tells it; nobody is asked, so no report comes early. An alphabet without it
#: (``events=`` naming the others) checks the asking path alone.
TOLD_EVENTS: Final[tuple[str, ...]] = ("request_finished_by",)
#: Connector kinds: a scripted saver, one whose calls raise, or ``None`` (a not-ready slot).
SAVER: Final = "saver"
RAISES: Final = "raises"
#: A connector whose ``request_finished`` answers a bare ``True``: not a ``(bool, params)``
#: pair, so it may have started a save (the aggregator must await it) and its answer is
#: reported as an ``InvalidAnswerError``.
GARBAGE: Final = "garbage"
#: A save-only connector (registered with ``role=Role.save``): a scripted saver that, asked for
#: matched tokens, would answer 1. The aggregator must never ask it, so never choose it to load.
STORE: Final = "store"
#: A load-only connector (registered with ``role=Role.load``): it answers ``match_tokens`` as the
#: event says, as a saver does, and answers every ``request_finished`` with ``(True, None)``, a
#: save its role rules out: the aggregator must never await it (it raises ``RoleError``).
LOADER: Final = "loader"
#: A connector counted on fewer workers than all, as the vLLM adapter books one
#: (``multiconnector.vllm.counted``): registered under :data:`COUNTED_RANKS` report names of its
#: own, ``<name>@1`` and ``<name>@2`` (:func:`rank_names`), which the aggregator asks and awaits
#: as two savers that answer alike; its load is the split load of those names; its reports name
#: no rank, and each settles the one :func:`multiconnector.rule.counted_name` picks
#: (:mod:`.counted`).
COUNTED: Final = "counted"
#: How many workers a counted connector reports on: its report names.
COUNTED_RANKS: Final = 2
#: Every connector kind :func:`~multiconnector.check.check_aggregator` takes (``None`` aside).
KINDS: Final[tuple[str, ...]] = ("saver", "raises", "garbage", "store", "loader", "counted")
#: The kinds whose ``request_finished`` answers as each event says, each a possible saver.
SAVING: Final[frozenset[str]] = frozenset({SAVER, STORE})
#: The kinds whose ``get_num_new_matched_tokens`` answers as each ``match_tokens`` event says.
LOADING: Final[frozenset[str]] = frozenset({SAVER, LOADER})
#: The role each kind is registered with (a kind not here: ``Role.both``).
ROLES: Final[Mapping[str, Role]] = {STORE: Role.save, LOADER: Role.load}


def rank_names(name: str) -> tuple[str, ...]:
    """The report names a counted connector ``name`` is registered under, in order."""
    return tuple(f"{name}@{i}" for i in range(1, COUNTED_RANKS + 1))


def role_of(kind: str | None) -> Role:
    """The role a connector of ``kind`` is registered with."""
    return Role.both if kind is None else ROLES.get(kind, Role.both)


#: The default bound's connectors: two savers (two are needed for a request to wait for a second
#: report). Since request_finished is explored in its two halves, a ``None`` slot (``"none":
#: None``) makes the two-request search about four times larger, and a connector that raises
#: more still; the tests check both with one request.
DEFAULT_CONNECTORS: Final[Mapping[str, str | None]] = {"a": SAVER, "b": SAVER}
DEFAULT_UNKNOWN: Final[tuple[str, ...]] = ("ghost",)
#: The most request ids a check takes part (``requests``, ``--requests``).
MAX_REQUESTS: Final = 6
#: The most connectors a check registers (``connectors``, ``--connectors``): each
#: ``request_finished`` event is one subset of the ready savers, ``2**n`` of them for ``n``
#: savers of different kinds (65,536 at the bound). The docs' largest check has nine.
MAX_CONNECTORS: Final = 16
#: What a scripted saver may answer as params when the scenario checks them (``params=True``),
#: each a symbol the ``request_finished`` event carries per saver: nothing, a key of its own
#: (its name), that key plus the shared key ``=shared`` with the value 1 (equal across savers)
#: or with its own name (different across savers). The keys and values are made from the
#: saver's own name, so renaming savers renames the answers (symmetry stays sound), and no
#: connector name is ``=shared`` (a name has no ``=``).
PARAM_CHOICES: Final[tuple[str | None, ...]] = (None, "own", "equal", "differ")
SHARED_KEY: Final = "=shared"
#: Which reports that come while a ``request_finished`` asks (early reports, kept until its
#: answers are recorded) the check explores: ``"all"`` (from every ready connector it does not
#: await), ``"savers"`` (only from the connectors that call asked and that answered it saves:
#: a connector reporting the very save it promises) or ``"off"`` (none). The same for load
#: reports while a ``match_tokens`` asks, with the load side: ``"savers"`` then means the
#: connectors that match asked.
EARLY_REPORTS: Final[tuple[str, ...]] = ("all", "savers", "off")


def scripted_params(name: str, choice: str | None) -> dict[str, Any] | None:
    """The params a scripted saver named ``name`` answers for ``choice`` (a new dict each call)."""
    if choice is None:
        return None
    if choice == "own":
        return {name: 1}
    return {name: 1, SHARED_KEY: 1 if choice == "equal" else name}


_UNBORN, _HELD, _TAKEN = 0, 1, 2
_FINISHED: Final = State.finished
_NOTHING: Final[frozenset[str]] = frozenset()
_CANCELLED: Final = State.cancelled
_PENDING: Final = State.pending
_APPLIED: Final = Outcome.applied
_GONE: Final = Outcome.unregistered
_ABANDONED: Final = Outcome.abandoned

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
    #: The params choice of each saver for the current ``request_finished`` (absent: None).
    params: Mapping[str, str | None] = attrs.field(factory=dict)
    #: What each scripted saver answered as params, in the order asked: (name, the dict).
    answered: list[tuple[str, dict[str, Any] | None]] = attrs.field(factory=list)
    #: ``on_finished`` calls, (name, request id), in order (an applied report's callback).
    finished: list[tuple[str, str]] = attrs.field(factory=list)
    #: Under health, while a lookup asks: the children the book does not let look up (each
    #: as if it answered 0, not asked: :mod:`.breaker`).
    bypassed: frozenset[str] = frozenset()


class _Scripted:
    """Saves asynchronously exactly when the current event says so."""

    def __init__(self, name: str, pad: _Pad) -> None:
        self.name, self.pad = name, pad

    def request_finished(
        self, request_id: str, blocks: Sequence[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        pad = self.pad
        saves = self.name in pad.savers
        pad.asked.append((self.name, saves))
        if not pad.params:
            return saves, None
        params = scripted_params(self.name, pad.params.get(self.name))
        pad.answered.append((self.name, params))
        return saves, params

    def on_finished(self, request_id: str, blocks: Sequence[int]) -> None:
        self.pad.finished.append((self.name, request_id))

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int | None:
        if self.name in self.pad.bypassed:  # its health is open: not asked (the adapter's gate)
            return 0
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


class _Store(_Scripted):
    """A scripted saver registered with ``role=Role.save``: asked for tokens (it must not be),
    it would answer 1, so that an aggregator asking it would choose it to load."""

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int | None:
        self.pad.matched.append((self.name, 1))
        return 1

    def __repr__(self) -> str:
        return f"store {self.name}"


class _Loader(_Scripted):
    """A scripted connector registered with ``role=Role.load``: answers tokens as the event
    says, and promises a save at every ``request_finished``, which its role rules out (never to
    be awaited)."""

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, None]:
        self.pad.asked.append((self.name, True))
        return True, None

    def __repr__(self) -> str:
        return f"loader {self.name}"


class _Raising:
    """Raises whenever it is asked."""

    def __init__(self, name: str, pad: _Pad) -> None:
        self.name, self.pad = name, pad

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, None]:
        self.pad.asked.append((self.name, False))
        raise ConnectorCrash(f"connector {self.name!r} failed")

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int | None:
        if self.name in self.pad.bypassed:  # its health is open: not asked
            return 0
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
    #: The second loader the latest ``split_load`` chose (none since a match chose anew), and
    #: whether its part is owed: neither delivered nor unregistered since.
    part: str | None = None
    part_owed: bool = False
    #: ``record``'s split part while held: its ``parts`` (one name at most here) and whether
    #: it is in ``parts_owed``.
    part_view: tuple[str | None, bool] = (None, False)
    #: request_finished calls that asked and have not applied their answers yet (the first
    #: half's result, see :func:`.halves.ask`), oldest first.
    asking: tuple[tuple[Any, ...], ...] = ()
    #: With params checked: for each call in ``asking``, what the savers answered, as
    #: ``(choices, answered)``: each saver's params choice (sorted by name: part of the state)
    #: and the dicts they returned, in the order asked (compared with fresh ones, never kept
    #: in the state).
    answers: tuple[tuple[tuple[tuple[str, str], ...], tuple[Any, ...]], ...] = ()
    #: The names whose reports came early (returned ``early``) while ``asking``, in the order
    #: they came: what the second half decides.
    early: tuple[str, ...] = ()
    #: A match_tokens that asked and has not recorded its loader yet (the first half's result,
    #: see :func:`.halves.match_ask`), or ``()``: at most one per request is explored.
    matching: tuple[Any, ...] = ()
    #: For that match, as the checker saw its answers: whether it is decisive (no ``None``
    #: answer), the loader its answers chose, and each connector asked with the entry
    #: registered under its name when it was asked (in the order asked).
    match_seen: tuple[Any, ...] = ()
    #: The names whose load reports came early (returned ``early``) while ``matching``, in the
    #: order they came: what the second half decides.
    load_early: tuple[str, ...] = ()
    #: The scripted savers that delivered a load report while ``matching`` (whatever it
    #: returned): a loader the match then chooses owes no load (it delivered it already).
    window_loads: frozenset[str] = frozenset()


@attrs.define(slots=True, eq=False)
class _Last:
    """What the latest event did, for the properties that concern a transition.

    Nothing here is part of the state: it is what one transition did (its outcomes, the
    callbacks it made, what it raised), judged on that transition alone.
    """

    event: Event
    before: tuple[View | None, ...]
    phases: tuple[int, ...]
    lengths: tuple[int, ...]
    taken: list[RequestTransferState]
    fired: list[tuple[str, str, str]] = attrs.field(factory=list)
    load: _Load | None = None
    #: The registry before the event: (name, ready) in order.
    registry: tuple[tuple[str, bool], ...] = ()
    #: Whether the event's request had a request_finished between its halves, before.
    claimed: bool = False
    #: The outcomes the event returned (a batch's list, request_finished's first), or ``None``
    #: for an event that returns none (or a first half that asked the connectors: ``()``).
    outcomes: tuple[Outcome, ...] | None = None
    #: The params request_finished returned (or its error's ``result`` carried), when it did.
    result: Any = None
    #: The params error the event raised (a ``KeyClashError``, alone or in
    #: ``ConnectorFailures``), if any.
    clash: BaseException | None = None
    #: The saver answers (choices, answered) of the request_finished this event asked or
    #: applied, when params are checked.
    answers: tuple[tuple[tuple[str, str], ...], tuple[Any, ...]] | None = None
    #: The ``on_finished`` calls the event made, (name, request id), in order.
    called: tuple[tuple[str, str], ...] = ()
    #: Each request's early reports before the event, or ``None`` when no request_finished
    #: was between its halves for it.
    early: tuple[tuple[str, ...] | None, ...] = ()
    #: For a second half: the savers its first half asked, each with whether it is still the
    #: connector registered under its name (what the answers' application reads).
    savers: tuple[tuple[str, bool], ...] = ()
    #: For a second half: the early reports it decides, with the outcome the reference gives
    #: each, in the order they came.
    settled: tuple[tuple[str, Outcome], ...] = ()
    #: For match_tokens' second half: the early load reports it decides, with the outcome the
    #: reference gives each, in the order they came.
    settled_loads: tuple[tuple[str, Outcome], ...] = ()
    #: For match_tokens' second half: whose ``on_load_finished`` it called, in order.
    load_called: tuple[str, ...] = ()
    #: For match_tokens (or its first half): the names it asked for tokens, in order.
    matched: tuple[str, ...] = ()
    #: For a counted connector's report: the report name the checker's ledger says it settles
    #: (:func:`.reference.counted_rank`), which the reference's outcome is of.
    routed: str | None = None
    #: Under health: each child's health before the event (the book's records, in order).
    health: tuple[Any, ...] | None = None
    #: The loaders the event chose for its request, as the checker saw the answers (a
    #: decisive match's, a split load's): what ``breaker kept`` reads.
    chose: tuple[str, ...] = ()


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
    #: The loader whose load the checker's ledger said was owed, before.
    load_owed: str | None = None
    #: The request's early load reports before, or ``None`` when no match_tokens was between
    #: its halves for it.
    early: tuple[str, ...] | None = None
    #: The checker's split part and whether it was owed, before.
    part: str | None = None
    part_owed: bool = False


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
    #: Renamings of request indices and connector names under which the scenario is unchanged,
    #: and how a state's canonical form under them is found.
    symmetry: _Symmetry
    interner: _Interner
    #: Drive request_finished whole instead of in its two halves (a factory whose class
    #: overrides request_finished itself: its halves may not be MultiConnector's).
    atomic: bool = False
    #: Whether the order names were registered in is part of the state (see
    #: :func:`~multiconnector.check.snapshot._snapshot`): the load side and params read it.
    registry_order: bool = True
    #: Whether scripted savers answer params (``request_finished`` events carry the choices).
    params: bool = False
    #: The names ``transfer_finished_many`` reports under: the connectors that can be awaited
    #: (savers, and connectors answering garbage).
    batchers: tuple[str, ...] = ()
    #: Which early reports are explored (:data:`EARLY_REPORTS`).
    early: str = "all"
    #: Each counted connector's report names (:func:`rank_names`), registered in its place.
    ranks: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)
    #: Whether the aggregator under check lets equal values of a key through (its
    #: ``allow_equal_params``), which the reference merge follows.
    allow_equal: bool = False
    #: Whether a settled record's part of the state leaves out what nothing reads any more
    #: (:func:`~multiconnector.check.snapshot._part`, ``forget``): ``check_aggregator``'s
    #: ``forget``, on by default.
    forget: bool = False
    #: Under health (``health=True``): what builds each world's book (:mod:`.breaker`).
    health_book: Callable[..., Any] | None = None
    #: The bounds of each child's health machine under health (:data:`.breaker.SETTINGS`).
    health_settings: Any = None

    def fresh(self) -> _World:
        names = [rank for n in self.names for rank in self.ranks.get(n, (n,))]
        registry = ConnectorRegistry(
            {n: self.connectors[n] for n in names},
            roles={n: role_of(k) for n, k in self.kinds.items() if k in ROLES},
        )
        mc = self.factory(registry, trace=True, stripes=1)
        if not isinstance(mc, MultiConnector):
            raise InvalidArgumentError(
                f"factory returned {shown(mc)}; it must return a MultiConnector"
            )
        world = _World(self, mc)
        if self.health_book is not None:
            world.health = self.health_book(
                names,
                self.health_settings,
                clock=functools.partial(getattr, world, "now"),
                aggregator=mc,
            )
        return world


class _World:
    """The aggregator under check, plus the checker's own observations.

    What the aggregator shows is read lazily (:meth:`sync`), so replaying a path to a state
    costs only the events themselves.
    """

    __slots__ = (
        "applied",
        "dirty",
        "entries",
        "fixed",
        "health",
        "index",
        "last",
        "log",
        "mc",
        "now",
        "order",
        "queue",
        "raw",
        "registry",
        "requests",
        "scenario",
        "tally",
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
        #: What maps the state read at the last snapshot onto itself (renamings, and classes
        #: of names any permutation within which does): see :func:`.alike._alike`.
        self.fixed: Fixed = ((), ())
        #: The state read at the last snapshot, numbered, before its canonical form (what
        #: :func:`.snapshot._views` cuts into each request's view).
        self.raw: Raw | None = None
        #: What the counters should show: the outcomes the events returned (and each request
        #: an unregistering abandoned), by (outcome, connector name or ``None``), summed since
        #: the start. Never part of the state: ``counters`` compares it with the aggregator's
        #: counts after every transition.
        self.tally: dict[tuple[Outcome, str | None], int] = {}
        #: Under health: each child's book, and the frozen clock ``cooled`` moves (:mod:`.breaker`).
        self.health: HealthBook | None = None
        self.now = 0.0

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
                if record.parts or r.part_view[0] is not None:
                    r.part_view = (
                        record.parts[0] if record.parts else None,
                        bool(record.parts_owed),
                    )
            else:
                r.view = None
                r.load_view = (None, False, False)
                r.part_view = (None, False)
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
    return getattr(mc.registry, "entries", None)


def _held(mc: MultiConnector) -> Mapping[str, RequestTransferState]:
    """The records the aggregator holds, by request id (read, never written)."""
    return halves.held(mc)


def _take_queue(mc: MultiConnector) -> Sequence[RequestTransferState]:
    """What ``take()`` would hand back now, without taking it.

    Read from the aggregator's queue of terminal records, which ``take()`` empties in order:
    taking would be an event, not an observation.
    """
    return halves.queued(mc)


#: The second half of a request_finished: it applies the answers its first half gathered.
_APPLY_ANSWERS: Final = "request_finished_apply"
#: The second half of a match_tokens: it records the loader its first half's answers chose.
_MATCH_ANSWER: Final = "match_tokens_apply"
#: A counted connector's report, of a save or of a load: ``(kind, request index, its name)``.
COUNTED_SAVE: Final = "counted_save"
COUNTED_LOAD: Final = "counted_load"
_PER_REQUEST: Final = frozenset(
    {
        "begin",
        "request_finished",
        _APPLY_ANSWERS,
        "transfer_finished",
        "cancel",
        "match_tokens",
        _MATCH_ANSWER,
        "load_finished",
        "split_load",
        COUNTED_SAVE,
        COUNTED_LOAD,
        "request_finished_by",
    }
)
_LOADING: Final = frozenset({*LOAD_EVENTS, *SPLIT_EVENTS, _MATCH_ANSWER})
_KINDS: Final = tuple(dict.fromkeys(ALPHABET + TOLD_EVENTS + LOAD_EVENTS + SPLIT_EVENTS))


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


def independent(a: Event, b: Event) -> bool:
    """Whether two events of the scenario commute: per-request events of different requests.

    Every kind in ``_PER_REQUEST`` names its request at ``event[1]``; registry events
    (``register``, ``unregister``) and ``take`` touch every request, so they are independent
    of nothing. This is the assumption partial-order reduction rests on: the aggregator lets
    requests interact only through the registry and ``take()`` (docs/check.md, "Reductions").

    .. versionadded:: 0.1.0
    """
    return a[0] in _PER_REQUEST and b[0] in _PER_REQUEST and a[1] != b[1]


def _actor(event: Event) -> int | None:
    """The request a per-request event is about (``None`` for the others): :func:`independent`
    as :func:`~multiconnector._explore.explore` reads it fastest."""
    return event[1] if event[0] in _PER_REQUEST else None

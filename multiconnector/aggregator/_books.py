"""The aggregator's books: the state every side of :class:`MultiConnector` shares, and the
helpers they all use.

:class:`Books` declares every attribute (``__slots__``) and makes them (``__init__``); the other
modules of this package add methods over it, each one concept. Here too: the unregister rule
(``_connector_gone``, subscribed to the registry when the books are made), settling a terminal
request for :meth:`MultiConnector.take`, the shared name tuples, transitions and counters. The
module constants below are the hot paths' (each module imports the ones it reads, as its own
globals).
"""

from __future__ import annotations

import copy
import logging
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Final, NoReturn, Self

from .._validate import check_stripes, shown
from ..errors import ConnectorFailures, InvalidArgumentError, ShutDownError
from ..lookup import Lookup, lookup_of
from ..machine import DECISIONS, TERMINAL, RequestTransferState, State, Step
from ..outcome import Outcome
from ..registry import Connector, ConnectorRegistry, Entry
from ..rule import (
    OTHER_NAMES,
    Verdicts,
    count,
    decide,
    load_owed,
    refined,
    safe_to_hand_back,
)

__all__ = ["OTHER_NAMES", "Books"]


def _slots(cls: type) -> frozenset[str]:
    """Every slot a class and its bases declare."""
    return frozenset(s for c in cls.__mro__ for s in c.__dict__.get("__slots__", ()))


#: ``(awaited, expected)``: the savers a finished request awaits, and every saver it expects.
Awaited = tuple[tuple[str, ...], tuple[str, ...]]
#: A ready snapshot, its names, and request_finished_by's table of savers to :data:`Awaited`.
ReadyNames = tuple[tuple[Entry, ...], tuple[str, ...], dict[tuple[str, ...], Awaited]]

logger: Final = logging.getLogger("multiconnector")

# Enum members read through their class cost ~70 ns each on CPython 3.11: the hot paths use
# these module constants instead.
_APPLIED: Final = Outcome.applied
_UNKNOWN_REQUEST: Final = Outcome.unknown_request
_TERMINAL: Final = Outcome.terminal
_DUPLICATE: Final = Outcome.duplicate
_PHANTOM: Final = Outcome.phantom
_UNREGISTERED: Final = Outcome.unregistered
_ABANDONED: Final = Outcome.abandoned
_DRAINED: Final = Outcome.drained
_OVERTAKEN: Final = Outcome.overtaken
_EARLY: Final = Outcome.early
_PENDING: Final = State.pending
_CANCELLED: Final = State.cancelled
#: Counter key for events that concern a request, not a connector.
_NO_NAME: Final = None
_ON_GONE: Final = DECISIONS["connector_gone"]


class Books:
    """The shared state of :class:`MultiConnector` and the helpers every side uses."""

    __slots__ = (
        "__weakref__",  # the registry holds our unregister listener weakly
        "_allow_equal",
        "_applied",
        "_asking",
        "_closed",
        "_counts",
        "_done",
        "_early",
        "_early_loads",
        "_finishes",
        "_locks",
        "_lookup",
        "_mask",
        "_matching",
        "_parked",
        "_ready_names",
        "_registry",
        "_requests",
        "_trace",
        "_verdicts",
    )

    def __init__(
        self,
        registry: ConnectorRegistry | Mapping[str, Connector | None] | None = None,
        *,
        trace: bool = False,
        allow_equal_params: bool = False,
        stripes: int = 64,
        lookup: Lookup | str = Lookup.first,
    ) -> None:
        if registry is None:
            registry = ConnectorRegistry()
        elif isinstance(registry, Mapping):
            registry = ConnectorRegistry(registry)
        elif not isinstance(registry, ConnectorRegistry):
            raise InvalidArgumentError(
                f"registry={shown(registry)} must be a ConnectorRegistry, a Mapping or None"
            )
        for argument, value in (("trace", trace), ("allow_equal_params", allow_equal_params)):
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"{argument}={shown(value)} must be a bool")
        stripes = check_stripes(stripes)
        self._lookup = lookup_of(lookup)
        self._closed = False
        self._registry = registry
        self._trace = trace
        self._allow_equal = allow_equal_params
        self._requests: dict[str, RequestTransferState] = {}
        self._done: deque[RequestTransferState] = deque()
        # Records a request_finished (or request_finished_by) is applying, by id(record), each
        # with that call's claim token; see request_finished. Records compare by value and are
        # not hashable, so these tables key them by id: a key is never reused while it is here,
        # as the call holding the claim holds the record (and _early and _parked hold keys of
        # _asking only, dropped with the claim).
        self._asking: dict[int, object] = {}
        # Early reports: for a record a request_finished is asking about, the names that
        # reported while it asked, each with its report's blocks, in the order they came; kept
        # until the claim is dropped, then decided (_drop_claim). Written under the record's lock.
        self._early: dict[int, dict[str, Sequence[int]]] = {}
        # Records a match_tokens is asking about (by id), each with how many calls are asking;
        # and, for each, the names whose load reports came meanwhile (early), in the order they
        # came: decided when the last of those calls recorded its loader (Loading._drop_match).
        # Written under the record's lock.
        self._matching: dict[int, int] = {}
        self._early_loads: dict[int, list[str]] = {}
        # Cancelled records (by id) kept from take() while a request_finished or a match_tokens
        # still asks (see _settle).
        self._parked: set[int] = set()
        self._locks = tuple(threading.Lock() for _ in range(stripes))
        self._mask = stripes - 1
        # One counter dict per stripe, only ever written under that stripe's lock.
        self._counts: tuple[dict[tuple[Outcome, str | None], int], ...] = tuple(
            {} for _ in range(stripes)
        )
        # The hot paths count applied events here, by name alone: no key tuple to build and hash.
        self._applied: tuple[dict[str | None, int], ...] = tuple({} for _ in range(stripes))
        # Applied request_finished events, one slot per stripe (written under its lock).
        self._finishes: list[int] = [0] * stripes
        # The transfer report rule's verdicts, remembered, and the name tuples shared by every
        # request with the same awaited set: both small, both capped (see rule.Verdicts).
        self._verdicts = Verdicts()
        # The names of a ready snapshot, for the common "every ready connector saves"; and, for
        # request_finished_by, the awaited and expected names of each savers tuple given (a
        # function of the snapshot and the tuple alone: a new snapshot starts a new table).
        self._ready_names: ReadyNames = ((), (), {})
        registry.subscribe(self._connector_gone)

    def __deepcopy__(self, memo: dict[int, Any]) -> Self:
        """``copy.deepcopy(mc)``: a copy that behaves exactly as this aggregator would, from
        now on, on the same connectors (the model check forks its worlds with it:
        :mod:`multiconnector.check.fork`).

        What either side may change is copied: the records (each with ``copy.deepcopy(record,
        memo)``, so a caller that put its own copy of a record in ``memo`` gets that one used),
        the queue for :meth:`take`, the claims and marks of calls between their halves, the
        counters, the locks (new ones), the registry's listeners (the copy's own). What no side
        changes is shared: the connectors, the registry's published entries, the caches of name
        tuples and verdicts (each value a function of its key alone). Every attribute is
        copied or shared by a line below: a new one must be added there
        (tests/test_copy.py fails until it is).

        Raises :class:`copy.Error` for what cannot be copied: a subclass with attributes of its
        own, a registry another listener than this aggregator subscribed to.
        """
        if _slots(type(self)) != _SLOTS:
            raise copy.Error(f"{type(self).__name__} has attributes of its own: not copied")
        new = object.__new__(type(self))
        memo[id(self)] = new
        registry = self._registry._copy(new._connector_gone)
        if registry is None:
            raise copy.Error("the registry has other listeners than this aggregator")
        new._registry = registry
        new._closed = self._closed
        new._trace = self._trace
        new._allow_equal = self._allow_equal
        new._lookup = self._lookup
        new._requests = {rid: copy.deepcopy(r, memo) for rid, r in self._requests.items()}
        new._done = deque(copy.deepcopy(r, memo) for r in self._done)
        # The tables keyed by id(record): the copy's by its records' ids. A record a call
        # claimed or marked is held (a cancel parks it until the call lets go).
        held = {id(r): r for r in self._requests.values()}

        def key(old: int) -> int:
            if old not in held:  # pragma: no cover - a call's record, no longer held
                raise copy.Error("a call between its halves holds a record no longer held")
            return id(copy.deepcopy(held[old], memo))

        new._asking = {key(k): claim for k, claim in self._asking.items()}
        new._parked = {key(k) for k in self._parked}
        new._early = {key(k): dict(kept) for k, kept in self._early.items()}
        new._matching = {key(k): n for k, n in self._matching.items()}
        new._early_loads = {key(k): list(kept) for k, kept in self._early_loads.items()}
        new._locks = tuple(threading.Lock() for _ in self._locks)
        new._mask = self._mask
        new._counts = tuple(dict(counts) for counts in self._counts)
        new._applied = tuple(dict(counts) for counts in self._applied)
        new._finishes = list(self._finishes)
        new._verdicts = self._verdicts
        new._ready_names = self._ready_names
        return new

    def _connector_gone(self, entry: Entry) -> None:
        # Called under the registry lock, after `entry` was removed. The scan holds every stripe
        # lock: a request_finished that checked the registry before the removal writes its
        # awaited names under its stripe lock, so the scan sees them, or it checked after and
        # leaves the name out itself. A scan without the locks could miss such a request and
        # strand it. Unregistering is rare; the scan is O(held requests).
        name = entry.name
        locks = self._locks
        for lock in locks:
            lock.acquire()
        try:
            for record in list(self._requests.values()):
                if record.loader == name:
                    if load_owed(name, record.loaded, record.loader_gone):
                        # Its load is over, unreported: the connector that was loading is gone.
                        record.loader_gone = True
                        if name not in record.abandoned and name not in record.awaiting:
                            record.abandoned = (*record.abandoned, name)
                        if record.state in TERMINAL:
                            self._settle(record)  # a drain: take() may hand it back now
                    elif record.state not in TERMINAL:
                        record.loader_gone = True  # a load report can never be applied now
                if record.parts_owed and name in record.parts_owed:
                    # A split load's part whose loader is gone: over, unreported.
                    record.parts_owed = tuple([n for n in record.parts_owed if n != name])
                    if name not in record.abandoned and name not in record.awaiting:
                        record.abandoned = (*record.abandoned, name)
                    if record.state in TERMINAL:
                        self._settle(record)
                if name not in record.awaiting:
                    continue
                # A record awaits names only in finishing or cancelled, and DECISIONS (complete)
                # gives both a connector_gone transition.
                dest = decide(_ON_GONE, record, name)
                assert dest is not None
                record.awaiting = tuple([n for n in record.awaiting if n != name])
                record.abandoned = (*record.abandoned, name)
                self._transition(record, "connector_gone", dest, name)
                self._count(hash(record.request_id) & self._mask, _ABANDONED, name)
                if dest is _CANCELLED:
                    self._settle(record)  # a drain: take() may hand it back now
        finally:
            for lock in reversed(locks):
                lock.release()

    def _settle(self, record: RequestTransferState) -> None:
        """Queue terminal ``record`` for take() once it is safe to free; the caller holds its
        lock. It is not while a connector may still touch its blocks (``in_flight``: a drain
        event settles it again), nor while a request_finished or a match_tokens that a cancel
        overtook is still asking (its connectors may be promising saves, or reporting loads
        early): then it is parked, and the call's release settles it."""
        if not safe_to_hand_back(
            record.state,
            record.awaiting,
            record.loader,
            record.loaded,
            record.loader_gone,
            parts_owed=record.parts_owed,
        ):
            return
        if record.state is _CANCELLED and (
            id(record) in self._asking or (self._matching and id(record) in self._matching)
        ):
            self._parked.add(id(record))
            return
        self._done.append(record)

    def _drop_claim(
        self, record: RequestTransferState, index: int
    ) -> list[tuple[str, Sequence[int]]] | None:
        """Drop the claim a request_finished (or request_finished_by) holds on ``record``, after
        it wrote the answers, under lock ``index``: hand a record a cancel kept back to take(),
        and decide the reports that came early (:attr:`Outcome.early`), each as if it arrived
        now, on the answers alone: the ones the record does not await first (ignored: they
        change nothing), then the awaited ones, so no early report sees another. Returns the
        early reports applied, ``(name, blocks)``, whose
        ``on_finished`` the caller calls once the lock is released; ``None`` when none was
        applied."""
        key = id(record)
        del self._asking[key]
        if self._parked:
            self._unpark(record)  # first: a drain below settles it once, not twice
        early = self._early.pop(key, None) if self._early else None
        if early is None:
            return None
        awaiting = record.awaiting
        for name in early:
            if name not in awaiting:
                self._report(record, name, index)
        applied: list[tuple[str, Sequence[int]]] | None = None
        for name, blocks in early.items():
            if name in awaiting and self._report(record, name, index) is _APPLIED:
                applied = [] if applied is None else applied
                applied.append((name, blocks))
        return applied

    def _unpark(self, record: RequestTransferState) -> None:
        """``record``'s claim was just dropped: queue it if a cancel kept it back for that;
        the caller holds its lock."""
        parked = self._parked
        if id(record) in parked:
            parked.discard(id(record))
            self._settle(record)

    def _call_back_early(
        self, request_id: str, applied: list[tuple[str, Sequence[int]]]
    ) -> list[tuple[str, Exception]]:
        """The ``on_finished`` calls of the early reports :meth:`_drop_claim` applied, with no
        lock held, in the order they came; what they raised, ``(name, exception)``."""
        errors: list[tuple[str, Exception]] = []
        for name, blocks in applied:
            entry = self._registry.entry(name)
            if entry is not None and entry.on_finished is not None:
                try:
                    entry.on_finished(request_id, blocks)
                except Exception as exc:
                    errors.append((name, exc))
        return errors

    def _report(
        self,
        record: RequestTransferState | None,
        name: str,
        index: int,
        blocks: Sequence[int] = (),
    ) -> Outcome:  # pragma: no cover - Reports._report, the one MultiConnector has
        """Apply ``name``'s transfer report to ``record``: see ``Reports._report``."""
        raise NotImplementedError

    def _intern(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The shared tuple equal to ``names`` (``names`` itself when new or when full)."""
        return self._verdicts.intern(names)

    def _transition(
        self, record: RequestTransferState, event: str, dest: State, name: str | None
    ) -> None:
        """Move ``record`` to ``dest``; caller holds its lock and has written every other field
        (a terminal record is queued for :meth:`take`, which may hand it over at once).

        ``transfer_finished`` and ``transfer_finished_many`` inline this for their applied case,
        the hottest event."""
        source = record.state
        record.state = dest
        if record.history is not None:
            record.history.append(Step(event, source, dest, name))
        if dest is not source and dest in TERMINAL:
            self._settle(record)  # queued, or draining, or parked

    def _stranger(self, name: str) -> Outcome:
        """Why a report from ``name``, which the request never awaited nor expected, is
        ignored: its connector is not registered, not ready, or a ready one's report is a
        phantom."""
        entry = self._registry.entry(name)
        return refined(
            _PHANTOM, entry is not None, entry is not None and entry.connector is not None
        )

    def _count(self, index: int, outcome: Outcome, name: str | None) -> None:
        count(self._counts[index], outcome, name)

    @staticmethod
    def _log_ignored(event: str, request_id: str, name: str | None, outcome: Outcome) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "ignored %s for request %r from %r: %s", event, request_id, name, outcome.value
            )

    @staticmethod
    def _call_back(outcome: Outcome, entry: Entry, method: Any, *args: Any) -> None:
        try:
            method(*args)
        except Exception as exc:
            raise ConnectorFailures(
                f"connector {entry.name!r} raised in its callback",
                [exc],
                failed=[entry.name],
                result=outcome,  # applied before the callback: the caller learns it
            ) from None

    def _shut(self, call: str) -> NoReturn:
        raise ShutDownError(
            f"{call}() refused: this MultiConnector was shut down, so it takes no new work; "
            "to drain it, cancel() the requests that will not finish, let the connectors' "
            "reports arrive (still accepted), unregister() a connector that will never report, "
            "and free what take() hands back"
        )

    def __repr__(self) -> str:
        return f"MultiConnector({self._registry!r}, held={len(self._requests)})"


#: Every attribute of the books (``__slots__``, with the bases'): what :meth:`Books.__deepcopy__`
#: copies or shares, each by a line of its own.
_SLOTS: Final = _slots(Books)

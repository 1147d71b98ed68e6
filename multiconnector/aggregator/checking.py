"""The model checker's seam: all that :mod:`multiconnector.check` does to an aggregator beyond
its public calls, in one place.

The checker drives the real aggregator through its public methods, and through these three:

* :meth:`Checking._ask` and :meth:`Checking._answer`: ``request_finished``'s two halves (ask every
  ready connector; apply the answers under the request's lock) as two events, so that any other
  event can come between them, as it can between two threads. ``request_finished`` is the two
  halves in one call; the ``_halves`` slot is the one hook it has for this (``None`` but while
  :meth:`~Checking._ask` runs).
* :meth:`Checking._held`, :meth:`Checking._queued` and :meth:`Checking._counted`: the books
  the checker's properties read, read without taking them (``take()`` would be an event) and
  without the stripes' locks (the checker runs one event at a time).
* :meth:`Checking._copy`: an independent copy of the aggregator, its records copied by the
  checker's function (the checker keeps its own references to them), so that a state's
  successors start from a copy instead of replaying the path to it
  (:mod:`multiconnector.check.fork`).

Nothing here runs outside a model check.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, NamedTuple, Self

from ..machine import RequestTransferState
from ..outcome import Outcome
from ..registry import Entry
from ._books import _APPLIED
from .saving import Failures, Saving

__all__ = ["Asked", "Checking"]


class Asked(NamedTuple):
    """What request_finished's first half gathered, for its second half: the claimed record,
    its lock stripe, the ready snapshot asked, the savers, the failures, the merged params and
    the params error (see :meth:`Checking._ask`)."""

    record: RequestTransferState
    stripe: int
    ready: tuple[Entry, ...]
    savers: list[Entry]
    failures: Failures
    merged: dict[str, Any] | None
    clash: Exception | None


def _slots(cls: type) -> frozenset[str]:
    """Every slot a class and its bases declare."""
    return frozenset(s for c in cls.__mro__ for s in c.__dict__.get("__slots__", ()))


#: The slots :meth:`Checking._copy` copies: a class with others (a subclass with state of its
#: own) is not copied.
_COPIED: Final = frozenset(
    {
        "__weakref__",
        "_allow_equal",
        "_applied",
        "_asking",
        "_closed",
        "_counts",
        "_done",
        "_early",
        "_early_loads",
        "_finishes",
        "_halves",
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
    }
)


class Checking(Saving):
    """The model checker's seam (see the module's doc)."""

    __slots__ = ()

    def _ask(self, request_id: str, blocks: Sequence[int]) -> Asked | tuple[Outcome, None]:
        """request_finished's first half alone, for the model check (one thread): claim the
        request and ask every ready connector. Returns ``(outcome, None)`` when refused (nobody
        asked), else the :class:`Asked` answers for :meth:`_answer`, whose claim is held until
        :meth:`_answer` drops it. ``request_finished`` is the two halves in sequence, in one
        call."""
        halves: list[Asked] = []
        self._halves = halves
        try:
            refused = self.request_finished(request_id, blocks)
        finally:
            self._halves = None
        return halves[0] if halves else (refused[0], None)

    def _answer(self, asked: Asked | tuple[Any, ...]) -> tuple[Outcome, dict[str, Any] | None]:
        """request_finished's second half, for the model check: apply what :meth:`_ask`
        gathered (an :class:`Asked`)."""
        return self._apply_answers(*asked)

    def _held(self) -> Mapping[str, RequestTransferState]:
        """The records held, by request id (read, never written)."""
        return self._requests

    def _queued(self) -> Sequence[RequestTransferState]:
        """What ``take()`` would hand back now, in order, without taking it."""
        return self._done

    def _counted(self) -> dict[tuple[Outcome, str | None], int]:
        """What ``counts()`` and ``connector_counts()`` sum (by outcome; by name), in one read,
        without the stripes' locks (the checker runs one event at a time): the same sums, in a
        fifth of the time with the checker's one stripe."""
        counted = self._counts[0].copy()
        for index, stripe in enumerate(self._counts):
            if index:
                for key, n in stripe.items():
                    counted[key] = counted.get(key, 0) + n
            for name, n in self._applied[index].items():
                key = (_APPLIED, name)
                counted[key] = counted.get(key, 0) + n
            if self._finishes[index]:
                key = (_APPLIED, None)
                counted[key] = counted.get(key, 0) + self._finishes[index]
        return counted

    def _copy(self, record: Callable[[RequestTransferState], RequestTransferState]) -> Self | None:
        """A copy that behaves exactly as this aggregator would, each of its records
        ``record(old)`` (a copy the caller keeps, called once per record); ``None`` when it
        cannot be copied: a class with slots of its own, a registry with other listeners, or a
        ``request_finished`` between its halves inside :meth:`_ask`.

        What either side may change is copied (records, queues, counters, locks); what no side
        changes is shared: the registry's published entries, the connectors, the caches of name
        tuples and verdicts (each value a function of its key alone)."""
        if _slots(type(self)) != _COPIED or self._halves is not None:
            return None
        new = object.__new__(type(self))
        registry = self._registry._copy(new._connector_gone)
        if registry is None:
            return None
        new._registry = registry
        new._closed = self._closed
        new._trace = self._trace
        new._allow_equal = self._allow_equal
        new._lookup = self._lookup
        new._requests = {rid: record(r) for rid, r in self._requests.items()}
        new._done = deque(record(r) for r in self._done)
        # The claim tables key records by id: the copy's by its records' ids. A claimed record is
        # held (a cancel parks it until the claim is dropped), so it is one of _requests'.
        held = {id(r): r for r in self._requests.values()}
        if not held.keys() >= self._asking.keys():
            return None  # pragma: no cover - a claim on a record no longer held: replay
        new._asking = {id(record(held[key])): claim for key, claim in self._asking.items()}
        new._parked = {id(record(held[key])) for key in self._parked}
        new._early = {id(record(held[key])): dict(kept) for key, kept in self._early.items()}
        if not held.keys() >= self._matching.keys():
            return None  # pragma: no cover - a match on a record no longer held: replay
        new._matching = {id(record(held[key])): n for key, n in self._matching.items()}
        new._early_loads = {
            id(record(held[key])): list(kept) for key, kept in self._early_loads.items()
        }
        new._halves = None
        new._locks = tuple(threading.Lock() for _ in self._locks)
        new._mask = self._mask
        new._counts = tuple(dict(counts) for counts in self._counts)
        new._applied = tuple(dict(counts) for counts in self._applied)
        new._finishes = list(self._finishes)
        new._verdicts = self._verdicts
        new._ready_names = self._ready_names
        return new

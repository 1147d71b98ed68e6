"""A world copied in memory instead of rebuilt by replaying its path.

The search stores a state as the path that first reached it and rebuilds its model by replaying
that path from a fresh aggregator (:mod:`multiconnector._explore`). Replaying costs every event
of the path again, once per successor that leaves the state. :func:`_fork` copies a world
instead: the aggregator's records and books, the registry's published entries, and the
checker's own observations, so that each successor starts from a copy of the state rather than
from the start.

A copy must behave exactly as the replayed model would. It is made only for the real
:class:`~multiconnector.MultiConnector` (not a subclass, which may keep state of its own), by the
aggregator itself (``copy.deepcopy``: ``Books.__deepcopy__``), which says when it cannot copy
(then the world is replayed, as before). What is shared between copies is immutable
(the registry's entries, the connectors, a request handed back by ``take()``, the answers a
``request_finished`` gathered, the aggregator's caches of name tuples, whose values are
functions of their keys); what either side may change is copied (records, queues, counters).
``tests/test_check.py`` compares whole searches with and without copies: the same states,
edges, verdicts and traces.
"""

from __future__ import annotations

import copy
import functools
from collections import deque
from collections.abc import Callable
from typing import Any

import attrs

from ..aggregator import MultiConnector
from ..healthbook import HealthBook
from ..machine import RequestTransferState
from ..registry import ConnectorRegistry
from . import halves
from .scenario import _Request, _World


def forkable(mc: object) -> bool:
    """Whether :func:`_fork` may copy a world around ``mc`` (else it is replayed): the real
    aggregator on the real registry (a subclass may keep state of its own)."""
    return type(mc) is MultiConnector and type(mc.registry) is ConnectorRegistry


@functools.cache
def _copier(cls: type[Any]) -> Callable[[Any], Any]:
    """A shallow copy of an attrs instance with slots: every field, no ``__init__`` run.

    Compiled once per class as one assignment per field, the cheapest copy Python has: it runs
    for every record and request of every copy.
    """
    names = [a.name for a in attrs.fields(cls)]  # identifiers: attrs makes them attributes
    body = "".join(f"    _set(new, {name!r}, old.{name})\n" for name in names)
    namespace: dict[str, Any] = {"_new": object.__new__, "_set": object.__setattr__, "_cls": cls}
    exec(f"def shallow(old):\n    new = _new(_cls)\n{body}    return new\n", namespace)
    shallow: Callable[[Any], Any] = namespace["shallow"]
    return shallow


def _fork(world: _World) -> _World | None:
    """A copy of ``world`` that behaves as its replayed model would, or ``None`` (replay it)."""
    mc = world.mc
    book = world.health
    if not forkable(mc) or (book is not None and type(book) is not HealthBook):
        return None  # (a book of another class may keep state of its own: replayed)
    world.sync()
    records: dict[int, RequestTransferState] = {}
    shallow = _copier(RequestTransferState)

    def record(old: RequestTransferState) -> RequestTransferState:
        new = records.get(id(old))
        if new is None:
            new = records[id(old)] = shallow(old)
            if old.history is not None:
                new.history = list(old.history)
            if old.params is not None:
                new.params = dict(old.params)
        return new

    # The aggregator's own copy (its books, its registry's entries), with the checker's copies
    # of the records it holds (fast, and the checker keeps its references to them).
    memo: dict[int, Any] = {
        id(r): record(r) for r in (*halves.held(mc).values(), *halves.queued(mc))
    }
    try:
        new = copy.deepcopy(mc, memo)
    except copy.Error:
        return None
    twin = object.__new__(_World)
    for name in _World.__slots__:  # the checker's own books: immutable, or copied one level
        value = getattr(world, name)
        setattr(twin, name, value.copy() if isinstance(value, list | dict | set) else value)
    twin.mc = new
    if book is not None:
        twin.health = _copy_book(book, twin)
    twin.last = None  # what the latest event did: the copy's next event sets it
    twin.dirty = False  # read: the copy shows what world shows
    twin.requests = [_copy_request(r, records, record) for r in world.requests]
    return twin


def _copy_book(book: HealthBook, twin: _World) -> HealthBook:
    """A copy of the real book: each child's record copied (its lists and dicts too), the
    clock the copy's world's, the gates (frozensets) shared."""
    new = copy.copy(book)
    records = halves.health_records(book)
    halves.set_health_records(
        new,
        {
            n: attrs.evolve(
                r, failures=deque(r.failures), answers=deque(r.answers), moves=dict(r.moves)
            )
            for n, r in records.items()
        },
    )
    new.clock = functools.partial(getattr, twin, "now")
    return new


def _copy_request(r: _Request, records: dict[int, RequestTransferState], record: Any) -> _Request:
    new: _Request = _copier(_Request)(r)
    if r.record is not None:
        # Held: the copy's record. Handed back by take(): nobody changes it any more, shared.
        new.record = record(r.record) if id(r.record) in records else r.record
    if r.asking:
        new.asking = tuple((record(asked[0]), *asked[1:]) for asked in r.asking)
    if r.matching:
        new.matching = (record(r.matching[0]), *r.matching[1:])
    return new

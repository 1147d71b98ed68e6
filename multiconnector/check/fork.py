"""A world copied in memory instead of rebuilt by replaying its path.

The search stores a state as the path that first reached it and rebuilds its model by replaying
that path from a fresh aggregator (:mod:`multiconnector._explore`). Replaying costs every event
of the path again, once per successor that leaves the state. :func:`_fork` copies a world
instead: the aggregator's records and books, the registry's published entries, and the
checker's own observations, so that each successor starts from a copy of the state rather than
from the start.

A copy must behave exactly as the replayed model would. It is made only for the real
:class:`~multiconnector.MultiConnector` (not a subclass, which may keep state of its own) whose
slots, and its registry's, are the ones listed here: anything else is replayed, as before. What
is shared between copies is immutable (the registry's entries, the connectors, a request
handed back by ``take()``, the answers a ``request_finished`` gathered, the aggregator's caches
of name tuples, whose values are functions of their keys); what either side may change is copied
(records, queues, counters). ``tests/test_check.py``
compares whole searches with and without copies: the same states, edges, verdicts and traces.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import attrs

from ..aggregator import MultiConnector
from ..machine import RequestTransferState
from ..registry import ConnectorRegistry
from .scenario import _Request, _World

#: The aggregator's slots this copy knows; an aggregator with others is replayed instead.
_AGGREGATOR_SLOTS: Final = frozenset(
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
_REGISTRY_SLOTS: Final = frozenset({"__weakref__", "_entries", "_listeners", "_lock", "_ready"})


def _slots(cls: type) -> frozenset[str]:
    """Every slot a class and its bases declare."""
    return frozenset(s for c in cls.__mro__ for s in c.__dict__.get("__slots__", ()))


#: Whether the aggregator and registry classes have exactly the slots this copy knows.
_KNOWN: Final = (
    _slots(MultiConnector) == _AGGREGATOR_SLOTS and _slots(ConnectorRegistry) == _REGISTRY_SLOTS
)


def forkable(mc: object) -> bool:
    """Whether :func:`_fork` can copy a world around ``mc`` (else it is replayed)."""
    return (
        _KNOWN
        and type(mc) is MultiConnector
        and type(mc.registry) is ConnectorRegistry
        and len(mc.registry._listeners) == 1
        and mc._halves is None
    )


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
    if not forkable(mc):
        return None
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

    new = object.__new__(MultiConnector)
    new._closed = mc._closed
    new._trace = mc._trace
    new._allow_equal = mc._allow_equal
    new._requests = {rid: record(r) for rid, r in mc._requests.items()}
    new._done = deque(record(r) for r in mc._done)
    new._asking = {record(r): claim for r, claim in mc._asking.items()}
    new._parked = {record(r) for r in mc._parked}
    new._early = {record(r): dict(kept) for r, kept in mc._early.items()}
    new._matching = {record(r): n for r, n in mc._matching.items()}
    new._early_loads = {record(r): list(kept) for r, kept in mc._early_loads.items()}
    new._halves = None
    new._locks = tuple(threading.Lock() for _ in mc._locks)
    new._mask = mc._mask
    new._counts = tuple(dict(counts) for counts in mc._counts)
    new._applied = tuple(dict(counts) for counts in mc._applied)
    new._finishes = list(mc._finishes)
    # Shared: the caches map each key to a value that is a function of the key alone (the
    # interned tuple of names, the report rule's verdict), so sharing them changes no value read.
    new._verdicts = mc._verdicts
    new._ready_names = mc._ready_names
    old_registry = mc._registry
    registry = object.__new__(ConnectorRegistry)
    registry._lock = threading.RLock()
    registry._entries = old_registry._entries  # replaced, never changed, on every change
    registry._ready = old_registry._ready
    # What subscribe() stores for a bound method, without its checks and lock round.
    registry._listeners = (weakref.WeakMethod(new._connector_gone),)
    new._registry = registry

    twin = object.__new__(_World)
    for name in _World.__slots__:  # the checker's own books: immutable, or copied one level
        value = getattr(world, name)
        setattr(twin, name, value.copy() if isinstance(value, list | dict | set) else value)
    twin.mc = new
    twin.last = None  # what the latest event did: the copy's next event sets it
    twin.dirty = False  # read: the copy shows what world shows
    twin.requests = [_copy_request(r, records, record) for r in world.requests]
    return twin


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

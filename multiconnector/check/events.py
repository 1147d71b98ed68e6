"""The events of the scenario enabled in a world: :func:`_events` (the alphabet's, every one)
and :func:`_events_of` (those of some requests, for the search by views).

Each kind of :data:`~.scenario.ALPHABET` (and the load side's) is listed for every request,
connector name and answer it may take in the world's state, but for the windows the check
leaves out (a match_tokens' save side, the early reports :data:`~.scenario.EARLY_REPORTS`
excludes), and :func:`~.counted.counted_events` adds the counted connectors' own.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from . import halves
from .breaker import health_events, may_load
from .counted import counted_events, counted_savers
from .scenario import (
    _APPLY_ANSWERS,
    _HELD,
    _MATCH_ANSWER,
    _PENDING,
    _UNBORN,
    LOADER,
    LOADING,
    PARAM_CHOICES,
    SAVING,
    Event,
    _Request,
    _Scenario,
    _World,
)

#: The batches ``transfer_finished_many`` reports, by number of requests: the same request
#: twice with one request, else every pair of two requests (as a set: two reports for different
#: requests touch different records, so their order in the batch decides nothing but the
#: order of ``take()``'s queue and of the callbacks, which are judged per event).
_BATCHES: Final[Mapping[int, tuple[tuple[int, ...], ...]]] = {
    n: ((0, 0),) if n == 1 else tuple(itertools.combinations(range(n), 2)) for n in range(1, 7)
}


def _events(world: _World) -> list[Event]:
    """Every event of the alphabet enabled in ``world``."""
    return _events_of(world, range(len(world.requests)), alike=False)


def _events_of(world: _World, ids: Iterable[int], *, alike: bool = True) -> list[Event]:
    """The events of the requests ``ids`` and of no request (registry events, ``take``,
    batches), in the order :func:`_events` lists them.

    ``alike`` (for the search by views): of the ``request_finished`` events that differ only by
    a permutation of savers that maps the state onto itself (``world.fixed``, read at the last
    snapshot, which is this state's), only the first is listed. The others lead to renamings of
    its next state, one canonical state with renamed verdicts: what
    :func:`.alike._alike` would spare after applying the first, without listing them.
    """
    world.sync()
    scenario = world.scenario
    alphabet = scenario.alphabet
    ids = sorted(ids)
    out: list[Event] = []
    if "begin" in alphabet:
        out += [("begin", i) for i in ids if world.requests[i].phase == _UNBORN]
    if "request_finished" in alphabet:
        classes = world.fixed[1] if alike and not scenario.params else ()
        out += [e for i in ids for e in _finishing(world, i, classes)]
        out += [(_APPLY_ANSWERS, i) for i in ids if world.requests[i].asking]
    if "request_finished_by" in alphabet:
        classes = world.fixed[1] if alike and not scenario.params else ()
        out += [e for i in ids for e in _told(world, i, classes)]
    # A counted connector's names are reported by its own events only (counted_events).
    own = tuple(n for n in scenario.names if n not in scenario.ranks)
    if "transfer_finished" in alphabet:
        names = own + scenario.unknown
        out += [("transfer_finished", i, n) for i in ids for n in _reporters(world, i, names)]
    if "transfer_finished_many" in alphabet:
        out += [
            ("transfer_finished_many", n, b)
            for n in scenario.batchers
            for b in _BATCHES[len(world.requests)]
            if _batched(world.requests, b, n)
        ]
    if "cancel" in alphabet:
        out += [("cancel", i) for i in ids]
    if "match_tokens" in alphabet:
        savers = [n for n, ready in world.registry if ready and scenario.kinds.get(n) in LOADING]
        answers = [
            tuple(zip(savers, choice, strict=True))
            for choice in itertools.product((0, 1, None), repeat=len(savers))
        ]
        held = [i for i in ids if world.requests[i].phase == _HELD]
        out += [
            ("match_tokens", i, a)
            for i in held
            if not (world.requests[i].matching or world.requests[i].asking)
            for a in answers
        ]
        out += [(_MATCH_ANSWER, i) for i in ids if world.requests[i].matching]
    if "split_load" in alphabet:
        out += _splits(world, ids)
    if "load_finished" in alphabet:
        names = own + scenario.unknown
        out += [("load_finished", i, n) for i in ids for n in _loaders(world, i, names)]
    out += counted_events(world, ids)
    registered = {n for n, _ in world.registry}
    if "unregister" in alphabet:
        out += [("unregister", n) for n in own if n in registered]
    if "register" in alphabet:
        out += [("register", n) for n in own if n not in registered]
    if "take" in alphabet:
        out.append(("take",))
    out += health_events(world)
    if any(world.requests[i].matching for i in ids):
        return [e for e in out if not _outside_match_window(world, e)]
    return out


def _splits(world: _World, ids: Iterable[int]) -> list[Event]:
    """``split_load`` for each pending request no call asks about, and each ordered pair of
    ready connectors that may load: the first loads the first range, the second the next."""
    scenario = world.scenario
    loaders = [
        n
        for n, ready in world.registry
        if ready and scenario.kinds.get(n) in LOADING and may_load(world, n)
    ]
    pending = [
        i
        for i in ids
        if (r := world.requests[i]).view is not None
        and r.view[0] is _PENDING
        and not (r.matching or r.asking)
    ]
    return [("split_load", i, a, b) for i in pending for a in loaders for b in loaders if a != b]


#: The events of a request not explored while a match_tokens asks about it (see
#: :func:`_outside_match_window`): its save side, and a split load's choice (which, like the
#: match's own, records a loader; :func:`_splits` offers it outside a match only).
_SAVE_SIDE: Final = frozenset(
    {"request_finished", _APPLY_ANSWERS, "request_finished_by", "transfer_finished", "split_load"}
)


def _outside_match_window(world: _World, event: Event) -> bool:
    """Whether ``event`` is one the check leaves out while a match_tokens asks about its
    request: that request's save side (``request_finished``'s halves, its transfer reports,
    batches with it). The load race is what the match's window is explored for: its load
    reports, a cancel overtaking it, an unregistering or registering, ``take``; the save side
    touches none of the match's books (``match_tokens`` records its loader only on a pending
    request, and a request_finished that asks or applies around it is explored before and
    after the window)."""
    kind = event[0]
    requests = world.requests
    if kind in _SAVE_SIDE:
        return bool(requests[event[1]].matching)
    if kind == "transfer_finished_many":
        return any(requests[i].matching for i in event[2])
    if kind in ("register", "take"):
        return any(r.matching for r in requests)
    return False


def _reporters(world: _World, i: int, names: tuple[str, ...]) -> tuple[str, ...]:
    """The names whose ``transfer_finished`` for request ``i`` is explored: all of them, but
    while a ``request_finished`` asks about it, with ``scenario.early`` ``"savers"``, not a
    ready connector that the call did not ask or that answered it saves nothing, and with
    ``"off"``, no ready connector it does not await (see :data:`EARLY_REPORTS`)."""
    r = world.requests[i]
    early = world.scenario.early
    if not r.asking or early == "all":
        return names
    ready = {n for n, on in world.registry if on}
    awaiting = r.view[1] if r.view is not None else ()
    if early == "off":
        return tuple(n for n in names if n not in ready or n in awaiting)
    entry = world.mc.registry.entry
    savers: set[str] = set()
    for asked in r.asking:
        savers.update(n for s in halves.savers_asked(asked) if entry(n := s.name) is s)
    return tuple(n for n in names if n not in ready or n in awaiting or n in savers)


def _loaders(world: _World, i: int, names: tuple[str, ...]) -> tuple[str, ...]:
    """The names whose ``load_finished`` for request ``i`` is explored: all of them, but while
    a ``match_tokens`` asks about it, with ``scenario.early`` ``"savers"``, only the names that
    are no ready connector and the connectors that match asked (while each is still the one
    registered under its name), and with ``"off"``, no ready connector (see
    :data:`EARLY_REPORTS`)."""
    r = world.requests[i]
    early = world.scenario.early
    if not r.matching or early == "all":
        return names
    ready = {n for n, on in world.registry if on}
    if early == "off":
        return tuple(n for n in names if n not in ready)
    entry = world.mc.registry.entry
    asked = {n for n, e in r.match_seen[2] if entry(n) is e}
    return tuple(n for n in names if n not in ready or n in asked)


def _subsets(savers: list[str], classes: Sequence[Sequence[str]]) -> list[tuple[str, ...]]:
    """Every subset of ``savers`` (by size, then in their order), or with ``classes`` one per
    number of each class's members in it: the first ones, in ``savers``' order."""
    position = {n: p for p, n in enumerate(savers)}
    groups = [sorted((n for n in c if n in position), key=position.__getitem__) for c in classes]
    groups = [g for g in groups if len(g) > 1]
    if not groups:  # no two savers interchangeable here
        return [c for k in range(len(savers) + 1) for c in itertools.combinations(savers, k)]
    grouped = {n for g in groups for n in g}
    groups += [[n] for n in savers if n not in grouped]
    found = {
        tuple(sorted((n for part in choice for n in part), key=position.__getitem__))
        for choice in itertools.product(*([g[:k] for k in range(len(g) + 1)] for g in groups))
    }
    return sorted(found, key=lambda s: (len(s), [position[n] for n in s]))


def _batched(requests: Sequence[_Request], batch: tuple[int, ...], name: str) -> bool:
    """Whether ``name`` reports ``batch`` in this state: when every request of it awaits
    ``name``. So the batch events stay few, and each applies (or drains) its first report; the
    second meets what the first left: another request's applied or drained report, or, for the
    same request twice, a duplicate or a terminal request."""
    for i in batch:
        view = requests[i].view
        if view is None or name not in view[1]:
            return False
    return True


def _ready_savers(world: _World) -> list[str]:
    """The savers a finishing request may have, told or asked: the ready scripted savers and the
    counted connectors saving, in registration order, a counted one at its first name's place."""
    scenario = world.scenario
    kinds = scenario.kinds
    first = {ranks[0]: n for n, ranks in scenario.ranks.items()}
    counted = counted_savers(world) if first else ()
    return [
        first.get(n, n)
        for n, ready in world.registry
        if ready and (kinds.get(n) in SAVING or first.get(n) in counted)
    ]


def _told(world: _World, i: int, classes: Sequence[Sequence[str]] = ()) -> list[Event]:
    """The ``request_finished_by`` events of request ``i``: every subset of the ready scripted
    savers and counted connectors (as :func:`_finishing` chooses them), each told as the vLLM
    adapter tells it: names in registration order, a counted connector's report names in its
    place. And once every one of them with ``True``: told too, every name that cannot report
    then (:func:`cannot_report`), each abandoned at once."""
    scenario = world.scenario
    ranks = scenario.ranks
    out: list[Event] = []
    for subset in _subsets(_ready_savers(world), classes):
        out.append(("request_finished_by", i, tuple(r for n in subset for r in ranks.get(n, (n,)))))
    if cannot_report(scenario, world.registry):
        out.append((*out[-1], True))
    return out


def cannot_report(scenario: _Scenario, registry: Iterable[tuple[str, bool]]) -> tuple[str, ...]:
    """The names a told ``request_finished_by`` may give that can never report, under
    ``registry`` ((name, ready) in registration order): each registered ``None`` slot, then
    each of the scenario's own names not registered, then the names never registered (a
    counted connector's are registered for good)."""
    registry = tuple(registry)
    registered = {n for n, _ in registry}
    # A load-only connector is never told as a saver: its role refuses it (RoleError).
    own = tuple(
        n for n in scenario.names if n not in scenario.ranks and scenario.kinds[n] != LOADER
    )
    return (
        *(n for n, ready in registry if not ready and scenario.kinds.get(n) != LOADER),
        *(n for n in own if n not in registered),
        *scenario.unknown,
    )


def _finishing(world: _World, i: int, classes: Sequence[Sequence[str]] = ()) -> list[Event]:
    """The ``request_finished`` events of request ``i``: every subset of the ready scripted
    savers and counted connectors saving (each in registration order, a counted one at its
    first name's place, smallest first) and, with params, every choice of the scripted savers'
    answers (``None`` ones left out). With ``classes`` (names any permutation within which
    maps the state onto itself), one subset per number of each class's names saving."""
    scenario = world.scenario
    kinds = scenario.kinds
    savers = _ready_savers(world)
    subsets = _subsets(savers, classes)
    if not scenario.params:
        return [("request_finished", i, s) for s in subsets]
    scripted = [n for n in savers if kinds.get(n) in SAVING]
    choices = [
        tuple((n, c) for n, c in zip(scripted, choice, strict=True) if c is not None)
        for choice in itertools.product(PARAM_CHOICES, repeat=len(scripted))
    ]
    return [("request_finished", i, s, c) for s in subsets for c in choices]

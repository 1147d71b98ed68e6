"""The canonical state of a world: its parts numbered once, the least renaming under symmetry."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Final

from ..machine import TERMINAL
from .scenario import _NOTHING, _TAKEN, _Request, _World


class _Interner:
    """Numbers the distinct request parts and registries, and their renamings, once each.

    Snapshots are then tuples of small ints: cheap to hash, compare and keep.
    """

    def __init__(self, symmetries: Sequence[tuple[tuple[int, ...], Mapping[str, str]]]) -> None:
        self.renamings = [rename for _, rename in symmetries]
        self.ids: dict[Any, int] = {}
        #: renamed[k][id]: the id of the thing numbered ``id``, renamed by renaming ``k``.
        self.renamed: list[dict[int, int]] = [{} for _ in self.renamings]
        #: The canonical key of each raw key (registry, parts, order, queue) met so far, and the
        #: symmetries that map it onto itself: most events lead to a state already seen, whose
        #: canonical form is then a dict look-up.
        self.canonical: dict[tuple[Any, ...], tuple[tuple[Any, ...], tuple[int, ...]]] = {}
        #: The thing each number stands for.
        self.things: list[Any] = []
        #: The part number of each request's raw fields met so far (see :func:`_raw`).
        self.parts: dict[tuple[Any, ...], int] = {}

    def number(self, thing: Any) -> int:
        found = self.ids.get(thing)
        if found is None:
            found = self.ids[thing] = len(self.ids)
            self.things.append(thing)
        return found

    def rename(self, k: int, number: int, how: Callable[..., Any]) -> int:
        table = self.renamed[k]
        found = table.get(number)
        if found is None:
            rename = self.renamings[k]
            thing = self.things[number]
            found = table[number] = self.number(how(thing, rename) if rename else thing)
        return found


def _rename_part(part: Any, rename: Mapping[str, str]) -> Any:
    kind, phase, view, owed, cancelled, load, asking, *params = part
    if load is not None:  # (tag, names and flags): rename the names, keep the flags
        load = tuple(rename.get(x, x) if isinstance(x, str) else x for x in load)
    if asking:
        asking = tuple(
            tuple(sorted((rename.get(n, n), current) for n, current in one)) for one in asking
        )
    if params:  # the params choices of the calls asking (see _part)
        params = [tuple(tuple(sorted((rename.get(n, n), c) for n, c in one)) for one in params[0])]
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
        *params,
    )


def _names_key(names: Iterable[str]) -> tuple[str, ...]:
    """A set of names as a key: sorted, each once (see :func:`_part`)."""
    return tuple(sorted(set(names)))


#: Every field of a request :func:`_part` reads, but ``asking`` (which reads the registry too)
#: and ``answers`` (the params dicts answered, while asking):
#: requests with equal fields have equal parts, so a part is worked out once per distinct tuple.
_raw: Final = operator.attrgetter(
    "phase",
    "view",
    "owed",
    "cancelled",
    "load_view",
    "loader",
    "loaded",
    "loader_gone",
    "load_owed",
)


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
    * With params checked, each call between its halves adds its savers' params choices (as a
      set of (name, choice)): what its second half merges and returns, which ``params merged``
      judges. The params a record keeps once applied are judged on that transition and read
      by nothing later, so they are not part of the state.
    * Counters, outcomes and callbacks are not part of the state: each is judged on the
      transition that made it (``counters`` compares the counts with a tally of what the
      events returned, kept outside the state), and nothing the aggregator does reads them.

    Every field read here but ``asking`` and ``answers`` is in :data:`_raw`, the key parts are
    cached under.
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
    if r.answers:  # params checked: what each call asking will merge (its savers' choices)
        choices = tuple(tuple(sorted(choice)) for choice, _ in r.answers)
        return ("request", r.phase, view, r.owed, r.cancelled, load, asking, choices)
    return ("request", r.phase, view, r.owed, r.cancelled, load, asking)


def _rename_registry(registry: Any, rename: Mapping[str, str]) -> Any:
    tag, names = registry
    renamed = tuple((rename.get(n, n), ready) for n, ready in names)
    return (tag, renamed if tag == _IN_ORDER else tuple(sorted(renamed)))


#: The registry part's tag: names in registration order, or as a set.
_IN_ORDER, _AS_SET = "registry", "registered"


def _snapshot(world: _World) -> Hashable:
    """The canonical state: the least renaming of the observed state under the symmetries."""
    world.sync()
    scenario = world.scenario
    numbers = scenario.interner
    requests = world.requests
    # The registry: which names are registered and which of them are ready. In what order
    # only when the load side is on (match_tokens chooses the first connector, in registration
    # order, with tokens to load) or params are (the merge and its clash follow that order).
    # Otherwise the aggregator reads the order only to order the
    # connectors it asks, and what it records of their answers (awaiting, expected, abandoned,
    # a call's asked savers) is part of the state as sets.
    if scenario.registry_order:
        registry = (_IN_ORDER, world.registry)
    else:
        registry = (_AS_SET, tuple(sorted(world.registry)))
    reg_id = numbers.number(registry)
    part_ids = []
    entry = world.mc.registry.entry
    known_parts = numbers.parts
    for r in requests:
        if r.asking or r.answers:  # reads the registry: numbered from the part itself
            part_ids.append(numbers.number(_part(r, entry)))
            continue
        raw_part = _raw(r)
        number = known_parts.get(raw_part)
        if number is None:
            number = known_parts[raw_part] = numbers.number(_part(r, entry))
        part_ids.append(number)
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
        world.fixed = known[1]
        return known[0]
    best: tuple[Any, ...] | None = None
    fixed: list[int] = []
    unmoved: tuple[Any, ...] | None = None  # the key under the identity, symmetries[0]
    for k, (perm, _) in enumerate(scenario.symmetries):
        moved = [0] * len(requests)
        for i, number in enumerate(part_ids):
            moved[perm[i]] = numbers.rename(k, number, _rename_part)
        key = (
            numbers.rename(k, reg_id, _rename_registry),
            tuple(moved),
            tuple(sorted(perm[i] if i >= 0 else -1 for i in order)),
            tuple(sorted(perm[i] if i >= 0 else -1 for i in queue)),
        )
        if unmoved is None:
            unmoved = key
        elif key == unmoved:
            fixed.append(k)  # this renaming maps the state onto itself
        if best is None or key < best:
            best = key
    assert best is not None
    world.fixed = tuple(fixed)
    numbers.canonical[raw] = (best, world.fixed)
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

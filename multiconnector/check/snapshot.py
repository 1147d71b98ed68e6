"""The state of a world: its parts numbered once, then its canonical form under symmetry."""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable
from typing import Any, Final

from ..machine import TERMINAL
from . import halves
from .breaker import health_key
from .canonical import AS_SET, IN_ORDER, Raw, _names_key
from .scenario import _FINISHED, _NOTHING, _TAKEN, _Request, _World

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
    "part_view",
    "part",
    "part_owed",
)


# Why ``forget`` is sound (docs/check.md, "Settled records").
# With ``forget`` (``check_aggregator(forget=True)``, the default) a *settled* record (one
# finished or cancelled, with no call between its halves) keeps of its names only
# ``awaiting``, and a finished one forgets whether the caller cancelled it. Nothing reads
# the rest again: the rule decides every later report on a terminal record from
# ``awaiting`` alone (``drained`` or ``terminal``; ``unregistered``, ``duplicate`` and
# ``phantom`` come after ``terminal`` in its order), and every later finishing call, told
# or asked, and every cancel from its state alone (refused, asking nobody: a terminal
# record is never claimed, so it never has a call between its halves again); an
# unregistering drains it from ``awaiting``; a load report on it reads the loader and
# whether its load is owed (kept), and a counted connector's report the names it
# awaits or owes a load. ``no early free`` reads ``cancelled`` only of a record handed back
# as cancelled, which a finished one is not without leaving ``finished``; a request handed
# back forgets it too (nothing reads it after that), else a finished
# record's, forgotten, would show again once ``take()`` hands it back. ``terminal
# absorbing`` and ``roles kept`` read ``expected`` and ``abandoned``, but of the world
# before and after each event, never of the state: a change to a settled record's names
# fails on the event that makes it, whichever of the merged worlds it is made in.


def _part(r: _Request, entry: Callable[[str], Any], *, forget: bool = False) -> tuple[Any, ...]:
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
    * A split load's second part (``split_load``): the aggregator's part and whether it is
      owed, and the checker's, beside the loader's, on a live request; on a terminal one the
      part it drains and the checker's owed part, each ``None`` when none is. A state with no
      split keeps the key it had without them.
    * A request handed back keeps no promises: ``no early free`` judged them when ``take()``
      handed it back.
    * A call between its halves keeps the early reports (their names, as a set): its second
      half decides each on the answers alone, whatever the order they came in; the order only
      orders its ``on_finished`` calls, which ``callbacks`` judges on that transition.
    * With params checked, each call between its halves adds its savers' params choices (as a
      set of (name, choice)): what its second half merges and returns, which ``params merged``
      judges. The params a record keeps once applied are judged on that transition and read
      by nothing later, so they are not part of the state.
    * A match_tokens between its halves keeps what :func:`_matching` lists.
    * Counters, outcomes and callbacks are not part of the state: each is judged on the
      transition that made it (``counters`` compares the counts with a tally of what the
      events returned, kept outside the state), and nothing the aggregator does reads them.

    Every field read here but ``asking``, ``answers`` and the match's is in :data:`_raw`, the
    key parts are cached under.
    """
    view = r.view
    cancelled = r.cancelled
    load: tuple[Any, ...] | None = None
    if view is not None:
        loader, loaded, gone = r.load_view
        part, part_owed = r.part_view
        if view[0] in TERMINAL:
            draining = loader if loader is not None and not loaded else None
            if draining is not None or r.load_owed is not None:
                load = ("drain", draining, r.load_owed)
            if part_owed or r.part_owed:  # a split load's part it drains
                drained = part if part_owed else None
                load = (*(load or ("drain", None, None)), drained, r.part if r.part_owed else None)
        elif loader is not None or r.loader is not None or r.load_owed is not None:
            load = ("live", loader, loaded, gone, r.loader, r.loaded, r.loader_gone, r.load_owed)
            if part is not None or r.part is not None:  # a split load's part, and its ledger
                load = (*load, part, part_owed, r.part, r.part_owed)
        names = (_names_key(view[2]), _names_key(view[3]))
        if forget and view[0] in TERMINAL and not (r.asking or r.matching):  # see above
            names, cancelled = ((), ()), cancelled and view[0] is not _FINISHED
        view = (view[0], _names_key(view[1]), *names)
    # A call between its halves: the savers it asked, and whether each is still the one registered
    # (what its answers' application reads), as a set: the order asked orders nothing kept.
    asking = tuple(
        tuple(sorted((e.name, entry(e.name) is e) for e in halves.savers_asked(asked)))
        for asked in r.asking
    )
    early = _names_key(r.early)  # the early reports kept while asking, as a set (see above)
    matching = _matching(r, entry) if r.matching else None
    if r.phase == _TAKEN:  # with forget, not whether it was cancelled (see above)
        told = not forget and r.cancelled
        return ("request", r.phase, view, _NOTHING, told, None, asking, early, matching)
    parts = (r.phase, view, r.owed, cancelled, load, asking, early, matching)
    if r.answers:  # params checked: what each call asking will merge (its savers' choices)
        choices = tuple(tuple(sorted(choice)) for choice, _ in r.answers)
        return ("request", *parts, choices)
    return ("request", *parts)


def _matching(r: _Request, entry: Callable[[str], Any]) -> tuple[Any, ...]:
    """A match_tokens between its halves: what its second half reads (the loader the
    aggregator's first half chose, whether it is still the connector registered under its
    name, whether the asking stopped at a ``None``), what the checker saw of its answers (the
    loader they chose, whether decisive, each connector asked and whether it is still the one
    registered: which early reports are explored), and the load reports that came meanwhile:
    the early ones kept (a set: each is decided on the answer alone, and only the loader's
    changes the record) and the savers that delivered one (a set)."""
    asked = r.matching
    chooser = asked[2]
    decisive, chose, entries = r.match_seen
    return (
        decisive,
        chose,
        tuple(sorted((n, entry(n) is e) for n, e in entries)),
        None if chooser is None else chooser.name,
        chooser is not None and entry(chooser.name) is chooser,
        asked[4],
        _names_key(r.load_early),
        _names_key(r.window_loads),
    )


def _snapshot(world: _World) -> Hashable:
    """The canonical state: the observed state, numbered, in its canonical form under symmetry
    (:mod:`.canonical`)."""
    raw = world.raw if world.raw is not None else _numbered(world)
    key, world.fixed = world.scenario.symmetry.canonical(world.scenario.interner, raw)
    return key


def _numbered(world: _World) -> Raw:
    """The observed state, numbered (kept as ``world.raw`` until the next event)."""
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
        registry = (IN_ORDER, world.registry)
    else:
        registry = (AS_SET, tuple(sorted(world.registry)))
    health = health_key(world)
    # Each child's health, beside the registry (symmetry is off under health).
    reg_id = numbers.number(registry if health is None else (*registry, health))
    part_ids = []
    entry = world.mc.registry.entry
    known_parts = numbers.parts
    forget = scenario.forget
    for r in requests:
        if r.asking or r.answers or r.matching:  # reads the registry: numbered from the part
            part_ids.append(numbers.number(_part(r, entry, forget=forget)))
            continue
        raw_part = _raw(r)
        number = known_parts.get(raw_part)
        if number is None:
            number = known_parts[raw_part] = numbers.number(_part(r, entry, forget=forget))
        part_ids.append(number)
    # Which requests are held and queued for take() matters, not in what order: no property
    # reads the order (take()'s list is judged record by record), and requests are assumed
    # not to interact except through the registry and take() (docs/check.md, "Reductions").
    # Queued as a set, but for a request queued twice or more, listed twice: it fails "no
    # early free" on the event that queued it again (take() would hand it back twice), and
    # take() may then raise on the second copy ("no exception"): a state queued twice is not
    # one queued once, whatever else they share (``forget`` merges a settled record's names,
    # which told the two apart). Beyond two the copies differ in no verdict; counted, a bug
    # that re-queues a record on every event (a drain applied again) has no end of states.
    queue = world.queue
    if len(set(queue)) == len(queue):
        queue = tuple(sorted(queue))
    else:
        queue = tuple(sorted((*set(queue), *{i for i in queue if queue.count(i) > 1})))
    order = tuple(sorted(world.order))
    raw = world.raw = (reg_id, tuple(part_ids), order, queue)
    return raw


def _views(world: _World) -> list[tuple[int, Hashable, Hashable, bool]]:
    """Each request's view of the state, for the search by views (``--per-request``):
    (request index, its own part, its context, whether it is a goal).

    Its own part is the registry and its record, whether it is held and whether queued, in the
    canonical form of a one-request state: everything its future and its verdicts read, as long
    as requests interact only through the registry, ``take()`` and batches (the assumption the
    sleep sets rest on too; docs/check.md, "Requests apart"). Its context is how many other
    requests are held, while it is not finished or cancelled (0 once it is): so each part of a
    live or not yet begun request is explored next to no other request held and next to one
    held, a finished or cancelled one's once, and an event of one request is checked not to
    change another's own part next to it. Its goal: not live (finished, cancelled, handed back
    or not begun).
    """
    raw = world.raw if world.raw is not None else _numbered(world)
    numbers = world.scenario.interner
    views = numbers.views.get(raw)
    if views is None:  # a function of the raw state: worked out once per raw state
        views = numbers.views[raw] = _views_of(world, raw)
    return views


def _views_of(world: _World, raw: Raw) -> list[tuple[int, Hashable, Hashable, bool]]:
    reg_id, part_ids, order, queue = raw
    scenario = world.scenario
    key, numbers = scenario.symmetry.key, scenario.interner
    held = len(order)  # the requests held, by index
    views: list[tuple[int, Hashable, Hashable, bool]] = []
    for i, number in enumerate(part_ids):
        mine = i in order
        one = (reg_id, (number,), (0,) if mine else (), (0,) * queue.count(i))  # twice: (0, 0)
        view = numbers.things[number][2]  # the record's state and names, None when not held
        done = mine and view is not None and view[0] in TERMINAL
        goal = not mine or view is None or done
        views.append((i, key(numbers, one), 0 if done else held - mine, goal))
    return views

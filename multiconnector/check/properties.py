"""The properties the aggregator check judges on every transition, and what coverage can expect."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Final

from .._explore import (
    NO_EXCEPTION,
    NO_TRAP,
    STATES_REACHED,
    TRANSITIONS_FIRED,
)
from ..machine import TERMINAL, State
from .scenario import (
    _APPLIED,
    _APPLY_ANSWERS,
    _CANCELLED,
    _FINISHED,
    _GONE,
    _HELD,
    _KINDS,
    _TAKEN,
    _UNBORN,
    SAVER,
    Event,
    _names,
    _Request,
    _show_view,
    _view,
    _World,
)

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

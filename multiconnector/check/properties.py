"""The properties the aggregator check judges on every transition, and what coverage can expect."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any, Final

from .._explore import (
    NO_EXCEPTION,
    NO_TRAP,
    STATES_REACHED,
    TRANSITIONS_FIRED,
)
from ..health import Health
from ..machine import CALL_EVENTS, TERMINAL, State
from ..outcome import Outcome
from . import halves
from .breaker import DECLARED, health_names, states
from .reference import expected_outcomes, reference_merge
from .scenario import (
    _APPLIED,
    _APPLY_ANSWERS,
    _CANCELLED,
    _FINISHED,
    _GONE,
    _HELD,
    _MATCH_ANSWER,
    _TAKEN,
    _UNBORN,
    COUNTED,
    COUNTED_LOAD,
    COUNTED_RANKS,
    COUNTED_SAVE,
    LOADER,
    LOADING,
    SAVING,
    STORE,
    Event,
    _names,
    _Request,
    _show_view,
    _view,
    _World,
    scripted_params,
)

TERMINAL_ABSORBING: Final = "terminal absorbing"
NO_EARLY_FREE: Final = "no early free"
NO_LEAK: Final = "no leak"
#: Reported only when a load event is in the alphabet, after ``no leak``.
LOAD_ONCE: Final = "load once"
RIGHT_OUTCOME: Final = "right outcome"
COUNTERS: Final = "counters"
CALLBACKS: Final = "callbacks"
#: Reported only when params are checked (``params=True``), after ``callbacks``.
PARAMS_MERGED: Final = "params merged"
#: Reported only when a connector has a role (a ``store`` or a ``loader``), after the others.
ROLES_KEPT: Final = "roles kept"
#: Reported only under health (``health=True``), after the others.
BREAKER_KEPT: Final = "breaker kept"
#: Every property the aggregator check reports, in report order.
PROPERTIES: Final[tuple[str, ...]] = (
    NO_EXCEPTION,
    TERMINAL_ABSORBING,
    NO_EARLY_FREE,
    NO_LEAK,
    RIGHT_OUTCOME,
    COUNTERS,
    CALLBACKS,
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
    if r.part_owed:
        owing.append(f"{r.part} (load part)")
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
    """no state outlives its request, and no request is stranded"""
    world.sync()
    mc = world.mc
    for i, r in enumerate(world.requests):
        if r.phase == _TAKEN and r.request_id in mc:
            return f"{r.request_id} was handed back by take() but is still held"
        if r.phase == _HELD and r.view is None:
            return f"{r.request_id} is no longer held but take() never handed it back"
        view = r.view
        if view is None or r.asking or r.matching:
            continue
        # A connector reports a save once: a name awaited that owes nothing (it reported, even
        # early, or never promised) is awaited for ever.
        stale = [n for n in view[1] if n not in r.owed]
        if stale:
            return (
                f"{r.request_id} is {view[0].value} awaiting {_names(stale)}, which owe no "
                "report (already delivered): it is stranded"
            )
        loader, loaded, gone = r.load_view
        if loader is not None and not (loaded or gone) and r.load_owed != loader:
            # A connector reports a load once: a load awaited that is owed no more (delivered,
            # even early, or its loader unregistered) is awaited for ever.
            return (
                f"{r.request_id} is {view[0].value} awaiting the load of {loader}, which owes "
                "none (delivered already, or unregistered): it is stranded"
            )
        part, part_owed = r.part_view
        if part_owed and not (r.part == part and r.part_owed):
            return (
                f"{r.request_id} is {view[0].value} awaiting the load part of {part}, which "
                "owes none (delivered already, or unregistered): it is stranded"
            )
        if view[0] not in TERMINAL or i in world.queue:
            continue
        if not view[1] and (loader is None or loaded) and not part_owed:  # nothing in flight
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
    # While a match asks, no load is due: a report is kept, and decided when it records.
    due = load.early is None and load.live
    if name == load.part and name != load.loader:  # a split load's part: its own report
        due = due and load.part_owed
    else:
        due = due and name == load.loader and not load.loaded and not load.loader_gone
    if applied and not due:
        if not load.live:
            why = "after it was terminal or handed back"
        elif load.loader is None:
            why = "though no connector was chosen to load it"
        elif name == load.part:
            why = f"from {name}, whose part of the load was delivered or unregistered already"
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
    if (
        load.early is None
        and load.live
        and name == load.loader
        and load.loader_gone
        and load.outcome is not _GONE
    ):
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


def _right_outcome(world: _World) -> str | None:
    """every event returns the outcome the checker classifies from what it saw before it"""
    last = world.last
    if last is None or last.outcomes is None:  # none returned, or raised without a result
        return None
    expected = expected_outcomes(last, world.scenario.atomic)
    if expected is None or tuple(last.outcomes) == expected:
        return None
    label = _event_text(world, last.event)
    got = ", ".join(o.value for o in last.outcomes) or "nothing (it asked the connectors)"
    want = ", ".join(o.value for o in expected) or "nothing (it asks the connectors)"
    return f"{label} returned {got}; the checker expected {want}"


def _event_text(world: _World, event: Event) -> str:
    """An event as a call, with the real request ids."""
    ids = world.scenario.ids
    kind = event[0]
    if kind == "transfer_finished_many":
        return f"transfer_finished_many({event[1]}, [{', '.join(ids[i] for i in event[2])}])"
    if kind in ("transfer_finished", "load_finished"):
        return f"{kind}({ids[event[1]]}, {event[2]})"
    if kind == "split_load":
        return f"choose_loader({ids[event[1]]}, {event[2]}, parts=[{event[3]}])"
    if kind in (COUNTED_SAVE, COUNTED_LOAD):
        return counted_text(ids, event)
    if kind == _APPLY_ANSWERS:
        return f"request_finished({ids[event[1]]}) applying its answers"
    if kind == "request_finished_by":
        return told_text(ids, event)
    if kind == _MATCH_ANSWER:
        return f"match_tokens({ids[event[1]]}) recording its loader"
    if kind in ("begin", "cancel", "request_finished", "match_tokens"):
        return f"{kind}({ids[event[1]]})"
    return f"{kind}({', '.join(str(x) for x in event[1:])})"


def told_text(ids: tuple[str, ...], event: Event) -> str:
    """A told ``request_finished_by``, as the trace shows it."""
    more = ", every name that cannot report" if len(event) > 3 else ""
    return f"request_finished_by({ids[event[1]]}, [{', '.join(event[2])}]{more})"


def counted_text(ids: tuple[str, ...], event: Event) -> str:
    """A counted connector's report, as the trace shows it."""
    of = "save" if event[0] == COUNTED_SAVE else "load"
    return f"counted report ({of}) of {ids[event[1]]} by {event[2]}"


def _counters(world: _World) -> str | None:
    """counts() and connector_counts() grow by exactly the outcomes each event returned"""
    last = world.last
    if last is None:
        return None
    # What counts() and connector_counts() sum, in one read (the property is judged on every
    # transition: see the seam's _counted).
    counted = halves.counted(world.mc)
    if counted == world.tally:
        return None
    label = _event_text(world, last.event)
    counts, want = _by_outcome(counted, None), _by_outcome(world.tally, None)
    if counts != want:
        return f"after {label}, counts() is {_show_counts(counts)}; {_TALLY} {_show_counts(want)}"
    names = sorted({n for _, n in counted.keys() | world.tally.keys() if n is not None})
    wrong = next(n for n in names if _by_outcome(counted, n) != _by_outcome(world.tally, n))
    return (
        f"after {label}, connector_counts()[{wrong!r}] is "
        f"{_show_counts(_by_outcome(counted, wrong))}; {_TALLY} "
        f"{_show_counts(_by_outcome(world.tally, wrong))}"
    )


def _by_outcome(
    counted: Mapping[tuple[Outcome, str | None], int], name: str | None
) -> dict[Outcome, int]:
    """``counted`` summed by outcome: all of it (``name`` None), or that name's."""
    out: dict[Outcome, int] = {}
    for (outcome, n), k in counted.items():
        if k and (name is None or n == name):
            out[outcome] = out.get(outcome, 0) + k
    return out


_TALLY: Final = (
    "the outcomes the events returned (and the requests unregistering abandoned) add up to"
)


def _show_counts(counts: Mapping[Outcome, int]) -> str:
    return "{" + ", ".join(f"{o.value}: {n}" for o, n in sorted(counts.items())) + "}"


def _callbacks(world: _World) -> str | None:
    """on_finished and on_load_finished are called once for each applied report, and only then"""
    last = world.last
    if last is None:
        return None
    event = last.event
    kind = event[0]
    ids = world.scenario.ids
    kinds = world.scenario.kinds
    called: list[tuple[str, str]] = []
    outcomes = last.outcomes or ()
    if kind == "transfer_finished":
        called = [(event[2], ids[event[1]]) for o in outcomes if o is _APPLIED]
    elif kind == "transfer_finished_many":
        called = [
            (event[1], ids[i]) for i, o in zip(event[2], outcomes, strict=False) if o is _APPLIED
        ]
    elif kind == _APPLY_ANSWERS:  # the early reports it applied
        called = [(n, ids[event[1]]) for n, o in last.settled if o is _APPLIED]
    registry = dict(last.registry)
    if kind == _MATCH_ANSWER:  # the early load reports it applied
        loads = [n for n, o in last.settled_loads if o is _APPLIED]
        loads = [n for n in loads if kinds.get(n) in LOADING and registry.get(n)]
        if tuple(loads) != last.load_called:
            label = _event_text(world, event)
            rid = ids[event[1]]
            calls = [(n, rid) for n in last.load_called]
            return (
                f"{label} called on_load_finished {_calls(calls)}; "
                f"{_expected_calls([(n, rid) for n in loads])}"
            )
    if not called and not last.called and last.load is None:
        return None  # nothing applied, nothing called: the common case
    # Only a scripted saver registered under the name has on_finished (a store too, not a
    # loader: its role rules saves out), only a saver or a loader on_load_finished.
    called = [(n, r) for n, r in called if kinds.get(n) in SAVING and registry.get(n)]
    if tuple(called) != last.called:
        label = _event_text(world, event)
        return f"{label} called on_finished {_calls(last.called)}; {_expected_calls(called)}"
    load = last.load
    if load is not None:
        name = load.name
        due = load.outcome is _APPLIED and kinds.get(name) in LOADING and registry.get(name)
        if load.callbacks != ((name,) if due else ()):
            label = _event_text(world, event)
            calls = [(n, load.request_id) for n in load.callbacks]
            want = [(name, load.request_id)] if due else []
            return f"{label} called on_load_finished {_calls(calls)}; {_expected_calls(want)}"
    return None


def _calls(calls: Collection[tuple[str, str]]) -> str:
    if not calls:
        return "never"
    return ", ".join(f"of {n} for {r}" for n, r in calls)


def _expected_calls(calls: Collection[tuple[str, str]]) -> str:
    if not calls:
        return "no call was due: no report was applied"
    return f"due: {_calls(calls)} (once per applied report)"


def _params_merged(world: _World) -> str | None:
    """request_finished returns (and raises) what the reference merge says; inputs unchanged"""
    last = world.last
    if last is None or last.answers is None:
        return None
    scenario = world.scenario
    event = last.event
    choices, answered = last.answers
    chosen = dict(choices)
    fresh = [(name, scripted_params(name, chosen.get(name))) for name, _ in answered]
    for (name, given), (_, was) in zip(answered, fresh, strict=True):
        if given != was:
            return f"{name} answered params {was!r}, which became {given!r}: an input was changed"
    merged, clashing = reference_merge(fresh, scenario.allow_equal)
    applies = event[0] == _APPLY_ANSWERS or scenario.atomic
    clash: Any = last.clash
    rid = scenario.ids[event[1]]
    if clash is not None:
        if not clashing:
            return (
                f"request_finished({rid}) raised {type(clash).__name__} ({clash}); no key clashes"
            )
        if not applies:
            return (
                f"request_finished({rid}) raised {type(clash).__name__} before applying its "
                "answers: the connectors that promised a save are not recorded"
            )
        result = clash.result
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], Outcome)):
            return (
                f"request_finished({rid}) raised {type(clash).__name__} with result={result!r}: "
                "not the (outcome, None) it applied, so the answers were not applied"
            )
        if result[1] is not None:
            return f"request_finished({rid}) raised a clash and returned params {result[1]!r}"
        if set(getattr(clash, "clashes", ())) != set(clashing):
            return (
                f"request_finished({rid}) raised a clash of {sorted(clash.clashes)}; the "
                f"reference merge clashes on {sorted(clashing)}"
            )
        return None
    if not applies or last.outcomes is None:
        return None
    if clashing:
        return (
            f"request_finished({rid}) raised no KeyClashError, though {', '.join(clashing)} "
            f"clash{'es' if len(clashing) == 1 else ''} in {_answers(fresh)}"
        )
    result = last.result
    params = result[1] if isinstance(result, tuple) and len(result) == 2 else result
    want = merged if last.outcomes[0] is _APPLIED else None
    if params != want:
        return (
            f"request_finished({rid}) returned params {params!r}; the reference merge of "
            f"{_answers(fresh)} is {want!r}"
        )
    if params is not None and any(params is given for _, given in answered):
        return f"request_finished({rid}) returned a connector's own params dict"
    world.sync()
    record = world.requests[event[1]].record
    if last.outcomes[0] is _APPLIED and record is not None:
        if record.params != merged:
            return f"{rid} keeps params {record.params!r}; the reference merge is {merged!r}"
        if params is not None and record.params is params:
            return f"request_finished({rid}) returned the params dict its record keeps"
    return None


def _roles_kept(world: _World) -> str | None:
    """a save-only connector is never asked to load nor chosen; a load-only one is never awaited"""
    kinds = world.scenario.kinds
    last = world.last
    if last is not None and last.matched:
        stores = [n for n in last.matched if kinds.get(n) == STORE]
        if stores:
            return (
                f"{_event_text(world, last.event)} asked {_names(stores)} for matched tokens, "
                "registered with Role.save: a save-only connector is never asked to load"
            )
    world.sync()
    for r in world.requests:
        view = r.view
        if view is None:
            continue
        loaders = sorted({n for n in (*view[1], *view[2]) if kinds.get(n) == LOADER})
        if loaders:
            return (
                f"{r.request_id} is {_show_view(view)}: {_names(loaders)}, registered with "
                "Role.load, counted as a saver; a load-only connector is never awaited"
            )
        loader = r.load_view[0]
        if loader is not None and kinds.get(loader) == STORE:
            return (
                f"{r.request_id}'s loader is {loader}, registered with Role.save: a save-only "
                "connector is never chosen to load"
            )
    return None


def _breaker_kept(world: _World) -> str | None:
    """an open child is never asked to look up nor chosen to load; health moves as declared"""
    last = world.last
    if last is None or last.health is None:
        return None
    names = health_names(world)
    before = dict(zip(names, last.health, strict=True))
    text = _event_text(world, last.event)
    asked = [n for n in last.matched if before.get(n) is Health.open]
    if asked:
        return f"{text} asked {_names(asked)} for matched tokens, open: an open child is not asked"
    chosen = [n for n in last.chose if before.get(n) is Health.open]
    if chosen:
        return f"{text} chose {_names(chosen)} to load, open: an open child is never chosen"
    after = states(world)
    assert after is not None
    kind = last.event[0]
    trigger, moved = _HEALTH_TRIGGER.get(kind), set(names)
    if kind == "failure":
        moved = {last.event[1]}
    elif trigger == "probe_ok":
        moved = set(last.matched)
    for name, source, dest in zip(names, last.health, after, strict=True):
        if trigger is not None and name in moved:
            if (source, trigger, dest) not in DECLARED:
                return (
                    f"{text}: {name} moved {source.value} -> {dest.value} on {trigger}, "
                    "a transition the health machine does not declare"
                )
        elif source is not dest:
            return f"{text}: {name} moved {source.value} -> {dest.value}, by no event of its own"
    return None


#: The health machine's event each event of the check is to a child it concerns.
_HEALTH_TRIGGER: Final = {"failure": "failure", "cooled": "cooled", "match_tokens": "probe_ok"}


def _answers(answered: Collection[tuple[str, Any]]) -> str:
    return ", ".join(f"{n}: {p!r}" for n, p in answered) or "no answers"


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

    Every transition needs ``begin``, and a call in ``events`` that fires its event
    (:data:`multiconnector.machine.CALL_EVENTS`: ``connector_gone`` is fired by ``unregister``,
    ``request_finished`` by either finish call); one touching ``finishing`` needs a saver and a
    call that fires ``request_finished`` (the way into ``finishing``); one staying in
    ``finishing`` needs two savers (a request awaits a second report, or a second connector's
    unregistering). One touching ``cancelled`` needs ``cancel``; a drain (``cancelled`` to
    itself) also needs a saver and a call that fires ``request_finished``, so that a cancelled
    request awaits a report. A counted connector counts as a saver per name, but for
    ``connector_gone``: its names are never unregistered. A transition of an event no call
    fires is assumed reachable.

    .. versionadded:: 0.1.0
    """
    savers = sum(1 for kind in connectors.values() if kind in SAVING)
    # A counted connector saves under each of its names, none of which is ever unregistered.
    ranks = COUNTED_RANKS * sum(1 for kind in connectors.values() if kind == COUNTED)
    begins = "begin" in events
    fired = {event for call, event in CALL_EVENTS.items() if call in events}
    known = frozenset(CALL_EVENTS.values())
    finishing = State.finishing.value
    cancelled = State.cancelled.value
    finish = "request_finished"  # the event into finishing, fired asked or told

    def reachable(triple: tuple[str, str, str]) -> bool:
        source, event, dest = triple
        needs = {event} & known
        least = 0
        if finishing in (source, dest):
            needs.add(finish)
            least = 2 if source == dest else 1
        if cancelled in (source, dest):
            needs.add("cancel")
            if source == dest:
                needs.add(finish)
                least = max(least, 1)
        gone = event == "connector_gone"  # of a saver that can be unregistered: not a counted one
        return begins and needs <= fired and savers + ranks >= least and (savers >= 1 or not gone)

    return reachable

"""The breadth-first search itself: replays and copies, sleep sets, the trap search, traces."""

from __future__ import annotations

import functools
import gc
import inspect
import time
from array import array
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Final, Generic, TypeVar

from .._validate import shown
from ..errors import InvalidArgumentError, NondeterminismError
from .config import SearchConfig
from .progress import _Progress
from .report import (
    ACTORS_APART,
    MAX_DEPTH,
    MAX_SECONDS,
    MAX_STATES,
    NO_EXCEPTION,
    NO_TRAP,
    STATES_REACHED,
    TRANSITIONS_FIRED,
    CheckReport,
    Counterexample,
    PropertyResult,
    TraceStep,
    TransitionCoverage,
    Triple,
    _jsonable,
)
from .views import _Views

__all__ = ["NondeterminismError", "declared_transitions"]

M = TypeVar("M")
E = TypeVar("E")


def declared_transitions(machine: Any) -> tuple[tuple[str, ...], tuple[Triple, ...]]:
    """The states and the (source, event, dest) transitions of a ``transitions.Machine``.

    Guarded alternatives are distinct transitions when their destinations differ; ``"="`` and
    internal transitions lead back to their source.

    .. versionadded:: 0.1.0
    """
    events = getattr(machine, "events", None)
    states = getattr(machine, "states", None)
    if not isinstance(events, Mapping) or not isinstance(states, Mapping):
        raise InvalidArgumentError(f"machine={shown(machine)} must be a transitions.Machine")
    found: dict[Triple, None] = {}
    for name, event in events.items():
        for source, candidates in event.transitions.items():
            for t in candidates:
                found.setdefault((str(source), str(name), str(t.dest or source)), None)
    return tuple(str(s) for s in states), tuple(found)


#: Collect the young objects' cycles once per this many states expanded (plus one: a mask).
_COLLECT_EVERY: Final = (1 << 14) - 1
#: With ``fork``, the most models kept for states found and not yet expanded (each is then
#: expanded from the model it was found with instead of replaying its path); past it, replay.
_KEEP_MODELS: Final = 250_000


def _verdict(result: object) -> str | None:
    """``None`` when an invariant held; otherwise a message (``""``: none given)."""
    if result is None or result is True:
        return None
    if result is False:
        return ""
    if isinstance(result, str):
        return result
    raise InvalidArgumentError(
        f"an invariant returned {shown(result)}; it must return None, a bool or a str"
    )


def _docstring(fn: Any) -> str:
    doc = inspect.getdoc(fn) if callable(fn) and not isinstance(fn, type) else None
    return doc.strip().splitlines()[0] if doc else ""


def _description(fn: Any, name: str) -> str:
    return _docstring(fn) or name


class _Search(Generic[M, E]):
    """The state of one breadth-first search: the graph, coverage, first violations."""

    def __init__(
        self,
        *,
        initial: Callable[[], M],
        events: Callable[[M], Iterable[E]],
        apply: Callable[[M, E], object],
        snapshot: Callable[[M], Hashable],
        invariants: dict[str, Callable[[M], object]],
        goal: Callable[[M], bool] | None,
        ways_out: Callable[[E], bool] | None,
        machine: Any,
        fired: Callable[[M], Iterable[Triple]] | None,
        reached: Callable[[M], Iterable[str]] | None,
        expected: Callable[[Triple], bool] | None = None,
        config: SearchConfig,
    ) -> None:
        self.initial, self.events, self.apply, self.snapshot = initial, events, apply, snapshot
        actor, independent = config.actor, config.independent
        #: With ``views``: the search by views (:mod:`.views`), which replaces the sleep sets.
        views = config.views
        self.views = None if views is None or actor is None else _Views(views, actor, ways_out)
        self.events_of = config.events_of if self.views is not None else None
        self.checks = list(invariants.items())
        self.goal, self.ways_out = goal, ways_out
        self.fired, self.reached = fired, reached
        self.max_states, self.max_depth = config.max_states, config.max_depth
        self.max_seconds, self.expected = config.max_seconds, expected
        if actor is not None and independent is None and self.views is None:
            independent = functools.partial(_different_actors, actor)
        self.independent = independent
        self.actor = None if self.views is not None else actor
        #: With ``actor``: each sleep set's events with their actors (for :meth:`asleep`).
        self.acting: dict[frozenset[Any], tuple[tuple[Any, Hashable | None], ...]] = {}
        self.alike = config.alike
        self.fork = config.fork
        self.keep_models = _KEEP_MODELS if config.keep_models is None else config.keep_models
        #: Events not applied because an event applied from the same state did the same.
        self.spared = 0
        #: Sleep sets (partial-order reduction), by state: the events not to apply there.
        self.sleep: list[frozenset[Any] | None] = []
        self.sleep_sets: dict[frozenset[Any], frozenset[Any]] = {}
        #: Transitions the sleep sets spared, and those applied again for the trap search.
        self.pruned = 0
        self.reexpanded = 0
        #: The bounds that cut the search short, in the order they did.
        self.stopped: dict[str, None] = {}
        self.machine = machine
        self.declared_states: tuple[str, ...] = ()
        self.declared: tuple[Triple, ...] = ()
        self.seen_states: set[str] = set()
        if machine is not None:
            self.declared_states, self.declared = declared_transitions(machine)
            first = getattr(machine, "initial", None)
            if first:
                self.seen_states.add(str(first))
        self.coverage: dict[Triple, int] = dict.fromkeys(self.declared, 0)
        #: property -> (state the violating event left, the event or None, message)
        self.first: dict[str, tuple[int, Any, str]] = {}
        # The graph; states are numbered in discovery (breadth-first) order.
        self.ids: dict[Hashable, int] = {}
        self.parent = array("q")
        self.via: list[Any] = []
        self.depth = array("i")
        self.goals = bytearray()
        self.open = bytearray()  # 1: a bound left it not fully expanded
        self.out_src = array("i")  # ways-out edges, for the trap search
        self.out_dst = array("i")
        self.generated = 0
        self.edges = 0
        self.wall = 0.0
        #: When ``max_seconds`` runs out (``time.perf_counter()``), set when the search starts.
        self.deadline: float | None = None

    # -- the search ----------------------------------------------------------------------------

    def path(self, sid: int) -> list[Any]:
        events: list[Any] = []
        while sid > 0:
            events.append(self.via[sid])
            sid = int(self.parent[sid])
        events.reverse()
        return events

    def replay(self, sid: int) -> M:
        model = self.initial()
        apply = self.apply
        for event in self.path(sid):
            apply(model, event)
        return model

    def revisit(self, sid: int) -> M:
        """The model of state ``sid``, rebuilt by replay and checked to be that state."""
        model = self.replay(sid)
        if self.ids.get(self.snapshot(model)) != sid:
            raise NondeterminismError(
                f"replaying the path to state {sid} ({len(self.path(sid))} events) gave another "
                "snapshot: apply() or snapshot() depends on something outside the model"
            )
        return model

    def record(self, name: str, source: int, event: Any, message: str) -> None:
        # Breadth-first: the first violation found of each property is a shortest one.
        self.first.setdefault(name, (source, event, message))

    def by_views(self, model: M, sid: int, event: Any, here: Hashable) -> tuple[bool, M | None]:
        """By views: whether to keep the state ``event`` led to from kept state ``sid`` (a view
        of it is new; or no room is left to keep it, which the caller then says), and the model
        to go on with: that state's when kept; otherwise ``sid``'s own when the event led back to
        it (an event ignored), else ``None`` (a copy or a replay for the next event), as ``run``
        does. Its view edges are recorded and ``actors apart`` judged on the way."""
        views = self.views
        assert views is not None
        room = self.max_states is None or len(self.via) < self.max_states
        found = views.arrive(model, len(self.via), room=room)
        if found is None:
            return True, model
        self.apart(views.edge(sid, event, found), sid, event)
        if views.kept(found[0]):
            return True, model
        # Snapshots are compared only for a state whose views are the ones here.
        same = found[0] == views.numbers[sid] and self.snapshot(model) == here
        return False, model if same else None

    def listed(self, model: M, sid: int) -> tuple[list[E], bool]:
        """The events to try from state ``sid``, and whether the search by views must still
        skip other actors' among them (not when ``events_of`` listed only the actors whose view
        is new there, and no actor's)."""
        if self.events_of is not None and self.views is not None:
            return list(self.events_of(model, self.views.new[sid])), False
        return list(self.events(model)), self.views is not None

    def apart(self, message: str | None, source: int, event: Any) -> None:
        """``actors apart``, with ``views``: an actor's event changed another actor's view."""
        if message is not None:
            self.record(ACTORS_APART, source, event, message)

    def observe(self, model: M, source: int, event: Any) -> None:
        for name, check in self.checks:
            if name in self.first:
                continue
            try:
                verdict = _verdict(check(model))
            except AssertionError as exc:
                verdict = str(exc)
            if verdict is not None:
                self.record(name, source, event, verdict or _description(check, name))
        if self.fired is not None:
            coverage, seen = self.coverage, self.seen_states
            for triple in self.fired(model):
                key = (str(triple[0]), str(triple[1]), str(triple[2]))
                coverage[key] = coverage.get(key, 0) + 1
                seen.add(key[0])
                seen.add(key[2])
        if self.reached is not None:
            self.seen_states.update(str(s) for s in self.reached(model))

    def add(
        self,
        key: Hashable,
        model: M,
        source: int,
        event: Any,
        depth: int,
        *,
        sleep: frozenset[Any] | None = None,
    ) -> int:
        sid = len(self.via)
        self.sleep.append(sleep)
        self.ids[key] = sid
        self.parent.append(source)
        self.via.append(event)
        self.depth.append(depth)
        self.goals.append(1 if self.goal is not None and self.goal(model) else 0)
        self.open.append(0)
        return sid

    def run(self, show: _Progress) -> None:
        """The search: every state found expanded breadth-first, until done or a bound; then
        the trap search."""
        start = time.perf_counter()
        root = self.initial()
        self.observe(root, -1, None)
        self.add(self.snapshot(root), root, -1, None, 0)
        if self.views is not None:
            self.views.arrive(root, 0)  # every view of the first state is new
        via, depth, open_ = self.via, self.depth, self.open
        # With fork: the model each new state was found with, until it is expanded.
        kept: dict[int, M] = {}
        index = 0
        deadline = self.deadline = None if self.max_seconds is None else start + self.max_seconds
        # The cyclic garbage collector is paused while searching: the search makes millions of
        # short-lived objects and keeps the models of the states still to expand, and each of
        # the collector's passes over them found nothing to free (reference counting frees what
        # the search drops), yet cost about a seventh of the time. Cycles a model makes are
        # still collected among the young objects every few thousand states.
        collecting = gc.isenabled()
        gc.disable()
        stopped = self.stopped
        try:
            while index < len(via):
                if deadline is not None and time.perf_counter() > deadline:
                    # Stop cleanly: what is left in the queue stays open (a state the budget ran
                    # out in the middle of included: every state found so far was checked).
                    stopped.setdefault(MAX_SECONDS, None)
                    for rest in range(index, len(via)):
                        open_[rest] = 1
                    break
                sid = index
                index += 1
                if self.max_depth is not None and depth[sid] >= self.max_depth:
                    open_[sid] = 1
                    stopped.setdefault(MAX_DEPTH, None)
                    continue
                model: M | None = kept.pop(sid, None)
                if model is None:
                    model = self.revisit(sid)
                if self.expand(sid, model, kept, deadline):
                    index -= 1  # cut short by the deadline: the next turn marks it open
                if index & 31 == 0:
                    show.update(len(via), self.generated, depth[sid], len(via) - index)
                    if collecting and index & _COLLECT_EVERY == 0:
                        gc.collect(1)  # the young objects only: cycles made since the last one
        finally:
            # The models kept for states not expanded (a search cut short leaves many) are
            # dropped before the collector is back: its first full pass would walk them all
            # (seconds past a time budget, with nine savers).
            kept.clear()
            show.close()
            self.wall = time.perf_counter() - start
        try:
            self.traps(start)
        finally:
            if collecting:
                gc.enable()

    def expand(self, sid: int, model: M, kept: dict[int, M], deadline: float | None) -> bool:
        """Apply each event of state ``sid`` (its model ``model``) not spared, recording what
        each reached; a new state's model goes to ``kept`` (with fork). True when ``deadline``
        passed within the state: it stays open, not fully expanded."""
        ids, open_, out_src, out_dst = self.ids, self.open, self.out_src, self.out_dst
        apply, snapshot, ways_out = self.apply, self.snapshot, self.ways_out
        alike, fork, views = self.alike, self.fork, self.views
        # An untouched copy of this state's model, copied again for each event that
        # leaves the state (instead of replaying its path again); None: replay.
        pristine = fork(model) if fork is not None else None
        here = snapshot(model) if views is not None else None
        targets: set[int] = set()
        asleep = self.sleep[sid]
        done: list[Any] = []  # the events applied here so far (sleep sets)
        acts: list[Hashable | None] = []  # with actor: those of done, read when needed
        same: set[Any] = set()  # events that would do what one applied here did
        listed, filtered = self.listed(model, sid)
        cut = False
        current: M | None = model
        for event in listed:
            if filtered and views is not None and not views.applies(sid, event):
                continue
            if asleep is not None and event in asleep:
                self.pruned += 1
                continue
            if event in same:
                self.spared += 1
                done.append(event)  # explored as far as sleep sets go: it did the same
                continue
            done.append(event)
            # A state of many events can take seconds: stop within it. It stays open
            # (not fully expanded); what it reached so far was checked.
            if deadline is not None and len(done) & 15 == 0 and time.perf_counter() > deadline:
                open_[sid] = 1
                cut = True
                break
            if current is None:
                if pristine is not None and fork is not None:
                    current = fork(pristine)
                if current is None:
                    current = self.revisit(sid)
            self.generated += 1
            try:
                apply(current, event)
            except Exception as exc:
                text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                self.record(NO_EXCEPTION, sid, event, text)
                current = None
                continue
            self.observe(current, sid, event)
            if alike is not None:
                same.update(alike(current, event))
            if views is not None:
                keep, current = self.by_views(current, sid, event, here)
                if not keep:  # every view of it was found
                    continue
                assert current is not None
            key = snapshot(current)
            target = ids.get(key)
            if target is None:
                target = self.found(key, current, sid, event, asleep, done, acts, kept)
                if target is None:  # no room left: the state stays open
                    current = None
                    continue
            targets.add(target)
            if views is None and target != sid and (ways_out is None or ways_out(event)):
                out_src.append(sid)
                out_dst.append(target)
            if target != sid:
                current = None  # it stands for another state now: replay for the next
        self.edges += len(targets)
        return cut

    def found(  # noqa: PLR0917
        self,
        key: Hashable,
        model: M,
        sid: int,
        event: Any,
        asleep: frozenset[Any] | None,
        done: list[Any],
        acts: list[Hashable | None],
        kept: dict[int, M],
    ) -> int | None:
        """A new state ``key``, reached from ``sid`` by ``event`` (the last of ``done``): its
        number, or ``None`` when ``max_states`` leaves no room (``sid`` then stays open)."""
        if self.max_states is not None and len(self.via) >= self.max_states:
            self.open[sid] = 1
            self.stopped.setdefault(MAX_STATES, None)
            return None
        sleep = None
        if self.actor is not None:
            sleep = self.asleep_by_actor(asleep, done, acts)
        elif self.independent is not None:
            sleep = self.asleep(asleep, done[:-1], event)
        target = self.add(key, model, sid, event, self.depth[sid] + 1, sleep=sleep)
        if self.fork is not None and len(kept) < self.keep_models:
            kept[target] = model  # expanded from this model, not replayed
        return target

    def traps(self, start: float) -> None:
        """``no trap``, judged on the graph found (the collector still paused: its first full
        pass over what the search keeps would take seconds past a time budget)."""
        via, open_, out_src, out_dst = self.via, self.open, self.out_src, self.out_dst
        independent, ways_out = self.independent, self.ways_out
        views = self.views
        if self.goal is not None:
            if views is not None:  # on the graph of views: a trap is a view's, found by a state
                good = _able(len(views.ids), views.goals, views.open_views(open_), *views.edges)
                trap = views.first[good.find(0)] if 0 in good else None
            else:
                good = _able(len(via), self.goals, open_, out_src, out_dst)
                if independent is not None:
                    good = self.expand_traps(good)
                trap = good.find(0) if 0 in good else None
            if trap is not None:
                self.record(
                    NO_TRAP,
                    trap,
                    None,
                    "no sequence of events"
                    + ("" if ways_out is None else f" ({_description(ways_out, 'ways out only')})")
                    + " leads from this state to a goal state"
                    + (f" ({_description(self.goal, '')})" if _docstring(self.goal) else ""),
                )
            self.wall = time.perf_counter() - start  # the trap search included

    def asleep(
        self, here: frozenset[Any] | None, done: list[Any], event: Any
    ) -> frozenset[Any] | None:
        """The sleep set of a state first reached by ``event``: the events already explored
        (from here, or asleep here) that commute with it, so their interleaving is found anyway.
        """
        independent = self.independent
        assert independent is not None
        kept = [x for x in done if independent(x, event)]
        if here:
            kept += [x for x in here if independent(x, event)]
        if not kept:
            return None
        found = frozenset(kept)
        return self.sleep_sets.setdefault(found, found)

    def asleep_by_actor(
        self, here: frozenset[Any] | None, done: list[Any], acts: list[Hashable | None]
    ) -> frozenset[Any] | None:
        """:meth:`asleep` for the event ``done[-1]`` when independence is by ``actor``: the
        same set, from the actors each event done was listed with (no call per event)."""
        actor = self.actor
        assert actor is not None
        acts.extend(map(actor, done[len(acts) :]))
        this = acts[-1]
        if this is None:
            return None  # independent of nothing
        # done[-1] is the event itself: its own actor leaves it out.
        kept = [x for x, a in zip(done, acts, strict=True) if a is not None and a != this]
        if here:
            acting = self.acting.get(here)
            if acting is None:
                acting = self.acting[here] = tuple((x, actor(x)) for x in here)
            kept += [x for x, a in acting if a is not None and a != this]
        if not kept:
            return None
        found = frozenset(kept)
        return self.sleep_sets.setdefault(found, found)

    def expand_traps(self, good: bytearray) -> bytearray:
        """Apply the spared events of every state that cannot reach a goal, until none is left.

        The reduced graph lacks the edges the sleep sets spared; a state that reaches a goal in
        it reaches one in the full graph. The others get all their edges back (a target not
        found counts as open), and reachability is recomputed, until every state still unable
        to reach a goal has all its edges: those are exactly the traps of the full graph.
        """
        n = len(self.via)
        full = bytearray(n)
        ways_out = self.ways_out
        while True:
            todo = [s for s in range(n) if not good[s] and not full[s] and self.sleep[s]]
            if not todo:
                return good
            for k, sid in enumerate(todo):
                if self.deadline is not None and time.perf_counter() > self.deadline:
                    # Out of time: the states not given all their edges back count as able to
                    # reach a goal (as a bound's open states do), so no trap is claimed that the
                    # spared edges might have left; the search says it was cut short.
                    self.stopped.setdefault(MAX_SECONDS, None)
                    for rest in todo[k:]:
                        self.open[rest] = 1
                    return _able(n, self.goals, self.open, self.out_src, self.out_dst)
                full[sid] = 1
                asleep = self.sleep[sid]
                assert asleep is not None
                model: M | None = None
                for event in list(self.events(self.revisit(sid))):
                    if event not in asleep or (ways_out is not None and not ways_out(event)):
                        continue
                    if model is None:
                        model = self.revisit(sid)
                    self.reexpanded += 1
                    try:
                        self.apply(model, event)
                    except Exception:  # recorded where it was first applied
                        model = None
                        continue
                    target = self.ids.get(self.snapshot(model))
                    if target is None:
                        self.open[sid] = 1  # not found: count it as able to reach a goal
                    elif target != sid:
                        self.out_src.append(sid)
                        self.out_dst.append(target)
                        model = None
            good = _able(n, self.goals, self.open, self.out_src, self.out_dst)

    # -- the report ----------------------------------------------------------------------------

    def report(
        self,
        *,
        title: str,
        bounds: dict[str, Any],
        describe: Callable[[M], str] | None,
        label: Callable[[E], str],
        data: Callable[[E], Any] | None,
        annotate: Callable[[M], Mapping[str, Any]] | None,
    ) -> CheckReport:
        def show(model: M) -> str:
            return describe(model) if describe is not None else repr(self.snapshot(model))

        def result(name: str, description: str) -> PropertyResult:
            found = self.first.get(name)
            if found is None:
                return PropertyResult(name=name, description=description, passed=True)
            source, last, message = found
            return PropertyResult(
                name=name,
                description=description,
                passed=False,
                message=message,
                counterexample=self.trace(
                    source=source, last=last, show=show, label=label, data=data, annotate=annotate
                ),
            )

        results = [
            result(NO_EXCEPTION, _docstring(self.apply) or "no exception escapes from an event")
        ]
        results += [result(name, _description(check, name)) for name, check in self.checks]
        if self.views is not None:
            results.append(
                result(
                    ACTORS_APART,
                    "an actor's event changes no other actor's view (what the search by views "
                    "assumes)",
                )
            )
        if self.goal is not None:
            goal = _description(self.goal, "")
            results.append(
                result(
                    NO_TRAP,
                    "from every reachable state a goal state is still reachable"
                    + (f" ({goal})" if _docstring(self.goal) else ""),
                )
            )
        if self.machine is not None:
            results += self.coverage_results()
        table, reached = self.coverage_table()
        return CheckReport(
            title=title,
            bounds=bounds,
            states_generated=self.generated,
            distinct_states=len(self.via),
            edges=self.edges if self.views is None else len(self.views.src),
            max_depth=max(self.depth),
            finished=not self.stopped,
            stopped_by=tuple(self.stopped),
            complete_depth=self.complete_depth(),
            pruned=self.pruned,
            reexpanded=self.reexpanded,
            alike=self.spared,
            views=0 if self.views is None else len(self.views.ids),
            other_actors=0 if self.views is None else self.views.skipped,
            wall_time=self.wall,
            properties=tuple(results),
            coverage=table,
            states_reached=reached,
        )

    def coverage_table(self) -> tuple[tuple[TransitionCoverage, ...], tuple[str, ...]]:
        """Each transition fired, with how often and whether declared, and the states reached:
        declared ones in declaration order, then the others, sorted (none without a machine)."""
        if self.machine is None:
            return (), ()
        declared = set(self.declared)
        table = tuple(
            TransitionCoverage(source=t[0], event=t[1], dest=t[2], count=n, declared=t in declared)
            for t, n in self.coverage.items()
        )
        reached = tuple(s for s in self.declared_states if s in self.seen_states)
        reached += tuple(sorted(self.seen_states - set(self.declared_states)))
        return table, reached

    def complete_depth(self) -> int:
        """Every event sequence of up to this many events was explored and checked."""
        deepest = max(self.depth)
        if not self.stopped:
            return deepest
        # A state left open (not fully expanded) at depth d: sequences of d + 1 events are not
        # all explored. States are numbered breadth-first, so the first open one is shallowest.
        first = self.open.find(1)
        return int(self.depth[first]) if first >= 0 else deepest

    def coverage_results(self) -> list[PropertyResult]:
        """``states reached`` and ``transitions fired``, judged only on a finished search."""
        expected = self.expected
        required = [t for t in self.declared if expected is None or expected(t)]
        needed_states = {str(getattr(self.machine, "initial", ""))} | {
            s for t in required for s in (t[0], t[2])
        }
        missing = [s for s in self.declared_states if s not in self.seen_states]
        failing_states = [s for s in missing if expected is None or s in needed_states]
        unreachable_states = [s for s in missing if s not in failing_states]
        required_set, declared = set(required), set(self.declared)
        never = [t for t in self.declared if not self.coverage[t]]
        problems = [f"never fired: {_arrow(t)}" for t in never if t in required_set]
        problems += [
            f"fired but not declared: {_arrow(t)}" for t in self.coverage if t not in declared
        ]
        unreachable = [_arrow(t) for t in never if t not in required_set]
        judged = not self.stopped
        out = []
        for name, description, failing, notes, what in (
            (
                STATES_REACHED,
                "every declared state is entered",
                ["never entered: " + ", ".join(failing_states)] if failing_states else [],
                unreachable_states,
                "never entered",
            ),
            (
                TRANSITIONS_FIRED,
                "every declared transition fires, and no undeclared one",
                problems,
                unreachable,
                "never fired",
            ),
        ):
            note = (
                f"{what}, not reachable in this configuration: " + ", ".join(notes) if notes else ""
            )
            if not judged:
                shown_ = "; ".join([*failing, note] if note else failing)
                out.append(
                    PropertyResult(
                        name=name,
                        description=description,
                        passed=True,
                        judged=False,
                        message="not judged: the search was cut short"
                        + (f" ({shown_})" if shown_ else ""),
                    )
                )
                continue
            out.append(
                PropertyResult(
                    name=name,
                    description=description,
                    passed=not failing,
                    message="; ".join([*failing, note] if note else failing),
                )
            )
        return out

    def trace(
        self,
        *,
        source: int,
        last: Any,
        show: Callable[[M], str],
        label: Callable[[E], str],
        data: Callable[[E], Any] | None,
        annotate: Callable[[M], Mapping[str, Any]] | None,
    ) -> Counterexample:
        """Replay the path to ``source`` (then ``last``), describing the state after each event."""
        path = self.path(source) if source >= 0 else []
        if last is not None:
            path.append(last)
        model = self.initial()
        initial_text = show(model)
        steps: list[TraceStep] = []
        for number, event in enumerate(path, 1):
            try:
                self.apply(model, event)
                after = show(model)
            except Exception as exc:
                after = f"raised {type(exc).__name__}: {exc}"
            steps.append(
                TraceStep(
                    number=number,
                    event=label(event),
                    data=_jsonable(data(event) if data is not None else label(event)),
                    state=after,
                )
            )
        return Counterexample(
            initial=initial_text,
            steps=tuple(steps),
            extra=dict(annotate(model)) if annotate is not None else {},
        )


def _different_actors(actor: Callable[[Any], Hashable | None], a: Any, b: Any) -> bool:
    """Independence by actor: both events have one, and not the same."""
    first, second = actor(a), actor(b)
    return first is not None and second is not None and first != second


def _arrow(t: Triple) -> str:
    return f"{t[0]} --{t[1]}--> {t[2]}"


def _able(
    n: int, goals: bytearray, open_: bytearray, src: array[int], dst: array[int]
) -> bytearray:
    """1 for each state from which a goal state or an open state is reachable, else 0.

    Backward breadth-first search over the reversed edges, stored compactly (CSR). The first
    0 is the first (so shallowest) trap.
    """
    start = [0] * (n + 1)
    for d in dst:
        start[d + 1] += 1
    for i in range(n):
        start[i + 1] += start[i]
    fill = start[:]
    preds = array("i", bytes(4 * len(src)))
    for s, d in zip(src, dst, strict=True):
        preds[fill[d]] = s
        fill[d] += 1
    good = bytearray(n)
    todo: deque[int] = deque()
    for i in range(n):
        if goals[i] or open_[i]:
            good[i] = 1
            todo.append(i)
    while todo:
        d = todo.popleft()
        for k in range(start[d], start[d + 1]):
            s = preds[k]
            if not good[s]:
                good[s] = 1
                todo.append(s)
    return good

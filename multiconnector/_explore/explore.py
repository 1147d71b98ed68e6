"""``explore()``: the public entry point, its arguments checked, the search run and reported."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Final, TypeVar

from .._validate import check_bool, shown
from ..errors import InvalidArgumentError, InvalidValueError
from .progress import _Progress
from .report import (
    CheckReport,
    Triple,
)
from .search import _Search
from .views import View

__all__ = ["explore", "remaining_seconds"]

#: What is left of ``max_seconds`` for a search once its set-up spent it all: the search then
#: stops after the initial state (which is checked: the report says "complete to 0 events").
_LEAST_SECONDS: Final = 1e-6


def remaining_seconds(max_seconds: float | None, started: float) -> float | None:
    """What is left of ``max_seconds`` for the search, its set-up having begun at ``started``
    (``time.perf_counter()``); a bad ``max_seconds`` is passed on unchanged, for
    :func:`explore` to refuse."""
    if (
        max_seconds is None
        or type(max_seconds) not in (int, float)
        or not 0 < max_seconds < float("inf")
    ):
        return max_seconds
    return max(max_seconds - (time.perf_counter() - started), _LEAST_SECONDS)


M = TypeVar("M")
E = TypeVar("E")


def explore(
    initial: Callable[[], M],
    events: Callable[[M], Iterable[E]],
    apply: Callable[[M, E], object],
    snapshot: Callable[[M], Hashable],
    invariants: Mapping[str, Callable[[M], object]] | None = None,
    *,
    goal: Callable[[M], bool] | None = None,
    ways_out: Callable[[E], bool] | None = None,
    machine: Any = None,
    fired: Callable[[M], Iterable[Triple]] | None = None,
    reached: Callable[[M], Iterable[str]] | None = None,
    describe: Callable[[M], str] | None = None,
    label: Callable[[E], str] = repr,
    data: Callable[[E], Any] | None = None,
    annotate: Callable[[M], Mapping[str, Any]] | None = None,
    max_states: int | None = None,
    max_depth: int | None = None,
    progress: bool = False,
    bounds: Mapping[str, Any] | None = None,
    title: str = "model check",
    max_seconds: float | None = None,
    expected: Callable[[Triple], bool] | None = None,
    independent: Callable[[E, E], bool] | None = None,
    alike: Callable[[M, E], Iterable[E]] | None = None,
    fork: Callable[[M], M | None] | None = None,
    actor: Callable[[E], Hashable | None] | None = None,
    views: Callable[[M], Iterable[View]] | None = None,
    events_of: Callable[[M, frozenset[Any]], Iterable[E]] | None = None,
    keep_models: int | None = None,
) -> CheckReport:
    """Explore every state reachable from ``initial()`` breadth-first and check properties.

    * ``initial()`` makes a fresh model; ``events(model)`` lists the events enabled in it;
      ``apply(model, event)`` applies one, in place. Events must be deterministic: a state is
      revisited by replaying its path from a fresh model, and :class:`NondeterminismError` is
      raised if that gives another snapshot (the snapshot of a replayed model is taken before
      any event is applied to it, so a model may read its state lazily in ``snapshot``).
    * ``snapshot(model)`` is the model's canonical, hashable state. Equal snapshots are one
      state, so it must capture everything that affects later behaviour (and nothing that grows
      without bound, such as counters). Canonicalizing over symmetric parts (interchangeable
      ids, say) is allowed and shrinks the search.
    * ``invariants`` maps a property name to ``check(model)``, called after every applied
      event (and on the initial model). It returns ``None`` or ``True`` when the property
      holds, ``False`` or a message when it does not, or raises ``AssertionError``. The first
      line of the callable's docstring describes the property in the report.
    * Property ``"no exception"``: ``apply`` raising anything is a violation, and the search
      does not continue from that state. Catch the exceptions your model documents in
      ``apply``; the first line of its docstring, if any, describes the property.
    * ``goal(model)``, when given, adds property ``"no trap"``: from every explored state some
      goal state must be reachable, using only the events for which ``ways_out(event)`` is true
      (all events when it is ``None``). Computed on the explored graph by backward
      reachability; states a bound left unexpanded count as able to reach the goal.
    * ``machine`` (a ``transitions.Machine``) and ``fired(model)``, the (source, event, dest)
      transitions the last ``apply`` fired, add the structural properties ``"states
      reached"`` (every declared state was entered; ``reached(model)`` may name more states
      the model is in) and ``"transitions fired"`` (every declared transition fired, and no
      undeclared one did), with per-transition coverage in the report.
    * ``describe(model)`` (default: the snapshot's repr) and ``label(event)`` (default: repr)
      write counterexamples; ``data(event)`` gives the event as JSON data; ``annotate(model)``
      adds data about a counterexample's final model to it.
    * ``expected(triple)``, when given, says which declared transitions the configuration can
      fire: one that never fires fails ``"transitions fired"`` only when ``expected`` is true
      for it (the others are listed as unreachable), and a declared state fails ``"states
      reached"`` only when it is the initial state or an end of an expected transition.
      Coverage is judged only when the search finished; otherwise it is reported, not judged.
    * ``max_states``, ``max_depth`` and ``max_seconds`` (wall time) bound the search (``None``:
      unbounded); the report says which stopped it (:attr:`CheckReport.stopped_by`), up to which
      depth the search is complete (:attr:`CheckReport.complete_depth`), and its
      :attr:`CheckReport.verdict`. A search stopped by ``max_seconds`` stops cleanly: every
      state it found was checked.
    * ``independent(a, b)``, when given, turns on partial-order reduction with sleep sets: it
      must be true only for events that commute (applied in either order from any state where
      both are enabled, they lead to the same state, neither enables or disables the other,
      and each does to the properties' inputs what it does in the other order). An event
      already explored from a predecessor, independent of the event that led here, is not
      applied again: every state is still found at its breadth-first depth, so verdicts and
      counterexample lengths are unchanged (docs/check.md, "Reductions"). For ``"no trap"``,
      every state that cannot reach a goal in the reduced graph is expanded fully until
      none is left, so traps are those of the full graph.
    * ``actor(event)``, when given instead of ``independent``, says the same faster: two
      events are independent when both have an actor (not ``None``) and the actors differ
      (the request an event is about, say). The search then reads each event's actor once
      instead of calling ``independent`` for every pair it compares.
    * ``alike(model, event)``, when given, is called after ``event`` was applied to ``model``
      and names other events, enabled in the state it was applied in, that would have done
      exactly the same there (the same next state, the same verdicts): a choice the model
      never read, say. They are not applied from that state (:attr:`CheckReport.alike`). Return
      an empty iterable when unsure.
    * ``fork(model)``, when given, returns an independent copy of ``model`` that behaves
      exactly as the model replayed to the same state would (or ``None``: replay it). A state
      is then expanded from the model it was found with (up to ``keep_models`` kept at once,
      a quarter of a million by default; past it, replay), and a copy replaces the replay
      otherwise needed after each event that leaves it.
    * ``views(model)``, given with ``actor``, turns on the search by views
      (:mod:`multiconnector._explore.views`): it lists ``(actor, key, goal)`` for each actor of
      the model, ``key`` that actor's *view* (everything its future and verdicts depend on, the
      shared part included) and ``goal`` whether the view is a goal for that actor. A state is
      expanded only when one of its views is new, and then only with the events of those
      actors and the events of no actor. It replaces the sleep sets, and ``no trap`` is judged
      on the graph of views. Sound when actors interact only through the events of no actor
      and ``goal`` is every actor's goal reached; then verdicts and counterexample lengths are
      those of the whole search, at about the cost of one actor. ``events_of(model, actors)``,
      when given, lists only the events of those actors and of no actor, in ``events``' order
      (faster than listing every event and skipping the others').
    * ``progress=True`` shows the figures on stderr when the search runs longer than two seconds
      (with ``rich`` on a terminal when it is installed).

    Every counterexample is a shortest event sequence leading to its violation.

    .. versionadded:: 0.1.0
    """
    # What the search itself takes, checked with the rest first.
    searched: dict[str, Any] = {
        "initial": initial,
        "events": events,
        "apply": apply,
        "snapshot": snapshot,
        "goal": goal,
        "ways_out": ways_out,
        "machine": machine,
        "fired": fired,
        "reached": reached,
        "max_states": max_states,
        "max_depth": max_depth,
        "max_seconds": max_seconds,
        "expected": expected,
        "independent": independent,
        "alike": alike,
        "fork": fork,
        "actor": actor,
        "views": views,
        "events_of": events_of,
        "keep_models": keep_models,
    }
    checked = _checked(
        **searched,
        invariants=invariants,
        describe=describe,
        label=label,
        data=data,
        annotate=annotate,
        progress=progress,
    )
    search = _Search(**searched, invariants=checked)
    search.run(_Progress(progress))
    return search.report(
        title=title,
        bounds=dict(bounds or {"max states": max_states, "max depth": max_depth}),
        describe=describe,
        label=label,
        data=data,
        annotate=annotate,
    )


def _checked(
    *,
    initial: object,
    events: object,
    apply: object,
    snapshot: object,
    invariants: object,
    goal: object,
    ways_out: object,
    machine: object,
    fired: object,
    reached: object,
    describe: object,
    label: object,
    data: object,
    annotate: object,
    max_states: int | None,
    max_depth: int | None,
    progress: object,
    max_seconds: float | None,
    expected: object,
    independent: object,
    alike: object,
    fork: object,
    actor: object,
    views: object,
    events_of: object,
    keep_models: int | None,
) -> dict[str, Callable[[Any], object]]:
    """:func:`explore`'s arguments checked, in order (an :class:`InvalidArgumentError` names
    the first bad one); returns the invariants as a new dict (empty for ``None``)."""
    required: dict[str, object] = {
        "initial": initial,
        "events": events,
        "apply": apply,
        "snapshot": snapshot,
        "label": label,
    }
    optional: dict[str, object] = {
        "goal": goal,
        "ways_out": ways_out,
        "fired": fired,
        "reached": reached,
        "describe": describe,
        "data": data,
        "annotate": annotate,
    }
    for argument, fn in required.items():
        if not callable(fn):
            raise InvalidArgumentError(f"{argument}={shown(fn)} must be callable")
    for argument, fn in optional.items():
        if fn is not None and not callable(fn):
            raise InvalidArgumentError(f"{argument}={shown(fn)} must be callable or None")
    checked = _invariants(invariants)
    for argument, bound in (
        ("max_states", max_states),
        ("max_depth", max_depth),
        ("keep_models", keep_models),
    ):
        if bound is not None and (type(bound) is not int or bound < 1):
            error = InvalidValueError if type(bound) is int else InvalidArgumentError
            raise error(f"{argument}={shown(bound)} must be an int >= 1 or None")
    if max_seconds is not None and (
        type(max_seconds) not in (int, float) or not 0 < max_seconds < float("inf")
    ):
        error = InvalidValueError if type(max_seconds) in (int, float) else InvalidArgumentError
        raise error(f"max_seconds={shown(max_seconds)} must be a number > 0 or None")
    if expected is not None and not callable(expected):
        raise InvalidArgumentError(f"expected={shown(expected)} must be callable or None")
    if independent is not None and not callable(independent):
        raise InvalidArgumentError(f"independent={shown(independent)} must be callable or None")
    if actor is not None and not callable(actor):
        raise InvalidArgumentError(f"actor={shown(actor)} must be callable or None")
    if actor is not None and independent is not None:
        raise InvalidArgumentError("give independent or actor, not both")
    if views is not None and not callable(views):
        raise InvalidArgumentError(f"views={shown(views)} must be callable or None")
    if views is not None and actor is None:
        raise InvalidArgumentError("views needs actor: which actor each event is of")
    if events_of is not None and not callable(events_of):
        raise InvalidArgumentError(f"events_of={shown(events_of)} must be callable or None")
    if fork is not None and not callable(fork):
        raise InvalidArgumentError(f"fork={shown(fork)} must be callable or None")
    if alike is not None and not callable(alike):
        raise InvalidArgumentError(f"alike={shown(alike)} must be callable or None")
    check_bool(progress, "progress")
    if (machine is None) != (fired is None):
        raise InvalidArgumentError(
            f"machine={shown(machine)} and fired={shown(fired)} must be given together"
        )
    return checked


def _invariants(invariants: object) -> dict[str, Callable[[Any], object]]:
    """``invariants`` checked: ``None`` or a mapping of property names to callables; a copy."""
    if invariants is None:
        return {}
    if not isinstance(invariants, Mapping) or not all(
        isinstance(k, str) and callable(v) for k, v in invariants.items()
    ):
        raise InvalidArgumentError(
            f"invariants={shown(invariants)} must map property names (str) to callables"
        )
    return dict(invariants)

"""``explore()``: the public entry point, its arguments checked, the search run and reported."""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, Final, TypeVar

from .._validate import shown
from ..errors import InvalidArgumentError
from .config import SearchConfig
from .progress import _Progress
from .report import (
    CheckReport,
    Triple,
)
from .search import _Search

__all__ = ["SearchConfig", "explore", "remaining_seconds"]

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
    config: SearchConfig | None = None,
    goal: Callable[[M], bool] | None = None,
    ways_out: Callable[[E], bool] | None = None,
    machine: Any = None,
    fired: Callable[[M], Iterable[Triple]] | None = None,
    reached: Callable[[M], Iterable[str]] | None = None,
    expected: Callable[[Triple], bool] | None = None,
    describe: Callable[[M], str] | None = None,
    label: Callable[[E], str] = repr,
    data: Callable[[E], Any] | None = None,
    annotate: Callable[[M], Mapping[str, Any]] | None = None,
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
    * ``config``, a :class:`SearchConfig`: the bounds (``max_states``, ``max_depth``,
      ``max_seconds``), the reductions (``independent`` or ``actor``, ``alike``, ``fork``,
      ``views``), ``progress`` and the report's heading. Default: ``SearchConfig()``, an
      unbounded search with no reduction.
    * ``goal(model)``, when given, adds property ``"no trap"``: from every explored state some
      goal state must be reachable, using only the events for which ``ways_out(event)`` is true
      (all events when it is ``None``). Computed on the explored graph by backward
      reachability; states a bound left unexpanded count as able to reach the goal.
    * ``machine`` (a ``transitions.Machine``) and ``fired(model)``, the (source, event, dest)
      transitions the last ``apply`` fired, add the structural properties ``"states
      reached"`` (every declared state was entered; ``reached(model)`` may name more states
      the model is in) and ``"transitions fired"`` (every declared transition fired, and no
      undeclared one did), with per-transition coverage in the report. ``expected(triple)``,
      when given, says which declared transitions the configuration can fire: one that never
      fires fails ``"transitions fired"`` only when ``expected`` is true for it (the others
      are listed as unreachable), and a declared state fails ``"states reached"`` only when
      it is the initial state or an end of an expected transition. Coverage is judged only
      when the search finished; otherwise it is reported, not judged.
    * ``describe(model)`` (default: the snapshot's repr) and ``label(event)`` (default: repr)
      write counterexamples; ``data(event)`` gives the event as JSON data; ``annotate(model)``
      adds data about a counterexample's final model to it. Every counterexample is a
      shortest event sequence leading to its violation.

    .. versionadded:: 0.1.0
    """
    config = _config(config)
    model: dict[str, Any] = dict(initial=initial, events=events, apply=apply, snapshot=snapshot)
    model.update(goal=goal, ways_out=ways_out, machine=machine, fired=fired, reached=reached)
    model.update(expected=expected)
    shown_by: dict[str, Any] = dict(describe=describe, label=label, data=data, annotate=annotate)
    checked = _checked(model, shown_by, invariants)
    search = _Search(**model, invariants=checked, config=config)
    search.run(_Progress(config.progress))
    return search.report(title=config.title, bounds=config.shown_bounds(), **shown_by)


def _config(config: object) -> SearchConfig:
    if config is None:
        return _DEFAULT
    if not isinstance(config, SearchConfig):
        raise InvalidArgumentError(f"config={shown(config)} must be a SearchConfig or None")
    return config


#: The config of a search given none: unbounded, no reduction.
_DEFAULT: Final = SearchConfig()


def _checked(
    model: Mapping[str, object], shown_by: Mapping[str, object], invariants: object
) -> dict[str, Callable[[Any], object]]:
    """:func:`explore`'s arguments checked, in order (an :class:`InvalidArgumentError` names
    the first bad one); returns the invariants as a new dict (empty for ``None``)."""
    for argument in ("initial", "events", "apply", "snapshot", "label"):
        fn = model.get(argument, shown_by.get(argument))
        if not callable(fn):
            raise InvalidArgumentError(f"{argument}={shown(fn)} must be callable")
    for argument in ("goal", "ways_out", "fired", "reached", "describe", "data", "annotate"):
        fn = model.get(argument, shown_by.get(argument))
        if fn is not None and not callable(fn):
            raise InvalidArgumentError(f"{argument}={shown(fn)} must be callable or None")
    checked = _invariants(invariants)
    expected = model["expected"]
    if expected is not None and not callable(expected):
        raise InvalidArgumentError(f"expected={shown(expected)} must be callable or None")
    machine, fired = model["machine"], model["fired"]
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

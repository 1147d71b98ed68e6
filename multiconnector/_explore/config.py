"""How a search runs: :class:`SearchConfig`, its bounds and switches, checked once."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any, final

import attrs

from .._validate import check_bool, shown
from ..errors import InvalidArgumentError, InvalidValueError
from .views import View

__all__ = ["SearchConfig"]


def _check_bound(value: Any, argument: str) -> None:
    if value is not None and (type(value) is not int or value < 1):
        error = InvalidValueError if type(value) is int else InvalidArgumentError
        raise error(f"{argument}={shown(value)} must be an int >= 1 or None")


def _check_seconds(value: Any) -> None:
    if value is not None and (type(value) not in (int, float) or not 0 < value < float("inf")):
        error = InvalidValueError if type(value) in (int, float) else InvalidArgumentError
        raise error(f"max_seconds={shown(value)} must be a number > 0 or None")


def _check_callable(value: Any, argument: str) -> None:
    if value is not None and not callable(value):
        raise InvalidArgumentError(f"{argument}={shown(value)} must be callable or None")


def _shown_bounds(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise InvalidArgumentError(f"bounds={shown(value)} must map str to values, or be None")
    return dict(value)


@final
@attrs.frozen(kw_only=True, eq=False)
class SearchConfig:
    """How :func:`~multiconnector.check.explore` searches: its bounds, its reductions and its
    report's heading. Every field is checked when the config is made: a value of the wrong type
    raises :class:`~multiconnector.errors.InvalidArgumentError`, an out-of-range one
    :class:`~multiconnector.errors.InvalidValueError`, each naming the field.

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
    * ``title`` heads the report, and ``bounds`` is what it shows as the bounds (default: the
      ``max states`` and ``max depth``).

    .. versionadded:: 0.1.0
    """

    max_states: int | None = None
    max_depth: int | None = None
    max_seconds: float | None = None
    independent: Callable[[Any, Any], bool] | None = None
    actor: Callable[[Any], Hashable | None] | None = None
    alike: Callable[[Any, Any], Iterable[Any]] | None = None
    fork: Callable[[Any], Any] | None = None
    keep_models: int | None = None
    views: Callable[[Any], Iterable[View]] | None = None
    events_of: Callable[[Any, frozenset[Any]], Iterable[Any]] | None = None
    progress: bool = False
    title: str = "model check"
    bounds: dict[str, Any] | None = attrs.field(default=None, converter=_shown_bounds)

    def __attrs_post_init__(self) -> None:
        _check_bound(self.max_states, "max_states")
        _check_bound(self.max_depth, "max_depth")
        _check_bound(self.keep_models, "keep_models")
        _check_seconds(self.max_seconds)
        for argument in ("independent", "actor", "views", "events_of", "fork", "alike"):
            _check_callable(getattr(self, argument), argument)
        if self.actor is not None and self.independent is not None:
            raise InvalidArgumentError("give independent or actor, not both")
        if self.views is not None and self.actor is None:
            raise InvalidArgumentError("views needs actor: which actor each event is of")
        check_bool(self.progress, "progress")
        if type(self.title) is not str:
            raise InvalidArgumentError(f"title={shown(self.title)} must be a str")

    def shown_bounds(self) -> dict[str, Any]:
        """The bounds the report shows: ``bounds``, or the ``max states`` and ``max depth``."""
        if self.bounds is not None:
            return dict(self.bounds)
        return {"max states": self.max_states, "max depth": self.max_depth}

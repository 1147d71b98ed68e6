"""What a search reports: figures, verdict, one result per property, counterexamples, coverage."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, final

import attrs

from ..errors import UnknownPropertyError

__all__ = [
    "CheckReport",
    "Counterexample",
    "PropertyResult",
    "TraceStep",
    "TransitionCoverage",
    "UnknownPropertyError",
]


#: Verdicts of a :class:`CheckReport` (:attr:`CheckReport.verdict`).
PASS: Final = "PASS"
FAIL: Final = "FAIL"
INCONCLUSIVE: Final = "INCONCLUSIVE"
#: Names of the bounds that can stop a search (:attr:`CheckReport.stopped_by`).
MAX_STATES: Final = "max states"
MAX_DEPTH: Final = "max depth"
MAX_SECONDS: Final = "max seconds"
#: The properties about coverage rather than behaviour.
COVERAGE: Final = frozenset({"states reached", "transitions fired"})

#: A declared or fired transition: (source state, event, destination state).
Triple = tuple[str, str, str]

NO_EXCEPTION: Final = "no exception"
NO_TRAP: Final = "no trap"
#: With ``explore(views=...)``: an actor's event changed no other actor's view.
ACTORS_APART: Final = "actors apart"
STATES_REACHED: Final = "states reached"
TRANSITIONS_FIRED: Final = "transitions fired"

#: The exit status of ``multiconnector check`` for each verdict (2 is for bad arguments).
EXIT_STATUS: Final[Mapping[str, int]] = {PASS: 0, FAIL: 1, INCONCLUSIVE: 3}

#: Seconds before a progress display appears.
PROGRESS_AFTER: Final = 2.0


@final
@attrs.frozen(kw_only=True)
class TraceStep:
    """One step of a counterexample: the event, and the state it led to.

    .. versionadded:: 0.1.0
    """

    number: int
    event: str
    #: The event as data (lists and strings), for tools that redraw the trace.
    data: Any
    state: str


@final
@attrs.frozen(kw_only=True)
class Counterexample:
    """A shortest event sequence from the initial state to a violation.

    .. versionadded:: 0.1.0
    """

    initial: str
    steps: tuple[TraceStep, ...]
    #: Extra data about the final model (the aggregator gives each request's path).
    extra: Mapping[str, Any] = attrs.field(factory=dict)

    def __len__(self) -> int:
        return len(self.steps)


@final
@attrs.frozen(kw_only=True)
class PropertyResult:
    """Whether one property held on every explored transition.

    .. versionadded:: 0.1.0
    """

    name: str
    description: str
    passed: bool
    message: str = ""
    counterexample: Counterexample | None = None
    #: ``False`` when the property was not judged (coverage of a search a bound cut short):
    #: ``passed`` is then ``True`` and ``message`` says why; the report shows ``SKIP``.
    judged: bool = True

    @property
    def status(self) -> str:
        """``"PASS"``, ``"FAIL"`` or ``"SKIP"`` (not judged)."""
        if not self.judged:
            return "SKIP"
        return PASS if self.passed else FAIL


@final
@attrs.frozen(kw_only=True)
class TransitionCoverage:
    """How often a declared (or undeclared) transition fired during the search.

    .. versionadded:: 0.1.0
    """

    source: str
    event: str
    dest: str
    count: int
    declared: bool


@final
@attrs.frozen(kw_only=True)
class CheckReport:
    """What :func:`explore` found: figures, one result per property, coverage.

    ``states_generated`` counts every event applied to an expanded state (TLC's "states
    generated"); ``distinct_states`` the states found (their rates: :attr:`generated_per_second`
    and :attr:`distinct_per_second`); ``edges`` the distinct (state, next state)
    pairs (by views: the (view, next view) edges of the ways out, what ``no trap`` walks).
    ``finished`` is true when the search ran out of states to expand, not out of bounds.
    ``stopped_by`` names the bounds that cut it short (:data:`MAX_STATES`, :data:`MAX_DEPTH`,
    :data:`MAX_SECONDS`); ``complete_depth`` is the largest ``n`` such that every event sequence
    of up to ``n`` events was explored and checked (``max_depth`` when the search finished).

    .. versionadded:: 0.1.0
    .. versionchanged:: 0.1.0
       ``stopped_by``, ``complete_depth`` and :attr:`verdict`.
    """

    title: str
    bounds: Mapping[str, Any]
    states_generated: int
    distinct_states: int
    edges: int
    max_depth: int
    finished: bool
    wall_time: float
    properties: tuple[PropertyResult, ...]
    coverage: tuple[TransitionCoverage, ...] = ()
    states_reached: tuple[str, ...] = ()
    stopped_by: tuple[str, ...] = ()
    complete_depth: int = 0
    #: Transitions partial-order reduction spared (not applied), and those applied again to
    #: search for traps.
    pruned: int = 0
    reexpanded: int = 0
    #: Events not applied because an event applied from the same state did the same
    #: (``explore``'s ``alike``).
    alike: int = 0
    #: With ``explore(views=...)``: the distinct views found (``distinct_states`` are then the
    #: states kept, each for a new view), and the events listed but not applied because they
    #: were another actor's (none when ``events_of`` lists only the actors wanted; see
    #: :mod:`multiconnector._explore.views`); 0 otherwise.
    views: int = 0
    other_actors: int = 0

    @property
    def ok(self) -> bool:
        """Every property passed (a property not judged counts as passed)."""
        return all(p.passed for p in self.properties)

    @property
    def verdict(self) -> str:
        """``"FAIL"``, ``"INCONCLUSIVE"`` or ``"PASS"``.

        ``FAIL`` when a property failed: a counterexample is definite even in a search cut
        short. Otherwise ``INCONCLUSIVE`` when ``max states`` or ``max seconds`` cut the search
        short; a ``max depth`` bound is one the caller chose, so a search that explored every
        state within it passes (bounded). Otherwise ``PASS``.
        """
        if not self.ok:
            return FAIL
        if set(self.stopped_by) - {MAX_DEPTH}:
            return INCONCLUSIVE
        return PASS

    def explored(self) -> str:
        """One line: what the search explored, and what it did not."""
        if self.finished:
            return f"complete: every reachable state was explored (max depth {self.max_depth})"
        stops = " and ".join(self.stopped_by) or "a bound"
        if self.stopped_by == (MAX_DEPTH,):
            return (
                f"bounded by {stops}: every event sequence of up to "
                f"{_events(self.complete_depth)} was explored; longer ones were not"
            )
        return (
            f"NOT complete ({stops} hit): every event sequence of up to "
            f"{_events(self.complete_depth)} was explored; some of {self.complete_depth + 1} or "
            "more were not"
        )

    @property
    def distinct_per_second(self) -> float:
        """Distinct states found per second of wall time: what grows with the problem."""
        return self.distinct_states / self.wall_time if self.wall_time > 0 else 0.0

    @property
    def generated_per_second(self) -> float:
        """States generated (events applied) per second of wall time."""
        return self.states_generated / self.wall_time if self.wall_time > 0 else 0.0

    @property
    def failures(self) -> tuple[PropertyResult, ...]:
        return tuple(p for p in self.properties if not p.passed)

    def result(self, name: str) -> PropertyResult:
        """The result of the property called ``name``; :class:`UnknownPropertyError` (a
        ``KeyError``) if there is none."""
        for p in self.properties:
            if p.name == name:
                return p
        known = ", ".join(repr(p.name) for p in self.properties)
        raise UnknownPropertyError(f"no property {name!r} in this report; it has {known}")

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-ready data (what ``--json`` writes).

        ``ok`` is true only for a ``PASS`` (what CI reads; :attr:`ok` counts a search cut short
        as passed when nothing failed), ``verdict`` is :attr:`verdict`, and the bounds are
        numbers, ``null`` for a bound not set.
        """

        def trace(c: Counterexample | None) -> dict[str, Any] | None:
            if c is None:
                return None
            return {
                "length": len(c),
                "initial": c.initial,
                "steps": [
                    {"n": s.number, "event": s.event, "data": s.data, "state": s.state}
                    for s in c.steps
                ],
                **{k: _jsonable(v) for k, v in c.extra.items()},
            }

        return {
            "title": self.title,
            "ok": self.verdict == PASS,
            "bounds": _jsonable(dict(self.bounds)),
            "states_generated": self.states_generated,
            "distinct_states": self.distinct_states,
            "edges": self.edges,
            "max_depth": self.max_depth,
            "finished": self.finished,
            "stopped_by": list(self.stopped_by),
            "complete_depth": self.complete_depth,
            "pruned": self.pruned,
            "reexpanded": self.reexpanded,
            "alike": self.alike,
            "views": self.views,
            "other_actors": self.other_actors,
            "verdict": self.verdict,
            "wall_time": round(self.wall_time, 4),
            "distinct_per_second": round(self.distinct_per_second, 1),
            "generated_per_second": round(self.generated_per_second, 1),
            "properties": [
                {
                    "name": p.name,
                    "description": p.description,
                    "result": p.status,
                    "message": p.message,
                    "counterexample": trace(p.counterexample),
                }
                for p in self.properties
            ],
            "coverage": [
                {
                    "source": c.source,
                    "event": c.event,
                    "dest": c.dest,
                    "count": c.count,
                    "declared": c.declared,
                }
                for c in self.coverage
            ],
            "states_reached": list(self.states_reached),
        }

    def to_text(self) -> str:
        """The report as the command prints it."""
        out = [self.title]
        out.append("bounds: " + "; ".join(f"{k} {_shown_bound(v)}" for k, v in self.bounds.items()))
        out.append(
            f"explored: {self.states_generated:,} states generated, {self.distinct_states:,} "
            f"distinct, {self.edges:,} edges, max depth {self.max_depth}"
        )
        out.append(f"search: {self.explored()}")
        if self.views:
            out.append(
                f"by views: {self.views:,} distinct views (one actor's part of a state each), "
                f"{self.distinct_states:,} states kept for a new view"
                + (
                    f", {self.other_actors:,} events of another actor not applied"
                    if self.other_actors
                    else ""
                )
            )
        if self.pruned:
            out.append(
                f"reduction: {self.pruned:,} transitions spared by sleep sets"
                + (f" ({self.reexpanded:,} applied again for no trap)" if self.reexpanded else "")
            )
        if self.alike:
            out.append(
                f"reduction: {self.alike:,} events spared as alike (one applied did the same)"
            )
        out.append(
            f"time: {self.wall_time:.2f} s, {self.distinct_per_second:,.0f} distinct states/s "
            f"({self.generated_per_second:,.0f} states generated/s)"
        )
        out.append("properties:")
        for p in self.properties:
            out.append(f"  {p.status}  {p.name}: {p.description}")
            if p.passed:
                if p.message:
                    out.append(f"        {p.message}")
                continue
            out.append(f"        {p.message}")
            trace = p.counterexample
            if trace is not None:
                out.append(f"        shortest trace ({len(trace)} events), from: {trace.initial}")
                width = max((len(s.event) for s in trace.steps), default=0)
                for s in trace.steps:
                    out.append(f"        {s.number:>3}. {s.event:<{width}}  -> {s.state}")
        if self.coverage:
            out.append("transitions (source --event--> dest: times fired):")
            width = max(len(f"{c.source} --{c.event}--> {c.dest}") for c in self.coverage)
            for c in self.coverage:
                arrow = f"{c.source} --{c.event}--> {c.dest}"
                note = "" if c.declared else "  (NOT DECLARED)"
                out.append(f"  {arrow:<{width}}  {c.count:>9,}{note}")
        if self.states_reached:
            out.append("states reached: " + ", ".join(self.states_reached))
        failed = len(self.failures)
        verdict = self.verdict
        if verdict == FAIL:
            verdict += f" ({failed} {'property' if failed == 1 else 'properties'})"
        elif verdict == INCONCLUSIVE:
            verdict += f" (no violation within {_events(self.complete_depth)}; the rest unexplored)"
        elif not self.finished:
            verdict += f" (bounded: every sequence of up to {_events(self.complete_depth)})"
        out.append("result: " + verdict)
        return "\n".join(out)


def _events(n: int) -> str:
    return f"{n} event" if n == 1 else f"{n} events"


def _shown_bound(value: Any) -> str:
    if value is None:  # a bound not set
        return "unbounded"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)

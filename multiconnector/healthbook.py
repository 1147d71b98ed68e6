"""Every child's health, for one composition: :class:`HealthBook`.

The book keeps one :class:`~multiconnector.health.ChildHealth` per child and moves it by the
one declaration (:data:`~multiconnector.health.HEALTH_TABLE`): :meth:`HealthBook.failed` (a
failure of the child), :meth:`HealthBook.answered` (it answered a lookup: a probe when it is
half-open, a call in the window when it is closed under ``failure_rate``) and
:meth:`HealthBook.tick` (the clock moved: cooldowns end). Times must not go backwards (the
default clock is monotonic): each window is pruned from its oldest end. Hot paths read
:attr:`HealthBook.bypassed` and :attr:`HealthBook.probing`, frozensets swapped on each
transition (a membership test, no lock). The clock is injected: the book never sleeps, and
tests drive it by hand.

Each transition is logged, one line, on the ``multiconnector`` logger (in vLLM's format
inside vLLM), at WARNING when a child opens, at INFO otherwise.

.. versionadded:: 0.1.0
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Final, final

import attrs

from .health import ChildHealth, Health, health_step
from .rule import DEFAULT_FAILURE_KINDS, failure_counts, may_look_up, next_cooldown

__all__ = ["HealthBook", "HealthSettings", "health_book"]

logger: Final = logging.getLogger("multiconnector")

_OPEN: Final = Health.open
_HALF_OPEN: Final = Health.half_open
_CLOSED: Final = Health.closed


@final
@attrs.frozen(kw_only=True)
class HealthSettings:
    """The bounds of every child's health machine in one composition (the vLLM adapter reads
    them from ``kv_connector_extra_config['health']``).

    .. versionadded:: 0.1.0
    """

    #: Failures within ``window_seconds`` that open a closed child (the count rule; read only
    #: when ``failure_rate`` is ``None``).
    threshold: int = 5
    #: The share of its calls within ``window_seconds`` (failures and lookups answered in
    #: time) that, failed, opens a closed child, ``0 < failure_rate <= 1`` (the rate rule;
    #: ``None``: off, the count rule instead).
    failure_rate: float | None = None
    #: Under ``failure_rate``, the fewest calls within the window a child is judged on.
    min_calls: int = 10
    window_seconds: float = 60.0
    #: How long a child stays open the first time.
    cooldown_seconds: float = 10.0
    #: The longest cooldown, however many probes failed.
    max_cooldown_seconds: float = 300.0
    #: Successes in a row that close a half-open child.
    probes: int = 3
    #: A lookup slower than this is a failure (``None``: off).
    slow_lookup_seconds: float | None = None
    #: The kinds of failure counted (:data:`~multiconnector.rule.FAILURE_KINDS`): by default
    #: those of what the breaker gates, lookups and loads.
    count: frozenset[str] = attrs.field(default=DEFAULT_FAILURE_KINDS, converter=frozenset)


@final
class HealthBook:
    """Each child's health, by name; thread-safe (one lock; reads of the gates take none).

    .. versionadded:: 0.1.0
    """

    __slots__ = (
        "_lock",
        "_records",
        "_unreported",
        "bypassed",
        "clock",
        "probing",
        "rated",
        "settings",
    )

    def __init__(
        self,
        names: Iterable[str],
        settings: HealthSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        #: Where the book reads the time when a call gives none (tests give their own).
        self.clock = clock
        self._lock = threading.Lock()
        self._records = {
            name: ChildHealth(
                name=name,
                threshold=settings.threshold,
                failure_rate=settings.failure_rate,
                min_calls=settings.min_calls,
                probes=settings.probes,
            )
            for name in names
        }
        #: Whether the rate rule is on: a closed child's lookups answered in time are told
        #: (:meth:`answered`) and kept in its window; otherwise only the half-open ones' are.
        self.rated: bool = settings.failure_rate is not None
        #: The transitions since :meth:`take_unreported` last ran, per child (for the stats).
        self._unreported: dict[str, dict[str, int]] = {}
        #: The children not asked to look up (:func:`~multiconnector.rule.may_look_up`).
        self.bypassed: frozenset[str] = frozenset()
        #: The half-open children: each lookup they answer is a probe.
        self.probing: frozenset[str] = frozenset()

    def failed(
        self, name: str, now: float | None = None, *, hook: str | None = None
    ) -> Health | None:
        """Child ``name`` failed (in ``hook``: counted only when its kind is one the settings'
        ``count`` names, :func:`~multiconnector.rule.failure_counts`; ``None``: always); its
        state afterwards (``None``: no such child, ignored)."""
        record = self._records.get(name)
        if record is None:
            return None
        if not failure_counts(hook, self.settings.count):
            return record.state
        when = self.clock() if now is None else now
        with self._lock:
            if record.state is _CLOSED:
                cutoff = when - self.settings.window_seconds
                _prune(record.failures, cutoff)
                record.failures.append(when)
                if self.rated:
                    _prune(record.answers, cutoff)
            self._fire(record, "failure", when)
            return record.state

    def answered(self, name: str, now: float | None = None) -> Health | None:
        """Child ``name`` answered a lookup in time: a probe's success when it is half-open
        (the only state in which this moves it); under ``failure_rate``, a call in a closed
        child's window (the adapter tells a closed child's answers only then: :attr:`rated`);
        its state afterwards."""
        record = self._records.get(name)
        if record is None:
            return None
        when = self.clock() if now is None else now
        with self._lock:
            state = record.state
            if state is _HALF_OPEN:
                record.successes += 1
            elif state is _CLOSED and self.rated:
                _prune(record.answers, when - self.settings.window_seconds)
                record.answers.append(when)
            self._fire(record, "probe_ok", when)
            return record.state

    def tick(self, now: float | None = None) -> None:
        """The clock moved: each open child whose cooldown is over goes half-open (one
        membership walk of the open ones; nothing when none is)."""
        if not self.bypassed:
            return
        when = self.clock() if now is None else now
        with self._lock:
            for name in self.bypassed:
                self._fire(self._records[name], "cooled", when)

    def snapshot(self) -> dict[str, Health]:
        """Each child's state, by name, in configuration order (a new dict)."""
        with self._lock:
            return {name: record.state for name, record in self._records.items()}

    def moves(self) -> dict[str, dict[str, int]]:
        """Per child that moved, per ``"<source>_to_<dest>"``, how many times (a copy)."""
        with self._lock:
            return {n: dict(r.moves) for n, r in self._records.items() if r.moves}

    def take_unreported(self) -> dict[str, dict[str, int]]:
        """The transitions since the last call, per child and ``"<source>_to_<dest>"``
        (empty when none), with each child not closed now under its state (``1``: the stats of
        one step, summed by vLLM over an interval, say in how many steps it was so)."""
        with self._lock:
            taken, self._unreported = self._unreported, {}
            if self.bypassed or self.probing:
                for name in self.bypassed | self.probing:
                    taken.setdefault(name, {})[self._records[name].state.value] = 1
            return taken

    def record(self, name: str) -> ChildHealth:
        """Child ``name``'s record (read it, don't mutate it): ``KeyError`` for another name."""
        return self._records[name]

    def _fire(self, record: ChildHealth, event: str, now: float) -> None:
        """``event`` on ``record``, under the lock: its state by the declaration, and the
        books of the transition (the gates, the counts, the log line)."""
        source = record.state
        dest = health_step(record, event, now)
        if dest is None or dest is source:
            return
        why = _why(record, source, self.settings) if dest is _OPEN else ""
        record.state = dest
        key = f"{source.value}_to_{dest.value}"
        record.moves[key] = record.moves.get(key, 0) + 1
        new = self._unreported.setdefault(record.name, {})
        new[key] = new.get(key, 0) + 1
        settings = self.settings
        if dest is _OPEN:
            record.cooldown = next_cooldown(
                record.cooldown,
                base=settings.cooldown_seconds,
                most=settings.max_cooldown_seconds,
                probe_failed=source is _HALF_OPEN,
            )
            record.opened_at = now
            record.failures.clear()
            record.answers.clear()
        elif dest is _HALF_OPEN:
            record.successes = 0
        self._gates()
        _log(record, source, dest, why)

    def _gates(self) -> None:
        records = self._records.values()
        self.bypassed = frozenset(r.name for r in records if not may_look_up(r.state))
        self.probing = frozenset(r.name for r in records if r.state is _HALF_OPEN)


def health_book(
    names: Iterable[str], settings: HealthSettings | None, **kwargs: Any
) -> HealthBook | None:
    """A :class:`HealthBook` of ``names`` under ``settings``; ``None`` when ``settings`` is
    (no health machine: every child asked as if always closed)."""
    return None if settings is None else HealthBook(names, settings, **kwargs)


def _prune(times: deque[float], cutoff: float) -> None:
    """Drop the times at or before ``cutoff`` from the oldest end of a window (amortized
    O(1): each time is dropped once)."""
    while times and times[0] <= cutoff:
        times.popleft()


def _why(record: ChildHealth, source: Health, settings: HealthSettings) -> str:
    """Why ``record`` opens now from ``source``: the rule that tripped, read before its
    window is cleared."""
    if source is _HALF_OPEN:
        return "a probe failed"
    window = f"within {settings.window_seconds:g} s"
    if settings.failure_rate is None:
        return f"{settings.threshold} failure(s) {window}"
    failed = len(record.failures)
    calls = failed + len(record.answers)
    return f"{failed} of {calls} calls failed {window} (failure_rate={settings.failure_rate:g})"


def _log(record: ChildHealth, source: Health, dest: Health, why: str) -> None:
    """One line per transition, saying what it means for the child (``why``: the rule that
    opened it, when it opens)."""
    if dest is _OPEN:
        logger.warning(
            "child connector %r health %s -> open (%s): not asked to look up nor chosen to "
            "load for %g s; what it owes is still awaited",
            record.name,
            source.value,
            why,
            record.cooldown,
        )
    elif dest is _HALF_OPEN:
        logger.info(
            "child connector %r health open -> half_open: its next %d lookup(s) are probes",
            record.name,
            record.probes,
        )
    else:
        logger.info(
            "child connector %r health half_open -> closed: %d probe(s) answered; asked as before",
            record.name,
            record.probes,
        )

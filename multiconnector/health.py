"""A child's health machine: declared once, here, like the request transfer machine.

Each child of a composition is ``closed`` (healthy: asked as always), ``open`` (bypassed: not
asked to look up, never chosen to load; what it already owes is still awaited) or
``half_open`` (probing: asked again, and watched)::

    closed ──failure (tripped)──▶ open ──cooled (cooldown_over)──▶ half_open
      ▲  ⟲ failure (not tripped)   ⟲ failure, cooled (not over)     │  ⟲ probe_ok (not done)
      └────────────────────────probe_ok (probes_done)──────────────┤
                                   open ◀────────failure────────────┘

:data:`TRANSITIONS` is the single declaration, in the format of the ``transitions`` package,
compiled into :data:`TABLE` by the same rules as the transfer machine's
(:mod:`multiconnector._table`) and read by the runtime
(:class:`~multiconnector.healthbook.HealthBook`), by :func:`build_health_machine` (a real
``transitions.Machine``, for the tests and ``multiconnector diagram --health``). Every event is
declared from every state, so any sequence of failures, successes and clock ticks is defined.

The guards are methods of :class:`ChildHealth`, read by name by both. Each reads the record as
the book left it just before firing the event (the failure's time already in the window, the
probe's success already counted): a guard decides, the book keeps the books.

.. versionadded:: 0.1.0
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any, Final, final

import attrs
from transitions import Machine

from ._table import Compiled, build_machine_of, compile_table, events_of

__all__ = [
    "HEALTH_EVENTS",
    "HEALTH_STATES",
    "HEALTH_TABLE",
    "HEALTH_TRANSITIONS",
    "ChildHealth",
    "Health",
    "build_health_machine",
    "health_step",
]


class Health(enum.StrEnum):
    """The three states of a child's health.

    .. versionadded:: 0.1.0
    """

    closed = "closed"
    """Healthy: asked as always; its failures are counted over a window."""
    open = "open"
    """Bypassed: not asked to look up, never chosen to load, until its cooldown is over. What
    it owes (saves and loads in flight) is still awaited."""
    half_open = "half_open"
    """Probing: asked to look up again; enough successes close it, one failure opens it again
    with a longer cooldown."""


HEALTH_STATES: Final[tuple[Health, ...]] = tuple(Health)
HEALTH_INITIAL: Final = Health.closed

#: The declaration. ``failure``: the child failed (a hook raised or answered what cannot be
#: true, a load reported failed, a lookup past the slow bound); ``cooled``: the clock moved
#: (each scheduler step); ``probe_ok``: the child answered a lookup. ``"="``: stay.
HEALTH_TRANSITIONS: Final[tuple[Mapping[str, Any], ...]] = (
    {"trigger": "failure", "source": "closed", "dest": "open", "conditions": "tripped"},
    {"trigger": "failure", "source": "closed", "dest": "=", "unless": "tripped"},
    {"trigger": "failure", "source": "half_open", "dest": "open"},
    {"trigger": "failure", "source": "open", "dest": "="},
    {"trigger": "cooled", "source": "open", "dest": "half_open", "conditions": "cooldown_over"},
    {"trigger": "cooled", "source": "open", "dest": "=", "unless": "cooldown_over"},
    {"trigger": "cooled", "source": ["closed", "half_open"], "dest": "="},
    {"trigger": "probe_ok", "source": "half_open", "dest": "closed", "conditions": "probes_done"},
    {"trigger": "probe_ok", "source": "half_open", "dest": "=", "unless": "probes_done"},
    {"trigger": "probe_ok", "source": ["closed", "open"], "dest": "="},
)  # fmt: skip

HEALTH_EVENTS: Final[tuple[str, ...]] = events_of(HEALTH_TRANSITIONS)


def _times(values: Iterable[float]) -> deque[float]:
    """A window of times, oldest first (a new deque: pruned from the left in O(1))."""
    return deque(values)


@final
@attrs.define(slots=True, eq=False, weakref_slot=False, kw_only=True)
class ChildHealth:
    """One child's health: its state, and what the guards read.

    Kept by a :class:`~multiconnector.healthbook.HealthBook` (read its snapshot, don't mutate
    it). The bounds are the composition's (``threshold``, ``failure_rate``, ``min_calls``,
    ``probes``); the rest is this child's. Its windows are deques of times, oldest first (any
    iterable given is made one).

    .. versionadded:: 0.1.0
    """

    name: str
    state: Health = Health.closed
    #: How many failures in the window open a closed child (when ``failure_rate`` is ``None``).
    threshold: int = 5
    #: The share of the window's calls failed that opens a closed child (``None``: the count
    #: rule, ``threshold``, instead).
    failure_rate: float | None = None
    #: Under ``failure_rate``, the fewest calls in the window it is judged on.
    min_calls: int = 10
    #: How many successes in a row close a half-open child.
    probes: int = 3
    #: The times of the failures still in the window (while closed).
    failures: deque[float] = attrs.field(factory=deque, converter=_times)
    #: The times of the lookups answered in time still in the window (while closed, and only
    #: under ``failure_rate``: the book records none otherwise).
    answers: deque[float] = attrs.field(factory=deque, converter=_times)
    #: When it last opened.
    opened_at: float = 0.0
    #: How long it stays open this time (doubled, up to a bound, after each failed probe).
    cooldown: float = 0.0
    #: The successes in a row while half-open.
    successes: int = 0
    #: Per ``"<source>_to_<dest>"``, how many times it moved so (self-loops are not counted).
    moves: dict[str, int] = attrs.field(factory=dict)

    # Guards, read by name from HEALTH_TRANSITIONS by the compiled table and by transitions.
    def tripped(self, now: float) -> bool:
        """The window's failures reached the threshold; under ``failure_rate``, the window
        holds ``min_calls`` calls or more (failures and lookups answered in time), of which
        that share or more failed."""
        failed = len(self.failures)
        rate = self.failure_rate
        if rate is None:
            return failed >= self.threshold
        calls = failed + len(self.answers)
        return calls >= self.min_calls and calls > 0 and failed / calls >= rate

    def cooldown_over(self, now: float) -> bool:
        """The cooldown since it opened has passed."""
        return now - self.opened_at >= self.cooldown

    def probes_done(self, now: float) -> bool:
        """Enough successes in a row since it went half-open."""
        return self.successes >= self.probes


def _compile() -> dict[Health, dict[str, tuple[Compiled[Health], ...]]]:
    return compile_table(HEALTH_TRANSITIONS, Health, ChildHealth)


#: ``HEALTH_TABLE[state][event]`` lists the candidate transitions in declaration order.
HEALTH_TABLE: Final[Mapping[Health, Mapping[str, tuple[Compiled[Health], ...]]]] = _compile()


def health_step(record: ChildHealth, event: str, now: float) -> Health | None:
    """The state ``event`` leads ``record`` to (``None``: no transition), as ``transitions``
    decides: the first candidate whose guard holds. Does not change ``record``.

    .. versionadded:: 0.1.0
    """
    for guard, want, dest in HEALTH_TABLE[record.state].get(event, ()):
        if guard is None or guard(record, now) is want:
            return dest
    return None


def build_health_machine(**kwargs: Any) -> Machine:
    """A ``transitions.Machine`` built from :data:`HEALTH_TRANSITIONS`, with no model attached
    (as :func:`multiconnector.machine.build_machine`: pass ``machine_cls`` and ``model`` to
    draw it; fire events with ``machine.events[event].trigger(record, now)``).

    .. versionadded:: 0.1.0
    """
    return build_machine_of(HEALTH_TRANSITIONS, HEALTH_STATES, HEALTH_INITIAL, **kwargs)

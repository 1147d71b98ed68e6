"""Each child's health in the aggregator check (``health=True``, ``--health``): the glue.

The aggregator knows nothing of health: the vLLM adapter keeps a
:class:`~multiconnector.healthbook.HealthBook` beside it and gates its own lookups by it
(:mod:`multiconnector.vllm.lookups`). The check does what the adapter does, around the real
aggregator and a real book over the scenario's connector names, with a frozen clock the
checker moves (:data:`SETTINGS`, small bounds):

* ``failure(name)``: a failure of child ``name``, fed to the book (:meth:`HealthBook.failed`);
* ``cooled``: the clock jumps past every cooldown (and out of every failure window), then
  :meth:`HealthBook.tick`;
* under health, a ``match_tokens`` asks only the children the book lets look up (the book's
  gate, :attr:`HealthBook.bypassed`, read as the adapter reads it: an open child is as if it
  answered 0, never asked), and each half-open child that answered is
  :meth:`HealthBook.answered` (a probe); a ``split_load`` chooses only among them.

Health events are not explored while a ``match_tokens`` is between its halves (a lookup's
failure is fed once it returned). The book touches no record of the transfer machine, so
``no early free`` and ``no leak`` are judged with health events interleaved as they are
without; ``breaker kept`` judges the rest (:func:`.properties._breaker_kept`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final

from ..health import HEALTH_TABLE, Health
from ..healthbook import HealthBook, HealthSettings, logger

#: (the kind name of :data:`.scenario.RAISES`, not imported: the scenario imports this module)
RAISES: Final = "raises"

if TYPE_CHECKING:
    from ..aggregator import MultiConnector
    from .scenario import Event, _World

#: The health events (``health=True`` adds them to the alphabet).
HEALTH_EVENTS: Final[tuple[str, ...]] = ("failure", "cooled")
#: The check's bounds: two failures open a closed child, one probe closes a half-open one, a
#: failed probe doubles the cooldown once (1 s, then 2 s, the most).
SETTINGS: Final = HealthSettings(
    threshold=2, window_seconds=1.0, cooldown_seconds=1.0, max_cooldown_seconds=2.0, probes=1
)
#: How far ``cooled`` moves the clock: past the longest cooldown and the failure window.
JUMP: Final = 2.0

#: What builds the book: ``(names, settings, clock=..., aggregator=...)``.
BookFactory = Callable[..., HealthBook]

#: Every declared (source, event, dest) of the health machine, self-loops included.
DECLARED: Final[frozenset[tuple[Health, str, Health]]] = frozenset(
    (source, event, dest)
    for source, events in HEALTH_TABLE.items()
    for event, candidates in events.items()
    for _, _, dest in candidates
)


@contextlib.contextmanager
def quiet(on: bool) -> Iterator[None]:
    """While the check runs under health (``on``): the books' one line per transition (the
    ``multiconnector`` logger, WARNING when a child opens) is not logged, thousands of times."""
    if not on:
        yield
        return
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def real_book(
    names: Iterable[str],
    settings: HealthSettings,
    *,
    clock: Callable[[], float],
    aggregator: MultiConnector,
) -> HealthBook:
    """The real book (the default ``health_book``): it is given the aggregator as a planted
    glue would be, and leaves it alone, as the adapter's book does."""
    return HealthBook(names, settings, clock=clock)


def health_names(world: _World) -> tuple[str, ...]:
    """The names the book keeps: each name the registry may hold (a counted one's report
    names in its place), in the scenario's order."""
    scenario = world.scenario
    return tuple(r for n in scenario.names for r in scenario.ranks.get(n, (n,)))


def health_events(world: _World) -> list[Event]:
    """The health events enabled: none while a match_tokens is between its halves."""
    if world.health is None or any(r.matching for r in world.requests):
        return []
    return [*(("failure", n) for n in health_names(world)), ("cooled",)]


def apply_health(world: _World, event: Event) -> None:
    """A health event on the world's book (the aggregator is not called)."""
    book = world.health
    assert book is not None
    if event[0] == "failure":
        book.failed(event[1], world.now)
    else:
        world.now += JUMP
        book.tick(world.now)


def gate(world: _World) -> None:
    """Before a lookup: the children the book does not let look up (the adapter's read)."""
    book = world.health
    world.scenario.pad.bypassed = book.bypassed if book is not None else frozenset()


def probed(world: _World, answers: Iterable[tuple[str, int | None]]) -> None:
    """After a lookup asked: each half-open child that answered is a probe's success, and
    under ``failure_rate`` each closed one's a call in its window (as the adapter tells its
    book); the gate is lifted."""
    book = world.health
    world.scenario.pad.bypassed = frozenset()
    if book is None:
        return
    kinds = world.scenario.kinds
    for name, tokens in answers:  # (a raising child answered nothing: it raised)
        if (
            tokens is not None
            and (book.rated or name in book.probing)
            and kinds.get(name) != RAISES
        ):
            book.answered(name, world.now)


def may_load(world: _World, name: str) -> bool:
    """Whether the book lets ``name`` look up, so be chosen to load (no book: yes)."""
    book = world.health
    return book is None or name not in book.bypassed


def states(world: _World) -> tuple[Health, ...] | None:
    """Each child's health (the book's records, in its order), or ``None`` without health."""
    book = world.health
    if book is None:
        return None
    return tuple(book.snapshot().values())


def health_key(world: _World) -> tuple[Any, ...] | None:
    """Each child's part of the state: its health, and what of its record decides its next
    transition. With the frozen clock only ``cooled`` moves, by :data:`JUMP` (past every
    cooldown and window), so the failures in the window (those at the current time), whether
    the cooldown is over, the cooldown (it doubles on a failed probe) and the probes done are
    all of it; the clock itself is not."""
    book = world.health
    if book is None:
        return None
    now = world.now
    cutoff = now - book.settings.window_seconds
    key: list[tuple[Any, ...]] = []
    for name in health_names(world):
        r = book.record(name)
        if r.state is Health.closed:  # opening from closed reads neither cooldown nor probes
            answers = sum(1 for t in r.answers if t > cutoff)  # (none unless failure_rate)
            key.append((r.state.value, sum(1 for t in r.failures if t > cutoff), answers))
        else:
            over = r.state is Health.open and r.cooldown_over(now)
            key.append((r.state.value, over, r.cooldown, r.successes))
    return tuple(key)

"""Saves told by name: :class:`SaveLedger`, each finished request's awaited savers.

A side that does not decide who saves a request (a vLLM worker: the scheduler's connector
metadata says so, by name, once the request finished) is left with the transfer report rule
for a request in ``finishing``, :func:`multiconnector.rule.transfer_report`, the one the
aggregator applies: a report from a name the request still awaits is applied (one name less;
the last one releases the request), and any other report is ignored and counted under the same
:class:`Outcome` the aggregator gives it. Its savers are fixed, all started, never unregistered,
and its requests are never cancelled, so no other rule of the aggregator can apply.

The ledger is a plain dict of awaited names per request, and reads the rule's remembered
verdicts (:class:`multiconnector.rule.Verdicts`) as the aggregator does: one step's reports cost
about what vLLM's own count of pending saves costs, which the aggregator's locks, records and
state machine do not (see docs/bench.md, "The scheduler loop"). ``tests/test_ledger.py``
checks it against the aggregator and the rule, event for event (outcomes, releases, counters),
on every sequence of a bounded alphabet and on random longer ones.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from typing import Final

from ._validate import check_name, check_request_id, check_request_ids, check_seconds, shown
from .errors import DuplicateConnectorError, InvalidArgumentError, UnknownConnectorError
from .machine import State
from .outcome import Outcome
from .rule import SHARED_LIMIT, Verdict, Verdicts, count, refined

__all__ = ["SaveLedger", "take_older"]

logger: Final = logging.getLogger("multiconnector")

_APPLIED: Final = Outcome.applied
_FINISHING: Final = State.finishing
_FINISHED: Final = State.finished
_INF: Final = float("inf")


def take_older(since: dict[str, float], cutoff: float) -> list[tuple[str, float]]:
    """Remove from ``since`` (request id -> when it began to wait, in the order they began) the
    requests that began at ``cutoff`` or before; return them, oldest first, with when they
    began. Costs what it returns."""
    taken: list[tuple[str, float]] = []
    for request_id, began in since.items():
        if began > cutoff:
            break
        taken.append((request_id, began))
    for request_id, _ in taken:
        del since[request_id]
    return taken


class SaveLedger:
    """Each finished request's savers still owing a report, until all of them reported.

    ``names`` are the savers (a vLLM worker's children), in configuration order: a request
    awaits its savers in that order, as the aggregator awaits its registered connectors.
    Single-threaded, as a vLLM worker's connector calls are. ``names`` is checked: an iterable
    (not a ``str``) of connector names (:class:`InvalidNameError` for one that is not), each
    once (:class:`DuplicateConnectorError`).

    .. versionadded:: 0.1.0
    """

    __slots__ = (
        "_applied",
        "_awaiting",
        "_canonical",
        "_expected",
        "_ignored",
        "_order",
        "_since",
        "_verdicts",
    )

    def __init__(self, names: Iterable[str]) -> None:
        if isinstance(names, str | bytes) or not isinstance(names, Iterable):
            raise InvalidArgumentError(f"names={shown(names)} must be an iterable of child names")
        self._order: dict[str, int] = {}
        for given in names:
            name = check_name(given, "an item of names")
            if name in self._order:
                raise DuplicateConnectorError(f"an item of names={name!r} is given twice")
            self._order[name] = len(self._order)
        #: Each held request's savers still owing a report (never empty).
        self._awaiting: dict[str, tuple[str, ...]] = {}
        #: Each held request's savers (what tells a duplicate report from a phantom one).
        self._expected: dict[str, tuple[str, ...]] = {}
        #: Each saver tuple as received, in configuration order, without repeats.
        self._canonical: dict[tuple[str, ...], tuple[str, ...]] = {}
        #: The transfer report rule's verdicts, remembered (few distinct tuples, shared).
        self._verdicts = Verdicts()
        self._applied: dict[str, int] = {}
        self._ignored: dict[tuple[Outcome, str | None], int] = {}
        #: When each held request began to await its savers (``time.monotonic()``), oldest
        #: first, until :meth:`take_overdue` took it or it was released.
        self._since: dict[str, float] = {}

    def expect(self, savers: Mapping[str, tuple[str, ...]]) -> None:
        """Each request of ``savers`` finished; it awaits a report from each of its names.

        A request already held is a ``duplicate`` finish and changes nothing; a request with no
        savers owes nothing and is not held (vLLM freed its blocks at once). Every saver tuple is
        checked before anything changes: a name that is not a connector name raises
        :class:`InvalidNameError`, one that is not a child :class:`UnknownConnectorError`.
        """
        canonical = self._canonical
        given: tuple[str, ...] | None = None
        plain = True
        for request_id, these in savers.items():
            if request_id.__class__ is not str or not request_id:
                check_request_id(request_id, "a request id of savers")
                plain = False  # a str subclass: held as a plain str
            if these is not given:  # a step's tuples are mostly one shared tuple
                given = these
                try:
                    known = these.__class__ is tuple and these in canonical
                except TypeError:  # an unhashable item: _check names it
                    known = False
                if not known:
                    self._check(these)
        if not plain:
            savers = {str(request_id): these for request_id, these in savers.items()}
        awaiting, expected, since = self._awaiting, self._expected, self._since
        given = None
        names: tuple[str, ...] = ()
        now = time.monotonic()
        for request_id, these in savers.items():
            if request_id in awaiting:
                self._ignore("request_finished", request_id, None, Outcome.duplicate)
                continue
            if these is not given:
                given = these
                found = canonical.get(these)  # not there only once the cache is full
                names = self._canonicalize(these) if found is None else found
            if names:
                awaiting[request_id] = expected[request_id] = names
                since[request_id] = now

    def report(self, name: str, request_ids: Iterable[str], released: set[str]) -> None:
        """Child ``name`` finished saving each of ``request_ids``; a request that no longer
        awaits anyone is added to ``released`` and forgotten.

        ``released`` is the step's: the worker passes one set to every child's report of a step.
        A report for a request in it is ``terminal``, as it is to the aggregator, which holds a
        finished request until it is handed back at the end of the step. Every argument is
        checked before any report is applied: :class:`InvalidNameError` for ``name``,
        :class:`InvalidArgumentError` for ``request_ids`` that is a ``str`` or not iterable, or
        for an item that is not a request id; nothing changes then.
        """
        if name.__class__ is not str or name not in self._order:
            name = check_name(name)  # a child's name is a valid one: no scan
        ids = check_request_ids(request_ids)
        awaiting = self._awaiting
        known = self._verdicts.by_state[_FINISHING]  # every held request is finishing
        applied = 0
        for request_id in ids:
            owed = awaiting.get(request_id)
            try:  # the remembered verdict (a KeyError when not held, ignored or new)
                outcome, _, rest, completes = known[owed][name]  # type: ignore[index]
            except KeyError:
                outcome, _, rest, completes = self._verdict(request_id, owed, name, released)
            if outcome is not _APPLIED:
                # Every child is a started connector: a stranger is a name that is none.
                outcome = refined(outcome, name in self._order, True)
                self._ignore("transfer_finished", request_id, name, outcome)
                continue
            applied += 1
            if completes:
                del awaiting[request_id]
                del self._expected[request_id]
                self._since.pop(request_id, None)
                released.add(request_id)
            else:
                awaiting[request_id] = rest
        if applied:
            self._applied[name] = self._applied.get(name, 0) + applied

    def _verdict(
        self, request_id: str, owed: tuple[str, ...] | None, name: str, released: set[str]
    ) -> Verdict:
        """The rule's verdict on ``name``'s report for ``request_id``, which awaits ``owed``
        (``None``: not held; ``finished`` when ``released`` this step, as the aggregator holds
        a finished request until the end of the step)."""
        if owed is None:
            state = _FINISHED if request_id in released else None
            return self._verdicts.of(state, (), (), (), name)
        return self._verdicts.of(_FINISHING, owed, self._expected[request_id], (), name)

    def _ignore(self, event: str, request_id: str, name: str | None, outcome: Outcome) -> None:
        count(self._ignored, outcome, name)
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "ignored %s for request %r from %r: %s", event, request_id, name, outcome.value
            )

    def _check(self, names: tuple[str, ...]) -> None:
        """Raise unless ``names`` is a tuple of children's names."""
        order = self._order
        if not isinstance(names, tuple):
            raise InvalidArgumentError(f"savers={shown(names)} must be a tuple of child names")
        for given in names:
            if given.__class__ is not str or given not in order:
                name = check_name(given, "an item of savers")
                if name in order:
                    continue  # a str subclass of a child's name
                raise UnknownConnectorError(
                    f"an item of savers={name!r} is not a child of this connector: {list(order)}"
                )

    def _canonicalize(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """Checked ``names`` in configuration order, without repeats (remembered)."""
        ordered = self._verdicts.intern(
            tuple(sorted({str(name) for name in names}, key=self._order.__getitem__))
        )
        if len(self._canonical) < SHARED_LIMIT:  # few distinct tuples; garbage cannot grow it
            self._canonical[names] = ordered
        return ordered

    def take_overdue(
        self, older_than: float, now: float | None = None
    ) -> list[tuple[str, tuple[str, ...], float]]:
        """The held requests that have awaited their savers for ``older_than`` seconds or more
        and were not taken before: ``(request_id, savers still owing, seconds awaited)``, oldest
        first. Each request is taken once (a saver that never reports is told about once per
        request, not once per call); it stays held until its savers report. Costs what it
        returns: the requests are kept in the order they began to wait.
        """
        if older_than.__class__ is not float or not 0 <= older_than < _INF:
            older_than = check_seconds(older_than, "older_than")
        if not self._since:
            return []
        if now is None:
            now = time.monotonic()
        elif now.__class__ is not float:
            now = check_seconds(now, "now")
        awaiting = self._awaiting
        return [
            (request_id, awaiting[request_id], now - began)
            for request_id, began in take_older(self._since, now - older_than)
        ]

    # -- reading -------------------------------------------------------------------------------

    def __len__(self) -> int:
        """How many requests are held (each awaits at least one saver)."""
        return len(self._awaiting)

    def __contains__(self, request_id: object) -> bool:
        return isinstance(request_id, str) and request_id in self._awaiting

    def awaiting(self, request_id: str) -> tuple[str, ...]:
        """The savers ``request_id`` still awaits, in configuration order (``()`` when not
        held)."""
        return self._awaiting.get(request_id, ())

    def held(self) -> dict[str, tuple[str, ...]]:
        """Every held request with the savers it still awaits (a copy), in the order the
        requests finished: the first ones have waited longest (a saver that never reports keeps
        its requests here, at the front)."""
        return dict(self._awaiting)

    def connector_counts(self) -> dict[str, dict[Outcome, int]]:
        """The outcomes of the reports, per child name, as the aggregator's
        :meth:`~multiconnector.MultiConnector.connector_counts` gives them."""
        counts: dict[str, dict[Outcome, int]] = {}
        for name, n in self._applied.items():
            counts.setdefault(name, {})[Outcome.applied] = n
        for (outcome, reporter), n in self._ignored.items():
            if reporter is not None:
                per = counts.setdefault(reporter, {})
                per[outcome] = per.get(outcome, 0) + n
        return counts

    def __repr__(self) -> str:
        return f"SaveLedger(held={len(self._awaiting)})"

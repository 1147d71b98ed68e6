"""Reading the aggregator: held requests, their records, the event counters and the
connectors' stats. Nothing here changes a request.
"""

from __future__ import annotations

from typing import Any

import attrs

from .._validate import check_bool, check_int, check_request_id
from ..errors import ConnectorFailures
from ..machine import TERMINAL, RequestTransferState
from ..outcome import Outcome
from ._books import _APPLIED, _NO_NAME, Books

__all__ = ["Queries"]


class Queries(Books):
    """Held requests, records, counters and stats."""

    __slots__ = ()

    def get(self, request_id: str) -> RequestTransferState | None:
        """A copy of the request's record, or ``None`` if it is not held.

        The copy's ``params`` and ``history`` are copies too: changing them changes nothing held.
        """
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        record = self._requests.get(request_id)
        if record is None:
            return None
        with self._locks[hash(request_id) & self._mask]:
            copy = attrs.evolve(record)
            if record.history is not None:
                copy.history = list(record.history)
            if record.params is not None:
                copy.params = dict(record.params)
            return copy

    def peek(self, request_id: str) -> RequestTransferState | None:
        """The held record itself, not a copy, or ``None`` if the request is not held.

        Read-only: never assign to its fields, and expect them to change as events apply (each
        field read is atomic, but two reads may straddle an update made by another thread).
        :meth:`get` copies the record under its lock, for a consistent snapshot; ``peek`` is
        for a hot path that needs one field and owns the request's events (the vLLM adapter,
        whose step-wise calls come from one thread).

        .. versionadded:: 0.1.0
        """
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        return self._requests.get(request_id)

    def __len__(self) -> int:
        """How many requests are held: live, draining (terminal, a transfer still in flight),
        or terminal and queued for :meth:`take`. :meth:`held` tells them apart."""
        return len(self._requests)

    def held(self) -> dict[str, int]:
        """How many held requests are ``live`` (pending or finishing), ``draining`` (finished
        or cancelled, with a save or a load still in flight: not yet safe to free) and
        ``queued`` (safe to free, waiting for :meth:`take`). The three add up to ``len()``.

        A scan of the held requests, without locks: under concurrent events, a count each
        request had at some moment of the scan.

        .. versionadded:: 0.1.0
        """
        live = draining = 0
        records = list(self._requests.values())
        for record in records:
            if record.state not in TERMINAL:
                live += 1
            elif record.in_flight:
                draining += 1
        return {"live": live, "draining": draining, "queued": len(records) - live - draining}

    def oldest(self, count: int = 1, *, draining: bool = False) -> list[RequestTransferState]:
        """Copies of the ``count`` requests held longest, oldest first (in the order they were
        begun); with ``draining=True``, only requests that are terminal but not yet safe to free.

        Held requests are kept in begin order, so without ``draining`` this reads only the first
        ones. A request that stays among the oldest for longer than a transfer takes names, in
        its ``awaiting`` (or its ``loader`` without ``loaded``), a connector that never
        reported: once that connector no longer touches KV blocks, unregister it and the request
        is released. (Call it periodically and compare: records carry no timestamp, which would
        cost every ``begin`` a clock read.)

        .. versionadded:: 0.1.0
        """
        check_int(count, "count", minimum=0)
        check_bool(draining, "draining")
        found: list[RequestTransferState] = []
        if count == 0:
            return found
        for request_id, record in list(self._requests.items()):
            if draining and not (record.state in TERMINAL and record.in_flight):
                continue
            copy = self.get(request_id)
            if copy is None:
                continue  # taken meanwhile
            found.append(copy)
            if len(found) == count:
                break
        return found

    def __contains__(self, request_id: object) -> bool:
        """Whether ``request_id`` is held; ``False`` for anything that is not a ``str`` (an
        unhashable ``[]`` included), as no such id can be held."""
        if request_id.__class__ is str:
            return request_id in self._requests
        return isinstance(request_id, str) and str(request_id) in self._requests

    def request_ids(self) -> list[str]:
        """The ids of every held request."""
        return list(self._requests)

    def counts(self) -> dict[Outcome, int]:
        """How many events had each outcome, since this aggregator was made."""
        totals: dict[Outcome, int] = {}
        for (outcome, _), n in self._merged_counts().items():
            totals[outcome] = totals.get(outcome, 0) + n
        return totals

    def connector_counts(self) -> dict[str, dict[Outcome, int]]:
        """Event outcomes per connector name (reports and load reports).

        Names are whatever reports carried, registered or not. To keep memory bounded, each lock
        stripe keeps at most 1 024 distinct (outcome, name) counters; further names are counted
        under :data:`OTHER_NAMES` (``"<other names>"``).
        """
        per: dict[str, dict[Outcome, int]] = {}
        for (outcome, name), n in self._merged_counts().items():
            if name is not None:
                per.setdefault(name, {})[outcome] = n
        return per

    def _merged_counts(self) -> dict[tuple[Outcome, str | None], int]:
        merged: dict[tuple[Outcome, str | None], int] = {}
        stripes = zip(self._locks, self._counts, self._applied, strict=True)
        for index, (lock, counts, applied) in enumerate(stripes):
            with lock:
                items = [*counts.items(), *(((_APPLIED, k), n) for k, n in applied.items())]
                if self._finishes[index]:
                    items.append(((_APPLIED, _NO_NAME), self._finishes[index]))
            for key, n in items:
                merged[key] = merged.get(key, 0) + n
        return merged

    def stats(self) -> dict[str, Any]:
        """Each ready connector's ``get_stats()``, keyed by its registration name.

        Two connectors of one class never collide: the key is the name. A connector that raises
        is left out and :class:`ConnectorFailures` (``result``: the others' stats) is raised.
        Refused after :meth:`shutdown`.
        """
        if self._closed:
            self._shut("stats")
        stats: dict[str, Any] = {}
        errors: list[Exception] = []
        failed: list[str] = []
        for entry in self._registry.ready_entries():
            get_stats = getattr(entry.connector, "get_stats", None)
            if get_stats is None:
                continue
            try:
                stats[entry.name] = get_stats()
            except Exception as exc:
                errors.append(exc)
                failed.append(entry.name)
        if errors:
            raise ConnectorFailures(
                "connectors failed to give stats", errors, failed=failed, result=stats
            )
        return stats

"""Deliberately broken health glue: the model checker's ``--health`` must be able to fail.

Each is a :class:`~multiconnector.healthbook.HealthBook` subclass, built by the check through
its documented ``health_book(names, settings, clock=..., aggregator=...)`` parameter. The real
book touches no record of the transfer machine, so a bug that drops what a child owes cannot
be planted in the book alone: :class:`OpeningAbandonsSaves` plants it in the glue a wrong
adapter would have, a book told the aggregator that settles a child's saves when it opens.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from multiconnector import MultiConnector
from multiconnector.health import Health
from multiconnector.healthbook import HealthBook, HealthSettings


class OpeningAbandonsSaves(HealthBook):  # type: ignore[misc]
    """When a child opens, every save it owes is settled as if it reported: the records it
    held back are freed while the child may still be writing their blocks."""

    def __init__(
        self,
        names: Iterable[str],
        settings: HealthSettings,
        *,
        clock: Callable[[], float],
        aggregator: MultiConnector,
    ) -> None:
        super().__init__(names, settings, clock=clock)
        self.aggregator = aggregator

    def failed(self, name: str, now: float | None = None, **kwargs: Any) -> Health | None:
        before = self.record(name).state
        after = super().failed(name, now, **kwargs)
        if after is Health.open and before is not Health.open:
            for request_id in self.aggregator.request_ids():
                record = self.aggregator.peek(request_id)
                if record is not None and name in record.awaiting:
                    self.aggregator.transfer_finished(request_id, name)
        return after


class FailedProbeCloses(HealthBook):  # type: ignore[misc]
    """A probe that fails closes the breaker (half_open + failure -> closed), so a child still
    down is asked again by every lookup."""

    def failed(self, name: str, now: float | None = None, **kwargs: Any) -> Health | None:
        record = self.record(name)
        if record.state is Health.half_open:
            record.state = Health.closed
            self._gates()
            return record.state
        return super().failed(name, now, **kwargs)


def failed_probe_closes(
    names: Iterable[str],
    settings: HealthSettings,
    *,
    clock: Callable[[], float],
    aggregator: MultiConnector,
) -> HealthBook:
    return FailedProbeCloses(names, settings, clock=clock)

"""What a run measured: :class:`SimulationResult`, and its JSON form."""

from __future__ import annotations

from typing import Any, final

import attrs

from ..outcome import Outcome
from .config import SimulationConfig

__all__ = ["SimulationResult"]


@final
@attrs.frozen(kw_only=True)
class SimulationResult:
    """Everything a run measured. ``ok`` is true when no invariant was broken."""

    config: SimulationConfig
    finished: int
    cancelled: int
    outcomes: dict[str, int]
    connector_outcomes: dict[str, dict[str, int]]
    reports: dict[str, dict[str, int]]
    simulator: dict[str, int]
    faults: dict[str, int]
    violations: dict[str, int]
    examples: list[dict[str, str]]
    early_frees: int
    leaks: dict[str, int]
    elapsed: float

    @property
    def events(self) -> int:
        """Events the library counted: every request_finished, report, load report, cancel.

        Not the awaited saves released by unregistering (``abandoned``): no call made those."""
        return sum(n for k, n in self.outcomes.items() if k != Outcome.abandoned.value)

    @property
    def events_per_second(self) -> float:
        return self.events / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def violation_count(self) -> int:
        return sum(self.violations.values())

    @property
    def ok(self) -> bool:
        return self.violation_count == 0

    def to_json(self) -> dict[str, Any]:
        applied = self.outcomes.get(Outcome.applied.value, 0)
        return {
            "ok": self.ok,
            "config": self.config.to_json(),
            "requests": {
                "total": self.config.requests,
                "finished": self.finished,
                "cancelled": self.cancelled,
            },
            "events": {
                "total": self.events,
                "applied": applied,
                "ignored": {
                    k: n
                    for k, n in self.outcomes.items()
                    if k not in (Outcome.applied.value, Outcome.abandoned.value)
                },
                # Awaited saves released by unregistering their connector: not events.
                "abandoned": self.outcomes.get(Outcome.abandoned.value, 0),
            },
            "connectors": self.connector_outcomes,
            "reports": self.reports,
            "simulator": self.simulator,
            "faults": self.faults,
            "violations": {
                "total": self.violation_count,
                "by_kind": self.violations,
                "examples": self.examples,
            },
            "early_frees": self.early_frees,
            "leaks": self.leaks,
            "elapsed_s": round(self.elapsed, 3),
            "events_per_second": round(self.events_per_second),
        }

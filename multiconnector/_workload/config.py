"""What a simulation runs: :class:`SimulationConfig`, the fault kinds and the connectors."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, final

import attrs

from .._validate import bad_argument, check_stripes, shown
from ..errors import InvalidArgumentError, InvalidValueError

__all__ = ["CONNECTORS", "FAULT_KINDS", "MAX_BLOCKS", "SimulationConfig"]

#: The fault kinds ``--faults`` picks from, and what each injects.
FAULT_KINDS: Final[dict[str, str]] = {
    "raise": "a connector raises in request_finished, or in its on_finished callback",
    "duplicate": "a save or load report, request_finished or cancel delivered twice",
    "late": "reports after the request was handed back, request_finished after a cancel, "
    "reports from a connector after its shutdown",
    "phantom": "a ready connector reports a save or load it never committed to",
    "unknown": "reports from a name never registered and from the not-ready connector, "
    "reports for a request never begun",
    "unregister": "a connector shut down and unregistered mid-run, registered again later",
    "clash": "pd@0 and pd@1 both supply the params key remote_engine_id",
}

#: The connectors, in registration order: ``None`` is one whose start failed.
CONNECTORS: Final[tuple[str, ...]] = ("cache", "pd@0", "pd@1", "nixl")
#: The most blocks a request takes: the pool must hold at least one such request.
MAX_BLOCKS: Final = 32


def _check_rate(value: Any, argument: str) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and 0 <= value <= 1:
        return float(value)
    error = InvalidValueError if number else InvalidArgumentError
    raise error(f"{argument}={shown(value)} must be a number from 0 to 1")


def _check_count(value: Any, argument: str, minimum: int) -> None:
    if type(value) is not int or value < minimum:
        error = InvalidValueError if type(value) is int else InvalidArgumentError
        raise error(f"{argument}={shown(value)} must be an int >= {minimum}")


def _check_faults(value: Any) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        raise InvalidArgumentError(
            f"faults={shown(value)} must be a collection of fault kinds ({', '.join(FAULT_KINDS)})"
        )
    kinds = frozenset(value)
    unknown = sorted(k for k in kinds if k not in FAULT_KINDS)
    if unknown:
        raise bad_argument(all(isinstance(k, str) for k in kinds))(
            f"faults={shown(value)} has unknown kind(s) {unknown}; "
            f"must be among {', '.join(FAULT_KINDS)}"
        )
    return kinds


@final
@attrs.frozen(kw_only=True)
class SimulationConfig:
    """What to simulate. Every field is checked: a bad one raises ``InvalidArgumentError``.

    ``fault_rate`` is the probability, per request and per fault kind, that the fault is injected
    (connectors are unregistered ten times less often); ``cancel_rate`` the probability that the
    scheduler cancels a request at a random moment of its life; ``blocks`` the pool's size.
    """

    requests: int = 100_000
    seed: int = 0
    threads: int = 1
    faults: frozenset[str] = attrs.field(default=frozenset(FAULT_KINDS), converter=_check_faults)
    fault_rate: float = attrs.field(default=0.02)
    cancel_rate: float = attrs.field(default=0.05)
    blocks: int = 4096
    stripes: int = 64

    def __attrs_post_init__(self) -> None:
        _check_count(self.requests, "requests", 1)
        if type(self.seed) is not int:
            raise InvalidArgumentError(f"seed={shown(self.seed)} must be an int")
        _check_count(self.threads, "threads", 1)
        _check_count(self.blocks, "blocks", MAX_BLOCKS)
        check_stripes(self.stripes)
        _check_rate(self.fault_rate, "fault_rate")
        _check_rate(self.cancel_rate, "cancel_rate")

    def to_json(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["faults"] = sorted(self.faults)
        return out

"""What a simulation runs: :class:`SimulationConfig`, the fault kinds and the connectors."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final, final

import attrs

from .._validate import bad_argument, check_stripes, shown
from ..errors import InvalidArgumentError, InvalidValueError

__all__ = [
    "CONNECTORS",
    "FAULT_KINDS",
    "MAX_BLOCKS",
    "MAX_POOL_BLOCKS",
    "MAX_REQUESTS",
    "MAX_THREADS",
    "SimulationConfig",
]

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
#: The most requests a run takes: ten times the documented million, an hour or so of work.
#: The run keeps a byte per request, and a number as large as fits an int would only fail later
#: (out of memory, or after days).
MAX_REQUESTS: Final = 10_000_000
#: The largest pool: the pool keeps about 50 bytes per block (a million: some 50 MB), and more
#: blocks than this only make every request fit at once.
MAX_POOL_BLOCKS: Final = 1_000_000
#: The most worker threads: each is an OS thread with its own stack, and a run with more
#: threads than this would race no more than one with fewer.
MAX_THREADS: Final = 256


def _check_rate(value: Any, argument: str) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and 0 <= value <= 1:
        return float(value)
    error = InvalidValueError if number else InvalidArgumentError
    raise error(f"{argument}={shown(value)} must be a number from 0 to 1")


def _check_count(value: Any, argument: str, minimum: int, maximum: int) -> None:
    if type(value) is not int or not minimum <= value <= maximum:
        error = InvalidValueError if type(value) is int else InvalidArgumentError
        raise error(f"{argument}={shown(value)} must be an int >= {minimum} and <= {maximum:,}")


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
    ``requests`` is at most 10,000,000, ``threads`` 256 and ``blocks`` 1,000,000
    (``MAX_REQUESTS``, ``MAX_THREADS``, ``MAX_POOL_BLOCKS``).
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
        _check_count(self.requests, "requests", 1, MAX_REQUESTS)
        if type(self.seed) is not int:
            raise InvalidArgumentError(f"seed={shown(self.seed)} must be an int")
        _check_count(self.threads, "threads", 1, MAX_THREADS)
        _check_count(self.blocks, "blocks", MAX_BLOCKS, MAX_POOL_BLOCKS)
        check_stripes(self.stripes)
        _check_rate(self.fault_rate, "fault_rate")
        _check_rate(self.cancel_rate, "cancel_rate")

    def to_json(self) -> dict[str, Any]:
        out = attrs.asdict(self)
        out["faults"] = sorted(self.faults)
        return out

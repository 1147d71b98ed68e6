"""What every benchmark of ``make bench`` shares: the sizes, the table's rows, the timers.

The runner (:mod:`bench.run`) and the vLLM rows (:mod:`bench.vllm_rows`,
:mod:`bench.scheduler_loop`) import it; nothing here imports them.
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

NAMES = ("a", "b", "c")
BLOCKS = [0, 1, 2, 3]


@dataclass(frozen=True)
class Sizes:
    lifecycle_batch: int = 4000
    machine_batch: int = 200
    lifecycle_repeats: int = 61
    memory_requests: int = 100_000
    flat_small: int = 1_000
    flat_large: int = 1_000_000
    flat_cycles: int = 4000
    flat_repeats: int = 21
    thread_requests: int = 16_000
    threads: int = 8
    thread_repeats: int = 11
    vllm_steps: int = 40
    vllm_repeats: int = 11
    loop_requests: int = 128
    loop_repeats: int = 21
    check_states: int | None = None  # None: the default bound, to the end
    usermachine_states: int = 1_000  # the smaller search; the larger has twice as many
    usermachine_repeats: int = 5


QUICK = Sizes(
    lifecycle_batch=50,
    machine_batch=5,
    lifecycle_repeats=3,
    memory_requests=500,
    flat_small=100,
    flat_large=1_000,
    flat_cycles=50,
    flat_repeats=3,
    thread_requests=400,
    threads=8,
    thread_repeats=2,
    vllm_steps=2,
    vllm_repeats=2,
    loop_requests=8,
    loop_repeats=2,
    check_states=300,
    usermachine_states=100,
    usermachine_repeats=1,
)


@dataclass
class Row:
    """One line of the table."""

    name: str
    median: float
    p90: float
    unit: str
    target: str = ""
    met: bool | None = None


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def p90(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def timed(fn: Callable[[], object]) -> float:
    """Seconds ``fn`` took, with the collector off (and the garbage collected before)."""
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start
    finally:
        gc.enable()

"""Breadth-first, exhaustive exploration of a bounded state space, on the real implementation.

:func:`explore` knows nothing of the aggregator: it drives any model through a user-given event
alphabet, identifies states by a user-given snapshot, and checks user-given invariants on every
transition. :mod:`multiconnector.check` builds the aggregator's scenario on top of it.

Why replay instead of copying: real implementations hold locks, callbacks and registries that
``copy.deepcopy`` cannot or should not copy. A state is therefore stored only as its snapshot and
the event that first reached it; the model is rebuilt by replaying that path from a fresh
``initial()``. An event whose snapshot equals the state it started from (an ignored event)
leaves a model that still stands for that state, so the next event reuses it instead of
replaying. Both tricks rely on the snapshot being faithful (two models with equal snapshots
behave the same), which is also what merging states requires.

Breadth-first order makes every counterexample a shortest one: states are numbered in the order
they are found, so a state's number never decreases with its depth.
"""

from .config import SearchConfig
from .explore import explore, remaining_seconds
from .report import (
    ACTORS_APART,
    COVERAGE,
    EXIT_STATUS,
    FAIL,
    INCONCLUSIVE,
    MAX_DEPTH,
    MAX_SECONDS,
    MAX_STATES,
    NO_EXCEPTION,
    NO_TRAP,
    PASS,
    PROGRESS_AFTER,
    STATES_REACHED,
    TRANSITIONS_FIRED,
    CheckReport,
    Counterexample,
    PropertyResult,
    TraceStep,
    TransitionCoverage,
    Triple,
    UnknownPropertyError,
)
from .search import NondeterminismError, declared_transitions

__all__ = [
    "ACTORS_APART",
    "COVERAGE",
    "EXIT_STATUS",
    "FAIL",
    "INCONCLUSIVE",
    "MAX_DEPTH",
    "MAX_SECONDS",
    "MAX_STATES",
    "NO_EXCEPTION",
    "NO_TRAP",
    "PASS",
    "PROGRESS_AFTER",
    "STATES_REACHED",
    "TRANSITIONS_FIRED",
    "CheckReport",
    "Counterexample",
    "NondeterminismError",
    "PropertyResult",
    "SearchConfig",
    "TraceStep",
    "TransitionCoverage",
    "Triple",
    "UnknownPropertyError",
    "declared_transitions",
    "explore",
    "remaining_seconds",
]

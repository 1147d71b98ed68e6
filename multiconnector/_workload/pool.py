"""The simulator's KV block pool, and the record of every invariant it saw broken.

The pool is the simulator's referee. It does not believe the library: before it frees a request's
blocks it asks the *simulated connectors themselves* whether any of them still owes a report for
that request (a save or a load still touching the blocks). Freeing then is an **early free**, the
failure this library exists to prevent. It also catches blocks freed twice, handed out twice, or
never freed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Final, final

__all__ = ["BlockPool", "Violations"]

#: How many violations are kept with their details; the rest are only counted.
EXAMPLES: Final = 20


@final
class Violations:
    """Broken invariants, counted by kind, the first few kept with a detail. Thread-safe."""

    __slots__ = ("_lock", "by_kind", "examples")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.by_kind: dict[str, int] = {}
        self.examples: list[dict[str, str]] = []

    def add(self, kind: str, request_id: str, detail: str) -> None:
        with self._lock:
            self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
            if len(self.examples) < EXAMPLES:
                self.examples.append({"kind": kind, "request_id": request_id, "detail": detail})

    @property
    def total(self) -> int:
        return sum(self.by_kind.values())

    def __len__(self) -> int:
        return self.total


_FREE: Final = -1


@final
class BlockPool:
    """``capacity`` KV blocks handed to requests and freed exactly once, never while owed.

    Requests are numbered ``0 .. requests - 1``. ``owed(request_id)`` is the ground truth: the
    names of simulated connectors that still owe a report for it.
    """

    __slots__ = (
        "_free",
        "_owed",
        "_owner",
        "_state",
        "capacity",
        "early_frees",
        "frees",
        "violations",
    )

    _NEW, _HELD, _FREED = 0, 1, 2

    def __init__(
        self,
        capacity: int,
        requests: int,
        owed: Callable[[str], Sequence[str]],
        violations: Violations,
    ) -> None:
        self.capacity = capacity
        self._free = list(range(capacity - 1, -1, -1))  # a stack: low ids are handed out first
        self._owner = [_FREE] * capacity
        self._state = bytearray(requests)
        self._owed = owed
        self.violations = violations
        self.early_frees = 0
        self.frees = 0

    @property
    def in_use(self) -> int:
        return self.capacity - len(self._free)

    def allocate(self, index: int, count: int) -> list[int] | None:
        """``count`` blocks for request ``index``, or ``None`` when too few are free."""
        free = self._free
        if count > len(free):
            return None
        if self._state[index] != self._NEW:
            self.violations.add("allocated_twice", f"r{index}", "blocks asked for twice")
        self._state[index] = self._HELD
        blocks = free[-count:]
        del free[-count:]
        owner = self._owner
        for block in blocks:
            if owner[block] != _FREE:  # pragma: no cover - the pool's own bookkeeping
                self.violations.add("block_shared", f"r{index}", f"block {block} already held")
            owner[block] = index
        return blocks

    def free(self, index: int, request_id: str, blocks: list[int]) -> None:
        """Free request ``index``'s blocks, flagging a second free and an early one."""
        if self._state[index] != self._HELD:
            self.violations.add("double_free", request_id, "blocks freed twice or never held")
            return
        owed = self._owed(request_id)
        if owed:
            self.early_frees += 1
            self.violations.add(
                "early_free", request_id, f"freed while a report is still owed by {', '.join(owed)}"
            )
        self._state[index] = self._FREED
        owner = self._owner
        for block in blocks:
            if owner[block] != index:  # pragma: no cover - the pool's own bookkeeping
                self.violations.add("block_shared", request_id, f"block {block} not its own")
            owner[block] = _FREE
        self._free.extend(blocks)
        self.frees += 1

    def never_freed(self) -> int:
        """How many requests got blocks and never gave them back."""
        return self._state.count(self._HELD)

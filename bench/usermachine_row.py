"""``make bench``'s row for ``check --machine``: a machine whose model carries data.

A counter ticks up to a limit, then stops: every state is the counter's value, the search is a
path as deep as it has states, and a search that rebuilt each state by replaying its path
from a fresh model would cost time quadratic in the states. The row is the ratio of the CPU
time of the whole check (set-up included) on twice the states to that on the states, medians
of interleaved runs in one process: linear is 2 (a little less: the set-up is paid once).
"""

from __future__ import annotations

import functools
import time
from typing import Any

from transitions import Machine

from multiconnector.usermachine import check_machine

__all__ = ["Counter", "checked_seconds"]


class Counter:
    """A model holding its machine: ``tick`` while below ``limit`` (adds 1), then ``stop``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self.machine = Machine(
            model=self,
            states=["counting", {"name": "stopped", "final": True}],
            initial="counting",
            transitions=[
                {
                    "trigger": "tick",
                    "source": "counting",
                    "dest": "counting",
                    "conditions": "below",
                    "after": "add",
                },
                ["stop", "counting", "stopped"],
            ],
            auto_transitions=False,
        )

    def below(self) -> bool:
        return self.count < self.limit

    def add(self) -> None:
        self.count += 1


def checked_seconds(states: int) -> tuple[float, Any]:
    """CPU seconds of ``check_machine`` on a counter with about ``states`` distinct states, and
    the report (two states per value: counting and stopped)."""
    factory = functools.partial(Counter, max(1, states // 2 - 1))
    start = time.process_time()
    report = check_machine(factory, name="Counter", max_states=10 * states)
    return time.process_time() - start, report

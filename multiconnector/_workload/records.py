"""What a run keeps: the scheduler's :class:`SimRequest` per request, and the tallies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, final

__all__ = ["SimRequest", "Tally", "count"]


@final
class SimRequest:
    """The scheduler's view of one request, and the plan its connectors follow."""

    __slots__ = (
        "answers",
        "blocks",
        "cache_saves",
        "callback_fail",
        "cancel_applied",
        "clash",
        "committed",
        "finished_once",
        "handed_back",
        "hits",
        "index",
        "loading",
        "overtake",
        "pd",
        "raised",
        "raiser",
        "rid",
        "seen",
    )

    def __init__(self, index: int, blocks: list[int]) -> None:
        self.index = index
        self.rid = f"r{index}"
        self.blocks = blocks
        # The plan, drawn at admission.
        self.hits = 0
        self.cache_saves = False
        self.pd = False
        self.clash = False
        self.raiser: str | None = None
        self.callback_fail: str | None = None
        # What happened: written by the connectors (ground truth) and the scheduler.
        self.raised: str | None = None
        self.loading = False
        self.answers: list[tuple[str, dict[str, Any] | None]] = []
        self.committed: list[str] = []
        #: Reports relayed: saver names, and ``"load:" + name`` for a load.
        self.seen: set[str] = set()
        self.cancel_applied = False
        self.handed_back = False
        self.finished_once = False
        #: The scheduler's cancel, called by the first connector asked at request_finished, as
        #: another thread's cancel would land while a slow connector answers.
        self.overtake: Callable[[SimRequest], None] | None = None


Tally = dict[tuple[str, str], int]


def count(tally: Tally, category: str, what: str, n: int = 1) -> None:
    """Add ``n`` to the tally of ``what`` under ``category``."""
    key = (category, what)
    tally[key] = tally.get(key, 0) + n

"""What each child's lookups came to, by child name: :class:`Hits`.

vLLM's own metrics count prefix-cache hits per engine, and per connector class at best; which
child of a composition served a hit is not seen (two children of one class collide). The
scheduler counts, per child *name*: lookups asked, hits (answers of more than 0 tokens), tokens
offered, loads chosen and their tokens, asynchronous loads completed and failed, and lookups
skipped because the child's health machine is open (``skipped``: each one a call a failing
child was spared), lookups not asked because the request's ``kv_transfer_params`` left the
child out (``excluded``) and requests whose key naming their loaders was refused (``refused``,
once per request: :mod:`~multiconnector.vllm.choice`). The counts reach vLLM's stats payload
each step (``"lookup.<count>"`` beside the failures' counts) and the Prometheus counter
``vllm:multiconnector_child_lookups{child, count}`` when the composition asks for them
(``child_hit_metrics: true``: vLLM's class has no such counts, and vLLM's stats log line
would show them); :meth:`Hits.counts` is the running total, always kept
(docs/vllm.md, "Hits per child").
"""

from __future__ import annotations

from typing import Final

__all__ = ["COUNTS", "LOOKUP", "Hits"]

#: The prefix of a lookup count in the stats payload: ``"lookup.<count>"``.
LOOKUP: Final = "lookup."
#: The counts kept per child, in the order they are shown.
COUNTS: Final = (
    "asked",
    "hits",
    "tokens_offered",
    "chosen",
    "tokens_chosen",
    "loads_completed",
    "loads_failed",
    "skipped",
    "excluded",
    "refused",
)


class Hits:
    """Per child name, per count of :data:`COUNTS`: the running totals and those not yet
    reported in the stats."""

    __slots__ = ("_tables", "_totals", "_unreported")

    def __init__(self, *, report: bool = False) -> None:
        """``report``: keep the counts not yet reported for :meth:`take_unreported` (else
        only the totals: nothing to take)."""
        self._totals: dict[str, dict[str, int]] = {}
        self._unreported: dict[str, dict[str, int]] = {}
        self._tables = (self._totals, self._unreported) if report else (self._totals,)

    def add(self, name: str, count: str, n: int = 1) -> None:
        for table in self._tables:
            per = table.get(name)
            if per is None:
                per = table[name] = {}
            per[count] = per.get(count, 0) + n

    def answered(self, name: str, tokens: int) -> None:
        """Child ``name``, asked (counted before it answers, so that a child that raises is
        asked too), answered ``tokens``, an int."""
        if tokens > 0:
            self.add(name, "hits")
            self.add(name, "tokens_offered", tokens)

    def chosen(self, name: str, tokens: int) -> None:
        self.add(name, "chosen")
        self.add(name, "tokens_chosen", tokens)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per child name, every count so far (a copy; a child never asked is absent)."""
        return {name: dict(per) for name, per in self._totals.items()}

    def take_unreported(self) -> dict[str, dict[str, int]]:
        """The counts since the last call, per child (empty when none)."""
        unreported = self._unreported
        if not unreported:
            return {}
        # Copied, then emptied in place: add() writes through self._tables, which holds this
        # very dict (rebinding the name would leave add() writing to the one handed out).
        taken = {name: dict(per) for name, per in unreported.items()}
        unreported.clear()
        return taken

"""Simulated connectors: the ground truth of who owes which report.

A :class:`SimConnector` answers the aggregator like a real connector and remembers, in its own
ledger, every save and load it committed to and has not finished. That ledger, never the
library's bookkeeping, is what the block pool consults before freeing anything. Shutting a
connector down aborts its transfers: it stops touching KV blocks, so it owes nothing any more
(the precondition of the unregister rule).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, final

from .records import SimRequest

__all__ = ["InjectedError", "SimCache", "SimConnector"]


class InjectedError(RuntimeError):
    """A failure the simulator injected on purpose."""


#: ``on_commit(connector, request, load)``: schedule the report of a committed save or load.
OnCommit = Callable[["SimConnector", "SimRequest", bool], None]


class SimConnector:
    """One registration of a simulated saving connector (``pd@<rank>``); see :class:`SimCache`.

    What it answers for a request comes from the request's plan, drawn by the simulator's seeded
    generator, so that a run is reproducible whatever thread calls it.
    """

    __slots__ = ("_lock", "dead", "fail_callbacks", "live", "loads", "name", "on_commit", "saves")

    def __init__(self, name: str, live: Mapping[str, SimRequest], on_commit: OnCommit) -> None:
        self.name = name
        self.live = live
        self.on_commit = on_commit
        self.dead = False
        self._lock = threading.Lock()
        #: Request ids whose save / load this connector committed to and has not finished. Dicts,
        #: not sets: their order is insertion order, whatever the string hash seed.
        self.saves: dict[str, None] = {}
        self.loads: dict[str, None] = {}
        #: Request ids whose ``on_finished`` callback must raise.
        self.fail_callbacks: dict[str, None] = {}

    # -- the connector interface ---------------------------------------------------------------

    def request_finished(
        self, request_id: str, blocks: Sequence[int]
    ) -> tuple[bool, Mapping[str, Any] | None]:
        req = self.live[request_id]
        name = self.name
        overtake = req.overtake
        if overtake is not None:  # a cancel lands while we are asked
            req.overtake = None
            overtake(req)
        if req.raiser == name:
            req.raised = name
            raise InjectedError(f"{name} failed while finishing {request_id}")
        params: dict[str, Any]
        if name == "cache":
            saves = req.cache_saves
            params = {"cache_blocks": len(blocks)}
        else:
            saves = req.pd
            params = {f"{name}_engine": name} if req.pd else {}
            if req.pd and req.clash:
                params["remote_engine_id"] = name
        with self._lock:
            if self.dead:  # asked after its shutdown: it saves nothing, says nothing
                saves, answer = False, None
            else:
                answer = params or None
                if saves:
                    self.saves[request_id] = None
        req.answers.append((name, answer))
        if saves:
            req.committed.append(name)
            self.on_commit(self, req, False)
        return saves, answer

    def on_finished(self, request_id: str, blocks: Sequence[int]) -> None:
        if request_id in self.fail_callbacks:
            del self.fail_callbacks[request_id]
            raise InjectedError(f"{self.name} failed in its on_finished callback")

    # -- the simulator's side ------------------------------------------------------------------

    def complete(self, request_id: str, load: bool) -> bool:
        """The transfer finished; whether it was still owed (``False``: aborted by shutdown)."""
        owed = self.loads if load else self.saves
        with self._lock:
            return owed.pop(request_id, False) is None

    def owes(self, request_id: str) -> tuple[bool, bool]:
        """Whether a save, and a load, of ``request_id`` are still owed."""
        return request_id in self.saves, request_id in self.loads

    def owed_saves(self) -> list[str]:
        """The request ids whose save this connector still owes, oldest first."""
        with self._lock:
            return list(self.saves)

    def shutdown(self) -> tuple[list[str], int]:
        """Abort every transfer in flight: the ids of the aborted saves, the number of loads."""
        with self._lock:
            self.dead = True
            aborted = list(self.saves)
            loads = len(self.loads)
            self.saves.clear()
            self.loads.clear()
        return aborted, loads

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}{', dead' if self.dead else ''})"


@final
class SimCache(SimConnector):
    """The local cache: saves like any connector, and can also load a request's prefix."""

    __slots__ = ()

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int:
        req = self.live[request_id]
        hits = req.hits
        with self._lock:
            if self.dead:
                return 0
            if hits:
                self.loads[request_id] = None
        if hits:
            self.on_commit(self, req, True)
        return hits

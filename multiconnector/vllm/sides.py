"""Each vLLM child as the core's aggregator sees it: one adapter per role.

The aggregator (:class:`multiconnector.MultiConnector`) asks its connectors by request id; vLLM's
children want the live ``Request``. A side holds its child and its owner (the vLLM-facing
connector), which keeps the live requests and the call's context.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, final

from .errors import WrongRoleError

__all__ = ["SchedulerOwner", "SchedulerSide", "Side", "WorkerOwner", "WorkerSide"]


class SchedulerOwner(Protocol):
    """What a scheduler side asks the connector that owns it (and nothing else)."""

    def live_request(self, request_id: str) -> Any: ...

    def finish_groups(self) -> tuple[list[int], ...] | None: ...

    def took_tail(self, request_id: str, name: str) -> bool: ...


class WorkerOwner(Protocol):
    """What a worker side asks the connector that owns it."""

    def planned_loader(self, request_id: str) -> str | None: ...


class Side:
    """One child as the core sees it; the stats and shutdown parts are the same on both roles."""

    __slots__ = ("child", "name")

    def __init__(self, name: str, child: Any) -> None:
        self.name = name
        self.child = child

    def get_stats(self) -> Any:
        return self.child.get_kv_connector_stats()

    def shutdown(self) -> None:
        self.child.shutdown()


@final
class SchedulerSide(Side):
    """Scheduler role: asks the vLLM child, passing the live ``Request`` object.

    One match asks the children in configuration order; a child answering ``None`` (still
    looking up) ends it: :attr:`lookup` is the match's flag, shared by every side of one owner
    (like vLLM's, the later children are not asked).
    """

    __slots__ = ("load_async", "lookup", "owner")

    def __init__(self, owner: SchedulerOwner, name: str, child: Any, lookup: list[bool]) -> None:
        super().__init__(name, child)
        self.owner = owner
        #: ``[True]`` once a child of the current match answered ``None``; the owner resets it.
        self.lookup = lookup
        #: The requests this child's last match would load asynchronously (only those: the
        #: common case, no asynchronous load, writes nothing).
        self.load_async: dict[str, bool] = {}

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int | None:
        lookup = self.lookup
        if lookup[0]:
            # An earlier child is still looking up: like vLLM's, the later ones are not asked.
            return None
        tokens, load_async = self.child.get_num_new_matched_tokens(
            self.owner.live_request(request_id), num_computed_tokens
        )
        if tokens is None:
            lookup[0] = True
            return None
        if load_async:
            self.load_async[request_id] = True
        elif self.load_async:
            self.load_async.pop(request_id, None)  # an earlier match's answer
        return int(tokens)

    def request_finished(self, request_id: str, blocks: Sequence[Any]) -> tuple[Any, Any]:
        """``blocks`` is one group's block ids; every group's come from the owner, if set.

        The child's answer goes to the core as it is (a child that took the partial tail at
        finish answers ``True``: it owes a report as a saver does); the core's record then
        awaits the savers, and the owner tells the workers their names.
        """
        owner = self.owner
        request = owner.live_request(request_id)
        groups = owner.finish_groups()
        if groups is not None:
            saves, params = self.child.request_finished_all_groups(request, groups)
        else:
            saves, params = self.child.request_finished(request, blocks)
        if saves is False and owner.took_tail(request_id, self.name):
            return True, params
        return saves, params


@final
class WorkerSide(Side):
    """Worker role: answers from the plan the scheduler sent in the connector metadata."""

    __slots__ = ("owner",)

    def __init__(self, owner: WorkerOwner, name: str, child: Any) -> None:
        super().__init__(name, child)
        self.owner = owner

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int:
        return 1 if self.owner.planned_loader(request_id) == self.name else 0

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, None]:
        # Never asked: a worker learns who saves a request from the connector metadata, and
        # its ledger awaits them. Answering anything here could free blocks early.
        raise WrongRoleError("a worker learns who saves a request from the connector metadata")

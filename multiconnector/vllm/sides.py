"""Each vLLM child as the core's aggregator sees it: one adapter per role.

The aggregator (:class:`multiconnector.MultiConnector`) asks its connectors by request id; vLLM's
children want the live ``Request``. A side holds its child and its owner (the vLLM-facing
connector), which keeps the live requests and the call's context.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, final

from .errors import WrongRoleError

if TYPE_CHECKING:
    from .connector import MultiConnector

__all__ = ["SchedulerSide", "Side", "WorkerSide"]


class Side:
    """One child as the core sees it; the stats and shutdown parts are the same on both roles."""

    __slots__ = ("child", "name", "owner")

    def __init__(self, owner: MultiConnector, name: str, child: Any) -> None:
        self.owner = owner
        self.name = name
        self.child = child

    def get_stats(self) -> Any:
        return self.child.get_kv_connector_stats()

    def shutdown(self) -> None:
        self.child.shutdown()


@final
class SchedulerSide(Side):
    """Scheduler role: asks the vLLM child, passing the live ``Request`` object."""

    __slots__ = ("load_async",)

    def __init__(self, owner: MultiConnector, name: str, child: Any) -> None:
        super().__init__(owner, name, child)
        #: The requests this child's last match would load asynchronously (only those: the
        #: common case, no asynchronous load, writes nothing).
        self.load_async: dict[str, bool] = {}

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int | None:
        owner = self.owner
        if owner._lookup_pending:
            # An earlier child is still looking up: like vLLM's, the later ones are not asked.
            return None
        tokens, load_async = self.child.get_num_new_matched_tokens(
            owner._live[request_id], num_computed_tokens
        )
        if tokens is None:
            owner._lookup_pending = True
            return None
        if load_async:
            self.load_async[request_id] = True
        elif self.load_async:
            self.load_async.pop(request_id, None)  # an earlier match's answer
        return int(tokens)

    def request_finished(self, request_id: str, blocks: Sequence[Any]) -> tuple[bool, Any]:
        """``blocks`` is one group's block ids; every group's are ``owner._all_groups``, if set."""
        owner = self.owner
        request = owner._live[request_id]
        groups = owner._all_groups
        if groups is not None:
            saves, params = self.child.request_finished_all_groups(request, groups)
        else:
            saves, params = self.child.request_finished(request, blocks)
        # A child that took the partial tail at finish also owes a "finished sending" report.
        tails = owner._tail_savers
        if saves is True or (saves is False and tails and self.name in tails.get(request_id, ())):
            # The workers await this save (the metadata names it), not the scheduler's books:
            # to the core it is no save here.
            owner._handed_off.append(self.name)
            return False, params
        return saves, params  # False, or garbage the core awaits (on the scheduler) and reports


@final
class WorkerSide(Side):
    """Worker role: answers from the plan the scheduler sent in the connector metadata."""

    __slots__ = ()

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int:
        return 1 if self.owner._load_plan.get(request_id) == self.name else 0

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, None]:
        # Never asked: a worker finishes a request with the names the scheduler sent, through
        # MultiConnector.request_finished_by. Answering anything here could free blocks early.
        raise WrongRoleError("a worker learns who saves a request from the connector metadata")

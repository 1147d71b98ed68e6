"""Each vLLM child as the core's aggregator sees it: one adapter per role.

The aggregator (:class:`multiconnector.MultiConnector`) asks its connectors by request id; vLLM's
children want the live ``Request``. A side holds its child, its owner (the vLLM-facing
connector), which it asks only through :class:`SchedulerOwner` or :class:`WorkerOwner`, and, on
the scheduler, the :class:`Call` its owner's sides share.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Integral
from typing import Any, Final, Protocol, final

from .._validate import shown
from ..errors import InvalidArgumentError, InvalidValueError
from ..registry import Role
from .config import PATIENCE_KEY
from .errors import LookupPatienceError, WrongRoleError
from .hits import Hits

__all__ = ["GAVE_UP", "SchedulerOwner", "SchedulerSide", "Side", "WorkerOwner", "WorkerSide"]

#: In :attr:`SchedulerSide.waits`: the child answered ``None`` past its patience.
GAVE_UP: Final = -1


class SchedulerOwner(Protocol):
    """What a scheduler side asks the connector that owns it (and nothing else)."""

    def live_request(self, request_id: str) -> Any: ...

    def finish_groups(self) -> tuple[list[int], ...] | None: ...

    def took_tail(self, request_id: str, name: str) -> bool: ...


class WorkerOwner(Protocol):
    """What a worker side asks the connector that owns it."""

    def planned_loader(self, request_id: str) -> str | None: ...


class Call:
    """What the sides of one connector tell it about the call in progress: whether a child of
    the current match is still looking up (under the ``first`` lookup policy the later ones are
    then not asked, as in vLLM's), and which children committed to a save during the current
    ``request_finished``. The owner starts each call with :meth:`start` and reads
    :attr:`handed_off` after it. ``asks_all``: the ``longest`` policy, which asks every child;
    ``patience``: how many ``None`` answers in a row a child may give a request under it."""

    __slots__ = ("asks_all", "handed_off", "looking_up", "patience")

    def __init__(self, *, asks_all: bool = False, patience: int = 64) -> None:
        self.looking_up = False
        self.handed_off: list[str] = []
        self.asks_all = asks_all
        self.patience = patience

    def start(self) -> None:
        self.looking_up = False
        if self.handed_off:
            self.handed_off = []


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
    """Scheduler role: asks the vLLM child, passing the live ``Request`` object."""

    __slots__ = ("call", "failed_loads", "hands_off", "hits", "load_async", "owner", "waits")

    def __init__(
        self,
        owner: SchedulerOwner,
        name: str,
        child: Any,
        call: Call,
        *,
        role: Role = Role.both,
        hits: Hits | None = None,
    ) -> None:
        super().__init__(name, child)
        self.owner = owner
        self.call = call
        #: The owner's counts of each child's lookups (:mod:`~multiconnector.vllm.hits`).
        self.hits = Hits() if hits is None else hits
        #: Whether a save this child commits to is handed off to the workers: not for a
        #: load-only child, whose answer goes to the core as it is (a promised save is then
        #: the core's RoleError, that child's failure, and nobody awaits it).
        self.hands_off = role is not Role.load
        #: The requests this child's last match would load asynchronously (only those: the
        #: common case, no asynchronous load, writes nothing).
        self.load_async: dict[str, bool] = {}
        #: The requests whose load by this child failed: it is not asked again for them (a
        #: request vLLM reschedules after a failed load would otherwise fail the same way).
        self.failed_loads: set[str] = set()
        #: Under the ``longest`` policy, the requests this child answered ``None`` in a row,
        #: with how many times (:data:`GAVE_UP` once past the call's patience: it is then not
        #: asked again for that request); until it answers or the request finishes.
        self.waits: dict[str, int] = {}

    def forget(self, request_id: str) -> None:
        """``request_id`` finished: nothing of it is kept."""
        if self.load_async:
            self.load_async.pop(request_id, None)
        if self.failed_loads:
            self.failed_loads.discard(request_id)
        if self.waits:
            self.waits.pop(request_id, None)

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int | None:
        call = self.call
        if call.looking_up and not call.asks_all:
            # An earlier child is still looking up: like vLLM's, the later ones are not asked.
            return None
        if self.failed_loads and request_id in self.failed_loads:
            return 0
        if self.waits and self.waits.get(request_id) == GAVE_UP:
            return 0
        request = self.owner.live_request(request_id)
        self.hits.add(self.name, "asked")
        answer = self.child.get_num_new_matched_tokens(request, num_computed_tokens)
        if answer.__class__ is not tuple or len(answer) != 2:
            raise InvalidArgumentError(
                f"child {self.name!r} answered get_num_new_matched_tokens with "
                f"{shown(answer)}; must be a (tokens, load_async) pair"
            )
        tokens, load_async = answer
        if tokens is None:
            if call.asks_all:
                self._wait(request_id, call.patience)
            call.looking_up = True
            return None
        if self.waits:
            self.waits.pop(request_id, None)
        if tokens.__class__ is not int:
            if isinstance(tokens, bool) or not isinstance(tokens, Integral):
                raise InvalidArgumentError(
                    f"child {self.name!r} answered tokens={shown(tokens)}; must be an int or None"
                )
            tokens = int(tokens)
        if tokens > 0:
            total = getattr(request, "num_tokens", None)  # an int on vLLM's Request
            if total.__class__ is int and tokens > total - num_computed_tokens:
                raise InvalidValueError(
                    f"child {self.name!r} answered tokens={tokens} for a request with "
                    f"{total - num_computed_tokens} token(s) left to compute"
                )
            if load_async is not True and load_async is not False:
                raise InvalidArgumentError(
                    f"child {self.name!r} answered load_async={shown(load_async)}; must be a bool"
                )
        self.hits.answered(self.name, tokens)
        if load_async:
            self.load_async[request_id] = True
        elif self.load_async:
            self.load_async.pop(request_id, None)  # an earlier match's answer
        return tokens  # a negative count is the core's to refuse (with the child's name)

    def _wait(self, request_id: str, patience: int) -> None:
        """One more ``None`` answer for ``request_id``; past ``patience`` in a row, a
        :class:`LookupPatienceError` (the child's failure: no hit) and no more asking."""
        waited = self.waits.get(request_id, 0) + 1
        if waited <= patience:
            self.waits[request_id] = waited
            return
        self.waits[request_id] = GAVE_UP
        raise LookupPatienceError(
            f"child {self.name!r} answered None (still looking up) for request {request_id!r} "
            f"{patience} times in a row: the lookup goes on without it for this request "
            f"(kv_connector_extra_config[{PATIENCE_KEY!r}])"
        )

    def request_finished(self, request_id: str, blocks: Sequence[Any]) -> tuple[bool, Any]:
        """``blocks`` is one group's block ids; every group's come from the owner, if set."""
        owner = self.owner
        request = owner.live_request(request_id)
        groups = owner.finish_groups()
        if groups is not None:
            saves, params = self.child.request_finished_all_groups(request, groups)
        else:
            saves, params = self.child.request_finished(request, blocks)
        # A child that took the partial tail at finish also owes a "finished sending" report.
        if not self.hands_off:
            return saves, params
        if saves is True or (saves is False and owner.took_tail(request_id, self.name)):
            # The workers await this save (the metadata names it), not the scheduler's books:
            # to the core it is no save here.
            self.call.handed_off.append(self.name)
            return False, params
        return saves, params  # False, or garbage the core awaits (on the scheduler) and reports


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
        # Never asked: a worker finishes a request with the names the scheduler sent, through
        # its ledger. Answering anything here could free blocks early.
        raise WrongRoleError("a worker learns who saves a request from the connector metadata")

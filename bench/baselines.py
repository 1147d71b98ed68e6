"""What the aggregator is measured against, written from descriptions, not copied.

* :class:`VllmStyleBookkeeping` keeps the books the way vLLM's ``MultiConnector`` is described
  to: a dict of request id -> index of the connector chosen to load it, a dict of *extra*
  asynchronous-save counts (savers beyond the first) decremented once per report, and the finished
  ids of every connector merged with set unions. It checks nothing: a report for an unknown id, a
  duplicate or a report from a connector that never saved is counted like any other. It calls the
  same connectors' ``request_finished`` as the aggregator does, so the comparison is like for like.
* :class:`MachinePerRequest` creates a ``transitions.Machine`` for every request, attached to a
  model object, from the very declaration the aggregator compiles
  (:data:`multiconnector.machine.TRANSITIONS`): what one would write first with ``transitions``.
* :class:`UnguardedFloor` is the aggregator's own data layout and happy path with every
  safeguard taken out: a yardstick for what the guarantees cost, never a thing to use.
* :class:`TrivialConnector` is the connector they are driven with: it always saves
  asynchronously and returns one key of its own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

from transitions import Machine

from multiconnector import merge_transfer_params
from multiconnector.machine import DECISIONS, INITIAL, STATES, TRANSITIONS, RequestTransferState

__all__ = ["MachinePerRequest", "TrivialConnector", "UnguardedFloor", "VllmStyleBookkeeping"]


class TrivialConnector:
    """Saves every request asynchronously and contributes ``{key: 1}`` (a new dict each time)."""

    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key

    def request_finished(
        self, request_id: str, blocks: Sequence[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        return True, {self.key: 1}


class VllmStyleBookkeeping:
    """Count-and-position bookkeeping, as vLLM's ``MultiConnector`` is described.

    ``transfer_finished`` takes the connector's *index*, as vLLM's workers report per position;
    ``take`` is the aggregation step (vLLM's ``get_finished``): it walks every connector's reports,
    decrements the extra-save counts and returns the union of ids whose last save came in.
    """

    def __init__(self, connectors: Sequence[Any]) -> None:
        self._connectors = list(connectors)
        self._requests_to_connector: dict[str, int] = {}
        self._extra_async_saves: dict[str, int] = {}
        self._sent: list[set[str]] = [set() for _ in self._connectors]

    def begin(self, request_id: str) -> None:
        """Nothing to do: a request is only remembered once a connector is chosen to load it."""

    def request_finished(
        self, request_id: str, blocks: Sequence[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        async_saves = 0
        params: dict[str, Any] | None = None
        for connector in self._connectors:
            saves, extra = connector.request_finished(request_id, blocks)
            if saves:
                async_saves += 1
            if extra is not None:
                if params is None:
                    params = extra
                else:
                    if set(params) & set(extra):
                        raise RuntimeError("key clash in transfer params")
                    params.update(extra)
        if async_saves > 1:
            self._extra_async_saves[request_id] = async_saves - 1
        self._requests_to_connector.pop(request_id, None)
        return async_saves > 0, params

    def transfer_finished(self, request_id: str, index: int) -> None:
        self._sent[index].add(request_id)

    def take(self) -> set[str]:
        finished: set[str] = set()
        extra = self._extra_async_saves
        for sent in self._sent:
            for request_id in sent:
                pending = extra.get(request_id)
                if pending is None:
                    finished.add(request_id)
                elif pending == 1:
                    del extra[request_id]
                else:
                    extra[request_id] = pending - 1
            sent.clear()
        return finished


class _Model:
    """A request as a ``transitions`` model: a plain object the machine adds methods to."""

    has_savers = RequestTransferState.has_savers
    is_last = RequestTransferState.is_last

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.awaiting: tuple[str, ...] = ()
        self.state = INITIAL.value


class MachinePerRequest:
    """A ``transitions.Machine`` per request, with the same guards and the same rules."""

    def __init__(self, connectors: dict[str, Any]) -> None:
        self._connectors = dict(connectors)
        self._requests: dict[str, _Model] = {}
        self._done: deque[_Model] = deque()
        self._states = [s.value for s in STATES]

    def begin(self, request_id: str) -> None:
        model = _Model(request_id)
        Machine(
            model=model,
            states=self._states,
            initial=INITIAL.value,
            transitions=[dict(t) for t in TRANSITIONS],
            auto_transitions=False,
        )
        self._requests[request_id] = model

    def request_finished(
        self, request_id: str, blocks: Sequence[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        model = self._requests[request_id]
        savers: list[str] = []
        contributions = []
        for name, connector in self._connectors.items():
            saves, params = connector.request_finished(request_id, blocks)
            if saves:
                savers.append(name)
            contributions.append((name, params))
        merged = merge_transfer_params(contributions)
        awaited = tuple(savers)
        model.trigger("request_finished", awaited)  # type: ignore[attr-defined]
        model.awaiting = awaited
        if model.state == "finished":
            self._done.append(model)
        return bool(awaited), merged

    def transfer_finished(self, request_id: str, name: str) -> bool:
        model = self._requests.get(request_id)
        if model is None or name not in model.awaiting:
            return False
        model.trigger("transfer_finished", name)  # type: ignore[attr-defined]
        model.awaiting = tuple(n for n in model.awaiting if n != name)
        if model.state == "finished":
            self._done.append(model)
        return True

    def take(self) -> list[_Model]:
        taken = list(self._done)
        self._done.clear()
        for model in taken:
            del self._requests[model.request_id]
        return taken


class UnguardedFloor:
    """The aggregator's bookkeeping with every safeguard taken out: a yardstick, not a product.

    The same records (:class:`RequestTransferState`), the same connectors asked the same way, the
    same merge of plain dicts, the same shared awaited-name tuples and successors, the states
    from the same declaration. Taken out: locks, argument checks, guard calls (the destination is
    chosen from what the guard would answer), the params key checks, counters, and any refusal
    or classification of a bad event. On a good workload it keeps the same books as
    :class:`multiconnector.MultiConnector`; on a bad one it corrupts them (a duplicate report can
    free a request early, an unknown one raises ``KeyError``). The aggregator's time minus this
    one's is what the guarantees cost.
    """

    def __init__(self, connectors: dict[str, Any]) -> None:
        self._connectors = tuple(connectors.items())
        self._requests: dict[str, RequestTransferState] = {}
        self._done: list[RequestTransferState] = []
        self._without: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {}
        self._names: dict[tuple[str, ...], tuple[str, ...]] = {}
        # (destination when the guard holds, when it does not): read from the declaration.
        _, self._saving, self._not_saving = DECISIONS["request_finished"][INITIAL]
        finishing = self._saving
        assert finishing is not None
        _, self._last, _ = DECISIONS["transfer_finished"][finishing]

    def begin(self, request_id: str) -> None:
        self._requests[request_id] = RequestTransferState(request_id)

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> dict[str, Any] | None:
        record = self._requests[request_id]
        savers: list[str] = []
        merged: dict[str, Any] | None = None
        for name, connector in self._connectors:
            saves, params = connector.request_finished(request_id, blocks)
            if saves:
                savers.append(name)
            if params is not None:
                if merged is None:
                    merged = params.copy()
                else:
                    merged |= params
        awaited = self._names.setdefault(tuple(savers), tuple(savers))
        record.awaiting = record.expected = awaited
        record.params = merged
        dest = self._saving if awaited else self._not_saving
        assert dest is not None
        record.state = dest
        if not awaited:
            self._done.append(record)
        return merged

    def transfer_finished_many(self, name: str, request_ids: Sequence[str]) -> None:
        requests, without, done = self._requests, self._without, self._done
        for request_id in request_ids:
            record = requests[request_id]
            awaiting = record.awaiting
            rest = without.setdefault(awaiting, {}).get(name)
            if rest is None:
                rest = tuple([n for n in awaiting if n != name])
                rest = without[awaiting][name] = self._names.setdefault(rest, rest)
            record.awaiting = rest
            if not rest:
                assert self._last is not None
                record.state = self._last
                done.append(record)

    def take(self) -> list[RequestTransferState]:
        taken, self._done = self._done, []
        requests = self._requests
        for record in taken:
            del requests[record.request_id]
        return taken

"""The scheduler side of the vLLM-facing connector: :class:`SchedulerRole`.

The calls vLLM makes on the scheduler's connector: it chooses the child that loads each request,
builds each step's metadata, merges the children's params when a request finishes and tells the
workers, by name, which children save it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

from .._validate import shown
from ..errors import InvalidArgumentError, ShutDownError
from ..machine import State
from ..outcome import Outcome
from ._base import SKIP, ConnectorBase, OneGets
from .config import without_hma
from .errors import HMAUnsupportedError
from .wire import (
    NamedHandshakeMetadata,
    NamedKVEvents,
    NamedMultiConnectorMetadata,
    NamedMultiConnectorWorkerMetadata,
)

__all__ = ["SchedulerRole"]


def _named(value: Any, kind: type[Any], what: str) -> Any:
    """``value`` if it is ``None`` or a ``kind``; else an :class:`InvalidArgumentError`."""
    if value is not None and not isinstance(value, kind):
        raise InvalidArgumentError(f"{what}={shown(value)} must be a {kind.__name__}")
    return value


class SchedulerRole(ConnectorBase):
    """The scheduler-side methods of vLLM's connector interface."""

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        # Not super(): it would bind the block pool to every child a second time.
        self._kv_cache_manager = kv_cache_manager
        self._each("bind_kv_cache_manager", kv_cache_manager)

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        self._each("bind_gpu_block_pool", gpu_block_pool)

    def on_new_request(self, request: Any) -> None:
        self._ensure(request)
        self._each("on_new_request", request)

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """The first child, in configuration order, with tokens to load becomes the loader.

        As in vLLM's: a child answering ``None`` (still looking up) makes the answer
        ``(None, False)``, and the children after it are not asked.
        """
        request_id = self._ensure(request)
        self._lookup[0] = False
        tokens = self._tracker.match_tokens(request_id, num_computed_tokens)
        if not tokens:
            return tokens, False
        loader = self._loader(request_id)
        assert loader is not None
        return tokens, self._sides[loader].load_async.get(request_id, False)

    def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:
        loader = self._loader(request.request_id)
        if loader is None:
            return super().get_loaded_kv_cache_group_ids(request)  # type: ignore[no-any-return]
        return self._children[loader].get_loaded_kv_cache_group_ids(request)  # type: ignore[no-any-return]

    def get_external_cache_hit_sources(
        self, request: Any, num_external_tokens: int
    ) -> dict[Any, int]:
        loader = self._loader(request.request_id)
        if loader is None:
            return super().get_external_cache_hit_sources(request, num_external_tokens)  # type: ignore[no-any-return]
        return self._children[loader].get_external_cache_hit_sources(  # type: ignore[no-any-return]
            request, num_external_tokens
        )

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """The loader gets ``num_external_tokens``; every other child gets 0 and the blocks."""
        request_id = request.request_id
        loader = self._loader(request_id)
        self._each(
            "update_state_after_alloc", request, blocks, own=OneGets(loader, num_external_tokens, 0)
        )
        if (
            num_external_tokens > 0
            and loader is not None
            and self._sides[loader].load_async.get(request_id, False)
        ):
            self._new_loads[request_id] = loader
            self._loads_in_flight.add(request_id)

    def build_connector_meta(self, scheduler_output: Any) -> NamedMultiConnectorMetadata:
        children = self._each("build_connector_meta", scheduler_output, answers=True) or {}
        # Built by this connector: the dicts are new and the saver names tuples, so the
        # metadata takes them as they are instead of copying them.
        metadata = NamedMultiConnectorMetadata.owning(children, self._new_savers, self._new_loads)
        self._new_savers = {}
        self._new_loads = {}
        return metadata

    def update_connector_output(self, connector_output: Any) -> None:
        """Each child sees the output with its own worker metadata and its own KV cache events
        (by name); then the workers' reports go to the core's books, and vLLM is shown the
        completions the core's rule makes due: one per request.

        vLLM calls this before it acts on ``finished_sending`` and ``finished_recving``. A
        request whose saves were handed off is held by the core (``finishing``) until every
        saver reported, and its load too if one is in flight: its one completion is the
        "finished sending" shown in the step the last of them reported, and its load's
        "finished recving" is taken out (the load is applied to the books).
        """
        worker_meta = _named(
            connector_output.kv_connector_worker_meta,
            NamedMultiConnectorWorkerMetadata,
            "kv_connector_worker_meta",
        )
        events = _named(connector_output.kv_cache_events, NamedKVEvents, "kv_cache_events")
        self._route_output(connector_output, worker_meta, events)
        recving = connector_output.finished_recving
        if recving:
            self._loads_done(recving)
            saving = self._saving
            if saving and not saving.keys().isdisjoint(recving):
                connector_output.finished_recving = {r for r in recving if r not in saving} or None
        sent = connector_output.finished_sending
        if sent:
            self._sent_everywhere(sent)
        if worker_meta is not None and worker_meta.sent:
            self._count_sent(worker_meta.sent)
        connector_output.finished_sending = self._completions()

    def _route_output(self, connector_output: Any, worker_meta: Any, events: Any) -> None:
        """Every child's ``update_connector_output``; with worker metadata or KV cache events,
        each child gets a shallow copy of the output holding its own entries of them instead
        of ours (the completion sets are shared)."""
        if worker_meta is None and events is None:
            self._each("update_connector_output", connector_output)
            return
        own: dict[str, Any] = {}
        for name in self._children:
            mine = copy.copy(connector_output)
            if worker_meta is not None:
                mine.kv_connector_worker_meta = worker_meta.children.get(name)
            if events is not None:
                mine.kv_cache_events = events.children.get(name)
            own[name] = mine
        self._each("update_connector_output", own=own)

    def _loads_done(self, recving: set[str]) -> None:
        """Every worker reported these loads (vLLM's aggregator): the loader's report, to the
        core's books."""
        tracker = self._tracker
        in_flight = self._loads_in_flight
        for request_id in recving:
            in_flight.discard(request_id)
            loader = self._loader(request_id)
            if loader is not None:
                tracker.load_finished(request_id, loader)

    def _sent_everywhere(self, sent: set[str]) -> None:
        """Every worker reported these requests finished sending: each worker's ledger heard
        every saver that reports on every worker. Those savers' reports, to the core's books,
        one batch per saver (a step's requests mostly share one tuple of savers)."""
        saving = self._saving
        counted = self._counted
        by_savers: dict[tuple[str, ...], list[str]] = {}
        for request_id in sent:
            savers = saving.get(request_id)
            if savers is not None:
                by_savers.setdefault(savers, []).append(request_id)
        tracker = self._tracker
        for savers, request_ids in by_savers.items():
            for name in savers:
                if name not in counted:
                    tracker.transfer_finished_many(name, request_ids)

    def _count_sent(self, sent: Mapping[str, Mapping[str, int]]) -> None:
        """``sent[name][r]`` workers reported counted saver ``name`` finished sending ``r``: its
        report goes to the core's books once ``name``'s count of workers reported."""
        owed = self._counted_owed
        tracker = self._tracker
        for name, counts in sent.items():
            for request_id, n in counts.items():
                mine = owed.get(request_id)
                if mine is None or name not in mine:
                    self._counted_outcome(name, request_id, mine)
                    continue
                left = mine[name] - n
                if left > 0:
                    mine[name] = left
                    continue
                del mine[name]
                if not mine:
                    del owed[request_id]
                tracker.transfer_finished(request_id, name)

    def _completions(self) -> set[str] | None:
        """The handed-off requests the core let go of: each one's one completion for vLLM."""
        taken = self._tracker.take()
        if not taken:
            return None
        saving = self._saving
        done: set[str] = set()
        for record in taken:
            if saving.pop(record.request_id, None) is not None:
                done.add(record.request_id)
        return done or None

    def _counted_outcome(self, name: str, request_id: str, owed: dict[str, int] | None) -> None:
        """Count why a counted report is ignored: the request owes no counted report
        (``unknown_request``), or none of ``name`` (``duplicate`` if ``name`` saves it and its
        count was reached, else ``phantom``)."""
        if owed is None:
            outcome = Outcome.unknown_request
        elif name in self._saving.get(request_id, ()):
            outcome = Outcome.duplicate
        else:
            outcome = Outcome.phantom
        key = (outcome, name)
        self._counted_outcomes[key] = self._counted_outcomes.get(key, 0) + 1

    def register_finished_partial_tail(
        self,
        request: Any,
        block_ids: tuple[list[int], ...],
        partial_tail_offloads: list[tuple[int, int, int]],
    ) -> bool:
        accepted = self._each(
            "register_finished_partial_tail",
            request,
            block_ids,
            partial_tail_offloads,
            answers=True,
        )
        names = tuple(name for name, took in (accepted or {}).items() if took)
        if names:
            self._tail_savers[request.request_id] = names
        return bool(names)

    def request_finished(
        self, request: Any, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Ask every child; merge params into a new dict; tell workers who saves, by name.

        A params clash raises :class:`~multiconnector.KeyClashError` once the bookkeeping is
        consistent: the children that committed to a save are still awaited and still sent to
        the workers, so no block is freed under a save in progress.
        """
        return self._finish(request, block_ids, all_groups=False)

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """:meth:`request_finished` with every KV cache group's block ids (``SupportsHMA``).

        As in vLLM's: when every child supports HMA each is asked its
        ``request_finished_all_groups``; otherwise there must be exactly one group, and each
        child is asked its ``request_finished`` with that group's blocks. The guarantees are
        :meth:`request_finished`'s.
        """
        if self._all_support_hma:
            return self._finish(request, block_ids, all_groups=True)
        if not isinstance(block_ids, tuple | list) or len(block_ids) != 1:
            raise HMAUnsupportedError(
                f"block_ids={shown(block_ids)} must hold exactly one KV cache group's block ids: "
                f"these children do not support HMA: {without_hma(tuple(self._specs.values()))}"
            )
        return self._finish(request, block_ids[0], all_groups=False)

    def _finish(
        self, request: Any, blocks: Any, *, all_groups: bool
    ) -> tuple[bool, dict[str, Any] | None]:
        if request.request_id in self._saving:
            # Finished before and its saves handed off: a duplicate, which asks nobody (as the
            # core refuses a second request_finished); vLLM still holds the blocks.
            return True, None
        request_id = self._ensure(request)
        tracker = self._tracker
        # Every group's block ids travel beside the core's call (it takes one flat list).
        self._all_groups = blocks if all_groups else None
        try:
            _, params = tracker.request_finished(request_id, () if all_groups else blocks)
        finally:
            self._all_groups = None
            savers = self._hand_off(request_id)
            self._forget(request_id)
            tracker.take()  # a request with no save and no load in flight: vLLM frees it now
        return bool(savers), params

    def _hand_off(self, request_id: str) -> tuple[str, ...]:
        """The core's record of a finished request awaits its savers (the children that
        committed to a save, a garbage answer conservatively among them): the workers are told
        them, by name, and the core holds the record until they reported."""
        record = self._tracker.peek(request_id)
        if record is None or record.state is not State.finishing or not record.awaiting:
            return ()
        savers = self._shared_savers(record.awaiting)
        self._new_savers[request_id] = savers
        self._saving[request_id] = savers
        if self._counted:
            self._owe_counted(request_id, savers)
        return savers

    def _forget(self, request_id: str) -> None:
        """What the scheduler kept for a request while it ran; and a load that will not report
        (a synchronous one ends within its step, one never started never ends), drained."""
        self._live.pop(request_id, None)
        if self._tail_savers:
            self._tail_savers.pop(request_id, None)
        for side in self._sides.values():
            if side.load_async:
                side.load_async.pop(request_id, None)
        tracker = self._tracker
        record = tracker.peek(request_id)
        if (
            record is not None
            and record.loader is not None
            and not record.loaded
            and request_id not in self._loads_in_flight
        ):
            # Counted as the loader's drained load; after shutdown() nothing is (the books stay
            # as they are).
            with suppress(ShutDownError):
                tracker.load_finished(request_id, record.loader)

    # -- what the sides ask (SchedulerOwner) ----------------------------------------------------

    def live_request(self, request_id: str) -> Any:
        """The live vLLM ``Request`` of ``request_id``."""
        return self._live[request_id]

    def finish_groups(self) -> tuple[list[int], ...] | None:
        """Every KV cache group's block ids while request_finished_all_groups asks the children;
        else ``None``."""
        return self._all_groups

    def took_tail(self, request_id: str, name: str) -> bool:
        """Whether child ``name`` took ``request_id``'s partial tail at finish (it owes a
        "finished sending" report as a saver does)."""
        tails = self._tail_savers
        return bool(tails) and name in tails.get(request_id, ())

    def _owe_counted(self, request_id: str, savers: tuple[str, ...]) -> None:
        counted = self._counted
        owed = {name: counted[name] for name in savers if name in counted}
        if owed:
            self._counted_owed[request_id] = owed

    def _shared_savers(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The one tuple equal to ``names`` that every request with these savers shares."""
        shared = self._saver_tuples.get(names)
        if shared is None:
            shared = self._saver_tuples.setdefault(names, names)
        return shared

    def take_events(self) -> list[Any]:
        events: list[Any] = []
        for found in (self._each("take_events", answers=True, then=list) or {}).values():
            events.extend(found)
        return events

    def has_pending_block_frees(self) -> bool:
        return any(c.has_pending_block_frees() for c in self._children.values())

    def has_pending_push_work(self) -> bool:
        return any(c.has_pending_push_work() for c in self._children.values())

    def set_xfer_handshake_metadata(self, metadata: dict[int, Any]) -> None:
        """Each child gets its own entries of :class:`NamedHandshakeMetadata`, by name."""
        self._route_handshake(metadata, "set_xfer_handshake_metadata")

    def set_xfer_handshake_metadata_pp_aware(self, metadata: dict[tuple[int, int], Any]) -> None:
        self._route_handshake(metadata, "set_xfer_handshake_metadata_pp_aware")

    def _route_handshake(self, metadata: Mapping[Any, Any], method: str) -> None:
        own: dict[str, Any] = {}
        for name in self._children:
            mine = {
                rank: meta.children[name]
                for rank, meta in metadata.items()
                if isinstance(meta, NamedHandshakeMetadata) and name in meta.children
            }
            own[name] = mine or SKIP  # a child with no entries is not called
        self._each(method, own=own)

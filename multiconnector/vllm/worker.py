"""The worker side of the vLLM-facing connector: :class:`WorkerRole`.

The calls vLLM makes on each worker's connector: the KV caches, the per-layer loads and saves,
and the completions. A worker reports a request finished sending only once every name the
scheduler said saves it has reported, and passes on one load completion per load.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

from ..errors import InvalidArgumentError
from ..outcome import Outcome
from ._base import ConnectorBase, _failed
from .wire import NamedHandshakeMetadata, NamedMultiConnectorWorkerMetadata

__all__ = ["WorkerRole"]


class WorkerRole(ConnectorBase):
    """The worker-side methods of vLLM's connector interface."""

    def get_mem_pool_context(self) -> AbstractContextManager[Any] | None:
        contexts = self._present("get_mem_pool_context")
        if len(contexts) > 1:
            raise ValueError(
                f"child connectors {sorted(contexts)} each provide a KV cache memory pool; "
                "the KV cache is allocated once, in one pool: configure at most one"
            )
        return next(iter(contexts.values()), None)

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self._gather("register_kv_caches", lambda _, c: c.register_kv_caches(kv_caches))

    # vLLM 0.33 added these two to the base class (a no-op there); a child built for 0.32 lacks
    # them, and then gets that default: nothing is called.
    def unregister_kv_caches(self) -> None:
        self._gather(
            "unregister_kv_caches", lambda _, c: _call_if_present(c, "unregister_kv_caches")
        )

    def restore_kv_caches(self) -> None:
        self._gather("restore_kv_caches", lambda _, c: _call_if_present(c, "restore_kv_caches"))

    def set_host_xfer_buffer_ops(self, copy_operation: Any) -> None:
        self._gather(
            "set_host_xfer_buffer_ops", lambda _, c: c.set_host_xfer_buffer_ops(copy_operation)
        )

    def finish_forward(self) -> None:
        self._each("finish_forward")

    def reset_capture_state(self) -> None:
        self._gather("reset_capture_state", lambda _, c: c.reset_capture_state())

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        children = self._check_metadata(kv_connector_metadata).children
        self._gather("handle_preemptions", lambda name, c: c.handle_preemptions(children[name]))

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:
            try:
                child.start_load_kv(forward_context, **kwargs)
            except Exception as exc:
                failures = _failed(failures, name, exc)
        if failures is not None:
            self._raise("start_load_kv", failures)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Called for every attention layer of every step: a plain loop, no helper.
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:
            try:
                child.wait_for_layer_load(layer_name)
            except Exception as exc:
                failures = _failed(failures, name, exc)
        if failures is not None:
            self._raise("wait_for_layer_load", failures)

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:
            try:
                child.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
            except Exception as exc:
                failures = _failed(failures, name, exc)
        if failures is not None:
            self._raise("save_kv_layer", failures)

    def wait_for_save(self) -> None:
        self._each("wait_for_save")

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """Apply every child's completions to the bookkeeping; return only what is due.

        A request is reported finished sending once every name the scheduler said saves it has
        reported; a load completion is passed on once, from the name chosen to load. When a
        child raises (or answers what is not a set of request ids), the others' completions are
        still applied, and what became due is returned by the next call: the books have already
        let go of those requests, so they must not be lost with the error.
        """
        per_child: dict[str, Any] = {}
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:  # every step: no helper
            try:
                per_child[name] = child.get_transfer_results(finished_req_ids)
            except Exception as exc:
                failures = _failed(failures, name, exc)
        # Due but not yet returned (a call that raised): returned by this one.
        results = self._due
        loads = self._loads
        ledger = self._ledger
        sending = results.finished_sending
        for name, child_results in per_child.items():
            if child_results.finished_sending:
                try:
                    ledger.report(name, child_results.finished_sending, sending)
                except InvalidArgumentError as exc:  # nothing of this child's was applied
                    failures = _failed(failures, name, exc)
            failed = child_results.failed_recving
            if not failed and not child_results.finished_recving:
                continue
            # Failed receives also count as finished: the scheduler must stop waiting.
            for request_id in child_results.finished_recving | failed:
                if loads.load_finished(request_id, name) is not Outcome.applied:
                    continue
                results.finished_recving.add(request_id)
                if request_id in failed:
                    results.failed_recving.add(request_id)
                if request_id in self._finished_while_loading:
                    self._finished_while_loading.discard(request_id)
                    loads.cancel(request_id)
        if len(loads):  # nothing to look up while no load is tracked
            for request_id in finished_req_ids:
                record = loads.peek(request_id)
                if record is None:
                    continue
                if record.loader is None or record.loaded:
                    loads.cancel(request_id)
                else:  # aborted while loading: the scheduler still needs that one completion
                    self._finished_while_loading.add(request_id)
            loads.take()
        if failures is not None:
            self._raise("get_transfer_results", failures, result=per_child)
        self._due = KVConnectorTransferResults()
        return results

    def get_block_ids_with_load_errors(self) -> set[int]:
        blocks: set[int] = set()
        failures: list[tuple[str, Exception]] | None = None
        answers: dict[str, Any] = {}
        for name, child in self._items:
            try:
                answers[name] = found = child.get_block_ids_with_load_errors()
            except Exception as exc:
                failures = _failed(failures, name, exc)
                continue
            if found:
                blocks |= found
        if failures is not None:
            self._raise("get_block_ids_with_load_errors", failures, result=answers)
        return blocks

    def get_kv_connector_kv_cache_events(self) -> Any:
        found = list(self._present("get_kv_connector_kv_cache_events").values())
        if not found:
            return None
        merged = found[0]
        for events in found[1:]:
            merged = merged.merge(events)
        return merged

    def get_handshake_metadata(self) -> NamedHandshakeMetadata | None:
        found = self._present("get_handshake_metadata")
        return NamedHandshakeMetadata(found) if found else None

    def build_connector_worker_meta(self) -> NamedMultiConnectorWorkerMetadata | None:
        found: dict[str, Any] | None = None
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:  # every step: no helper
            try:
                meta = child.build_connector_worker_meta()
            except Exception as exc:
                failures = _failed(failures, name, exc)
                continue
            if meta is not None:
                if found is None:
                    found = {}
                found[name] = meta
        if failures is not None:
            self._raise("build_connector_worker_meta", failures, result=found or {})
        return None if found is None else NamedMultiConnectorWorkerMetadata(found)

    def get_finished_count(self) -> int | None:
        counts = self._gather("get_finished_count", lambda _, c: c.get_finished_count())
        if any(count is None for count in counts.values()):
            return None
        distinct = {count for count in counts.values() if count is not None}
        if len(distinct) > 1:
            raise ValueError(f"child connectors expect different finished counts: {counts}")
        return next(iter(distinct), None)


def _call_if_present(child: Any, method: str) -> None:
    """``child.<method>()``, or nothing for a child whose vLLM has no such method (the base
    class's default in the version that added it)."""
    found = getattr(child, method, None)
    if found is not None:
        found()

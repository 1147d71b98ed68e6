"""The vLLM-facing connector: :class:`MultiConnector`, under vLLM's own class name."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from .._validate import shown
from ..aggregator import MultiConnector as Aggregator
from ..errors import ConnectorFailures, InvalidArgumentError
from ..machine import State
from ..outcome import Outcome
from ..registry import ConnectorRegistry
from .config import ChildSpec, child_specs, connector_class, specs_of, without_hma
from .errors import ChildStartError, HMAUnsupportedError, MetadataMismatchError
from .sides import SchedulerSide, WorkerSide
from .wire import (
    NamedHandshakeMetadata,
    NamedMultiConnectorMetadata,
    NamedMultiConnectorStats,
    NamedMultiConnectorWorkerMetadata,
    NamedPromMetrics,
)

__all__ = ["MultiConnector"]

_T = TypeVar("_T")


class MultiConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """A vLLM v1 KV connector that fans out to named children (see :mod:`multiconnector.vllm`).

    Loaded under vLLM's own class name, with ``kv_connector_module_path="multiconnector.vllm"``,
    so every check vLLM makes on the string ``"MultiConnector"`` reads our children too.

    One instance per role and process, as vLLM builds them: the scheduler's chooses loaders,
    merges params and tells the workers who saves what; each worker's releases requests and
    passes on load completions by the rules above. ``children`` maps names to the child
    connectors, in configuration order.

    It implements ``SupportsHMA``: with the hybrid memory allocator enabled, every child must
    support it too (:class:`HMAUnsupportedError` otherwise, before any child is built).

    .. versionadded:: 0.1.0
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        specs = specs_of(self._kv_transfer_config)
        lacking = without_hma(specs)
        if not vllm_config.scheduler_config.disable_hybrid_kv_cache_manager and lacking:
            raise HMAUnsupportedError(
                "the hybrid memory allocator (HMA) is enabled, but these children do not "
                f"support it: {lacking}; set --disable-hybrid-kv-cache-manager or remove them"
            )
        #: Whether every child supports HMA: request_finished_all_groups then asks each child
        #: for every group's blocks (vLLM's rule), otherwise the one group's.
        self._all_support_hma = not lacking
        self._specs: dict[str, ChildSpec] = {spec.name: spec for spec in specs}
        self._children: dict[str, Any] = _start_children(specs, vllm_config, role, kv_cache_config)
        #: ``(name, child)`` pairs in configuration order, for the per-step fan-outs.
        self._items: tuple[tuple[str, Any], ...] = tuple(self._children.items())
        side = SchedulerSide if role == KVConnectorRole.SCHEDULER else WorkerSide
        self._sides: dict[str, Any] = {
            name: side(self, name, child) for name, child in self._children.items()
        }
        registry = ConnectorRegistry(self._sides)
        # Scheduler: every request, from arrival to request_finished (and its load, if one is in
        # flight then); the saves it hands off are the workers' to await (see saving).
        # Worker: the saves each finished request awaits.
        self._tracker = Aggregator(registry)
        # Worker: the load each request awaits; unused on the scheduler.
        self._loads = Aggregator(registry)
        # Scheduler state.
        self._live: dict[str, Any] = {}
        self._tail_savers: dict[str, tuple[str, ...]] = {}
        self._new_savers: dict[str, tuple[str, ...]] = {}
        self._new_loads: dict[str, str] = {}
        #: Scheduler: the requests whose saves were handed off to the workers, with the names
        #: they await, until the workers report them finished sending.
        self._saving: dict[str, tuple[str, ...]] = {}
        #: Scheduler: the children that committed to a save during the current request_finished
        #: (written by the sides; see SchedulerSide.request_finished).
        self._handed_off: list[str] = []
        #: Scheduler: requests whose record still awaits names on the scheduler's own books (a
        #: child answered request_finished with garbage: the core awaits it, conservatively).
        self._awaited_here: set[str] = set()
        #: Saver tuples shared by every request with the same savers (fewer objects to pickle).
        self._saver_tuples: dict[tuple[str, ...], tuple[str, ...]] = {}
        # The current call's context, read by the sides.
        self._lookup_pending = False  # a child answered None in this match: ask no more
        #: Every KV cache group's block ids while request_finished_all_groups asks the children
        #: (the core takes a flat list of block ids, so they travel beside it); else None.
        self._all_groups: tuple[list[int], ...] | None = None
        # Worker state.
        self._load_plan: dict[str, str] = {}
        self._finished_while_loading: set[str] = set()

    # -- introspection -------------------------------------------------------------------------

    @property
    def children(self) -> Mapping[str, Any]:
        """The child connectors by name, in configuration order."""
        return dict(self._children)

    @property
    def sub_connectors(self) -> list[Any]:
        """The child connectors in configuration order (vLLM's ``MultiConnector`` API)."""
        return list(self._children.values())

    @property
    def tracker(self) -> Aggregator:
        """Scheduler: each request from its arrival to ``request_finished`` (held longer only
        while a load is still in flight, or when a child answered ``request_finished`` with
        garbage). The saves it then hands off are awaited by the workers, not here: see
        :attr:`saving`. Worker: the finished requests' awaited saves, each held until every
        saver the scheduler named reported it (or is in flight to load)."""
        return self._tracker

    @property
    def saving(self) -> Mapping[str, tuple[str, ...]]:
        """Scheduler: each request whose asynchronous saves were handed off to the workers, with
        the names they await, until the workers report it finished sending (a copy).

        The workers report a request finished sending only once every one of those names
        confirmed it (vLLM's output aggregator then waits for every worker), so while a request
        is here vLLM holds its blocks.

        .. versionadded:: 0.1.0
        """
        return dict(self._saving)

    @property
    def load_tracker(self) -> Aggregator:
        """Worker: the load each request awaits (unused on the scheduler)."""
        return self._loads

    def connector_counts(self) -> dict[str, dict[Outcome, int]]:
        """Outcomes of the children's reports, per child name: ignored ones included."""
        counts: dict[str, dict[Outcome, int]] = {}
        for tracker in (self._tracker, self._loads):
            for name, per in tracker.connector_counts().items():
                mine = counts.setdefault(name, {})
                for outcome, n in per.items():
                    mine[outcome] = mine.get(outcome, 0) + n
        return counts

    # -- helpers -------------------------------------------------------------------------------

    def _gather(self, what: str, call: Callable[[str, Any], _T]) -> dict[str, _T]:
        """``call(name, child)`` for every child; every failure raised together afterwards."""
        results: dict[str, _T] = {}
        errors: list[Exception] = []
        failed: list[str] = []
        for name, child in self._children.items():
            try:
                results[name] = call(name, child)
            except Exception as exc:
                errors.append(exc)
                failed.append(name)
        if errors:
            raise ConnectorFailures(
                f"{len(errors)} child connector(s) raised in {what}: {', '.join(failed)}",
                errors,
                failed=failed,
                result=results,
            )
        return results

    def _each(self, method: str, *args: Any) -> None:
        """``child.<method>(*args)`` for every child; every failure raised together afterwards.

        :meth:`_gather` for a call whose answers are not used, with no closure and no result
        dict on the way (the per-step calls).
        """
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:
            try:
                getattr(child, method)(*args)
            except Exception as exc:
                failures = _failed(failures, name, exc)
        if failures is not None:
            self._raise(method, failures)

    def _raise(self, what: str, failures: list[tuple[str, Exception]], result: Any = ...) -> None:
        """Raise :class:`ConnectorFailures` for ``failures``, as :meth:`_gather` does."""
        failed = [name for name, _ in failures]
        if result is ...:
            result = {name: None for name in self._children if name not in failed}
        raise ConnectorFailures(
            f"{len(failures)} child connector(s) raised in {what}: {', '.join(failed)}",
            [exc for _, exc in failures],
            failed=failed,
            result=result,
        )

    def _present(self, method: str) -> dict[str, Any]:
        """Each child's no-argument ``method()``, keeping only answers that are not ``None``."""
        answers = self._gather(method, lambda _, c: getattr(c, method)())
        return {name: answer for name, answer in answers.items() if answer is not None}

    def _loader(self, request_id: str) -> str | None:
        record = self._tracker.peek(request_id)
        return None if record is None else record.loader

    def _ensure(self, request: Any) -> str:
        request_id: str = request.request_id
        self._live[request_id] = request
        if request_id not in self._tracker:
            self._tracker.begin(request_id)
        return request_id

    def _check_metadata(self, metadata: Any) -> NamedMultiConnectorMetadata:
        if not isinstance(metadata, NamedMultiConnectorMetadata):
            raise InvalidArgumentError(
                f"connector_metadata={shown(metadata)} must be a NamedMultiConnectorMetadata"
            )
        known = self._children
        if metadata.children.keys() == known.keys() and _all_known(metadata, known):
            return metadata  # every step: the common case, without building name sets
        missing = [name for name in known if name not in metadata.children]
        unexpected = sorted(name for name in metadata.names() if name not in known)
        if missing or unexpected:
            raise MetadataMismatchError(
                f"connector metadata does not match this connector's children "
                f"{list(self._children)}: missing {missing}, unexpected {unexpected}; the "
                "scheduler and the workers must be configured with the same children"
            )
        return metadata

    # -- properties and class-level queries ----------------------------------------------------

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return all(c.supports_divergent_local_hybrid_hits for c in self._children.values())

    @property
    def requires_kv_delivery(self) -> bool:
        return any(c.requires_kv_delivery for c in self._children.values())

    @classmethod
    def all_children_support_hma(cls, kv_transfer_config: Any) -> bool:
        """Whether every configured child supports HMA (vLLM's ``MultiConnector`` API)."""
        return not without_hma(specs_of(kv_transfer_config))

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        return all(
            spec.connector_class().supports_sleep_mode(spec.config)
            for spec in specs_of(kv_transfer_config)
        )

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return any(
            spec.connector_class().requires_piecewise_for_cudagraph(
                spec.config.kv_connector_extra_config
            )
            for spec in child_specs(extra_config)
        )

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:
        layouts: dict[str, list[str]] = {}
        for spec in specs_of(vllm_config.kv_transfer_config):
            layout = spec.connector_class().get_required_kvcache_layout(
                spec.vllm_config(vllm_config)
            )
            if layout is not None:
                layouts.setdefault(layout, []).append(spec.name)
        if len(layouts) > 1:
            raise ValueError(
                "child connectors require different KV cache layouts: "
                + "; ".join(f"{layout} by {', '.join(names)}" for layout, names in layouts.items())
            )
        return next(iter(layouts), None)

    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> NamedMultiConnectorStats:
        """Rebuild stats from :meth:`NamedMultiConnectorStats.to_dict`'s payload, by name."""
        if data is None:
            return NamedMultiConnectorStats()
        stats: dict[str, Any] = {}
        sources: dict[str, tuple[str, str | None]] = {}
        for name, entry in data.items():
            if isinstance(entry, KVConnectorStats):
                stats[name] = entry
                continue
            if not isinstance(entry, Mapping) or not entry.get("kv_connector"):
                raise InvalidArgumentError(
                    f"stats payload for child {name!r}={shown(entry)} must be a mapping with "
                    "'kv_connector', 'kv_connector_module_path' and 'stats'"
                )
            source = (str(entry["kv_connector"]), entry.get("kv_connector_module_path"))
            rebuilt = connector_class(*source).build_kv_connector_stats(data=entry.get("stats"))
            if rebuilt is not None:
                stats[name] = rebuilt
                sources[name] = source
        return NamedMultiConnectorStats(data=stats, sources=sources)

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> NamedPromMetrics:
        per_class: dict[type[Any], Any] = {}
        by_name: dict[str, Any] = {}
        for spec in specs_of(vllm_config.kv_transfer_config):
            child_cls = spec.connector_class()
            if child_cls not in per_class:
                per_class[child_cls] = child_cls.build_prom_metrics(
                    spec.vllm_config(vllm_config),
                    metric_types,
                    labelnames,
                    per_engine_labelvalues,
                )
            if per_class[child_cls] is not None:
                by_name[spec.name] = per_class[child_cls]
        return NamedPromMetrics(
            vllm_config, metric_types, labelnames, per_engine_labelvalues, by_name
        )

    # -- both roles ----------------------------------------------------------------------------

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        metadata = self._check_metadata(connector_metadata)
        tracker = self._tracker
        for request_id, names in metadata.savers.items():
            # The request finished on the scheduler; from now on it awaits exactly these names.
            if request_id not in tracker:
                tracker.begin(request_id)
            tracker.request_finished_by(request_id, names)
        for request_id, name in metadata.loads.items():
            if request_id not in self._loads:
                self._loads.begin(request_id)
            self._load_plan[request_id] = name
            try:
                self._loads.match_tokens(request_id, 0)
            finally:
                del self._load_plan[request_id]
        children = metadata.children
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:
            try:
                child.bind_connector_metadata(children[name])
            except Exception as exc:
                failures = _failed(failures, name, exc)
        if failures is not None:
            self._raise("bind_connector_metadata", failures)
        super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:  # every step: no helper
            try:
                child.clear_connector_metadata()
            except Exception as exc:
                failures = _failed(failures, name, exc)
        if failures is not None:
            self._raise("clear_connector_metadata", failures)
        super().clear_connector_metadata()

    def shutdown(self) -> None:
        """Shut every child down, even after failures; raise them all as ConnectorFailures."""
        self._tracker.shutdown()

    def reset_cache(self) -> bool:
        results = self._gather("reset_cache", lambda _, c: c.reset_cache())
        return all(result is not False for result in results.values())

    def get_kv_connector_stats(self) -> NamedMultiConnectorStats | None:
        stats: dict[str, Any] = {}
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:  # every step, on both roles: no helper
            try:
                found = child.get_kv_connector_stats()
            except Exception as exc:
                failures = _failed(failures, name, exc)
                continue
            if found is not None:
                stats[name] = found
        if failures is not None:
            self._raise("get_kv_connector_stats", failures, result=stats)
        if not stats:
            return None
        sources = {
            name: (self._specs[name].kv_connector, self._specs[name].module_path) for name in stats
        }
        return NamedMultiConnectorStats(data=stats, sources=sources)

    # -- worker side ---------------------------------------------------------------------------

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

    def unregister_kv_caches(self) -> None:
        self._gather("unregister_kv_caches", lambda _, c: c.unregister_kv_caches())

    def restore_kv_caches(self) -> None:
        self._gather("restore_kv_caches", lambda _, c: c.restore_kv_caches())

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
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:  # every step: no helper
            try:
                child.wait_for_save()
            except Exception as exc:
                failures = _failed(failures, name, exc)
        if failures is not None:
            self._raise("wait_for_save", failures)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """Apply every child's completions to the bookkeeping; return only what is due.

        A request is reported finished sending once every name the scheduler said saves it has
        reported; a load completion is passed on once, from the name chosen to load.
        """
        per_child: dict[str, Any] = {}
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:  # every step: no helper
            try:
                per_child[name] = child.get_transfer_results(finished_req_ids)
            except Exception as exc:
                failures = _failed(failures, name, exc)
        results = KVConnectorTransferResults()
        loads = self._loads
        tracker = self._tracker
        for name, child_results in per_child.items():
            if child_results.finished_sending:
                tracker.transfer_finished_many(name, child_results.finished_sending)
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
        sending = results.finished_sending
        for record in tracker.take():
            if record.state is State.finished:
                sending.add(record.request_id)
        if failures is not None:
            self._raise("get_transfer_results", failures, result=per_child)
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
        found: list[Any] = []
        failures: list[tuple[str, Exception]] | None = None
        answers: dict[str, Any] = {}
        for name, child in self._items:  # every step: no helper
            try:
                answers[name] = events = child.get_kv_connector_kv_cache_events()
            except Exception as exc:
                failures = _failed(failures, name, exc)
                continue
            if events is not None:
                found.append(events)
        if failures is not None:
            self._raise("get_kv_connector_kv_cache_events", failures, result=answers)
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

    # -- scheduler side ------------------------------------------------------------------------

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        # Not super(): it would bind the block pool to every child a second time.
        self._kv_cache_manager = kv_cache_manager
        self._gather(
            "bind_kv_cache_manager", lambda _, c: c.bind_kv_cache_manager(kv_cache_manager)
        )

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        self._gather("bind_gpu_block_pool", lambda _, c: c.bind_gpu_block_pool(gpu_block_pool))

    def on_new_request(self, request: Any) -> None:
        self._ensure(request)
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:  # once per request: no helper
            try:
                child.on_new_request(request)
            except Exception as exc:
                failures = _failed(failures, name, exc)
        if failures is not None:
            self._raise("on_new_request", failures)

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """The first child, in configuration order, with tokens to load becomes the loader.

        As in vLLM's: a child answering ``None`` (still looking up) makes the answer
        ``(None, False)``, and the children after it are not asked.
        """
        request_id = self._ensure(request)
        self._lookup_pending = False
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
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:  # once per scheduled request: no helper
            try:
                child.update_state_after_alloc(
                    request, blocks, num_external_tokens if name == loader else 0
                )
            except Exception as exc:
                failures = _failed(failures, name, exc)
        if failures is not None:
            self._raise("update_state_after_alloc", failures)
        if (
            num_external_tokens > 0
            and loader is not None
            and self._sides[loader].load_async.get(request_id, False)
        ):
            self._new_loads[request_id] = loader

    def build_connector_meta(self, scheduler_output: Any) -> NamedMultiConnectorMetadata:
        children: dict[str, Any] = {}
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:  # every step: no helper
            try:
                children[name] = child.build_connector_meta(scheduler_output)
            except Exception as exc:
                failures = _failed(failures, name, exc)
        if failures is not None:
            self._raise("build_connector_meta", failures, result=children)
        # Built by this connector: the dicts are new and the saver names tuples, so the
        # metadata takes them as they are instead of copying them.
        metadata = NamedMultiConnectorMetadata.owning(children, self._new_savers, self._new_loads)
        self._new_savers = {}
        self._new_loads = {}
        return metadata

    def update_connector_output(self, connector_output: Any) -> None:
        worker_meta = connector_output.kv_connector_worker_meta
        if worker_meta is not None and not isinstance(
            worker_meta, NamedMultiConnectorWorkerMetadata
        ):
            raise InvalidArgumentError(
                f"kv_connector_worker_meta={shown(worker_meta)} must be a "
                "NamedMultiConnectorWorkerMetadata"
            )

        errors: list[Exception] = []
        failed: list[str] = []
        try:
            for name, child in self._children.items():
                try:
                    if worker_meta is not None:
                        connector_output.kv_connector_worker_meta = worker_meta.children.get(name)
                    child.update_connector_output(connector_output)
                except Exception as exc:
                    errors.append(exc)
                    failed.append(name)
        finally:
            connector_output.kv_connector_worker_meta = worker_meta
        if errors:
            raise ConnectorFailures(
                f"{len(errors)} child connector(s) raised in update_connector_output: "
                + ", ".join(failed),
                errors,
                failed=failed,
                result={name: None for name in self._children if name not in failed},
            )
        # The workers report a request finished sending only once every saver confirmed, and
        # vLLM's output aggregator only once every worker did.
        tracker = self._tracker
        finished = connector_output.finished_sending
        if finished:
            saving = self._saving
            for request_id in finished:
                saving.pop(request_id, None)
            if self._awaited_here:
                self._confirm_here(finished)
        for request_id in connector_output.finished_recving or ():
            loader = self._loader(request_id)
            if loader is not None:
                tracker.load_finished(request_id, loader)
        tracker.take()

    def _confirm_here(self, finished: set[str]) -> None:
        """Confirm, on the scheduler's own books, the names still awaited there for the
        requests of ``finished`` (a garbage answer awaited conservatively: see
        :meth:`_handed_off_savers`)."""
        tracker = self._tracker
        confirmed: dict[str, list[str]] = {}
        for request_id in finished:
            if request_id not in self._awaited_here:
                continue
            self._awaited_here.discard(request_id)
            record = tracker.peek(request_id)
            if record is not None:
                for name in record.awaiting:
                    confirmed.setdefault(name, []).append(request_id)
        for name, request_ids in confirmed.items():
            tracker.transfer_finished_many(name, request_ids)

    def register_finished_partial_tail(
        self,
        request: Any,
        block_ids: tuple[list[int], ...],
        partial_tail_offloads: list[tuple[int, int, int]],
    ) -> bool:
        accepted = self._gather(
            "register_finished_partial_tail",
            lambda _, c: c.register_finished_partial_tail(
                request, block_ids, partial_tail_offloads
            ),
        )
        names = tuple(name for name, took in accepted.items() if took)
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
        self._all_groups = blocks if all_groups else None
        tracker = self._tracker
        handed = self._handed_off
        handed.clear()
        answered = False
        try:
            _, params = tracker.request_finished(request_id, () if all_groups else blocks)
            answered = True
        finally:
            self._all_groups = None
            # Answered without an error: no child answered garbage (the core raises for it), so
            # nothing is awaited on the scheduler's books, only what the children handed off.
            savers = (
                self._shared_savers(tuple(handed))
                if answered and handed
                else self._handed_off_savers(request_id, handed)
            )
            if savers:
                self._new_savers[request_id] = savers
                self._saving[request_id] = savers
            self._live.pop(request_id, None)
            if self._tail_savers:
                self._tail_savers.pop(request_id, None)
            for side in self._sides.values():
                if side.load_async:
                    side.load_async.pop(request_id, None)
            tracker.take()
        return bool(savers), params

    def _handed_off_savers(self, request_id: str, handed: list[str]) -> tuple[str, ...]:
        """The names the workers are to await for ``request_id``: the children that committed
        to a save (``handed``), and any the scheduler's record awaits (a garbage answer), in
        configuration order, as a shared tuple."""
        record = self._tracker.peek(request_id)
        if record is not None and record.state is State.finishing and record.awaiting:
            self._awaited_here.add(request_id)
            owing = {*handed, *record.awaiting}
            return self._shared_savers(tuple([name for name in self._children if name in owing]))
        return self._shared_savers(tuple(handed)) if handed else ()

    def _shared_savers(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The one tuple equal to ``names`` that every request with these savers shares."""
        shared = self._saver_tuples.get(names)
        if shared is None:
            shared = self._saver_tuples.setdefault(names, names)
        return shared

    def take_events(self) -> list[Any]:
        events: list[Any] = []
        failures: list[tuple[str, Exception]] | None = None
        answers: dict[str, Any] = {}
        for name, child in self._items:  # every step: no helper
            try:
                answers[name] = found = list(child.take_events())
            except Exception as exc:
                failures = _failed(failures, name, exc)
                continue
            events.extend(found)
        if failures is not None:
            self._raise("take_events", failures, result=answers)
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
        def route(name: str, child: Any) -> None:
            mine = {
                rank: meta.children[name]
                for rank, meta in metadata.items()
                if isinstance(meta, NamedHandshakeMetadata) and name in meta.children
            }
            if mine:
                getattr(child, method)(mine)

        self._gather(method, route)


def _all_known(metadata: NamedMultiConnectorMetadata, known: Mapping[str, Any]) -> bool:
    """Whether every saver and loader name ``metadata`` mentions is one of ``known``.

    The saver tuples of one step are mostly one shared tuple (the scheduler's are interned and
    pickle keeps them shared), so each distinct tuple is checked once.
    """
    checked: tuple[str, ...] | None = None
    for names in metadata.savers.values():
        if names is not checked:
            for name in names:
                if name not in known:
                    return False
            checked = names
    return all(name in known for name in metadata.loads.values())


def _failed(
    failures: list[tuple[str, Exception]] | None, name: str, exc: Exception
) -> list[tuple[str, Exception]]:
    """``failures`` (a new list when ``None``) with ``(name, exc)`` appended."""
    if failures is None:
        return [(name, exc)]
    failures.append((name, exc))
    return failures


def _start_children(
    specs: Sequence[ChildSpec], vllm_config: Any, role: Any, kv_cache_config: Any
) -> dict[str, Any]:
    """Build every child in order; if one fails, shut down those already built, then raise."""
    built: dict[str, Any] = {}
    for spec in specs:
        try:
            built[spec.name] = spec.connector_class()(
                spec.vllm_config(vllm_config), role, kv_cache_config
            )
        except Exception as exc:
            failures: dict[str, BaseException] = {}
            for name, child in reversed(built.items()):
                try:
                    child.shutdown()
                except Exception as shutdown_exc:
                    failures[name] = shutdown_exc
            raise ChildStartError(spec.name, spec.kv_connector, tuple(built), failures) from exc
    return built

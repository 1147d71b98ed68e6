"""The vLLM-facing connector: :class:`MultiConnector`, under vLLM's own class name.

One object per role and process, as vLLM builds them: the connector holds the children
(:class:`~multiconnector.vllm.children.Children`) and the part of its role, a
:class:`~multiconnector.vllm.scheduler.SchedulerPart` or a
:class:`~multiconnector.vllm.worker.WorkerPart`, each with only its own books. Every hook of
vLLM's interface is a method here: one that only fans out to the children calls them through
:class:`~multiconnector.vllm.children.Children`; one that reads or writes a role's books hands
the call to that role's part. (vLLM's own tests call a
scheduler's hook on a worker's connector now and then: the other part is then built on first
use.) Here too are the introspection, the class-level queries and the calls both roles get.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Final

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiConnector as VllmMultiConnector,
)
from vllm.version import __version__ as VLLM_VERSION

from .._validate import shown
from ..aggregator import MultiConnector as Aggregator
from ..errors import InvalidArgumentError
from ..health import Health
from ..ledger import SaveLedger
from ..outcome import Outcome
from . import queries
from .children import ANSWER_TYPES, Children, Failures, failed, wrong_answer
from .closed import close
from .config import (
    connector_class,
    kv_role_disagreement,
    settings_of,
    specs_of,
    without_hma,
)
from .counted import WORKERS
from .errors import ChildrenConflictError, HMAUnsupportedError
from .hits import LOOKUP
from .hooks import adopt, check_adopted
from .scheduler import SchedulerPart
from .wire import (
    FAILED,
    HEALTH,
    NamedHandshakeMetadata,
    NamedKVEvents,
    NamedMultiConnectorMetadata,
    NamedMultiConnectorStats,
    NamedMultiConnectorWorkerMetadata,
    NamedPromMetrics,
    is_named_stats_entry,
)
from .worker import WorkerPart

__all__ = ["MultiConnector"]

_SAVE_DEGRADED: Final = "its save of this step may be incomplete; its report is still awaited"

logger: Final = logging.getLogger("multiconnector")


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
        # The composition's own settings, checked before any child starts.
        self._settings = settings_of(self._kv_transfer_config.kv_connector_extra_config)
        lacking = without_hma(specs)
        if not vllm_config.scheduler_config.disable_hybrid_kv_cache_manager and lacking:
            raise HMAUnsupportedError(
                "the hybrid memory allocator (HMA) is enabled, but these children do not "
                f"support it: {lacking}; set --disable-hybrid-kv-cache-manager or remove them"
            )
        self._vllm_config = vllm_config
        #: Whether every child supports HMA (vLLM's class's attribute, which its tests read):
        #: request_finished_all_groups then asks each child for every group's blocks.
        self._all_support_hma = not lacking
        self._kids = Children(specs, vllm_config, role, kv_cache_config)
        self._sched: SchedulerPart | None = None
        self._work: WorkerPart | None = None
        if role == KVConnectorRole.SCHEDULER:
            self._sched = SchedulerPart(
                self._kids, self._settings, vllm_config, all_support_hma=self._all_support_hma
            )
        else:
            self._work = WorkerPart(self._kids, self._settings)
        disagreement = kv_role_disagreement(self._kv_transfer_config.kv_role, specs)
        if disagreement is not None and role == KVConnectorRole.SCHEDULER:
            logger.warning(disagreement)  # served all the same, as vLLM's class serves
        try:  # a hook of a newer vLLM that ours cannot compose: refused, named (hooks.py)
            check_adopted(self, VLLM_VERSION)
        except Exception:
            self._kids.shutdown()
            raise

    @property
    def _scheduler(self) -> SchedulerPart:
        """The scheduler's part (built on first use on a worker's connector)."""
        part = self._sched
        if part is None:
            part = self._sched = SchedulerPart(
                self._kids,
                self._settings,
                self._vllm_config,
                all_support_hma=self._all_support_hma,
            )
        return part

    @property
    def _worker(self) -> WorkerPart:
        """The worker's part (built on first use on the scheduler's connector)."""
        part = self._work
        if part is None:
            part = self._work = WorkerPart(self._kids, self._settings)
        return part

    # -- introspection -------------------------------------------------------------------------

    @property
    def children(self) -> Mapping[str, Any]:
        """The child connectors by name, in configuration order."""
        return dict(self._kids.by_name)

    @property
    def sub_connectors(self) -> list[Any]:
        """The child connectors in configuration order (vLLM's ``MultiConnector`` API)."""
        return list(self._kids.by_name.values())

    @property
    def _connectors(self) -> list[Any]:
        """vLLM's class's private list of the children, in configuration order, which its
        subclasses read (a new list: changing it changes nothing here).

        Assigning a list of as many connectors puts them in the children's places, by
        position: the names, and so the books, stay (docs/vllm.md, "What subclasses of
        vLLM's class read").
        """
        return list(self._kids.by_name.values())

    @_connectors.setter
    def _connectors(self, connectors: Sequence[Any]) -> None:
        if "_kids" not in self.__dict__:
            raise InvalidArgumentError(
                "this MultiConnector was not built by its constructor (object.__new__): its "
                "children, their names and its books come from the constructor"
            )
        self._kids.replace(list(connectors))

    @property
    def tracker(self) -> Aggregator:
        """Scheduler: each request from its arrival until vLLM may free its blocks: its loader,
        and the savers the workers await until they report them (the core's books, told by
        the scheduler's part)."""
        return self._scheduler.tracker

    @property
    def ledger(self) -> SaveLedger:
        """Worker: the finished requests' awaited saves, each held until every saver the
        scheduler named reported it.

        .. versionadded:: 0.1.0
        """
        return self._worker.ledger

    @property
    def saving(self) -> Mapping[str, tuple[str, ...]]:
        """Scheduler: each request whose asynchronous saves were handed off to the workers, with
        the names they await, until the workers report it finished sending (a copy).

        The workers report a request finished sending only once every one of those names
        confirmed it (vLLM's output aggregator then waits for every worker), so while a request
        is here vLLM holds its blocks.

        .. versionadded:: 0.1.0
        """
        return self._scheduler.saving

    @property
    def load_tracker(self) -> Aggregator:
        """Worker: the load each request awaits."""
        return self._worker.loads

    def child_hits(self) -> dict[str, dict[str, int]]:
        """Scheduler: per child name, its lookups so far: ``asked``, ``hits`` (more than 0
        tokens), ``tokens_offered``, ``chosen`` and ``tokens_chosen`` (the loads it was chosen
        for), ``loads_completed`` and ``loads_failed`` (asynchronous loads), ``skipped`` (the
        lookups of a loader not asked: its health machine was open), ``excluded`` (not asked:
        the request's ``multiconnector_load_children`` left it out) and ``refused`` (requests
        whose such key was refused); a count that is 0 is absent (docs/vllm.md, "Hits per
        child").

        .. versionadded:: 0.1.0
        """
        return self._scheduler.hits.counts()

    def child_health(self) -> dict[str, Health]:
        """Scheduler: each child's health (:class:`~multiconnector.health.Health`), by name in
        configuration order; empty when the composition has no health machine (no
        ``kv_connector_extra_config['health']``): docs/vllm.md, "When a child fails".

        .. versionadded:: 0.1.0
        """
        health = self._scheduler.health
        return {} if health is None else health.snapshot()

    def child_failures(self) -> dict[str, dict[str, int]]:
        """Per child name, per hook, how many times the child raised or answered what cannot
        be true in a hook vLLM calls per request or per step (each degraded that child for that
        call; none reached vLLM): docs/vllm.md, "When a child fails".

        .. versionadded:: 0.1.0
        """
        return self._kids.trouble.counts()

    def connector_counts(self) -> dict[str, dict[Outcome, int]]:
        """Outcomes of the children's reports, per child name: ignored ones included (on the
        scheduler, a child's reports forwarded by the workers, each under the child's name)."""
        counts: dict[str, dict[Outcome, int]] = {}
        per_book: list[tuple[dict[str, dict[Outcome, int]], Any]] = []
        tables: list[dict[tuple[Any, str], int]] = []
        if self._sched is not None:
            per_book.append((self._sched.tracker.connector_counts(), self._sched.child_of))
            tables.append(self._sched.counted_outcomes)
        if self._work is not None:
            per_book += (
                (self._work.ledger.connector_counts(), str),
                (self._work.loads.connector_counts(), str),
            )
            tables.append(self._work.counted_outcomes)
        for book, child_of in per_book:
            for name, per in book.items():
                if name == WORKERS:
                    continue  # the workers' confirmation: no child's report
                mine = counts.setdefault(child_of(name), {})
                for outcome, n in per.items():
                    mine[outcome] = mine.get(outcome, 0) + n
        for table in tables:
            for (outcome, name), n in table.items():
                mine = counts.setdefault(name, {})
                mine[outcome] = mine.get(outcome, 0) + n
        return counts

    # -- properties and class-level queries ----------------------------------------------------

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        return all(c.supports_divergent_local_hybrid_hits for c in self._kids.by_name.values())

    @property
    def requires_kv_delivery(self) -> bool:
        # A load-only child is never awaited for a save: it hands nothing off.
        return any(c.requires_kv_delivery for _, c in self._kids.savers)

    @classmethod
    def all_children_support_hma(cls, kv_transfer_config: Any) -> bool:
        """Whether every configured child supports HMA (vLLM's ``MultiConnector`` API)."""
        return not without_hma(specs_of(kv_transfer_config))

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        """Whether every child supports sleep mode (a child class without the method, from
        vLLM 0.32, answers the 0.33 base class's ``True``)."""
        return queries.supports_sleep_mode(kv_transfer_config)

    @classmethod
    def kv_cache_access(cls, kv_transfer_config: Any) -> Any:
        """Every child's ``KVCacheAccess`` flags, OR-ed, as vLLM 0.34's class composes them; a
        child that raises or answers what is no flags stops the start, named
        (:func:`~multiconnector.vllm.queries.kv_cache_access`)."""
        return queries.kv_cache_access(kv_transfer_config)

    @classmethod
    def supports_lookahead_block_hashes(cls, kv_transfer_config: Any) -> bool:
        """Whether every child supports lookahead block hashes, as vLLM 0.34's class answers;
        a child that raises or answers no ``bool`` makes it ``False``, logged
        (:func:`~multiconnector.vllm.queries.supports_lookahead_block_hashes`)."""
        return queries.supports_lookahead_block_hashes(kv_transfer_config)

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return queries.requires_piecewise_for_cudagraph(extra_config)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:
        """The children's one required layout, compared as vLLM resolves layout names (so
        ``"HND"`` and ``"LBHNC"`` agree); the first child's name for it is returned."""
        return queries.required_kvcache_layout(vllm_config)

    @classmethod
    def build_kv_connector_stats(
        cls, data: dict[str, Any] | None = None
    ) -> NamedMultiConnectorStats:
        """Rebuild stats from a payload: ours (:meth:`NamedMultiConnectorStats.to_dict`, each
        child's by name with its class) or vLLM's (each class's stats by class name, rebuilt
        through vLLM's registry, whose ``ValueError`` names a class it does not know). A
        ``KVConnectorStats`` object is kept as it is; a child whose class rebuilds ``None``
        is left out."""
        if data is None:
            return NamedMultiConnectorStats()
        stats: dict[str, Any] = {}
        sources: dict[str, tuple[str, str | None]] = {}
        counts: dict[str, dict[str, int]] = {}
        for name, entry in data.items():
            if isinstance(entry, KVConnectorStats):
                stats[name] = entry
                continue
            if is_named_stats_entry(entry):
                source = (entry["kv_connector"], entry["kv_connector_module_path"])
                if entry.get("counts"):
                    counts[name] = dict(entry["counts"])
                    sources[name] = source
                if entry["stats"] is None:  # only the adapter's counts of this child
                    continue
                rebuilt = connector_class(*source).build_kv_connector_stats(data=entry["stats"])
            elif isinstance(entry, Mapping):  # vLLM's payload: a class name and its stats
                source = None
                rebuilt = KVConnectorFactory.get_connector_class_by_name(
                    name
                ).build_kv_connector_stats(data=entry)
            else:
                raise InvalidArgumentError(
                    f"stats payload for child {name!r}={shown(entry)} must be a mapping: "
                    "'kv_connector', 'kv_connector_module_path' and 'stats' (ours), or the "
                    "stats of the class of that name (vLLM's)"
                )
            if rebuilt is not None:
                stats[name] = rebuilt
                if source is not None:
                    sources[name] = source
        return NamedMultiConnectorStats(data=stats, sources=sources, counts=counts)

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> NamedPromMetrics:
        """Each child's metrics by name (:func:`~multiconnector.vllm.queries.prom_metrics`)."""
        return queries.prom_metrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    # -- the scheduler's hooks -----------------------------------------------------------------

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        # Not super(): it would bind the block pool to every child a second time.
        self._kv_cache_manager = kv_cache_manager
        self._scheduler.bind_kv_cache_manager(kv_cache_manager)

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        self._kids.gather("bind_gpu_block_pool", lambda _, c: c.bind_gpu_block_pool(gpu_block_pool))

    def on_new_request(self, request: Any) -> None:
        self._scheduler.on_new_request(request)

    def may_load_async(self, request: Any) -> bool:
        """Whether a child that may load (every role but save-only) may load ``request``
        asynchronously (vLLM 0.34: the scheduler then queues it for an in-flight load slot).

        A child that raises or answers what is not a ``bool`` fails there, counted and logged:
        the base class's default (the request's P/D ``do_remote_prefill`` flag) stands for its
        answer, as for a child that does not implement the hook. Either answer is safe for
        vLLM (a wrong one costs a load slot or a prefetch, never a block).
        """
        pairs = self._scheduler.lookups.askable(request)  # not open, named by its params
        if not pairs:
            return False  # no child that may load is asked: none loads it
        answers = self._kids.gather_soft(
            "may_load_async",
            lambda name, child: _flag(name, "may_load_async", child.may_load_async(request)),
            "the base class's default (the request's do_remote_prefill) stands for its answer",
            pairs,
        )
        if any(answers.values()):
            return True
        if len(answers) < len(pairs):
            return bool(super().may_load_async(request))
        return False

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """The first child, in configuration order, with tokens to load becomes the loader
        (the ``lookup`` policy ``"first"``, the default; ``"longest"``: the child with the
        most, docs/vllm.md, "Which child loads").

        As in vLLM's: a child answering ``None`` (still looking up) makes the answer
        ``(None, False)``, and the children after it are not asked; unless a child asked before
        it already covers every token the request has left but its last.
        """
        return self._scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:
        return self._scheduler.get_loaded_kv_cache_group_ids(  # type: ignore[no-any-return]
            request, lambda: super(MultiConnector, self).get_loaded_kv_cache_group_ids(request)
        )

    def get_external_cache_hit_sources(
        self, request: Any, num_external_tokens: int
    ) -> dict[Any, int]:
        return self._scheduler.get_external_cache_hit_sources(  # type: ignore[no-any-return]
            request,
            num_external_tokens,
            lambda: super(MultiConnector, self).get_external_cache_hit_sources(
                request, num_external_tokens
            ),
        )

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """The loader gets ``num_external_tokens``; every other child gets 0 and the blocks.

        A child that raises is that child's failure; when it is the loader, its load is
        reported failed (through the workers, in vLLM's own terms), so vLLM recomputes.
        """
        self._scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> NamedMultiConnectorMetadata:
        return self._scheduler.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        """Each child sees the output with its own worker metadata and its own KV cache events
        (by name); then the completions vLLM acts on next are made one per request."""
        self._scheduler.update_connector_output(connector_output)

    def register_finished_partial_tail(
        self,
        request: Any,
        block_ids: tuple[list[int], ...],
        partial_tail_offloads: list[tuple[int, int, int]],
    ) -> bool:
        return self._scheduler.register_finished_partial_tail(
            request, block_ids, partial_tail_offloads
        )

    def request_finished(
        self, request: Any, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Ask every child; merge params into a new dict; tell workers who saves, by name.

        A params clash is the later children's failure, counted and logged: the params are
        dropped, and the children that committed to a save are still awaited and still sent
        to the workers, so no block is freed under a save in progress.
        """
        return self._scheduler.request_finished(request, block_ids)

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """:meth:`request_finished` with every KV cache group's block ids (``SupportsHMA``).

        As in vLLM's: when every child supports HMA each is asked its
        ``request_finished_all_groups``; otherwise there must be exactly one group, and each
        child is asked its ``request_finished`` with that group's blocks. The guarantees are
        :meth:`request_finished`'s.
        """
        return self._scheduler.request_finished(request, block_ids, all_groups=True)

    def take_events(self) -> list[Any]:
        events: list[Any] = []
        failures: Failures = None
        for name, child in self._kids.fan.take_events:  # every step: no helper
            try:
                found = list(child.take_events())
            except Exception as exc:
                failures = failed(failures, name, exc)
                continue
            events.extend(found)
        if failures is not None:
            self._kids.absorb("take_events", failures, "its events of this step dropped")
        return events

    def has_pending_block_frees(self) -> bool:
        return self._has_pending("has_pending_block_frees")

    def has_pending_push_work(self) -> bool:
        return self._has_pending("has_pending_push_work")

    def set_xfer_handshake_metadata(self, metadata: dict[int, Any]) -> None:
        """Each child gets its own entries of :class:`NamedHandshakeMetadata`, by name."""
        self._route_handshake(metadata, "set_xfer_handshake_metadata")

    def set_xfer_handshake_metadata_pp_aware(self, metadata: dict[tuple[int, int], Any]) -> None:
        self._route_handshake(metadata, "set_xfer_handshake_metadata_pp_aware")

    # -- the worker's hooks --------------------------------------------------------------------

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        self._worker.bind_connector_metadata(connector_metadata)
        super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        self._worker.clear_connector_metadata()
        super().clear_connector_metadata()

    def get_mem_pool_context(self) -> AbstractContextManager[Any] | None:
        contexts = self._kids.present("get_mem_pool_context")
        if len(contexts) > 1:
            raise ChildrenConflictError(
                f"Multiple connectors provide a KV cache memory pool {list(contexts)}: child "
                f"connectors {', '.join(map(repr, contexts))} each provide one; the KV cache is "
                "allocated once, in one pool: configure custom_mem_pool on at most one"
            )
        return next(iter(contexts.values()), None)

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        self._kids.gather("register_kv_caches", lambda _, c: c.register_kv_caches(kv_caches))

    # vLLM 0.33 added these two to the base class (a no-op there); a child built for 0.32 lacks
    # them, and then gets that default: nothing is called.
    def unregister_kv_caches(self) -> None:
        self._kids.gather(
            "unregister_kv_caches", lambda _, c: _call_if_present(c, "unregister_kv_caches")
        )

    def restore_kv_caches(self) -> None:
        self._kids.gather(
            "restore_kv_caches", lambda _, c: _call_if_present(c, "restore_kv_caches")
        )

    def set_host_xfer_buffer_ops(self, copy_operation: Any) -> None:
        self._kids.gather(
            "set_host_xfer_buffer_ops", lambda _, c: c.set_host_xfer_buffer_ops(copy_operation)
        )

    def finish_forward(self) -> None:
        self._kids.each("finish_forward")

    def reset_capture_state(self) -> None:
        self._kids.gather("reset_capture_state", lambda _, c: c.reset_capture_state())

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        children = self._kids.check_metadata(kv_connector_metadata).children
        pairs = self._kids.fan.handle_preemptions
        if pairs:  # every step: most children leave it a no-op (Fanout)
            self._kids.gather_soft(
                "handle_preemptions",
                lambda name, c: c.handle_preemptions(children[name]),
                "ignored for this step",
                pairs,
            )

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        failures: Failures = None
        for name, child in self._kids.fan.start_load_kv:
            try:
                child.start_load_kv(forward_context, **kwargs)
            except Exception as exc:
                failures = failed(failures, name, exc)
        if failures is not None:
            self._worker.loader_failed("start_load_kv", failures)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Called for every attention layer of every step: a plain loop over the children that
        # wait per layer (most often none); a failure is the worker's books' to settle.
        failures: Failures = None
        for name, child in self._kids.fan.wait_for_layer_load:
            try:
                child.wait_for_layer_load(layer_name)
            except Exception as exc:
                failures = failed(failures, name, exc)
        if failures is not None:
            self._worker.loader_failed("wait_for_layer_load", failures)

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        failures: Failures = None
        for name, child in self._kids.fan.save_kv_layer:  # every layer: no helper
            try:
                child.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs)
            except Exception as exc:
                failures = failed(failures, name, exc)
        if failures is not None:
            self._kids.absorb("save_kv_layer", failures, _SAVE_DEGRADED)

    def wait_for_save(self) -> None:
        failures: Failures = None
        for name, child in self._kids.fan.wait_for_save:
            try:
                child.wait_for_save()
            except Exception as exc:
                failures = failed(failures, name, exc)
        if failures is not None:
            self._kids.absorb("wait_for_save", failures, _SAVE_DEGRADED)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        return self._worker.get_finished(finished_req_ids)

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """Apply every child's completions to the bookkeeping; return only what is due.

        A request is reported finished sending once every name the scheduler said saves it has
        reported; a load completion is passed on once, from the name chosen to load. When a
        child raises (or answers what is not a set of request ids), that is its failure: the
        others' completions are applied and returned, and the child's reports are awaited still.
        """
        return self._worker.get_transfer_results(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker.get_block_ids_with_load_errors()

    def get_kv_connector_kv_cache_events(self) -> NamedKVEvents | None:
        """Every child's KV cache events object, by name, in one :class:`NamedKVEvents`
        (``None`` when no child has one): vLLM's output aggregator merges it across workers
        child by child, and the scheduler hands each child back its own."""
        found = self._kids.present("get_kv_connector_kv_cache_events", soft=True)
        hook = "get_kv_connector_kv_cache_events"
        wrong = [
            name for name, events in found.items() if not isinstance(events, ANSWER_TYPES[hook])
        ]
        if wrong:  # vLLM's aggregator would call its methods: that child's failure, here
            self._kids.absorb(
                hook,
                [(name, wrong_answer(name, hook, found.pop(name))) for name in wrong],
                "its events of this step dropped",
            )
        return NamedKVEvents(found) if found else None

    def get_handshake_metadata(self) -> NamedHandshakeMetadata | None:
        found = self._kids.present("get_handshake_metadata")
        return NamedHandshakeMetadata(found) if found else None

    def build_connector_worker_meta(self) -> NamedMultiConnectorWorkerMetadata | None:
        """Each child's worker metadata by name, and the reports of the children that report on
        fewer workers than all (:meth:`get_finished_count`), for the scheduler to count."""
        return self._worker.build_connector_worker_meta()

    def get_finished_count(self) -> int | None:
        """``None``: vLLM's output aggregator awaits every worker's report of a request.

        The children's own counts are kept per child instead (:attr:`finished_counts`): a
        worker reports a request once the savers that report on every worker have reported
        there, and forwards the reports of a child that reports on fewer workers to the
        scheduler, which counts them by name and tells vLLM once every such child's workers
        reported (docs/vllm.md, "Children that report on fewer workers").

        Every child is asked its own here, when vLLM asks (as vLLM's class asks them), or
        when a count is first needed, whichever comes first; once.
        """
        self._kids.counted()
        return None

    @property
    def finished_counts(self) -> dict[str, int]:
        """The children that report a transfer on fewer workers than all, with how many."""
        return dict(self._kids.counted())

    def _has_pending(self, method: str) -> bool:
        """Whether any child answers ``method()`` (``has_pending_block_frees``,
        ``has_pending_push_work``) truly; a child that raises counts as no."""
        answers = self._kids.gather_soft(method, lambda _, c: getattr(c, method)(), "counted as no")
        return any(answers.values())

    def _route_handshake(self, metadata: Mapping[Any, Any], method: str) -> None:
        """Every child, in order, gets its own entries of :class:`NamedHandshakeMetadata`
        (``{}`` when it has none: vLLM's class calls every child too)."""

        def route(name: str, child: Any) -> None:
            mine = {
                rank: meta.children[name]
                for rank, meta in metadata.items()
                if isinstance(meta, NamedHandshakeMetadata) and name in meta.children
            }
            getattr(child, method)(mine)

        self._kids.gather(method, route)

    # -- both roles ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Shut every child down once, even after failures; raise them all as ConnectorFailures.
        From then on no child is asked again: every hook answers neutrally (:mod:`.closed`).

        First logs at DEBUG how many requests each of this role's books still holds
        (``multiconnector shutdown (<role>): held={...}``, all 0 on a drained engine)."""
        if self._kids.closed:
            return
        held: dict[str, int] = {}
        if self._sched is not None:
            held |= {"tracker": len(self._sched.tracker), "saving": len(self._sched.saving)}
            self._sched.tracker.shutdown()  # its slots have nothing to shut down
        if self._work is not None:
            held |= {"ledger": len(self._work.ledger), "loads": len(self._work.loads)}
            self._work.loads.shutdown()
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug("multiconnector shutdown (%s): held=%s", self.role.name, json.dumps(held))
        try:
            self._kids.shutdown()
        finally:
            close(self, self._kids.names, None if self._sched is None else self._sched._seal)

    def reset_cache(self) -> bool:
        """Whether every child reset (vLLM's rule: an answer that is not ``False``); a child
        answering ``None`` (it does not say) is logged at WARNING: it may still serve blocks."""
        results = self._kids.gather_soft(
            "reset_cache", lambda _, c: c.reset_cache(), "counted as not reset"
        )
        unsure = [name for name, result in results.items() if result is None]
        if unsure:
            logger.warning(
                "reset_cache: child connector(s) %s answered None, not whether they reset; "
                "counted as reset, as vLLM does, but they may still serve cached blocks",
                ", ".join(unsure),
            )
        # A child that raised is missing from results: it did not reset.
        return len(results) == len(self._kids.names) and all(
            result is not False for result in results.values()
        )

    def get_kv_connector_stats(self) -> NamedMultiConnectorStats | None:
        stats: dict[str, Any] = {}
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._kids.fan.get_kv_connector_stats:  # every step, both roles
            try:
                found = child.get_kv_connector_stats()
            except Exception as exc:
                failures = failed(failures, name, exc)
                continue
            if found is None:
                continue
            if not isinstance(found, KVConnectorStats):  # vLLM would call its methods
                failures = failed(
                    failures, name, wrong_answer(name, "get_kv_connector_stats", found)
                )
                continue
            stats[name] = found
        if failures is not None:
            self._kids.absorb("get_kv_connector_stats", failures, "its stats of this step dropped")
        new = self._kids.trouble.take_unreported()
        sched = self._sched
        hits = sched.hits.take_unreported() if sched is not None else {}
        moved = (
            sched.health.take_unreported() if sched is not None and sched.health is not None else {}
        )
        if not stats and not new and not hits and not moved:
            return None
        counts = {name: {FAILED + hook: n for hook, n in per.items()} for name, per in new.items()}
        for prefix, table in ((LOOKUP, hits), (HEALTH, moved)):
            for name, per in table.items():
                mine = counts.setdefault(name, {})
                for count, n in per.items():
                    mine[prefix + count] = n
        sources = {name: self._kids.sources[name] for name in (*stats, *counts)}
        return NamedMultiConnectorStats(data=stats, sources=sources, counts=counts)


def _flag(name: str, hook: str, answer: Any) -> bool:
    """Child ``name``'s answer to ``hook``, which must be a ``bool``."""
    if not isinstance(answer, bool):
        raise InvalidArgumentError(
            f"child {name!r} answered {hook} with {shown(answer)}; must be a bool"
        )
    return answer


def _call_if_present(child: Any, method: str) -> None:
    """``child.<method>()``, or nothing for a child whose vLLM has no such method (the base
    class's default in the version that added it)."""
    found = getattr(child, method, None)
    if found is not None:
        found()


#: The hooks of the installed vLLM's base class that ours neither composes nor inherits on
#: purpose (none on the tested vLLMs): vLLM's own class's composition, or the base's default
#: (:mod:`multiconnector.vllm.hooks`).
ADOPTED: Final = adopt(MultiConnector, (KVConnectorBase_V1, SupportsHMA), VllmMultiConnector)

"""The vLLM-facing connector: :class:`MultiConnector`, under vLLM's own class name.

Assembled from :class:`~multiconnector.vllm.scheduler.SchedulerRole` and
:class:`~multiconnector.vllm.worker.WorkerRole` (each role's methods, over
:class:`~multiconnector.vllm._base.ConnectorBase`'s state and helpers), ahead of vLLM's
``KVConnectorBase_V1`` so that theirs override its defaults; here are the introspection, the
class-level queries and the calls both roles get.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Final

from vllm.config.cache import _layout_from_name
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, SupportsHMA
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from .._validate import shown
from ..aggregator import MultiConnector as Aggregator
from ..errors import InvalidArgumentError
from ..ledger import SaveLedger
from ..outcome import Outcome
from ._base import ConnectorBase, _failed
from .config import child_specs, connector_class, specs_of, without_hma
from .errors import ChildrenConflictError
from .hits import LOOKUP
from .scheduler import SchedulerRole
from .wire import (
    FAILED,
    NamedMultiConnectorMetadata,
    NamedMultiConnectorStats,
    NamedPromMetrics,
    is_named_stats_entry,
)
from .worker import WorkerRole

__all__ = ["MultiConnector"]

logger: Final = logging.getLogger("multiconnector")


def _resolved_layout(name: str) -> Any:
    """The KV cache layout ``name`` stands for, as vLLM 0.33 resolves it (``"HND"`` is
    ``"LBHNC"``); a name vLLM does not know stands for itself (vLLM refuses it later)."""
    try:
        return _layout_from_name(name)
    except (ValueError, TypeError):
        return name


class MultiConnector(SchedulerRole, WorkerRole, KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
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
    def _connectors(self) -> list[Any]:
        """vLLM's class's private list of the children, in configuration order, which its
        subclasses read (a new list: changing it changes nothing here).

        Assigning a list of as many connectors puts them in the children's places, by
        position: the names, and so the books, stay (docs/vllm.md, "What subclasses of
        vLLM's class read").
        """
        return list(self._children.values())

    @_connectors.setter
    def _connectors(self, connectors: Sequence[Any]) -> None:
        self._replace_children(list(connectors))

    @property
    def tracker(self) -> Aggregator:
        """Scheduler: each request from its arrival to ``request_finished`` (held longer only
        while a load is still in flight, or when a child answered ``request_finished`` with
        garbage). The saves it then hands off are awaited by the workers, not here: see
        :attr:`saving` and, on a worker, :attr:`ledger`. Worker: holds no request."""
        return self._tracker

    @property
    def ledger(self) -> SaveLedger:
        """Worker: the finished requests' awaited saves, each held until every saver the
        scheduler named reported it (unused on the scheduler).

        .. versionadded:: 0.1.0
        """
        return self._ledger

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

    def child_hits(self) -> dict[str, dict[str, int]]:
        """Scheduler: per child name, its lookups so far: ``asked``, ``hits`` (more than 0
        tokens), ``tokens_offered``, ``chosen`` and ``tokens_chosen`` (the loads it was chosen
        for), ``loads_completed`` and ``loads_failed`` (asynchronous loads); a count that is 0
        is absent (docs/vllm.md, "Hits per child").

        .. versionadded:: 0.1.0
        """
        return self._hits.counts()

    def connector_counts(self) -> dict[str, dict[Outcome, int]]:
        """Outcomes of the children's reports, per child name: ignored ones included."""
        counts: dict[str, dict[Outcome, int]] = {}
        for books in (self._tracker, self._ledger, self._loads):
            for name, per in books.connector_counts().items():
                mine = counts.setdefault(name, {})
                for outcome, n in per.items():
                    mine[outcome] = mine.get(outcome, 0) + n
        for (outcome, name), n in self._counted_outcomes.items():
            mine = counts.setdefault(name, {})
            mine[outcome] = mine.get(outcome, 0) + n
        return counts

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
        # A child class without the method (vLLM 0.32 had none) answers the base class's
        # default of the version that added it (0.33): True.
        return all(
            getattr(spec.connector_class(), "supports_sleep_mode", _sleeps)(spec.config)
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
        """The children's one required layout, compared as vLLM resolves layout names (so
        ``"HND"`` and ``"LBHNC"`` agree); the first child's name for it is returned."""
        layouts: dict[Any, list[tuple[str, str]]] = {}
        for spec in specs_of(vllm_config.kv_transfer_config):
            layout = spec.connector_class().get_required_kvcache_layout(
                spec.vllm_config(vllm_config)
            )
            if layout is not None:
                layouts.setdefault(_resolved_layout(layout), []).append((layout, spec.name))
        if len(layouts) > 1:
            raise ChildrenConflictError(
                f"KV cache layout mismatch: found {len(layouts)} different layouts; "
                "child connectors require different KV cache layouts: "
                + "; ".join(
                    f"{named[0][0]} by {', '.join(name for _, name in named)}"
                    for named in layouts.values()
                )
            )
        return next((named[0][0] for named in layouts.values()), None)

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
        if metadata.savers:
            # These requests finished on the scheduler; each awaits exactly these names now.
            if self._known_counts():
                self._expect_counted(metadata.savers)
            else:
                self._ledger.expect(metadata.savers)
        for request_id, name in metadata.loads.items():
            if name in self._known_counts():
                self._expect_counted_load(request_id, name)
                continue
            if request_id not in self._loads:
                self._loads.begin(request_id)
            self._load_plan[request_id] = name
            try:
                self._loads.match_tokens(request_id, 0)
            finally:
                del self._load_plan[request_id]
        if metadata.failed_loads or metadata.load_errors:
            self._fail_loads_known(metadata)
        self._bound = metadata
        children = metadata.children
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:
            try:
                child.bind_connector_metadata(children[name])
            except Exception as exc:
                failures = _failed(failures, name, exc)
        if failures is not None:
            self._loader_failed("bind_connector_metadata", failures)
        super().bind_connector_metadata(connector_metadata)

    def _fail_loads_known(self, metadata: NamedMultiConnectorMetadata) -> None:
        """The loads the scheduler knows failed (its child failed there): reported failed by
        this worker, as each worker reports its loads, so vLLM recomputes them."""
        if metadata.failed_loads:
            due = self._due_results()
            for request_id in metadata.failed_loads:
                due.finished_recving.add(request_id)
                due.failed_recving.add(request_id)
        self._load_errors_due.update(metadata.load_errors)

    def clear_connector_metadata(self) -> None:
        self._bound = None
        self._each("clear_connector_metadata")
        super().clear_connector_metadata()

    def shutdown(self) -> None:
        """Shut every child down, even after failures; raise them all as ConnectorFailures.

        First logs at DEBUG how many requests each of this role's books still holds
        (``multiconnector shutdown (<role>): held={...}``, all 0 on a drained engine)."""
        if logger.isEnabledFor(logging.DEBUG):
            held = {"tracker": len(self._tracker), "saving": len(self._saving)}
            held |= {"ledger": len(self._ledger), "loads": len(self._loads)}
            logger.debug("multiconnector shutdown (%s): held=%s", self.role.name, json.dumps(held))
        self._tracker.shutdown()

    def reset_cache(self) -> bool:
        """Whether every child reset (vLLM's rule: an answer that is not ``False``); a child
        answering ``None`` (it does not say) is logged at WARNING: it may still serve blocks."""
        results = self._gather_soft(
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
        return len(results) == len(self._children) and all(
            result is not False for result in results.values()
        )

    def get_kv_connector_stats(self) -> NamedMultiConnectorStats | None:
        stats: dict[str, Any] = {}
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._fan.get_kv_connector_stats:  # every step, both roles
            try:
                found = child.get_kv_connector_stats()
            except Exception as exc:
                failures = _failed(failures, name, exc)
                continue
            if found is not None:
                stats[name] = found
        if failures is not None:
            self._absorb("get_kv_connector_stats", failures, "its stats of this step dropped")
        new = self._trouble.take_unreported()
        hits = self._hits.take_unreported()
        if not stats and not new and not hits:
            return None
        counts = {name: {FAILED + hook: n for hook, n in per.items()} for name, per in new.items()}
        for name, per in hits.items():
            mine = counts.setdefault(name, {})
            for count, n in per.items():
                mine[LOOKUP + count] = n
        sources = {
            name: (self._specs[name].kv_connector, self._specs[name].module_path)
            for name in (*stats, *counts)
        }
        return NamedMultiConnectorStats(data=stats, sources=sources, counts=counts)


def _own_overrides(cls: type[Any], base: type[Any]) -> None:
    """Put in ``cls.__dict__`` each public member of ``base`` that one of ``cls``'s own
    mixins overrides (the same object: nothing changes but where it is listed).

    vLLM checks its class's ``__dict__`` for an override of every member of the base class;
    ours are spread over the roles' mixins.
    """
    for name in dir(base):
        if name.startswith("_") or name in cls.__dict__:
            continue
        for klass in cls.__mro__[1:]:
            if klass is base or not issubclass(klass, ConnectorBase):
                continue
            if name in klass.__dict__:
                setattr(cls, name, klass.__dict__[name])
                break


_own_overrides(MultiConnector, KVConnectorBase_V1)


def _sleeps(kv_transfer_config: Any) -> bool:
    """vLLM 0.33's ``KVConnectorBase_V1.supports_sleep_mode`` default, for a child without it."""
    return True

"""What crosses process boundaries: connector, worker and handshake metadata, stats, metrics.

Everything here is keyed by child name, never by position.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import msgspec
from vllm.distributed.kv_events import KVConnectorKVEvents
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from .._validate import shown
from ..errors import InvalidArgumentError

__all__ = [
    "NamedEvents",
    "NamedHandshakeMetadata",
    "NamedKVEvents",
    "NamedMultiConnectorMetadata",
    "NamedMultiConnectorStats",
    "NamedMultiConnectorWorkerMetadata",
    "NamedPromMetrics",
    "msgspec_dec_hook",
    "msgspec_enc_hook",
]


class NamedMultiConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """What the scheduler sends the workers each step, keyed by child name.

    ``children`` holds each child's own metadata. ``savers`` maps each request that finished
    with asynchronous saves to the names that committed to one: the worker releases it only
    once all of them reported. ``loads`` maps each request whose asynchronous load started to
    the name chosen to load it: the only one whose load completion is passed on.

    When a child fails (docs/vllm.md, "When a child fails"), its entry in ``children`` is
    ``None`` (it built no metadata this step), and the workers report what its failure did to
    the loads: ``failed_loads`` maps each asynchronous load known failed on the scheduler to
    its loader (every worker reports it finished and failed); ``load_errors`` holds the blocks
    of the synchronous loads known failed there; ``sync_loads`` maps each synchronous load of
    the step to its loader and the blocks its external tokens fill (a worker on which that
    loader fails reports them as load errors). vLLM then recomputes those tokens.

    vLLM sends it to workers with pickle. For msgspec, encode with :func:`msgspec_enc_hook` and
    decode with ``type=NamedMultiConnectorMetadata, dec_hook=msgspec_dec_hook``: the children's
    metadata types are recorded, so each comes back as its own type.

    .. versionadded:: 0.1.0
    """

    def __init__(
        self,
        children: Mapping[str, Any] | None = None,
        *,
        savers: Mapping[str, Iterable[str]] | None = None,
        loads: Mapping[str, str] | None = None,
        sync_loads: Mapping[str, tuple[str, Iterable[int]]] | None = None,
        failed_loads: Mapping[str, str] | None = None,
        load_errors: Iterable[int] = (),
    ) -> None:
        self.children: dict[str, Any] = dict(children or {})
        self.savers: dict[str, tuple[str, ...]] = {
            request_id: tuple(names) for request_id, names in (savers or {}).items()
        }
        self.loads: dict[str, str] = dict(loads or {})
        self.sync_loads = {
            request_id: (str(name), tuple(blocks))
            for request_id, (name, blocks) in (sync_loads or {}).items()
        }
        self.failed_loads = dict(failed_loads or {})
        self.load_errors = tuple(load_errors)

    # Most steps have none of these: read from the class, not stored per instance.
    sync_loads: Mapping[str, tuple[str, tuple[int, ...]]] = MappingProxyType({})
    failed_loads: Mapping[str, str] = MappingProxyType({})
    load_errors: tuple[int, ...] = ()

    @classmethod
    def owning(
        cls,
        children: dict[str, Any],
        savers: dict[str, tuple[str, ...]],
        loads: dict[str, str],
    ) -> NamedMultiConnectorMetadata:
        """The metadata holding these very dicts, which the caller gives up (no copies)."""
        metadata = cls.__new__(cls)
        metadata.children = children
        metadata.savers = savers
        metadata.loads = loads
        return metadata

    def names(self) -> set[str]:
        """Every child name this metadata mentions."""
        mentioned = set(self.children)
        mentioned.update(self.loads.values())
        mentioned.update(self.failed_loads.values())
        mentioned.update(name for name, _ in self.sync_loads.values())
        for names in self.savers.values():
            mentioned.update(names)
        return mentioned

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NamedMultiConnectorMetadata):
            return NotImplemented
        return self._fields() == other._fields()

    def _fields(self) -> tuple[Any, ...]:
        return (
            self.children,
            self.savers,
            self.loads,
            dict(self.sync_loads),
            dict(self.failed_loads),
            self.load_errors,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"NamedMultiConnectorMetadata(children={self.children!r}, "
            f"savers={self.savers!r}, loads={self.loads!r}"
            + (
                f", sync_loads={dict(self.sync_loads)!r}, failed_loads="
                f"{dict(self.failed_loads)!r}, load_errors={self.load_errors!r})"
                if self.sync_loads or self.failed_loads or self.load_errors
                else ")"
            )
        )


def _type_path(cls: type[Any]) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _resolve_metadata_type(path: str) -> type[Any]:
    module, _, qualname = path.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    if not (isinstance(found, type) and issubclass(found, KVConnectorMetadata)):
        raise InvalidArgumentError(
            f"metadata type={path!r} must name a KVConnectorMetadata subclass"
        )
    return found


def msgspec_enc_hook(obj: Any) -> Any:
    """msgspec ``enc_hook`` for :class:`NamedMultiConnectorMetadata`.

    Children's metadata is encoded by msgspec itself, tagged with its type; it must be of a type
    msgspec encodes (a dataclass, an attrs class, a ``msgspec.Struct``...).

    .. versionadded:: 0.1.0
    """
    if isinstance(obj, NamedMultiConnectorMetadata):
        return {
            "children": {
                name: None if meta is None else [_type_path(type(meta)), meta]
                for name, meta in obj.children.items()
            },
            "savers": {request_id: list(names) for request_id, names in obj.savers.items()},
            "loads": dict(obj.loads),
            "sync_loads": {r: [name, list(b)] for r, (name, b) in obj.sync_loads.items()},
            "failed_loads": dict(obj.failed_loads),
            "load_errors": list(obj.load_errors),
        }
    raise NotImplementedError(f"msgspec_enc_hook cannot encode type {type(obj).__name__}")


def msgspec_dec_hook(type_: type[Any], obj: Any) -> Any:
    """msgspec ``dec_hook`` for :class:`NamedMultiConnectorMetadata` (see there).

    .. versionadded:: 0.1.0
    """
    if type_ is not NamedMultiConnectorMetadata:
        raise NotImplementedError(f"msgspec_dec_hook cannot decode type {type_!r}")
    if not isinstance(obj, Mapping):
        raise InvalidArgumentError(f"encoded metadata={shown(obj)} must be a mapping")
    children: dict[str, Any] = {}
    for name, entry in obj.get("children", {}).items():
        if entry is None:  # the child failed to build its metadata
            children[name] = None
            continue
        path, raw = entry
        children[name] = msgspec.convert(
            raw, type=_resolve_metadata_type(path), dec_hook=msgspec_dec_hook
        )
    return NamedMultiConnectorMetadata(
        children,
        savers=obj.get("savers", {}),
        loads=obj.get("loads", {}),
        sync_loads=obj.get("sync_loads", {}),
        failed_loads=obj.get("failed_loads", {}),
        load_errors=obj.get("load_errors", ()),
    )


@dataclass
class NamedMultiConnectorWorkerMetadata(KVConnectorWorkerMetadata):  # type: ignore[misc]
    """Each child's worker metadata, keyed by child name (children with none are absent).

    ``sent`` carries, per child that reports a transfer on fewer workers than all, how many
    workers reported each request finished sending (1 from one worker; summed as workers'
    metadata is aggregated): the scheduler counts them against the child's finished count.
    ``loaded`` carries such a child's load reports (of the requests it was chosen to load) the
    same way, and ``load_failed`` those of them that were failed loads.

    .. versionadded:: 0.1.0
    """

    children: dict[str, Any] = field(default_factory=dict)
    sent: dict[str, dict[str, int]] = field(default_factory=dict)
    loaded: dict[str, dict[str, int]] = field(default_factory=dict)
    load_failed: dict[str, dict[str, int]] = field(default_factory=dict)

    def aggregate(self, other: Any) -> NamedMultiConnectorWorkerMetadata:
        """A new object: each name's metadata aggregated with the other worker's, by name."""
        if not isinstance(other, NamedMultiConnectorWorkerMetadata):
            raise InvalidArgumentError(
                f"other={shown(other)} must be a NamedMultiConnectorWorkerMetadata"
            )
        merged = dict(self.children)
        for name, theirs in other.children.items():
            mine = merged.get(name)
            merged[name] = theirs if mine is None else mine.aggregate(theirs)
        return NamedMultiConnectorWorkerMetadata(
            merged,
            _summed(self.sent, other.sent),
            _summed(self.loaded, other.loaded),
            _summed(self.load_failed, other.load_failed),
        )


def _summed(
    mine: dict[str, dict[str, int]], theirs: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """A new ``name -> request id -> count`` dict: ``mine``'s counts plus ``theirs``."""
    summed = {name: dict(counts) for name, counts in mine.items()}
    for name, counts in theirs.items():
        into = summed.setdefault(name, {})
        for request_id, n in counts.items():
            into[request_id] = into.get(request_id, 0) + n
    return summed


class NamedKVEvents(KVConnectorKVEvents):  # type: ignore[misc]
    """Each child's KV cache events object, keyed by child name, merged by name across workers.

    vLLM's output aggregator requires one events type from every worker and merges the others
    into the first worker's object with ``add_events(other.get_all_events())`` and
    ``increment_workers(1)``. Here :meth:`get_all_events` hands over the children's objects
    themselves, tagged with their names, and :meth:`add_events` merges each into this object's
    own for that name as vLLM's aggregator merges that child's class (its ``add_events`` and
    ``increment_workers(1)``), or takes it as that name's first. The scheduler then gives each
    child its own object (:attr:`children`), of its own class, and only that.

    .. versionadded:: 0.1.0
    """

    def __init__(self, children: Mapping[str, Any] | None = None, workers: int = 1) -> None:
        self.children: dict[str, Any] = dict(children or {})
        self._workers = workers

    def add_events(self, events: list[Any]) -> None:
        for item in events:
            if not isinstance(item, NamedEvents):
                raise InvalidArgumentError(
                    f"an item of events={shown(item)} must be a NamedEvents (a NamedKVEvents "
                    "merges only another worker's NamedKVEvents)"
                )
            mine = self.children.get(item.name)
            if mine is None:
                self.children[item.name] = item.events
            else:
                mine.add_events(item.events.get_all_events())
                mine.increment_workers(1)

    def aggregate(self) -> NamedKVEvents:
        for events in self.children.values():
            events.aggregate()
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._workers += count

    def get_all_events(self) -> list[Any]:
        """The children's events objects, each tagged with its name (see the class)."""
        return [NamedEvents(name, events) for name, events in self.children.items()]

    def get_number_of_workers(self) -> int:
        return self._workers

    def clear_events(self) -> None:
        for events in self.children.values():
            events.clear_events()
        self._workers = 1

    def __repr__(self) -> str:
        return f"NamedKVEvents(children={self.children!r}, workers={self._workers})"


@dataclass(frozen=True)
class NamedEvents:
    """One child's events object, tagged with the child's name, as
    :meth:`NamedKVEvents.get_all_events` lists it.

    .. versionadded:: 0.1.0
    """

    name: str
    events: Any


@dataclass
class NamedHandshakeMetadata(KVConnectorHandshakeMetadata):  # type: ignore[misc]
    """Each child's handshake metadata, keyed by child name (children with none are absent).

    vLLM's ``MultiConnector`` returns the first child's and hands it to every child.

    .. versionadded:: 0.1.0
    """

    children: dict[str, Any] = field(default_factory=dict)


@dataclass
class NamedMultiConnectorStats(KVConnectorStats):  # type: ignore[misc]
    """Each child's stats, keyed by child name.

    ``data`` maps names to the children's ``KVConnectorStats``; ``sources`` maps names to the
    ``(kv_connector, kv_connector_module_path)`` that made them. :meth:`to_dict` carries both,
    so :meth:`MultiConnector.build_kv_connector_stats` rebuilds each child's stats in
    another process with that child's own class, which need not be registered with vLLM's
    factory. vLLM's ``MultiConnector`` keys stats by class name: two children of one class merge
    into one entry, and rebuilding fails for a class loaded by module path.

    .. versionadded:: 0.1.0
    """

    sources: dict[str, tuple[str, str | None]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        payload: dict[str, Any] = {}
        for name, stats in self.data.items():
            connector, module_path = self.sources.get(name, (None, None))
            payload[name] = {
                "kv_connector": connector,
                "kv_connector_module_path": module_path,
                "stats": stats.to_dict(),
            }
        return payload

    def reset(self) -> None:
        for stats in self.data.values():
            stats.reset()

    def aggregate(self, other: Any) -> NamedMultiConnectorStats:
        """Fold ``other`` into this accumulator, name by name; returns ``self``."""
        if not isinstance(other, NamedMultiConnectorStats):
            raise InvalidArgumentError(f"other={shown(other)} must be a NamedMultiConnectorStats")
        for name, stats in other.data.items():
            mine = self.data.get(name)
            self.data[name] = stats if mine is None else mine.aggregate(stats)
            if name in other.sources:
                self.sources.setdefault(name, other.sources[name])
        return self

    def reduce(self) -> dict[str, int | float]:
        """Each child's reduced values, under ``"<name>.<key>"``."""
        return {
            f"{name}.{key}": value
            for name, stats in self.data.items()
            for key, value in stats.reduce().items()
        }

    def is_empty(self) -> bool:
        return all(stats.is_empty() for stats in self.data.values())


class NamedPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """Routes each child's stats payload to the Prometheus metrics of that child's class.

    Metrics are built once per class (Prometheus refuses to register a metric twice), so two
    children of one class record into the same metrics.

    .. versionadded:: 0.1.0
    """

    def __init__(
        self,
        vllm_config: Any,
        metric_types: Any,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
        by_name: Mapping[str, Any],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self.by_name = dict(by_name)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, entry in transfer_stats_data.items():
            metrics = self.by_name.get(name)
            if metrics is not None and isinstance(entry, Mapping):
                metrics.observe(entry.get("stats", {}), engine_idx)

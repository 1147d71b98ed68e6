"""What crosses process boundaries: connector, worker and handshake metadata, stats, metrics.

Everything here is keyed by child name, never by position.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
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
    "NamedHandshakeMetadata",
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
    ) -> None:
        self.children: dict[str, Any] = dict(children or {})
        self.savers: dict[str, tuple[str, ...]] = {
            request_id: tuple(names) for request_id, names in (savers or {}).items()
        }
        self.loads: dict[str, str] = dict(loads or {})

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
        for names in self.savers.values():
            mentioned.update(names)
        return mentioned

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NamedMultiConnectorMetadata):
            return NotImplemented
        return (self.children, self.savers, self.loads) == (
            other.children,
            other.savers,
            other.loads,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"NamedMultiConnectorMetadata(children={self.children!r}, "
            f"savers={self.savers!r}, loads={self.loads!r})"
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
                name: [_type_path(type(meta)), meta] for name, meta in obj.children.items()
            },
            "savers": {request_id: list(names) for request_id, names in obj.savers.items()},
            "loads": dict(obj.loads),
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
    for name, (path, raw) in obj.get("children", {}).items():
        children[name] = msgspec.convert(
            raw, type=_resolve_metadata_type(path), dec_hook=msgspec_dec_hook
        )
    return NamedMultiConnectorMetadata(
        children, savers=obj.get("savers", {}), loads=obj.get("loads", {})
    )


@dataclass
class NamedMultiConnectorWorkerMetadata(KVConnectorWorkerMetadata):  # type: ignore[misc]
    """Each child's worker metadata, keyed by child name (children with none are absent).

    .. versionadded:: 0.1.0
    """

    children: dict[str, Any] = field(default_factory=dict)

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
        return NamedMultiConnectorWorkerMetadata(merged)


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

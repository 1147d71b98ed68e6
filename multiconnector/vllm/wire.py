"""What crosses process boundaries: connector, worker and handshake metadata, stats, metrics.

Everything here is keyed by child name, never by position.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, NamedTuple

import msgspec
from vllm.distributed.kv_events import KVConnectorKVEvents
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (
    MultiKVConnectorStats,
    MultiKVConnectorWorkerMetadata,
)

from .._validate import shown
from ..errors import InvalidArgumentError
from ..health import Health
from .config import HEALTH_KEY, specs_of
from .hits import LOOKUP

__all__ = [
    "NamedEvents",
    "NamedHandshakeMetadata",
    "NamedKVEvents",
    "NamedMultiConnectorMetadata",
    "NamedMultiConnectorStats",
    "NamedMultiConnectorWorkerMetadata",
    "NamedPromMetrics",
    "Outbox",
    "msgspec_dec_hook",
    "msgspec_enc_hook",
]


def _why(exc: Exception) -> str:
    """What a child's object raised, for a failure recorded where vLLM called it: one line."""
    return f"{type(exc).__name__}: {exc}"[:500]


_NO_LOADS: Final[Mapping[str, Any]] = MappingProxyType({})


class Outbox(NamedTuple):
    """One step's news for the workers, as the scheduler part sealed it: who saves, who loads
    asynchronously, the split loads' parts, the synchronous loads, the asynchronous loads known
    failed, the blocks of the synchronous loads known failed (the fields of
    :class:`NamedMultiConnectorMetadata` of the same names). Handed whole to
    :meth:`NamedMultiConnectorMetadata.owning`, which builds the step's metadata from it; the
    scheduler keeps nothing of it (its dicts are new each step)."""

    savers: dict[str, tuple[str, ...]]
    loads: dict[str, str]
    split_loads: Mapping[str, tuple[tuple[str, tuple[int, ...]], ...]] = _NO_LOADS
    sync_loads: Mapping[str, tuple[str, tuple[int, ...]]] = _NO_LOADS
    failed_loads: Mapping[str, str] = _NO_LOADS
    load_errors: tuple[int, ...] = ()


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

    ``split_loads`` maps each request whose load this step is split across children
    (``split_loads`` in the configuration) to its parts: ``(name, blocks)`` each, in token
    order, the first the loader named in ``loads`` (when asynchronous). A worker passes on one
    load completion once every part reported, and reports the blocks of a part that failed as
    load errors, so vLLM recomputes from that part's first block on.

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
        split_loads: Mapping[str, Iterable[tuple[str, Iterable[int]]]] | None = None,
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
        if split_loads:
            self.split_loads = {
                request_id: tuple((str(name), tuple(blocks)) for name, blocks in parts)
                for request_id, parts in split_loads.items()
            }

    # Most steps have none of these: read from the class, not stored per instance.
    split_loads: Mapping[str, tuple[tuple[str, tuple[int, ...]], ...]] = MappingProxyType({})
    sync_loads: Mapping[str, tuple[str, tuple[int, ...]]] = MappingProxyType({})
    failed_loads: Mapping[str, str] = MappingProxyType({})
    load_errors: tuple[int, ...] = ()

    @classmethod
    def owning(cls, children: dict[str, Any], outbox: Outbox) -> NamedMultiConnectorMetadata:
        """The metadata holding ``children`` and ``outbox``'s very dicts, which the caller gives
        up (no copies): built whole here, never changed afterwards."""
        metadata = cls.__new__(cls)
        metadata.children = children
        metadata.savers = outbox.savers
        metadata.loads = outbox.loads
        # Most steps have none of these: the class's empty ones are read then.
        if outbox.split_loads:
            metadata.split_loads = outbox.split_loads
        if outbox.sync_loads or outbox.failed_loads or outbox.load_errors:
            metadata.sync_loads = outbox.sync_loads
            metadata.failed_loads = outbox.failed_loads
            metadata.load_errors = outbox.load_errors
        return metadata

    def names(self) -> set[str]:
        """Every child name this metadata mentions."""
        mentioned = set(self.children)
        mentioned.update(self.loads.values())
        mentioned.update(self.failed_loads.values())
        mentioned.update(name for name, _ in self.sync_loads.values())
        for parts in self.split_loads.values():
            mentioned.update(name for name, _ in parts)
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
            dict(self.split_loads),
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
            + (f"[split_loads={dict(self.split_loads)!r}]" if self.split_loads else "")
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
            "split_loads": {
                r: [[name, list(b)] for name, b in parts] for r, parts in obj.split_loads.items()
            },
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
        split_loads=obj.get("split_loads", {}),
    )


class NamedMultiConnectorWorkerMetadata(MultiKVConnectorWorkerMetadata):  # type: ignore[misc]
    """Each child's worker metadata, keyed by child name (children with none are absent).

    ``sent`` carries, per child that reports a transfer on fewer workers than all, how many
    workers reported each request finished sending (1 from one worker; summed as workers'
    metadata is aggregated): the scheduler counts them against the child's finished count.
    ``loaded`` carries such a child's load reports (of the requests it was chosen to load) the
    same way, and ``load_failed`` those of them that were failed loads. ``failed`` names the
    children whose metadata raised while vLLM aggregated the workers' (outside the connector's
    calls): dropped for the step, each with why; the scheduler counts them.

    A vLLM ``MultiKVConnectorWorkerMetadata``: :attr:`metadata` is vLLM's view, one entry per
    child in configuration order (``order``, the names), ``None`` for a child with none. It is
    read from ``children``, which is what this package routes by.

    .. versionadded:: 0.1.0
    """

    def __init__(
        self,
        children: dict[str, Any] | None = None,
        sent: dict[str, dict[str, int]] | None = None,
        loaded: dict[str, dict[str, int]] | None = None,
        load_failed: dict[str, dict[str, int]] | None = None,
        *,
        order: tuple[str, ...] = (),
        failed: dict[str, str] | None = None,
    ) -> None:
        self.children: dict[str, Any] = {} if children is None else children
        self.sent: dict[str, dict[str, int]] = {} if sent is None else sent
        self.loaded: dict[str, dict[str, int]] = {} if loaded is None else loaded
        self.load_failed: dict[str, dict[str, int]] = {} if load_failed is None else load_failed
        #: Every child's name, in configuration order (empty: the order of ``children``).
        self.order = order
        #: Per child name, why its metadata was dropped while aggregated.
        self.failed: dict[str, str] = {} if failed is None else failed

    @property
    def metadata(self) -> tuple[Any, ...]:
        """vLLM's view: each child's worker metadata in configuration order, or ``None``."""
        children = self.children
        return tuple(children.get(name) for name in (self.order or tuple(children)))

    def aggregate(self, other: Any) -> NamedMultiConnectorWorkerMetadata:
        """A new object: each name's metadata aggregated with the other worker's, by name."""
        if not isinstance(other, NamedMultiConnectorWorkerMetadata):
            raise InvalidArgumentError(
                f"other={shown(other)} must be a NamedMultiConnectorWorkerMetadata"
            )
        failed = {**self.failed, **other.failed}
        merged = {name: meta for name, meta in self.children.items() if name not in failed}
        for name, theirs in other.children.items():
            mine = merged.get(name)
            if name in failed:
                continue
            if mine is None:
                merged[name] = theirs
                continue
            try:
                merged[name] = mine.aggregate(theirs)
            except Exception as exc:  # that child's failure: its metadata of the step dropped
                del merged[name]
                failed[name] = _why(exc)
        return NamedMultiConnectorWorkerMetadata(
            merged,
            _summed(self.sent, other.sent),
            _summed(self.loaded, other.loaded),
            _summed(self.load_failed, other.load_failed),
            order=self.order or other.order,
            failed=failed,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NamedMultiConnectorWorkerMetadata):
            return NotImplemented
        return (self.children, self.sent, self.loaded, self.load_failed) == (
            other.children,
            other.sent,
            other.loaded,
            other.load_failed,
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"NamedMultiConnectorWorkerMetadata(children={self.children!r}, sent={self.sent!r}, "
            f"loaded={self.loaded!r}, load_failed={self.load_failed!r})"
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

    vLLM calls these methods outside any ``try`` of the connector's (in its output aggregator),
    so a child's object that raises there is that child's failure, not the engine's: its events
    of the step are dropped, and :attr:`failed` says why (the scheduler counts it under the
    child's name).

    .. versionadded:: 0.1.0
    """

    def __init__(self, children: Mapping[str, Any] | None = None, workers: int = 1) -> None:
        self.children: dict[str, Any] = dict(children or {})
        self._workers = workers
        #: Per child name, why its events were dropped while merged (``"<type>: <message>"``).
        self.failed: dict[str, str] = {}

    def add_events(self, events: list[Any]) -> None:
        for item in events:
            if not isinstance(item, NamedEvents):
                raise InvalidArgumentError(
                    f"an item of events={shown(item)} must be a NamedEvents (a NamedKVEvents "
                    "merges only another worker's NamedKVEvents)"
                )
            if item.name in self.failed:
                continue  # dropped for this step: a half-merged object is no one's events
            mine = self.children.get(item.name)
            if mine is None:
                self.children[item.name] = item.events
                continue
            try:
                mine.add_events(item.events.get_all_events())
                mine.increment_workers(1)
            except Exception as exc:
                self._drop(item.name, exc)

    def _drop(self, name: str, exc: Exception) -> None:
        """Child ``name``'s events object raised while merged: dropped, and why kept."""
        self.children.pop(name, None)
        self.failed[name] = _why(exc)

    def aggregate(self) -> NamedKVEvents:
        for name, events in list(self.children.items()):
            try:
                events.aggregate()
            except Exception as exc:
                self._drop(name, exc)
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._workers += count

    def get_all_events(self) -> list[Any]:
        """The children's events objects, each tagged with its name (see the class)."""
        return [NamedEvents(name, events) for name, events in self.children.items()]

    def get_number_of_workers(self) -> int:
        return self._workers

    def clear_events(self) -> None:
        for name, events in list(self.children.items()):
            try:
                events.clear_events()
            except Exception as exc:
                self._drop(name, exc)
        self._workers = 1

    def __repr__(self) -> str:
        failed = f", failed={self.failed!r}" if self.failed else ""
        return f"NamedKVEvents(children={self.children!r}, workers={self._workers}{failed})"


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
class NamedMultiConnectorStats(MultiKVConnectorStats):  # type: ignore[misc]
    """Each child's stats, keyed by child name: a vLLM ``MultiKVConnectorStats``.

    ``data`` maps names to the children's ``KVConnectorStats``; ``sources`` maps names to the
    ``(kv_connector, kv_connector_module_path)`` that made them. :meth:`to_dict` carries both,
    so :meth:`MultiConnector.build_kv_connector_stats` rebuilds each child's stats in
    another process with that child's own class, which need not be registered with vLLM's
    factory. vLLM's ``MultiConnector`` keys stats by class name: two children of one class merge
    into one entry, and rebuilding fails for a class loaded by module path.

    An entry without a source (one rebuilt from vLLM's own payload, keyed by class name) is
    written back in vLLM's shape, its stats' own ``to_dict()``. :meth:`reduce` is vLLM's shape,
    each entry's reduced values under its name, so vLLM's log line reads the same.

    ``counts`` holds, per child name, what the adapter itself counted of that child in the
    interval (``"failed.<hook>"``: the child's failures in that hook, docs/vllm.md "When a child
    fails"): summed when stats are aggregated (over workers, over steps). Each child's counts
    travel in its payload entry, beside its own stats (``"stats": None`` when it has none), and
    reach the log line under :data:`ADAPTER_KEY` and the Prometheus metrics of
    :class:`NamedPromMetrics`.

    vLLM calls these methods outside any ``try`` of the connector's (aggregating the workers'
    stats, logging, exporting): a child's stats that raise in their own ``aggregate``,
    ``to_dict``, ``reduce``, ``is_empty`` or ``reset`` (or aggregate into what is no stats) are
    that child's failure, not the engine's: its stats are dropped from this object and counted
    under ``"failed.get_kv_connector_stats"`` in its ``counts``.

    .. versionadded:: 0.1.0
    """

    sources: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def _failed(self, name: str) -> None:
        """Child ``name``'s stats raised where vLLM called them: dropped, and counted."""
        self.data.pop(name, None)
        counts = self.counts.setdefault(name, {})
        counts[_STATS_FAILED] = counts.get(_STATS_FAILED, 0) + 1

    def to_dict(self) -> dict[str, Any]:
        payload: dict[str, Any] = {}
        for name, stats in list(self.data.items()):
            try:
                own = stats.to_dict()
            except Exception:
                self._failed(name)
                continue
            source = self.sources.get(name)
            if source is None:
                payload[name] = own
                continue
            payload[name] = {
                "kv_connector": source[0],
                "kv_connector_module_path": source[1],
                "stats": own,
            }
        for name, counts in self.counts.items():
            source = self.sources.get(name)
            if source is None:  # vLLM's shape has no place for them
                continue
            entry = payload.setdefault(
                name,
                {"kv_connector": source[0], "kv_connector_module_path": source[1], "stats": None},
            )
            entry["counts"] = dict(counts)
        return payload

    def reset(self) -> None:
        self.counts.clear()
        for name, stats in list(self.data.items()):
            try:
                stats.reset()
            except Exception:
                self._failed(name)  # reported with the next interval's stats

    def aggregate(self, other: Any) -> NamedMultiConnectorStats:
        """Fold ``other`` (ours or vLLM's ``MultiKVConnectorStats``) into this accumulator,
        entry by entry; returns ``self``."""
        if not isinstance(other, MultiKVConnectorStats):
            raise InvalidArgumentError(f"other={shown(other)} must be a MultiKVConnectorStats")
        theirs = getattr(other, "sources", {})
        for name, stats in other.data.items():
            mine = self.data.get(name)
            if mine is None:
                self.data[name] = stats
                continue
            try:
                merged = mine.aggregate(stats)
            except Exception:
                self._failed(name)
                continue
            if isinstance(merged, KVConnectorStats):
                self.data[name] = merged
            else:
                self._failed(name)
        for name, source in theirs.items():
            self.sources.setdefault(name, source)
        for name, counts in getattr(other, "counts", {}).items():
            mine_counts = self.counts.setdefault(name, {})
            for key, n in counts.items():
                mine_counts[key] = mine_counts.get(key, 0) + n
        return self

    def reduce(self) -> dict[str, Any]:
        """Each entry's reduced values, under its name (vLLM's shape); the adapter's counts,
        if any, under :data:`ADAPTER_KEY`, as ``"<child>.<count>"``."""
        reduced: dict[str, Any] = {}
        for name, stats in list(self.data.items()):
            try:
                reduced[name] = stats.reduce()
            except Exception:
                self._failed(name)
        ours = {
            f"{name}.{key}": n
            for name, counts in sorted(self.counts.items())
            for key, n in sorted(counts.items())
        }
        if ours:
            reduced[ADAPTER_KEY] = ours
        return reduced

    def is_empty(self) -> bool:
        for name, stats in list(self.data.items()):
            try:
                if not stats.is_empty():
                    return False
            except Exception:
                self._failed(name)
        return not any(self.counts.values())


logger: Final = logging.getLogger("multiconnector")

#: The prefix of a count of a child's failures in one hook: ``"failed.<hook>"``.
FAILED: Final = "failed."
#: The prefix of a child's health counts: ``"health.<source>_to_<dest>"`` (its transitions),
#: and ``"health.open"`` or ``"health.half_open"`` (1 per step it was so: summed over an
#: interval, the steps it was bypassed or probing).
HEALTH: Final = "health."
#: The value of ``vllm:multiconnector_child_health`` per state.
HEALTH_GAUGE: Final = {Health.closed: 0, Health.half_open: 1, Health.open: 2}


def health_state(counts: Mapping[str, int]) -> Health | None:
    """A child's health at the end of the step whose ``counts`` these are (vLLM records each
    step's payload): its state when not closed (a count of the step, ``health.open`` or
    ``health.half_open``), closed when it moved there in that step; ``None``: it did not
    change (a closed child's counts say nothing of its health)."""
    if counts.get(HEALTH + Health.open.value):
        return Health.open
    if counts.get(HEALTH + Health.half_open.value):
        return Health.half_open
    if any(key.startswith(HEALTH) and key.endswith("_to_closed") for key in counts):
        return Health.closed
    return None


#: The count of a child whose stats raised where vLLM called them.
_STATS_FAILED: Final = FAILED + "get_kv_connector_stats"

#: Where :meth:`NamedMultiConnectorStats.reduce` puts the adapter's own counts: not a child name
#: (a name has no whitespace), so it never hides a child's entry.
ADAPTER_KEY: Final = "multiconnector adapter"

#: The keys of one entry of :meth:`NamedMultiConnectorStats.to_dict`'s payload, and the one it
#: may add.
STATS_ENTRY_KEYS: Final = frozenset({"kv_connector", "kv_connector_module_path", "stats"})
STATS_ENTRY_OPTIONAL: Final = frozenset({"counts"})


def is_named_stats_entry(entry: Any) -> bool:
    """Whether ``entry`` is one entry of our stats payload (else it is vLLM's: the stats)."""
    return (
        isinstance(entry, Mapping)
        and STATS_ENTRY_KEYS <= entry.keys() <= STATS_ENTRY_KEYS | STATS_ENTRY_OPTIONAL
        and isinstance(entry["kv_connector"], str)
    )


class NamedPromMetrics(KVConnectorPromMetrics):  # type: ignore[misc]
    """Routes each child's stats payload to the Prometheus metrics of that child's class.

    Metrics are built once per class (Prometheus refuses to register a metric twice), so two
    children of one class record into the same metrics. The adapter's own counts of each child
    (:attr:`NamedMultiConnectorStats.counts`) are recorded by child *name*:
    ``vllm:multiconnector_child_failures_total{child, hook}``, and with a health machine
    ``vllm:multiconnector_child_health{child}`` (:data:`HEALTH_GAUGE`: 0 closed, 1 half-open, 2
    open; every child 0 from the start) and
    ``vllm:multiconnector_child_health_transitions_total{child, transition}``.

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
        #: The children whose metrics' failure was logged (once each).
        self._warned: set[str] = set()
        self.child_failures = self._counter_cls(
            name="vllm:multiconnector_child_failures",
            documentation="Failures of a child connector of multiconnector's MultiConnector, by "
            "child name and hook; each degraded that child for that call, none reached the engine",
            labelnames=[*labelnames, "child", "hook"],
        )
        self.child_lookups = self._counter_cls(
            name="vllm:multiconnector_child_lookups",
            documentation="Lookups of a child connector of multiconnector's MultiConnector, by "
            "child name and count: asked, hits, tokens_offered, chosen, tokens_chosen, "
            "loads_completed, loads_failed, skipped, excluded, refused",
            labelnames=[*labelnames, "child", "count"],
        )
        self.child_health = self._gauge_cls(
            name="vllm:multiconnector_child_health",
            documentation="The health of a child connector of multiconnector's MultiConnector, "
            "by child name: 0 closed (asked), 1 half_open (probed), 2 open (not looked up)",
            labelnames=[*labelnames, "child"],
        )
        self.child_health_transitions = self._counter_cls(
            name="vllm:multiconnector_child_health_transitions",
            documentation="Transitions of a child's health machine, by child name and "
            "'<source>_to_<dest>'",
            labelnames=[*labelnames, "child", "transition"],
        )
        transfer = vllm_config.kv_transfer_config
        if transfer is not None and transfer.kv_connector_extra_config.get(HEALTH_KEY) is not None:
            for values in per_engine_labelvalues.values():
                for spec in specs_of(transfer):
                    self.child_health.labels(*values, spec.name).set(0)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, entry in transfer_stats_data.items():
            if not isinstance(entry, Mapping):
                continue
            metrics = self.by_name.get(name)
            stats = entry.get("stats", {})
            if metrics is not None and stats is not None:
                try:
                    metrics.observe(stats, engine_idx)
                except Exception:  # its class's metrics' failure: the others are recorded
                    self._observe_failed(name, engine_idx)
            counts = entry.get("counts")
            if counts:
                self._observe_counts(name, counts, engine_idx)

    def _observe_failed(self, name: str, engine_idx: int) -> None:
        """Child ``name``'s class's metrics raised recording its stats (vLLM calls this outside
        the connector's calls, in the front end): counted under the hook ``observe``, logged
        with its traceback the first time for that child."""
        values = self.per_engine_labelvalues[engine_idx]
        self.child_failures.labels(*values, name, "observe").inc()
        if name not in self._warned:
            self._warned.add(name)
            logger.warning(
                "child connector %r's Prometheus metrics failed to record its stats (counted "
                "under hook 'observe'; later failures are counted, not logged)",
                name,
                exc_info=True,
            )

    def _observe_counts(self, name: str, counts: Mapping[str, int], engine_idx: int) -> None:
        values = self.per_engine_labelvalues[engine_idx]
        for key, n in counts.items():
            if n <= 0:
                continue
            if key.startswith(FAILED):
                self.child_failures.labels(*values, name, key.removeprefix(FAILED)).inc(n)
            elif key.startswith(LOOKUP):
                self.child_lookups.labels(*values, name, key.removeprefix(LOOKUP)).inc(n)
            elif key.startswith(HEALTH) and "_to_" in key:
                moved = key.removeprefix(HEALTH)
                self.child_health_transitions.labels(*values, name, moved).inc(n)
        state = health_state(counts)
        if state is not None:
            self.child_health.labels(*values, name).set(HEALTH_GAUGE[state])

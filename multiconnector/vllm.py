"""A drop-in vLLM KV connector that composes child connectors by name.

vLLM loads it with one configuration change::

    KVTransferConfig(
        kv_connector="NamedMultiConnector",
        kv_connector_module_path="multiconnector.vllm",
        kv_role="kv_both",
        kv_connector_extra_config={"connectors": [
            {"name": "disk", "kv_connector": "ExampleConnector"},
            {"name": "pd", "kv_connector": "NixlConnector", "kv_role": "kv_producer"},
        ]},
    )

Each child is the usual per-connector transfer config plus a unique ``name``; a child without
``kv_role`` or ``engine_id`` takes the parent's. The class is deliberately *not* called
``MultiConnector``: vLLM recognises that string and reads the children with its own rules, which
reject the ``name`` key.

What changes against vLLM's own ``MultiConnector`` (docs/vllm.md has the full table):

* Everything that crosses a process boundary is keyed by child name, never by position: connector
  metadata (so a missing child is an error, not a silent ``zip`` truncation), worker metadata,
  handshake metadata, stats (two children of one class no longer collide, and stats rebuild
  from their own payload without a factory registration).
* The scheduler sends workers the *names* of the children that committed an asynchronous save of
  each finished request. A worker reports the request finished sending only when every one of
  those names has reported; duplicate and phantom reports are ignored and counted
  (:meth:`NamedMultiConnector.connector_counts`), so they cannot free blocks early.
* A worker passes on one load completion per load, from the child chosen to load; duplicate,
  late and phantom load completions are ignored (vLLM's scheduler asserts on them).
* Transfer params are merged by :func:`~multiconnector.merge_transfer_params` into a new dict;
  no child's dict is modified, and a clash raises :class:`~multiconnector.KeyClashError` after
  the bookkeeping was made consistent.
* Every fan-out calls every child, then raises all failures together as
  :class:`~multiconnector.ConnectorFailures` (an ``ExceptionGroup``); shutdown included.
* A child whose constructor raises has the children built before it shut down, then
  :class:`ChildStartError` names it.

The bookkeeping is :class:`multiconnector.MultiConnector`'s: one on the scheduler tracks each
request from arrival to the last confirmed save; on each worker one tracks the saves each
finished request awaits and one the load each request awaits.

.. versionadded:: 0.1.0
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, final

try:  # the vllm extra: without it, say how to install it, not just which module is missing
    import msgspec
    import vllm  # noqa: F401
except ModuleNotFoundError as _missing:
    raise ModuleNotFoundError(
        f"multiconnector.vllm needs the vllm extra ({_missing}): "
        "install it with pip install 'multiconnector[vllm]'",
        name=_missing.name,
    ) from None
from vllm.config import KVTransferConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

from ._validate import check_name, shown
from .aggregator import MultiConnector
from .errors import (
    ConnectorFailures,
    DuplicateConnectorError,
    InvalidArgumentError,
    MultiConnectorError,
)
from .machine import State
from .outcome import Outcome
from .registry import ConnectorRegistry

__all__ = [
    "CHILDREN_KEY",
    "ChildSpec",
    "ChildStartError",
    "MetadataMismatchError",
    "NamedHandshakeMetadata",
    "NamedMultiConnector",
    "NamedMultiConnectorMetadata",
    "NamedMultiConnectorStats",
    "NamedMultiConnectorWorkerMetadata",
    "NamedPromMetrics",
    "child_specs",
    "msgspec_dec_hook",
    "msgspec_enc_hook",
]

#: The ``kv_connector_extra_config`` key listing the children (the key vLLM's own uses too).
CHILDREN_KEY: Final = "connectors"

_T = TypeVar("_T")


# -- errors ------------------------------------------------------------------------------------


class ChildStartError(MultiConnectorError, RuntimeError):
    """A child connector's constructor raised.

    The children built before it were shut down first (a half-built set would leak their
    threads, sockets and pinned memory). ``name`` is the child that failed, ``started`` the
    names shut down, ``shutdown_failures`` the exceptions their shutdowns raised, by name. The
    constructor's exception is the ``__cause__``.

    .. versionadded:: 0.1.0
    """

    def __init__(
        self,
        name: str,
        kv_connector: str,
        started: Sequence[str] = (),
        shutdown_failures: Mapping[str, BaseException] | None = None,
    ) -> None:
        self.name = name
        self.kv_connector = kv_connector
        self.started = tuple(started)
        self.shutdown_failures = dict(shutdown_failures or {})
        message = f"child connector {name!r} (kv_connector={kv_connector!r}) failed to start"
        if self.started:
            message += f"; the {len(self.started)} started before it were shut down: " + ", ".join(
                map(repr, self.started)
            )
        if self.shutdown_failures:
            message += "; shutting down " + ", ".join(
                f"{n!r} raised {e!r}" for n, e in self.shutdown_failures.items()
            )
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.name, self.kv_connector, self.started, self.shutdown_failures),
        )


class MetadataMismatchError(MultiConnectorError, ValueError):
    """Connector metadata does not name exactly this connector's children.

    The scheduler and the workers were configured with different children. vLLM's
    ``MultiConnector`` pairs children and metadata by position with ``zip``, which silently drops
    the surplus; here a mismatch is an error that names the missing and unexpected children.

    .. versionadded:: 0.1.0
    """


# -- configuration -----------------------------------------------------------------------------


@final
@dataclass(frozen=True)
class ChildSpec:
    """One configured child: its unique name and its own transfer config.

    .. versionadded:: 0.1.0
    """

    name: str
    config: Any  # vllm.config.KVTransferConfig

    @property
    def kv_connector(self) -> str:
        return str(self.config.kv_connector)

    @property
    def module_path(self) -> str | None:
        path = self.config.kv_connector_module_path
        return None if path is None else str(path)

    def connector_class(self) -> type[Any]:
        """The child's connector class, found the way vLLM's factory finds it."""
        return KVConnectorFactory.get_connector_class(self.config)  # type: ignore[no-any-return]

    def vllm_config(self, vllm_config: Any) -> Any:
        """A shallow copy of ``vllm_config`` carrying this child's transfer config."""
        child_config = copy.copy(vllm_config)
        child_config.kv_transfer_config = self.config
        return child_config


def child_specs(
    extra_config: Mapping[str, Any],
    *,
    kv_role: str | None = "kv_both",
    engine_id: str | None = None,
) -> tuple[ChildSpec, ...]:
    """Read and check the children listed in ``kv_connector_extra_config``.

    ``kv_role`` and ``engine_id`` are the defaults for children that set none (the parent's).
    Every child is checked before any is built, so a bad configuration starts nothing.

    >>> [s.name for s in child_specs({"connectors": [
    ...     {"name": "disk", "kv_connector": "ExampleConnector"}]})]
    ['disk']

    .. versionadded:: 0.1.0
    """
    if not isinstance(extra_config, Mapping):
        raise InvalidArgumentError(
            f"kv_connector_extra_config={shown(extra_config)} must be a mapping"
        )
    listed = extra_config.get(CHILDREN_KEY)
    if not isinstance(listed, list | tuple) or not listed:
        raise InvalidArgumentError(
            f"kv_connector_extra_config[{CHILDREN_KEY!r}]={shown(listed)} must be a non-empty "
            "list of child connector configs, each with a unique 'name'"
        )
    specs: list[ChildSpec] = []
    seen: set[str] = set()
    for index, item in enumerate(listed):
        where = f"kv_connector_extra_config[{CHILDREN_KEY!r}][{index}]"
        if not isinstance(item, Mapping):
            raise InvalidArgumentError(f"{where}={shown(item)} must be a mapping")
        name = check_name(item.get("name"), f"{where}['name']")
        if name in seen:
            raise DuplicateConnectorError(
                f"{where}['name']={name!r} is already the name of an earlier child; "
                "names must be unique"
            )
        seen.add(name)
        fields = {key: value for key, value in item.items() if key != "name"}
        connector = fields.get("kv_connector")
        if not isinstance(connector, str) or not connector:
            raise InvalidArgumentError(
                f"{where}['kv_connector']={shown(connector)} must be a connector class name"
            )
        if fields.get("kv_role") is None:
            fields["kv_role"] = kv_role
        if fields.get("engine_id") is None and engine_id is not None:
            fields["engine_id"] = engine_id
        try:
            config = KVTransferConfig(**fields)
        except (TypeError, ValueError) as exc:
            raise InvalidArgumentError(
                f"{where} (name={name!r}) is not a valid KVTransferConfig: {exc}"
            ) from exc
        specs.append(ChildSpec(name, config))
    return tuple(specs)


def _specs_of(kv_transfer_config: Any) -> tuple[ChildSpec, ...]:
    return child_specs(
        kv_transfer_config.kv_connector_extra_config,
        kv_role=kv_transfer_config.kv_role,
        engine_id=kv_transfer_config.engine_id,
    )


def _connector_class(kv_connector: str, module_path: str | None) -> type[Any]:
    if module_path:
        return getattr(importlib.import_module(module_path), kv_connector)  # type: ignore[no-any-return]
    return KVConnectorFactory.get_connector_class_by_name(kv_connector)  # type: ignore[no-any-return]


# -- what crosses process boundaries -----------------------------------------------------------


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
    so :meth:`NamedMultiConnector.build_kv_connector_stats` rebuilds each child's stats in
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


# -- adapters from vLLM children to the core's connector protocol -------------------------------


class _Side:
    """One child as the core sees it; the stats and shutdown parts are the same on both roles."""

    __slots__ = ("child", "name", "owner")

    def __init__(self, owner: NamedMultiConnector, name: str, child: Any) -> None:
        self.owner = owner
        self.name = name
        self.child = child

    def get_stats(self) -> Any:
        return self.child.get_kv_connector_stats()

    def shutdown(self) -> None:
        self.child.shutdown()


@final
class _SchedulerSide(_Side):
    """Scheduler role: asks the vLLM child, passing the live ``Request`` object."""

    __slots__ = ("load_async",)

    def __init__(self, owner: NamedMultiConnector, name: str, child: Any) -> None:
        super().__init__(owner, name, child)
        #: Whether this child's last match for a request would load asynchronously.
        self.load_async: dict[str, bool] = {}

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int | None:
        request = self.owner._live[request_id]
        tokens, load_async = self.child.get_num_new_matched_tokens(request, num_computed_tokens)
        self.load_async[request_id] = bool(load_async)
        return None if tokens is None else int(tokens)

    def request_finished(
        self, request_id: str, blocks: Sequence[int]
    ) -> tuple[bool, Mapping[str, Any] | None]:
        owner = self.owner
        saves, params = self.child.request_finished(owner._live[request_id], blocks)
        if saves is True:
            return True, params
        # A child that took the partial tail at finish also owes a "finished sending" report.
        tails = owner._tail_savers
        return bool(saves) or (bool(tails) and self.name in tails.get(request_id, ())), params


@final
class _WorkerSide(_Side):
    """Worker role: answers from the plan the scheduler sent in the connector metadata."""

    __slots__ = ()

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int:
        return 1 if self.owner._load_plan.get(request_id) == self.name else 0

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, None]:
        # Never asked: a worker finishes a request with the names the scheduler sent, through
        # MultiConnector.request_finished_by. Answering anything here could free blocks early.
        raise RuntimeError("a worker learns who saves a request from the connector metadata")


# -- the connector -----------------------------------------------------------------------------


class NamedMultiConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """A vLLM v1 KV connector that fans out to named children (see the module docstring).

    One instance per role and process, as vLLM builds them: the scheduler's chooses loaders,
    merges params and tells the workers who saves what; each worker's releases requests and
    passes on load completions by the rules above. ``children`` maps names to the child
    connectors, in configuration order.

    .. versionadded:: 0.1.0
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        specs = _specs_of(self._kv_transfer_config)
        self._specs: dict[str, ChildSpec] = {spec.name: spec for spec in specs}
        self._children: dict[str, Any] = _start_children(specs, vllm_config, role, kv_cache_config)
        side = _SchedulerSide if role == KVConnectorRole.SCHEDULER else _WorkerSide
        self._sides: dict[str, Any] = {
            name: side(self, name, child) for name, child in self._children.items()
        }
        registry = ConnectorRegistry(self._sides)
        # Scheduler: every request, from arrival to its last confirmed save.
        # Worker: the saves each finished request awaits.
        self._tracker = MultiConnector(registry)
        # Worker: the load each request awaits; unused on the scheduler.
        self._loads = MultiConnector(registry)
        # Scheduler state.
        self._live: dict[str, Any] = {}
        self._tail_savers: dict[str, tuple[str, ...]] = {}
        self._new_savers: dict[str, tuple[str, ...]] = {}
        self._new_loads: dict[str, str] = {}
        # Worker state.
        self._load_plan: dict[str, str] = {}
        self._finished_while_loading: set[str] = set()

    # -- introspection -------------------------------------------------------------------------

    @property
    def children(self) -> Mapping[str, Any]:
        """The child connectors by name, in configuration order."""
        return dict(self._children)

    @property
    def tracker(self) -> MultiConnector:
        """Scheduler: the requests' bookkeeping. Worker: the finished requests' awaited saves."""
        return self._tracker

    @property
    def load_tracker(self) -> MultiConnector:
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
        missing = [name for name in self._children if name not in metadata.children]
        unexpected = sorted(name for name in metadata.names() if name not in self._children)
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
    def supports_sleep_mode(cls, kv_transfer_config: Any) -> bool:
        return all(
            spec.connector_class().supports_sleep_mode(spec.config)
            for spec in _specs_of(kv_transfer_config)
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
        for spec in _specs_of(vllm_config.kv_transfer_config):
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
            rebuilt = _connector_class(*source).build_kv_connector_stats(data=entry.get("stats"))
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
        for spec in _specs_of(vllm_config.kv_transfer_config):
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
        self._gather(
            "bind_connector_metadata",
            lambda name, child: child.bind_connector_metadata(children[name]),
        )
        super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        self._gather("clear_connector_metadata", lambda _, c: c.clear_connector_metadata())
        super().clear_connector_metadata()

    def shutdown(self) -> None:
        """Shut every child down, even after failures; raise them all as ConnectorFailures."""
        self._tracker.shutdown()

    def reset_cache(self) -> bool:
        results = self._gather("reset_cache", lambda _, c: c.reset_cache())
        return all(result is not False for result in results.values())

    def get_kv_connector_stats(self) -> NamedMultiConnectorStats | None:
        stats = {name: s for name, s in self._tracker.stats().items() if s is not None}
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
        self._gather("finish_forward", lambda _, c: c.finish_forward())

    def reset_capture_state(self) -> None:
        self._gather("reset_capture_state", lambda _, c: c.reset_capture_state())

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        children = self._check_metadata(kv_connector_metadata).children
        self._gather("handle_preemptions", lambda name, c: c.handle_preemptions(children[name]))

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._gather("start_load_kv", lambda _, c: c.start_load_kv(forward_context, **kwargs))

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._gather("wait_for_layer_load", lambda _, c: c.wait_for_layer_load(layer_name))

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        self._gather(
            "save_kv_layer",
            lambda _, c: c.save_kv_layer(layer_name, kv_layer, attn_metadata, **kwargs),
        )

    def wait_for_save(self) -> None:
        self._gather("wait_for_save", lambda _, c: c.wait_for_save())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """Apply every child's completions to the bookkeeping; return only what is due.

        A request is reported finished sending once every name the scheduler said saves it has
        reported; a load completion is passed on once, from the name chosen to load.
        """
        failure: ConnectorFailures | None = None
        try:
            per_child = self._gather(
                "get_transfer_results", lambda _, c: c.get_transfer_results(finished_req_ids)
            )
        except ConnectorFailures as exc:
            failure, per_child = exc, exc.result
        results = KVConnectorTransferResults()
        loads = self._loads
        tracker = self._tracker
        for name, child_results in per_child.items():
            if child_results.finished_sending:
                tracker.transfer_finished_many(name, child_results.finished_sending)
            failed = child_results.failed_recving
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
        for request_id in finished_req_ids:
            record = loads.peek(request_id)
            if record is None:
                continue
            if record.loader is None or record.loaded:
                loads.cancel(request_id)
            else:  # aborted while loading: the scheduler still needs that one completion
                self._finished_while_loading.add(request_id)
        loads.take()
        for record in tracker.take():
            if record.state is State.finished:
                results.finished_sending.add(record.request_id)
        if failure is not None:
            raise failure
        return results

    def get_block_ids_with_load_errors(self) -> set[int]:
        blocks: set[int] = set()
        for found in self._gather(
            "get_block_ids_with_load_errors", lambda _, c: c.get_block_ids_with_load_errors()
        ).values():
            blocks |= found
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
        found = self._present("build_connector_worker_meta")
        return NamedMultiConnectorWorkerMetadata(found) if found else None

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
        self._gather("on_new_request", lambda _, c: c.on_new_request(request))

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """The first child, in configuration order, with tokens to load becomes the loader."""
        request_id = self._ensure(request)
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
        self._gather(
            "update_state_after_alloc",
            lambda name, c: c.update_state_after_alloc(
                request, blocks, num_external_tokens if name == loader else 0
            ),
        )
        if (
            num_external_tokens > 0
            and loader is not None
            and self._sides[loader].load_async.get(request_id, False)
        ):
            self._new_loads[request_id] = loader

    def build_connector_meta(self, scheduler_output: Any) -> NamedMultiConnectorMetadata:
        children = self._gather(
            "build_connector_meta", lambda _, c: c.build_connector_meta(scheduler_output)
        )
        metadata = NamedMultiConnectorMetadata(
            children, savers=self._new_savers, loads=self._new_loads
        )
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
        # The workers report a request finished sending only once every saver confirmed.
        tracker = self._tracker
        confirmed: dict[str, list[str]] = {}
        for request_id in connector_output.finished_sending or ():
            record = tracker.peek(request_id)
            if record is not None:
                for name in record.awaiting:
                    if name in confirmed:
                        confirmed[name].append(request_id)
                    else:
                        confirmed[name] = [request_id]
        for name, request_ids in confirmed.items():
            tracker.transfer_finished_many(name, request_ids)
        for request_id in connector_output.finished_recving or ():
            loader = self._loader(request_id)
            if loader is not None:
                tracker.load_finished(request_id, loader)
        tracker.take()

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
        request_id = self._ensure(request)
        try:
            _, params = self._tracker.request_finished(request_id, block_ids)
        finally:
            record = self._tracker.peek(request_id)
            savers = (
                record.awaiting if record is not None and record.state is State.finishing else ()
            )
            if savers:
                self._new_savers[request_id] = savers
            self._live.pop(request_id, None)
            if self._tail_savers:
                self._tail_savers.pop(request_id, None)
            for side in self._sides.values():
                if side.load_async:
                    side.load_async.pop(request_id, None)
            self._tracker.take()
        return bool(savers), params

    def take_events(self) -> list[Any]:
        events: list[Any] = []
        for found in self._gather("take_events", lambda _, c: list(c.take_events())).values():
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
        def route(name: str, child: Any) -> None:
            mine = {
                rank: meta.children[name]
                for rank, meta in metadata.items()
                if isinstance(meta, NamedHandshakeMetadata) and name in meta.children
            }
            if mine:
                getattr(child, method)(mine)

        self._gather(method, route)


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

"""The children of one vLLM-facing connector, and how every hook calls them: :class:`Children`.

Both roles' parts (:class:`~multiconnector.vllm.scheduler.SchedulerPart`,
:class:`~multiconnector.vllm.worker.WorkerPart`) call the children through one
:class:`Children`: it builds them (shutting down those already built when one fails), knows
their names, roles and configuration, lists per hook the children it calls
(:class:`~multiconnector.vllm.fanout.Fanout`), and holds the two ways a failure is taken:
raised together (:meth:`Children.gather`, start-up and shutdown hooks) or absorbed as that
child's (:meth:`Children.absorb`, the hooks vLLM calls per request or per step:
:mod:`~multiconnector.vllm.trouble`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from numbers import Integral
from typing import Any, Final, TypeVar, final

from vllm.distributed.kv_events import KVConnectorKVEvents
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from .._validate import shown
from ..errors import ConnectorFailures, InvalidArgumentError, InvalidValueError
from ..healthbook import HealthBook
from ..registry import ConnectorRegistry, Role
from .config import ChildSpec
from .errors import ChildStartError, MetadataMismatchError, WrongRoleError
from .fanout import Fanout
from .trouble import OVERDUE_HOOKS, Trouble
from .wire import NamedMultiConnectorMetadata

__all__ = ["ANSWER_TYPES", "Children", "Slot", "failed", "wrong_answer"]

_T = TypeVar("_T")

#: ``(name, exception)`` pairs of the children that failed in one call (``None``: none did).
Failures = list[tuple[str, Exception]] | None


def failed(failures: Failures, name: str, exc: Exception) -> list[tuple[str, Exception]]:
    """``failures`` (a new list when ``None``) with ``(name, exc)`` appended."""
    if failures is None:
        return [(name, exc)]
    failures.append((name, exc))
    return failures


@final
class Slot:
    """A child's place in the core's books: the core keeps them by name and calls nothing.

    The adapter asks the children itself (they want vLLM's request objects) and tells the core
    what they answered (:meth:`~multiconnector.MultiConnector.request_finished_by`,
    :meth:`~multiconnector.MultiConnector.choose_loader`), so the core never asks a slot."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, None]:
        raise WrongRoleError(
            f"the core's books never ask child {self.name!r}: the adapter asks it and tells "
            "them who saves (request_finished_by)"
        )


@final
class Children:
    """The children by name, in configuration order, and the calls every hook makes on them."""

    __slots__ = (
        "_counted",
        "_world",
        "by_name",
        "closed",
        "fan",
        "health",
        "items",
        "loaders",
        "names",
        "roles",
        "savers",
        "sources",
        "specs",
        "trouble",
    )

    def __init__(
        self, specs: Sequence[ChildSpec], vllm_config: Any, role: Any, kv_cache_config: Any
    ) -> None:
        self.specs: dict[str, ChildSpec] = {spec.name: spec for spec in specs}
        #: Each child's role (``multiconnector_role``): the core's books hold each to it.
        self.roles: dict[str, Role] = {spec.name: spec.role for spec in specs}
        #: The children's failures in per-request and per-step hooks, counted and logged.
        self.trouble = Trouble()
        #: Each child's health (the scheduler's, when the composition has a health machine):
        #: every failure absorbed is fed to it.
        self.health: HealthBook | None = None
        self.closed = False
        self._world = int(
            getattr(getattr(vllm_config, "parallel_config", None), "world_size", 1) or 1
        )
        built = _start_children(specs, vllm_config, role, kv_cache_config)
        #: The children's names in configuration order (vLLM's positions).
        self.names: tuple[str, ...] = tuple(built)
        #: Per child, the class that rebuilds its stats (:meth:`ChildSpec.stats_source`).
        self.sources = {spec.name: spec.stats_source() for spec in specs}
        self._put(built)

    def _put(self, by_name: dict[str, Any]) -> None:
        self.by_name = by_name
        #: ``(name, child)`` pairs in configuration order.
        self.items: tuple[tuple[str, Any], ...] = tuple(by_name.items())
        #: Per per-step or per-layer hook, the children it calls (:class:`Fanout`).
        self.fan = Fanout(self.items, self.roles)
        #: The children that may save (every role but load-only).
        self.savers = tuple((n, c) for n, c in self.items if self.roles[n] is not Role.load)
        #: The children that may load (every role but save-only).
        self.loaders = tuple((n, c) for n, c in self.items if self.roles[n] is not Role.save)
        self._counted: dict[str, int] | None = None

    def replace(self, connectors: Sequence[Any]) -> None:
        """Put ``connectors`` in the children's places, by position: the names, and so the
        books, stay; every child is asked its ``get_finished_count()`` again when next needed."""
        if len(connectors) != len(self.names):
            raise InvalidValueError(
                f"_connectors={shown(connectors)} must hold exactly one connector per configured "
                f"child ({len(self.names)}: {list(self.names)}): names come from the "
                "configuration"
            )
        self._put(dict(zip(self.names, connectors, strict=True)))

    def registry(self) -> ConnectorRegistry:
        """A registry of the children's :class:`Slot` s, with their roles, for the core's books."""
        return ConnectorRegistry({name: Slot(name) for name in self.names}, roles=self.roles)

    def counted(self) -> dict[str, int]:
        """The children that report a transfer on fewer workers than all, with how many: every
        child's ``get_finished_count()``, asked the first time (in configuration order).

        A child that raises there or answers what is no count (not ``None`` nor an int) fails
        there, as a child's failure: counted and logged, and its reports are awaited on every
        worker, as vLLM's output aggregator awaits those of a child answering ``None``."""
        if self._counted is None:
            counted: dict[str, int] = {}
            failures: list[tuple[str, Exception]] = []
            for name, child in self.items:
                try:
                    count = child.get_finished_count()
                    if count is not None and (
                        isinstance(count, bool) or not isinstance(count, Integral)
                    ):
                        raise InvalidArgumentError(
                            f"child {name!r} answered get_finished_count() with {shown(count)}; "
                            "must be an int or None"
                        )
                except Exception as exc:
                    failures.append((name, exc))
                    continue
                if count is not None and 0 < int(count) < self._world:
                    counted[name] = int(count)
            self._counted = counted
            if failures:
                self.absorb("get_finished_count", failures, "its reports awaited on every worker")
        return self._counted

    # -- calling them --------------------------------------------------------------------------

    def gather(
        self,
        what: str,
        call: Callable[[str, Any], _T],
        pairs: Sequence[tuple[str, Any]] | None = None,
    ) -> dict[str, _T]:
        """``call(name, child)`` for every child (of ``pairs``, when given); every failure
        raised together afterwards as :class:`ConnectorFailures`."""
        results: dict[str, _T] = {}
        failures: Failures = None
        for name, child in self.items if pairs is None else pairs:
            try:
                results[name] = call(name, child)
            except Exception as exc:
                failures = failed(failures, name, exc)
        if failures is not None:
            raise _all(f"{len(failures)} child connector(s) raised in {what}", failures, results)
        return results

    def gather_soft(
        self,
        what: str,
        call: Callable[[str, Any], _T],
        degraded: str,
        pairs: Sequence[tuple[str, Any]] | None = None,
    ) -> dict[str, _T]:
        """:meth:`gather` for a per-request or per-step hook: the answers of the children that
        did not fail; the failures absorbed (:meth:`absorb`)."""
        try:
            return self.gather(what, call, pairs)
        except ConnectorFailures as failures:
            self.absorb(
                what, list(zip(failures.failed, failures.exceptions, strict=True)), degraded
            )
            found: dict[str, _T] = failures.result
            return found

    def each(self, method: str, *args: Any) -> None:
        """``child.<method>(*args)`` for the children the hook calls (:class:`Fanout`), a
        per-step call whose answers are not used: a failure is that child's (:meth:`absorb`)."""
        failures: Failures = None
        for name, child in getattr(self.fan, method, self.items):
            try:
                getattr(child, method)(*args)
            except Exception as exc:
                failures = failed(failures, name, exc)
        if failures is not None:
            self.absorb(method, failures)

    def absorb(
        self,
        what: str,
        failures: Sequence[tuple[str, BaseException]],
        degraded: str = "ignored for this call",
    ) -> None:
        """The children of ``failures`` failed in ``what``, a hook vLLM calls per request or per
        step: counted under their names and logged, never raised (``degraded`` says what became
        of each child's part, for the log); each a failure of its health machine, when the
        composition has one (:attr:`health`)."""
        self.trouble.record_all(what, failures, degraded)
        health = self.health
        if health is not None:
            for name, _ in failures:
                health.failed(name, hook=what)

    def overdue(self, kind: str, name: str, request_id: str, seconds: float, limit: float) -> None:
        """Child ``name`` owes its ``kind`` report of ``request_id`` past ``limit``
        (:meth:`Trouble.overdue`: counted, warned about); a failure of its health machine too."""
        self.trouble.overdue(kind, name, request_id, seconds, limit)
        if self.health is not None:
            self.health.failed(name, hook=OVERDUE_HOOKS[kind])

    def present(self, method: str, *, soft: bool = False) -> dict[str, Any]:
        """Each child's no-argument ``method()``, keeping only answers that are not ``None``
        (``soft``: a per-step hook, whose failures are absorbed)."""

        pairs = getattr(self.fan, method, None) if soft else None
        if pairs == ():  # a per-step hook no child needs calling for (Fanout)
            return {}

        def call(_: str, child: Any) -> Any:
            return getattr(child, method)()

        answers = (
            self.gather_soft(method, call, "its answer dropped", pairs)
            if soft
            else self.gather(method, call)
        )
        return {name: answer for name, answer in answers.items() if answer is not None}

    def shutdown(self) -> None:
        """Shut every child down once, even after failures; raise them all together."""
        if self.closed:
            return
        self.closed = True  # first: a child being shut down is never asked again
        # The hooks that still drain the books after shutdown call no child: no fan-out, and
        # no count asked (a count never asked is none: reports awaited on every worker).
        self.fan = Fanout((), self.roles)
        if self._counted is None:
            self._counted = {}
        failures: Failures = None
        for name, child in self.items:
            try:
                child.shutdown()
            except Exception as exc:
                failures = failed(failures, name, exc)
        if failures is not None:
            raise _all(f"{len(failures)} connector(s) failed to shut down", failures, None)

    def check_metadata(self, metadata: Any) -> NamedMultiConnectorMetadata:
        """``metadata`` if it is this connector's kind and names exactly these children."""
        if not isinstance(metadata, NamedMultiConnectorMetadata):
            raise InvalidArgumentError(
                f"connector_metadata={shown(metadata)} must be a NamedMultiConnectorMetadata"
            )
        known = self.by_name
        if metadata.children.keys() == known.keys() and _all_known(metadata, known):
            return metadata  # every step: the common case, without building name sets
        missing = [name for name in known if name not in metadata.children]
        unexpected = sorted(name for name in metadata.names() if name not in known)
        if missing or unexpected:
            raise MetadataMismatchError(
                f"connector metadata does not match this connector's children "
                f"{list(known)}: missing {missing}, unexpected {unexpected}; the "
                "scheduler and the workers must be configured with the same children"
            )
        return metadata


def wrong_answer(name: str, hook: str, answer: Any) -> InvalidArgumentError:
    """Child ``name`` answered per-step ``hook`` with what is not the type vLLM's interface
    says (:data:`ANSWER_TYPES`): vLLM would call its methods outside the adapter's calls."""
    return InvalidArgumentError(
        f"child {name!r} answered {hook} with {shown(answer)}; must be a "
        f"{ANSWER_TYPES[hook].__name__} or None"
    )


#: The type of a per-step hook's answer whose methods vLLM calls itself (aggregating the
#: workers' answers, logging, exporting): any other answer is that child's failure.
ANSWER_TYPES: Final[dict[str, type[Any]]] = {
    "get_kv_connector_stats": KVConnectorStats,
    "get_kv_connector_kv_cache_events": KVConnectorKVEvents,
}


def _all(what: str, failures: list[tuple[str, Exception]], result: Any) -> ConnectorFailures:
    """Every failure of ``failures`` together, ``what`` happened to the children named."""
    names = [name for name, _ in failures]
    return ConnectorFailures(
        f"{what}: {', '.join(names)}", [exc for _, exc in failures], failed=names, result=result
    )


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

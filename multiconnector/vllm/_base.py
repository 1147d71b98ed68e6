"""The state and fan-out helpers both roles share: :class:`ConnectorBase`, under the roles.

It builds the children (shutting down those already built when one fails), the core's books and
the per-role state, and holds the helpers every fan-out uses: :meth:`ConnectorBase._gather`,
:meth:`ConnectorBase._each` and :meth:`ConnectorBase._raise`, and the metadata check.
:class:`~multiconnector.vllm.worker.WorkerRole` and
:class:`~multiconnector.vllm.scheduler.SchedulerRole` build on it;
:class:`~multiconnector.vllm.connector.MultiConnector` assembles them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from .._validate import shown
from ..aggregator import MultiConnector as Aggregator
from ..errors import ConnectorFailures, InvalidArgumentError, InvalidValueError
from ..ledger import SaveLedger
from ..lookup import Lookup
from ..registry import ConnectorRegistry, Role
from .config import (
    ChildSpec,
    hit_metrics,
    lookup_policy,
    overdue_seconds,
    patience_steps,
    specs_of,
    without_hma,
)
from .errors import ChildStartError, HMAUnsupportedError, MetadataMismatchError
from .fanout import Fanout
from .hits import Hits
from .sides import Call, SchedulerSide, WorkerSide
from .trouble import Trouble
from .wire import NamedMultiConnectorMetadata

__all__ = ["ConnectorBase"]

_T = TypeVar("_T")


class ConnectorBase(KVConnectorBase_V1):  # type: ignore[misc]
    """The children, the books and the state of both roles, and the fan-out helpers.

    Not a connector on its own: :class:`~multiconnector.vllm.connector.MultiConnector` is one.
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        specs = specs_of(self._kv_transfer_config)
        #: Both roles: how long a child may owe a save's or a load's report before it is
        #: counted and warned about (:meth:`Trouble.overdue`); checked before a child starts.
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._overdue = overdue_seconds(extra)
        #: Scheduler: which child's hit loads a request (checked before a child starts).
        self._lookup = lookup_policy(extra)
        patience = patience_steps(extra)
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
        #: Each child's role (``multiconnector_role``): the core's books hold each to it.
        self._roles: dict[str, Role] = {spec.name: spec.role for spec in specs}
        #: Both roles: the children's failures in per-request and per-step hooks, counted and
        #: logged; never raised into vLLM (:mod:`~multiconnector.vllm.trouble`).
        self._trouble = Trouble()
        self._children: dict[str, Any] = _start_children(specs, vllm_config, role, kv_cache_config)
        #: ``(name, child)`` pairs in configuration order, for the per-step fan-outs.
        self._items: tuple[tuple[str, Any], ...] = tuple(self._children.items())
        #: Per per-step or per-layer hook, the children it calls (not those whose class leaves
        #: it a no-op): :mod:`~multiconnector.vllm.fanout`.
        self._fan = Fanout(self._items, self._roles)
        #: The children that may save (every role but load-only), for the save offers.
        self._savers = self._may_save()
        #: The children's names in configuration order (vLLM's positions).
        self._names: tuple[str, ...] = tuple(self._children)
        #: Scheduler: what the sides tell this connector about the call in progress.
        #: Scheduler: each child's lookups, hits and loads, by name.
        self._hits = Hits(report=hit_metrics(extra))
        self._call = Call(asks_all=self._lookup is Lookup.longest, patience=patience)
        # Every role asks the children as the scheduler does (vLLM's class has one behaviour
        # for both roles, and its tests call scheduler methods on a worker's connector); the
        # worker's load books answer from the plan in the connector metadata instead.
        self._sides: dict[str, SchedulerSide] = {
            name: SchedulerSide(
                self, name, child, self._call, role=self._roles[name], hits=self._hits
            )
            for name, child in self._children.items()
        }
        self._worker_sides: dict[str, WorkerSide] = {
            name: WorkerSide(self, name, child) for name, child in self._children.items()
        }
        # Scheduler: every request, from arrival to request_finished (and its load, if one is in
        # flight then); the saves it hands off are the workers' to await (see saving).
        # (Both roles: shutdown goes through it.)
        self._tracker = Aggregator(
            ConnectorRegistry(self._sides, roles=self._roles), lookup=self._lookup
        )
        # Worker: the saves each finished request awaits; unused on the scheduler.
        self._ledger = SaveLedger(self._children)
        # Worker: the load each request awaits; unused on the scheduler.
        self._loads = Aggregator(ConnectorRegistry(self._worker_sides, roles=self._roles))
        # Scheduler state.
        self._live: dict[str, Any] = {}
        self._tail_savers: dict[str, tuple[str, ...]] = {}
        self._new_savers: dict[str, tuple[str, ...]] = {}
        self._new_loads: dict[str, str] = {}
        #: Scheduler: each request's computed tokens when its loader was chosen (the first
        #: block its external tokens fill), until vLLM allocates for it.
        self._matched_at: dict[str, int] = {}
        #: Scheduler, this step: the synchronous loads, with their loader and the blocks their
        #: external tokens fill (a worker reports those blocks failed if the loader fails
        #: there); the asynchronous loads known failed, with their loader (each worker reports
        #: them failed); the blocks of the synchronous loads known failed.
        self._sync_loads: dict[str, tuple[str, tuple[int, ...]]] = {}
        self._failed_loads: dict[str, str] = {}
        self._load_errors: list[int] = []
        self._block_size: int = int(getattr(vllm_config.cache_config, "block_size", 16) or 16)
        #: Scheduler: the requests whose asynchronous load was sent to the workers and has not
        #: reported yet (a finished request's record is held for those only).
        self._loads_in_flight: set[str] = set()
        #: Scheduler: when each of those loads was sent (``time.monotonic()``), in that order,
        #: until it reported or was found overdue (``report_overdue_seconds``).
        self._load_since: dict[str, float] = {}
        #: Scheduler: the requests whose saves were handed off to the workers, with the names
        #: they await, until the workers report them finished sending.
        self._saving: dict[str, tuple[str, ...]] = {}
        #: Scheduler: requests whose record still awaits names on the scheduler's own books (a
        #: child answered request_finished with garbage: the core awaits it, conservatively).
        self._awaited_here: set[str] = set()
        #: Saver tuples shared by every request with the same savers (fewer objects to pickle).
        self._saver_tuples: dict[tuple[str, ...], tuple[str, ...]] = {}
        # The current call's context, read by the sides.
        #: Every KV cache group's block ids while request_finished_all_groups asks the children
        #: (the core takes a flat list of block ids, so they travel beside it); else None.
        self._all_groups: tuple[list[int], ...] | None = None
        # Worker state.
        #: What get_transfer_results found due and has not returned yet (it raised, or it was
        #: due when the metadata was bound); None when nothing is.
        self._due: Any = None
        self._load_plan: dict[str, str] = {}
        #: Worker: the metadata bound for this step (its loads, if a loader fails), else None.
        self._bound: NamedMultiConnectorMetadata | None = None
        #: Worker: blocks of failed synchronous loads, for get_block_ids_with_load_errors.
        self._load_errors_due: set[int] = set()
        self._finished_while_loading: set[str] = set()
        #: Worker: requests whose saves all reported here while their load was still in flight
        #: here: held back until the load reports (one completion per request).
        self._sent_while_loading: set[str] = set()
        #: Worker: per child, when a non-chosen load was last warned about, and how many since.
        self._unchosen_warned: dict[str, tuple[float | None, int]] = {}
        # Both roles: the children that report a transfer on fewer workers than all (their
        # get_finished_count), with how many; the scheduler counts their reports. Asked when
        # vLLM asks (get_finished_count) or when first needed, never at construction.
        self._world = _world_size(vllm_config)
        self._counted: dict[str, int] = {}
        self._counts_known = False
        self._init_counted()
        #: Scheduler: this output's load completions, read before vLLM's own handling.
        self._recving: Any = ()

    def _init_counted(self) -> None:
        """The state both roles keep for the children that report on fewer workers."""
        #: Worker: each finished request's counted savers that have not reported here yet.
        self._counted_expected: dict[str, set[str]] = {}
        #: Worker: counted savers' reports to forward with this step's worker metadata.
        self._forward: dict[str, dict[str, int]] = {}
        #: Worker: each asynchronous load by a counted child not yet reported here, with it.
        self._counted_loading: dict[str, str] = {}
        #: Worker: counted loaders' reports (and which of them failed) to forward likewise.
        self._forward_loads: dict[str, dict[str, int]] = {}
        self._forward_failed: dict[str, dict[str, int]] = {}
        #: Per (outcome, name), counted children's reports: on a worker the ignored ones, on
        #: the scheduler the forwarded ones (applied up to the count, or why ignored).
        self._counted_outcomes: dict[tuple[Any, str], int] = {}
        #: Scheduler: each handed-off request's counted savers with the reports still owed.
        self._counted_owed: dict[str, dict[str, int]] = {}
        #: Scheduler: handed-off requests every worker reported, still owed counted reports.
        self._workers_done: set[str] = set()
        #: Scheduler: asynchronous loads by a counted child, with its name and the reports
        #: still owed; the loads every worker reported, still owed them; the loads a counted
        #: report said failed; the saves reported while such a load was still owed.
        self._loads_owed: dict[str, tuple[str, int]] = {}
        self._recv_done: set[str] = set()
        self._counted_failed: set[str] = set()
        self._sent_while_loading_here: set[str] = set()

    def _replace_children(self, connectors: Sequence[Any]) -> None:
        """Put ``connectors`` in the children's places, by position: the names, and so the
        books, stay; every child is asked its ``get_finished_count()`` again when next needed."""
        if "_children" not in self.__dict__:
            raise InvalidArgumentError(
                "this MultiConnector was not built by its constructor (object.__new__): its "
                "children, their names and its books come from the constructor"
            )
        if len(connectors) != len(self._names):
            raise InvalidValueError(
                f"_connectors={shown(connectors)} must hold exactly one connector per configured "
                f"child ({len(self._names)}: {list(self._names)}): names come from the "
                "configuration"
            )
        self._children = dict(zip(self._names, connectors, strict=True))
        self._items = tuple(self._children.items())
        self._fan = Fanout(self._items, self._roles)
        self._savers = self._may_save()
        for name, child in self._items:
            self._sides[name].child = child
            self._worker_sides[name].child = child
        self._counts_known = False

    def _may_save(self) -> tuple[tuple[str, Any], ...]:
        return tuple((name, c) for name, c in self._items if self._roles[name] is not Role.load)

    def _known_counts(self) -> dict[str, int]:
        """The children that report on fewer workers than all, with how many: every child's
        ``get_finished_count()``, asked the first time (in configuration order)."""
        if not self._counts_known:
            self._counted = _finished_counts(self._items, self._world)
            self._counts_known = True
        return self._counted

    # -- helpers -------------------------------------------------------------------------------

    def _gather(
        self,
        what: str,
        call: Callable[[str, Any], _T],
        pairs: Sequence[tuple[str, Any]] | None = None,
    ) -> dict[str, _T]:
        """``call(name, child)`` for every child (of ``pairs``, when given); every failure
        raised together afterwards."""
        results: dict[str, _T] = {}
        errors: list[Exception] = []
        failed: list[str] = []
        for name, child in self._items if pairs is None else pairs:
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
        """``child.<method>(*args)`` for every child, a per-step call whose answers are not
        used: a child that raises is that child's failure (:meth:`_absorb`), not the call's.
        Only the children the hook calls (:class:`~multiconnector.vllm.fanout.Fanout`)."""
        failures: list[tuple[str, Exception]] | None = None
        for name, child in getattr(self._fan, method, self._items):
            try:
                getattr(child, method)(*args)
            except Exception as exc:
                failures = _failed(failures, name, exc)
        if failures is not None:
            self._absorb(method, failures)

    def _absorb(
        self,
        what: str,
        failures: Sequence[tuple[str, BaseException]],
        degraded: str = "ignored for this call",
    ) -> None:
        """The children of ``failures`` failed in ``what``, a hook vLLM calls per request or
        per step: counted under their names and logged, never raised (``degraded`` says what
        became of each child's part, for the log)."""
        self._trouble.record_all(what, failures, degraded)

    def _gather_soft(
        self,
        what: str,
        call: Callable[[str, Any], _T],
        degraded: str,
        pairs: Sequence[tuple[str, Any]] | None = None,
    ) -> dict[str, _T]:
        """:meth:`_gather` for a per-request or per-step hook: the answers of the children
        that did not fail; the failures absorbed (:meth:`_absorb`)."""
        try:
            return self._gather(what, call, pairs)
        except ConnectorFailures as failures:
            pairs = list(zip(failures.failed, failures.exceptions, strict=True))
            self._absorb(what, pairs, degraded)
            found: dict[str, _T] = failures.result
            return found

    def child_failures(self) -> dict[str, dict[str, int]]:
        """Per child name, per hook, how many times the child raised or answered what cannot
        be true in a hook vLLM calls per request or per step (each degraded that child for that
        call; none reached vLLM): docs/vllm.md, "When a child fails".

        .. versionadded:: 0.1.0
        """
        return self._trouble.counts()

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

    def _present(self, method: str, *, soft: bool = False) -> dict[str, Any]:
        """Each child's no-argument ``method()``, keeping only answers that are not ``None``
        (``soft``: a per-step hook, whose failures are absorbed (:meth:`_absorb`))."""
        answers = (
            self._gather_soft(
                method,
                lambda _, c: getattr(c, method)(),
                "its answer dropped",
                getattr(self._fan, method, None),
            )
            if soft
            else self._gather(method, lambda _, c: getattr(c, method)())
        )
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


def _world_size(vllm_config: Any) -> int:
    return int(getattr(getattr(vllm_config, "parallel_config", None), "world_size", 1) or 1)


def _finished_counts(items: Sequence[tuple[str, Any]], world: int) -> dict[str, int]:
    """The children whose ``get_finished_count()`` is fewer workers than the world size."""
    counted: dict[str, int] = {}
    for name, child in items:
        count = child.get_finished_count()
        if count is not None and 0 < count < world:
            counted[name] = int(count)
    return counted


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

"""The scheduler's part of the vLLM-facing connector: :class:`SchedulerPart`.

The calls vLLM makes on the scheduler's connector. The part asks its children itself (they want
vLLM's ``Request``), judges their answers by the core's pure rules (:mod:`~multiconnector.rule`,
through :class:`~multiconnector.vllm.lookups.Lookups`) and *tells* its core books what they
decided: the loader (:meth:`~multiconnector.MultiConnector.choose_loader`) and the savers
(:meth:`~multiconnector.MultiConnector.request_finished_by`). The books hold each request until
:meth:`~multiconnector.MultiConnector.take` hands it back, when vLLM may free its blocks. Each
step's metadata tells the workers, by name, who loads and who saves what.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from functools import partial
from typing import Any, Final

from .._validate import shown
from ..aggregator import MultiConnector as Aggregator
from ..errors import (
    InvalidArgumentError,
    InvalidParamsError,
    InvalidValueError,
    KeyClashError,
    ShutDownError,
)
from ..healthbook import health_book
from ..ledger import take_older
from ..machine import State
from ..outcome import Outcome
from ..params import merge_transfer_params
from ..registry import Role
from ..rule import HOLD, PASS, finish_answer, one_completion
from .allocation import external_blocks, tell_allocation
from .children import Children, Failures, Slot, failed
from .config import Settings, without_hma
from .counted import WORKERS, Counted, not_taken
from .errors import HMAUnsupportedError
from .hits import Hits
from .lookups import RANGE_HOOK, Lookups
from .wire import (
    NamedKVEvents,
    NamedMultiConnectorMetadata,
    NamedMultiConnectorWorkerMetadata,
    Outbox,
)

__all__ = ["SchedulerPart"]

#: A load report's outcomes that end a load owed: applied, or drained (the request finished
#: while it loaded). Either way the child made that load: counted completed or failed.
_LOAD_ENDED: Final = frozenset({Outcome.applied, Outcome.drained})
_PENDING: Final = State.pending
_FINISHING: Final = State.finishing
_LOAD: Final = Role.load


def _named(value: Any, kind: type[Any], what: str) -> Any:
    """``value`` if it is ``None`` or a ``kind``; else an :class:`InvalidArgumentError`."""
    if value is not None and not isinstance(value, kind):
        raise InvalidArgumentError(f"{what}={shown(value)} must be a {kind.__name__}")
    return value


class SchedulerPart:
    """The scheduler-side calls of vLLM's connector interface, over one :class:`Children`."""

    def __init__(
        self, children: Children, settings: Settings, vllm_config: Any, *, all_support_hma: bool
    ) -> None:
        self._kids = children
        self._settings = settings
        #: Every request from its arrival until vLLM may free its blocks: its loader, and the
        #: savers the workers await (the core's books, told by this part).
        self.tracker = Aggregator(children.registry(), lookup=settings.lookup)
        not_taken(WORKERS, set(children.names))
        self.tracker.register(WORKERS, Slot(WORKERS), Role.save)
        #: The report names of the children counted on fewer workers than all.
        self.counted = Counted(children, self.tracker)
        #: Each request the workers await saves of, with its savers, until handed back.
        self._savers_of: dict[str, tuple[str, ...]] = {}
        #: Each child's lookups, hits and loads, by name.
        self.hits = Hits(report=settings.hit_metrics)
        #: Whether every child supports HMA: request_finished_all_groups then asks each child
        #: for every group's blocks (vLLM's rule), otherwise the one group's.
        self._all_support_hma = all_support_hma
        self._block_size = int(getattr(vllm_config.cache_config, "block_size", 16) or 16)
        self.live: dict[str, Any] = {}
        #: Each child's health (``None``: no health machine), fed by every failure absorbed.
        self.health = children.health = health_book(children.names, settings.health)
        #: Which child loads each request, and what later lookups need of it.
        self.lookups = Lookups(children, settings, self.hits)
        #: Each request's computed tokens when its loader was chosen, until vLLM allocates.
        self._matched_at: dict[str, int] = {}
        #: Each split load's parts, ``(name, start, tokens)`` in token order, until vLLM
        #: allocates (``split_loads``: :meth:`Lookups.further`).
        self._parts: dict[str, tuple[tuple[str, int, int], ...]] = {}
        self._tail_savers: dict[str, tuple[str, ...]] = {}
        #: This step's news for the workers: who saves, who loads asynchronously, the
        #: synchronous loads (loader, blocks), the asynchronous loads known failed, the blocks
        #: of the synchronous loads known failed.
        self._new_savers: dict[str, tuple[str, ...]] = {}
        self._new_loads: dict[str, str] = {}
        self._new_splits: dict[str, tuple[tuple[str, tuple[int, ...]], ...]] = {}
        self._sync_loads: dict[str, tuple[str, tuple[int, ...]]] = {}
        self._failed_loads: dict[str, str] = {}
        self._load_errors: list[int] = []
        #: The asynchronous loads sent to the workers and not reported yet, with when each was
        #: sent (``time.monotonic()``), until reported or found overdue.
        self.loads_in_flight: set[str] = set()
        self._load_since: dict[str, float] = {}
        self._saver_tuples: dict[tuple[str, ...], tuple[str, ...]] = {}
        #: The requests with saves the core books handed back (:meth:`_take`), for vLLM to
        #: see finished sending in the next ``update_connector_output``.
        self._handed: list[str] = []

    @property
    def counted_outcomes(self) -> dict[tuple[Any, str], int]:
        """Per (outcome, name), forwarded reports of names that are no counted child's."""
        return self.counted.outcomes

    def child_of(self, name: str) -> str:
        """The child a name on the core books stands for (itself, or a report's child)."""
        return self.counted.child_of(name)

    @property
    def saving(self) -> dict[str, tuple[str, ...]]:
        """Each request whose saves the workers await, with its savers (a new dict)."""
        tracker = self.tracker
        saving: dict[str, tuple[str, ...]] = {}
        for request_id, savers in self._savers_of.items():
            record = tracker.peek(request_id)
            if record is not None and record.state is _FINISHING:
                saving[request_id] = savers
        return saving

    @property
    def counted_owed(self) -> dict[str, dict[str, int]]:
        """Each request still owed reports by children that report on fewer workers than all,
        with how many each still owes (a new dict)."""
        return self.counted.owed()

    def loader(self, request_id: str) -> str | None:
        """The child chosen to load ``request_id`` (the first part's, of a split load)."""
        record = self.tracker.peek(request_id)
        return None if record is None or record.loader is None else self.child_of(record.loader)

    def forget(self, request_id: str) -> None:
        """``request_id`` finished: nothing of its lookups is kept."""
        self.live.pop(request_id, None)
        if self._matched_at:
            self._matched_at.pop(request_id, None)
        if self._parts:
            self._parts.pop(request_id, None)
        if self._tail_savers:
            self._tail_savers.pop(request_id, None)
        self.lookups.forget(request_id)

    def _ensure(self, request: Any) -> str:
        request_id: str = request.request_id
        if request_id not in self.tracker:
            self.tracker.begin(request_id)  # a bad id, or after shutdown: raises, nothing kept
        self.live[request_id] = request
        return request_id

    # -- binding -------------------------------------------------------------------------------

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        self._kids.gather(
            "bind_kv_cache_manager", lambda _, c: c.bind_kv_cache_manager(kv_cache_manager)
        )

    def on_new_request(self, request: Any) -> None:
        self._ensure(request)
        self._kids.each("on_new_request", request)

    # -- which child loads ---------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """Ask the children that may load (:meth:`Lookups.match`) and tell the core books the
        loader chosen; ``(None, False)`` while a child still looking up holds the lookup."""
        request_id = self._ensure(request)
        record = self.tracker.peek(request_id)
        if record is None or record.state is not _PENDING:
            return 0, False
        loader, tokens, held = self.lookups.match(request, num_computed_tokens)
        if held:
            return None, False
        parts = (
            self.lookups.further(request, num_computed_tokens + tokens, loader)
            if loader is not None and self._settings.split
            else ()
        )
        if parts and loader is not None:
            self._parts[request_id] = ((loader, num_computed_tokens, tokens), *parts)
            self.tracker.choose_loader(request_id, loader, parts=[name for name, _, _ in parts])
            tokens += sum(n for _, _, n in parts)
        else:
            if self._parts:
                self._parts.pop(request_id, None)
            if loader is not None or record.loader is not None:  # else: nothing to record
                self.tracker.choose_loader(request_id, loader)
        if loader is None:
            return 0, False
        self._matched_at[request_id] = num_computed_tokens
        return tokens, self.lookups.loads_async(request_id)

    def get_loaded_kv_cache_group_ids(self, request: Any, default: Any) -> Any:
        loader = self.loader(request.request_id)
        if loader is not None:
            try:
                return self._kids.by_name[loader].get_loaded_kv_cache_group_ids(request)
            except Exception as exc:
                self._kids.absorb(
                    "get_loaded_kv_cache_group_ids", [(loader, exc)], "answered the default"
                )
        return default()

    def get_external_cache_hit_sources(
        self, request: Any, num_external_tokens: int, default: Any
    ) -> Any:
        loader = self.loader(request.request_id)
        if loader is not None:
            try:
                return self._kids.by_name[loader].get_external_cache_hit_sources(
                    request, num_external_tokens
                )
            except Exception as exc:
                self._kids.absorb(
                    "get_external_cache_hit_sources", [(loader, exc)], "answered the default"
                )
        return default()

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """The loader gets ``num_external_tokens``; every other child gets 0 and the blocks.

        A child that raises is that child's failure. When it is the loader, the next child
        that offers the tokens loads them (``load_fallback: failover``); else, or when none
        does, its load is reported failed (through the workers, in vLLM's own terms), so vLLM
        recomputes.
        """
        request_id = request.request_id
        if self._parts and request_id in self._parts:
            self._split_alloc(request, blocks, num_external_tokens)
            return
        # No tokens to load (the most common allocation): every child gets 0, whoever loads.
        loader = self.loader(request_id) if num_external_tokens else None
        matched_at = self._matched_at.pop(request_id, 0) if self._matched_at else 0
        stand_in = None
        if loader is not None and self._settings.failover:
            stand_in = partial(self.lookups.stand_in, request, matched_at, num_external_tokens)
        loads, failures = tell_allocation(
            self._kids, request, blocks, loader, num_external_tokens, stand_in=stand_in
        )
        if num_external_tokens <= 0 or loader is None:
            if failures is not None:
                self._kids.absorb("update_state_after_alloc", failures)
            return
        if failures is not None:
            self._kids.absorb(
                "update_state_after_alloc",
                failures,
                "its load reported failed, recomputed by vLLM"
                if loads is None
                else f"its load (if any) handed to {loads!r}",
            )
        if loads is not None and loads != loader:  # failed over: the books learn who loads
            self.lookups.failed(loader, request_id)
            self.tracker.choose_loader(request_id, loads)
            loader = loads
        self.hits.chosen(loader, num_external_tokens)
        if self.lookups.loads_async(request_id):
            self._load_started(request_id, loader, loads is None)
            return
        external = external_blocks(blocks, self._block_size, matched_at, num_external_tokens)
        if loads is None:
            self._load_errors.extend(external)
            self.lookups.failed(loader, request_id)
        else:
            self._sync_loads[request_id] = (loader, external)

    def _split_alloc(self, request: Any, blocks: Any, granted: int) -> None:
        """A split load's allocation: each part's child is told its token range
        (:data:`~multiconnector.vllm.lookups.RANGE_HOOK`), every other child 0 tokens. The
        workers learn each part's blocks; a part whose child raises here is that child's
        failure: its blocks are reported as load errors (vLLM recomputes from the first of
        them), and the other parts load."""
        request_id = request.request_id
        self._matched_at.pop(request_id, None)
        parts: list[tuple[str, int, int]] = []
        left = granted
        for name, start, tokens in self._parts.pop(request_id):
            if left > 0:  # vLLM granted less than asked: the later parts shrink first
                parts.append((name, start, min(tokens, left)))
                left -= tokens
        ranges = {name: (start, tokens) for name, start, tokens in parts}
        failures: Failures = None
        for name, child in self._kids.items:
            try:
                if name in ranges:
                    getattr(child, RANGE_HOOK)(request, blocks, *ranges[name])
                else:
                    child.update_state_after_alloc(request, blocks, 0)
            except Exception as exc:
                failures = failed(failures, name, exc)
        bad = set() if failures is None else {name for name, _ in failures}
        if failures is not None:
            self._kids.absorb(
                "update_state_after_alloc",
                failures,
                "its part of a load (if any) reported failed, recomputed by vLLM",
            )
        shares: list[tuple[str, tuple[int, ...]]] = []
        for name, start, tokens in parts:
            self.hits.chosen(name, tokens)
            external = external_blocks(blocks, self._block_size, start, tokens)
            if name in bad:
                self._load_errors.extend(external)
                self.lookups.failed(name, request_id)
            else:
                shares.append((name, external))
        if not parts:
            return
        if not self.lookups.loads_async(request_id):
            self._new_splits[request_id] = tuple(shares)  # for a child failing on a worker
        elif shares:
            for name in bad.intersection(name for name, _, _ in parts):
                self._part_failed(request_id, name)
            self.loads_in_flight.add(request_id)
            self._load_since[request_id] = time.monotonic()
            self._new_loads[request_id] = shares[0][0]
            self._new_splits[request_id] = tuple(shares)
        else:  # every part failed: the load, as one
            self._load_started(request_id, parts[0][0], True)

    def _load_started(self, request_id: str, loader: str, loader_failed: bool) -> None:
        """An asynchronous load of ``request_id`` by ``loader`` is in flight from now on:
        sent to the workers, or reported failed through them (each worker reports it)."""
        self.loads_in_flight.add(request_id)
        self._load_since[request_id] = time.monotonic()
        if loader_failed:
            self._failed_loads[request_id] = loader
            self.lookups.failed(loader, request_id)
            return
        self._new_loads[request_id] = loader
        if loader in self._kids.counted():
            self.counted.load_started(request_id, loader)

    # -- each step's metadata ------------------------------------------------------------------

    def build_connector_meta(self, scheduler_output: Any) -> NamedMultiConnectorMetadata:
        children: dict[str, Any] = {}
        failures: Failures = None
        for name, child in self._kids.items:  # every step: no helper
            try:
                children[name] = child.build_connector_meta(scheduler_output)
            except Exception as exc:
                failures = failed(failures, name, exc)
                children[name] = None
        if failures is not None:
            self._kids.absorb(
                "build_connector_meta",
                failures,
                "its workers get no metadata this step and its loads of this step are "
                "reported failed",
            )
            self._fail_step_loads({name for name, _ in failures})
        if self._load_since:
            self._overdue_loads()
        if self.health is not None:
            self.health.tick()  # open children whose cooldown is over go half-open
        return NamedMultiConnectorMetadata.owning(children, self._seal())

    def _seal(self) -> Outbox:
        """This step's news for the workers, as one :class:`~.wire.Outbox` the metadata is
        built from; the part starts the next step's afresh. Built by this part: the dicts are
        new and the saver names tuples, so the metadata takes them as they are."""
        outbox = Outbox(self._new_savers, self._new_loads)
        self._new_savers = {}
        self._new_loads = {}
        if self._new_splits:
            outbox = outbox._replace(split_loads=self._new_splits)
            self._new_splits = {}
        if self._sync_loads or self._failed_loads or self._load_errors:
            outbox = outbox._replace(
                sync_loads=self._sync_loads,
                failed_loads=self._failed_loads,
                load_errors=tuple(self._load_errors),
            )
            self._sync_loads = {}
            self._failed_loads = {}
            self._load_errors = []
        return outbox

    def _overdue_loads(self) -> None:
        """Each loader still owing a load's report past ``report_overdue_seconds`` is counted
        and warned about, once per request; vLLM keeps the request waiting for it."""
        limit = self._settings.overdue
        now = time.monotonic()
        for request_id, began in take_older(self._load_since, now - limit):
            loader = self.loader(request_id)
            if loader is not None:
                self._kids.overdue("load", loader, request_id, now - began, limit)

    def _fail_step_loads(self, names: set[str]) -> None:
        """The loads of this step by the children ``names`` (which sent their workers no
        metadata) are reported failed: vLLM recomputes them (a split load's parts by them
        alone, from their first block: the other parts load)."""
        if self._new_splits:
            self._fail_step_parts(names)
        for request_id, name in list(self._new_loads.items()):
            if name in names:
                del self._new_loads[request_id]
                if name in self._kids.counted():
                    self.counted.load_failed(request_id, name)
                self._failed_loads[request_id] = name
                self.lookups.failed(name, request_id)
        for request_id, (name, external) in list(self._sync_loads.items()):
            if name in names:
                del self._sync_loads[request_id]
                self._load_errors.extend(external)
                self.lookups.failed(name, request_id)

    def _fail_step_parts(self, names: set[str]) -> None:
        """The parts of this step's split loads by the children ``names``: their blocks
        reported as load errors, the other parts still sent (an asynchronous load whose every
        part failed is reported failed as one)."""
        for request_id, shares in list(self._new_splits.items()):
            if all(name not in names for name, _ in shares):
                continue
            kept = tuple(share for share in shares if share[0] not in names)
            for name, external in shares:
                if name in names:
                    self._load_errors.extend(external)
                    self.lookups.failed(name, request_id)
            self._new_splits[request_id] = kept
            if request_id in self._new_loads:
                if kept:
                    self._new_loads[request_id] = kept[0][0]
                    for name, _ in shares:
                        if name in names:
                            self._part_failed(request_id, name)
                else:
                    del self._new_splits[request_id]
                    del self._new_loads[request_id]
                    self._failed_loads[request_id] = shares[0][0]

    # -- what the workers report ---------------------------------------------------------------

    def update_connector_output(self, connector_output: Any) -> None:
        """Each child sees the output with its own worker metadata and its own KV cache events
        (by name); the core books are told which saves and loads the workers reported; then
        the completions vLLM acts on next are what the books hand back.

        vLLM calls this before it acts on ``finished_sending`` and ``finished_recving``, and
        frees a request's blocks when it sees it there. So ``finished_sending`` becomes exactly
        the requests with saves that :meth:`~multiconnector.MultiConnector.take` hands back in
        this output (safe to free: nothing of them owed, their load's report included), and a
        load completion of a request with saves is taken (its one completion is its save's).
        """
        worker_meta = connector_output.kv_connector_worker_meta
        if worker_meta is not None:
            if worker_meta.__class__ is not NamedMultiConnectorWorkerMetadata:
                _named(worker_meta, NamedMultiConnectorWorkerMetadata, "kv_connector_worker_meta")
            if worker_meta.failed:
                self._merge_failed("build_connector_worker_meta", worker_meta.failed, "metadata")
        events = connector_output.kv_cache_events
        if events is not None:
            if events.__class__ is not NamedKVEvents:
                _named(events, NamedKVEvents, "kv_cache_events")
            if events.failed:
                self._merge_failed("get_kv_connector_kv_cache_events", events.failed, "events")
        loaded = connector_output.finished_recving or ()  # as the workers reported them
        if self._kids.fan.update_connector_output:
            self._route_output(connector_output, worker_meta, events)
        if connector_output.failed_recving:
            self._mark_failed(connector_output.failed_recving)
        if worker_meta is not None and worker_meta.load_failed:
            self._parts_failed(worker_meta.load_failed)
        counted = self.counted if self._kids.counted() else None
        if counted is not None and worker_meta is not None and worker_meta.loaded:
            counted.loads(worker_meta)
        if loaded or (counted is not None and counted.active()):
            loaded = self._one_completion(connector_output, counted)
        sending = connector_output.finished_sending
        sent = None if worker_meta is None else worker_meta.sent
        unknown = self._saves_confirmed(sending) if sending else ()
        if sent:
            self.counted.saves(sent)
        if loaded:
            self._loads_reported(loaded, connector_output.failed_recving)
        self._take()
        handed = self._handed
        if handed:
            self._handed = []
            savers_of = self._savers_of
            for request_id in handed:
                savers_of.pop(request_id, None)
        if handed or sending:
            connector_output.finished_sending = {*unknown, *handed} or None

    def _one_completion(self, connector_output: Any, counted: Counted | None) -> set[str]:
        """Each load completion the workers reported, or held back before, decided by
        :func:`~multiconnector.rule.one_completion`: held back while a counted loader still
        owes a report; else reported to the books (returned), and passed on to vLLM unless
        the request saves (its one completion is then its save's) or a forwarded report said
        its load failed (:meth:`Counted.failed_of`: every worker reports it failed next
        step)."""
        tracker = self.tracker
        recving = connector_output.finished_recving or ()
        held: set[str] = counted.held if counted is not None else set()
        loaded: set[str] = set()
        passed: set[str] = set()
        for request_id in {*recving, *held} if held else recving:
            record = tracker.peek(request_id)
            due = one_completion(
                load=True,
                saves=record is not None and bool(record.expected),
                owed=counted is not None and counted.counting(record),
            )
            if due is HOLD:
                held.add(request_id)  # only when counted
                continue
            if held:
                held.discard(request_id)
            loaded.add(request_id)
            if due is PASS:
                passed.add(request_id)
        if counted is not None:
            for request_id, name in counted.failed_of(loaded).items():
                loaded.discard(request_id)
                passed.discard(request_id)
                self._failed_loads[request_id] = name  # every worker reports it next step
                self._load_failed(name, request_id)
        if len(passed) != len(recving) or not passed.issuperset(recving):
            connector_output.finished_recving = passed or None
        return loaded

    def _merge_failed(self, hook: str, why_of: Mapping[str, str], what: str) -> None:
        """The children whose answers to ``hook`` raised while vLLM merged the workers' (their
        ``what`` dropped there: :class:`NamedKVEvents`, worker metadata): their failure,
        counted under their names."""
        failures: list[tuple[str, BaseException]] = [
            (name, InvalidValueError(f"child {name!r}'s {what} did not merge: {why}"))
            for name, why in why_of.items()
            if name in self._kids.by_name
        ]
        if failures:
            self._kids.absorb(hook, failures, f"its {what} of this step dropped")

    def _saves_confirmed(self, finished: Any) -> list[str]:
        """Every worker reported ``finished`` sent (vLLM's output aggregator awaits every
        worker): their confirmation, :data:`WORKERS`, applied on the core books. Returns the
        requests the books do not hold (passed on to vLLM as they are)."""
        tracker = self.tracker
        held: list[str] = []
        unknown: list[str] = []
        for request_id in finished:
            (held if request_id in tracker else unknown).append(request_id)
        tracker.transfer_finished_many(WORKERS, held)
        return unknown

    def _loads_reported(self, loaded: Any, failed_now: Any) -> None:
        """The loads of ``loaded`` reported to the core books, by their loaders."""
        tracker = self.tracker
        for request_id in loaded:
            self.loads_in_flight.discard(request_id)
            self._load_since.pop(request_id, None)
            record = tracker.peek(request_id)
            if record is None or record.loader is None:
                continue
            if record.loader in self.counted.owner:  # its reports came: counted.loads
                if not (failed_now and request_id in failed_now):
                    self.hits.add(self.child_of(record.loader), "loads_completed")
                continue
            for loader in (record.loader, *record.parts):
                if tracker.load_finished(request_id, loader) in _LOAD_ENDED and not (
                    failed_now and request_id in failed_now  # counted by _mark_failed
                ):
                    self.hits.add(loader, "loads_completed")

    def _mark_failed(self, request_ids: Any) -> None:
        """The loads of ``request_ids`` failed (a split load's, under its first part's
        loader); a counted loader's were marked when its last report came (Counted.loads)."""
        tracker, owner = self.tracker, self.counted.owner
        for request_id in request_ids:
            record = tracker.peek(request_id)
            if record is not None and record.loader is not None and record.loader not in owner:
                self._load_failed(record.loader, request_id)

    def _load_failed(self, name: str, request_id: str) -> None:
        """Child ``name``'s load (or part) of ``request_id`` failed: counted, and the child is
        not asked to load it again (while it lives: a finished request is looked up no more,
        and nothing of it kept)."""
        if request_id in self.live:
            self.lookups.failed(name, request_id)
        self.hits.add(name, "loads_failed")
        if self.health is not None:
            self.health.failed(self.child_of(name), hook="finished_recving")

    def _parts_failed(self, load_failed: Mapping[str, Mapping[str, int]]) -> None:
        """The workers reported these children's parts of split loads failed (their blocks
        came as load errors): those children are not asked to load those requests again."""
        tracker = self.tracker
        for name, request_ids in load_failed.items():
            for request_id in request_ids:
                record = tracker.peek(request_id)
                if (
                    record is not None
                    and (name in record.parts or name == record.loader)
                    and name not in self._kids.counted()  # counted loaders': Counted.loads
                ):
                    self._part_failed(request_id, name)

    def _part_failed(self, request_id: str, name: str) -> None:
        """Child ``name``'s part of split load ``request_id`` failed while the other parts
        load: settled on the books now, and counted once (its report at the load's completion,
        or another worker's of the same failure, is then a duplicate, not a completion)."""
        if self.tracker.load_finished(request_id, name) in _LOAD_ENDED:
            self._load_failed(name, request_id)

    def _route_output(self, connector_output: Any, worker_meta: Any, events: Any) -> None:
        """Every child's ``update_connector_output``, with its own entries of ``worker_meta``
        and ``events`` in place of ours (put back afterwards); failures absorbed."""
        failures: Failures = None
        try:
            for name, child in self._kids.fan.update_connector_output:
                try:
                    if worker_meta is not None:
                        connector_output.kv_connector_worker_meta = worker_meta.children.get(name)
                    if events is not None:
                        connector_output.kv_cache_events = events.children.get(name)
                    child.update_connector_output(connector_output)
                except Exception as exc:
                    failures = failed(failures, name, exc)
        finally:
            connector_output.kv_connector_worker_meta = worker_meta
            connector_output.kv_cache_events = events
        if failures is not None:
            self._kids.absorb("update_connector_output", failures)

    # -- a request finished --------------------------------------------------------------------

    def register_finished_partial_tail(
        self,
        request: Any,
        block_ids: tuple[list[int], ...],
        partial_tail_offloads: list[tuple[int, int, int]],
    ) -> bool:
        if self._kids.closed:  # as request_finished: no child is asked, nothing is kept
            raise ShutDownError(
                "register_finished_partial_tail() refused: this MultiConnector was shut down"
            )
        accepted = self._kids.gather_soft(
            "register_finished_partial_tail",
            lambda _, c: c.register_finished_partial_tail(
                request, block_ids, partial_tail_offloads
            ),
            "counted as not taking the tail",
            self._kids.savers,  # a load-only child takes no save
        )
        names = tuple(name for name, took in accepted.items() if took)
        if names:
            self._tail_savers[request.request_id] = names
        return bool(names)

    def request_finished(
        self, request: Any, block_ids: Any, *, all_groups: bool = False
    ) -> tuple[bool, dict[str, Any] | None]:
        """Ask every child; merge params into a new dict; tell the core books, and the workers
        by name, who saves.

        ``all_groups``: ``block_ids`` holds every KV cache group's block ids (``SupportsHMA``):
        when every child supports HMA each is asked its ``request_finished_all_groups``;
        otherwise there must be exactly one group, and each is asked its ``request_finished``
        with that group's blocks. A params clash is the later children's failure: the params
        are dropped, and every child that committed to a save is still awaited.
        """
        if all_groups and not self._all_support_hma:
            if not isinstance(block_ids, tuple | list) or len(block_ids) != 1:
                raise HMAUnsupportedError(
                    f"block_ids={shown(block_ids)} must hold exactly one KV cache group's block "
                    "ids: these children do not support HMA: "
                    f"{without_hma(tuple(self._kids.specs.values()))}"
                )
            block_ids, all_groups = block_ids[0], False
        if self._kids.closed:
            raise ShutDownError("request_finished() refused: this MultiConnector was shut down")
        request_id = request.request_id
        record = self.tracker.peek(request_id)
        if record is not None and record.state is not _PENDING:
            # Finished before: a duplicate, which asks nobody (as the core refuses a second
            # request_finished); until its saves are handed back vLLM still holds the blocks.
            return bool(record.expected), None
        if record is None:  # never seen before: its record begins here
            self._ensure(request)
        savers: tuple[str, ...] = ()
        params: dict[str, Any] | None = None
        try:
            savers, params = self._ask_finished(request, block_ids, all_groups)
        finally:
            self._finished(request_id, savers)
        return bool(savers), params

    def _ask_finished(
        self, request: Any, blocks: Any, all_groups: bool
    ) -> tuple[tuple[str, ...], dict[str, Any] | None]:
        """Every child's ``request_finished`` answer, judged by
        :func:`~multiconnector.rule.finish_answer`: the savers (a garbage answer included: it
        may have started a save; a child that took the partial tail too) and the merged params.
        """
        roles = self._kids.roles
        tails = self._tail_savers.get(request.request_id, ()) if self._tail_savers else ()
        savers: list[str] = []
        contributions: list[tuple[str, Any]] = []
        failures: list[tuple[str, BaseException]] = []
        for name, child in self._kids.items:
            try:
                if all_groups:
                    answer = child.request_finished_all_groups(request, blocks)
                else:
                    answer = child.request_finished(request, blocks)
            except Exception as exc:
                failures.append((name, exc))
                if name in tails:  # it took the partial tail before: that save is still owed
                    savers.append(name)
                continue
            saves, params, error = finish_answer(name, answer, load_only=roles[name] is _LOAD)
            if saves or name in tails:
                savers.append(name)
            if error is not None:
                failures.append((name, error))
            elif params is not None:  # None contributes nothing: most children's answer
                contributions.append((name, params))
        merged: dict[str, Any] | None = None
        try:
            merged = merge_transfer_params(contributions) if contributions else None
        except KeyClashError as clash:  # the later children that supplied a key
            later = {name for names in clash.clashes.values() for name in names[1:]}
            failures += [(name, clash) for name in self._kids.names if name in later]
        except InvalidParamsError as exc:
            failures.append(("params", exc))
        if failures:
            self._kids.absorb(
                "request_finished",
                failures,
                "its params dropped (awaited if it answered garbage: it may have started a "
                "save, or if it took the partial tail; else not if it raised)",
            )
        return self._shared_savers(tuple(savers)), merged

    def _finished(self, request_id: str, savers: tuple[str, ...]) -> None:
        """Tell the core books (and this step's metadata, for the workers) who saves
        ``request_id``, and forget its lookups; its record is handed back once nothing of it
        is owed."""
        tracker = self.tracker
        tracker.request_finished_by(request_id, self.counted.awaited(savers))
        if savers:
            self._new_savers[request_id] = savers
            self._savers_of[request_id] = savers
        self.forget(request_id)
        record = tracker.peek(request_id)
        if record is not None and record.loading and request_id not in self.loads_in_flight:
            # No load of it is in flight, and no report of one will come: a synchronous load
            # ends within the step that scheduled it (vLLM reports none), and a load never
            # started never ends. The record would otherwise be held forever. Counted as each
            # loader's drained load (after shutdown too: the core accepts reports, they drain).
            for name in record.owed_loads:
                tracker.load_finished(request_id, name)
        self._take()

    def _take(self) -> None:
        """Drain the core books' hand-back queue (:meth:`~multiconnector.MultiConnector.take`),
        the one place that does: a record with saves goes to :attr:`_handed`, which the next
        ``update_connector_output`` passes on to vLLM as finished sending (vLLM frees its
        blocks then); a record without is forgotten (its request finished without saves: vLLM
        freed its blocks when it finished it). A record is thus never dropped unreported,
        whichever of vLLM's calls settled it."""
        for record in self.tracker.take():
            if record.expected:
                self._handed.append(record.request_id)

    def _shared_savers(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The one tuple equal to ``names`` that every request with these savers shares."""
        if not names:
            return ()
        shared = self._saver_tuples.get(names)
        if shared is None:
            shared = self._saver_tuples.setdefault(names, names)
        return shared

"""The scheduler's part of the vLLM-facing connector: :class:`SchedulerPart`.

The calls vLLM makes on the scheduler's connector. The part asks its children itself (they want
vLLM's ``Request``), judges their answers by the core's pure rules (:mod:`~multiconnector.rule`,
through :class:`~multiconnector.vllm.lookups.Lookups`) and *tells* its core books what they
decided: the loader (:meth:`~multiconnector.MultiConnector.choose_loader`) and the savers
(:meth:`~multiconnector.MultiConnector.request_finished_by`). The books hold each request until
:meth:`~multiconnector.MultiConnector.take` hands it back, when vLLM may free its blocks. Each
step's metadata tells the workers, by name, who loads and who saves what; what they report back
each step is applied by :class:`~multiconnector.vllm.reported.Reported`.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Final

from .._validate import shown
from ..aggregator import MultiConnector as Aggregator
from ..errors import InvalidParamsError, KeyClashError, ShutDownError
from ..healthbook import health_book
from ..machine import State
from ..params import merge_transfer_params
from ..registry import Role
from ..rule import finish_answer
from .allocation import external_blocks, tell_allocation
from .children import Children, Failures, Slot, failed
from .config import Settings, without_hma
from .counted import WORKERS, Counted, not_taken
from .errors import HMAUnsupportedError
from .hits import Hits
from .lookups import RANGE_HOOK, Lookups
from .reported import Reported
from .wire import NamedMultiConnectorMetadata, Outbox

__all__ = ["SchedulerPart"]

_PENDING: Final = State.pending
_FINISHING: Final = State.finishing
_LOAD: Final = Role.load


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
        self._saver_tuples: dict[tuple[str, ...], tuple[str, ...]] = {}
        #: What the workers report each step: applied to the core books, passed on to vLLM;
        #: the asynchronous loads whose report is awaited.
        self.reported = Reported(
            children,
            self.tracker,
            self.counted,
            hits=self.hits,
            lookups=self.lookups,
            health=self.health,
            live=self.live,
            savers_of=self._savers_of,
            fail_next=self._fail_next,
            overdue=settings.overdue,
        )

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
                self.reported.part_failed(request_id, name)
            self.reported.load_sent(request_id)
            self._new_loads[request_id] = shares[0][0]
            self._new_splits[request_id] = tuple(shares)
        else:  # every part failed: the load, as one
            self._load_started(request_id, parts[0][0], True)

    def _load_started(self, request_id: str, loader: str, loader_failed: bool) -> None:
        """An asynchronous load of ``request_id`` by ``loader`` is in flight from now on:
        sent to the workers, or reported failed through them (each worker reports it)."""
        self.reported.load_sent(request_id)
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
        reported = self.reported
        if reported.load_since:
            reported.overdue_loads()
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
                            self.reported.part_failed(request_id, name)
                else:
                    del self._new_splits[request_id]
                    del self._new_loads[request_id]
                    self._failed_loads[request_id] = shares[0][0]

    # -- what the workers report ---------------------------------------------------------------

    def update_connector_output(self, connector_output: Any) -> None:
        """What the workers reported this step: :meth:`Reported.update_connector_output`."""
        self.reported.update_connector_output(connector_output)

    def _fail_next(self, request_id: str, loader: str) -> None:
        """``loader``'s load of ``request_id`` failed: every worker reports it next step."""
        self._failed_loads[request_id] = loader

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
        in_flight = self.reported.loads_in_flight
        if record is not None and record.loading and request_id not in in_flight:
            # No load of it is in flight, and no report of one will come: a synchronous load
            # ends within the step that scheduled it (vLLM reports none), and a load never
            # started never ends. The record would otherwise be held forever. Counted as each
            # loader's drained load (after shutdown too: the core accepts reports, they drain).
            for name in record.owed_loads:
                tracker.load_finished(request_id, name)
        self.reported.take()

    def _shared_savers(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The one tuple equal to ``names`` that every request with these savers shares."""
        if not names:
            return ()
        shared = self._saver_tuples.get(names)
        if shared is None:
            shared = self._saver_tuples.setdefault(names, names)
        return shared

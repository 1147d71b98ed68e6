"""The worker's part of the vLLM-facing connector: :class:`WorkerPart`.

The calls vLLM makes on each worker's connector: the KV caches, the per-layer loads and saves,
and the completions. A worker learns from the scheduler's metadata who loads and who saves each
request, and tells its core books (:meth:`~multiconnector.MultiConnector.choose_loader`, the
:class:`~multiconnector.SaveLedger`); it reports a request finished sending only once every
name the scheduler said saves it has reported, and passes on one load completion per load.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import fields
from functools import cache
from typing import Any, Final

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

from .._validate import shown
from ..aggregator import MultiConnector as Aggregator
from ..errors import InvalidArgumentError
from ..ledger import SaveLedger
from ..machine import State
from ..outcome import Outcome
from ..rule import HOLD, one_completion
from .children import Children, Failures, failed
from .config import Settings
from .counted import Forwarded
from .errors import ChildrenConflictError
from .wire import (
    NamedMultiConnectorMetadata,
    NamedMultiConnectorWorkerMetadata,
)

__all__ = ["WorkerPart"]

logger: Final = logging.getLogger("multiconnector")

#: At most one warning per child in this many seconds about loads it was not chosen to make.
UNCHOSEN_WARN_SECONDS: Final = 60.0

#: The fields of vLLM's ``KVConnectorTransferResults`` this worker applies its rules to; any
#: other field (one a later vLLM adds) is passed through by name (:func:`_pass_through`).
RULED_FIELDS: Final = frozenset({"finished_sending", "finished_recving", "failed_recving"})


@cache
def _extra_fields(results_class: type[Any]) -> tuple[str, ...]:
    """The fields of ``results_class`` (a dataclass) that are not :data:`RULED_FIELDS`."""
    return tuple(f.name for f in fields(results_class) if f.name not in RULED_FIELDS)


def _pass_through(
    results: Any,
    per_child: dict[str, Any],
    extra: tuple[str, ...],
    failures: Failures,
) -> Failures:
    """Merge every child's ``extra`` fields into ``results``, by name: sets and frozensets
    united, dicts updated, lists and tuples concatenated, any other value kept when the children
    that set it agree. A child whose value does not merge is a failure of that child."""
    for name, child_results in per_child.items():
        for field_name in extra:
            theirs = getattr(child_results, field_name, None)
            if not theirs:
                continue
            mine = getattr(results, field_name, None)
            try:
                merged = _merged(mine, theirs)
            except ChildrenConflictError as exc:
                failures = failed(failures, name, exc)
                continue
            setattr(results, field_name, merged)
    return failures


def _merged(mine: Any, theirs: Any) -> Any:
    if not mine:
        return theirs.copy() if isinstance(theirs, set | dict | list) else theirs
    if isinstance(mine, set | frozenset) and isinstance(theirs, set | frozenset):
        return mine | theirs
    if isinstance(mine, dict) and isinstance(theirs, dict):
        return {**mine, **theirs}
    if isinstance(mine, list | tuple) and isinstance(theirs, list | tuple):
        return type(mine)([*mine, *theirs])
    if mine == theirs:
        return mine
    raise ChildrenConflictError(
        f"a transfer-results field holds {shown(mine)} from one child and {shown(theirs)} from "
        "another: they do not merge"
    )


def _ids(name: str, found: Any) -> set[Any]:
    """Child ``name``'s load errors answered in another collection than a set (a list, a
    tuple): its block ids all the same, each a block vLLM must not take as loaded (dropped,
    vLLM would run over KV nothing wrote). What is no collection of ids (a string, a mapping,
    a number) is that child's failure."""
    if isinstance(found, Iterable) and not isinstance(found, str | bytes | Mapping):
        return set(found)
    raise InvalidArgumentError(
        f"child {name!r} answered get_block_ids_with_load_errors with {shown(found)}; must "
        "be a set of block ids"
    )


class WorkerPart:
    """The worker-side calls of vLLM's connector interface, over one :class:`Children`."""

    def __init__(self, children: Children, settings: Settings) -> None:
        self._kids = children
        self._overdue = settings.overdue
        #: The saves each finished request awaits, by the names the scheduler sent.
        self.ledger = SaveLedger(children.names)
        #: The load each request awaits, from the loader the scheduler chose.
        self.loads = Aggregator(children.registry())
        #: What get_transfer_results found due and has not returned yet (it raised, or it was
        #: due when the metadata was bound); None when nothing is.
        self._due: Any = None
        #: The metadata bound for this step (its loads, if a loader fails), else None.
        self._bound: NamedMultiConnectorMetadata | None = None
        #: Blocks of failed synchronous loads, for get_block_ids_with_load_errors.
        self._load_errors_due: set[int] = set()
        #: Each asynchronous split load in flight here: its parts' blocks, by child.
        self._split_of: dict[str, dict[str, tuple[int, ...]]] = {}
        #: Requests vLLM finished while their load was in flight here.
        self._finished_while_loading: set[str] = set()
        #: Requests whose saves all reported here while their load was still in flight here:
        #: held back until the load reports (one completion per request).
        self.sent_while_loading: set[str] = set()
        #: Per child, when a non-chosen load was last warned about, and how many since.
        self._unchosen_warned: dict[str, tuple[float | None, int]] = {}
        #: The children that report on fewer workers than all: which of them save or load
        #: what here, and their reports (and failed loads' parts) to forward to the scheduler.
        self.counted = Forwarded()

    @property
    def counted_outcomes(self) -> dict[tuple[Any, str], int]:
        """Per (outcome, name), the counted children's reports ignored here."""
        return self.counted.outcomes

    # -- the step's metadata -------------------------------------------------------------------

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        """Learn who saves and who loads what from the scheduler's metadata (the core books
        are told), then give each child its own metadata."""
        metadata = self._kids.check_metadata(connector_metadata)
        # The children's counts are asked when first needed (as vLLM's class asks them).
        counted = self._kids.counted() if metadata.savers or metadata.loads else {}
        if metadata.savers:
            # These requests finished on the scheduler; each awaits exactly these names now.
            if counted:
                every, done = self.counted.expect_saves(metadata.savers, counted)
                for request_id in done:
                    if request_id not in self.ledger:
                        self._due_results().finished_sending.add(request_id)
                self.ledger.expect(every)
            else:
                self.ledger.expect(metadata.savers)
        loads = self.loads
        for request_id, name in metadata.loads.items():
            if name in counted:
                # This worker's part is done at once; the scheduler holds the completion back
                # until the child's count of workers reported.
                self.counted.expect_load(request_id, name)
                self._due_results().finished_recving.add(request_id)
                continue
            if request_id not in loads:
                loads.begin(request_id)
            parts = metadata.split_loads.get(request_id) if metadata.split_loads else None
            if parts:
                self._split_of[request_id] = dict(parts)
                loads.choose_loader(request_id, name, parts=[n for n, _ in parts if n != name])
            else:
                loads.choose_loader(request_id, name)
        if metadata.failed_loads or metadata.load_errors:
            self._fail_loads_known(metadata)
        self._bound = metadata
        children = metadata.children
        failures: Failures = None
        for name, child in self._kids.items:
            try:
                child.bind_connector_metadata(children[name])
            except Exception as exc:
                failures = failed(failures, name, exc)
        if failures is not None:
            self.loader_failed("bind_connector_metadata", failures)

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
        self._kids.each("clear_connector_metadata")

    # -- the KV caches and the forward pass ----------------------------------------------------

    def loader_failed(self, what: str, failures: list[tuple[str, Exception]]) -> None:
        """The children of ``failures`` failed in ``what``, a hook of this step's loads: each
        one's loads of this step are reported failed (vLLM recomputes them)."""
        self._kids.absorb(what, failures, "its loads of this step reported failed")
        for name, _ in failures:
            self._fail_loads_of(name)

    def _fail_loads_of(self, name: str) -> None:
        """Child ``name`` failed in this step's load hooks: its asynchronous loads bound this
        step are reported finished and failed (once: a later report of its own is then a
        duplicate), the blocks of its synchronous loads reported as load errors.

        Such a load is settled on the load books as the child's failed report, as a split
        load's part is: nothing here waits for a report of its own, which a child that failed
        to start its load may never make, and the request's next load, by whichever child
        vLLM's next lookup chooses, is recorded (a cancelled record, held until the child
        reported, ignored it: the request waited for remote KVs forever)."""
        bound = self._bound
        if bound is None:
            return
        if bound.split_loads:
            self._fail_parts_of(name, bound)
        for request_id, loader in bound.loads.items():
            if loader != name or request_id in bound.split_loads:
                continue
            if name in self._kids.counted():
                # This worker reported its part already; the scheduler counts the child's own
                # reports, which no one else can make for it (docs/vllm.md, "When a child
                # fails": such a child that never reports is seen in child_failures()).
                continue
            record = self.loads.peek(request_id)
            if record is None or record.state is not State.pending or not record.owes_load(name):
                continue
            self.loads.load_finished(request_id, name)
            due = self._due_results()
            due.finished_recving.add(request_id)
            due.failed_recving.add(request_id)
            self._load_over(request_id)
        for loader, blocks in bound.sync_loads.values():
            if loader == name:
                self._load_errors_due.update(blocks)

    def _fail_parts_of(self, name: str, bound: NamedMultiConnectorMetadata) -> None:
        """Child ``name`` failed in this step's load hooks: the blocks of its parts of this
        step's split loads are reported as load errors; an asynchronous part is over (applied
        on the load books for it, once however many hooks it failed in: its own report, if
        one comes, is a duplicate), and the load completes when its last part does."""
        for request_id, parts in bound.split_loads.items():
            for part, blocks in parts:
                if part != name:
                    continue
                split = request_id in self._split_of
                if split and not self._part_owed(request_id, name):
                    continue  # arrived, or settled by an earlier hook's failure
                self._part_failed(request_id, name, blocks)
                if split:
                    self._part_arrived(request_id, name, self._due_results())

    def _load_over(self, request_id: str) -> None:
        """``request_id``'s load completion is passed on: a request vLLM finished while it
        loaded is cancelled on the load books now (nothing of its load is owed)."""
        if request_id in self._finished_while_loading:
            self._finished_while_loading.discard(request_id)
            self.loads.cancel(request_id)

    def _part_owed(self, request_id: str, name: str) -> bool:
        """Whether child ``name``'s part of split load ``request_id`` is still owed here."""
        record = self.loads.peek(request_id)
        return record is not None and record.owes_load(name)

    def _part_failed(self, request_id: str, name: str, blocks: tuple[int, ...]) -> None:
        """Child ``name``'s part of split load ``request_id`` failed: its blocks are load
        errors (vLLM recomputes from the first of them on, the other parts' tokens stand), and
        the scheduler learns whose part it was (the worker metadata's ``load_failed``), so it
        does not ask that child to load the request again."""
        self._load_errors_due.update(blocks)
        self.counted.part_failed(name, request_id)

    def _part_arrived(self, request_id: str, name: str, results: Any) -> bool:
        """Child ``name``'s part of split load ``request_id`` reported (or failed): applied on
        the load books; once no part is owed, its one completion goes into ``results``.
        Whether the report was applied."""
        if self.loads.load_finished(request_id, name) is not Outcome.applied:
            return False
        record = self.loads.peek(request_id)
        if record is None or not record.loading:
            del self._split_of[request_id]
            results.finished_recving.add(request_id)
            self._load_over(request_id)
        return True

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        results = self.get_transfer_results(finished_req_ids)
        return results.finished_sending or None, results.finished_recving or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """Apply every child's completions to the bookkeeping; return only what is due.

        A request is reported finished sending once every name the scheduler said saves it has
        reported; a load completion is passed on once, from the name chosen to load. When a
        child raises (or answers what is not a set of request ids), that is its failure: the
        others' completions are applied and returned, and the child's reports are awaited still.
        """
        per_child: dict[str, Any] = {}
        failures: Failures = None
        for name, child in self._kids.fan.get_transfer_results:  # every step: no helper
            try:
                per_child[name] = child.get_transfer_results(finished_req_ids)
            except Exception as exc:
                failures = failed(failures, name, exc)
        # Due but not yet returned (a call that raised): returned by this one.
        results = self._due_results()
        counted = self._kids.counted()
        ledger = self.ledger
        for name, child_results in per_child.items():
            sent = child_results.finished_sending
            if sent:
                try:
                    if name in counted:
                        self.counted.saved(name, sent)
                    else:
                        ledger.report(name, sent, results.finished_sending)
                except InvalidArgumentError as exc:  # nothing of this child's was applied
                    failures = failed(failures, name, exc)
            if child_results.failed_recving or child_results.finished_recving:
                self._report_loaded(name, child_results, results)
        if self.sent_while_loading or (results.finished_sending and len(self.loads)):
            self._hold_back(results)
        if per_child:
            extra = _extra_fields(KVConnectorTransferResults)
            if extra:
                failures = _pass_through(results, per_child, extra, failures)
        if len(self.loads):  # nothing to look up while no load is tracked
            self._finish_loads(finished_req_ids)
        if len(ledger):
            self._overdue_saves()
        if failures is not None:
            self._kids.absorb(
                "get_transfer_results", failures, "its completions of this step ignored"
            )
        self._due = None
        return results

    def _overdue_saves(self) -> None:
        """Each child still owing a save's report past ``report_overdue_seconds`` is counted and
        warned about, once per request; the request stays held until it reports."""
        limit = self._overdue
        for request_id, owing, seconds in self.ledger.take_overdue(limit):
            for name in owing:
                self._kids.trouble.overdue("save", name, request_id, seconds, limit)

    def _due_results(self) -> Any:
        """What is due for the next get_transfer_results to return (made when first needed)."""
        if self._due is None:
            self._due = KVConnectorTransferResults()
        return self._due

    def _report_loaded(self, name: str, child_results: Any, results: Any) -> None:
        """Child ``name``'s load completions: passed on once, from the name chosen to load.
        Failed receives also count as finished: the scheduler must stop waiting."""
        loads = self.loads
        failed = child_results.failed_recving
        counted = self.counted
        for request_id in child_results.finished_recving | failed:
            if counted.loading and counted.load_reported(name, request_id, request_id in failed):
                continue  # a counted loader's report: forwarded to the scheduler
            split = self._split_of.get(request_id) if self._split_of else None
            if split is not None and name in split:
                # A part's report once it arrived is a duplicate: its tokens stand.
                if request_id in failed and self._part_owed(request_id, name):
                    self._part_failed(request_id, name, split[name])
                self._part_arrived(request_id, name, results)
                continue
            outcome = loads.load_finished(request_id, name)
            if outcome is not Outcome.applied:
                if outcome is Outcome.phantom:
                    self._warn_unchosen(name, request_id)
                continue
            results.finished_recving.add(request_id)
            if request_id in failed:
                results.failed_recving.add(request_id)
            self._load_over(request_id)

    def _warn_unchosen(self, name: str, request_id: str) -> None:
        """A load completion from a child not chosen to load: counted (as ``phantom``, under
        its name) by the load books; warned about at most once a minute per child."""
        now = time.monotonic()
        last, quiet = self._unchosen_warned.get(name, (None, 0))
        if last is not None and now - last < UNCHOSEN_WARN_SECONDS:
            self._unchosen_warned[name] = (last, quiet + 1)
            return
        self._unchosen_warned[name] = (now, 0)
        logger.warning(
            "child connector %r reported a load of request %r it was not chosen to load "
            "(ignored; the blocks stay the chosen loader's, or the scheduler's to free)%s",
            name,
            request_id,
            f"; {quiet} more such report(s) since the last warning" if quiet else "",
        )

    def _hold_back(self, results: Any) -> None:
        """One completion per request (:func:`~multiconnector.rule.one_completion`): a request
        whose saves are all reported while its load is still in flight on this worker is held
        back until the load reports (the load's own completion is passed on, and the scheduler
        takes the save's as the one)."""
        sending = results.finished_sending
        waiting = self.sent_while_loading
        for request_id in [*waiting, *sending] if len(self.loads) else [*waiting]:
            due = one_completion(load=False, saves=True, owed=self._load_pending(request_id))
            if due is HOLD:
                sending.discard(request_id)
                waiting.add(request_id)
            else:
                waiting.discard(request_id)
                sending.add(request_id)

    def _load_pending(self, request_id: str) -> bool:
        record = self.loads.peek(request_id)
        return record is not None and record.state is State.pending and record.loading

    def _finish_loads(self, finished_req_ids: set[str]) -> None:
        loads = self.loads
        for request_id in finished_req_ids:
            record = loads.peek(request_id)
            if record is None or record.state is not State.pending:
                continue
            if not record.loading:
                loads.cancel(request_id)
            else:  # aborted while loading: the scheduler still needs that one completion
                self._finished_while_loading.add(request_id)
        loads.take()

    def get_block_ids_with_load_errors(self) -> set[int]:
        blocks: set[int] = self._load_errors_due
        if blocks:
            self._load_errors_due = set()
        else:
            blocks = set()
        failures: Failures = None
        for name, child in self._kids.fan.get_block_ids_with_load_errors:
            try:
                found = child.get_block_ids_with_load_errors()
                if found:
                    blocks |= found if isinstance(found, set | frozenset) else _ids(name, found)
            except Exception as exc:
                failures = failed(failures, name, exc)
        if failures is not None:
            self._kids.absorb("get_block_ids_with_load_errors", failures)
        return blocks

    def build_connector_worker_meta(self) -> NamedMultiConnectorWorkerMetadata | None:
        """Each child's worker metadata by name, and the reports of the children that report on
        fewer workers than all (:meth:`get_finished_count`), for the scheduler to count."""
        found: dict[str, Any] | None = None
        failures: Failures = None
        for name, child in self._kids.fan.build_connector_worker_meta:  # every step: no helper
            try:
                meta = child.build_connector_worker_meta()
            except Exception as exc:
                failures = failed(failures, name, exc)
                continue
            if meta is None:
                continue
            # Not type-checked: vLLM's own tests give MagicMock children (their metadata is a
            # MagicMock); one that fails to aggregate is dropped there (NamedMultiConnector-
            # WorkerMetadata.aggregate) and counted by the scheduler.
            if found is None:
                found = {}
            found[name] = meta
        if failures is not None:
            self._kids.absorb(
                "build_connector_worker_meta", failures, "its worker metadata dropped"
            )
        if found is None and not self.counted.pending():
            return None
        forward, loaded, load_failed = self.counted.take()
        return NamedMultiConnectorWorkerMetadata(
            found or {},
            sent=forward,
            loaded=loaded,
            load_failed=load_failed,
            order=self._kids.names,
        )

"""What the workers report back to the scheduler each step: :class:`Reported`.

vLLM hands the scheduler's connector the workers' reports in ``update_connector_output``:
the saves and loads they finished, the loads that failed, each child's worker metadata and KV
cache events. The scheduler part's :class:`Reported` routes each child its own share, applies
the reports to the core books (:class:`~multiconnector.MultiConnector`, through the counted
children's report names, :class:`~multiconnector.vllm.counted.Counted`), and passes on to vLLM
the completions it may act on: the requests with saves the books hand back
(:meth:`Reported.take`, the one caller of :meth:`~multiconnector.MultiConnector.take` on the
scheduler), and each load's one completion (:func:`~multiconnector.rule.one_completion`). It
keeps the asynchronous loads whose report is awaited, and counts a report overdue.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from .._validate import shown
from ..aggregator import MultiConnector as Aggregator
from ..errors import InvalidArgumentError, InvalidValueError
from ..healthbook import HealthBook
from ..ledger import take_older
from ..outcome import Outcome
from ..rule import HOLD, PASS, one_completion
from .children import Children, Failures, failed
from .counted import WORKERS, Counted
from .hits import Hits
from .lookups import Lookups
from .wire import NamedKVEvents, NamedMultiConnectorWorkerMetadata

__all__ = ["Reported"]

#: A load report's outcomes that end a load owed: applied, or drained (the request finished
#: while it loaded). Either way the child made that load: counted completed or failed.
_LOAD_ENDED: Final = frozenset({Outcome.applied, Outcome.drained})


def _named(value: Any, kind: type[Any], what: str) -> Any:
    """``value`` if it is ``None`` or a ``kind``; else an :class:`InvalidArgumentError`."""
    if value is not None and not isinstance(value, kind):
        raise InvalidArgumentError(f"{what}={shown(value)} must be a {kind.__name__}")
    return value


class Reported:
    """The workers' reports on the scheduler: applied to the core books, passed on to vLLM."""

    __slots__ = (
        "_counted",
        "_fail_next",
        "_handed",
        "_health",
        "_hits",
        "_kids",
        "_live",
        "_lookups",
        "_overdue",
        "_savers_of",
        "_tracker",
        "load_since",
        "loads_in_flight",
    )

    def __init__(
        self,
        children: Children,
        tracker: Aggregator,
        counted: Counted,
        *,
        hits: Hits,
        lookups: Lookups,
        health: HealthBook | None,
        live: Mapping[str, Any],
        savers_of: dict[str, tuple[str, ...]],
        fail_next: Callable[[str, str], None],
        overdue: float,
    ) -> None:
        self._kids = children
        self._tracker = tracker
        self._counted = counted
        self._hits = hits
        self._lookups = lookups
        self._health = health
        #: The scheduler part's requests that live (a finished one is looked up no more).
        self._live = live
        #: The scheduler part's requests the workers await saves of, until handed back.
        self._savers_of = savers_of
        #: Reports a load failed to the workers in the next step's metadata (its loader's).
        self._fail_next = fail_next
        #: ``report_overdue_seconds``.
        self._overdue = overdue
        #: The asynchronous loads sent to the workers and not reported yet, with when each was
        #: sent (``time.monotonic()``), until reported or found overdue.
        self.loads_in_flight: set[str] = set()
        self.load_since: dict[str, float] = {}
        #: The requests with saves the core books handed back (:meth:`take`), for vLLM to see
        #: finished sending in the next ``update_connector_output``.
        self._handed: list[str] = []

    def load_sent(self, request_id: str) -> None:
        """An asynchronous load of ``request_id`` is in flight from now on: its report awaited."""
        self.loads_in_flight.add(request_id)
        self.load_since[request_id] = time.monotonic()

    def overdue_loads(self) -> None:
        """Each loader still owing a load's report past ``report_overdue_seconds`` is counted
        and warned about, once per request; vLLM keeps the request waiting for it."""
        limit = self._overdue
        now = time.monotonic()
        tracker = self._tracker
        for request_id, began in take_older(self.load_since, now - limit):
            record = tracker.peek(request_id)
            if record is not None and record.loader is not None:
                loader = self._counted.child_of(record.loader)
                self._kids.overdue("load", loader, request_id, now - began, limit)

    def take(self) -> None:
        """Drain the core books' hand-back queue (:meth:`~multiconnector.MultiConnector.take`),
        the one place that does: a record with saves goes to :attr:`_handed`, which the next
        ``update_connector_output`` passes on to vLLM as finished sending (vLLM frees its
        blocks then); a record without is forgotten (its request finished without saves: vLLM
        freed its blocks when it finished it). A record is thus never dropped unreported,
        whichever of vLLM's calls settled it."""
        for record in self._tracker.take():
            if record.expected:
                self._handed.append(record.request_id)

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
        counted = self._counted if self._kids.counted() else None
        if counted is not None and worker_meta is not None and worker_meta.loaded:
            counted.loads(worker_meta)
        if loaded or (counted is not None and counted.active()):
            loaded = self._one_completion(connector_output, counted)
        sending = connector_output.finished_sending
        sent = None if worker_meta is None else worker_meta.sent
        unknown = self._saves_confirmed(sending) if sending else ()
        if sent:
            self._counted.saves(sent)
        if loaded:
            self._loads_reported(loaded, connector_output.failed_recving)
        self.take()
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
        tracker = self._tracker
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
                self._fail_next(request_id, name)  # every worker reports it next step
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
        tracker = self._tracker
        held: list[str] = []
        unknown: list[str] = []
        for request_id in finished:
            (held if request_id in tracker else unknown).append(request_id)
        tracker.transfer_finished_many(WORKERS, held)
        return unknown

    def _loads_reported(self, loaded: Any, failed_now: Any) -> None:
        """The loads of ``loaded`` reported to the core books, by their loaders."""
        tracker = self._tracker
        for request_id in loaded:
            self.loads_in_flight.discard(request_id)
            self.load_since.pop(request_id, None)
            record = tracker.peek(request_id)
            if record is None or record.loader is None:
                continue
            if record.loader in self._counted.owner:  # its reports came: counted.loads
                if not (failed_now and request_id in failed_now):
                    self._hits.add(self._counted.child_of(record.loader), "loads_completed")
                continue
            for loader in (record.loader, *record.parts):
                if tracker.load_finished(request_id, loader) in _LOAD_ENDED and not (
                    failed_now and request_id in failed_now  # counted by _mark_failed
                ):
                    self._hits.add(loader, "loads_completed")

    def _mark_failed(self, request_ids: Any) -> None:
        """The loads of ``request_ids`` failed (a split load's, under its first part's
        loader); a counted loader's were marked when its last report came (Counted.loads)."""
        tracker, owner = self._tracker, self._counted.owner
        for request_id in request_ids:
            record = tracker.peek(request_id)
            if record is not None and record.loader is not None and record.loader not in owner:
                self._load_failed(record.loader, request_id)

    def _load_failed(self, name: str, request_id: str) -> None:
        """Child ``name``'s load (or part) of ``request_id`` failed: counted, and the child is
        not asked to load it again (while it lives: a finished request is looked up no more,
        and nothing of it kept)."""
        if request_id in self._live:
            self._lookups.failed(name, request_id)
        self._hits.add(name, "loads_failed")
        if self._health is not None:
            self._health.failed(self._counted.child_of(name), hook="finished_recving")

    def _parts_failed(self, load_failed: Mapping[str, Mapping[str, int]]) -> None:
        """The workers reported these children's parts of split loads failed (their blocks
        came as load errors): those children are not asked to load those requests again."""
        tracker = self._tracker
        for name, request_ids in load_failed.items():
            for request_id in request_ids:
                record = tracker.peek(request_id)
                if (
                    record is not None
                    and (name in record.parts or name == record.loader)
                    and name not in self._kids.counted()  # counted loaders': Counted.loads
                ):
                    self.part_failed(request_id, name)

    def part_failed(self, request_id: str, name: str) -> None:
        """Child ``name``'s part of split load ``request_id`` failed while the other parts
        load: settled on the books now, and counted once (its report at the load's completion,
        or another worker's of the same failure, is then a duplicate, not a completion)."""
        if self._tracker.load_finished(request_id, name) in _LOAD_ENDED:
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

"""Delivering the connectors' reports: on the scheduler's thread, or batched to worker threads.

A delivery is a tuple whose first item is one of the ``_D_*`` codes below. Each genuine report's
outcome is judged (a report a connector really made must never be refused), each injected one
must be ignored; a worker delivers each run of saves as one ``transfer_finished_many`` per
connector, as a vLLM worker's ``get_finished`` does.
"""

from __future__ import annotations

import queue
from typing import Any, Final

from ..aggregator import MultiConnector
from ..errors import ConnectorFailures
from ..outcome import Outcome
from .pool import Violations
from .records import Tally, count

__all__ = ["D_LOAD", "D_LOAD_REPORT", "D_REPORT", "D_SAVE", "Deliveries"]

_APPLIED: Final = Outcome.applied
#: What a report a connector really made may meet: applied, or refused because the request was
#: cancelled (and maybe already handed back) or its connector unregistered meanwhile.
#: A cancelled request awaiting it drains it (``drained``).
_GENUINE_SAVE: Final = frozenset(
    {
        Outcome.applied,
        Outcome.drained,
        Outcome.terminal,
        Outcome.unknown_request,
        Outcome.unregistered,
    }
)
#: A load report racing its connector's unregistering meets ``unregistered``.
_GENUINE_LOAD: Final = frozenset(
    {
        Outcome.applied,
        Outcome.drained,
        Outcome.terminal,
        Outcome.unknown_request,
        Outcome.unregistered,
    }
)

#: The kinds of delivery (an item's first field), made by the scheduler (threads == 1) or a
#: worker thread.
D_SAVE, D_LOAD, D_REPORT, D_LOAD_REPORT = range(4)


class Deliveries:
    """The deliveries of :class:`~multiconnector._workload.Simulation`, which sets the attributes
    declared here."""

    mc: MultiConnector
    violations: Violations
    tally: Tally
    threaded: bool
    batches: list[list[tuple[Any, ...]]]
    queues: list[queue.Queue[list[tuple[Any, ...]] | None]]

    def _send(self, route: int, item: tuple[Any, ...]) -> None:
        if self.threaded:
            self.batches[route % len(self.batches)].append(item)
        else:
            self._deliver(item, self.tally)

    def _deliver(self, item: tuple[Any, ...], tally: Tally) -> None:
        try:
            self._deliver_one(item, tally)
        except Exception as exc:  # the library raised where it must not: a finding, not a crash
            about = item[2]
            self.violations.add("unexpected_error", getattr(about, "rid", str(about)), repr(exc))

    def _deliver_one(self, item: tuple[Any, ...], tally: Tally) -> None:
        code = item[0]
        mc = self.mc
        if code in (D_SAVE, D_LOAD):
            _, connector, req, dup = item
            load = code == D_LOAD
            name, rid = connector.name, req.rid
            if not connector.complete(rid, load):
                return  # aborted by its shutdown: a connector that is gone does not report
            if load:
                req.seen.add("load:" + name)
                outcome = mc.load_finished(rid, name)
            else:
                req.seen.add(name)
                try:
                    outcome = mc.transfer_finished(rid, name)
                except ConnectorFailures:  # its on_finished raised, after the report applied
                    count(tally, "callback", "failure")
                    outcome = _APPLIED
            self._judge(tally, load, name, rid, outcome, dup=dup)
        elif code in (D_REPORT, D_LOAD_REPORT):
            _, name, rid, category, req = item
            if req is not None and name not in req.seen:
                return  # a late copy of a report that was never made (its save was aborted)
            self._injected(tally, code == D_LOAD_REPORT, name, rid, category)

    def _judge(
        self,
        tally: Tally,
        load: bool,
        name: str,
        rid: str,
        outcome: Outcome,
        *,
        dup: bool,
    ) -> None:
        """Count a genuine report's outcome, flag a refused one, then send its duplicate."""
        what = "load" if load else "save"
        count(tally, what, outcome.value)
        if outcome not in (_GENUINE_LOAD if load else _GENUINE_SAVE):
            self.violations.add("report_refused", rid, f"{name}'s {what}: {outcome.value}")
        if dup:
            self._injected(tally, load, name, rid, "duplicate")

    def _injected(self, tally: Tally, load: bool, name: str, rid: str, category: str) -> None:
        """Deliver a report that must be ignored."""
        try:
            outcome = (
                self.mc.load_finished(rid, name) if load else self.mc.transfer_finished(rid, name)
            )
        except ConnectorFailures:
            outcome = _APPLIED
        count(tally, category, outcome.value)
        if outcome is _APPLIED or outcome is Outcome.drained:
            what = "load report" if load else "report"
            self.violations.add("fault_applied", rid, f"{category} {what} from {name} applied")

    def _flush(self) -> None:
        for i, batch in enumerate(self.batches):
            if batch:
                self.queues[i].put(batch)
                self.batches[i] = []

    def _drain(self) -> None:
        if self.threaded:
            self._flush()
            for q in self.queues:
                q.join()

    def _work(self, q: queue.Queue[list[tuple[Any, ...]] | None], tally: Tally) -> None:
        """A worker thread: each run of consecutive saves in a batch is delivered as a vLLM
        worker's ``get_finished`` does, one ``transfer_finished_many`` per connector; every other
        delivery one at a time, in order."""
        deliver, saves = self._deliver, self._deliver_saves
        while True:
            batch = q.get()
            if batch is None:
                q.task_done()
                return
            run: list[tuple[Any, ...]] = []
            for item in batch:
                if item[0] == D_SAVE:
                    run.append(item)
                    continue
                if run:
                    saves(run, tally)
                    run = []
                deliver(item, tally)
            if run:
                saves(run, tally)
            q.task_done()

    def _deliver_saves(self, run: list[tuple[Any, ...]], tally: Tally) -> None:
        """A run of genuine saves, one batch per connector name. Each connector's own reports
        keep their order (a run holds one save per request and connector, and a save's injected
        duplicate follows it); reports about one request from different connectors may swap,
        which leads to the same state, as in a real worker's get_finished. The connectors take
        the saves off their ledgers before the batch is reported, as a real one has finished
        them before its get_finished says so."""
        by_name: dict[str, list[tuple[Any, ...]]] = {}
        for item in run:
            by_name.setdefault(item[1].name, []).append(item)
        for name, items in by_name.items():
            try:
                self._deliver_batch(name, items, tally)
            except Exception as exc:  # as in _deliver: a finding, not a crash
                self.violations.add("unexpected_error", items[0][2].rid, repr(exc))

    def _deliver_batch(self, name: str, items: list[tuple[Any, ...]], tally: Tally) -> None:
        made = []
        for item in items:
            _, connector, req, _ = item
            if connector.complete(req.rid, False):  # else aborted by its shutdown: no report
                req.seen.add(name)
                made.append(item)
        if not made:
            return
        try:
            outcomes = self.mc.transfer_finished_many(name, [item[2].rid for item in made])
        except ConnectorFailures as exc:  # on_finished raised, after every report applied
            count(tally, "callback", "failure", len(exc.exceptions))
            outcomes = exc.result
        count(tally, "batch", "calls")
        count(tally, "batch", "reports", len(made))
        for item, outcome in zip(made, outcomes, strict=True):
            self._judge(tally, False, name, item[2].rid, outcome, dup=item[3])

"""The scheduler: :class:`Simulation`, one run of the workload.

Its loop admits arrivals into the block pool, fans each finished request out, cancels,
unregisters and registers connectors, takes what the library hands back and frees exactly that,
then checks that nothing was lost. The connectors' reports go through
:class:`~multiconnector._workload.deliveries.Deliveries`.
"""

from __future__ import annotations

import heapq
import itertools
import math
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any, Final, final

from .._validate import shown
from ..aggregator import MultiConnector
from ..errors import ConnectorFailures, InvalidArgumentError, KeyClashError
from ..machine import State
from ..outcome import Outcome
from ..registry import ConnectorRegistry
from .config import CONNECTORS, FAULT_KINDS, MAX_BLOCKS, SimulationConfig
from .connectors import SimCache, SimConnector
from .deliveries import D_LOAD, D_LOAD_REPORT, D_REPORT, D_SAVE, Deliveries
from .pool import BlockPool, Violations
from .records import SimRequest, Tally, count
from .result import SimulationResult

__all__ = ["Simulation"]

_NOT_READY: Final = "nixl"
_SAVERS: Final = ("cache", "pd@0", "pd@1")
_GHOST: Final = "ghost"

# Scheduler events (heap entries are (tick, sequence, kind, payload)).
_SEND, _FINISH, _CANCEL, _UNREGISTER, _REGISTER = range(5)

#: Simulated time: mean ticks between arrivals, decode length, transfer latencies.
_ARRIVAL_RATE: Final = 2.0
_DECODE: Final = (5, 60)
_SAVE_MEAN: Final = 8.0
_LOAD: Final = (1, 20)
_LATE_AFTER: Final = 400
_DOWN_FOR: Final = (5, 50)


@final
class Simulation(Deliveries):
    """One run. ``Simulation(config).run()`` returns a :class:`SimulationResult`.

    ``on_progress(done, total)`` is called from the scheduler as requests are handed back.
    """

    def __init__(
        self,
        config: SimulationConfig,
        *,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        if not isinstance(config, SimulationConfig):
            raise InvalidArgumentError(f"config={shown(config)} must be a SimulationConfig")
        self.config = config
        self.on_progress = on_progress
        rng = self.rng = random.Random(config.seed)
        self.violations = Violations()
        self.live: dict[str, SimRequest] = {}
        self.pool = BlockPool(config.blocks, config.requests, self._owed, self.violations)
        self.heap: list[tuple[int, int, int, Any]] = []
        self._seq = itertools.count()
        self.now = 0
        self.admitted = 0
        self.clock = rng.expovariate(_ARRIVAL_RATE)
        #: When the load the cache just committed to will be done (set by _committed).
        self.load_done = 0
        self.next_size = rng.randint(1, MAX_BLOCKS)
        self.handed_back = 0
        self.finished = 0
        self.cancelled = 0
        #: Names in unregistration order, appended once each connector was shut down.
        self.unregistered: list[str] = []
        self.tally: Tally = {}
        self.worker_tallies: list[Tally] = []
        self.stats: dict[str, int] = dict.fromkeys(
            (
                "admission_waits",
                "aborted_saves",
                "aborted_loads",
                "callback_failures",
                "clashes",
                "connector_failures",
                "registrations",
                "unregistrations",
            ),
            0,
        )
        self.faults: dict[str, int] = {kind: 0 for kind in FAULT_KINDS if kind in config.faults}
        rate = config.fault_rate
        self.p = {kind: (rate if kind in config.faults else 0.0) for kind in FAULT_KINDS}
        # The connectors: ground truth lives in `instances` (every live registration).
        self.instances: tuple[SimConnector, ...] = ()
        self.by_name: dict[str, SimConnector | None] = {}
        self.up: list[str] = []
        registry = ConnectorRegistry()
        for name in CONNECTORS:
            registry.register(name, self._new_connector(name))
        self.mc = MultiConnector(registry, stripes=config.stripes)
        threads = config.threads
        self.threaded = threads > 1
        self.batches: list[list[tuple[Any, ...]]] = [[] for _ in range(threads)]
        self.queues: list[queue.Queue[list[tuple[Any, ...]] | None]] = []
        self.workers: list[threading.Thread] = []

    # -- connectors ----------------------------------------------------------------------------

    def _new_connector(self, name: str) -> SimConnector | None:
        connector: SimConnector | None = None
        if name != _NOT_READY:
            kind = SimCache if name == "cache" else SimConnector
            connector = kind(name, self.live, self._committed)
        if connector is not None:
            self.instances = (*self.instances, connector)
        self.by_name[name] = connector
        self.up.append(name)
        self.stats["registrations"] += 1
        return connector

    def _owed(self, request_id: str) -> list[str]:
        """Ground truth: which simulated connectors still owe a report for ``request_id``."""
        owed = []
        for connector in self.instances:
            save, load = connector.owes(request_id)
            if save:
                owed.append(connector.name)
            if load:
                owed.append(f"{connector.name} (load)")
        return owed

    def _committed(self, connector: SimConnector, req: SimRequest, load: bool) -> None:
        """A connector committed to a save or a load: schedule its report (and faults)."""
        rng, p, now = self.rng, self.p, self.now
        if load:
            req.loading = True
            done = now + rng.randint(*_LOAD)
            dup = bool(p["duplicate"]) and rng.random() < p["duplicate"]
            self._at(done, _SEND, (req.index, (D_LOAD, connector, req, dup)))
            self.load_done = done
            if dup:
                self.faults["duplicate"] += 1
            return
        done = now + 1 + int(rng.expovariate(1 / _SAVE_MEAN))
        dup = bool(p["duplicate"]) and rng.random() < p["duplicate"]
        if dup:
            self.faults["duplicate"] += 1
        if req.callback_fail == connector.name:
            connector.fail_callbacks[req.rid] = None
            self.faults["raise"] += 1
        self._at(done, _SEND, (req.index, (D_SAVE, connector, req, dup)))
        if p["late"] and rng.random() < p["late"]:
            self.faults["late"] += 1
            item = (D_REPORT, connector.name, req.rid, "late", req)
            self._at(done + _LATE_AFTER, _SEND, (req.index, item))

    # -- the scheduler -------------------------------------------------------------------------

    def _at(self, tick: int, kind: int, payload: Any) -> None:
        heapq.heappush(self.heap, (tick, next(self._seq), kind, payload))

    def _admit(self) -> bool:
        """Admit the next arrival if the pool has room for it."""
        index = self.admitted
        blocks = self.pool.allocate(index, self.next_size)
        if blocks is None:
            return False
        rng, p, now, mc = self.rng, self.p, self.now, self.mc
        self.admitted += 1
        req = SimRequest(index, blocks)
        rid = req.rid
        req.hits = 16 * rng.randint(1, 8) if rng.random() < 0.3 else 0
        req.cache_saves = rng.random() < 0.9
        req.pd = rng.random() < 0.6
        if p["raise"]:
            if rng.random() < p["raise"]:
                req.raiser = rng.choice(_SAVERS)
                self.faults["raise"] += 1
            if rng.random() < p["raise"]:
                req.callback_fail = rng.choice(_SAVERS)
        if p["clash"] and rng.random() < p["clash"]:
            req.clash = True
            self.faults["clash"] += 1
        self.live[rid] = req
        mc.begin(rid)
        tokens = mc.match_tokens(rid)
        start = now
        if req.loading:
            start = self.load_done
        if tokens != (req.hits if req.loading else 0):
            self.violations.add(
                "match_tokens", rid, f"{tokens} tokens; the cache offered {req.hits}"
            )
        decode = rng.randint(*_DECODE)
        self._at(start + decode, _FINISH, req)
        if rng.random() < self.config.cancel_rate:
            if rng.random() < 0.1:  # it lands while request_finished asks the connectors
                req.overtake = self._cancel
            else:
                self._at(now + rng.randint(0, decode + 60), _CANCEL, req)
        if p["unknown"] and rng.random() < p["unknown"]:
            self.faults["unknown"] += 1
            which = rng.randrange(4)
            if which == 0:
                item: tuple[Any, ...] = (D_REPORT, _GHOST, rid, "unknown", None)
            elif which == 1:
                item = (D_REPORT, _NOT_READY, rid, "unknown", None)
            elif which == 2:
                item = (D_REPORT, "cache", f"never-{index}", "unknown", None)
            else:
                item = (D_LOAD_REPORT, _GHOST, rid, "unknown", None)
            self._at(now + rng.randint(0, decode + 20), _SEND, (index, item))
        if p["unregister"] and rng.random() < p["unregister"] / 10:
            self._at(now + rng.randint(0, 50), _UNREGISTER, None)
        self.clock += rng.expovariate(_ARRIVAL_RATE)
        self.next_size = rng.randint(1, MAX_BLOCKS)
        return True

    def _finish(self, req: SimRequest) -> None:
        """The request finished generating: fan it out and check what the library did."""
        rng, p, mc, rid = self.rng, self.p, self.mc, req.rid
        if req.cancel_applied:  # the scheduler cancelled it: it does not finish it...
            if p["late"] and rng.random() < 0.5:  # ...unless it is late to notice
                self.faults["late"] += 1
                late, _ = mc.request_finished(rid, req.blocks)
                count(self.tally, "late", late.value)
                if late is Outcome.applied:
                    self.violations.add("fault_applied", rid, "request_finished after cancel")
            return
        req.finished_once = True
        outcome: Outcome | None = None
        params: dict[str, Any] | None = None
        failed: tuple[str, ...] = ()
        clash: KeyClashError | None = None
        try:
            outcome, params = mc.request_finished(rid, req.blocks)
        except KeyClashError as exc:
            clash = exc
        except ConnectorFailures as exc:
            self.stats["connector_failures"] += 1
            failed = exc.failed
            outcome, params = exc.result
            for inner in exc.exceptions:
                if isinstance(inner, KeyClashError):
                    clash = inner
        count(self.tally, "request_finished", "clash" if outcome is None else outcome.value)
        self._check_fan_out(req, outcome, params, failed, clash)
        if p["duplicate"] and rng.random() < p["duplicate"]:
            self.faults["duplicate"] += 1
            again, _ = mc.request_finished(rid, req.blocks)
            count(self.tally, "duplicate", again.value)
            if again is Outcome.applied:
                self.violations.add("fault_applied", rid, "request_finished applied twice")
        if p["phantom"] and rng.random() < p["phantom"]:
            others = [n for n in self.up if n not in req.committed and n != _NOT_READY]
            if others:
                self.faults["phantom"] += 1
                name = rng.choice(others)
                item: tuple[Any, ...] = (D_REPORT, name, rid, "phantom", None)
                if name != "cache" and rng.random() < 0.5:  # the cache may be the loader
                    item = (D_LOAD_REPORT, name, rid, "phantom", None)
                self._at(self.now + rng.randint(0, 10), _SEND, (req.index, item))

    def _check_fan_out(
        self,
        req: SimRequest,
        outcome: Outcome | None,
        params: dict[str, Any] | None,
        failed: tuple[str, ...],
        clash: KeyClashError | None,
    ) -> None:
        """Compare request_finished's answer with what the connectors really answered."""
        rid, add = req.rid, self.violations.add
        suppliers: dict[str, list[str]] = {}
        merged: dict[str, Any] | None = None
        for name, answer in req.answers:
            if answer is None:
                continue
            merged = {} if merged is None else merged
            for key, value in answer.items():
                suppliers.setdefault(key, []).append(name)
                merged[key] = value
        expected = {k: tuple(names) for k, names in suppliers.items() if len(names) > 1}
        if failed != ((req.raised,) if req.raised else ()):
            add("fan_out", rid, f"failed={failed}, but {req.raised!r} raised")
        if expected:
            self.stats["clashes"] += 1
            if clash is None or dict(clash.clashes) != expected:
                add("fan_out", rid, f"clash {expected} reported as {clash!r}")
        elif clash is not None:
            add("fan_out", rid, f"clash reported where none was: {clash.clashes}")
        elif outcome is not None and outcome is not Outcome.overtaken and params != merged:
            add("fan_out", rid, f"params {params} merged from {req.answers}")
        # A cancel that landed while the connectors were asked overtakes the call (no params).
        wanted = Outcome.overtaken if req.cancel_applied else Outcome.applied
        if outcome is not None and outcome is not wanted:
            add("fan_out", rid, f"request_finished of a live request was {outcome.value}")

    def _cancel(self, req: SimRequest) -> None:
        mc, rid = self.mc, req.rid
        if req.handed_back:  # a cancel that comes too late
            outcome = mc.cancel(rid)
            count(self.tally, "cancel", outcome.value)
            if outcome is not Outcome.unknown_request:
                self.violations.add("cancel", rid, f"cancel after hand-back was {outcome.value}")
            return
        outcome = mc.cancel(rid)
        count(self.tally, "cancel", outcome.value)
        if outcome is Outcome.applied:
            req.cancel_applied = True
        elif outcome is not Outcome.terminal:
            self.violations.add("cancel", rid, f"cancel of a held request was {outcome.value}")
        p = self.p["duplicate"]
        if p and self.rng.random() < p:
            self.faults["duplicate"] += 1
            again = mc.cancel(rid)
            count(self.tally, "duplicate", again.value)
            if again is Outcome.applied:
                self.violations.add("fault_applied", rid, "cancel applied twice")

    def _unregister_event(self) -> None:
        """Shut a connector down and unregister it; register a new one later."""
        rng = self.rng
        if self.up:
            name = rng.choice(self.up)
            self.up.remove(name)
            connector = self.by_name.pop(name)
            # Reports the connector had in flight, delivered after its shutdown and unregistration.
            stale = connector.owed_saves()[:2] if connector is not None and self.p["late"] else []
            self.faults["unregister"] += 1
            if connector is not None:  # the unregister rule's precondition: it touches no block
                aborted, loads = connector.shutdown()
                self.instances = tuple(c for c in self.instances if c is not connector)
                self.stats["aborted_saves"] += len(aborted)
                self.stats["aborted_loads"] += loads
            self.unregistered.append(name)
            self.mc.unregister(name)
            for rid in stale:
                self.faults["late"] += 1
                item = (D_REPORT, name, rid, "late", None)
                self._at(self.now + rng.randint(0, 30), _SEND, (0, item))
            self._at(self.now + rng.randint(*_DOWN_FOR), _REGISTER, name)

    # -- handing back and freeing --------------------------------------------------------------

    def _collect(self) -> None:
        """Take what the library hands back and free exactly that."""
        live, add = self.live, self.violations.add
        for record in self.mc.take():
            rid = record.request_id
            req = live.pop(rid, None)
            if req is None:
                add("handed_back_twice", rid, f"handed back again as {record.state.value}")
                continue
            req.handed_back = True
            self.handed_back += 1
            state = record.state
            if state is State.finished:
                self.finished += 1
                if req.cancel_applied:
                    add("cancel_lost", rid, "handed back finished after its cancel applied")
                if record.awaiting:
                    add("finished_awaiting", rid, f"finished, still awaiting {record.awaiting}")
                if not req.finished_once:
                    add("finished_early", rid, "finished before request_finished")
            elif state is State.cancelled:
                self.cancelled += 1
                if not req.cancel_applied:
                    add("cancel_lost", rid, "handed back cancelled, never cancelled")
            else:
                add("not_terminal", rid, f"handed back in state {state.value}")
            # take() hands back only what is safe to free: free it now, whatever it was.
            self.pool.free(req.index, rid, req.blocks)

    # -- running -------------------------------------------------------------------------------

    def run(self) -> SimulationResult:
        """Run the workload to its end, then check that nothing was lost."""
        started = time.perf_counter()
        if self.threaded:
            for _ in self.batches:
                q: queue.Queue[list[tuple[Any, ...]] | None] = queue.Queue()
                tally: Tally = {}
                thread = threading.Thread(target=self._work, args=(q, tally), daemon=True)
                self.queues.append(q)
                self.worker_tallies.append(tally)
                self.workers.append(thread)
                thread.start()
        try:
            self._loop()
            self._drain()
            self._collect()
        finally:
            for q in self.queues:
                q.put(None)
            for thread in self.workers:
                thread.join()
        elapsed = time.perf_counter() - started
        return self._result(elapsed)

    def _loop(self) -> None:
        heap, pool, total = self.heap, self.pool, self.config.requests
        pop = heapq.heappop
        step = max(1, total // 200)
        reported = 0
        while True:
            now = self.now
            while self.admitted < total and self.clock <= now:
                if not self._admit():
                    self.stats["admission_waits"] += 1
                    break
            blocked = self.admitted < total and self.clock <= now
            if blocked and self.threaded:  # let the workers catch up rather than run ahead
                self._drain()
                self._collect()
                while self.admitted < total and self.clock <= now and self._admit():
                    pass
                blocked = self.admitted < total and self.clock <= now
            following: int | None = heap[0][0] if heap else None
            if self.admitted < total and not blocked:
                arrival = math.ceil(self.clock)
                if following is None or arrival < following:
                    following = arrival
            if following is None:  # nothing scheduled: wait for deliveries, take, free
                before = (pool.frees, self.handed_back)
                self._drain()
                self._collect()
                if (pool.frees, self.handed_back) != before:
                    continue
                return  # everything done, or stalled: the final checks tell which
            self.now = now = following
            while heap and heap[0][0] <= now:
                _, _, kind, payload = pop(heap)
                try:
                    if kind == _SEND:
                        self._send(*payload)
                    elif kind == _FINISH:
                        self._finish(payload)
                    elif kind == _CANCEL:
                        self._cancel(payload)
                    elif kind == _UNREGISTER:
                        self._unregister_event()
                    else:
                        self._register_event(payload)
                except Exception as exc:  # as in _deliver: record it, keep going
                    about = getattr(payload, "rid", "")
                    self.violations.add("unexpected_error", about, repr(exc))
            if self.threaded:
                self._flush()
            self._collect()
            if self.on_progress is not None and self.handed_back - reported >= step:
                reported = self.handed_back
                self.on_progress(reported, total)

    def _register_event(self, name: str) -> None:
        self.mc.register(name, self._new_connector(name))

    def _result(self, elapsed: float) -> SimulationResult:
        add = self.violations.add
        if self.on_progress is not None:
            self.on_progress(self.handed_back, self.config.requests)
        tally: Tally = dict(self.tally)
        for worker in self.worker_tallies:
            for key, n in worker.items():
                tally[key] = tally.get(key, 0) + n
        stats = dict(self.stats)
        stats["callback_failures"] = tally.pop(("callback", "failure"), 0)
        stats["report_batches"] = tally.pop(("batch", "calls"), 0)
        stats["batched_reports"] = tally.pop(("batch", "reports"), 0)
        stats["unregistrations"] = len(self.unregistered)
        reports: dict[str, dict[str, int]] = {}
        for (category, outcome), n in sorted(tally.items()):
            reports.setdefault(category, {})[outcome] = n
        # Nothing lost: every request handed back and freed, no state left anywhere.
        owed = sum(len(c.saves) + len(c.loads) for c in self.instances)
        leaks = {
            "blocks_in_use": self.pool.in_use,
            "requests_not_freed": self.pool.never_freed(),
            "requests_not_handed_back": len(self.live) + (self.config.requests - self.admitted),
            "requests_held_by_library": len(self.mc),
            "reports_owed": owed,
        }
        for kind, n in leaks.items():
            if n:
                add("leak", kind, f"{n} {kind.replace('_', ' ')} at the end")
        mc = self.mc
        return SimulationResult(
            config=self.config,
            finished=self.finished,
            cancelled=self.cancelled,
            outcomes={o.value: n for o, n in sorted(mc.counts().items())},
            connector_outcomes={
                name: {o.value: n for o, n in sorted(per.items())}
                for name, per in sorted(mc.connector_counts().items())
            },
            reports=reports,
            simulator=stats,
            faults=dict(self.faults),
            violations=dict(sorted(self.violations.by_kind.items())),
            examples=list(self.violations.examples),
            early_frees=self.pool.early_frees,
            leaks=leaks,
            elapsed=elapsed,
        )

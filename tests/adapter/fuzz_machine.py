"""The adapter under attack inside vLLM's real v1 ``Scheduler``: a hypothesis state machine.

:class:`World` is one engine: vLLM's ``Scheduler`` (CPU, the tiny OPT config, few KV blocks so
that it preempts) with a ``MultiConnector`` (ours, or vLLM's for the comparison), and one or two
worker-role connectors run as vLLM's model runner runs them (``handle_preemptions``, bind the
metadata after a pickle round trip, load, save, ``get_transfer_results``, load errors, events,
worker metadata, clear), whose outputs go through vLLM's real ``KVOutputAggregator``.

:class:`AdapterMachine` drives it with random interleavings of requests, steps, aborts and the
children's reports (on time, late, twice, for a request the child never had, for one that is
gone), load errors, children raising in worker calls and KV events, and checks after every rule,
from vLLM's side:

- no block is returned to vLLM's block pool while a child still owes a report for it (the pool's
  ``free_blocks`` is wrapped), and no request's blocks are freed, nor does it leave
  ``scheduler.requests``, while a child still owes a report of it (``kv_cache_manager.free`` and
  the scheduler's ``_free_blocks`` are wrapped);
- each asynchronous load is passed to vLLM as one ``finished_recving``: while vLLM awaits it
  (the request waits for remote KVs, or was aborted while it did), and only once no child owes
  a report of that load on any worker (the scheduler's connector's ``update_connector_output``
  is wrapped, and what vLLM acts on read after it);
- nothing but the adapter's documented ``ConnectorFailures`` (around an injected child error in a
  worker call) escapes into the scheduler or the model runner;
- each worker's ``connector_counts()`` add up to the reports that worker's children handed out
  (and the loads they gave up by raising in a load hook, which the adapter settles as theirs);
- every block id a child reported as failed to load reaches the scheduler in that step's output;
- with ``split_loads`` (:class:`SplitMachine`: the children load token ranges, a request's
  prefix may be split across two or three of them): a part that fails (its child reports it in
  ``failed_recving``, or raises in a load hook) reaches the scheduler as its blocks in that
  step's ``invalid_block_ids``, and its request is not failed as a whole (no ``failed_recving``
  for a request whose load is split);
- every child's KV events reach that child, on the scheduler, in its own events class;
- at the end of every example, once every owed report was made (but those of loads a child gave
  up by raising in a load hook: nothing may wait for them) and every request aborted, the
  scheduler, the scheduler-side connector (its books, lookups and split parts), the aggregator
  and every worker (its ledger, load books and split loads) hold nothing.

:class:`SplitMachine` runs the same with ``split_loads`` on and children that load token ranges,
adding requests whose prefix they hold in ranges (often consecutive ones), a rule by which a
part's child reports or fails its part on one worker, and one aborting a request whose split load
is in flight.
"""

from __future__ import annotations

import pickle
import sys
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from fuzz_children import (
    LOAD_HOOKS,
    WORKER_CALLS,
    Board,
    EventsA,
    EventsB,
    InjectedError,
    board,
    fuzz_child,
    stored,
)
from hypothesis import event, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request, RequestStatus
from vllm_harness import (
    BLOCK,
    make_config,
    make_connector,
    make_scheduler,
    runner_output,
    write_model,
)

from bench.scheduler_parts import make_request as bench_request
from multiconnector import ConnectorFailures
from multiconnector.vllm import FALLBACK_KEY, HEALTH_KEY, SPLIT_KEY

NAMES = ("a", "b", "c")
EVENT_CLASSES = {"a": EventsA, "b": EventsB, "c": EventsA}
_MODEL: list[Path] = []  # the tiny model folder, written once
_CONFIGS: dict[tuple[bool, int, tuple[int | None, ...], bool, bool], VllmConfig] = {}
#: The health machine's bounds when a world has one: a child opens at its first failure, so
#: that health transitions interleave with every other event of a run.
HEALTH_BOUNDS: dict[str, Any] = {"threshold": 1, "cooldown_seconds": 1, "probes": 1}

#: Every rule's name, with the labels it counts under (the coverage test checks each fired).
RULE_EVENTS = (
    "add",
    "add-with-hit",
    "step",
    "preempted",
    "abort-waiting",
    "abort-running",
    "abort-loading",
    "abort-finished-saving",
    "abort-gone",
    "report-save",
    "report-load",
    "report-late",
    "report-twice",
    "report-never-had",
    "report-after-gone",
    "report-unknown-id",
    "load-error-blocks",
    "load-error-request",
    "child-raises",
    "kv-events",
    "workers-split",
)

#: The labels of a split-loads run (:class:`SplitMachine`), besides the rules' (each must fire).
SPLIT_EVENTS = (
    "split-async",
    "split-sync",
    "split-three-parts",
    "split-parts-report-apart",
    "split-part-failed",
    "split-part-raised",
    "split-abort-loading",
)


#: How the children of a request added by :meth:`SplitMachine.add_ranges` load: most often
#: all asynchronously, some runs all synchronously, some mixed (a child that loads otherwise
#: than the loader never joins its split).
SYNC_CHOICES = (
    frozenset(),
    frozenset(),
    frozenset(),
    frozenset(NAMES),
    frozenset({"b"}),
    frozenset({"a", "c"}),
)


class Fuzzed(AssertionError):
    """An invariant of the fuzz broke (what the machine asserts)."""


def model_folder() -> Path:
    if not _MODEL:
        _MODEL.append(write_model(Path(tempfile.mkdtemp(prefix="fuzz-opt-"))))
    return _MODEL[0]


def config_for(
    ours: bool,
    workers: int,
    counts: tuple[int | None, ...],
    *,
    split: bool = False,
    health: bool = False,
    failover: bool = False,
) -> VllmConfig:
    """One VllmConfig per configuration, reused by every example (building one is slow);
    ``split``: ``split_loads`` on, every child a :class:`~fuzz_children.RangeFuzzChild`;
    ``health``: each child's health machine on (:data:`HEALTH_BOUNDS`); ``failover``:
    ``load_fallback: failover`` (a request whose load failed loads from the next child)."""
    key = (ours, workers, counts, split, health, failover)
    if key not in _CONFIGS:
        children = [fuzz_child(name, f"fuzz-{name}", ranged=split) for name in NAMES]
        extra: dict[str, Any] = {SPLIT_KEY: True} if split else {}
        if health:
            extra[HEALTH_KEY] = HEALTH_BOUNDS
        if failover:
            extra[FALLBACK_KEY] = "failover"
        config = make_config(model_folder(), children, ours=ours, extra=extra or None)
        assert config.kv_transfer_config is not None
        config.kv_transfer_config.kv_load_failure_policy = "recompute"
        config.parallel_config.world_size = workers  # vLLM's tensor parallel size
        _CONFIGS[key] = config
    return _CONFIGS[key]


def make_request(request_id: str, family: int, num_tokens: int, max_tokens: int) -> Request:
    """A request whose prompt is ``family``'s: requests of one family share their prefix."""
    prompt = [(13 * i + 101 * family) % 900 + 10 for i in range(num_tokens)]
    return bench_request(request_id, prompt, max_tokens)


class World:
    """vLLM's scheduler, ``workers`` worker-role connectors and vLLM's output aggregator."""

    def __init__(
        self,
        *,
        ours: bool = True,
        workers: int = 2,
        num_blocks: int = 10,
        counts: tuple[int | None, ...] = (None, None, None),
        split: bool = False,
        health: bool = False,
        failover: bool = False,
    ) -> None:
        self.ours = ours
        self.boards: dict[str, Board] = {
            name: board(
                f"fuzz-{name}",
                events_class=EVENT_CLASSES[name],
                finished_count=count,
                num_workers=workers,
            )
            for name, count in zip(NAMES, counts, strict=True)
        }
        config = config_for(ours, workers, counts, split=split, health=health, failover=failover)
        self.num_blocks = num_blocks
        self.scheduler = make_scheduler(config, num_blocks)
        self.connector = self.scheduler.connector
        self.workers = [make_connector(config, KVConnectorRole.WORKER) for _ in range(workers)]
        # As vLLM's engine core builds it: from the scheduler's connector and the world size.
        self.aggregator = KVOutputAggregator.from_connector(self.connector, workers)
        self.early_frees: list[str] = []
        self.problems: list[str] = []
        #: What vLLM was handed of the loads' completions that it must not be (see below).
        self.load_problems: list[str] = []
        #: The requests vLLM awaits one load completion of (waiting for remote KVs, or aborted
        #: while they did), until it is handed one.
        self.awaiting: set[str] = set()
        #: Labels of what the steps did (split loads made, their parts failed), for coverage.
        self.labels: list[str] = []
        self.armed: dict[int, set[tuple[str, str]]] = {rank: set() for rank in range(workers)}
        self.steps = 0
        self.preempted = 0
        self._watch_frees()
        self._watch_completions()

    def _watch_frees(self) -> None:
        """Record every block returned to the pool, and every request whose blocks are freed or
        that leaves ``scheduler.requests``, while a child may still touch its blocks."""
        scheduler = self.scheduler
        pool = scheduler.kv_cache_manager.block_pool
        free_blocks = pool.free_blocks

        def watched_free(ordered_blocks: Any) -> None:
            blocks = list(ordered_blocks)
            free_blocks(blocks)
            returned = {b.block_id for b in blocks if not b.is_null and b.ref_cnt == 0}
            for name, child in self.boards.items():
                for (rank, request_id, kind), ids in child.guarded():
                    early = returned.intersection(ids)
                    if early:
                        self.early_frees.append(
                            f"blocks {sorted(early)} of {request_id!r} returned to the pool "
                            f"while {name}@{rank} still owes its {kind} report"
                        )

        pool.free_blocks = watched_free
        manager = scheduler.kv_cache_manager
        free_request, remove_request = manager.free, scheduler._free_blocks

        def watched_free_request(request: Request) -> None:
            self._check_owed_at_free(request.request_id, "had its blocks freed")
            free_request(request)

        def watched_remove(request: Request) -> None:
            self._check_owed_at_free(request.request_id, "left scheduler.requests")
            remove_request(request)

        manager.free = watched_free_request
        scheduler._free_blocks = watched_remove

    def _check_owed_at_free(self, request_id: str, what: str) -> None:
        owing = sorted(
            f"{name}@{rank} ({kind})"
            for name, child in self.boards.items()
            for (rank, owed_id, kind), _ in child.guarded()
            if owed_id == request_id
        )
        if owing:
            self.early_frees.append(f"{request_id!r} {what} while {owing} still owe its reports")

    def _watch_completions(self) -> None:
        """Check the load completions vLLM acts on: what the scheduler's connector leaves in
        the output after its ``update_connector_output`` (vLLM acts on it right after)."""
        connector = self.connector
        update = connector.update_connector_output

        def watched(connector_output: Any) -> None:
            update(connector_output)
            self._check_completions(connector_output)

        connector.update_connector_output = watched

    def _check_completions(self, connector_output: Any) -> None:
        """Each load completion handed to vLLM is the one it awaits, once no child owes a
        report of that load; a split load is never failed as a whole."""
        problems = self.load_problems
        for request_id in sorted(connector_output.finished_recving or ()):
            owing = [
                f"{name}@{rank}"
                for name, child in self.boards.items()
                for rank in child.owes_load(request_id)
            ]
            if owing:
                problems.append(
                    f"finished_recving of {request_id!r} handed to vLLM while {owing} still "
                    "owe a report of its load"
                )
            if request_id not in self.awaiting:
                request = self.scheduler.requests.get(request_id)
                problems.append(
                    f"a finished_recving of {request_id!r} handed to vLLM, which awaits no load "
                    f"of it (a second completion; status "
                    f"{None if request is None else request.status.name})"
                )
            self.awaiting.discard(request_id)
        for request_id in sorted(connector_output.failed_recving or ()):
            parts = self.split_of(request_id)
            if parts:
                problems.append(
                    f"{request_id!r}, whose load is split across {parts}, handed to vLLM as "
                    "failed as a whole (failed_recving)"
                )

    def _await_loads(self, output: Any) -> None:
        """After a schedule(): the requests now waiting for remote KVs await one completion;
        the labels of this step's split loads (our metadata)."""
        s = self.scheduler
        for request_id, request in s.requests.items():
            if (
                request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
                and request_id not in s.finished_recving_kv_req_ids
            ):
                self.awaiting.add(request_id)
        splits = getattr(output.kv_connector_metadata, "split_loads", None) or {}
        for request_id, parts in splits.items():
            self.labels.append(
                "split-async" if request_id in output.kv_connector_metadata.loads else "split-sync"
            )
            if len(parts) > 2:
                self.labels.append("split-three-parts")

    # -- the documented exceptions -----------------------------------------------------------

    def _documented(self, exc: BaseException, rank: int, call: str) -> bool:
        """Whether ``exc``, raised by worker ``rank``'s ``call``, is what the adapter documents
        for the children that were told to raise in it (for vLLM's class: the child's own)."""
        armed = {name for name, method in self.armed[rank] if method == call}
        if not armed:
            return False
        if self.ours:
            return (
                isinstance(exc, ConnectorFailures)
                and set(exc.failed) <= armed
                and all(isinstance(e, InjectedError) for e in exc.exceptions)
            )
        return isinstance(exc, InjectedError)

    def _call(self, rank: int, call: str, run: Callable[[], Any], recover: Any) -> Any:
        try:
            return run()
        except Exception as exc:
            if not self._documented(exc, rank, call):
                raise Fuzzed(f"worker {rank}'s {call} raised {exc!r}") from exc
            return recover(exc) if callable(recover) else recover
        finally:
            for name in NAMES:
                if (name, call) in self.armed[rank]:
                    child = self.boards[name].workers[rank]
                    if call not in child.raise_in:  # it raised
                        self.armed[rank].discard((name, call))
                        if call in LOAD_HOOKS and child.bound is not None and child.bound.parts:
                            self.labels.append("split-part-raised")

    # -- one engine step ---------------------------------------------------------------------

    def step(self) -> None:
        """Schedule, run every worker as the model runner does, aggregate, update."""
        try:
            output = self.scheduler.schedule()
        except Exception as exc:
            raise Fuzzed(f"the scheduler's schedule() raised {exc!r}") from exc
        self.steps += 1
        if output.preempted_req_ids:
            self.preempted += len(output.preempted_req_ids)
        self._await_loads(output)
        shipped = pickle.dumps(output)  # how vLLM sends it to the worker processes
        for child in self.boards.values():
            child.failed_blocks_out.clear()
            child.parts_failed_out.clear()
        outputs = [
            self._run_worker(rank, worker, pickle.loads(shipped), output)
            for rank, worker in enumerate(self.workers)
        ]
        aggregated = self.aggregator.aggregate(outputs)
        assert aggregated is not None
        kv_output = aggregated.kv_connector_output
        self._check_load_errors(set() if kv_output is None else set(kv_output.invalid_block_ids))
        try:
            self.scheduler.update_from_output(output, aggregated)
        except Exception as exc:
            # What vLLM was handed that it must not be, if anything, is why.
            why = "".join(f"; {problem}" for problem in self.load_problems)
            raise Fuzzed(f"the scheduler's update_from_output raised {exc!r}{why}") from exc
        self.awaiting &= self.scheduler.requests.keys()

    def _check_load_errors(self, reached: set[int]) -> None:
        """Every block a child reported failed to load, and every block of a split load's part
        that failed this step, reaches the scheduler in this step's ``invalid_block_ids``."""
        boards = self.boards.values()
        sent_failed = {b for c in boards for blocks in c.failed_blocks_out.values() for b in blocks}
        if sent_failed - reached:
            self.problems.append(
                f"failed block ids {sorted(sent_failed - reached)} reported by children "
                "never reached the scheduler"
            )
        parts_failed = {b for c in boards for blocks in c.parts_failed_out.values() for b in blocks}
        if parts_failed:
            self.labels.append("split-part-failed")
        if parts_failed - reached:
            self.problems.append(
                f"blocks {sorted(parts_failed - reached)} of parts of split loads that failed "
                "this step never reached the scheduler as load errors"
            )

    def _run_worker(self, rank: int, worker: Any, shipped: Any, output: Any) -> Any:
        metadata = shipped.kv_connector_metadata
        kv = KVConnectorOutput()
        call = self._call
        call(rank, "handle_preemptions", lambda: worker.handle_preemptions(metadata), None)
        call(
            rank, "bind_connector_metadata", lambda: worker.bind_connector_metadata(metadata), None
        )
        call(rank, "start_load_kv", lambda: worker.start_load_kv(None), None)
        call(rank, "wait_for_save", worker.wait_for_save, None)
        results = call(
            rank,
            "get_transfer_results",
            lambda: worker.get_transfer_results(shipped.finished_req_ids),
            None,
        )
        if results is not None:
            kv.finished_sending = results.finished_sending
            kv.finished_recving = results.finished_recving
            kv.failed_recving = results.failed_recving

        def answered(exc: Any) -> set[int]:
            # Ours: the other children's answers ride on the error. vLLM's: lost with it.
            result = getattr(exc, "result", None) or {}
            return {b for found in result.values() if found for b in found}

        kv.invalid_block_ids = call(
            rank, "get_block_ids_with_load_errors", worker.get_block_ids_with_load_errors, answered
        )
        kv.kv_connector_stats = worker.get_kv_connector_stats()
        kv.kv_cache_events = worker.get_kv_connector_kv_cache_events()
        kv.kv_connector_worker_meta = call(
            rank, "build_connector_worker_meta", worker.build_connector_worker_meta, None
        )
        call(rank, "clear_connector_metadata", worker.clear_connector_metadata, None)
        return runner_output(output, kv)

    # -- what the world holds ----------------------------------------------------------------

    def owed(self) -> list[tuple[str, int, str, str]]:
        """Every report still owed: (child, rank, request id, kind), sorted."""
        return sorted(
            (name, rank, request_id, kind)
            for name, child in self.boards.items()
            for (rank, request_id, kind) in child.owed
        )

    def queued(self) -> bool:
        return any(
            w.sending or w.recving or w.failed or w.failed_blocks or w.events
            for child in self.boards.values()
            for w in child.workers
        )

    def split_of(self, request_id: str) -> list[str]:
        """The children that load a part of ``request_id``'s current asynchronous split load."""
        return [name for name, child in self.boards.items() if request_id in child.part_blocks]

    def live(self) -> list[str]:
        return [rid for rid, r in self.scheduler.requests.items() if not r.is_finished()]

    def check_counts(self) -> None:
        """Each worker's connector_counts() add up to the reports its children handed out (and
        the loads they gave up by raising in a load hook: the adapter settles each as the
        child's failed report).

        A child that reports on fewer workers than all has the reports its workers forward
        counted on the scheduler (applied, or why ignored), the others on the workers: for it,
        the workers' and the scheduler's counts together add up to every report it made (with
        those a worker forwards still on their way: its worker metadata raised).
        """
        if not self.ours:
            return
        counted = getattr(self.workers[0], "finished_counts", {})
        part = self.connector._scheduler
        # At the scheduler: the forwarded reports of their loads (and of made-up names), and
        # those of their saves, which the core books count under one name per report owed.
        at_scheduler = dict(part.counted_outcomes)
        for rank, per in part.tracker.connector_counts().items():
            if part.child_of(rank) != rank:
                for outcome, n in per.items():
                    key = (outcome, part.child_of(rank))
                    at_scheduler[key] = at_scheduler.get(key, 0) + n
        per_worker = [worker.connector_counts() for worker in self.workers]
        for name, child in self.boards.items():
            got = 0
            for rank, all_counts in enumerate(per_worker):
                counts = all_counts.get(name, {})
                got += sum(counts.values())
                made = child.delivered[rank] + child.given_up[rank]
                if name not in counted and sum(counts.values()) != made:
                    raise Fuzzed(
                        f"worker {rank}'s connector_counts()[{name!r}] add up to "
                        f"{sum(counts.values())}, but {name} handed out {child.delivered[rank]} "
                        f"reports there (and gave up {child.given_up[rank]} loads): {counts}"
                    )
            if name in counted:
                got += sum(n for (_, who), n in at_scheduler.items() if who == name)
                # Still on their way: forwarded by a worker whose worker metadata raised.
                for worker in self.workers:
                    for pending in (worker._worker.counted.sent, worker._worker.counted.loaded):
                        got += sum(pending.get(name, {}).values())
                made = sum(child.delivered.values())
                if got != made:
                    raise Fuzzed(
                        f"connector_counts() of the workers and the scheduler add up to {got} "
                        f"for {name!r}, which reports on fewer workers, but it handed out {made}"
                    )

    def check_events(self) -> None:
        """Every child's events reached it, in its own class, and only its own."""
        for name, child in self.boards.items():
            if child.foreign_events:
                raise Fuzzed(f"{name} was handed another class's KV events object")
            if Counter(map(repr, child.events_in)) != Counter(map(repr, child.events_out)):
                raise Fuzzed(
                    f"{name}'s KV events: sent {len(child.events_out)}, the scheduler's {name} "
                    f"received {len(child.events_in)}"
                )

    def drain(self, max_steps: int = 12) -> None:
        """Abort everything, make every owed report (but those of loads given up: a child that
        failed to start a load may never report it), step until quiet; then nothing is held."""
        for child in self.boards.values():
            for w in child.workers:
                w.raise_in.clear()
        for rank in self.armed:
            self.armed[rank].clear()
        for child in self.boards.values():  # a load given up is never reported: none awaited
            for rank, request_id in child.excused:
                del child.owed[(rank, request_id, "load")]
            child.excused.clear()
        live = self.live()
        if live:
            self.scheduler.finish_requests(live, RequestStatus.FINISHED_ABORTED)
        for _ in range(max_steps):
            for child in self.boards.values():
                for rank, request_id, kind in list(child.owed):
                    w = child.workers[rank]
                    (w.sending if kind == "save" else w.recving).add(request_id)
            self.step()
            if not self.owed() and not self.queued() and not self.scheduler.requests:
                break
        self.step()
        self.step()
        self.check_empty()

    def free_blocks(self) -> int:
        return int(self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks())

    def check_empty(self) -> None:
        s = self.scheduler
        held = {
            "owed reports": self.owed(),
            "scheduler.requests": sorted(s.requests),
            "scheduler.running": [r.request_id for r in s.running],
            "scheduler.waiting": len(s.waiting),
            "finished_recving_kv_req_ids": sorted(s.finished_recving_kv_req_ids),
            "failed_recving_kv_req_ids": sorted(s.failed_recving_kv_req_ids),
            "blocks in use": self.num_blocks - 1 - self.free_blocks(),
            "aggregator sending": dict(self.aggregator._send_remaining_count),
            "aggregator recving": dict(self.aggregator._recv_remaining_count),
        }
        c = self.connector
        if self.ours:
            held["connector.tracker"] = len(c.tracker)
            held["connector.saving"] = dict(c.saving)
            held["connector loads in flight"] = sorted(c._scheduler.reported.loads_in_flight)
            held["connector live"] = sorted(c._scheduler.live)
            held["connector savers"] = dict(c._scheduler._savers_of)
            part = c._scheduler
            held["connector split parts"] = dict(part._parts)
            held["connector matched at"] = dict(part._matched_at)
            held["connector load clocks"] = sorted(part.reported.load_since)
            lookups = part.lookups
            held["connector lookups"] = {
                what: found
                for what, found in (
                    ("loads async", sorted(lookups._load_async)),
                    ("failed by", dict(lookups._failed_by)),
                    ("waits", dict(lookups._waits)),
                )
                if found
            }
            for rank, w in enumerate(self.workers):
                held[f"worker {rank} ledger"] = w.ledger.held()
                held[f"worker {rank} loads"] = len(w.load_tracker)
                held[f"worker {rank} finished while loading"] = sorted(
                    w._worker._finished_while_loading
                )
                held[f"worker {rank} split loads"] = dict(w._worker._split_of)
                held[f"worker {rank} sent while loading"] = sorted(w._worker.sent_while_loading)
                held[f"worker {rank} load errors due"] = sorted(w._worker._load_errors_due)
        else:
            held["connector requests_to_connector"] = dict(c._requests_to_connector)
            held["connector extra_async_saves"] = dict(c._extra_async_saves)
            for rank, w in enumerate(self.workers):
                held[f"worker {rank} extra_async_saves"] = dict(w._extra_async_saves)
        leaks = {k: v for k, v in held.items() if v}
        if leaks:
            raise Fuzzed(f"held after every report was made and every request ended: {leaks}")


class AdapterMachine(RuleBasedStateMachine):
    """Random interleavings of requests, steps, aborts and reports against :class:`World`."""

    OURS: ClassVar[bool] = True
    WORKERS: ClassVar[int] = 2
    NUM_BLOCKS: ClassVar[int] = 16
    COUNTS: ClassVar[tuple[int | None, ...]] = (None, None, None)
    #: ``split_loads`` on, every child loading token ranges (:class:`SplitMachine`, whose
    #: requests are added by its ``add_ranges``, not by :meth:`add`).
    SPLIT: ClassVar[bool] = False
    #: Each child's health machine on (:data:`HEALTH_BOUNDS`; its rules: test_vllm_health_fuzz).
    HEALTH: ClassVar[bool] = False
    #: ``load_fallback: failover``: a request whose load failed is looked up again.
    FAILOVER: ClassVar[bool] = False
    EVENTS: ClassVar[bool] = True
    #: The children that may have an external prefix hit (may be chosen to load).
    LOADERS: ClassVar[tuple[str, ...]] = NAMES
    MAX_LIVE: ClassVar[int] = 5
    #: Every instance's world, for tests that look at what a run did.
    fired: ClassVar[Counter[str]] = Counter()
    #: How many examples (machines) were made since the count was last reset.
    made: ClassVar[int] = 0

    def __init__(self) -> None:
        super().__init__()
        type(self).made += 1
        self.world = World(
            ours=self.OURS,
            workers=self.WORKERS,
            num_blocks=self.NUM_BLOCKS,
            counts=self.COUNTS,
            split=self.SPLIT,
            health=self.HEALTH,
            failover=self.FAILOVER,
        )
        self.serial = 0
        self.requests: list[str] = []  # every request id ever added
        self.delivered: list[tuple[str, int, str, str]] = []  # (child, rank, rid, kind) made
        self.done = False
        self.checked_at = 0

    def fire(self, label: str) -> None:
        event(label)
        type(self).fired[label] += 1

    # -- rules ---------------------------------------------------------------------------------

    @precondition(lambda self: not self.SPLIT and len(self.world.live()) < self.MAX_LIVE)
    @rule(
        family=st.integers(0, 7),
        blocks=st.integers(1, 4),
        extra=st.integers(1, 15),
        max_tokens=st.integers(1, 32),
        hits=st.dictionaries(st.sampled_from(NAMES), st.integers(1, 3), max_size=2),
        sync=st.sampled_from([False, False, False, True]),
        savers=st.sets(st.sampled_from(NAMES), max_size=2),
    )
    def add(  # noqa: PLR0917 (hypothesis passes a rule's arguments by keyword)
        self,
        family: int,
        blocks: int,
        extra: int,
        max_tokens: int,
        hits: dict[str, int],
        sync: bool,
        savers: set[str],
    ) -> None:
        """A request, with an external prefix hit on some children (in blocks) and savers."""
        request_id = f"r{self.serial}"
        self.serial += 1
        num_tokens = blocks * BLOCK + extra
        for name, child in self.world.boards.items():
            hit = min(hits.get(name, 0), blocks) * BLOCK if name in self.LOADERS else 0
            if hit:
                child.hits[request_id] = hit
                if sync:  # loaded within the step: nothing is owed
                    child.sync.add(request_id)
            if name in savers:
                child.saves.add(request_id)
        with_hit = any(n in self.LOADERS for n in hits)
        self.fire("add-with-hit" if with_hit else "add")
        note(
            f"add {request_id}: {num_tokens} tokens, max {max_tokens}, hits {hits}, "
            f"sync {sync}, savers {sorted(savers)}"
        )
        self.world.scheduler.add_request(make_request(request_id, family, num_tokens, max_tokens))
        self.requests.append(request_id)

    def _steps(self, n: int) -> None:
        for _ in range(n):
            self.fire("step")
            preempted = self.world.preempted
            self.world.step()
            if self.world.preempted > preempted:
                self.fire("preempted")
            for label in self.world.labels:
                self.fire(label)
            self.world.labels.clear()

    @rule(events=st.lists(st.tuples(st.sampled_from(NAMES), st.integers(0, 1)), max_size=2))
    def step(self, events: list[tuple[str, int]]) -> None:
        """One engine step; before it, some children have KV cache events on some workers."""
        for name, drawn in events if self.EVENTS else ():
            rank = drawn % self.WORKERS
            self.serial += 1
            self.world.boards[name].workers[rank].events.append(stored(name, rank, self.serial))
            self.fire("kv-events")
        self._steps(1)

    @rule(n=st.integers(2, 6))
    def run(self, n: int) -> None:
        """Several engine steps (requests decode, run out of blocks, finish)."""
        self._steps(n)

    @precondition(lambda self: bool(self.requests))
    @rule(data=st.data(), gone=st.integers(0, 4))
    def abort(self, data: st.DataObject, gone: int) -> None:
        """Abort a request vLLM holds (waiting, loading, running, finished and saving), or
        now and then one that is gone."""
        held = sorted(self.world.scheduler.requests)
        pool = held if held and gone else self.requests
        request_id = data.draw(st.sampled_from(pool), label="abort")
        request = self.world.scheduler.requests.get(request_id)
        if request is None:
            label = "abort-gone"
        elif request.is_finished():
            label = "abort-finished-saving"
        elif request.status is RequestStatus.WAITING_FOR_REMOTE_KVS:
            label = "abort-loading"
        elif request.status is RequestStatus.RUNNING:
            label = "abort-running"
        else:
            label = "abort-waiting"
        self.fire(label)
        try:
            self.world.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)
        except Exception as exc:
            raise Fuzzed(f"finish_requests({request_id!r}) raised {exc!r}") from exc

    @precondition(lambda self: bool(self.world.owed()))
    @rule(data=st.data())
    def report(self, data: st.DataObject) -> None:
        """A child reports a save or load it owes, on one worker."""
        name, rank, request_id, kind = data.draw(st.sampled_from(self.world.owed()), label="owed")
        w = self.world.boards[name].workers[rank]
        (w.sending if kind == "save" else w.recving).add(request_id)
        self.fire(f"report-{kind}")
        request = self.world.scheduler.requests.get(request_id)
        if request is None or request.is_finished():
            self.fire("report-late")
        if any(
            (n, r, q, k) in self.world.owed()
            for n, r, q, k in [(name, other, request_id, kind) for other in range(self.WORKERS)]
            if r != rank
        ):
            self.fire("workers-split")
        self.delivered.append((name, rank, request_id, kind))

    @precondition(lambda self: bool(self.delivered))
    @rule(data=st.data())
    def report_twice(self, data: st.DataObject) -> None:
        """A child reports again a save or load it reported before."""
        name, rank, request_id, kind = data.draw(st.sampled_from(self.delivered), label="again")
        w = self.world.boards[name].workers[rank]
        (w.sending if kind == "save" else w.recving).add(request_id)
        self.fire("report-twice")

    @rule(
        data=st.data(),
        name=st.sampled_from(NAMES),
        kind=st.sampled_from(["save", "load"]),
        rank=st.integers(0, 1),
        unknown=st.booleans(),
    )
    def report_stray(
        self, data: st.DataObject, name: str, kind: str, rank: int, unknown: bool
    ) -> None:
        """A child reports a request it never had a transfer of: one vLLM has (live or
        finished), one that is gone, or an id vLLM never saw."""
        child = self.world.boards[name]
        w = child.workers[rank % self.WORKERS]
        candidates = [r for r in self.requests if (r, kind) not in child.had]
        if unknown or not candidates:
            request_id = f"ghost-{self.serial}"
            self.fire("report-unknown-id")
        else:
            request_id = data.draw(st.sampled_from(candidates), label="never had")
            gone = request_id not in self.world.scheduler.requests
            self.fire("report-after-gone" if gone else "report-never-had")
        (w.sending if kind == "save" else w.recving).add(request_id)

    @precondition(lambda self: any(k == "load" for *_, k in self.world.owed()))
    @rule(data=st.data(), whole=st.booleans())
    def load_error(self, data: st.DataObject, whole: bool) -> None:
        """A child's owed load finishes with an error: some blocks, or the whole request."""
        loads = [o for o in self.world.owed() if o[3] == "load"]
        name, rank, request_id, _ = data.draw(st.sampled_from(loads), label="load")
        child = self.world.boards[name]
        w = child.workers[rank]
        blocks = child.owed[(rank, request_id, "load")]
        if whole or not blocks:
            w.failed.add(request_id)
            self.fire("load-error-request")
        else:
            bad = data.draw(st.sets(st.sampled_from(blocks), min_size=1), label="bad blocks")
            w.recving.add(request_id)
            w.failed_blocks |= bad
            self.fire("load-error-blocks")
        self.delivered.append((name, rank, request_id, "load"))

    @precondition(lambda self: sum(map(len, self.world.armed.values())) < 3)
    @rule(name=st.sampled_from(NAMES), rank=st.integers(0, 1), call=st.sampled_from(WORKER_CALLS))
    def child_raises(self, name: str, rank: int, call: str) -> None:
        """A child raises, once, in one worker call."""
        rank %= self.WORKERS
        self.world.boards[name].workers[rank].raise_in.add(call)
        self.world.armed[rank].add((name, call))
        self.fire("child-raises")

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def nothing_freed_early(self) -> None:
        if self.world.early_frees:
            raise Fuzzed("; ".join(self.world.early_frees))

    @invariant()
    def failed_blocks_reach_the_scheduler(self) -> None:
        if self.world.problems:
            raise Fuzzed("; ".join(self.world.problems))

    @invariant()
    def loads_complete_once(self) -> None:
        if self.world.load_problems:
            raise Fuzzed("; ".join(self.world.load_problems))

    @invariant()
    def counts_add_up(self) -> None:
        # Reports are handed out, and events sent, only in a step: checked after each one.
        if self.checked_at != self.world.steps:
            self.checked_at = self.world.steps
            self.world.check_counts()
            self.world.check_events()

    def teardown(self) -> None:
        # Only when the run got here without a failure (teardown runs in a finally clause):
        # then, once everything is reported, nothing may be held.
        if sys.exc_info()[1] is None and not self.done:
            self.done = True
            self.world.drain()
            self.nothing_freed_early()
            self.failed_blocks_reach_the_scheduler()
            self.loads_complete_once()
            self.world.check_counts()
            self.world.check_events()


#: A child's blocks of a prefix: (first block, how many).
_SPAN = st.tuples(st.integers(0, 2), st.integers(1, 3))
#: The next child's blocks in a chain: (how many of the previous child's it holds too, how many
#: past them).
_LINK = st.tuples(st.sampled_from([0, 0, 1]), st.integers(1, 2))


def _chain(names: list[str], links: list[tuple[int, int]]) -> dict[str, tuple[int, int]]:
    """Children holding consecutive (or overlapping) block ranges of a prefix, in the order of
    ``names``: what a split load is made of, whichever child the lookup asks first."""
    spans: dict[str, tuple[int, int]] = {}
    end = 0
    for name, (back, count) in zip(names, links, strict=True):
        first = max(end - back, 0)
        spans[name] = (first, end + count - first)
        end += count
    return spans


#: The three children holding consecutive block ranges, in any order (those past a request's
#: blocks hold fewer, or none).
_CHAIN = st.builds(_chain, st.permutations(NAMES), st.lists(_LINK, min_size=3, max_size=3))


class SplitMachine(AdapterMachine):
    """``split_loads`` on, every child loading token ranges (:class:`RangeFuzzChild`): a
    request's prefix may be loaded in two or three parts, whose reports, failures and aborts
    come in any order, with the rules of :class:`AdapterMachine` and these. With
    ``load_fallback: failover``: a request whose load (or part) failed is looked up again and
    loaded by the others (the plain machine explores the default, ``recompute``)."""

    SPLIT = True
    FAILOVER = True

    def parts_owed(self) -> list[tuple[str, int, str]]:
        """Every part of a split load still owed: (child, rank, request id), sorted."""
        return sorted(
            (name, rank, request_id)
            for name, child in self.world.boards.items()
            for rank, request_id, kind in child.owed
            if kind == "load" and request_id in child.part_blocks
        )

    def splits_loading(self) -> list[str]:
        """The requests vLLM holds waiting for their split load."""
        return sorted(
            request_id
            for request_id, request in self.world.scheduler.requests.items()
            if request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
            and self.world.split_of(request_id)
        )

    @precondition(lambda self: len(self.world.live()) < self.MAX_LIVE)
    @rule(
        family=st.integers(0, 7),
        blocks=st.integers(2, 4),
        extra=st.integers(1, 15),
        max_tokens=st.integers(1, 32),
        spans=st.one_of(_CHAIN, _CHAIN, st.dictionaries(st.sampled_from(NAMES), _SPAN, max_size=3)),
        sync=st.sampled_from(SYNC_CHOICES),
        savers=st.sets(st.sampled_from(NAMES), max_size=2),
        hook=st.one_of(
            st.none(),
            st.tuples(st.sampled_from(NAMES), st.integers(0, 1), st.sampled_from(LOAD_HOOKS)),
        ),
        then_step=st.booleans(),
    )
    def add_ranges(  # noqa: PLR0917 (hypothesis passes a rule's arguments by keyword)
        self,
        family: int,
        blocks: int,
        extra: int,
        max_tokens: int,
        spans: dict[str, tuple[int, int]],
        sync: frozenset[str],
        savers: set[str],
        hook: tuple[str, int, str] | None,
        then_step: bool,
    ) -> None:
        """A request whose prefix the children hold in ranges: each child in ``spans`` holds
        the blocks ``[first, first + count)`` of it (within its ``blocks`` full blocks), those
        in ``sync`` load synchronously; ``hook``: a child raises, once, in a load hook of one
        worker (the next step's: the one that may bind this request's load); ``then_step``:
        one engine step at once (most requests are then scheduled while they live)."""
        request_id = f"r{self.serial}"
        self.serial += 1
        held = {}
        for name, (drawn, count) in spans.items():
            first = min(drawn, blocks - 1)
            end = min(first + count, blocks)
            child = self.world.boards[name]
            child.starts[request_id] = first * BLOCK
            child.hits[request_id] = end * BLOCK
            held[name] = (first, end)
            if name in sync:
                child.sync.add(request_id)
        for name in savers:
            self.world.boards[name].saves.add(request_id)
        if hook is not None:
            name, rank, call = hook
            rank %= self.WORKERS
            self.world.boards[name].workers[rank].raise_in.add(call)
            self.world.armed[rank].add((name, call))
        self.fire("add-with-hit" if held else "add")
        note(
            f"add {request_id}: {blocks * BLOCK + extra} tokens, max {max_tokens}, blocks held "
            f"{held}, sync {sorted(sync)}, savers {sorted(savers)}, raises {hook}"
        )
        request = make_request(request_id, family, blocks * BLOCK + extra, max_tokens)
        self.world.scheduler.add_request(request)
        self.requests.append(request_id)
        if then_step:
            self._steps(1)

    @precondition(lambda self: bool(self.parts_owed()))
    @rule(data=st.data(), fail=st.booleans())
    def report_part(self, data: st.DataObject, fail: bool) -> None:
        """A part's child reports its part of a split load on one worker, or that it failed
        (``failed_recving``)."""
        name, rank, request_id = data.draw(st.sampled_from(self.parts_owed()), label="part")
        w = self.world.boards[name].workers[rank]
        (w.failed if fail else w.recving).add(request_id)
        self.delivered.append((name, rank, request_id, "load"))
        others = [n for n in self.world.split_of(request_id) if n != name]
        if any(self.world.boards[other].owes_load(request_id) for other in others):
            self.fire("split-parts-report-apart")

    @precondition(lambda self: bool(self.splits_loading()))
    @rule(data=st.data())
    def abort_split(self, data: st.DataObject) -> None:
        """Abort a request while its split load is in flight."""
        request_id = data.draw(st.sampled_from(self.splits_loading()), label="abort split")
        self.fire("split-abort-loading")
        try:
            self.world.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)
        except Exception as exc:
            raise Fuzzed(f"finish_requests({request_id!r}) raised {exc!r}") from exc

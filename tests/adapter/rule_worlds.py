"""The pieces of ``test_scheduler_rule.py``: the alphabet, the adapter driven as vLLM drives it
(:class:`World`, :class:`SchedulerWorld`), the transfer report rule at each level of the adapter
(:class:`Reference`), and the enumeration of every sequence (:func:`explore`). The test's
docstring says what they prove and how.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request, RequestStatus
from vllm_children import Script, child, script
from vllm_harness import (
    connector_output,
    make_config,
    make_connector,
    make_request,
    make_scheduler,
    runner_output,
    worker_output,
)

from multiconnector import Outcome, SaveLedger, State
from multiconnector.aggregator import MultiConnector as Aggregator
from multiconnector.rule import transfer_report
from multiconnector.vllm import NamedMultiConnectorWorkerMetadata

#: The name of no child, reporting through the workers' metadata.
STRANGER = "X"

# -- the alphabet ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finish:
    """vLLM's ``request_finished`` (a finish or an abort); ``savers`` answer ``True``."""

    request_id: str
    savers: tuple[str, ...]

    def __str__(self) -> str:
        return f"finish {self.request_id} {{{', '.join(self.savers)}}}"


@dataclass(frozen=True)
class Arrive:
    """The request arrives and vLLM asks the connector for its matched tokens."""

    request_id: str

    def __str__(self) -> str:
        return f"arrive {self.request_id}"


@dataclass(frozen=True)
class Step:
    """One engine step; ``reports`` are ``(child, request id, workers)``: the child reports the
    request finished sending on those workers; ``stranger`` the requests :data:`STRANGER`
    reports in the workers' metadata."""

    reports: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    stranger: tuple[str, ...] = ()

    def __str__(self) -> str:
        said = [f"{name}:{r}@{'+'.join(map(str, on))}" for name, r, on in self.reports]
        said += [f"{STRANGER}:{r}" for r in self.stranger]
        return f"step({', '.join(said)})"


Event = Finish | Arrive | Step


@dataclass
class Setup:
    """A configuration of children, workers and requests, and its alphabet."""

    name: str
    #: Child name -> its ``get_finished_count()`` (``None``: every worker).
    children: dict[str, int | None]
    #: The children that save when asked (the others never do).
    saving: tuple[str, ...]
    workers: int
    requests: tuple[str, ...]
    alphabet: tuple[Event, ...] = ()
    #: ``(where, name, outcome)``: every outcome the enumeration must meet, and no other.
    outcomes: set[tuple[str, str, str]] = field(default_factory=set)
    scripts: dict[str, Script] = field(default_factory=dict)
    config: Any = None
    request_objects: dict[str, Request] = field(default_factory=dict)

    @property
    def counted(self) -> tuple[str, ...]:
        return tuple(n for n, k in self.children.items() if k is not None and k < self.workers)


def subsets(names: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for size in range(len(names) + 1):
        yield from itertools.combinations(names, size)


def one_worker() -> Setup:
    setup = Setup("one worker", {"S1": None, "S2": None, "N": None}, ("S1", "S2"), 1, ("r1", "r2"))
    events: list[Event] = []
    for r in setup.requests:
        events += [Finish(r, savers) for savers in subsets(setup.saving)]
        events.append(Arrive(r))
        events += [Step(((name, r, (0,)),)) for name in setup.children]
        events.append(Step(stranger=(r,)))
    # Two savers in one step (the second is the release, a third report the same step is
    # terminal), one child reporting both requests.
    events.append(Step((("S1", "r1", (0,)), ("S2", "r1", (0,)), ("N", "r1", (0,)))))
    events.append(Step((("S1", "r1", (0,)), ("S1", "r2", (0,)))))
    # A stranger's report in the step that frees the request (terminal on the scheduler).
    events.append(Step((("S1", "r1", (0,)),), stranger=("r1",)))
    events.append(Step())
    setup.alphabet = tuple(events)
    setup.outcomes = {
        *(("worker", n, o) for n in ("S1", "S2") for o in WORKER_SAVER_OUTCOMES),
        *(("worker", "N", o) for o in ("phantom", "terminal", "unknown_request")),
        *(("scheduler", STRANGER, o) for o in ("terminal", "unknown_connector", "unknown_request")),
    }
    # S1 never reports after its request was released in the same step: no event has it.
    setup.outcomes.discard(("worker", "S1", "terminal"))
    return setup


#: What a saver's report on a worker can be.
WORKER_SAVER_OUTCOMES = ("applied", "duplicate", "phantom", "terminal", "unknown_request")


def two_workers() -> Setup:
    setup = Setup(
        "two workers",
        {"S1": None, "S2": None, "N": None, "H": 1},
        ("S1", "S2", "H"),
        2,
        ("r1",),
    )
    events: list[Event] = [Finish("r1", savers) for savers in subsets(setup.saving)]
    events.append(Arrive("r1"))
    for name in setup.children:
        events += [Step(((name, "r1", on),)) for on in ((0,), (1,), (0, 1))]
    events.append(Step(stranger=("r1",)))
    events.append(Step())
    setup.alphabet = tuple(events)
    setup.outcomes = {
        *(("worker", n, o) for n in ("S1", "S2") for o in WORKER_SAVER_OUTCOMES),
        *(("worker", "N", o) for o in ("phantom", "terminal", "unknown_request")),
        # H's report on a worker that does not await it (its other reports go to the scheduler).
        ("worker", "H", "unknown_request"),
        *(
            ("scheduler", "H", o)
            for o in ("applied", "duplicate", "phantom", "terminal", "unknown_request")
        ),
        *(("scheduler", STRANGER, o) for o in ("unknown_connector", "unknown_request")),
    }
    return setup


# -- the adapter, as vLLM drives it --------------------------------------------------------------


def prepare(setup: Setup, model: Path) -> Setup:
    """Scripts, the ``VllmConfig`` and the requests, made once per configuration."""
    setup.scripts = {name: script(finished_count=k) for name, k in setup.children.items()}
    setup.config = make_config(model, [child(n, s) for n, s in setup.scripts.items()])
    setup.config.parallel_config.world_size = setup.workers
    setup.request_objects = {r: make_request(r) for r in setup.requests}
    return setup


class World:
    """The scheduler-role connector, one worker-role connector per worker, vLLM's aggregator."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.scheduler = make_connector(setup.config, KVConnectorRole.SCHEDULER)
        self.workers = [
            make_connector(setup.config, KVConnectorRole.WORKER) for _ in range(setup.workers)
        ]
        # As vLLM's engine core builds it, from the scheduler's connector and the world size.
        self.aggregator = (
            KVOutputAggregator.from_connector(self.scheduler, setup.workers)
            if setup.workers > 1
            else None
        )
        #: The requests finished since the last step (the step's ``finished_req_ids``).
        self.finished_ids: set[str] = set()

    def finish(self, event: Finish) -> bool:
        """``request_finished``: whether vLLM is to keep the blocks (``False``: freed now)."""
        for name in self.setup.saving:
            self.setup.scripts[name].saves = name in event.savers
        request = self.setup.request_objects[event.request_id]
        keep, _ = self.scheduler.request_finished(request, [1, 2, 3])
        self.finished_ids.add(event.request_id)
        return bool(keep)

    def arrive(self, event: Arrive) -> None:
        request = self.setup.request_objects[event.request_id]
        self.scheduler.get_num_new_matched_tokens(request, 0)

    def step(self, event: Step) -> set[str]:
        """One engine step; the requests in the ``finished_sending`` vLLM acts on."""
        output = SchedulerOutput.make_empty()
        output.finished_req_ids = self.finished_ids
        self.finished_ids = set()
        output.kv_connector_metadata = self.scheduler.build_connector_meta(output)
        shipped = pickle.dumps(output.kv_connector_metadata)  # how workers receive it
        outputs = []
        for number, worker in enumerate(self.workers):
            worker.bind_connector_metadata(pickle.loads(shipped))
            for name, request_id, on in event.reports:
                if number in on:
                    self.setup.scripts[name].sending.add(request_id)
            kv_output = worker_output(worker, output.finished_req_ids)
            worker.clear_connector_metadata()
            outputs.append(connector_output(kv_output))
        if self.aggregator is None:
            kv_output = outputs[0].kv_connector_output
        else:
            aggregated = self.aggregator.aggregate(outputs)
            assert aggregated is not None
            kv_output = aggregated.kv_connector_output
        if event.stranger:
            extra = NamedMultiConnectorWorkerMetadata(
                {}, sent={STRANGER: {r: 1 for r in event.stranger}}
            )
            meta = kv_output.kv_connector_worker_meta
            kv_output.kv_connector_worker_meta = extra if meta is None else meta.aggregate(extra)
        self.scheduler.update_connector_output(kv_output)
        # No load here: a load completion would reach vLLM for a request it does not load.
        assert not kv_output.finished_recving, kv_output.finished_recving
        return set(kv_output.finished_sending or ())

    # -- the whole state but the counters --------------------------------------------------

    def key(self) -> tuple[Any, ...]:
        parts: list[Any] = [_connector_key(self.scheduler)]
        parts += [_connector_key(worker) for worker in self.workers]
        if self.aggregator is not None:
            agg = self.aggregator
            parts.append(
                (
                    _frozen(agg._send_remaining_count),
                    _frozen(agg._recv_remaining_count),
                    _frozen(agg._failed_recving_pending),
                    agg._expected_finished_count,
                    # (vLLM 0.32's aggregator salvages nothing: it has no such list)
                    len(getattr(agg, "_salvaged_outputs", ())),
                )
            )
        parts.append(_frozen(self.finished_ids))
        return tuple(parts)


#: Attributes of the connectors that are configuration (fixed once built), not state.
STATIC = frozenset(
    {
        "_vllm_config",
        "_kv_transfer_config",
        "_kv_cache_config",
        "_kv_cache_manager",
        "_role",
        "_all_support_hma",
        "_block_size",
        # The children, their names, roles, fan-out and counts (asked once), and the settings.
        "_kids",
        "_settings",
        "hits",
    }
)
#: Attributes only ever added to and never read by a decision (compared as counts instead), or
#: a cache of values that are a function of their keys.
COUNTERS = frozenset({"counted_outcomes", "_unchosen_warned", "_saver_tuples"})
#: The attributes holding a connector's role parts, whose attributes are compared in turn.
PARTS = frozenset({"_sched", "_work"})


def _connector_key(connector: Any) -> tuple[Any, ...]:
    """Every attribute of ``connector`` but configuration and counters, frozen."""
    parts = []
    for name, value in sorted(vars(connector).items()):
        if name in STATIC or name in COUNTERS:
            continue
        if name in PARTS:
            parts.append((name, None if value is None else _connector_key(value)))
            continue
        parts.append((name, _frozen(value)))
    return tuple(parts)


def _frozen(value: Any) -> Any:
    """A hashable snapshot of ``value``, order kept where the value keeps one; an error for a
    type this test does not know (an attribute added to the adapter must be classified)."""
    if value is None or isinstance(value, str | int | bool | float | State | Outcome):
        return value
    if isinstance(value, tuple | list):
        return (type(value).__name__, tuple(_frozen(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _frozen(v)) for k, v in value.items()))
    if isinstance(value, set | frozenset):
        return ("set", frozenset(_frozen(v) for v in value))
    if isinstance(value, Request):
        return ("request", value.request_id)
    if isinstance(value, Aggregator):
        records = []
        for request_id in value.request_ids():
            r = value.get(request_id)
            assert r is not None
            records.append(
                (
                    request_id,
                    r.state,
                    r.awaiting,
                    r.expected,
                    r.abandoned,
                    r.loader,
                    r.loaded,
                    r.parts_owed,
                )
            )
        return ("aggregator", tuple(records), len(value.held()))
    if isinstance(value, SaveLedger):
        return ("ledger", _frozen(value.held()), _frozen(value._expected))
    if type(value).__name__ == "Trouble":
        return ("trouble", _frozen(value.counts()))
    if type(value).__name__ == "NamedMultiConnectorMetadata":
        return ("metadata", _frozen(value._fields()))
    if type(value).__name__ == "Lookups":
        return ("lookups", _frozen([value._load_async, value._failed_by, value._waits]))
    if type(value).__name__ == "Reported":  # the rest is the scheduler part's, compared there
        return ("reported", _frozen([value.loads_in_flight, value.load_since, value._handed]))
    if type(value).__name__ == "Counted":  # its names are configuration, outcomes counters
        return ("counted", _frozen([value._held, value._failed]))
    if type(value).__name__ == "Forwarded":  # its outcomes are counters
        return (
            "forwarded",
            _frozen([value.expected, value.loading, value.sent, value.loaded, value.load_failed]),
        )
    if type(value).__name__ == "KVConnectorTransferResults":
        return ("results", _frozen(vars(value)))
    raise AssertionError(f"the test does not know how to compare a {type(value).__name__}")


class SchedulerWorld(World):
    """The same events under vLLM's real ``Scheduler`` (one worker): vLLM makes the calls.

    ``finish`` adds a request and aborts it (``finish_requests``: vLLM calls
    ``request_finished`` as it frees it; a request it still holds is not finished again, so a
    duplicate finish asks nothing); ``step`` is ``schedule()``, the worker's calls on the
    pickled scheduler output, and ``update_from_output``; vLLM frees what leaves its requests.
    """

    def __init__(self, setup: Setup) -> None:
        assert setup.workers == 1
        self.setup = setup
        self.vllm = make_scheduler(setup.config)
        self.scheduler = self.vllm.connector
        self.workers = [make_connector(setup.config, KVConnectorRole.WORKER)]
        self.aggregator = None
        self.finished_ids = set()

    def finish(self, event: Finish) -> bool:
        for name in self.setup.saving:
            self.setup.scripts[name].saves = name in event.savers
        if event.request_id not in self.vllm.requests:
            self.vllm.add_request(make_request(event.request_id))
        self.vllm.finish_requests(event.request_id, RequestStatus.FINISHED_ABORTED)
        return event.request_id in self.vllm.requests

    def arrive(self, event: Arrive) -> None:
        raise AssertionError("an arrival under the Scheduler would schedule the request")

    def step(self, event: Step) -> set[str]:
        held = set(self.vllm.requests)
        output = self.vllm.schedule()
        shipped = pickle.loads(pickle.dumps(output))  # how workers receive it
        worker = self.workers[0]
        worker.bind_connector_metadata(shipped.kv_connector_metadata)
        for name, request_id, _ in event.reports:
            self.setup.scripts[name].sending.add(request_id)
        extra = None
        if event.stranger:
            extra = NamedMultiConnectorWorkerMetadata(
                {}, sent={STRANGER: {r: 1 for r in event.stranger}}
            )
        kv_output = worker_output(worker, shipped.finished_req_ids, extra=extra)
        worker.clear_connector_metadata()
        self.vllm.update_from_output(output, runner_output(output, kv_output))
        return held - set(self.vllm.requests)

    def key(self) -> tuple[Any, ...]:
        """The connectors' state, and the Scheduler's that these events change: its requests
        (every one is finished here: aborted before it was scheduled) and the finished ids it
        sends the workers next. Nothing is ever scheduled, so its queues stay empty and its
        block pool untouched (asserted)."""
        vllm = self.vllm
        assert not vllm.waiting and not vllm.running
        pool = vllm.kv_cache_manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1  # the null block
        return (
            _connector_key(self.scheduler),
            _connector_key(self.workers[0]),
            tuple((r, request.status) for r, request in vllm.requests.items()),
            frozenset(vllm.finished_req_ids),
        )


# -- the reference: the rule, at each level of the adapter -------------------------------------

Book = dict[str, tuple[tuple[str, ...], tuple[str, ...]]]


def apply_rule(
    book: Book, request_id: str, name: str, released: set[str], *, pending: bool = False
) -> Outcome:
    """``name``'s report for ``request_id`` on ``book`` (request id -> awaited and expected
    names), as :func:`transfer_report` decides it: a request not held is ``finished`` when it
    was ``released`` in this step (the adapter hands it back at the end of the step),
    ``pending`` when it is held otherwise (arrived, not finished), else unknown; a completed
    request leaves ``book`` and joins ``released``."""
    entry = book.get(request_id)
    if entry is None:
        state = State.finished if request_id in released else State.pending if pending else None
        awaiting = expected = ()
    else:
        state = State.finishing
        awaiting, expected = entry
    outcome, dest, rest, completes = transfer_report(state, awaiting, expected, (), name)
    if outcome is Outcome.applied:
        assert dest is not None
        if completes:
            del book[request_id]
            released.add(request_id)
        else:
            book[request_id] = (rest, expected)
    return outcome


class Reference:
    """The adapter's two levels of books as plain data, changed only by the rule's verdicts.

    A worker awaits, per finished request, the savers that report on every worker (its ledger)
    and, apart, the counted savers (each reports to the scheduler, once per worker); it releases
    a request to vLLM once its ledger awaits nothing. The scheduler awaits, per request handed
    off, each worker's release (vLLM's aggregator counts them) and each counted saver's report;
    vLLM frees the request once nothing is awaited there. A phantom from a name that is no child
    is ``unknown_connector``, as every side refines it.
    """

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.children = tuple(setup.children)
        self.counted = setup.counted
        #: The requests whose blocks vLLM holds (their request_finished answered True).
        self.held: set[str] = set()
        #: Finished at the scheduler, not yet told the workers: request id -> savers.
        self.untold: dict[str, tuple[str, ...]] = {}
        self.scheduler: Book = {}
        self.ledgers: list[Book] = [{} for _ in range(setup.workers)]
        self.counted_books: list[Book] = [{} for _ in range(setup.workers)]
        self.scheduler_counts: dict[str, dict[Outcome, int]] = {}
        self.worker_counts: list[dict[str, dict[Outcome, int]]] = [{} for _ in range(setup.workers)]
        #: The requests the scheduler's books hold from their arrival, not finished yet.
        self.arrived: set[str] = set()

    def arrive(self, event: Arrive) -> None:
        if event.request_id not in self.held:
            self.arrived.add(event.request_id)

    def finish(self, event: Finish) -> bool:
        """Whether vLLM keeps the blocks."""
        request_id = event.request_id
        if request_id in self.held:
            return True  # a duplicate: changes nothing, the blocks stay held
        self.arrived.discard(request_id)
        savers = tuple(n for n in self.children if n in event.savers)
        if not savers:
            return False  # nothing owed: freed at once
        self.held.add(request_id)
        workers = tuple(f"worker {w}" for w in range(self.setup.workers))
        owed = workers + tuple(n for n in savers if n in self.counted)
        self.scheduler[request_id] = (owed, owed)
        self.untold[request_id] = savers
        return True

    def step(self, event: Step) -> set[str]:
        """The requests vLLM frees in this step."""
        workers = range(self.setup.workers)
        released: list[set[str]] = [set() for _ in workers]
        for request_id, savers in self.untold.items():
            every = tuple(n for n in savers if n not in self.counted)
            counted = tuple(n for n in savers if n in self.counted)
            for w in workers:
                assert request_id not in self.ledgers[w]
                if counted:
                    self.counted_books[w][request_id] = (counted, counted)
                if every:
                    self.ledgers[w][request_id] = (every, every)
                else:
                    released[w].add(request_id)  # nothing of its own to await
        self.untold = {}
        forwarded: dict[str, dict[str, int]] = {}
        for w in workers:
            # The worker asks its children in configuration order.
            for name in self.children:
                for reporter, request_id, on in event.reports:
                    if reporter != name or w not in on:
                        continue
                    if name in self.counted:
                        outcome = apply_rule(self.counted_books[w], request_id, name, set())
                        if outcome is Outcome.applied:  # forwarded, counted by the scheduler
                            per = forwarded.setdefault(name, {})
                            per[request_id] = per.get(request_id, 0) + 1
                            continue
                    else:
                        outcome = apply_rule(self.ledgers[w], request_id, name, released[w])
                    _count(self.worker_counts[w], name, outcome)
        freed: set[str] = set()
        for w in workers:
            for request_id in sorted(released[w]):
                outcome = apply_rule(self.scheduler, request_id, f"worker {w}", freed)
                assert outcome is Outcome.applied, (w, request_id, outcome)
        reports = [(name, r, n) for name, per in forwarded.items() for r, n in per.items()]
        reports += [(STRANGER, r, 1) for r in event.stranger]
        for name, request_id, n in reports:
            for _ in range(n):
                pending = request_id in self.arrived  # held from its arrival, awaiting nothing
                outcome = apply_rule(self.scheduler, request_id, name, freed, pending=pending)
                if outcome is Outcome.phantom and name not in self.children:
                    outcome = Outcome.unknown_connector
                _count(self.scheduler_counts, name, outcome)
        assert freed <= self.held
        self.held -= freed
        return freed

    def key(self) -> tuple[Any, ...]:
        return (
            _frozen([self.held, self.untold, self.scheduler, self.arrived]),
            _frozen(self.ledgers),
            _frozen(self.counted_books),
        )


def _count(counts: dict[str, dict[Outcome, int]], name: str, outcome: Outcome) -> None:
    per = counts.setdefault(name, {})
    per[outcome] = per.get(outcome, 0) + 1


# -- one event on both, compared -----------------------------------------------------------------


class Mismatch(AssertionError):
    """The adapter and the rule disagree after the last event of ``path``."""

    def __init__(self, path: tuple[Event, ...], what: str) -> None:
        self.path = path
        super().__init__(f"after {' ; '.join(map(str, path))}: {what}")


class Pair:
    """A world and its reference, fed the same events."""

    def __init__(self, setup: Setup, world: type[World] = World) -> None:
        self.world = world(setup)
        self.ref = Reference(setup)
        self.path: tuple[Event, ...] = ()
        #: Whether the last event freed a request.
        self.freed = False

    def apply(self, event: Event, *, check: bool = True) -> None:
        """Feed ``event`` to both; compare everything afterwards (unless replaying a sequence
        already compared)."""
        self.path = (*self.path, event)
        world, ref = self.world, self.ref
        if isinstance(event, Finish):
            keep, says = world.finish(event), ref.finish(event)
            self.freed = not keep
            if keep != says:
                raise Mismatch(self.path, f"request_finished answered keep={keep}, the rule {says}")
        elif isinstance(event, Arrive):
            world.arrive(event)
            ref.arrive(event)
            self.freed = False
        else:
            freed, says = world.step(event), ref.step(event)
            self.freed = bool(freed)
            if freed != says:
                raise Mismatch(self.path, f"vLLM frees {sorted(freed)}, the rule {sorted(says)}")
        if check:
            self.compare()

    def compare(self) -> None:
        world, ref = self.world, self.ref
        scheduler = world.scheduler
        checks: list[tuple[str, Any, Any]] = [
            ("saving", set(scheduler.saving), ref.held),
            ("scheduler counts", scheduler.connector_counts(), ref.scheduler_counts),
            (
                "counted owed",
                {r: set(owed) for r, owed in scheduler._scheduler.counted_owed.items()},
                {
                    r: {n for n in awaiting if n in ref.counted}
                    for r, (awaiting, _) in ref.scheduler.items()
                    if any(n in ref.counted for n in awaiting)
                },
            ),
        ]
        for w, worker in enumerate(world.workers):
            checks.append(
                (
                    f"worker {w} ledger",
                    worker.ledger.held(),
                    {r: awaiting for r, (awaiting, _) in ref.ledgers[w].items()},
                )
            )
            checks.append((f"worker {w} counts", worker.connector_counts(), ref.worker_counts[w]))
        for what, got, says in checks:
            if got != says:
                raise Mismatch(self.path, f"{what}: the adapter has {got}, the rule {says}")

    def key(self) -> tuple[Any, ...]:
        return (self.world.key(), self.ref.key())


# -- the enumeration -----------------------------------------------------------------------------


def enabled(ref: Reference, event: Event) -> bool:
    """vLLM asks no matched tokens for a request id it still holds."""
    return not (isinstance(event, Arrive) and event.request_id in ref.held)


@dataclass
class Explored:
    states: int = 0
    expansions: int = 0
    #: Fresh worlds built to replay a sequence.
    worlds: int = 0
    sequences: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)
    #: With ``collect``: the sequences whose last event is the first to mismatch.
    failing: int = 0
    #: The report outcomes met, by where they were counted ("scheduler" or "worker") and name.
    met: set[tuple[str, str, Outcome]] = field(default_factory=set)
    #: How many frees were seen: at request_finished, and in a step's finished_sending.
    frees: dict[str, int] = field(default_factory=lambda: {"finish": 0, "step": 0})


def explore(
    setup: Setup, depth: int, *, collect: bool = False, world: type[World] = World
) -> Explored:
    """Every sequence of up to ``depth`` events of ``setup.alphabet``, each joint state expanded
    once, at the least depth that reaches it. A mismatch raises, or with ``collect`` is kept
    (its sequence then expands no further).

    A joint state is expanded on fresh worlds that replay the sequence that first reached it,
    but for two shortcuts, each a world already in that state: the world that first reached it,
    and a world that an event left in the state it was in (a report that is only counted, an
    empty step). Either has then run a longer sequence than the one replayed, to the same
    state: what it runs next is compared the same way.
    """
    found = Explored()
    start = Pair(setup, world)
    start.compare()
    ids: dict[Any, int] = {start.key(): 0}
    moves: dict[int, list[int]] = {}
    failed: list[int] = []  # per mismatch, the state it was met in
    frontier: list[tuple[int, tuple[Event, ...], Pair | None]] = [(0, (), start)]
    for level in range(depth):
        last = level == depth - 1
        following: list[tuple[int, tuple[Event, ...], Pair | None]] = []
        for state, path, stored in frontier:
            ready = stored
            targets = moves.setdefault(state, [])
            for event in setup.alphabet:
                if ready is None:
                    current = Pair(setup, world)
                    found.worlds += 1
                    for earlier in path:
                        current.apply(earlier, check=False)
                else:
                    current, ready = ready, None
                if not enabled(current.ref, event):
                    ready = current
                    continue
                found.expansions += 1
                try:
                    current.apply(event)
                except Mismatch as mismatch:
                    shortest = _replayed(setup, (*path, event), world) or mismatch
                    if not collect:
                        raise shortest from mismatch
                    found.mismatches.append(shortest)
                    failed.append(state)
                    continue
                _seen(found, current)
                key = current.key()
                target = ids.get(key)
                if target is None:
                    target = ids[key] = len(ids)
                    following.append((target, (*path, event), None if last else current))
                elif target == state:
                    ready = current
                targets.append(target)
        frontier = following
    found.states = len(ids)
    found.sequences, found.failing = sequences(moves, depth, failed)
    return found


def _replayed(setup: Setup, path: tuple[Event, ...], world: type[World]) -> Mismatch | None:
    """The mismatch of ``path`` (the shortest sequence to the state a mismatch was met in, and
    its event) on a fresh world: what a reader wants to see, rather than the longer sequence a
    reused world ran."""
    pair = Pair(setup, world)
    for earlier in path[:-1]:
        pair.apply(earlier, check=False)
    try:
        pair.apply(path[-1])
    except Mismatch as mismatch:
        return mismatch
    return None


def _seen(found: Explored, pair: Pair) -> None:
    ref = pair.ref
    for name, per in ref.scheduler_counts.items():
        found.met.update(("scheduler", name, outcome) for outcome in per)
    for counts in ref.worker_counts:
        for name, per in counts.items():
            found.met.update(("worker", name, outcome) for outcome in per)
    if pair.freed:
        found.frees["finish" if isinstance(pair.path[-1], Finish) else "step"] += 1


def sequences(
    moves: Mapping[int, list[int]], depth: int, failed: Sequence[int] = ()
) -> tuple[int, int]:
    """How many sequences of 1 to ``depth`` enabled events the transitions cover (from state 0),
    and how many more end in a mismatch (one per state in ``failed`` per mismatch there)."""
    paths = {0: 1}
    total = failing = 0
    for _ in range(depth):
        failing += sum(paths.get(state, 0) for state in failed)
        following: dict[int, int] = {}
        for state, n in paths.items():
            for target in moves.get(state, ()):
                following[target] = following.get(target, 0) + n
        paths = following
        total += sum(paths.values())
    return total, failing

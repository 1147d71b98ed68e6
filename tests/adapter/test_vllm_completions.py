"""One completion per request, and children that report on fewer workers, under vLLM's real
``Scheduler`` (and its ``KVOutputAggregator`` for two workers); the adapter's books against the
core's report rule on every order of a bounded alphabet of reports.

vLLM 0.33 frees a finished request's blocks on its first completion, "finished recving" or
"finished sending", and asserts the request is still there on any later one. A request aborted
while its load is in flight, that children answer with saves, must reach vLLM's scheduler as
exactly one completion, after the load and every saver reported, in whatever order and steps
those reports (and a phantom and a duplicate) come.
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import itertools  # noqa: E402
import pickle  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_children import Script, child, script  # noqa: E402
from vllm_harness import Engine, make_config, make_connector, make_request, runner_output  # noqa: E402

import multiconnector.vllm.counted as counted_module  # noqa: E402
from multiconnector import ConnectorRegistry, MultiConnector, Outcome  # noqa: E402
from multiconnector.rule import COUNTER_LIMIT, OTHER_NAMES  # noqa: E402
from multiconnector.vllm import NamedMultiConnectorMetadata  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]

#: The reports of one scenario: the load's (L), each saver's (S1, S2), a phantom (P: a child
#: that saves nothing reports sending); S1's duplicate follows S1's report by one step.
REPORTS = ("L", "S1", "S2", "P")


def groupings(order: tuple[str, ...]) -> Iterator[list[list[str]]]:
    """Every way of cutting ``order`` into consecutive steps."""
    for cuts in itertools.product((False, True), repeat=len(order) - 1):
        steps: list[list[str]] = [[order[0]]]
        for cut, report in zip(cuts, order[1:], strict=True):
            if cut:
                steps.append([report])
            else:
                steps[-1].append(report)
        yield steps


def with_duplicate(steps: list[list[str]]) -> list[list[str]]:
    """``steps`` with S1 reporting again one step after its first report."""
    steps = [list(step) for step in steps] + [[]]
    first = next(i for i, step in enumerate(steps) if "S1" in step)
    steps[first + 1].append("S1")
    return steps


SCENARIOS = [
    with_duplicate(steps) for order in itertools.permutations(REPORTS) for steps in groupings(order)
]


class CoreChild:
    """A child as the core aggregator sees it: L has 32 tokens to load, S1 and S2 save."""

    def __init__(self, tokens: int, saves: bool) -> None:
        self.tokens, self.saves = tokens, saves

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int:
        return self.tokens

    def request_finished(self, request_id: str, blocks: Any) -> tuple[bool, None]:
        return self.saves, None


def core_release_step(steps: list[list[str]]) -> int:
    """The step at which the core's rule (the aggregator ``multiconnector check`` explores)
    lets go of a request finished while L loads it and S1, S2 save it, for these reports."""
    core = MultiConnector(
        ConnectorRegistry(
            {
                "L": CoreChild(32, saves=False),
                "S1": CoreChild(0, saves=True),
                "S2": CoreChild(0, saves=True),
                "P": CoreChild(0, saves=False),
            }
        )
    )
    core.begin("r")
    assert core.match_tokens("r", 0) == 32
    core.request_finished("r", [1, 2, 3])
    for number, step in enumerate(steps):
        for report in step:
            if report == "L":
                core.load_finished("r", "L")
            else:
                core.transfer_finished("r", report)
        if [record.request_id for record in core.take()] == ["r"]:
            return number
    raise AssertionError(f"the core never lets go of the request: {steps}")


class Frees:
    """vLLM's block pool's ``free_blocks``, wrapped: every block id it frees, in order."""

    def __init__(self, engine: Engine) -> None:
        pool = engine.scheduler.kv_cache_manager.block_pool
        self.freed: list[int] = []
        real = pool.free_blocks

        def free_blocks(blocks: Any) -> None:
            blocks = list(blocks)
            self.freed.extend(block.block_id for block in blocks)
            real(blocks)

        pool.free_blocks = free_blocks


def test_one_completion_per_request_in_every_order_of_its_reports(model: Path) -> None:
    load, s1, s2, phantom = (
        script(tokens=32, load_async=True),
        script(saves=True),
        script(saves=True),
        script(),
    )
    scripts: dict[str, Script] = {"L": load, "S1": s1, "S2": s2, "P": phantom}
    sends = {"L": load.recving, "S1": s1.sending, "S2": s2.sending, "P": phantom.sending}
    engine = Engine(make_config(model, [child(n, s) for n, s in scripts.items()]))
    frees = Frees(engine)
    assert len(SCENARIOS) == 24 * 8
    for number, steps in enumerate(SCENARIOS):
        request_id = f"r{number}"
        engine.add(make_request(request_id, num_tokens=40, max_tokens=4))
        engine.step()  # L's asynchronous load starts
        status = engine.scheduler.requests[request_id].status
        assert status is RequestStatus.WAITING_FOR_REMOTE_KVS, steps
        (blocks,) = engine.scheduler.kv_cache_manager.get_block_ids(request_id)
        engine.scheduler.finish_requests(request_id, RequestStatus.FINISHED_ABORTED)
        assert engine.connector.saving[request_id] == ("S1", "S2")
        owed = {"L", "S1", "S2"}
        frees_of_it = 0
        freed_at = -1
        for at, step in enumerate(steps):
            for report in step:
                sends[report].add(request_id)
            before = len(frees.freed)
            owed -= set(step)
            engine.step()  # vLLM asserts if a second completion reaches it
            freed_now = set(frees.freed[before:])
            if owed:  # the load or a saver still uses the blocks
                assert engine.held(request_id), (steps, step)
                assert not set(blocks) & freed_now, (steps, step)
            else:  # freed in the step the last of them reported, and never again
                assert not engine.held(request_id), (steps, step)
                if set(blocks) <= freed_now:
                    frees_of_it += 1
                    freed_at = at
        assert frees_of_it == 1, steps
        # The adapter's lighter books (a worker's ledger and hold-back, the scheduler's hand-off)
        # free it in the very step the core's report rule lets go of it.
        assert freed_at == core_release_step(steps), steps
        # Late reports of every kind change nothing (and crash nothing).
        for report in ("L", "S1", "S2"):
            sends[report].add(request_id)
        engine.step()
        assert not engine.held(request_id)
        assert request_id not in engine.connector.saving
        assert request_id not in engine.connector.tracker
        assert request_id not in engine.worker.load_tracker
        assert request_id not in engine.worker.ledger
    counts = engine.worker.connector_counts()
    # P's report: a phantom while the request awaits its savers, unknown once it is gone.
    assert Outcome.applied not in counts["P"]
    assert sum(counts["P"].values()) == len(SCENARIOS)
    assert counts["P"][Outcome.phantom] >= 1
    assert counts["S1"][Outcome.duplicate] >= 1
    assert engine.worker._worker.sent_while_loading == set()


# -- children that report on fewer workers than all ----------------------------------------------


def two_workers(model: Path, **scripts: Script) -> tuple[Engine, list[Any], KVOutputAggregator]:
    config = make_config(model, [child(n, s) for n, s in scripts.items()])
    config.parallel_config.world_size = 2  # two workers (vLLM's tensor parallel size 2)
    engine = Engine(config, worker=False)
    workers = [make_connector(config, KVConnectorRole.WORKER) for _ in range(2)]
    # As vLLM's engine core builds it: from the scheduler's connector and the world size.
    aggregator = KVOutputAggregator.from_connector(engine.connector, 2)
    return engine, workers, aggregator


def run(
    engine: Engine,
    workers: list[Any],
    aggregator: KVOutputAggregator,
    *,
    scripts: dict[str, Script],
    plan: list[tuple[set[str], set[str]]],
    request_id: str = "r1",
) -> list[bool]:
    """Per step, per worker, the names reporting ``request_id`` finished sending there; whether
    vLLM still holds the request after each step."""
    held = []
    for per_worker in plan:
        output = engine.scheduler.schedule()
        outputs = []
        for worker, reporting in zip(workers, per_worker, strict=True):
            shipped = pickle.loads(pickle.dumps(output))
            worker.bind_connector_metadata(shipped.kv_connector_metadata)
            for name in reporting:
                scripts[name].sending.add(request_id)
            results = worker.get_transfer_results(shipped.finished_req_ids)
            kv_output = KVConnectorOutput(
                finished_sending=results.finished_sending or None,
                finished_recving=results.finished_recving or None,
                kv_connector_worker_meta=worker.build_connector_worker_meta(),
            )
            worker.clear_connector_metadata()
            outputs.append(runner_output(output, kv_output))
        engine.scheduler.update_from_output(output, aggregator.aggregate(outputs))
        held.append(engine.held(request_id))
    return held


PLANS = {
    # The child reporting on one worker (h) reports first, then a (on every worker).
    "h first": ([(set(), set()), ({"h"}, set()), ({"a"}, set()), (set(), {"a"})], 3),
    # a on every worker first: vLLM's aggregator has every worker's report; h's still owed.
    "a first": ([(set(), set()), ({"a"}, {"a"}), (set(), set()), ({"h"}, set())], 3),
    # All in one step, and h's report on the other worker too (more than its count: ignored).
    "one step": ([(set(), set()), ({"a", "h"}, {"a", "h"}), (set(), set())], 1),
}


@pytest.mark.parametrize("plan", list(PLANS), ids=list(PLANS))
def test_a_child_reporting_on_one_worker_is_counted_once_there(model: Path, plan: str) -> None:
    a, h = script(saves=True), script(saves=True, finished_count=1)
    engine, workers, aggregator = two_workers(model, a=a, h=h)
    assert engine.connector.get_finished_count() is None
    engine.add(make_request("r1", max_tokens=1))
    steps, freed_at = PLANS[plan]
    held = run(engine, workers, aggregator, scripts={"a": a, "h": h}, plan=steps)
    # Held until every child's reporting workers reported, then freed, and not stranded.
    assert held == [True] * freed_at + [False] * (len(steps) - freed_at)
    assert engine.connector.saving == {}
    assert [len(w.ledger) for w in workers] == [0, 0]
    assert engine.connector._scheduler.counted_owed == {}
    assert aggregator._send_remaining_count == {}
    assert workers[0].finished_counts == {"h": 1}


def test_children_all_reporting_on_one_worker_strand_nothing(model: Path) -> None:
    # Both children say 1: vLLM's aggregator would count 1 report; the other worker's ledger
    # would hold the request forever. Here neither worker holds it.
    a, h = script(saves=True, finished_count=1), script(saves=True, finished_count=1)
    engine, workers, aggregator = two_workers(model, a=a, h=h)
    engine.add(make_request("r1", max_tokens=1))
    held = run(
        engine,
        workers,
        aggregator,
        scripts={"a": a, "h": h},
        plan=[(set(), set()), ({"a"}, set()), ({"h"}, set())],
    )
    assert held == [True, True, False]
    assert [len(w.ledger) for w in workers] == [0, 0]
    assert engine.connector.saving == {}


def test_a_worker_a_counted_child_never_reports_on_forgets_its_oldest_requests(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(counted_module, "COUNTED_EXPECTED_LIMIT", 2)
    a, h = script(saves=True), script(saves=True, finished_count=1)
    _, workers, _ = two_workers(model, a=a, h=h)
    other = workers[1]  # h never reports here
    for number in range(5):
        shipped = NamedMultiConnectorMetadata(
            {name: None for name in other.children}, savers={f"r{number}": ("a", "h")}
        )
        other.bind_connector_metadata(shipped)
    assert list(other._worker.counted.expected) == ["r3", "r4"]


def test_a_workers_ignored_counted_reports_are_counted_in_a_capped_table(model: Path) -> None:
    # The worker's table of ignored counted reports is counted by the core's one capped counter
    # (multiconnector.rule.count): past COUNTER_LIMIT distinct names, the others share one key.
    a, h = script(saves=True), script(saves=True, finished_count=1)
    _, workers, _ = two_workers(model, a=a, h=h)
    worker = workers[0]
    extra = 100
    for number in range(COUNTER_LIMIT + extra):
        worker._worker.counted.saved(f"made-up-{number}", ["never-finished"])
    assert len(worker._worker.counted_outcomes) <= COUNTER_LIMIT + 1
    counts = worker.connector_counts()
    assert counts[OTHER_NAMES] == {Outcome.unknown_request: extra}
    assert sum(n for per in counts.values() for n in per.values()) == COUNTER_LIMIT + extra

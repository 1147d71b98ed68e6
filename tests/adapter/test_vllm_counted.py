"""Counted children (``get_finished_count()``) under vLLM's real ``Scheduler`` and its
``KVOutputAggregator``, several workers (``multiconnector/vllm/counted.py``).

A child whose count equals the number of workers reports on every worker, as a child answering
``None``: it is an ordinary child (it may take part in a split load, and its failures are handled
as any child's), so every observable of a run is the same as with ``None``. A child whose count
is 2 or more (of 3 workers) is awaited on that many workers: one worker's report, or one
worker's report twice, never releases the request.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from vllm_support import require_vllm

require_vllm()
pytestmark = pytest.mark.vllm

from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_children import Script, child, script  # noqa: E402
from vllm_harness import (  # noqa: E402
    Engine,
    make_config,
    make_connector,
    make_request,
    runner_output,
)

from multiconnector.vllm import SPLIT_KEY  # noqa: E402

PROMPT = 40
RANGE = "RangeConnector"


class Workers:
    """vLLM's scheduler over ``n`` worker connectors, their outputs aggregated as vLLM's engine
    core does (``KVOutputAggregator.from_connector``)."""

    def __init__(self, model: Path, n: int, children: list[dict[str, Any]], **extra: Any) -> None:
        config = make_config(model, children, extra=extra)
        config.parallel_config.world_size = n
        assert config.kv_transfer_config is not None
        config.kv_transfer_config.kv_load_failure_policy = "recompute"
        self.engine = Engine(config, worker=False)
        self.workers = [make_connector(config, KVConnectorRole.WORKER) for _ in range(n)]
        self.aggregator = KVOutputAggregator.from_connector(self.engine.connector, n)
        self.scheduled: list[dict[str, int]] = []
        self.sent_to_vllm: list[set[str]] = []

    def step(self, reports: dict[int, list[tuple[Script, str]]] | None = None) -> None:
        """One step; ``reports[rank]``: (script, what) reported on worker ``rank``, ``what``
        one of ``sent``, ``loaded``, ``failed`` (a load that failed), of request ``r``."""
        scheduler = self.engine.scheduler
        output = scheduler.schedule()
        self.scheduled.append(dict(output.num_scheduled_tokens))
        outputs = []
        for rank, worker in enumerate(self.workers):
            shipped = pickle.loads(pickle.dumps(output))
            worker.bind_connector_metadata(shipped.kv_connector_metadata)
            worker.start_load_kv(None)
            worker.wait_for_save()
            for made, what in (reports or {}).get(rank, ()):
                {"sent": made.sending, "loaded": made.recving, "failed": made.failed}[what].add("r")
                if what == "failed":
                    made.recving.add("r")
            results = worker.get_transfer_results(shipped.finished_req_ids)
            kv_output = KVConnectorOutput(
                finished_sending=results.finished_sending or None,
                finished_recving=results.finished_recving or None,
                failed_recving=results.failed_recving,
                invalid_block_ids=worker.get_block_ids_with_load_errors(),
                kv_connector_worker_meta=worker.build_connector_worker_meta(),
            )
            worker.clear_connector_metadata()
            outputs.append(runner_output(output, kv_output))
        aggregated = self.aggregator.aggregate(outputs)
        scheduler.update_from_output(output, aggregated)
        self.sent_to_vllm.append(set(aggregated.kv_connector_output.finished_sending or ()))

    def observed(self) -> tuple[Any, ...]:
        """What a run shows of the connector: the tokens scheduled, what reached vLLM as
        finished sending, the per-child hits and failures, what the books still hold."""
        connector = self.engine.connector
        return (
            self.scheduled,
            self.sent_to_vllm,
            connector.child_hits(),
            sorted(connector.child_failures().items()),
            len(connector.tracker),
        )


def _split_run(model: Path, count: int | None, fail_fast: bool) -> tuple[Workers, Script]:
    """A split asynchronous load by ``fast`` (the first 16 tokens, counted on ``count``
    workers) and ``slow`` (the next 16), on 2 workers; ``fast``'s part fails when
    ``fail_fast``, on every worker."""
    fast = script(holds=16, load_async=True, finished_count=count)
    slow = script(holds=32, load_async=True)
    world = Workers(
        model, 2, [child("fast", fast, RANGE), child("slow", slow, RANGE)], **{SPLIT_KEY: True}
    )
    request = world.engine.add(make_request("r", num_tokens=PROMPT, max_tokens=2))
    world.step()
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    fast_report = "failed" if fail_fast else "loaded"
    world.step({rank: [(fast, fast_report), (slow, "loaded")] for rank in range(2)})
    for _ in range(4):
        world.step()
    return world, fast


@pytest.mark.parametrize("fail_fast", [False, True], ids=["loaded", "fast-part-failed"])
def test_a_child_counted_on_every_worker_is_an_ordinary_child(model: Path, fail_fast: bool) -> None:
    ordinary, _ = _split_run(model, None, fail_fast)
    counted, fast = _split_run(model, 2, fail_fast)
    # Not counted: no report names of its own on the scheduler's books, none forwarded.
    assert counted.engine.connector.finished_counts == {}
    assert counted.engine.connector._sched.counted.ranks == {}
    # It took part in the split load (told its range), and the run is the same as with None.
    assert [c[2:] for c in fast.names("update_state_after_alloc_range")] == [(0, 16)]
    assert counted.observed() == ordinary.observed()
    # Its part completed, or failed and was counted as its failed load, as any child's.
    hits = counted.engine.connector.child_hits()["fast"]
    assert hits.get("loads_failed", 0) == (1 if fail_fast else 0)
    assert hits.get("loads_completed", 0) == (0 if fail_fast else 1)


def test_a_child_counted_on_two_workers_of_three_never_releases_a_save_early(
    model: Path,
) -> None:
    h = script(saves=True, finished_count=2)
    world = Workers(model, 3, [child("h", h)])
    assert world.engine.connector.finished_counts == {"h": 2}
    world.engine.add(make_request("r", num_tokens=PROMPT, max_tokens=1))
    world.step()  # prefill; r finishes, h saves it
    world.step()
    assert world.engine.held("r")
    world.step({0: [(h, "sent")]})  # one worker of the two
    assert world.engine.held("r") and "r" not in set().union(*world.sent_to_vllm)
    world.step({0: [(h, "sent")]})  # the same worker again: a duplicate there
    assert world.engine.held("r") and "r" not in set().union(*world.sent_to_vllm)
    world.step({2: [(h, "sent")]})  # the second worker: released in this step
    assert not world.engine.held("r")
    assert world.sent_to_vllm[-1] == {"r"}
    assert len(world.engine.connector.tracker) == 0


def test_a_child_counted_on_two_workers_of_three_never_releases_a_load_early(
    model: Path,
) -> None:
    h = script(tokens=16, load_async=True, finished_count=2)
    world = Workers(model, 3, [child("h", h), child("b", script())])
    request = world.engine.add(make_request("r", num_tokens=PROMPT, max_tokens=2))
    world.step()
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    world.step({1: [(h, "loaded")]})
    world.step({1: [(h, "loaded")]})  # the same worker again: a duplicate there
    world.step()
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    assert all("r" not in step for step in world.scheduled)
    world.step({0: [(h, "loaded")]})  # the second worker: the load completes
    world.step()
    assert request.status is not RequestStatus.WAITING_FOR_REMOTE_KVS
    assert any(step.get("r") == PROMPT - 16 for step in world.scheduled)

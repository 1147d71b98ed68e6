"""A counted loader's failed load, under vLLM's real ``Scheduler`` and its
``KVOutputAggregator``, two workers.

A child whose ``get_finished_count()`` is 1 (it reports on one worker of two) is chosen to load
a request asynchronously, and its one report says the load failed (``failed_recving``). vLLM
must see that failure: under ``kv_load_failure_policy: recompute`` it recomputes the whole
prompt, under ``fail`` it fails that request alone. A child that reports on every worker
(the control) gets exactly that.
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
from vllm.v1.engine import FinishReason  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm_children import child, script  # noqa: E402
from vllm_harness import (  # noqa: E402
    BLOCK,
    Engine,
    make_config,
    make_connector,
    make_request,
    runner_output,
)

PROMPT = 40


class TwoWorkers:
    """vLLM's scheduler over two worker connectors, their outputs aggregated as vLLM's engine
    core does (``KVOutputAggregator.from_connector``)."""

    def __init__(self, model: Path, policy: str, **scripts: Any) -> None:
        config = make_config(model, [child(n, s) for n, s in scripts.items()])
        config.parallel_config.world_size = 2
        config.kv_transfer_config.kv_load_failure_policy = policy
        self.engine = Engine(config, worker=False)
        self.workers = [make_connector(config, KVConnectorRole.WORKER) for _ in range(2)]
        self.aggregator = KVOutputAggregator.from_connector(self.engine.connector, 2)
        self.scheduled: list[dict[str, int]] = []
        self.outputs: dict[str, Any] = {}

    def step(self, before_worker: Any = None) -> None:
        """One step; ``before_worker(rank)`` runs before each worker's get_transfer_results."""
        scheduler = self.engine.scheduler
        output = scheduler.schedule()
        self.scheduled.append(dict(output.num_scheduled_tokens))
        outputs = []
        for rank, worker in enumerate(self.workers):
            shipped = pickle.loads(pickle.dumps(output))
            worker.bind_connector_metadata(shipped.kv_connector_metadata)
            worker.start_load_kv(None)
            worker.wait_for_save()
            if before_worker is not None:
                before_worker(rank)
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
        engine_outputs = scheduler.update_from_output(output, self.aggregator.aggregate(outputs))
        for per_client in engine_outputs.values():
            for out in per_client.outputs:
                if out.finish_reason is not None:
                    self.outputs[out.request_id] = out

    def computed_for(self, request_id: str) -> int:
        return sum(step.get(request_id, 0) for step in self.scheduled)


@pytest.mark.parametrize("policy", ["recompute", "fail"])
@pytest.mark.parametrize("count", [None, 1], ids=["every-worker", "counted-on-one"])
def test_a_loaders_failed_load_reaches_vllm_as_a_failure(
    model: Path, count: int | None, policy: str
) -> None:
    c = script(tokens=2 * BLOCK, load_async=True, finished_count=count)
    world = TwoWorkers(model, policy, c=c, b=script())
    world.engine.add(make_request("r1", num_tokens=PROMPT, max_tokens=1))
    world.step()  # c chosen to load r1 asynchronously; the workers learn it
    assert world.engine.connector.tracker.peek("r1") is not None
    reporting = range(2) if count is None else range(count)

    def fail_the_load(rank: int) -> None:
        # c's worker(s) report the load finished, and failed (as NIXL reports a failed read).
        if rank in reporting:
            c.recving.add("r1")
            c.failed.add("r1")

    world.step(fail_the_load)
    for _ in range(10):
        if "r1" in world.outputs:
            break
        world.step()
    assert "r1" in world.outputs
    if policy == "recompute":
        # vLLM recomputed the tokens the failed load was to fill: the whole prompt. With the
        # counted loader vLLM took the failed load as loaded, and computed only the last
        # PROMPT - 2 * BLOCK tokens, over blocks nothing wrote (and cached them).
        assert world.computed_for("r1") == PROMPT
        # The failed loader is not asked again for r1 (Lookups.failed, by _mark_failed).
        assert len([call for call in c.names("get_num_new_matched_tokens") if call[1] == "r1"]) == 1
        assert world.outputs["r1"].finish_reason == FinishReason.LENGTH
    else:
        # vLLM's default policy fails that request alone.
        assert world.outputs["r1"].finish_reason == FinishReason.ERROR
    assert world.engine.connector.child_hits()["c"].get("loads_failed") == 1

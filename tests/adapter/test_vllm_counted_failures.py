"""A counted loader's failed load, under vLLM's real ``Scheduler`` and its
``KVOutputAggregator``, two workers.

A child whose ``get_finished_count()`` is 1 (it reports on one worker of two) is chosen to load
a request asynchronously, and its one report says the load failed (``failed_recving``). vLLM
must see that failure: under ``kv_load_failure_policy: recompute`` it recomputes the whole
prompt, under ``fail`` it fails that request alone. A child that reports on every worker
(the control) gets exactly that.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_support import require_vllm

require_vllm()
pytestmark = pytest.mark.vllm

from vllm.v1.engine import FinishReason  # noqa: E402
from vllm_children import child, script  # noqa: E402
from vllm_harness import BLOCK, Workers, make_request  # noqa: E402

PROMPT = 40


@pytest.mark.parametrize("policy", ["recompute", "fail"])
@pytest.mark.parametrize("count", [None, 1], ids=["every-worker", "counted-on-one"])
def test_a_loaders_failed_load_reaches_vllm_as_a_failure(
    model: Path, count: int | None, policy: str
) -> None:
    c = script(tokens=2 * BLOCK, load_async=True, finished_count=count)
    world = Workers(model, 2, [child("c", c), child("b", script())], policy=policy)
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

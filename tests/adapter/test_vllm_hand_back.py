"""The scheduler part drains the core books' hand-back queue in one place, under vLLM's real
``Scheduler`` (``Reported.take``).

Both ``update_connector_output`` and ``request_finished`` drain it (a request finished without
saves is handed back at once). vLLM applies the workers' reports in ``update_connector_output``
and drains right after, so under vLLM's order of calls a record with saves is always taken
there; a record with saves that another call settled (a later vLLM, or a report applied
between the two) must still reach vLLM as finished sending, never be dropped by the other
drain: vLLM would hold its blocks forever.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from vllm_support import require_vllm

require_vllm()
pytestmark = pytest.mark.vllm

from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_children import child, script  # noqa: E402
from vllm_harness import Engine, make_config, make_request  # noqa: E402

from multiconnector.vllm.counted import WORKERS  # noqa: E402


def test_a_save_settled_outside_update_connector_output_still_reaches_vllm(model: Path) -> None:
    a = script(saves=True)
    engine = Engine(make_config(model, [child("a", a)]))
    engine.add(make_request("r1", num_tokens=8, max_tokens=1))
    engine.step()  # r1 runs and finishes: a saves it, vLLM holds its blocks
    assert engine.held("r1")
    tracker = engine.connector.tracker
    assert tracker.peek("r1") is not None
    # The workers' confirmation applied outside update_connector_output (the order vLLM's
    # calls make today never does this): r1 owes nothing now, and is in the queue.
    tracker.transfer_finished("r1", WORKERS)
    # r2 finishes without saves: request_finished drains the queue, r1 with it.
    a.saves = False
    engine.add(make_request("r2", num_tokens=8, max_tokens=4))
    engine.scheduler.finish_requests("r2", RequestStatus.FINISHED_ABORTED)
    assert not engine.held("r2")
    assert "r1" not in tracker  # taken by request_finished's drain
    engine.step()  # update_connector_output: r1 reaches vLLM as finished sending
    assert not engine.held("r1")
    assert len(tracker) == 0 and engine.connector.saving == {}

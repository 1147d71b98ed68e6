"""The order vLLM 0.33 gives the adapter: no child's report before its answer is recorded.

The adapter needs no early-report books of its own (docs/vllm.md, "A report before its
answer") because vLLM calls it in an order where a child cannot report a load or a save before
the adapter recorded that child's answer. These tests pin that order in vLLM's own source, so
that a vLLM upgrade that changes it fails here, not in production:

* the scheduler asks ``get_num_new_matched_tokens`` and then ``update_state_after_alloc``
  within ``schedule()``; reports come only through ``update_from_output``, on the same
  engine-core thread, after ``schedule()`` returned;
* in ``update_from_output``, requests that stop in the step are freed (``_free_request``: the
  connector's ``request_finished``) before the step's transfer reports are applied
  (``_update_from_kv_xfer_finished``, which hands ``update_connector_output`` the reports);
* a worker binds the step's connector metadata (where the adapter records the loaders and
  savers, before it binds its children's) before it starts loads and asks for finished
  transfers.
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import inspect  # noqa: E402

from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.worker import kv_connector_model_runner_mixin as mixin  # noqa: E402

from multiconnector.vllm.worker import WorkerPart  # noqa: E402


def _in_order(source: str, *needles: str) -> list[int]:
    """The offsets of ``needles`` in ``source``: each present, in the order given."""
    offsets = [source.find(needle) for needle in needles]
    assert all(o >= 0 for o in offsets), dict(zip(needles, offsets, strict=True))
    assert offsets == sorted(offsets), dict(zip(needles, offsets, strict=True))
    return offsets


def test_the_scheduler_records_the_load_answer_before_any_report_can_come() -> None:
    schedule = inspect.getsource(Scheduler.schedule)
    _in_order(
        schedule,
        "self.connector.get_num_new_matched_tokens(",
        "self.connector.update_state_after_alloc(",
    )
    # Reports reach the connector only from update_from_output, never from schedule().
    assert "update_connector_output" not in schedule
    assert "_update_from_kv_xfer_finished" not in schedule


def test_a_request_finishing_in_a_step_is_finished_before_the_steps_reports() -> None:
    update = inspect.getsource(Scheduler.update_from_output)
    _in_order(update, "self._free_request(request)", "self._update_from_kv_xfer_finished(")
    free = inspect.getsource(Scheduler._free_request)
    assert "self._connector_finished(request)" in free
    finished = inspect.getsource(Scheduler._connector_finished)
    assert "self.connector.request_finished(" in finished
    xfer = inspect.getsource(Scheduler._update_from_kv_xfer_finished)
    _in_order(
        xfer,
        "self.connector.update_connector_output(kv_connector_output)",
        "kv_connector_output.finished_recving",
        "kv_connector_output.finished_sending",
    )


def test_a_worker_binds_the_metadata_before_it_loads_or_asks_for_finished_transfers() -> None:
    source = inspect.getsource(mixin)
    _in_order(
        source,
        "kv_connector.bind_connector_metadata(scheduler_output.kv_connector_metadata)",
        "kv_connector.start_load_kv(get_forward_context())",
        "kv_connector.get_transfer_results(",
    )
    # The adapter records the loads and savers of the metadata before binding its children's:
    # a child learns of a load or save only from its own part, bound after.
    bind = inspect.getsource(WorkerPart.bind_connector_metadata)
    _in_order(
        bind,
        "self.ledger.expect(metadata.savers)",
        "loads.choose_loader(request_id, name)",
        "child.bind_connector_metadata(children[name])",
    )

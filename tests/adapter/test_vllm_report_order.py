"""The order vLLM gives the adapter: no child's report before its answer is recorded.

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
import pickle  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import vllm  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm_children import child, script  # noqa: E402
from vllm_harness import (  # noqa: E402
    BLOCK,
    Engine,
    make_config,
    make_connector,
    make_request,
    make_scheduler,
    runner_output,
)

from multiconnector.vllm.worker import WorkerPart  # noqa: E402

pytestmark = pytest.mark.vllm


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


def _record(log: list[tuple[str, ...]], who: str, target: Any, names: tuple[str, ...]) -> None:
    """Wrap ``target``'s methods ``names`` (on the instance) to log ``(who, name)`` first."""
    for name in names:
        method = getattr(target, name)

        def logged(*args: Any, _name: str = name, _method: Any = method, **kwargs: Any) -> Any:
            log.append((who, _name))
            return _method(*args, **kwargs)

        setattr(target, name, logged)


HOOKS = (
    "handle_preemptions",
    "bind_connector_metadata",
    "start_load_kv",
    "wait_for_save",
    "get_transfer_results",
    "clear_connector_metadata",
)


def _drive(model: Path, step: Callable[[Any, Any], Any]) -> tuple[list[tuple[str, ...]], Any]:
    """Two scheduler steps of a request that child "a" loads asynchronously and child "b"
    saves, the worker side run by ``step(ours, shipped)`` (vLLM's runner-side hooks), which
    returns the step's connector output. The calls logged, and what the adapter knew of the
    request each time a child was bound."""
    loader, saver = script(tokens=BLOCK, load_async=True), script(saves=True)
    config = make_config(model, [child("a", loader), child("b", saver)])
    scheduler = make_scheduler(config)
    ours = make_connector(config, KVConnectorRole.WORKER)
    log: list[tuple[str, ...]] = []
    _record(log, "ours", ours, HOOKS)
    part = ours._worker

    for name, made in (("a", loader), ("b", saver)):
        (instance,) = [i for i in made.instances if i.role == KVConnectorRole.WORKER]
        bind = instance.bind_connector_metadata

        def bound(metadata: Any, _name: str = name, _bind: Any = bind) -> None:
            log.append(
                (f"child {_name}", "bind_connector_metadata", "r" in part.loads, "r" in part.ledger)
            )
            _bind(metadata)

        instance.bind_connector_metadata = bound
    scheduler.add_request(make_request("r", num_tokens=3 * BLOCK, max_tokens=1))
    for number in range(4):
        output = scheduler.schedule()
        shipped = pickle.loads(pickle.dumps(output))  # how workers receive it
        log.append(("step",))
        kv_output = step(ours, shipped)
        if number == 0:
            loader.recving.add("r")  # the load completes on the next step's report
        if number == 2:
            saver.sending.add("r")
        scheduler.update_from_output(output, runner_output(output, kv_output))
    return log, scheduler


def _steps(log: list[tuple[str, ...]]) -> list[list[tuple[str, ...]]]:
    steps: list[list[tuple[str, ...]]] = []
    for entry in log:
        if entry == ("step",):
            steps.append([])
        else:
            steps[-1].append(entry)
    return steps


def _check_order(log: list[tuple[str, ...]], scheduler: Any) -> None:
    steps = _steps(log)
    for calls in steps:
        ours = [name for who, name, *_ in calls if who == "ours"]
        # Each step: the metadata bound before loads start and before any report is asked,
        # cleared last.
        assert ours.index("bind_connector_metadata") < ours.index("start_load_kv"), ours
        assert ours.index("start_load_kv") < ours.index("get_transfer_results"), ours
        assert ours[-1] == "clear_connector_metadata", ours
        # The children are bound within the adapter's bind.
        first = calls.index(("ours", "bind_connector_metadata"))
        kids = [i for i, call in enumerate(calls) if call[0].startswith("child ")]
        assert len(kids) == 2 and all(
            first < i < calls.index(("ours", "start_load_kv")) for i in kids
        )
    # Step 1 carries the load of "r": the adapter knew it before binding any child. A later
    # step (after "r" finished) carries its save: at that step's first child bind the adapter's
    # ledger awaited it already, where at the step before it did not.
    kids = [[c for c in calls if c[0].startswith("child ")] for calls in steps]
    assert [c[2] for c in kids[0]] == [True, True]
    awaited = [all(c[3] for c in bound) for bound in kids]
    assert any(c[3] for c in kids[0]) is False
    saved = awaited.index(True)
    assert [c[3] for c in kids[saved]] == [True, True]
    assert not any(c[3] for c in kids[saved - 1])
    assert "r" not in scheduler.requests  # loaded, run, saved and freed: the steps were real


def _active(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any, Any], Any]:
    """A step through ``ActiveKVConnector``: pre_forward, finish_forward, post_forward."""
    from vllm.distributed.kv_transfer import kv_transfer_state  # noqa: PLC0415
    from vllm.v1.worker.gpu.kv_connector import ActiveKVConnector  # noqa: PLC0415

    def step(ours: Any, shipped: Any) -> Any:
        monkeypatch.setattr(kv_transfer_state, "_KV_CONNECTOR_AGENT", ours)
        runner = ActiveKVConnector(ours._vllm_config, {})
        runner.pre_forward(shipped)
        runner.finish_forward()
        return runner.post_forward(shipped.finished_req_ids)

    return step


def test_vllms_runner_hooks_bind_the_metadata_before_loads_and_reports(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, scheduler = _drive(model, _active(monkeypatch))
    _check_order(log, scheduler)


def test_the_old_runner_hooks_bind_the_metadata_before_loads_and_reports(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    try:
        from vllm.v1.worker import kv_connector_model_runner_mixin as mixin  # noqa: PLC0415
    except ImportError:
        pytest.skip(
            f"vLLM {vllm.__version__} has no kv_connector_model_runner_mixin (deleted in 0.34 "
            "with the old GPU model runner; its hooks are ActiveKVConnector's, tested above)"
        )
    from vllm.distributed.kv_transfer import kv_transfer_state  # noqa: PLC0415

    def step(ours: Any, shipped: Any) -> Any:
        monkeypatch.setattr(kv_transfer_state, "_KV_CONNECTOR_AGENT", ours)
        return mixin.KVConnectorModelRunnerMixin.kv_connector_no_forward(
            shipped, ours._vllm_config
        ).kv_connector_output

    log, scheduler = _drive(model, step)
    _check_order(log, scheduler)


SCHEDULER_HOOKS = (
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "request_finished",
    "request_finished_all_groups",  # what vLLM calls on a connector that supports HMA (ours)
    "update_connector_output",
)


def test_vllms_scheduler_calls_the_adapter_in_that_order(model: Path) -> None:
    """The scheduler-side order above, exercised: each call of the adapter's scheduler hooks
    logged with the scheduler's phase (``schedule`` or ``update_from_output``) it came in, over
    requests that load asynchronously, finish, and are saved."""
    loader, saver = script(tokens=BLOCK, load_async=True), script(saves=True)
    engine = Engine(make_config(model, [child("a", loader), child("b", saver)]))
    scheduler, log = engine.scheduler, []
    _record(log, "ours", engine.connector, SCHEDULER_HOOKS)
    for phase in ("schedule", "update_from_output"):
        method = getattr(scheduler, phase)

        def marked(*args: Any, _phase: str = phase, _method: Any = method) -> Any:
            log.append(("phase", _phase))
            return _method(*args)

        setattr(scheduler, phase, marked)
    for request_id in ("r", "ss"):
        engine.add(make_request(request_id, num_tokens=3 * BLOCK, max_tokens=1))
    for step in range(6):
        engine.step()
        if step == 0:
            loader.recving.update({"r", "ss"})
        if step == 2:
            saver.sending.update({"r", "ss"})
    assert engine.scheduler.requests == {} and {"r", "ss"} <= set(engine.outputs)
    phase, steps = "", []
    for who, name in log:
        if who == "phase":
            phase = name
            if name == "schedule":
                steps.append([])
            continue
        steps[-1].append((phase, name.removesuffix("_all_groups")))
    calls = [call for step in steps for call in step]
    # Lookups and allocation only while scheduling, each lookup before its allocation; reports
    # and finishes only while updating from the step's output.
    for phase, name in calls:
        scheduling = name in ("get_num_new_matched_tokens", "update_state_after_alloc")
        assert (phase == "schedule") is scheduling, (phase, name)
    names = [name for _, name in calls]
    assert names.index("get_num_new_matched_tokens") < names.index("update_state_after_alloc")
    # In the step the requests finished, they were finished before the step's reports.
    (finishing,) = [step for step in steps if ("update_from_output", "request_finished") in step]
    updates = [name for phase, name in finishing if phase == "update_from_output"]
    assert updates.index("request_finished") < updates.index("update_connector_output")


def test_the_adapter_records_loads_and_savers_before_binding_its_children() -> None:
    # The adapter records the loads and savers of the metadata before binding its children's:
    # a child learns of a load or save only from its own part, bound after.
    bind = inspect.getsource(WorkerPart.bind_connector_metadata)
    _in_order(
        bind,
        "self.ledger.expect(metadata.savers)",
        "loads.choose_loader(request_id, name)",
        "child.bind_connector_metadata(children[name])",
    )

"""After ``shutdown()`` no child is asked again, and vLLM's teardown gets neutral answers.

vLLM frees the requests still in flight as it tears down (``finish_requests``, whose
``request_finished`` asks the connector whether to hold the blocks), after the scheduler's
connector shut down: the connector then asks no child (none is asked to start a save after its
own shutdown), answers ``(False, None)`` (nothing held: vLLM frees), raises nothing into vLLM,
and logs it once. What the books still owe keeps draining, as the core's does
(docs/concepts.md, "Shutting down"), without asking a child.
"""

from __future__ import annotations

import inspect
import logging
from pathlib import Path
from typing import Any

import pytest
from vllm_support import require_vllm

require_vllm()
pytestmark = pytest.mark.vllm

from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorRole,
)
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_children import HOOK_NAMES, Script, child, script  # noqa: E402
from vllm_harness import Engine, make_config, make_connector, make_request  # noqa: E402

from multiconnector.vllm import MultiConnector  # noqa: E402
from multiconnector.vllm.closed import NEUTRAL  # noqa: E402

AFTER = "called after shutdown"


def watched(name: str, made: Script) -> dict[str, Any]:
    return child(name, made, kv_connector="WatchedConnector")


def late_logs(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "multiconnector" and AFTER in r.getMessage()]


def test_a_request_freed_by_vllm_after_shutdown_asks_no_child_and_is_not_held(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saver, other = script(saves=True), script()
    engine = Engine(make_config(model, [watched("saver", saver), watched("other", other)]))
    request = engine.add(make_request("r1", num_tokens=40, max_tokens=8))
    engine.step()
    engine.step()
    assert engine.held("r1") and "r1" not in engine.outputs  # in flight
    engine.scheduler.shutdown()  # the scheduler's connector shuts down, then vLLM frees r1
    with caplog.at_level(logging.DEBUG, logger="multiconnector"):
        engine.scheduler.finish_requests("r1", RequestStatus.FINISHED_ABORTED)
        assert engine.connector.request_finished(request, [1]) == (False, None)
    assert saver.late == [] and other.late == []  # no child asked, none to start a save
    assert saver.names("request_finished") == []
    assert not engine.held("r1")  # nothing held: vLLM freed its blocks
    assert "r1" not in engine.connector.saving
    assert engine.connector.child_failures() == {}
    (record,) = late_logs(caplog)  # once, at DEBUG
    assert record.levelno == logging.DEBUG and "request_finished" in record.getMessage()
    assert "SCHEDULER" in record.getMessage()


def test_before_shutdown_the_same_request_asks_its_children(model: Path) -> None:
    # The counterpart of the test above: without shutdown, vLLM's finish_requests asks every
    # child, and the saver's save holds the request.
    saver, other = script(saves=True), script()
    engine = Engine(make_config(model, [watched("saver", saver), watched("other", other)]))
    engine.add(make_request("r1", num_tokens=40, max_tokens=8))
    engine.step()
    engine.scheduler.finish_requests("r1", RequestStatus.FINISHED_ABORTED)
    assert [c[1] for c in saver.names("request_finished")] == ["r1"]
    assert [c[1] for c in other.names("request_finished")] == ["r1"]
    assert engine.held("r1") and engine.connector.saving == {"r1": ("saver",)}


def _neutral_call(connector: Any, hook: str) -> Any:
    """``connector.<hook>(...)`` with as many placeholder arguments as vLLM's hook takes."""
    params = inspect.signature(getattr(KVConnectorBase_V1, hook)).parameters
    needed = [
        p
        for p in params.values()
        if p.name != "self" and p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD
    ]
    return getattr(connector, hook)(*[None] * len(needed))


@pytest.mark.parametrize("role", [KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER])
def test_every_hook_after_shutdown_answers_neutrally_and_asks_no_child(
    model: Path, role: KVConnectorRole, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = script(saves=True, tokens=32), script(stats=3)
    connector = make_connector(make_config(model, [watched("a", a), watched("b", b)]), role)
    connector.shutdown()
    hooks = [hook for hook in NEUTRAL if hasattr(KVConnectorBase_V1, hook)]
    with caplog.at_level(logging.DEBUG, logger="multiconnector"):
        for hook in hooks:
            assert _neutral_call(connector, hook) == NEUTRAL[hook](), hook
        for hook in hooks:  # a second time: the same, unlogged
            assert _neutral_call(connector, hook) == NEUTRAL[hook](), hook
    assert a.late == [] and b.late == []
    assert len(late_logs(caplog)) == 1
    assert connector.child_failures() == {}
    # A mutable answer is a new one each call: vLLM may fill it.
    assert connector.get_transfer_results(set()) is not connector.get_transfer_results(set())


def test_every_hook_ours_composes_has_an_answer_after_shutdown() -> None:
    # A hook added to the connector without one would ask the shut-down children again.
    draining = {"shutdown", "update_connector_output", "build_connector_meta"}
    composed = {
        name
        for name in HOOK_NAMES & set(vars(MultiConnector))
        if not isinstance(inspect.getattr_static(MultiConnector, name), classmethod)
    }
    assert composed - draining - set(NEUTRAL) == set()


def test_a_second_shutdown_shuts_no_child_down_again(model: Path) -> None:
    a, b = script(), script()
    engine = Engine(make_config(model, [watched("a", a), watched("b", b)]), worker=False)
    engine.connector.shutdown()
    engine.connector.shutdown()
    engine.scheduler.shutdown()
    assert (a.shutdowns, b.shutdowns) == (1, 1)
    assert a.late == [] and b.late == []


def test_a_failed_child_shutdown_still_leaves_every_hook_neutral(model: Path) -> None:
    a, b = script(shutdown_error=RuntimeError("disk gone")), script()
    engine = Engine(make_config(model, [watched("a", a), watched("b", b)]), worker=False)
    request = engine.add(make_request("r1", num_tokens=40, max_tokens=8))
    engine.step()
    with pytest.raises(ExceptionGroup, match="failed to shut down: a"):
        engine.connector.shutdown()
    assert (a.shutdowns, b.shutdowns) == (1, 1)
    assert engine.connector.request_finished(request, [1]) == (False, None)
    engine.connector.shutdown()  # nothing raised again: each child was shut down once
    assert (a.shutdowns, b.shutdowns) == (1, 1) and a.late == [] and b.late == []


def test_a_save_reported_after_shutdown_still_frees_its_request_asking_no_child(
    model: Path,
) -> None:
    """Shutting down drains (docs/concepts.md, "Shutting down"): a child's last save, reported
    after the connector's shutdown(), is applied and frees its request (it used to raise
    ShutDownError into vLLM's engine loop and leave the request held for ever); the
    scheduler's children are not asked for it."""
    a, b = script(saves=True), script()
    engine = Engine(make_config(model, [watched("a", a), watched("b", b)]))
    engine.add(make_request("r1", num_tokens=40, max_tokens=2))
    for _ in range(4):
        engine.step()
    assert "r1" in engine.outputs and engine.held("r1")  # its save is owed
    engine.connector.shutdown()
    a.sending.add("r1")
    engine.step()
    assert not engine.held("r1") and len(engine.connector.tracker) == 0
    assert a.late == [] and b.late == []  # the worker's children are not shut down

"""Ours against vLLM's own MultiConnector, on the same scripted children.

Where vLLM's class is right the two must agree. Where it has a known bug, one test body is run
against both: it passes for ours and is a strict ``xfail`` for vLLM's, so the day vLLM fixes the
bug this file says so (the xfail starts passing, which fails the run).
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (  # noqa: E402
    KVConnectorLogging,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (  # noqa: E402
    MultiKVConnectorMetadata,
)
from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_children import Script, ScriptedMetadata, child, script  # noqa: E402
from vllm_harness import Engine, make_config, make_connector, make_request  # noqa: E402

from multiconnector.vllm import NamedMultiConnectorMetadata  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]  # vLLM engine start-up


def both(reason: str, raises: type[BaseException] | None = AssertionError) -> pytest.MarkDecorator:
    """Run the test for ours (must pass) and for vLLM's (a strict xfail: the bug is there)."""
    bug = pytest.mark.xfail(strict=True, raises=raises, reason=f"vLLM: {reason}")
    return pytest.mark.parametrize(
        "ours", [pytest.param(True, id="ours"), pytest.param(False, id="vllm", marks=bug)]
    )


def engine(model: Path, ours: bool, **scripts: Script) -> Engine:
    return Engine(make_config(model, [child(n, s) for n, s in scripts.items()], ours=ours))


# -- where vLLM is right, the two agree --------------------------------------------------------


def agree(run: Callable[[bool], Any]) -> None:
    ours, theirs = run(True), run(False)
    assert ours == theirs


def test_the_first_child_with_tokens_loads(model: Path) -> None:
    def run(ours: bool) -> Any:
        a, b, c = script(tokens=0), script(tokens=16), script(tokens=32)
        e = engine(model, ours, a=a, b=b, c=c)
        e.add(make_request("r1", num_tokens=40, max_tokens=3))
        e.step()
        return e.scheduled, [s.names("update_state_after_alloc") for s in (a, b, c)]

    agree(run)


def test_a_child_still_looking_up_delays_the_request(model: Path) -> None:
    def run(ours: bool) -> Any:
        e = engine(model, ours, a=script(tokens=None), b=script(tokens=16))
        e.add(make_request("r1", num_tokens=40, max_tokens=3))
        e.step()
        return e.scheduled, e.scheduler.requests["r1"].status

    agree(run)


def test_params_from_two_children_reach_the_output_merged(model: Path) -> None:
    def run(ours: bool) -> Any:
        e = engine(model, ours, a=script(params={"x": 1}), b=script(params={"y": 2}))
        e.add(make_request("r1", max_tokens=1))
        e.step()
        return e.outputs["r1"].kv_transfer_params

    agree(run)


def test_two_savers_that_both_report_release_the_request_once_both_did(model: Path) -> None:
    def run(ours: bool) -> Any:
        a, b = script(saves=True), script(saves=True)
        e = engine(model, ours, a=a, b=b)
        e.add(make_request("r1", max_tokens=1))
        e.step()
        held = [e.held("r1")]
        a.sending.add("r1")
        e.step()
        held.append(e.held("r1"))
        b.sending.add("r1")
        e.step()
        held.append(e.held("r1"))
        return held

    agree(run)


def test_a_request_aborted_while_loading_frees_its_blocks_on_its_completion(model: Path) -> None:
    def run(ours: bool) -> Any:
        a = script(tokens=32, load_async=True)
        e = engine(model, ours, a=a, b=script())
        e.add(make_request("r1", num_tokens=40, max_tokens=4))
        e.step()
        e.scheduler.finish_requests("r1", RequestStatus.FINISHED_ABORTED)
        e.step()
        held = [e.held("r1")]
        a.recving.add("r1")
        e.step()
        return [*held, e.held("r1")]

    agree(run)


def test_each_child_gets_its_own_worker_metadata(model: Path) -> None:
    def run(ours: bool) -> Any:
        a, b = script(), script()
        e = engine(model, ours, a=a, b=b)
        e.add(make_request("r1", max_tokens=2))
        e.step()
        return [
            [call[1].seen for call in s.names("update_connector_output")] == [[s.label]]
            for s in (a, b)
        ]

    agree(run)


# -- vLLM's documented bugs: the same test, passing for ours, failing for vLLM's ---------------


@both("a phantom finished-sending report frees a request another child is still saving")
def test_a_phantom_send_report_does_not_free_early(model: Path, ours: bool) -> None:
    a, b, c = script(saves=True), script(saves=True), script()
    e = engine(model, ours, a=a, b=b, c=c)
    e.add(make_request("r1", max_tokens=1))
    e.step()
    a.sending.add("r1")
    c.sending.add("r1")  # c never committed to saving r1
    e.step()
    assert e.held("r1"), "freed while b is still saving"
    b.sending.add("r1")
    e.step()
    assert not e.held("r1")


@both("a duplicate finished-sending report frees a request another child is still saving")
def test_a_duplicate_send_report_does_not_free_early(model: Path, ours: bool) -> None:
    a, b = script(saves=True), script(saves=True)
    e = engine(model, ours, a=a, b=b)
    e.add(make_request("r1", max_tokens=1))
    e.step()
    a.sending.add("r1")
    e.step()
    a.sending.add("r1")  # the same report again
    e.step()
    assert e.held("r1"), "freed while b is still saving"


@both("a duplicate load completion crashes the scheduler (an assertion on the request state)")
def test_a_duplicate_load_completion_is_ignored(model: Path, ours: bool) -> None:
    a = script(tokens=32, load_async=True)
    e = engine(model, ours, a=a, b=script())
    e.add(make_request("r1", num_tokens=40, max_tokens=3))
    e.step()
    a.recving.add("r1")
    e.step()
    a.recving.add("r1")  # delivered again while the request runs
    for _ in range(3):
        e.step()
    assert e.outputs["r1"].finish_reason is not None


@both("a load completion after the request was freed crashes the scheduler")
def test_a_late_load_completion_is_ignored(model: Path, ours: bool) -> None:
    a = script(tokens=32, load_async=True)
    e = engine(model, ours, a=a, b=script())
    e.add(make_request("r1", num_tokens=40, max_tokens=1))
    e.step()
    a.recving.add("r1")
    e.step()
    e.step()  # runs the rest of the prompt and finishes
    e.step()  # the workers learn it finished; its blocks are freed
    assert not e.held("r1")
    a.recving.add("r1")  # the same completion, delivered once more
    e.step()
    assert e.outputs["r1"].finish_reason is not None


@both("a load completion from a child that was not chosen to load releases the request early")
def test_a_phantom_load_completion_is_ignored(model: Path, ours: bool) -> None:
    a, b = script(tokens=32, load_async=True), script()
    e = engine(model, ours, a=a, b=b)
    request = e.add(make_request("r1", num_tokens=40, max_tokens=3))
    e.step()
    b.recving.add("r1")  # b was never asked to load r1
    e.step()
    e.step()
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS, "ran before its KV arrived"


@both("a child that takes the finished request's partial tail is not awaited")
def test_a_partial_tail_taken_is_awaited(model: Path, ours: bool) -> None:
    a, b = script(tail=True), script(saves=True)
    config = make_config(model, [child("a", a), child("b", b)], ours=ours)
    scheduler = make_connector(config, KVConnectorRole.SCHEDULER)
    worker = make_connector(config, KVConnectorRole.WORKER)
    request = make_request("r1")
    scheduler.on_new_request(request)
    assert scheduler.register_finished_partial_tail(request, ([1, 2],), [(0, 1, 2)])
    assert scheduler.request_finished(request, [1, 2])[0] is True
    worker.bind_connector_metadata(scheduler.build_connector_meta(SchedulerOutput.make_empty()))
    b.sending.add("r1")
    released, _ = worker.get_finished({"r1"})
    assert not released, "released while a still writes its partial tail"
    a.sending.add("r1")
    assert worker.get_finished(set())[0] == {"r1"}


@both("stats are keyed by class name: two children of one class collide, and rebuilding fails")
def test_stats_are_keyed_by_name_and_rebuild(model: Path, ours: bool) -> None:
    e = engine(model, ours, a=script(stats=1), b=script(stats=2))
    e.add(make_request("r1", max_tokens=3))
    (outputs,) = e.step().values()
    payload = outputs.scheduler_stats.kv_connector_stats
    assert set(payload) == {"a", "b"}, f"collided: {sorted(payload)}"
    logging = KVConnectorLogging(e.config.kv_transfer_config)  # what vLLM's stat logger runs
    logging.observe(payload)
    assert logging.transfer_stats_accumulator.reduce() == {"a": {"count": 1}, "b": {"count": 2}}


@both(
    "stats are rebuilt through the factory's registry: a child loaded by module path fails",
    raises=ValueError,
)
def test_stats_of_a_child_loaded_by_module_path_rebuild(model: Path, ours: bool) -> None:
    e = engine(model, ours, a=script(stats=5))
    e.add(make_request("r1", max_tokens=3))
    (outputs,) = e.step().values()
    logging = KVConnectorLogging(e.config.kv_transfer_config)
    logging.observe(outputs.scheduler_stats.kv_connector_stats)
    assert logging.transfer_stats_accumulator.reduce() == {"a": {"count": 5}}


@both("transfer params are merged by updating the first child's own dict in place")
def test_a_childs_params_are_not_mutated(model: Path, ours: bool) -> None:
    a, b = script(params={"x": 1}), script(params={"y": 2})
    e = engine(model, ours, a=a, b=b)
    e.add(make_request("r1", max_tokens=1))
    e.step()
    assert e.outputs["r1"].kv_transfer_params == {"x": 1, "y": 2}
    assert a.params == {"x": 1}, f"a's own dict became {a.params}"


@both("shutdown raises only the last child's error", raises=RuntimeError)
def test_shutdown_raises_every_childs_error(model: Path, ours: bool) -> None:
    a = script(shutdown_error=RuntimeError("a down"))
    b = script(shutdown_error=RuntimeError("b down"))
    c = script()
    connector = make_connector(
        make_config(model, [child("a", a), child("b", b), child("c", c)], ours=ours),
        KVConnectorRole.WORKER,
    )
    with pytest.raises(ExceptionGroup) as caught:
        connector.shutdown()
    assert [str(exc) for exc in caught.value.exceptions] == ["a down", "b down"]
    assert (a.shutdowns, b.shutdowns, c.shutdowns) == (1, 1, 1)


@both("a child constructor failing leaks the children already built")
def test_a_failed_constructor_shuts_down_the_children_built(model: Path, ours: bool) -> None:
    a, b = script(), script(init_error=OSError("no such device"))
    config = make_config(model, [child("a", a), child("b", b)], ours=ours)
    with pytest.raises(Exception) as caught:  # the two raise different types
        make_connector(config, KVConnectorRole.WORKER)
    assert a.shutdowns == 1, "a was left running"
    assert "'b'" in str(caught.value)
    assert isinstance(caught.value.__cause__, OSError)


@both(
    "metadata is paired with children by position with zip: a short tuple is silently cut",
    raises=pytest.fail.Exception,
)
def test_metadata_for_too_few_children_is_an_error(model: Path, ours: bool) -> None:
    a, b = script(), script()
    connector = make_connector(
        make_config(model, [child("a", a), child("b", b)], ours=ours), KVConnectorRole.WORKER
    )
    only_a = ScriptedMetadata(a.label)
    metadata = (
        NamedMultiConnectorMetadata({"a": only_a})
        if ours
        else MultiKVConnectorMetadata(metadata=(only_a,))
    )
    with pytest.raises(ValueError, match="missing"):
        connector.bind_connector_metadata(metadata)

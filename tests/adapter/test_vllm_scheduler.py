"""Our connector under vLLM's real v1 Scheduler, on the CPU."""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import pickle  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (  # noqa: E402
    ExampleConnector,
    ExampleConnectorMetadata,
)
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_children import ScriptedMetadata, child, script  # noqa: E402
from vllm_harness import (  # noqa: E402
    BLOCK,
    Engine,
    make_config,
    make_connector,
    make_request,
    runner_output,
)

from multiconnector import (  # noqa: E402
    Outcome,
    ShutDownError,
    State,
)
from multiconnector.vllm import MultiConnector, NamedMultiConnectorMetadata  # noqa: E402
from multiconnector.vllm.scheduler import WORKERS  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]  # vLLM engine start-up


def example(name: str, storage: Path) -> dict[str, object]:
    return {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "shared_storage_path": str(storage),
            "multiconnector_name": name,
        },
    }


def test_vllm_loads_it_by_module_path(model: Path, tmp_path: Path) -> None:
    engine = Engine(make_config(model, [example("disk", tmp_path), child("pd", script())]))
    assert isinstance(engine.connector, MultiConnector)
    assert isinstance(engine.worker, MultiConnector)
    assert list(engine.connector.children) == ["disk", "pd"]
    assert isinstance(engine.connector.children["disk"], ExampleConnector)


def test_example_connector_hit_is_honoured(model: Path, tmp_path: Path) -> None:
    pd = script()
    engine = Engine(make_config(model, [example("disk", tmp_path), child("pd", pd)]))
    request = make_request("hit", num_tokens=40, max_tokens=3)
    # ExampleConnector finds a prefix by the folder it saved it in: make that folder.
    hit = (len(request.prompt_token_ids) - 2) // BLOCK * BLOCK
    disk = engine.connector.children["disk"]
    disk._generate_foldername_debug(
        torch.tensor(request.prompt_token_ids[:hit]), [], create_folder=True
    )
    engine.add(make_request("miss", num_tokens=40, max_tokens=3))
    engine.add(request)

    engine.step()

    assert engine.scheduled[0] == {"miss": 40, "hit": 40 - hit}
    assert engine.connector.tracker.get("hit").loader == "disk"
    assert engine.connector.tracker.get("miss").loader is None
    # The loader was told the external tokens; the other child 0, both got the blocks.
    assert ("update_state_after_alloc", "hit", 0) in pd.calls
    engine.step()
    assert engine.scheduled[1] == {"miss": 1, "hit": 1}  # decoding: the prompt is complete


def test_metadata_reaches_workers_by_name(model: Path, tmp_path: Path) -> None:
    a, b = script(), script()
    engine = Engine(make_config(model, [child("a", a), child("b", b), example("c", tmp_path)]))
    engine.add(make_request("r1"))
    engine.step()
    metadata = engine.worker.children["a"].bound[-1]
    assert metadata == ScriptedMetadata(a.label, ["r1"])
    assert engine.worker.children["b"].bound[-1] == ScriptedMetadata(b.label, ["r1"])
    assert isinstance(engine.worker.children["c"]._connector_metadata, type(None))


def test_params_from_two_children_are_merged_into_the_output(model: Path) -> None:
    a = script(params={"remote_host": "h", "remote_port": 1})
    b = script(params={"cache_hits": 3})
    engine = Engine(make_config(model, [child("a", a), child("b", b)]))
    engine.add(make_request("r1", max_tokens=1))
    engine.step()
    assert engine.outputs["r1"].kv_transfer_params == {
        "remote_host": "h",
        "remote_port": 1,
        "cache_hits": 3,
    }
    assert a.params == {"remote_host": "h", "remote_port": 1}  # not updated in place


def test_a_params_clash_is_the_later_childs_failure_with_consistent_bookkeeping(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # vLLM's class raises on two children's params; ours serves: the params are dropped (the
    # request's KV stays where it is), the clash counted under the later child and logged.
    a = script(saves=True, params={"remote_host": "a"})
    b = script(saves=True, params={"remote_host": "b"})
    engine = Engine(make_config(model, [child("a", a), child("b", b)]))
    engine.add(make_request("r1", max_tokens=1))
    with caplog.at_level("WARNING", logger="multiconnector"):
        engine.step()
    assert engine.connector.child_failures() == {"b": {"request_finished": 1}}
    assert "'remote_host' from a, b" in caplog.text
    assert engine.outputs["r1"].kv_transfer_params is None
    # Both saves still tracked, handed off to the workers: nothing freed early.
    assert engine.connector.saving == {"r1": ("a", "b")}
    assert engine.scheduler.schedule().kv_connector_metadata.savers == {"r1": ("a", "b")}


def test_blocks_are_held_until_every_saver_reported(model: Path) -> None:
    a, b, c = script(saves=True), script(saves=True), script()
    engine = Engine(make_config(model, [child("a", a), child("b", b), child("c", c)]))
    engine.add(make_request("r1", max_tokens=1))
    engine.step()  # prefill; finishes at max_tokens=1
    assert engine.outputs["r1"].finish_reason is not None
    assert engine.held("r1")

    a.sending.add("r1")
    c.sending.add("r1")  # a phantom: c never committed to saving r1
    engine.step()
    assert engine.held("r1")
    a.sending.add("r1")  # a duplicate
    engine.step()
    assert engine.held("r1")

    b.sending.add("r1")
    engine.step()
    assert not engine.held("r1")
    counts = engine.worker.connector_counts()
    assert counts["a"][Outcome.applied] == 1
    assert counts["a"][Outcome.duplicate] == 1
    assert counts["c"][Outcome.phantom] == 1
    assert len(engine.connector.tracker) == 0
    assert len(engine.worker.ledger) == 0


def test_an_async_load_completes_once(model: Path) -> None:
    a = script(tokens=32, load_async=True)
    b = script()
    engine = Engine(make_config(model, [child("a", a), child("b", b)]))
    request = engine.add(make_request("r1", num_tokens=40, max_tokens=2))
    engine.step()
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS

    a.recving.add("r1")
    b.recving.add("r1")  # a phantom: b was not chosen to load
    engine.step()
    a.recving.add("r1")  # a duplicate, once the request runs
    engine.step()
    assert engine.scheduled[-1] == {"r1": 8}
    engine.step()
    assert engine.outputs["r1"].finish_reason is not None
    counts = engine.worker.connector_counts()
    assert counts["b"][Outcome.phantom] == 1
    assert counts["a"][Outcome.applied] == 1
    assert sum(n for o, n in counts["a"].items() if o is not Outcome.applied) == 1
    engine.step()  # the workers learn the request finished one step later
    assert len(engine.worker.load_tracker) == 0


def test_the_scheduler_frees_blocks_only_once_every_saver_reported_on_every_worker(
    model: Path,
) -> None:
    # The scheduler keeps no books of its own for the saves it hands off: vLLM frees the blocks
    # when its output aggregator has "finished sending" from every worker, and each worker
    # reports it only once every saver named in the metadata confirmed. Two workers, reports
    # arriving one by one, each step checked.
    a, b, c = script(saves=True), script(saves=True), script()
    config = make_config(model, [child("a", a), child("b", b), child("c", c)])
    engine = Engine(config, worker=False)
    workers = [make_connector(config, KVConnectorRole.WORKER) for _ in range(2)]
    aggregator = KVOutputAggregator(expected_finished_count=len(workers))
    engine.add(make_request("r1", max_tokens=1))
    # Per step, per worker: the names reporting r1 finished sending there (c never saved it).
    plan = [
        (set(), set()),  # prefill: r1 finishes, its saves handed off to the workers
        ({"a", "c"}, {"b"}),  # worker 0: a and a phantom (c); worker 1: b
        ({"a"}, {"a"}),  # a duplicate on worker 0; worker 1 has every saver's report
        ({"b"}, set()),  # worker 0 has every saver's report: vLLM frees the blocks
    ]
    scripts = {"a": a, "b": b, "c": c}
    held = []
    for step, per_worker in enumerate(plan):
        output = engine.scheduler.schedule()
        outputs = []
        for worker, reporting in zip(workers, per_worker, strict=True):
            shipped = pickle.loads(pickle.dumps(output))
            worker.bind_connector_metadata(shipped.kv_connector_metadata)
            for name in reporting:
                scripts[name].sending.add("r1")
            results = worker.get_transfer_results(shipped.finished_req_ids)
            kv_output = KVConnectorOutput(finished_sending=results.finished_sending or None)
            worker.clear_connector_metadata()
            outputs.append(runner_output(output, kv_output))
        engine.scheduler.update_from_output(output, aggregator.aggregate(outputs))
        held.append(engine.held("r1"))
        # While vLLM holds the blocks, the scheduler still lists the request as saving.
        assert ("r1" in engine.connector.saving) is engine.held("r1"), step
    assert held == [True, True, True, False]
    counts = workers[0].connector_counts()
    assert counts["a"] == {Outcome.applied: 1, Outcome.duplicate: 1}
    assert counts["c"] == {Outcome.phantom: 1}
    assert engine.connector.saving == {}
    assert len(engine.connector.tracker) == 0
    assert [len(w.ledger) for w in workers] == [0, 0]


def test_a_garbage_save_answer_is_awaited_by_the_workers_and_the_scheduler(model: Path) -> None:
    # A child answering request_finished with garbage may have started a save: the workers are
    # told to await it (conservatively) beside the true saver, and the core's books their word.
    a, b = script(saves=True), script(saves="yes")  # type: ignore[arg-type]
    engine = Engine(make_config(model, [child("a", a), child("b", b)]))
    engine.add(make_request("r1", max_tokens=1))
    engine.step()  # b's answer is its failure, counted: the engine goes on
    assert engine.connector.child_failures() == {"b": {"request_finished": 1}}
    assert engine.connector.saving == {"r1": ("a", "b")}
    record = engine.connector.tracker.get("r1")
    assert record.state is State.finishing
    assert record.awaiting == (WORKERS,)
    a.sending.add("r1")
    engine.step()  # the workers learn who saves r1; a reports
    assert engine.held("r1")
    b.sending.add("r1")
    engine.step()
    assert not engine.held("r1")
    assert engine.connector.saving == {}
    assert len(engine.connector.tracker) == 0
    assert len(engine.worker.ledger) == 0


def test_a_second_request_finished_while_saving_asks_nobody(model: Path) -> None:
    a = script(saves=True, params={"x": 1})
    engine = Engine(make_config(model, [child("a", a), child("b", script())]))
    request = engine.add(make_request("r1", max_tokens=1))
    engine.step()
    assert engine.connector.saving == {"r1": ("a",)}
    asked = len(a.names("request_finished"))
    assert engine.connector.request_finished(request, [1]) == (True, None)
    assert len(a.names("request_finished")) == asked
    assert engine.connector.saving == {"r1": ("a",)}


def test_a_synchronously_loaded_request_leaves_the_schedulers_books(model: Path) -> None:
    # vLLM reports no completion for a synchronous load (it ends within the step that scheduled
    # it): once the request finished, the scheduler must not hold its record for that load.
    a = script(tokens=32, load_async=False)
    engine = Engine(make_config(model, [child("a", a), child("b", script())]))
    engine.add(make_request("r1", num_tokens=40, max_tokens=2))
    engine.step()
    assert engine.connector.tracker.get("r1").loader == "a"
    while engine.scheduler.has_requests():
        engine.step()
    assert engine.outputs["r1"].finish_reason is not None
    assert len(engine.connector.tracker) == 0
    assert len(engine.worker.load_tracker) == 0


def test_request_finished_after_shutdown_holds_nothing_and_keeps_the_books(model: Path) -> None:
    # After shutdown no child is asked (test_vllm_after_shutdown.py): nothing is held, so vLLM
    # may free the blocks; the books are left as they were.
    a = script(tokens=32, load_async=False)
    engine = Engine(make_config(model, [child("a", a), child("b", script())]))
    request = engine.add(make_request("r1", num_tokens=40, max_tokens=4))
    engine.step()
    assert engine.connector.tracker.get("r1").loader == "a"
    engine.connector.shutdown()
    assert engine.connector.request_finished(request, [1]) == (False, None)
    assert a.names("request_finished") == []
    assert engine.connector.tracker.get("r1").loader == "a"  # the books as they were


def test_the_scheduler_hooks_after_shutdown_answer_nothing_and_keep_nothing(model: Path) -> None:
    tail = script(tail=True)
    engine = Engine(make_config(model, [child("tail", tail), child("b", script())]))
    engine.connector.shutdown()
    part = engine.connector._scheduler
    late = make_request("late", num_tokens=40, max_tokens=4)
    assert engine.connector.get_num_new_matched_tokens(late, 0) == (0, False)
    assert not engine.connector.register_finished_partial_tail(late, ([1, 2],), [(0, 1, 2)])
    assert tail.names("register_finished_partial_tail") == []  # no child asked
    assert "late" not in part.live and not part._tail_savers
    assert len(engine.connector.tracker) == 0
    # The scheduler's part, called directly, still refuses as the core does.
    with pytest.raises(ShutDownError, match=r"register_finished_partial_tail\(\) refused"):
        part.register_finished_partial_tail(late, ([1, 2],), [(0, 1, 2)])
    with pytest.raises(ShutDownError, match=r"request_finished\(\) refused"):
        part.request_finished(late, [1])


def test_a_request_aborted_while_loading_still_frees_its_blocks(model: Path) -> None:
    a = script(tokens=32, load_async=True)
    engine = Engine(make_config(model, [child("a", a), child("b", script())]))
    engine.add(make_request("r1", num_tokens=40, max_tokens=4))
    engine.step()
    engine.scheduler.finish_requests("r1", RequestStatus.FINISHED_ABORTED)
    engine.step()
    assert engine.held("r1")  # the load still writes into its blocks
    a.recving.add("r1")  # the late, but legitimate, completion
    engine.step()
    assert not engine.held("r1")
    assert len(engine.worker.load_tracker) == 0


def test_metadata_is_ours_and_survives_the_trip(model: Path, tmp_path: Path) -> None:
    engine = Engine(make_config(model, [example("disk", tmp_path), child("pd", script())]))
    engine.add(make_request("r1"))
    scheduler_output = engine.scheduler.schedule()
    metadata = scheduler_output.kv_connector_metadata
    assert isinstance(metadata, NamedMultiConnectorMetadata)
    assert isinstance(metadata.children["disk"], ExampleConnectorMetadata)
    assert len(metadata.children["disk"].requests) == 1  # a store: the prompt is new

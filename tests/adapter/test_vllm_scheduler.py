"""Our connector under vLLM's real v1 Scheduler, on the CPU."""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (  # noqa: E402
    ExampleConnector,
    ExampleConnectorMetadata,
)
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_children import ScriptedMetadata, child, script  # noqa: E402
from vllm_harness import BLOCK, Engine, make_config, make_request  # noqa: E402

from multiconnector import KeyClashError, Outcome, State  # noqa: E402
from multiconnector.vllm import MultiConnector, NamedMultiConnectorMetadata  # noqa: E402

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


def test_a_params_clash_is_a_key_clash_error_with_consistent_bookkeeping(model: Path) -> None:
    a = script(saves=True, params={"remote_host": "a"})
    b = script(saves=True, params={"remote_host": "b"})
    engine = Engine(make_config(model, [child("a", a), child("b", b)]))
    engine.add(make_request("r1", max_tokens=1))
    with pytest.raises(KeyClashError) as caught:
        engine.step()
    assert caught.value.clashes == {"remote_host": ("a", "b")}
    record = engine.connector.tracker.get("r1")
    assert record.state is State.finishing
    assert record.awaiting == ("a", "b")  # both saves still tracked: nothing freed early
    # ...and the workers are told to await both.
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
    assert len(engine.worker.tracker) == 0


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

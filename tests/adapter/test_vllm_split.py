"""Split loads under vLLM's real Scheduler: one request's prefix loaded from several children.

With ``split_loads: true``, after the lookup policy chose the loader, a child that loads token
ranges (``update_state_after_alloc_range``) may load the tokens past the loader's hit: here
``fast`` holds the first 16 tokens of a 40-token prompt, ``slow`` the first 32. Each part's
child is told its range; the request runs once every part arrived; a failed part is
recomputed from its first block on; an abort drains every part (docs/vllm.md, "Split loads").
"""

from __future__ import annotations

import pickle

from vllm_support import require_vllm

require_vllm()

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_children import Script, child, script  # noqa: E402
from vllm_harness import (  # noqa: E402
    BLOCK,
    Engine,
    make_config,
    make_connector,
    make_request,
    runner_output,
)

from multiconnector import InvalidArgumentError, Outcome  # noqa: E402
from multiconnector.vllm import FALLBACK_KEY, LOOKUP_KEY, SPLIT_KEY  # noqa: E402
from multiconnector.vllm.wire import NamedMultiConnectorMetadata  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

PROMPT = 40
RANGE = "RangeConnector"


def engine(
    model: Path,
    fast: Script,
    slow: Script,
    *,
    split: bool = True,
    kinds: tuple[str, str] = (RANGE, RANGE),
    **extra: Any,
) -> Engine:
    children = [child("fast", fast, kinds[0]), child("slow", slow, kinds[1])]
    config = make_config(model, children, extra={SPLIT_KEY: split, **extra})
    assert config.kv_transfer_config is not None
    config.kv_transfer_config.kv_load_failure_policy = "recompute"  # vLLM's default: "fail"
    return Engine(config)


def ranges(made: Script, request_id: str) -> list[tuple[int, int]]:
    return [
        (c[2], c[3]) for c in made.names("update_state_after_alloc_range") if c[1] == request_id
    ]


def told(made: Script, request_id: str) -> list[int]:
    return [c[2] for c in made.names("update_state_after_alloc") if c[1] == request_id]


def test_a_sync_load_is_split_and_each_child_told_its_range(model: Path) -> None:
    fast, slow = script(holds=16), script(holds=32)
    e = engine(model, fast, slow)
    e.add(make_request("r", num_tokens=PROMPT, max_tokens=2))
    e.step()
    assert e.scheduled[0] == {"r": PROMPT - 32}
    assert ranges(fast, "r") == [(0, 16)] and ranges(slow, "r") == [(16, 16)]
    assert told(fast, "r") == [] and told(slow, "r") == []
    # The second child was asked from where the first one's hit ends.
    assert ("get_num_new_matched_tokens", "r", 16) in slow.calls
    record = e.connector.tracker.get("r")
    assert (record.loader, record.parts) == ("fast", ("slow",))
    for _ in range(3):
        e.step()
    assert "r" in e.outputs
    assert len(e.connector.tracker) == 0  # both parts settled once the request finished


@pytest.mark.parametrize(
    ("split", "kinds"),
    [
        (False, (RANGE, RANGE)),
        (True, ("ScriptedConnector", RANGE)),
        (True, (RANGE, "ScriptedConnector")),
    ],
    ids=["splits-off", "loader-loads-no-ranges", "other-loads-no-ranges"],
)
def test_without_opting_in_the_load_is_not_split(
    model: Path, split: bool, kinds: tuple[str, str]
) -> None:
    fast, slow = script(holds=16, tokens=16), script(holds=32, tokens=32)
    e = engine(model, fast, slow, split=split, kinds=kinds)
    e.add(make_request("r", num_tokens=PROMPT, max_tokens=3))
    e.step()
    assert e.scheduled[0] == {"r": PROMPT - 16}  # vLLM's first hit, as it is
    assert told(fast, "r") == [16] and told(slow, "r") == [0]
    assert ranges(fast, "r") == [] and ranges(slow, "r") == []
    assert e.connector.tracker.get("r").parts == ()


def test_under_longest_the_longest_hit_loads_first_and_nothing_is_left_to_split(
    model: Path,
) -> None:
    fast, slow = script(holds=16), script(holds=32)
    e = engine(model, fast, slow, **{LOOKUP_KEY: "longest"})
    e.add(make_request("r", num_tokens=PROMPT, max_tokens=1))
    e.step()
    assert e.scheduled[0] == {"r": PROMPT - 32}
    assert told(slow, "r") == [32] and told(fast, "r") == [0]
    assert ranges(slow, "r") == [] and ranges(fast, "r") == []


def async_split(
    model: Path, max_tokens: int = 2, **extra: Any
) -> tuple[Engine, Script, Script, Any]:
    fast, slow = script(holds=16, load_async=True), script(holds=32, load_async=True)
    e = engine(model, fast, slow, **extra)
    request = e.add(make_request("r", num_tokens=PROMPT, max_tokens=max_tokens))
    e.step()
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    return e, fast, slow, request


@pytest.mark.parametrize("last", ["fast", "slow"])
def test_an_async_split_load_runs_only_once_every_part_arrived(model: Path, last: str) -> None:
    e, fast, slow, request = async_split(model)
    first, second = (slow, fast) if last == "fast" else (fast, slow)
    first.recving.add("r")
    e.step()
    e.step()
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS  # one part still owed
    assert e.connector.tracker.get("r").loading
    second.recving.add("r")
    e.step()
    e.step()
    assert {"r": PROMPT - 32} in e.scheduled  # every loaded token kept
    for _ in range(3):
        e.step()
    assert "r" in e.outputs
    counts = e.worker.connector_counts()
    assert counts["fast"][Outcome.applied] == 1 and counts["slow"][Outcome.applied] == 1
    assert len(e.worker.load_tracker) == 0 and len(e.connector.tracker) == 0


def test_a_failed_part_is_recomputed_from_its_first_block_only(model: Path) -> None:
    e, fast, slow, _request = async_split(model)
    fast.recving.add("r")
    slow.recving.add("r")
    slow.failed.add("r")
    e.step()
    e.step()
    # fast's 16 tokens stand; slow's part (from token 16 on) is computed again.
    assert {"r": PROMPT - 16} in e.scheduled
    for _ in range(3):
        e.step()
    assert "r" in e.outputs


def test_a_failed_first_part_is_recomputed_from_its_first_block(model: Path) -> None:
    """fast's part starts at token 0: nothing loaded stands. vLLM then looks the request up
    again, and (``load_fallback: failover``) fast, whose load of it failed, is not asked:
    slow loads it alone."""
    e, fast, slow, request = async_split(model, **{FALLBACK_KEY: "failover"})
    fast.recving.add("r")
    fast.failed.add("r")
    slow.recving.add("r")
    e.step()
    asked_fast = len(fast.names("get_num_new_matched_tokens"))
    e.step()
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS  # slow's load, alone
    assert len(fast.names("get_num_new_matched_tokens")) == asked_fast
    assert ranges(slow, "r") == [(16, 16)] and told(slow, "r") == [32]
    slow.recving.add("r")
    for _ in range(4):
        e.step()
    assert {"r": PROMPT - 32} in e.scheduled
    assert "r" in e.outputs
    assert len(e.connector.tracker) == 0


@pytest.mark.parametrize("before", [(), ("fast",), ("slow",)])
def test_an_abort_drains_every_part_and_frees_once_after_the_last(
    model: Path, before: tuple[str, ...]
) -> None:
    e, fast, slow, _request = async_split(model, max_tokens=4)
    scripts = {"fast": fast, "slow": slow}
    for name in before:
        scripts[name].recving.add("r")
    e.step()
    e.scheduler.finish_requests("r", RequestStatus.FINISHED_ABORTED)
    e.step()
    assert e.held("r")  # a part still writes into its blocks
    for name in ("fast", "slow"):
        if name not in before:
            scripts[name].recving.add("r")
            e.step()
    e.step()
    assert not e.held("r")
    e.step()
    assert len(e.worker.load_tracker) == 0 and len(e.connector.tracker) == 0


def test_the_workers_learn_each_parts_blocks(model: Path) -> None:
    fast, slow = script(holds=16, load_async=True), script(holds=32, load_async=True)
    e = engine(model, fast, slow)
    e.add(make_request("r", num_tokens=PROMPT, max_tokens=1))
    output = e.scheduler.schedule()
    metadata = output.kv_connector_metadata
    assert isinstance(metadata, NamedMultiConnectorMetadata)
    assert metadata.loads == {"r": "fast"}
    (first, a), (second, b) = metadata.split_loads["r"]
    assert (first, second) == ("fast", "slow")
    assert len(a) == 16 // BLOCK and len(b) == 16 // BLOCK and not set(a) & set(b)


def test_split_loads_must_be_a_bool(model: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=SPLIT_KEY):
        engine(model, script(), script(), split="yes")  # type: ignore[arg-type]


def test_a_failed_report_after_a_part_arrived_is_a_duplicate_and_its_tokens_stand(
    model: Path,
) -> None:
    e, fast, slow, _request = async_split(model)
    fast.recving.add("r")
    e.step()
    fast.recving.add("r")  # again, now saying it failed: a duplicate of an arrived part
    fast.failed.add("r")
    e.step()
    slow.recving.add("r")
    for _ in range(4):
        e.step()
    assert {"r": PROMPT - 32} in e.scheduled  # fast's 16 tokens and slow's 16 all stand
    assert "r" in e.outputs
    counts = e.worker.connector_counts()["fast"]
    assert counts[Outcome.applied] == 1 and counts[Outcome.duplicate] == 1


def test_a_counted_childs_load_reports_never_settle_its_save(model: Path) -> None:
    """A child reporting on 2 workers of 3 loads a request (two parts on the scheduler's
    books: h@1, h@2) and saves it (aborted while loading): each worker's load report settles
    a part of the load, never a save's report name, and the request is freed once both its
    loads and both its saves came."""
    h = script(tokens=16, load_async=True, saves=True, finished_count=2)
    config = make_config(model, [child("h", h)])
    config.parallel_config.world_size = 3
    e = Engine(config, worker=False)
    workers = [make_connector(config, KVConnectorRole.WORKER) for _ in range(3)]
    aggregator = KVOutputAggregator.from_connector(e.connector, 3)
    e.add(make_request("r", num_tokens=PROMPT, max_tokens=2))
    # Per step: per worker, whether h reports the load there, and the save; abort first?
    plan = [
        (((False, False), (False, False), (False, False)), False),
        (((False, False), (False, False), (False, False)), True),
        (((True, False), (False, False), (False, False)), False),
        (((False, False), (True, False), (False, False)), False),
        (((False, True), (False, True), (False, False)), False),
        (((False, False), (False, False), (False, False)), False),
        (((False, False), (False, False), (False, False)), False),
    ]
    for step, (per_worker, abort) in enumerate(plan):
        if abort:
            e.scheduler.finish_requests("r", RequestStatus.FINISHED_ABORTED)
        scheduler_output = e.scheduler.schedule()
        outputs = []
        for worker, (loads, saves) in zip(workers, per_worker, strict=True):
            shipped = pickle.loads(pickle.dumps(scheduler_output))
            worker.bind_connector_metadata(shipped.kv_connector_metadata)
            if loads:
                h.recving.add("r")
            if saves:
                h.sending.add("r")
            results = worker.get_transfer_results(shipped.finished_req_ids)
            kv_output = KVConnectorOutput(
                finished_sending=results.finished_sending or None,
                finished_recving=results.finished_recving or None,
                kv_connector_worker_meta=worker.build_connector_worker_meta(),
            )
            outputs.append(runner_output(scheduler_output, kv_output))
            worker.clear_connector_metadata()
        e.scheduler.update_from_output(scheduler_output, aggregator.aggregate(outputs))
        if step == 3:
            assert e.held("r")  # both loads came; the saves are owed
    assert not e.held("r")
    assert len(e.connector.tracker) == 0

"""Ours against vLLM's own MultiConnector over vLLM's *built-in* children, under the real Scheduler.

One scripted workload runs through vLLM's v1 ``Scheduler`` on the CPU twice, with the same
children in vLLM's own configuration form: once with vLLM's ``MultiConnector``, once with ours
(the one added line). Each step records what the scheduler scheduled, the finished requests'
outputs and transfer params, which requests it still holds (their blocks are not freed), each
child's connector metadata and the KV connector stats; the two traces must be equal.

The documented differences are normalised first, and only those (docs/vllm.md): our stats
payload wraps each child's own under ``"stats"`` (with the class and module that rebuild it),
and timings (``*_seconds``) differ from run to run. The worker side of NixlConnector,
OffloadingConnector and DecodeBenchConnector needs a GPU; their workers' reports are injected
into the model runner's output, as vLLM's workers would aggregate them.
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import pickle  # noqa: E402
from collections.abc import Callable  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (  # noqa: E402
    MultiConnector as VllmMultiConnector,
)
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm_harness import (  # noqa: E402
    builtin_config,
    make_connector,
    make_hybrid_kv_cache_config,
    make_scheduler,
    runner_output,
)

from bench.scheduler_parts import make_request as bench_request  # noqa: E402
from multiconnector.vllm import MultiConnector  # noqa: E402

pytestmark = pytest.mark.vllm

Reports = Callable[[int], KVConnectorOutput | None]


def request(request_id: str, num_tokens: int = 40, max_tokens: int = 1, **params: Any) -> Request:
    """A request; ``params`` become its ``kv_transfer_params`` (as a client sends them)."""
    prompt = [(7 * i + 3) % 900 + 10 for i in range(num_tokens)]
    return bench_request(request_id, prompt, max_tokens, kv_transfer_params=dict(params) or None)


def without_timings(value: Any) -> Any:
    """``value`` without the ``*_seconds`` entries: timings differ from run to run."""
    if isinstance(value, dict):
        return {
            k: without_timings(v)
            for k, v in value.items()
            if not (isinstance(k, str) and k.endswith("_seconds"))
        }
    return value


def child_stats(payload: Any, ours: bool) -> Any:
    """Each child's own stats payload, by its key (ours: its name; vLLM's: its class)."""
    if payload is None:
        return None
    if ours:  # the documented difference: each child's stats under "stats", with its source
        payload = {name: entry["stats"] for name, entry in payload.items()}
    return without_timings(payload)


def comparable(value: Any) -> Any:
    """A child's connector metadata as plain, comparable data (tensors as lists).

    Floats are clock readings (NixlConnector's scheduler clock and expiry times): kept as
    their type only.
    """
    if isinstance(value, float):
        return float
    if isinstance(value, torch.Tensor | np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [comparable(v) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(map(repr, value))
    if hasattr(value, "__dict__"):
        return (type(value).__name__, comparable(vars(value)))
    return value


@dataclass
class Trace:
    scheduled: list[dict[str, int]] = field(default_factory=list)
    finished: list[dict[str, Any]] = field(default_factory=list)
    held: list[list[str]] = field(default_factory=list)
    metadata: list[list[Any]] = field(default_factory=list)
    stats: list[Any] = field(default_factory=list)


def drive(
    config: Any,
    requests: list[Callable[[], Request]],
    *,
    steps: int,
    ours: bool,
    reports: Reports | None = None,
    worker: bool = False,
    kv_cache_config: Any = None,
    setup: Callable[[Any], None] | None = None,
) -> Trace:
    """Run ``steps`` engine steps; ``reports(step)`` is the workers' aggregated report.

    ``setup(connector)`` runs on the scheduler's connector before the requests arrive.
    """
    scheduler = make_scheduler(config, kv_cache_config=kv_cache_config)
    connector = scheduler.connector
    assert isinstance(connector, MultiConnector if ours else VllmMultiConnector)
    if setup is not None:
        setup(connector)
    on_worker = make_connector(config, KVConnectorRole.WORKER) if worker else None
    for make in requests:
        scheduler.add_request(make())
    trace = Trace()
    for step in range(steps):
        output = scheduler.schedule()
        meta = output.kv_connector_metadata
        children = list(meta.children.values()) if ours else list(meta.metadata)
        trace.metadata.append([comparable(m) for m in children])
        kv_output = reports(step) if reports else None
        if on_worker is not None:
            shipped = pickle.loads(pickle.dumps(output))
            on_worker.bind_connector_metadata(shipped.kv_connector_metadata)
            on_worker.wait_for_save()
            results = on_worker.get_transfer_results(shipped.finished_req_ids)
            kv_output = KVConnectorOutput(
                finished_sending=results.finished_sending or None,
                finished_recving=results.finished_recving or None,
                kv_connector_worker_meta=on_worker.build_connector_worker_meta(),
            )
            on_worker.clear_connector_metadata()
        engine_outputs = scheduler.update_from_output(output, runner_output(output, kv_output))
        trace.scheduled.append(dict(output.num_scheduled_tokens))
        trace.finished.append(
            {
                o.request_id: (o.finish_reason, o.kv_transfer_params)
                for outputs in engine_outputs.values()
                for o in outputs.outputs
                if o.finish_reason is not None
            }
        )
        trace.held.append(sorted(scheduler.requests))
        trace.stats.append(
            [
                child_stats(o.scheduler_stats.kv_connector_stats, ours)
                for o in engine_outputs.values()
                if o.scheduler_stats is not None
            ]
        )
    return trace


def differential(run: Callable[[bool], Trace]) -> Trace:
    ours, theirs = run(True), run(False)
    assert ours.scheduled == theirs.scheduled
    assert ours.finished == theirs.finished
    assert ours.held == theirs.held
    assert ours.metadata == theirs.metadata
    assert ours.stats == theirs.stats
    return ours


# -- the children -------------------------------------------------------------------------------


def example(storage: Path) -> dict[str, Any]:
    return {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(storage)},
    }


NIXL_PRODUCER = {"kv_connector": "NixlConnector", "kv_role": "kv_producer"}
OFFLOADING = {
    "kv_connector": "OffloadingConnector",
    "kv_role": "kv_both",
    "kv_connector_extra_config": {"block_size": 32, "cpu_bytes_to_use": 1 << 20},
}
DECODE_BENCH = {"kv_connector": "DecodeBenchConnector", "kv_role": "kv_both"}


def seed_example_hit(prompt: list[int], tokens: int) -> Callable[[Any], None]:
    """A setup that makes ExampleConnector find ``tokens`` of ``prompt`` on its disk."""

    def setup(connector: Any) -> None:
        (disk,) = connector.sub_connectors  # vLLM's API, which ours has too
        disk._generate_foldername_debug(torch.tensor(prompt[:tokens]), [], create_folder=True)

    return setup


# -- the differential runs ----------------------------------------------------------------------


def test_example_connector_with_a_cache_hit_on_disk(model: Path, tmp_path: Path) -> None:
    def run(ours: bool) -> Trace:
        storage = tmp_path / ("ours" if ours else "vllm")  # each run its own disk
        hit = request("hit", num_tokens=40, max_tokens=3)
        config = builtin_config(model, [example(storage)], ours=ours)
        return drive(
            config,
            [lambda: request("miss", num_tokens=24, max_tokens=3), lambda: hit],
            steps=4,
            ours=ours,
            worker=True,
            setup=seed_example_hit(hit.prompt_token_ids, 32),
        )

    trace = differential(run)
    assert trace.scheduled[0] == {"miss": 24, "hit": 40 - 32}, "the hit was not loaded"


def test_offloading_connector_scheduler_side(model: Path) -> None:
    def run(ours: bool) -> Trace:
        config = builtin_config(model, [OFFLOADING], ours=ours)
        return drive(
            config,
            [
                lambda: request("a", num_tokens=64, max_tokens=2),
                lambda: request("b", num_tokens=40, max_tokens=1),
            ],
            steps=5,
            ours=ours,
        )

    trace = differential(run)
    assert any(trace.stats), "the offloading child reported no stats"


def test_nixl_producer_holds_blocks_until_finished_sending(model: Path) -> None:
    def reports(step: int) -> KVConnectorOutput | None:
        return KVConnectorOutput(finished_sending={"r1"}) if step == 2 else None

    def run(ours: bool) -> Trace:
        config = builtin_config(model, [NIXL_PRODUCER], ours=ours, kv_role="kv_producer")
        return drive(
            config,
            [lambda: request("r1", do_remote_decode=True), lambda: request("r2")],
            steps=4,
            ours=ours,
            reports=reports,
        )

    trace = differential(run)
    (_, params) = trace.finished[0]["r1"]
    assert params["do_remote_prefill"] is True and params["remote_engine_id"] == "engine-0"
    assert trace.held[:3] == [["r1"], ["r1"], []], "r1 freed before NIXL finished sending"


def test_decode_bench_connector(model: Path) -> None:
    def run(ours: bool) -> Trace:
        config = builtin_config(model, [DECODE_BENCH], ours=ours)
        return drive(
            config, [lambda: request("r1", num_tokens=40, max_tokens=2)], steps=3, ours=ours
        )

    trace = differential(run)
    assert trace.scheduled[0] == {"r1": 1}, "the prompt was not filled by the connector"


def test_nixl_offloading_and_decode_bench_together(model: Path) -> None:
    def reports(step: int) -> KVConnectorOutput | None:
        return KVConnectorOutput(finished_sending={"r1"}) if step == 1 else None

    def run(ours: bool) -> Trace:
        children = [NIXL_PRODUCER, OFFLOADING, DECODE_BENCH]
        config = builtin_config(model, children, ours=ours, kv_role="kv_producer")
        return drive(
            config,
            [lambda: request("r1", do_remote_decode=True), lambda: request("r2", max_tokens=2)],
            steps=4,
            ours=ours,
            reports=reports,
        )

    differential(run)


def test_hma_with_a_hybrid_kv_cache_under_the_scheduler(model: Path) -> None:
    """HMA enabled, two KV cache groups: params carry every group's blocks, as vLLM's do."""

    def reports(step: int) -> KVConnectorOutput | None:
        return KVConnectorOutput(finished_sending={"r1"}) if step == 2 else None

    def run(ours: bool) -> Trace:
        children = [NIXL_PRODUCER, DECODE_BENCH]
        config = builtin_config(model, children, ours=ours, kv_role="kv_producer", hma=True)
        return drive(
            config,
            [lambda: request("r1", num_tokens=40, do_remote_decode=True)],
            steps=4,
            ours=ours,
            reports=reports,
            kv_cache_config=make_hybrid_kv_cache_config(),
        )

    trace = differential(run)
    params = next(finished["r1"][1] for finished in trace.finished if "r1" in finished)
    assert len(params["remote_block_ids"]) == 2, "not every group's blocks"

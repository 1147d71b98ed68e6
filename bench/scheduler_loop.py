"""The headline row: the connector's cost in vLLM's real v1 scheduler loop.

``requests`` requests of 32 prompt tokens and 4 output tokens through vLLM's ``Scheduler`` (the
tiny OPT config of ``tests/adapter/vllm_harness.py``, CPU), each engine step as vLLM's engine
core and model runner drive it: ``schedule()``; the scheduler output pickled and unpickled (how
a multi-process executor ships it to its workers); on the worker-role connector
``bind_connector_metadata``, ``start_load_kv``, ``wait_for_layer_load`` and ``save_kv_layer``
for each of the model's two layers, ``wait_for_save``, ``get_transfer_results``,
``get_block_ids_with_load_errors``, ``get_kv_connector_stats``,
``get_kv_connector_kv_cache_events``, ``build_connector_worker_meta``,
``clear_connector_metadata``; then ``update_from_output()``. The three trivial children of
:mod:`bench.trivial_children` save every finished request asynchronously and report each finished id
as sent once, at the step where the workers learn it finished (``finished_req_ids``).

Through vLLM's ``MultiConnector`` and through ours, each configured as a user would: vLLM's
documented configuration, and the same plus ``kv_connector_module_path="multiconnector.vllm"``.
One scheduler and one worker-role connector per contender, built once; each repeat adds fresh
requests (fresh ids and prompts) and steps until the scheduler holds nothing. The contenders
run interleaved, the order alternating from repeat to repeat; the figure is per request.

Imported only when vLLM and the adapter are importable.
"""

from __future__ import annotations

import gc
import logging
import os
import pickle
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is a local folder: never ask a hub

from vllm.config import (
    KVTransferConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request

from . import trivial_children
from .common import NAMES, Report, Row, Sizes, median, p90
from .scheduler_parts import (
    BLOCK,
    TINY_OPT,
    make_kv_cache_config,
    make_request,
    make_scheduler,
    make_vllm_config,
    runner_output,
    write_model,
)

logging.getLogger("vllm").setLevel(logging.ERROR)

PROMPT = 32
OUTPUT = 4
LAYERS = tuple(
    f"model.decoder.layers.{i}.self_attn.attn" for i in range(TINY_OPT["num_hidden_layers"])
)

#: The children as a vLLM user lists them (``multiconnector_name`` is read by ours only).
CHILDREN = [
    {
        "kv_connector": "TrivialChild",
        "kv_connector_module_path": "bench.trivial_children",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"key": key, "multiconnector_name": key},
    }
    for key in NAMES
]


def config(model: Path, ours: bool, max_num_seqs: int, max_num_batched_tokens: int) -> VllmConfig:
    transfer = KVTransferConfig(
        kv_connector="MultiConnector",
        kv_connector_module_path="multiconnector.vllm" if ours else None,
        kv_role="kv_both",
        kv_connector_extra_config={"connectors": CHILDREN},
    )
    return make_vllm_config(
        model,
        transfer,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
    )


class Loop:
    """One contender: a real scheduler and a worker-role connector, stepped to empty."""

    def __init__(self, vllm_config: VllmConfig, num_blocks: int) -> None:
        self.scheduler = make_scheduler(vllm_config, num_blocks, make_kv_cache_config(num_blocks))
        self.worker = KVConnectorFactory.create_connector(
            vllm_config, KVConnectorRole.WORKER, make_kv_cache_config(num_blocks)
        )
        self.finished = 0
        self.steps = 0

    def run(self, requests: list[Request]) -> None:
        scheduler, worker = self.scheduler, self.worker
        for request in requests:
            scheduler.add_request(request)
        while scheduler.has_requests():
            output = scheduler.schedule()
            shipped = pickle.loads(pickle.dumps(output))  # as a multi-process executor ships it
            worker.bind_connector_metadata(shipped.kv_connector_metadata)
            worker.start_load_kv(None)
            for layer in LAYERS:
                worker.wait_for_layer_load(layer)
                worker.save_kv_layer(layer, None, None)
            worker.wait_for_save()
            trivial_children.OUTBOX = shipped.finished_req_ids  # each finished id, sent once
            results = worker.get_transfer_results(shipped.finished_req_ids)
            trivial_children.OUTBOX = set()
            kv_output = KVConnectorOutput(
                finished_sending=results.finished_sending,
                finished_recving=results.finished_recving,
                failed_recving=results.failed_recving,
                invalid_block_ids=worker.get_block_ids_with_load_errors(),
                kv_connector_stats=worker.get_kv_connector_stats(),
                kv_cache_events=worker.get_kv_connector_kv_cache_events(),
                kv_connector_worker_meta=worker.build_connector_worker_meta(),
            )
            worker.clear_connector_metadata()
            scheduler.update_from_output(output, runner_output(output, kv_output))
            self.finished += len(results.finished_sending)
            self.steps += 1


def make_requests(tag: str, n: int, rng: random.Random) -> list[Request]:
    return [
        make_request(
            f"{tag}-{i}",
            [rng.randrange(10, 990) for _ in range(PROMPT)],
            OUTPUT,
            ignore_eos=True,
        )
        for i in range(n)
    ]


#: A regression guard, not a target: today's figure (about 1.23, since the scheduler's saves are
#: on the core's books: docs/bench.md, "The scheduler's saves on the core's books") plus a
#: margin. The performance headline is the engine row (bench/engine_row.py); docs/bench.md says
#: why.
LOOP_GUARD = 1.30

#: (label, max_num_seqs, max_num_batched_tokens): the harness's config, then batches that fill
#: max_num_seqs (every request's prompt fits the token budget of one step).
SHAPES = (
    ("16 seqs, 64 tokens/step", 16, 64),
    ("full batches of 128", 128, 128 * PROMPT),
)


def measure(
    shape: tuple[str, int, int], requests: int, repeats: int, model: Path
) -> dict[str, list[float]]:
    """Seconds per request of each contender, one entry per repeat, interleaved."""
    _, seqs, tokens = shape
    blocks = 4 * requests * ((PROMPT + OUTPUT) // BLOCK + 1) + 64
    loops = {
        "vllm": Loop(config(model, False, seqs, tokens), blocks),
        "ours": Loop(config(model, True, seqs, tokens), blocks),
    }
    # vLLM and torch make a large heap: set it aside, so the collection before each timed run
    # walks only what the runs made.
    gc.collect()
    gc.freeze()
    rng = random.Random(17)
    times: dict[str, list[float]] = {who: [] for who in loops}
    order = list(loops)
    for repeat in range(-1, repeats):  # repeat -1 warms up, untimed
        for who in order:
            loop = loops[who]
            batch = make_requests(f"{who}{repeat}", requests, rng)
            before = loop.finished
            seconds = cpu_timed(_runner(loop, batch))
            assert loop.finished - before == requests, (who, loop.finished - before)
            assert not loop.scheduler.requests, who
            if repeat >= 0:
                times[who].append(seconds / requests)
        order.reverse()
    gc.unfreeze()
    ours = loops["ours"]
    assert len(ours.scheduler.connector.tracker) == 0, "the scheduler must release every request"
    assert len(ours.worker.ledger) == 0, "the worker must release every request"
    return times


def cpu_timed(fn: Callable[[], object]) -> float:
    """CPU seconds this thread spent in ``fn``, with the collector off (garbage collected before).

    CPU time, not wall time: on a small machine shared with other work, a 50 ms run is
    descheduled often, and wall time then measures the neighbours. The loop is single-threaded.
    """
    gc.collect()
    gc.disable()
    try:
        start = time.thread_time()
        fn()
        return time.thread_time() - start
    finally:
        gc.enable()


def _runner(loop: Loop, batch: list[Request]) -> Callable[[], None]:
    return lambda: loop.run(batch)


def quartiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    n = len(ordered)
    return ordered[n // 4], ordered[min(n - 1, (3 * n) // 4)]


def bench(sizes: Sizes, report: Report) -> None:
    with tempfile.TemporaryDirectory() as folder:
        model = write_model(Path(folder) / "tiny-opt")
        figures: dict[str, Any] = {}
        for index, shape in enumerate(SHAPES):
            times = measure(shape, sizes.loop_requests, sizes.loop_repeats, model)
            ratios = [o / v for o, v in zip(times["ours"], times["vllm"], strict=True)]
            label = shape[0]
            entry: dict[str, Any] = {}
            for who, name in (("vllm", "vLLM MultiConnector"), ("ours", "ours")):
                low, high = quartiles(times[who])
                report.rows.append(
                    Row(
                        f"scheduler loop, {label}: {name} (IQR {low * 1e6:.0f}-"
                        f"{high * 1e6:.0f} µs)",
                        median(times[who]) * 1e6,
                        p90(times[who]) * 1e6,
                        "µs",
                    )
                )
                entry[f"{who}_us"] = median(times[who]) * 1e6
                entry[f"{who}_iqr_us"] = [low * 1e6, high * 1e6]
            low, high = quartiles(ratios)
            headline = index == 0
            report.rows.append(
                Row(
                    f"scheduler loop ratio, {label}: ours ÷ vLLM (IQR {low:.3f}-{high:.3f})",
                    median(ratios),
                    p90(ratios),
                    "x",
                    f"≤ {LOOP_GUARD:g}" if headline else "",
                    (median(ratios) <= LOOP_GUARD) if headline else None,
                )
            )
            entry["ratio"] = median(ratios)
            entry["ratio_iqr"] = [low, high]
            entry["requests"] = sizes.loop_requests
            entry["repeats"] = sizes.loop_repeats
            figures[label] = entry
            if headline:
                report.figures["scheduler_loop_ratio_vs_real_vllm"] = median(ratios)
            else:
                report.figures["scheduler_loop_ratio_vs_real_vllm_full_batches"] = median(ratios)
        report.figures["scheduler_loop"] = figures

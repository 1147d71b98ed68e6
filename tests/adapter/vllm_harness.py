"""vLLM's real v1 Scheduler on the CPU, driven the way its model runner would drive it.

The model is a local folder holding only a tiny OPT ``config.json``; the scheduler side needs
nothing else. The worker side (per-layer load and save) needs a GPU model runner, so
:class:`Engine` plays the runner's part for the connector: it binds each step's metadata (after a
pickle round trip, as vLLM ships it to workers), asks for transfer results and hands them back.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from vllm.config import (
    KVTransferConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from vllm.v1.outputs import KVConnectorOutput
from vllm.v1.request import Request

# The scheduler, the model folder and a step's output: the same pieces as the benchmarks'.
from bench.scheduler_parts import (
    BLOCK,
    EOS,
    connector_output,
    make_kv_cache_config,
    make_scheduler,
    make_vllm_config,
    runner_output,
    write_model,
)
from bench.scheduler_parts import make_request as bench_request

OURS = ("MultiConnector", "multiconnector.vllm")
THEIRS = ("MultiConnector", None)

__all__ = [
    "BLOCK",
    "EOS",
    "OURS",
    "THEIRS",
    "Engine",
    "Workers",
    "builtin_config",
    "connector_output",
    "implemented",
    "make_config",
    "make_connector",
    "make_hybrid_kv_cache_config",
    "make_kv_cache_config",
    "make_request",
    "make_scheduler",
    "runner_output",
    "worker_output",
    "write_model",
]


init_none_hash(sha256)


def implemented(cls: type[Any]) -> set[str]:
    """The names ``cls`` defines, itself or in its bases from this package (the connector's role
    mixins and their common base), as against those it inherits from vLLM's classes."""
    return {
        name
        for klass in cls.__mro__
        if klass.__module__.startswith("multiconnector.")
        for name in vars(klass)
    }


def make_config(
    model: Path,
    children: list[dict[str, Any]],
    *,
    ours: bool = True,
    kv_role: str = "kv_both",
    extra: dict[str, Any] | None = None,
    tokens_per_step: int = 64,
) -> VllmConfig:
    """A VllmConfig whose connector is ours or vLLM's MultiConnector over ``children`` (and
    ``extra`` beside them in ``kv_connector_extra_config``), scheduling at most
    ``tokens_per_step`` tokens a step."""
    connector, module = OURS if ours else THEIRS
    transfer = KVTransferConfig(
        kv_connector=connector,
        kv_connector_module_path=module,
        kv_role=kv_role,
        kv_connector_extra_config={"connectors": children, **(extra or {})},
    )
    return make_vllm_config(model, transfer, max_num_batched_tokens=tokens_per_step)


def make_connector(config: VllmConfig, role: KVConnectorRole) -> Any:
    """The connector vLLM's factory builds for ``role``, loaded as configured."""
    return KVConnectorFactory.create_connector(config, role, make_kv_cache_config())


def make_request(request_id: str, num_tokens: int = 40, max_tokens: int = 1) -> Request:
    """A request whose prompt is made from its id's length (two ids of one length: one prompt)."""
    prompt = [(7 * i + len(request_id)) % 900 + 10 for i in range(num_tokens)]
    return bench_request(request_id, prompt, max_tokens)


class Engine:
    """A scheduler plus, optionally, one worker-role connector standing in for the workers."""

    def __init__(self, config: VllmConfig, *, worker: bool = True) -> None:
        self.config = config
        self.scheduler = make_scheduler(config)
        self.worker = make_connector(config, KVConnectorRole.WORKER) if worker else None
        self.outputs: dict[str, Any] = {}
        self.scheduled: list[dict[str, int]] = []

    @property
    def connector(self) -> Any:
        return self.scheduler.connector

    def add(self, request: Request) -> Request:
        self.scheduler.add_request(request)
        return request

    def step(self, token: int = 7) -> Any:
        """One engine step: schedule, run the worker connector, update from the output."""
        scheduler_output = self.scheduler.schedule()
        self.scheduled.append(dict(scheduler_output.num_scheduled_tokens))
        kv_output = None
        if self.worker is not None:
            shipped = pickle.loads(pickle.dumps(scheduler_output))  # how workers receive it
            worker = self.worker
            worker.bind_connector_metadata(shipped.kv_connector_metadata)
            worker.wait_for_save()
            kv_output = worker_output(worker, shipped.finished_req_ids)
            worker.clear_connector_metadata()
        engine_outputs = self.scheduler.update_from_output(
            scheduler_output, runner_output(scheduler_output, kv_output, token)
        )
        for outputs in engine_outputs.values():
            for output in outputs.outputs:
                if output.finish_reason is not None:
                    self.outputs[output.request_id] = output
        return engine_outputs

    def held(self, request_id: str) -> bool:
        """Whether the scheduler still holds the request (its blocks are not freed)."""
        return request_id in self.scheduler.requests


class Workers:
    """vLLM's scheduler over ``n`` worker connectors, their outputs aggregated as vLLM's engine
    core does (``KVOutputAggregator.from_connector``), with ``policy`` as the load failure
    policy. The model runner here samples a token for every scheduled request, a partial
    prefill's too: give ``tokens_per_step`` room for every prompt a test computes at once."""

    def __init__(
        self,
        model: Path,
        n: int,
        children: list[dict[str, Any]],
        *,
        policy: str = "recompute",
        tokens_per_step: int = 64,
        **extra: Any,
    ) -> None:
        config = make_config(model, children, extra=extra, tokens_per_step=tokens_per_step)
        config.parallel_config.world_size = n
        assert config.kv_transfer_config is not None
        config.kv_transfer_config.kv_load_failure_policy = policy  # type: ignore[assignment]
        self.engine = Engine(config, worker=False)
        self.workers = [make_connector(config, KVConnectorRole.WORKER) for _ in range(n)]
        self.aggregator = KVOutputAggregator.from_connector(self.engine.connector, n)
        self.scheduled: list[dict[str, int]] = []
        #: What reached vLLM as finished sending, step by step.
        self.sent_to_vllm: list[set[str]] = []
        #: The block ids that reached vLLM as load errors (``invalid_block_ids``), step by step.
        self.invalid_to_vllm: list[set[int]] = []
        #: The finished requests' outputs, by request id.
        self.outputs: dict[str, Any] = {}

    def step(self, before_worker: Callable[[int], None] | None = None) -> None:
        """One step; ``before_worker(rank)`` runs before each worker's get_transfer_results."""
        scheduler = self.engine.scheduler
        output = scheduler.schedule()
        self.scheduled.append(dict(output.num_scheduled_tokens))
        outputs = []
        for rank, worker in enumerate(self.workers):
            shipped = pickle.loads(pickle.dumps(output))
            worker.bind_connector_metadata(shipped.kv_connector_metadata)
            worker.start_load_kv(None)
            worker.wait_for_save()
            if before_worker is not None:
                before_worker(rank)
            kv_output = worker_output(worker, shipped.finished_req_ids)
            worker.clear_connector_metadata()
            outputs.append(runner_output(output, kv_output))
        aggregated = self.aggregator.aggregate(outputs)
        engine_outputs = scheduler.update_from_output(output, aggregated)
        self.sent_to_vllm.append(set(aggregated.kv_connector_output.finished_sending or ()))
        self.invalid_to_vllm.append(set(aggregated.kv_connector_output.invalid_block_ids))
        for per_client in engine_outputs.values():
            for out in per_client.outputs:
                if out.finish_reason is not None:
                    self.outputs[out.request_id] = out

    def computed_for(self, request_id: str) -> int:
        """The tokens scheduled for ``request_id`` over every step."""
        return sum(step.get(request_id, 0) for step in self.scheduled)


def make_hybrid_kv_cache_config(num_blocks: int = 64) -> KVCacheConfig:
    """Two KV cache groups, full attention and sliding window: what HMA allocates for."""
    full = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    window = SlidingWindowSpec(
        block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32, sliding_window=32
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["full"], full), KVCacheGroupSpec(["window"], window)],
    )


def builtin_config(
    model: Path,
    children: list[dict[str, Any]],
    *,
    ours: bool,
    kv_role: str = "kv_both",
    hma: bool = False,
) -> VllmConfig:
    """A VllmConfig over vLLM's built-in ``children``, in vLLM's own form, for either class.

    The engine id is fixed, so transfer params that carry it compare equal across runs. With
    ``hma`` the hybrid memory allocator is enabled after vLLM's post-init, which disables it on
    a CPU platform.
    """
    config = make_config(model, children, ours=ours, kv_role=kv_role)
    assert config.kv_transfer_config is not None
    config.kv_transfer_config.engine_id = "engine-0"
    if hma:
        config.scheduler_config.disable_hybrid_kv_cache_manager = False
    return config


def worker_output(worker: Any, finished_req_ids: Any, *, extra: Any = None) -> KVConnectorOutput:
    """A worker connector's part of a step's output: its transfer results, its load errors
    and its metadata (as vLLM's model runner gathers them),
    with ``extra`` worker metadata aggregated into it when given."""
    results = worker.get_transfer_results(finished_req_ids)
    meta = worker.build_connector_worker_meta()
    if extra is not None:
        meta = extra if meta is None else meta.aggregate(extra)
    return KVConnectorOutput(
        finished_sending=results.finished_sending or None,
        finished_recving=results.finished_recving or None,
        failed_recving=results.failed_recving,
        invalid_block_ids=worker.get_block_ids_with_load_errors(),
        kv_connector_worker_meta=meta,
    )

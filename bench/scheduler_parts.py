"""vLLM's real v1 ``Scheduler`` on the CPU, for the scheduler-loop row: a tiny OPT model folder
(only its ``config.json``: the scheduler side needs nothing else), the engine config, a
request, the KV cache config, the scheduler, and what the model runner returns for a step.

The adapter's tests use these too (``tests/adapter/vllm_harness.py`` imports them): ``bench``
imports nothing from ``tests``. Every vLLM object the tests and the benchmarks build by hand is
built here, so a field a vLLM release adds or removes is one edit (vLLM 0.34 removed
``ModelRunnerOutput.req_id_to_index``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from vllm import SamplingParams
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

BLOCK = 16
EOS = 2

TINY_OPT: dict[str, Any] = {
    "architectures": ["OPTForCausalLM"],
    "model_type": "opt",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "ffn_dim": 128,
    "vocab_size": 1000,
    "max_position_embeddings": 512,
    "word_embed_proj_dim": 64,
    "do_layer_norm_before": True,
    "torch_dtype": "float32",
}

init_none_hash(sha256)


def write_model(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_OPT))
    return folder


def make_vllm_config(
    model: Path,
    transfer: KVTransferConfig,
    *,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 64,
) -> VllmConfig:
    """The engine config of a scheduler on the CPU over the model folder ``model``, with the
    connector ``transfer``: chunked prefill, prefix caching, blocks of :data:`BLOCK` tokens."""
    return VllmConfig(
        model_config=ModelConfig(model=str(model), skip_tokenizer_init=True),
        scheduler_config=SchedulerConfig(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=512,
            enable_chunked_prefill=True,
            is_encoder_decoder=False,
        ),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True),
        kv_transfer_config=transfer,
        device_config=DeviceConfig("cpu"),
    )


def make_request(
    request_id: str,
    prompt: list[int],
    max_tokens: int,
    *,
    ignore_eos: bool = False,
    kv_transfer_params: dict[str, Any] | None = None,
) -> Request:
    """A request as vLLM's front end hands it to the scheduler: ``prompt``'s tokens, at most
    ``max_tokens`` sampled, its blocks hashed for the prefix cache, and the
    ``kv_transfer_params`` a client sent, if any."""
    extra = None if kv_transfer_params is None else {"kv_transfer_params": kv_transfer_params}
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=ignore_eos, extra_args=extra)
    params.update_from_generation_config({}, EOS)
    return Request(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling_params=params,
        pooling_params=None,
        block_hasher=get_request_block_hasher(BLOCK, sha256),
    )


def make_kv_cache_config(num_blocks: int = 64) -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=BLOCK, num_kv_heads=1, head_size=1, dtype=torch.float32)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)],
    )


def make_scheduler(
    config: VllmConfig, num_blocks: int = 64, kv_cache_config: KVCacheConfig | None = None
) -> Scheduler:
    config.cache_config.num_gpu_blocks = num_blocks
    return Scheduler(
        vllm_config=config,
        kv_cache_config=kv_cache_config or make_kv_cache_config(num_blocks),
        log_stats=True,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
    )


# vLLM 0.34 removed ``ModelRunnerOutput.req_id_to_index`` (the scheduler reads ``req_ids``
# only). Every vLLM object a test or a benchmark builds by hand is built in this module, so a
# field vLLM adds or removes is one edit here; this set says which fields the installed vLLM has.
_RUNNER_FIELDS = frozenset(f.name for f in dataclasses.fields(ModelRunnerOutput))


def model_runner_output(
    req_ids: list[str], kv_output: KVConnectorOutput | None, token: int = 7
) -> ModelRunnerOutput:
    """What the model runner returns for a step that ran ``req_ids``: ``token`` sampled for each,
    and ``kv_output`` (the workers' connector output), in the installed vLLM's fields."""
    fields: dict[str, Any] = {
        "req_ids": list(req_ids),
        "sampled_token_ids": [[token] for _ in req_ids],
        "kv_connector_output": kv_output,
    }
    if "req_id_to_index" in _RUNNER_FIELDS:  # vLLM <= 0.33
        fields["req_id_to_index"] = {rid: i for i, rid in enumerate(req_ids)}
    return ModelRunnerOutput(**fields)


def runner_output(
    scheduler_output: Any, kv_output: KVConnectorOutput | None, token: int = 7
) -> ModelRunnerOutput:
    """What the model runner returns for a step: ``token`` sampled for every scheduled request."""
    return model_runner_output(list(scheduler_output.num_scheduled_tokens), kv_output, token)


def connector_output(kv_output: KVConnectorOutput | None) -> ModelRunnerOutput:
    """A step's output that ran no request and carries only the workers' connector output."""
    return model_runner_output([], kv_output)

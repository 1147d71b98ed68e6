"""A child connector for the engine tests that keeps KV per block, so it answers any prefix.

vLLM's ``ExampleConnector`` keeps one entry per whole prompt (its block-aligned part): it answers
all of a prompt or nothing. :class:`BlockStoreConnector` keeps one entry per block instead, keyed
by a hash of the prompt's tokens up to that block's end, so it answers the longest run of stored
blocks from a prompt's start, and loads any block range. Two of them over one prompt can hold
prefixes of different lengths: what ``lookup: longest`` chooses between.

vLLM loads it by module path (``kv_connector_module_path="bench.block_children"``; the
repository's root is on ``sys.path`` in the engine's processes, as for
:mod:`bench.engine_children`): the engine tests and ``make bench``'s tiered row use it. The
tests run the engine in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the counters below
are read in the test's process.

Extra config keys (each child's own ``kv_connector_extra_config``):

- ``shared_storage_path``: the folder of its entries (one folder per block, one file per layer,
  and a ``complete`` marker written once every layer's file is);
- ``label``: the key of its counters in :data:`CALLS`, :data:`FINISHED` and :data:`ANSWERS`;
- ``max_blocks``: keep only a prompt's first ``max_blocks`` blocks (a tier with less room):
  it then answers at most that many blocks of a prompt;
- ``fail_loads``: raise in ``start_load_kv`` whenever it has blocks to load (a tier whose
  reads fail);
- ``never_knows``: answer every lookup ``None`` ("ask me again"), for ever (a tier whose
  lookups never finish).

A label in :data:`DOWN` raises in every lookup while it is there (a store that is down, then
back: the health machine's tests); one in :data:`NO_ALLOC` raises in ``update_state_after_alloc``
when told tokens to load (a store that answers lookups but cannot take a load: the failover
tests).

It loads token ranges (``update_state_after_alloc_range``), so a load may be split across it
and another such child (``split_loads``): asked from a ``num_computed_tokens`` past the
request's, it answers the stored blocks from there on, and loads the range it is told.
"""

# vLLM is imported at the top: only the engine environment imports this module.

from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import safetensors.torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)

#: Per label, how many times each hook was called (both roles: the engine is in-process).
#: ``loaded_blocks`` and ``stored_blocks`` count the blocks the worker side read and wrote.
CALLS: dict[str, Counter[str]] = {}
#: Per label, the request ids ``request_finished`` was called with, in order.
FINISHED: dict[str, list[str]] = {}
#: Per label, each ``get_num_new_matched_tokens`` answer: (request id, tokens).
ANSWERS: dict[str, list[tuple[str, int]]] = {}

#: The labels whose lookups raise (a store that is down), until removed.
DOWN: set[str] = set()
#: The labels that raise when told tokens to load, until removed.
NO_ALLOC: set[str] = set()

MARKER = "complete"


def reset() -> None:
    """Forget every counter (a test starts from none)."""
    CALLS.clear()
    FINISHED.clear()
    ANSWERS.clear()
    DOWN.clear()
    NO_ALLOC.clear()


def block_key(token_ids: list[int], end: int) -> str:
    """The key of the block that ends at token ``end``: a hash of every token before it."""
    data = b",".join(str(t).encode() for t in token_ids[:end])
    return hashlib.sha256(data).hexdigest()


@dataclass
class BlockMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """One step's work: (block id in vLLM's KV cache, entry key) to load, and to store."""

    loads: list[tuple[int, str]] = field(default_factory=list)
    stores: list[tuple[int, str]] = field(default_factory=list)


class BlockStoreConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """Saves every full prompt block it does not hold yet; answers the longest stored prefix.

    Scheduler: ``get_num_new_matched_tokens`` counts the stored blocks from the prompt's start
    (keeping the prompt's last token to compute, as vLLM wants) beyond the tokens computed
    locally; ``build_connector_meta`` names the blocks to load (the external tokens vLLM
    granted, right after the local ones) and those to store. Worker: ``start_load_kv`` copies
    each entry's per-layer block into vLLM's cache, ``save_kv_layer`` writes each block to be
    stored, ``wait_for_save`` marks the entries complete. Loads are synchronous.
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._storage = str(extra["shared_storage_path"])
        self._label = str(extra.get("label", "child"))
        cap = extra.get("max_blocks")
        self._max_blocks: int | None = None if cap is None else int(cap)
        self._block_size: int = vllm_config.cache_config.block_size
        self._fail_loads = bool(extra.get("fail_loads", False))
        self._never_knows = bool(extra.get("never_knows", False))
        self._need_load: dict[str, int] = {}
        self._need_range: dict[str, tuple[int, int]] = {}
        self._written: set[str] = set()  # worker: the entries this step wrote a layer of
        self._calls = CALLS.setdefault(self._label, Counter())
        self._finished = FINISHED.setdefault(self._label, [])
        self._answers = ANSWERS.setdefault(self._label, [])

    # -- storage -----------------------------------------------------------------------------

    def _folder(self, key: str) -> str:
        return os.path.join(self._storage, key)

    def _held(self, key: str) -> bool:
        return os.path.exists(os.path.join(self._folder(key), MARKER))

    def _keeps(self, block: int) -> bool:
        return self._max_blocks is None or block < self._max_blocks

    # -- scheduler ---------------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        self._calls["get_num_new_matched_tokens"] += 1
        if self._label in DOWN:
            raise OSError(f"{self._label}: its store is down")
        if self._never_knows:
            return None, False
        tokens = list(request.prompt_token_ids or [])
        size = self._block_size
        hit = 0
        # One token of the prompt is always left to compute: vLLM samples from it.
        while hit + size <= len(tokens) - 1 and self._held(block_key(tokens, hit + size)):
            hit += size
        answer = max(0, hit - num_computed_tokens)
        self._answers.append((request.request_id, answer))
        return answer, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._calls["update_state_after_alloc"] += 1
        if num_external_tokens > 0:
            self._calls["update_state_after_alloc.external"] += 1
            if self._label in NO_ALLOC:
                raise OSError(f"{self._label}: its store cannot take a load")
            self._need_load[request.request_id] = num_external_tokens

    def update_state_after_alloc_range(
        self, request: Any, blocks: Any, start: int, num_tokens: int
    ) -> None:
        self._calls["update_state_after_alloc_range"] += 1
        if num_tokens > 0:
            self._need_range[request.request_id] = (start, num_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = BlockMetadata()
        size = self._block_size
        for new in scheduler_output.scheduled_new_reqs:
            tokens = list(new.prompt_token_ids or [])
            block_ids = new.block_ids[0]
            computed = new.num_computed_tokens  # local and external
            external = self._need_load.pop(new.req_id, 0)
            start, count = self._need_range.pop(new.req_id, (computed - external, external))
            for block in range(start // size, (start + count) // size):
                meta.loads.append((block_ids[block], block_key(tokens, (block + 1) * size)))
            end = min(len(tokens), computed + scheduler_output.num_scheduled_tokens[new.req_id])
            for block in range(end // size):
                key = block_key(tokens, (block + 1) * size)
                if self._keeps(block) and not self._held(key):
                    meta.stores.append((block_ids[block], key))
        # A load granted to a request not scheduled as new (none in these tests) is dropped,
        # as ExampleConnector drops it: the tokens would then differ, and the test fail.
        self._need_load.clear()
        self._need_range.clear()
        return meta

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        self._calls["request_finished"] += 1
        self._finished.append(request.request_id)
        return False, None

    # -- worker ------------------------------------------------------------------------------

    def _metadata(self) -> BlockMetadata:
        metadata = self._get_connector_metadata()
        assert isinstance(metadata, BlockMetadata), type(metadata)
        return metadata

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._calls["start_load_kv"] += 1
        metadata = self._metadata()
        if forward_context.attn_metadata is None or not metadata.loads:
            return
        if self._fail_loads:
            self._calls["failed_loads"] += 1
            raise OSError(f"{self._label}: reading its blocks failed")
        for block_id, key in metadata.loads:
            for layer_name, layer in forward_context.no_compile_layers.items():
                kv_cache = getattr(layer, "kv_cache", None)
                if kv_cache is None:
                    continue
                path = os.path.join(self._folder(key), f"{layer_name}.safetensors")
                saved = safetensors.torch.load_file(path)["kv_cache"]
                kv_cache[block_id].copy_(saved.to(kv_cache.device))
            self._calls["loaded_blocks"] += 1

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._calls["wait_for_layer_load"] += 1

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        self._calls["save_kv_layer"] += 1
        for block_id, key in self._metadata().stores:
            os.makedirs(self._folder(key), exist_ok=True)
            block = kv_layer[block_id].detach().cpu().contiguous().clone()
            path = os.path.join(self._folder(key), f"{layer_name}.safetensors")
            safetensors.torch.save_file({"kv_cache": block}, path)
            self._written.add(key)

    def wait_for_save(self) -> None:
        self._calls["wait_for_save"] += 1
        for _, key in self._metadata().stores:
            if key not in self._written:
                continue  # no layer was saved: the entry stays incomplete, never answered
            with open(os.path.join(self._folder(key), MARKER), "w"):
                pass
            self._calls["stored_blocks"] += 1
        self._written.clear()


def held_blocks(storage: str | os.PathLike[str]) -> int:
    """How many complete block entries a child's storage holds."""
    if not os.path.isdir(storage):
        return 0
    return sum(
        1 for entry in os.scandir(storage) if os.path.exists(os.path.join(entry.path, MARKER))
    )

"""The three trivial vLLM child connectors of the vLLM rows (loaded by vLLM by module path).

Each one's scheduler-side ``request_finished`` answers ``(True, {its own key: 1})``; each
worker-side ``get_finished`` reports as sent every id the benchmark put in :data:`OUTBOX` for the
step. Nothing else does any work, so what is measured is the aggregating connector.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)

#: The ids every child reports as finished sending at the next ``get_finished``.
OUTBOX: set[str] = set()


class TrivialChild(KVConnectorBase_V1):  # type: ignore[misc]
    """Saves every request asynchronously; reports what :data:`OUTBOX` holds."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.key: str = self._kv_transfer_config.kv_connector_extra_config["key"]

    # scheduler side
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        return 0, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict[str, Any]]:
        return True, {self.key: 1}

    # worker side
    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        pass

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        pass

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, None]:
        return OUTBOX, None

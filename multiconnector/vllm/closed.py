"""What a shut-down vLLM-facing connector answers: :func:`close`.

vLLM may call the connector's hooks after its ``shutdown()``: it frees the requests still in
flight as it tears down (``request_finished``), and a step may still be running. The children
are shut down by then, and a child that shut down is never asked again: every hook of
:data:`NEUTRAL` answers its neutral answer, asking no child and raising nothing into vLLM
(``request_finished`` answers ``(False, None)``: nothing held, vLLM may free the blocks).

Two hooks keep what is owed moving, as the core drains after its own ``shutdown()``
(docs/concepts.md, "Shutting down"), without asking a child: ``update_connector_output`` still
applies the workers' reports to the scheduler's books (and hands back what they free), and
``build_connector_meta`` still tells the workers the news of the books, with no child's metadata.

The first hook called after shutdown is logged once, at DEBUG.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Final

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

from .wire import NamedMultiConnectorMetadata, Outbox

__all__ = ["NEUTRAL", "close"]

logger: Final = logging.getLogger("multiconnector")


def _none() -> None:
    return None


def _false() -> bool:
    return False


def _nothing_held() -> tuple[bool, None]:
    return False, None


#: Per hook, what it answers after shutdown (a new object each call: vLLM may change it).
NEUTRAL: Final[dict[str, Callable[[], Any]]] = {
    # the scheduler's
    "bind_kv_cache_manager": _none,
    "bind_gpu_block_pool": _none,
    "on_new_request": _none,
    "may_load_async": _false,
    "get_num_new_matched_tokens": lambda: (0, False),
    "get_loaded_kv_cache_group_ids": tuple,
    "get_external_cache_hit_sources": dict,
    "update_state_after_alloc": _none,
    "register_finished_partial_tail": _false,
    "request_finished": _nothing_held,
    "request_finished_all_groups": _nothing_held,
    "take_events": list,
    "has_pending_block_frees": _false,
    "has_pending_push_work": _false,
    "set_xfer_handshake_metadata": _none,
    "set_xfer_handshake_metadata_pp_aware": _none,
    # the worker's
    "bind_connector_metadata": _none,
    "clear_connector_metadata": _none,
    "get_mem_pool_context": _none,
    "register_kv_caches": _none,
    "unregister_kv_caches": _none,
    "restore_kv_caches": _none,
    "set_host_xfer_buffer_ops": _none,
    "finish_forward": _none,
    "reset_capture_state": _none,
    "handle_preemptions": _none,
    "start_load_kv": _none,
    "wait_for_layer_load": _none,
    "save_kv_layer": _none,
    "wait_for_save": _none,
    "get_finished": lambda: (None, None),
    "get_transfer_results": KVConnectorTransferResults,
    "get_block_ids_with_load_errors": set,
    "get_kv_connector_kv_cache_events": _none,
    "get_handshake_metadata": _none,
    "build_connector_worker_meta": _none,
    "get_finished_count": _none,
    # both roles': no child holds or serves a block any more, as after a reset
    "reset_cache": lambda: True,
    "get_kv_connector_stats": _none,
}


def close(connector: Any, names: Sequence[str], seal: Callable[[], Outbox] | None) -> None:
    """Make ``connector``, whose children (``names``) were shut down, answer every hook of
    :data:`NEUTRAL` neutrally; its ``build_connector_meta`` seals the scheduler's news
    (``seal``, when it has a scheduler's part) with no child's metadata."""
    role = connector.role.name
    logged = False

    def noted(hook: str, answer: Any) -> Any:
        nonlocal logged
        if not logged:
            logged = True
            logger.debug(
                "multiconnector (%s): %s called after shutdown: answered %r, no child asked "
                "(every hook is answered so after shutdown; logged once)",
                role,
                hook,
                answer,
            )
        return answer

    def neutral(hook: str, answer: Callable[[], Any]) -> Callable[..., Any]:
        def hook_after_shutdown(*_: Any, **__: Any) -> Any:
            return noted(hook, answer())

        hook_after_shutdown.__name__ = hook
        return hook_after_shutdown

    def build_connector_meta(_: Any) -> NamedMultiConnectorMetadata:
        outbox = seal() if seal is not None else Outbox({}, {})
        return noted(  # type: ignore[no-any-return]
            "build_connector_meta",
            NamedMultiConnectorMetadata.owning(dict.fromkeys(names), outbox),
        )

    for hook, answer in NEUTRAL.items():
        setattr(connector, hook, neutral(hook, answer))
    connector.build_connector_meta = build_connector_meta

"""Scripted vLLM child connectors, loaded by vLLM through this module's path.

A child's ``kv_connector_extra_config`` names a :class:`Script` registered in :data:`SCRIPTS`;
every instance built from it (scheduler and worker role, ours or vLLM's ``MultiConnector``)
shares that script, so a test sets answers and queues worker reports in one place.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorHandshakeMetadata,
    KVConnectorMetadata,
    KVConnectorTransferResults,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import LMCacheConnectorV1
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector import (
    MooncakeStoreConnector,
)

MODULE = __name__
SCRIPTS: dict[str, Script] = {}
_labels = itertools.count()


@dataclass
class Script:
    """What every connector built from one child config answers, and what it was asked."""

    label: str
    tokens: int | None = 0
    #: When set, the tokens held from the prompt's start: asked from ``num_computed_tokens``,
    #: the child answers what it holds past them (a child that loads token ranges).
    holds: int | None = None
    #: With ``holds``, the first token held: asked from before it, the child answers 0.
    holds_from: int = 0
    load_async: bool = False
    saves: bool = False
    params: dict[str, Any] | None = None
    stats: int | None = None
    tail: bool = False
    groups: tuple[int, ...] = (0,)
    handshake: str | None = None
    finished_count: int | None = None
    #: Events objects handed out by successive get_kv_connector_kv_cache_events calls.
    events: list[Any] = field(default_factory=list)
    init_error: Exception | None = None
    shutdown_error: Exception | None = None
    raise_in: dict[str, Exception] = field(default_factory=dict)
    # Worker reports, handed out by the next get_transfer_results.
    sending: set[str] = field(default_factory=set)
    recving: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    #: Block ids handed out by the next get_block_ids_with_load_errors of a child whose class
    #: implements it (:class:`ErrorsConnector`).
    load_errors: set[int] = field(default_factory=set)
    #: When set, the only requests whose prompt the child holds: asked about any other, it
    #: answers 0 tokens (each request is then loaded by the child meant to load it).
    only: frozenset[str] | None = None
    #: When set, what an :class:`ErrorsConnector` answers for the set of its load errors (a
    #: list of them, say: a child that does not answer a set, as vLLM's interface says).
    errors_as: Callable[[set[int]], Any] | None = None
    calls: list[tuple[Any, ...]] = field(default_factory=list)
    instances: list[ScriptedConnector] = field(default_factory=list)
    shutdowns: int = 0
    #: The hooks looked up on a :class:`WatchedConnector` after its shutdown().
    late: list[str] = field(default_factory=list)

    def names(self, method: str) -> list[tuple[Any, ...]]:
        return [call for call in self.calls if call[0] == method]


def script(**answers: Any) -> Script:
    """A new script under a fresh label."""
    made = Script(label=f"s{next(_labels)}", **answers)
    SCRIPTS[made.label] = made
    return made


def child(
    name: str | None, made: Script, kv_connector: str = "ScriptedConnector", **config: Any
) -> dict[str, Any]:
    """A child entry for ``kv_connector_extra_config['connectors']``, named ``name``.

    The name goes where vLLM's own config checks accept it, in the child's own extra config;
    vLLM's ``MultiConnector`` passes it on to the child, which ignores it.
    """
    extra: dict[str, Any] = {"script": made.label}
    if name is not None:
        extra["multiconnector_name"] = name
    return {
        "kv_connector": kv_connector,
        "kv_connector_module_path": MODULE,
        "kv_role": "kv_both",
        "kv_connector_extra_config": extra,
        **config,
    }


@dataclass
class ScriptedMetadata(KVConnectorMetadata):
    label: str = ""
    requests: list[str] = field(default_factory=list)


@dataclass
class ScriptedWorkerMetadata(KVConnectorWorkerMetadata):
    seen: list[str] = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        assert isinstance(other, ScriptedWorkerMetadata)
        return ScriptedWorkerMetadata([*self.seen, *other.seen])


@dataclass
class ScriptedHandshake(KVConnectorHandshakeMetadata):
    text: str = ""


@dataclass
class ScriptedStats(KVConnectorStats):
    def reset(self) -> None:
        self.data.clear()

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        self.data["count"] = self.data.get("count", 0) + other.data.get("count", 0)
        return self

    def reduce(self) -> dict[str, int | float]:
        return {"count": self.data.get("count", 0)}

    def is_empty(self) -> bool:
        return not self.data.get("count")


class ScriptedConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        label = self._kv_transfer_config.kv_connector_extra_config["script"]
        self.script = SCRIPTS[label]
        if self.script.init_error is not None:
            raise self.script.init_error
        self.script.instances.append(self)
        self.bound: list[Any] = []

    def _raise_if(self, method: str) -> None:
        """Raise what the script says ``method`` raises, recording no call."""
        error = self.script.raise_in.get(method)
        if error is not None:
            raise error

    def _call(self, method: str, *args: Any) -> None:
        self.script.calls.append((method, *args))
        error = self.script.raise_in.get(method)
        if error is not None:
            raise error

    # scheduler side
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        self._call("get_num_new_matched_tokens", request.request_id, num_computed_tokens)
        tokens = self.script.tokens
        if self.script.holds is not None:
            tokens = max(0, self.script.holds - num_computed_tokens)
            if num_computed_tokens < self.script.holds_from:
                tokens = 0
        if self.script.only is not None and request.request_id not in self.script.only:
            tokens = 0
        return tokens, bool(tokens) and self.script.load_async

    def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:
        return self.script.groups

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        self._call("update_state_after_alloc", request.request_id, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> ScriptedMetadata:
        self._call("build_connector_meta")
        return ScriptedMetadata(
            self.script.label, [r.req_id for r in scheduler_output.scheduled_new_reqs]
        )

    def request_finished(self, request: Any, block_ids: list[int]) -> Any:
        self._call("request_finished", request.request_id)
        return self.script.saves, self.script.params

    def register_finished_partial_tail(self, request: Any, block_ids: Any, tails: Any) -> bool:
        self._call("register_finished_partial_tail", request.request_id)
        return self.script.tail

    def on_new_request(self, request: Any) -> None:
        self._call("on_new_request", request.request_id)

    def update_connector_output(self, connector_output: Any) -> None:
        self._call("update_connector_output", connector_output.kv_connector_worker_meta)

    def take_events(self) -> Iterable[Any]:
        self._raise_if("take_events")
        return [f"event-{self.script.label}"]

    # worker side
    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        self.bound.append(connector_metadata)
        super().bind_connector_metadata(connector_metadata)
        self._raise_if("bind_connector_metadata")

    def clear_connector_metadata(self) -> None:
        self._call("clear_connector_metadata")
        super().clear_connector_metadata()

    def get_kv_connector_kv_cache_events(self) -> Any:
        self._call("get_kv_connector_kv_cache_events")
        return self.script.events.pop(0) if self.script.events else None

    def get_finished_count(self) -> Any:
        self._raise_if("get_finished_count")
        return self.script.finished_count

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        self._call("handle_preemptions", kv_connector_metadata)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._call("start_load_kv")

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._call("wait_for_layer_load", layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        self._call("save_kv_layer", layer_name)

    def wait_for_save(self) -> None:
        self._call("wait_for_save")

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        self._call("get_transfer_results", frozenset(finished_req_ids))
        script = self.script
        results = KVConnectorTransferResults(
            finished_sending=set(script.sending),
            finished_recving=set(script.recving),
            failed_recving=set(script.failed),
        )
        script.sending.clear()
        script.recving.clear()
        script.failed.clear()
        return results

    def build_connector_worker_meta(self) -> ScriptedWorkerMetadata:
        return ScriptedWorkerMetadata([self.script.label])

    def get_handshake_metadata(self) -> ScriptedHandshake | None:
        if self.script.handshake is None:
            return None
        return ScriptedHandshake(self.script.handshake)

    def set_xfer_handshake_metadata(self, metadata: dict[int, Any]) -> None:
        self._call("set_xfer_handshake_metadata", metadata)

    def get_kv_connector_stats(self) -> ScriptedStats | None:
        self._raise_if("get_kv_connector_stats")
        if self.script.stats is None:
            return None
        return ScriptedStats(data={"count": self.script.stats})

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> ScriptedStats:
        return ScriptedStats(data=dict(data or {}))

    def shutdown(self) -> None:
        self.script.shutdowns += 1
        if self.script.shutdown_error is not None:
            raise self.script.shutdown_error


class RangeConnector(ScriptedConnector):
    """A scripted child that loads token ranges: a load may be split across it and others
    (``split_loads``)."""

    def update_state_after_alloc_range(
        self, request: Any, blocks: Any, start: int, num_tokens: int
    ) -> None:
        self._call("update_state_after_alloc_range", request.request_id, start, num_tokens)


class ErrorsConnector(ScriptedConnector):
    """A scripted child whose class implements ``get_block_ids_with_load_errors``: it hands
    out the script's ``load_errors`` (each once), as a child that found blocks it failed to
    load."""

    def get_block_ids_with_load_errors(self) -> Any:
        self._raise_if("get_block_ids_with_load_errors")
        found = set(self.script.load_errors)
        self.script.load_errors.clear()
        return found if self.script.errors_as is None else self.script.errors_as(found)


class LMCacheEventsConnector(ScriptedConnector):
    """A scripted child whose scheduler side takes KV cache events with LMCache's own code
    (``LMCacheConnectorV1.update_connector_output`` and ``take_events``; the LMCache engine
    itself is not installed here)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._kv_cache_events = None

    def update_connector_output(self, connector_output: Any) -> None:
        self.script.calls.append(("update_connector_output", connector_output.kv_cache_events))
        LMCacheConnectorV1.update_connector_output(self, connector_output)

    def take_events(self) -> Iterable[Any]:
        return list(LMCacheConnectorV1.take_events(self))


class _MooncakeSchedulerPart:
    """Stands in for MooncakeStoreConnector's own scheduler part (it needs the Mooncake
    library); the events handling around it is Mooncake's code."""

    def update_connector_output(self, connector_output: Any) -> None:
        return None


class MooncakeEventsConnector(ScriptedConnector):
    """A scripted child whose scheduler side takes KV cache events with MooncakeStore's own
    code (``MooncakeStoreConnector.update_connector_output`` and ``take_events``)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._kv_cache_events = None
        self.connector_scheduler = _MooncakeSchedulerPart()

    def update_connector_output(self, connector_output: Any) -> None:
        self.script.calls.append(("update_connector_output", connector_output.kv_cache_events))
        MooncakeStoreConnector.update_connector_output(self, connector_output)

    def take_events(self) -> Iterable[Any]:
        return list(MooncakeStoreConnector.take_events(self))


#: What the next get_num_new_matched_tokens of a script's children answers, whole (the scripted
#: connector answers ``(tokens, load_async)`` from its script otherwise).
ANSWERS: dict[str, Any] = {}


#: Per script label, how many prompt tokens the child "stored" (ExampleConnector's arithmetic).
STORED: dict[str, int] = {}


class OddConnector(ScriptedConnector):
    """A scripted child that can answer ``get_num_new_matched_tokens`` anything, and that
    answers as vLLM's ``ExampleConnector`` does when its script says it stored a prefix: the
    stored tokens less the computed ones, negative when vLLM's prefix cache holds more."""

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        label = self.script.label
        if label in ANSWERS:
            self._call("get_num_new_matched_tokens", request.request_id, num_computed_tokens)
            return ANSWERS[label]
        if label in STORED:
            self._call("get_num_new_matched_tokens", request.request_id, num_computed_tokens)
            return STORED[label] - num_computed_tokens, False
        return super().get_num_new_matched_tokens(request, num_computed_tokens)


#: Every child MockedChild built, in order (cleared by the tests that use it).
MOCKED: list[Any] = []


class MockedChild(KVConnectorBase_V1):  # type: ignore[misc]
    """A child that is a ``MagicMock(spec_set=KVConnectorBase_V1)``, as vLLM's own tests build
    them: it records every method called on it (``method_calls``) and has no other method."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        from unittest.mock import MagicMock  # noqa: PLC0415

        mock = MagicMock(spec_set=KVConnectorBase_V1)
        mock.get_finished_count.return_value = None
        MOCKED.append(mock)
        return mock


class QuietConnector(ScriptedConnector):
    """A scripted child whose per-layer and per-step worker hooks are no-ops, as a P/D
    transport's per-layer hooks are (NIXL's) or a cache's that saves in one go: a fan-out that
    skips no-ops calls none of them."""

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Nothing to start."""

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        return

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        return super().get_transfer_results(finished_req_ids)


#: The methods of vLLM's connector interface (a child's hooks, its shutdown included).
HOOK_NAMES: frozenset[str] = frozenset(
    name
    for name in dir(KVConnectorBase_V1)
    if not name.startswith("_") and callable(getattr(KVConnectorBase_V1, name))
)


class WatchedConnector(ScriptedConnector):
    """A scripted child that records in its script's ``late`` every hook of vLLM's interface
    looked up on it after its own ``shutdown()`` (each instance for itself: the scheduler's
    and a worker's share a script, not their shutdown)."""

    def __getattribute__(self, name: str) -> Any:
        if name in HOOK_NAMES and object.__getattribute__(self, "__dict__").get("down"):
            object.__getattribute__(self, "script").late.append(name)
        return object.__getattribute__(self, name)

    def shutdown(self) -> None:
        self.down = True
        super().shutdown()

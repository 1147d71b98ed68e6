"""Scripted children for the adapter fuzz: they save and load asynchronously, and report only
when the test says so.

vLLM builds them from ``kv_connector_module_path="fuzz_children"``. Every instance built from one
child config (the scheduler's, and one per worker, for our ``MultiConnector`` or vLLM's) shares a
:class:`Board`: what the child answers for each request, what each of its instances still owes
(a report per worker for every save it committed to and every asynchronous load it was chosen
for, with the blocks it reads or writes until then), and what the test queued for each worker.

A report is *owed* from the moment the scheduler's child commits to the transfer until the
worker's child hands it out from ``get_transfer_results``: until then the child may still touch
the blocks, so vLLM must not free them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from vllm.distributed.kv_events import BlockStored, KVCacheEvent, KVConnectorKVEvents
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
)

MODULE = __name__
BOARDS: dict[str, Board] = {}

#: The worker calls a child can be told to raise in (once), in the order a model runner makes them.
WORKER_CALLS = (
    "handle_preemptions",
    "bind_connector_metadata",
    "start_load_kv",
    "wait_for_save",
    "get_transfer_results",
    "get_block_ids_with_load_errors",
    "build_connector_worker_meta",
    "clear_connector_metadata",
)


class InjectedError(RuntimeError):
    """What a child raises when the test tells it to."""


class _Events(KVConnectorKVEvents):
    """A child's KV cache events: a plain list, merged by concatenation."""

    def __init__(self, events: list[KVCacheEvent] | None = None, workers: int = 1) -> None:
        self.events: list[KVCacheEvent] = list(events or [])
        self.workers = workers

    def add_events(self, events: list[KVCacheEvent]) -> None:
        self.events.extend(events)

    def aggregate(self) -> _Events:
        return self

    def increment_workers(self, count: int = 1) -> None:
        self.workers += count

    def get_all_events(self) -> list[KVCacheEvent]:
        return list(self.events)

    def get_number_of_workers(self) -> int:
        return self.workers

    def clear_events(self) -> None:
        self.events.clear()


class EventsA(_Events):
    """One child class's events (as LMCache's are its own class)."""


class EventsB(_Events):
    """Another child class's events (as MooncakeStore's are)."""


def stored(label: str, rank: int, serial: int) -> BlockStored:
    """A KV event that says who sent it: block hash ``label/rank/serial``."""
    return BlockStored(
        block_hashes=[f"{label}/{rank}/{serial}"],
        parent_block_hash=None,
        token_ids=[],
        block_size=16,
        lora_id=None,
        medium=None,
        lora_name=None,
    )


@dataclass
class Board:
    """One child's script, shared by its scheduler and worker instances."""

    label: str
    events_class: type[_Events] = EventsA
    #: get_finished_count(): None (every worker reports) or how many of the first workers do.
    finished_count: int | None = None
    num_workers: int = 1
    # -- answers, set by the test per request --
    hits: dict[str, int] = field(default_factory=dict)
    sync: set[str] = field(default_factory=set)
    saves: set[str] = field(default_factory=set)
    # -- what is owed: (rank, request id, "save" | "load") -> block ids --
    owed: dict[tuple[int, str, str], tuple[int, ...]] = field(default_factory=dict)
    #: Every request this child ever committed a transfer for, by kind.
    had: set[tuple[str, str]] = field(default_factory=set)
    #: Reports handed out, per rank: request ids in finished_sending plus those in
    #: finished_recving or failed_recving (what the adapter's counts must add up to).
    delivered: Counter[int] = field(default_factory=Counter)
    #: Block ids handed out by get_block_ids_with_load_errors in the current step, per rank.
    failed_blocks_out: dict[int, set[int]] = field(default_factory=dict)
    #: KV events handed out by the workers (in order) and received by the scheduler's child.
    events_out: list[KVCacheEvent] = field(default_factory=list)
    events_in: list[KVCacheEvent] = field(default_factory=list)
    #: Events objects received by the scheduler's child that were not of its own class.
    foreign_events: int = 0
    scheduler: FuzzChild | None = None
    workers: list[FuzzChild] = field(default_factory=list)

    def ranks(self) -> range:
        """The workers that report this child's transfers."""
        return range(self.finished_count or self.num_workers)

    def owes(self, request_id: str) -> bool:
        return any(key[1] == request_id for key in self.owed)

    def owed_blocks(self) -> set[int]:
        return {block for blocks in self.owed.values() for block in blocks}

    def reset(self, num_workers: int) -> None:
        """Forget everything (a new example with the same configuration)."""
        self.num_workers = num_workers
        for name in ("hits", "owed", "failed_blocks_out"):
            getattr(self, name).clear()
        for name in ("sync", "saves", "had"):
            getattr(self, name).clear()
        self.delivered.clear()
        self.events_out.clear()
        self.events_in.clear()
        self.foreign_events = 0
        self.scheduler = None
        self.workers.clear()


def board(label: str, **answers: Any) -> Board:
    """The board under ``label``, made (or reset to ``answers``) now."""
    made = Board(label=label, **answers)
    BOARDS[label] = made
    return made


def fuzz_child(name: str, label: str) -> dict[str, Any]:
    """A child entry for ``kv_connector_extra_config['connectors']``."""
    return {
        "kv_connector": "FuzzChild",
        "kv_connector_module_path": MODULE,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"board": label, "multiconnector_name": name},
    }


@dataclass
class FuzzMetadata(KVConnectorMetadata):
    label: str = ""


class FuzzChild(KVConnectorBase_V1):
    """A child that commits to saves and loads as its board says and reports as it is told."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self.board = BOARDS[self._kv_transfer_config.kv_connector_extra_config["board"]]
        if role == KVConnectorRole.SCHEDULER:
            self.board.scheduler = self
            self.rank = -1
        else:
            self.rank = len(self.board.workers)
            self.board.workers.append(self)
        # Worker reports queued by the test, handed out by the next call that carries them.
        self.sending: set[str] = set()
        self.recving: set[str] = set()
        self.failed: set[str] = set()
        self.failed_blocks: set[int] = set()
        self.events: list[KVCacheEvent] = []
        self.raise_in: set[str] = set()

    def _maybe_raise(self, method: str) -> None:
        if method in self.raise_in:
            self.raise_in.discard(method)
            raise InjectedError(f"{self.board.label}@{self.rank} raised in {method}")

    # -- scheduler side --------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        board = self.board
        tokens = board.hits.get(request.request_id, 0) - num_computed_tokens
        if tokens <= 0:
            return 0, False
        return tokens, request.request_id not in board.sync

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        board = self.board
        request_id = request.request_id
        if num_external_tokens <= 0 or request_id in board.sync:
            return
        ids = tuple(blocks.get_block_ids()[0])
        for rank in board.ranks():
            board.owed[(rank, request_id, "load")] = ids
        board.had.add((request_id, "load"))

    def build_connector_meta(self, scheduler_output: Any) -> FuzzMetadata:
        return FuzzMetadata(self.board.label)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        board = self.board
        request_id = request.request_id
        if request_id not in board.saves:
            return False, None
        for rank in board.ranks():
            board.owed[(rank, request_id, "save")] = tuple(block_ids)
        board.had.add((request_id, "save"))
        return True, None

    def update_connector_output(self, connector_output: Any) -> None:
        events = connector_output.kv_cache_events
        if events is None:
            return
        if type(events) is self.board.events_class:
            self.board.events_in.extend(events.get_all_events())
        else:
            self.board.foreign_events += 1

    def take_events(self) -> list[Any]:
        return []

    def get_finished_count(self) -> int | None:
        return self.board.finished_count

    # -- worker side -----------------------------------------------------------------------------

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        self._maybe_raise("bind_connector_metadata")
        super().bind_connector_metadata(connector_metadata)

    def clear_connector_metadata(self) -> None:
        self._maybe_raise("clear_connector_metadata")
        super().clear_connector_metadata()

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        self._maybe_raise("handle_preemptions")

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._maybe_raise("start_load_kv")

    def wait_for_layer_load(self, layer_name: str) -> None:
        pass

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        pass

    def wait_for_save(self) -> None:
        self._maybe_raise("wait_for_save")

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        self._maybe_raise("get_transfer_results")
        board, rank = self.board, self.rank
        results = KVConnectorTransferResults(
            finished_sending=set(self.sending),
            finished_recving=self.recving | self.failed,
            failed_recving=set(self.failed),
        )
        for request_id in self.sending:
            board.owed.pop((rank, request_id, "save"), None)
        for request_id in results.finished_recving:
            board.owed.pop((rank, request_id, "load"), None)
        board.delivered[rank] += len(results.finished_sending) + len(results.finished_recving)
        self.sending.clear()
        self.recving.clear()
        self.failed.clear()
        return results

    def get_block_ids_with_load_errors(self) -> set[int]:
        self._maybe_raise("get_block_ids_with_load_errors")
        out, self.failed_blocks = self.failed_blocks, set()
        self.board.failed_blocks_out.setdefault(self.rank, set()).update(out)
        return out

    def get_kv_connector_kv_cache_events(self) -> _Events | None:
        if not self.events:
            return None
        found, self.events = self.events, []
        self.board.events_out.extend(found)
        return self.board.events_class(found)

    def build_connector_worker_meta(self) -> None:
        self._maybe_raise("build_connector_worker_meta")

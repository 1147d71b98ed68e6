"""Scripted children for the adapter fuzz: they save and load asynchronously, and report only
when the test says so.

vLLM builds them from ``kv_connector_module_path="fuzz_children"``. Every instance built from one
child config (the scheduler's, and one per worker, for our ``MultiConnector`` or vLLM's) shares a
:class:`Board`: what the child answers for each request, what each of its instances still owes
(a report per worker for every save it committed to and every asynchronous load it was chosen
for, with the blocks it reads or writes until then), and what the test queued for each worker.

A report is *owed* from the moment the scheduler's child commits to the transfer until the
worker's child hands it out from ``get_transfer_results``: until then the child may still touch
the blocks, so vLLM must not free them. A child that raises in a load hook
(``bind_connector_metadata``, ``start_load_kv``) on a worker gives up that worker's loads bound
in the step: their reports stay owed (it may make them late, or never), but *excused*: the
adapter reports those loads failed, and the child no longer touches their blocks.

:class:`RangeFuzzChild` loads token ranges (``update_state_after_alloc_range``), so that with
``split_loads`` a load may be split across it and others: it holds the tokens
``[starts[request], hits[request])`` and answers, for any ``num_computed_tokens`` it is asked
with, the tokens it holds from there on; each part owes its report with the blocks of its range.
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
from vllm_harness import BLOCK

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

#: The worker calls in which a child failing fails its loads bound in the step (the adapter
#: reports them failed; a split load's part as its blocks' load errors).
LOAD_HOOKS = ("bind_connector_metadata", "start_load_kv")


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
    #: Per request, the first token of its hit (the child holds ``[start, hits)``); 0 if absent.
    starts: dict[str, int] = field(default_factory=dict)
    sync: set[str] = field(default_factory=set)
    saves: set[str] = field(default_factory=set)
    # -- what is owed: (rank, request id, "save" | "load") -> block ids --
    owed: dict[tuple[int, str, str], tuple[int, ...]] = field(default_factory=dict)
    #: The owed loads, (rank, request id), given up by raising in a load hook (see above).
    excused: set[tuple[int, str]] = field(default_factory=set)
    #: Per request, the blocks of this child's part of its latest load, when that load is split
    #: (the child was told its range) and asynchronous.
    part_blocks: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: What the scheduler's child committed since it last built its metadata: the asynchronous
    #: loads (request ids) and the parts of split loads (request id -> blocks), for the workers.
    new_loads: set[str] = field(default_factory=set)
    new_parts: dict[str, tuple[int, ...]] = field(default_factory=dict)
    #: Per rank, the blocks of this child's parts of split loads that failed on that worker in
    #: the current step (it reported the load in failed_recving, or raised in a load hook): the
    #: adapter must hand them to the scheduler as load errors in the same step.
    parts_failed_out: dict[int, set[int]] = field(default_factory=dict)
    #: Every request this child ever committed a transfer for, by kind.
    had: set[tuple[str, str]] = field(default_factory=set)
    #: Reports handed out, per rank: request ids in finished_sending plus those in
    #: finished_recving or failed_recving (what the adapter's counts must add up to).
    delivered: Counter[int] = field(default_factory=Counter)
    #: Per rank, the asynchronous loads (and parts of split loads) this child gave up by raising
    #: in a load hook: the adapter settles each on its load books as the child's failed report
    #: (it counts in connector_counts() beside the reports delivered).
    given_up: Counter[int] = field(default_factory=Counter)
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

    def owes_load(self, request_id: str) -> list[int]:
        """The ranks on which this child still owes a load report of ``request_id``, not
        excused (it may still write into the request's blocks there)."""
        return [
            rank
            for rank, owed_id, kind in self.owed
            if owed_id == request_id and kind == "load" and (rank, request_id) not in self.excused
        ]

    def guarded(self) -> list[tuple[tuple[int, str, str], tuple[int, ...]]]:
        """The owed reports whose blocks the child may still touch (not excused)."""
        return [
            (key, ids)
            for key, ids in self.owed.items()
            if key[2] == "save" or (key[0], key[1]) not in self.excused
        ]

    def commit_load(self, request_id: str, ids: tuple[int, ...]) -> None:
        """The scheduler's child committed to an asynchronous load of ``request_id`` into
        ``ids``: a report owed on each reporting worker."""
        for rank in self.ranks():
            self.owed[(rank, request_id, "load")] = ids
            self.excused.discard((rank, request_id))
        self.had.add((request_id, "load"))
        self.new_loads.add(request_id)

    def owed_blocks(self) -> set[int]:
        return {block for blocks in self.owed.values() for block in blocks}

    def reset(self, num_workers: int) -> None:
        """Forget everything (a new example with the same configuration)."""
        self.num_workers = num_workers
        for name in ("hits", "starts", "owed", "failed_blocks_out", "part_blocks", "new_parts"):
            getattr(self, name).clear()
        for name in ("sync", "saves", "had", "excused", "new_loads"):
            getattr(self, name).clear()
        self.parts_failed_out.clear()
        self.delivered.clear()
        self.given_up.clear()
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


def fuzz_child(name: str, label: str, *, ranged: bool = False) -> dict[str, Any]:
    """A child entry for ``kv_connector_extra_config['connectors']`` (``ranged``: a
    :class:`RangeFuzzChild`)."""
    return {
        "kv_connector": "RangeFuzzChild" if ranged else "FuzzChild",
        "kv_connector_module_path": MODULE,
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"board": label, "multiconnector_name": name},
    }


@dataclass
class FuzzMetadata(KVConnectorMetadata):
    """A child's metadata: the asynchronous loads and the parts of split loads it committed to
    since the last step, which its workers learn (and give up if they raise in a load hook)."""

    label: str = ""
    loads: tuple[str, ...] = ()
    parts: dict[str, tuple[int, ...]] = field(default_factory=dict)


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
        #: The metadata bound this step (on a worker), for the loads a load hook gives up.
        self.bound: FuzzMetadata | None = None

    def _maybe_raise(self, method: str) -> None:
        if method in self.raise_in:
            self.raise_in.discard(method)
            raise InjectedError(f"{self.board.label}@{self.rank} raised in {method}")

    # -- scheduler side --------------------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        board = self.board
        if num_computed_tokens < board.starts.get(request.request_id, 0):
            return 0, False  # it holds none of the tokens from there on
        tokens = board.hits.get(request.request_id, 0) - num_computed_tokens
        if tokens <= 0:
            return 0, False
        return tokens, request.request_id not in board.sync

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        board = self.board
        request_id = request.request_id
        board.part_blocks.pop(request_id, None)  # a new allocation: no part of it is this child's
        if num_external_tokens <= 0 or request_id in board.sync:
            return
        board.commit_load(request_id, tuple(blocks.get_block_ids()[0]))

    def build_connector_meta(self, scheduler_output: Any) -> FuzzMetadata:
        board = self.board
        metadata = FuzzMetadata(board.label, tuple(sorted(board.new_loads)), dict(board.new_parts))
        board.new_loads.clear()
        board.new_parts.clear()
        return metadata

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
        self.bound = connector_metadata
        self._maybe_load_hook_raises("bind_connector_metadata")
        super().bind_connector_metadata(connector_metadata)

    def _maybe_load_hook_raises(self, method: str) -> None:
        """Raise in load hook ``method`` if told to: then this worker's loads bound this step
        are given up (excused), and its parts' blocks must reach vLLM as load errors. (Not a
        child that reports on fewer workers than all: the adapter awaits its own reports, as
        documented, so its loads stay owed as they are.)"""
        if method not in self.raise_in:
            return
        board, rank, bound = self.board, self.rank, self.bound
        if bound is not None and board.finished_count is None:
            for request_id in bound.loads:
                key = (rank, request_id)
                if (rank, request_id, "load") in board.owed and key not in board.excused:
                    board.excused.add(key)
                    board.given_up[rank] += 1
            for blocks in bound.parts.values():
                board.parts_failed_out.setdefault(rank, set()).update(blocks)
        self._maybe_raise(method)

    def clear_connector_metadata(self) -> None:
        self._maybe_raise("clear_connector_metadata")
        super().clear_connector_metadata()

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        self._maybe_raise("handle_preemptions")

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        self._maybe_load_hook_raises("start_load_kv")

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
            key = (rank, request_id, "load")
            part = board.part_blocks.get(request_id) if key in board.owed else None
            if part and request_id in self.failed and (rank, request_id) not in board.excused:
                # A part of a split load failed here (not given up before): its blocks are
                # this step's load errors.
                board.parts_failed_out.setdefault(rank, set()).update(part)
            board.owed.pop(key, None)
            board.excused.discard((rank, request_id))
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


class RangeFuzzChild(FuzzChild):
    """A fuzz child that loads token ranges: a load may be split across it and others."""

    def update_state_after_alloc_range(
        self, request: Any, blocks: Any, start: int, num_tokens: int
    ) -> None:
        board = self.board
        request_id = request.request_id
        ids = tuple(blocks.get_block_ids()[0][start // BLOCK : -(-(start + num_tokens) // BLOCK)])
        board.new_parts[request_id] = ids  # a worker raising in a load hook fails it
        if request_id in board.sync:
            board.part_blocks.pop(request_id, None)
            return
        board.part_blocks[request_id] = ids
        board.commit_load(request_id, ids)

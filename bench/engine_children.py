"""Child connectors for the engine tests and the engine benchmark, built on vLLM's ExampleConnector.

vLLM loads them by module path (``kv_connector_module_path="bench.engine_children"``): the
repository's root is on ``sys.path`` in every process of the engine (``python -m`` puts it there,
and ``bench.engine_harness.engine_environment`` on ``PYTHONPATH`` for the processes the engine
spawns).

Extra config keys they read (each child's own ``kv_connector_extra_config``):

- ``record_dir``: where the worker side appends one line per request it loads, to
  ``<record_dir>/<label>.loads`` (so a test in another process can see which child loaded);
- ``label``: the name of that file (the child's name in the test);
- ``save_delay_steps`` (:class:`DelayedSaveConnector`): how many worker steps after a request
  finished its save is reported finished;
- ``disk`` (:class:`DelayedSaveConnector`): ``false`` for no file I/O at all (the benchmark);
- ``never_reports`` (:class:`DelayedSaveConnector`): ``true`` for a child that never reports a
  save it promised;
- ``fail_seconds`` (:class:`DeadTierConnector`): how long a lookup waits before it raises while
  the child's store is down (:data:`DOWN`).
"""

# vLLM is imported inside functions: the main environment collects this folder and has no engine.
# ruff: noqa: PLC0415

from __future__ import annotations

import errno
import os
import time
from collections import Counter
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (
    ExampleConnector,
    ExampleConnectorMetadata,
)

#: In-process engines only: per label, the request ids the worker side reported finished
#: sending, in order, and the step of each report (the test reads them in the same process).
REPORTED: dict[str, dict[str, int]] = {}
#: In-process engines only: per label, the worker steps seen so far.
STEPS: dict[str, int] = {}


class RecordingExampleConnector(ExampleConnector):  # type: ignore[misc]
    """ExampleConnector that records, on the worker, each request it loads."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._record_dir: str | None = extra.get("record_dir")
        self._label: str = str(extra.get("label", "child"))

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        metadata = self._get_connector_metadata()
        loads = [request for request in metadata.requests if not request.is_store]
        if loads and self._record_dir is not None:
            with open(os.path.join(self._record_dir, f"{self._label}.loads"), "a") as record:
                for request in loads:
                    record.write(f"{len(request.slot_mapping)}\n")
        super().start_load_kv(forward_context, **kwargs)


class RankedExampleConnector(RecordingExampleConnector):
    """ExampleConnector whose storage includes the tensor-parallel rank.

    vLLM's ExampleConnector is not tensor-parallel safe: every rank writes the same per-layer
    files (each holding its own heads), so a load reads another rank's heads. Here each worker
    rank keeps its own folder; the scheduler looks up rank 0's.
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        rank = 0
        if role == KVConnectorRole.WORKER:
            from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

            rank = get_tensor_model_parallel_rank()
        self._storage_path: str = os.path.join(self._storage_path, f"rank{rank}")
        self._label = f"{self._label}.rank{rank}"


class DelayedSaveConnector(RecordingExampleConnector):
    """ExampleConnector whose saves are asynchronous: finished ``save_delay_steps`` steps late.

    Scheduler: ``request_finished`` answers ``True`` for every request (its blocks stay held
    until the workers report it finished sending). Worker: each finished request is reported in
    ``get_finished`` that many calls later. With ``disk: false`` it neither writes nor reads
    files and never offers tokens to load (the benchmark's child: bookkeeping only). With
    ``never_reports: true`` it never reports a save at all (a child that promised and went
    silent: its requests' blocks stay held).
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._delay = int(extra.get("save_delay_steps", 3))
        self._disk = bool(extra.get("disk", True))
        self._silent = bool(extra.get("never_reports", False))
        self._pending: dict[str, int] = {}
        self._steps = 0
        REPORTED.setdefault(self._label, {})
        STEPS.setdefault(self._label, 0)

    # -- scheduler -------------------------------------------------------------------------------

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        if not self._disk:
            return 0, False
        return super().get_num_new_matched_tokens(request, num_computed_tokens)  # type: ignore[no-any-return]

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        if not self._disk:
            return ExampleConnectorMetadata()  # nothing to save or load: no file is touched
        return super().build_connector_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, None]:
        return True, None

    # -- worker ----------------------------------------------------------------------------------

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        if self._disk:
            super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kw)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if self._disk:
            super().start_load_kv(forward_context, **kwargs)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, None]:
        self._steps += 1
        STEPS[self._label] = self._steps
        done = {r for r, due in self._pending.items() if 0 <= due <= self._steps}
        for request_id in done:
            del self._pending[request_id]
        for request_id in finished_req_ids:
            self._pending[request_id] = -1 if self._silent else self._steps + self._delay
        reported = REPORTED[self._label]
        for request_id in done:
            reported[request_id] = self._steps
        return (done or None), None

    @property
    def pending(self) -> dict[str, int]:
        """The saves in flight: request id to the step at which it is reported."""
        return dict(self._pending)


class DeadTierConnector(DelayedSaveConnector):
    """A tier whose store can be down: :class:`DelayedSaveConnector` (``disk: false``: it holds
    nothing, every lookup a miss) that, while its label is in :data:`DOWN`, waits
    ``fail_seconds`` in each lookup (a remote store's connect timeout: the scheduler's thread
    waits, using no CPU) and then raises ``ConnectionError``, and raises in each load. Its
    lookups failing, it is never chosen to load; its saves are taken as before. ``DEAD`` counts,
    in-process, its lookups and the failed ones (``label`` -> ``lookups`` / ``failed``)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._fail_seconds = float(extra.get("fail_seconds", 0.0))
        self._counts = DEAD.setdefault(self._label, Counter())

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        self._counts["lookups"] += 1
        if self._label in DOWN:
            self._counts["failed"] += 1
            time.sleep(self._fail_seconds)
            raise ConnectionError(
                f"{self._label}: its store did not answer within {self._fail_seconds:g} s"
            )
        return super().get_num_new_matched_tokens(request, num_computed_tokens)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        if self._label in DOWN and self._get_connector_metadata().requests:
            raise ConnectionError(f"{self._label}: its store is down")
        super().start_load_kv(forward_context, **kwargs)


#: In-process engines only: the labels of the :class:`DeadTierConnector` children whose store is
#: down (the benchmark adds and removes them), and what each one was asked.
DOWN: set[str] = set()
DEAD: dict[str, Counter[str]] = {}


class FaultyExampleConnector(RecordingExampleConnector):
    """ExampleConnector with faults, chosen by prompt (its first token id) or by call.

    Extra config keys:

    - ``save_fails``: first token ids of the prompts whose save of the first layer fails with an
      ``OSError`` (EIO) after the step's other requests were saved: that layer's file is then
      missing, so a later load of the prompt fails on a missing file;
    - ``truncate``: first token ids of the prompts whose every layer file is cut to 16 bytes as
      soon as it is written: a later load fails on a truncated file;
    - ``get_finished_raises``: every worker ``get_finished`` call raises ``RuntimeError``;
    - ``fail_every``: ``k``: besides those, the prompts whose first token id is ``0`` modulo
      ``k`` fail as ``save_fails`` do, and those at ``1`` modulo ``k`` are truncated (the
      benchmark's faults, a fraction of any prompts).

    ``FAULTS`` counts, in-process, what was injected (``label`` -> kind -> count).
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config
        self._save_fails = {int(t) for t in extra.get("save_fails", ())}
        self._truncate = {int(t) for t in extra.get("truncate", ())}
        self._finished_raises = bool(extra.get("get_finished_raises", False))
        self._every = int(extra.get("fail_every", 0))
        self._failed_once: set[int] = set()
        self._faults = FAULTS.setdefault(self._label, {})

    def _fails(self, first: int) -> bool:
        return first in self._save_fails or (self._every > 0 and first % self._every == 0)

    def _truncates(self, first: int) -> bool:
        return first in self._truncate or (self._every > 0 and first % self._every == 1)

    def _fault(self, kind: str) -> None:
        self._faults[kind] = self._faults.get(kind, 0) + 1

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        metadata = self._get_connector_metadata()
        requests = metadata.requests
        kept, failing = [], set()
        for request in requests:
            first = int(request.token_ids[0])
            if request.is_store and self._fails(first) and first not in self._failed_once:
                failing.add(first)
            else:
                kept.append(request)
        metadata.requests = kept  # the others of the step are saved
        try:
            super().save_kv_layer(layer_name, kv_layer, attn_metadata, **kw)
        finally:
            metadata.requests = requests
        for request in kept:
            if request.is_store and self._truncates(int(request.token_ids[0])):
                name = self._generate_filename_debug(
                    layer_name, request.token_ids, request.mm_hashes
                )
                with open(name, "r+b") as file:
                    file.truncate(16)
                self._fault("truncated")
        if failing:
            self._failed_once |= failing
            self._fault("save_fails")
            raise OSError(errno.EIO, f"injected I/O error saving {layer_name}")

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        if self._finished_raises:
            self._fault("get_finished_raises")
            raise RuntimeError("injected: get_finished failed")
        return super().get_finished(finished_req_ids)  # type: ignore[no-any-return]


#: In-process engines only: per label, the faults a FaultyExampleConnector injected, by kind.
FAULTS: dict[str, dict[str, int]] = {}

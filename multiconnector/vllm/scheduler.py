"""The scheduler side of the vLLM-facing connector: :class:`SchedulerRole`.

The calls vLLM makes on the scheduler's connector: it chooses the child that loads each request,
builds each step's metadata, merges the children's params when a request finishes and tells the
workers, by name, which children save it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from contextlib import suppress
from typing import Any

from .._validate import shown
from ..errors import (
    ConnectorFailures,
    InvalidArgumentError,
    InvalidParamsError,
    KeyClashError,
    ShutDownError,
)
from ..ledger import take_older
from ..machine import State
from ..outcome import Outcome
from ..rule import count, load_owed, refined, transfer_report
from ._base import ConnectorBase, _failed
from .config import without_hma
from .errors import HMAUnsupportedError
from .wire import (
    NamedHandshakeMetadata,
    NamedKVEvents,
    NamedMultiConnectorMetadata,
    NamedMultiConnectorWorkerMetadata,
)

__all__ = ["SchedulerRole"]

_APPLIED = Outcome.applied


def _named(value: Any, kind: type[Any], what: str) -> Any:
    """``value`` if it is ``None`` or a ``kind``; else an :class:`InvalidArgumentError`."""
    if value is not None and not isinstance(value, kind):
        raise InvalidArgumentError(f"{what}={shown(value)} must be a {kind.__name__}")
    return value


class SchedulerRole(ConnectorBase):
    """The scheduler-side methods of vLLM's connector interface."""

    def bind_kv_cache_manager(self, kv_cache_manager: Any) -> None:
        # Not super(): it would bind the block pool to every child a second time.
        self._kv_cache_manager = kv_cache_manager
        self._gather(
            "bind_kv_cache_manager", lambda _, c: c.bind_kv_cache_manager(kv_cache_manager)
        )

    def bind_gpu_block_pool(self, gpu_block_pool: Any) -> None:
        self._gather("bind_gpu_block_pool", lambda _, c: c.bind_gpu_block_pool(gpu_block_pool))

    def on_new_request(self, request: Any) -> None:
        self._ensure(request)
        self._each("on_new_request", request)

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        """The first child, in configuration order, with tokens to load becomes the loader
        (the ``lookup`` policy ``"first"``, the default; ``"longest"``: the child with the
        most, docs/vllm.md, "Which child loads").

        As in vLLM's: a child answering ``None`` (still looking up) makes the answer
        ``(None, False)``, and the children after it are not asked; unless a child asked before
        it already covers every token the request has left but its last.
        """
        request_id = self._ensure(request)
        self._call.start()
        # What a hit can cover: every token left but the last, which vLLM computes to sample
        # the next token from (its prefix cache's hits stop there too).
        total = getattr(request, "num_tokens", None)  # an int on vLLM's Request
        remaining = (
            total - num_computed_tokens - 1
            if total.__class__ is int and 0 <= num_computed_tokens < total
            else None
        )
        try:
            tokens = self._tracker.match_tokens(
                request_id, num_computed_tokens, remaining=remaining
            )
        except ConnectorFailures as failures:
            # A child that raised or answered what cannot be true (a negative count, more
            # tokens than the request has left, ...) counts as no hit; the others' answers stand.
            self._absorb(
                "get_num_new_matched_tokens",
                list(zip(failures.failed, failures.exceptions, strict=True)),
                "counted as no hit",
            )
            tokens = failures.result
        if not tokens:
            return tokens, False
        loader = self._loader(request_id)
        assert loader is not None
        self._matched_at[request_id] = num_computed_tokens
        return tokens, self._sides[loader].load_async.get(request_id, False)

    def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:
        loader = self._loader(request.request_id)
        if loader is not None:
            try:
                return self._children[loader].get_loaded_kv_cache_group_ids(request)  # type: ignore[no-any-return]
            except Exception as exc:
                self._absorb(
                    "get_loaded_kv_cache_group_ids", [(loader, exc)], "answered the default"
                )
        return super().get_loaded_kv_cache_group_ids(request)  # type: ignore[no-any-return]

    def get_external_cache_hit_sources(
        self, request: Any, num_external_tokens: int
    ) -> dict[Any, int]:
        loader = self._loader(request.request_id)
        if loader is not None:
            try:
                return self._children[loader].get_external_cache_hit_sources(  # type: ignore[no-any-return]
                    request, num_external_tokens
                )
            except Exception as exc:
                self._absorb(
                    "get_external_cache_hit_sources", [(loader, exc)], "answered the default"
                )
        return super().get_external_cache_hit_sources(request, num_external_tokens)  # type: ignore[no-any-return]

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """The loader gets ``num_external_tokens``; every other child gets 0 and the blocks.

        A child that raises is that child's failure; when it is the loader, its load is
        reported failed (through the workers, in vLLM's own terms), so vLLM recomputes.
        """
        request_id = request.request_id
        loader = self._loader(request_id)
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:  # once per scheduled request: no helper
            try:
                child.update_state_after_alloc(
                    request, blocks, num_external_tokens if name == loader else 0
                )
            except Exception as exc:
                failures = _failed(failures, name, exc)
        matched_at = self._matched_at.pop(request_id, 0) if self._matched_at else 0
        if num_external_tokens <= 0 or loader is None:
            if failures is not None:
                self._absorb("update_state_after_alloc", failures)
            return
        loader_failed = failures is not None and any(name == loader for name, _ in failures)
        if failures is not None:
            self._absorb(
                "update_state_after_alloc",
                failures,
                "its load reported failed, recomputed by vLLM",
            )
        self._hits.chosen(loader, num_external_tokens)
        if self._sides[loader].load_async.get(request_id, False):
            self._loads_in_flight.add(request_id)
            self._load_since[request_id] = time.monotonic()
            if loader_failed:
                self._failed_loads[request_id] = loader  # each worker reports it failed
                self._sides[loader].failed_loads.add(request_id)
                return
            self._new_loads[request_id] = loader
            if loader in self._known_counts():
                self._loads_owed[request_id] = (loader, self._counted[loader])
            return
        external = self._external_blocks(blocks, matched_at, num_external_tokens)
        if loader_failed:
            self._load_errors.extend(external)
            self._sides[loader].failed_loads.add(request_id)
        else:
            self._sync_loads[request_id] = (loader, external)

    def _external_blocks(self, blocks: Any, matched_at: int, tokens: int) -> tuple[int, ...]:
        """The ids of the blocks that hold a request's ``tokens`` external tokens, after the
        ``matched_at`` it had computed (one KV cache group; none for more: vLLM recomputes
        load errors by block only with one group)."""
        try:
            groups = blocks.get_block_ids()
        except Exception:  # not vLLM's KVCacheBlocks: nothing to name
            return ()
        if len(groups) != 1:
            return ()
        size = self._block_size
        return tuple(groups[0][matched_at // size : -(-(matched_at + tokens) // size)])

    def build_connector_meta(self, scheduler_output: Any) -> NamedMultiConnectorMetadata:
        children: dict[str, Any] = {}
        failures: list[tuple[str, Exception]] | None = None
        for name, child in self._items:  # every step: no helper
            try:
                children[name] = child.build_connector_meta(scheduler_output)
            except Exception as exc:
                failures = _failed(failures, name, exc)
                children[name] = None
        if failures is not None:
            self._absorb(
                "build_connector_meta",
                failures,
                "its workers get no metadata this step and its loads of this step are "
                "reported failed",
            )
            self._fail_step_loads({name for name, _ in failures})
        if self._load_since:
            self._overdue_loads()
        # Built by this connector: the dicts are new and the saver names tuples, so the
        # metadata takes them as they are instead of copying them.
        metadata = NamedMultiConnectorMetadata.owning(children, self._new_savers, self._new_loads)
        self._new_savers = {}
        self._new_loads = {}
        if self._sync_loads or self._failed_loads or self._load_errors:
            metadata.sync_loads = self._sync_loads
            metadata.failed_loads = self._failed_loads
            metadata.load_errors = tuple(self._load_errors)
            self._sync_loads = {}
            self._failed_loads = {}
            self._load_errors = []
        return metadata

    def _overdue_loads(self) -> None:
        """Each loader still owing a load's report past ``report_overdue_seconds`` is counted
        and warned about, once per request; vLLM keeps the request waiting for it."""
        limit = self._overdue
        now = time.monotonic()
        for request_id, began in take_older(self._load_since, now - limit):
            loader = self._loader(request_id)
            if loader is not None:
                self._trouble.overdue("load", loader, request_id, now - began, limit)

    def _fail_step_loads(self, names: set[str]) -> None:
        """The loads of this step by the children ``names`` (which sent their workers no
        metadata) are reported failed: vLLM recomputes them."""
        for request_id, name in list(self._new_loads.items()):
            if name in names:
                del self._new_loads[request_id]
                self._loads_owed.pop(request_id, None)
                self._failed_loads[request_id] = name
                self._sides[name].failed_loads.add(request_id)
        for request_id, (name, external) in list(self._sync_loads.items()):
            if name in names:
                del self._sync_loads[request_id]
                self._load_errors.extend(external)
                self._sides[name].failed_loads.add(request_id)

    def update_connector_output(self, connector_output: Any) -> None:
        """Each child sees the output with its own worker metadata and its own KV cache events
        (by name); then the completions vLLM acts on next are made one per request.

        vLLM calls this before it acts on ``finished_sending`` and ``finished_recving``: a
        request that finished with saves handed off has its load's completion taken here (its
        save's completion is the one vLLM sees), and one still owed reports by a child that
        reports on fewer workers than all is held back until they arrived.
        """
        worker_meta = connector_output.kv_connector_worker_meta
        if (
            worker_meta is not None
            and worker_meta.__class__ is not NamedMultiConnectorWorkerMetadata
        ):
            _named(worker_meta, NamedMultiConnectorWorkerMetadata, "kv_connector_worker_meta")
        events = connector_output.kv_cache_events
        if events is not None and events.__class__ is not NamedKVEvents:
            _named(events, NamedKVEvents, "kv_cache_events")
        self._route_output(connector_output, worker_meta, events)
        if connector_output.failed_recving:
            self._mark_failed(connector_output.failed_recving)
        if self._loads_owed or self._counted_failed:
            self._count_loads(connector_output, worker_meta)
        if (self._saving and (connector_output.finished_recving or self._counted_owed)) or (
            worker_meta is not None and worker_meta.sent
        ):
            self._one_completion(connector_output, worker_meta)
        if self._sent_while_loading_here or (self._loads_owed and self._saving):
            self._hold_for_loads(connector_output)
        # The workers report a request finished sending only once every saver confirmed, and
        # vLLM's output aggregator only once every worker did.
        tracker = self._tracker
        finished = connector_output.finished_sending
        if finished:
            saving = self._saving
            for request_id in finished:
                saving.pop(request_id, None)
            if self._awaited_here:
                self._confirm_here(finished)
        failed = connector_output.failed_recving
        for request_id in self._recving:
            self._loads_in_flight.discard(request_id)
            self._load_since.pop(request_id, None)
            loader = self._loader(request_id)
            if (
                loader is not None
                and tracker.load_finished(request_id, loader) is _APPLIED
                and not (failed and request_id in failed)  # counted by _mark_failed
            ):
                self._hits.add(loader, "loads_completed")
        self._recving = ()
        tracker.take()

    def _mark_failed(self, request_ids: Any) -> None:
        """The loads of ``request_ids`` failed: their loaders are not asked again for them."""
        for request_id in request_ids:
            loader = self._loader(request_id)
            if loader is not None:
                self._sides[loader].failed_loads.add(request_id)
                self._hits.add(loader, "loads_failed")

    def _route_output(self, connector_output: Any, worker_meta: Any, events: Any) -> None:
        """Every child's ``update_connector_output``, with its own entries of ``worker_meta``
        and ``events`` in place of ours (put back afterwards); every failure raised together."""
        failures: list[tuple[str, Exception]] | None = None
        self._recving = connector_output.finished_recving or ()
        try:
            for name, child in self._fan.update_connector_output:
                try:
                    if worker_meta is not None:
                        connector_output.kv_connector_worker_meta = worker_meta.children.get(name)
                    if events is not None:
                        connector_output.kv_cache_events = events.children.get(name)
                    child.update_connector_output(connector_output)
                except Exception as exc:
                    failures = _failed(failures, name, exc)
        finally:
            connector_output.kv_connector_worker_meta = worker_meta
            connector_output.kv_cache_events = events
        if failures is not None:
            self._absorb("update_connector_output", failures)

    def _one_completion(self, connector_output: Any, worker_meta: Any) -> None:
        """Make ``connector_output``'s completions one per request for the requests handed off.

        A load completion of a request whose saves were handed off is taken (the scheduler's
        record of the load still drains): the request's one completion is its save's, which
        each worker holds back until its load reported. A request every worker reported while
        counted savers still owe reports is held back; it is passed on in the step their last
        report arrives. Every forwarded report is counted, whatever else is owed.
        """
        saving = self._saving
        recving = connector_output.finished_recving
        if recving and not saving.keys().isdisjoint(recving):
            connector_output.finished_recving = {r for r in recving if r not in saving} or None
        sent = None if worker_meta is None else worker_meta.sent
        if not self._counted_owed and not sent:
            return
        owed = self._counted_owed
        done = self._workers_done
        sending = set(connector_output.finished_sending or ())
        for request_id in [r for r in sending if r in owed]:
            sending.discard(request_id)
            done.add(request_id)
        if sent:
            for name, counts in sent.items():
                self._count_sent(name, counts, sending)
        connector_output.finished_sending = sending or None

    def _count_loads(self, connector_output: Any, worker_meta: Any) -> None:
        """Hold back the load completions of the loads a counted child owes reports of; pass
        each on (with its failure, if a counted report said so) once every worker reported it
        and the child's reports reached its count, in the step the last of those arrived."""
        owed = self._loads_owed
        done = self._recv_done
        recving = set(connector_output.finished_recving or ())
        for request_id in [r for r in recving if r in owed]:
            recving.discard(request_id)
            done.add(request_id)
        if worker_meta is not None and worker_meta.loaded:
            for name, counts in worker_meta.loaded.items():
                failed = worker_meta.load_failed.get(name, {})
                for request_id, n in counts.items():
                    self._count_loaded(name, request_id, n, recving, request_id in failed)
        if self._counted_failed and not self._counted_failed.isdisjoint(recving):
            failed_now = self._counted_failed & recving
            self._counted_failed -= failed_now
            connector_output.failed_recving = set(connector_output.failed_recving) | failed_now
        connector_output.finished_recving = recving or None
        self._recving = connector_output.finished_recving or ()

    def _count_loaded(
        self, name: str, request_id: str, n: int, recving: set[str], failed: bool
    ) -> None:
        """``n`` workers reported counted child ``name`` finished loading ``request_id``
        (``failed``: one of them reported it failed)."""
        entry = self._loads_owed.get(request_id)
        if entry is None or entry[0] != name:
            outcome = Outcome.unknown_request if entry is None else Outcome.phantom
            self._tally(outcome, name, n)
            return
        left = entry[1]
        self._tally(Outcome.applied, name, min(n, left))
        if failed:
            self._counted_failed.add(request_id)
        if n < left:
            self._loads_owed[request_id] = (name, left - n)
            return
        if n > left:
            self._tally(Outcome.duplicate, name, n - left)
        del self._loads_owed[request_id]
        if request_id in self._recv_done:
            self._recv_done.discard(request_id)
            recving.add(request_id)

    def _hold_for_loads(self, connector_output: Any) -> None:
        """One completion per request: a request's save completion is held back while a
        counted child still owes reports of its load (its workers do not hold it back: they
        do not await such a load), and passed on once the last of them arrived."""
        owed = self._loads_owed
        held = self._sent_while_loading_here
        sending = set(connector_output.finished_sending or ())
        for request_id in [r for r in held if r not in owed]:
            held.discard(request_id)
            sending.add(request_id)
        for request_id in [r for r in sending if r in owed]:
            sending.discard(request_id)
            held.add(request_id)
        connector_output.finished_sending = sending or None

    def _tally(self, outcome: Outcome, name: str, n: int) -> None:
        """Count ``n`` forwarded reports of ``name`` as ``outcome``: past
        :data:`~multiconnector.rule.COUNTER_LIMIT` distinct keys, under the name
        :data:`~multiconnector.rule.OTHER_NAMES` (the workers' metadata may name anything)."""
        count(self._counted_outcomes, outcome, name, n)

    def _count_sent(self, name: str, counts: Mapping[str, int], sending: set[str]) -> None:
        """``counts[r]`` workers reported counted saver ``name`` finished sending ``r``;
        ``sending`` holds the requests passed on to vLLM in this output (so far)."""
        owed = self._counted_owed
        for request_id, n in counts.items():
            mine = owed.get(request_id)
            if mine is None or name not in mine:
                self._ignore_sent(name, request_id, n, sending)
                continue
            left = mine[name]
            self._tally(Outcome.applied, name, min(n, left))
            if n < left:
                mine[name] = left - n
                continue
            del mine[name]
            if not mine:
                del owed[request_id]
                if request_id in self._workers_done:
                    self._workers_done.discard(request_id)
                    sending.add(request_id)
            if n > left:
                self._ignore_sent(name, request_id, n - left, sending)

    def _ignore_sent(self, name: str, request_id: str, n: int, sending: set[str]) -> None:
        """Count ``n`` forwarded reports of ``name`` that ``request_id`` does not await, under
        the outcome :func:`~multiconnector.rule.transfer_report` gives them on these books: a
        handed-off request awaits the reports its counted savers still owe, and is finished
        once it is passed on to vLLM (in this output); any other request is unknown here."""
        savers = self._saving.get(request_id)
        if savers is None:
            verdict = transfer_report(None, (), (), (), name)
        else:
            counted = self._counted
            verdict = transfer_report(
                State.finished if request_id in sending else State.finishing,
                tuple(self._counted_owed.get(request_id, ())),
                tuple([saver for saver in savers if saver in counted]),
                (),
                name,
            )
        self._tally(refined(verdict[0], name in self._children, True), name, n)

    def _confirm_here(self, finished: set[str]) -> None:
        """Confirm, on the scheduler's own books, the names still awaited there for the
        requests of ``finished`` (a garbage answer awaited conservatively: see
        :meth:`_handed_off_savers`)."""
        tracker = self._tracker
        confirmed: dict[str, list[str]] = {}
        for request_id in finished:
            if request_id not in self._awaited_here:
                continue
            self._awaited_here.discard(request_id)
            record = tracker.peek(request_id)
            if record is not None:
                for name in record.awaiting:
                    confirmed.setdefault(name, []).append(request_id)
        for name, request_ids in confirmed.items():
            tracker.transfer_finished_many(name, request_ids)

    def register_finished_partial_tail(
        self,
        request: Any,
        block_ids: tuple[list[int], ...],
        partial_tail_offloads: list[tuple[int, int, int]],
    ) -> bool:
        accepted = self._gather_soft(
            "register_finished_partial_tail",
            lambda _, c: c.register_finished_partial_tail(
                request, block_ids, partial_tail_offloads
            ),
            "counted as not taking the tail",
            self._savers,  # a load-only child takes no save
        )
        names = tuple(name for name, took in accepted.items() if took)
        if names:
            self._tail_savers[request.request_id] = names
        return bool(names)

    def request_finished(
        self, request: Any, block_ids: list[int]
    ) -> tuple[bool, dict[str, Any] | None]:
        """Ask every child; merge params into a new dict; tell workers who saves, by name.

        A params clash raises :class:`~multiconnector.KeyClashError` once the bookkeeping is
        consistent: the children that committed to a save are still awaited and still sent to
        the workers, so no block is freed under a save in progress.
        """
        return self._finish(request, block_ids, all_groups=False)

    def request_finished_all_groups(
        self, request: Any, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        """:meth:`request_finished` with every KV cache group's block ids (``SupportsHMA``).

        As in vLLM's: when every child supports HMA each is asked its
        ``request_finished_all_groups``; otherwise there must be exactly one group, and each
        child is asked its ``request_finished`` with that group's blocks. The guarantees are
        :meth:`request_finished`'s.
        """
        if self._all_support_hma:
            return self._finish(request, block_ids, all_groups=True)
        if not isinstance(block_ids, tuple | list) or len(block_ids) != 1:
            raise HMAUnsupportedError(
                f"block_ids={shown(block_ids)} must hold exactly one KV cache group's block ids: "
                f"these children do not support HMA: {without_hma(tuple(self._specs.values()))}"
            )
        return self._finish(request, block_ids[0], all_groups=False)

    def _finish(
        self, request: Any, blocks: Any, *, all_groups: bool
    ) -> tuple[bool, dict[str, Any] | None]:
        if request.request_id in self._saving:
            # Finished before and its saves handed off: a duplicate, which asks nobody (as the
            # core refuses a second request_finished); vLLM still holds the blocks.
            return True, None
        request_id = self._ensure(request)
        self._all_groups = blocks if all_groups else None
        tracker = self._tracker
        call = self._call
        call.start()
        answered = False
        params: dict[str, Any] | None = None
        try:
            _, params = tracker.request_finished(request_id, () if all_groups else blocks)
            answered = True
        except (ConnectorFailures, KeyClashError, InvalidParamsError) as failures:
            # The core made its books consistent first (a garbage answer awaited, a clash's
            # params dropped): each child's failure is its own, not vLLM's.
            params = failures.result[1] if failures.result is not None else None
            self._absorb_finish(failures)
        finally:
            self._all_groups = None
            handed = call.handed_off
            # Answered without an error: no child answered garbage (the core raises for it), so
            # nothing is awaited on the scheduler's books, only what the children handed off.
            savers = (
                self._shared_savers(tuple(handed))
                if answered and handed
                else self._handed_off_savers(request_id, handed)
            )
            if savers:
                self._new_savers[request_id] = savers
                self._saving[request_id] = savers
                if self._known_counts():
                    self._owe_counted(request_id, savers)
            self._live.pop(request_id, None)
            if self._matched_at:
                self._matched_at.pop(request_id, None)
            if self._tail_savers:
                self._tail_savers.pop(request_id, None)
            for side in self._sides.values():
                side.forget(request_id)
            record = tracker.peek(request_id)
            if (
                record is not None
                and load_owed(record.loader, record.loaded, record.loader_gone)
                and request_id not in self._loads_in_flight
            ):
                # No load of it is in flight, and no report of one will come: a synchronous load
                # ends within the step that scheduled it (vLLM reports none), and a load never
                # started never ends. The record would otherwise be held forever. Counted as the
                # loader's drained load; after shutdown() nothing is (the books stay as they are).
                assert record.loader is not None  # owed: a loader was chosen
                with suppress(ShutDownError):
                    tracker.load_finished(request_id, record.loader)
            tracker.take()
        return bool(savers), params

    def _absorb_finish(self, failures: Exception) -> None:
        """Count and log what went wrong in a request_finished, under the children's names: a
        clash under the later children that supplied a key, bad params under ``params``."""
        found: list[tuple[str, BaseException]] = []
        errors = failures.exceptions if isinstance(failures, ConnectorFailures) else (failures,)
        names = failures.failed if isinstance(failures, ConnectorFailures) else ()
        for index, exc in enumerate(errors):
            if isinstance(exc, KeyClashError):
                later = {name for names_ in exc.clashes.values() for name in names_[1:]}
                found.extend((name, exc) for name in self._children if name in later)
            elif index < len(names):
                found.append((names[index], exc))
            else:
                found.append(("params", exc))
        self._absorb(
            "request_finished",
            found,
            "its params dropped (awaited if it answered garbage: it may have started a save; "
            "not if it raised)",
        )

    def _owe_counted(self, request_id: str, savers: tuple[str, ...]) -> None:
        counted = self._counted
        owed = {name: counted[name] for name in savers if name in counted}
        if owed:
            self._counted_owed[request_id] = owed

    # -- what the sides ask (SchedulerOwner) ----------------------------------------------------

    def live_request(self, request_id: str) -> Any:
        """The live vLLM ``Request`` of ``request_id``."""
        return self._live[request_id]

    def finish_groups(self) -> tuple[list[int], ...] | None:
        """Every KV cache group's block ids while request_finished_all_groups asks the children;
        else ``None``."""
        return self._all_groups

    def took_tail(self, request_id: str, name: str) -> bool:
        """Whether child ``name`` took ``request_id``'s partial tail at finish (it owes a
        "finished sending" report as a saver does)."""
        tails = self._tail_savers
        return bool(tails) and name in tails.get(request_id, ())

    def _handed_off_savers(self, request_id: str, handed: list[str]) -> tuple[str, ...]:
        """The names the workers are to await for ``request_id``: the children that committed
        to a save (``handed``), and any the scheduler's record awaits (a garbage answer), in
        configuration order, as a shared tuple."""
        record = self._tracker.peek(request_id)
        if record is not None and record.state is State.finishing and record.awaiting:
            self._awaited_here.add(request_id)
            owing = {*handed, *record.awaiting}
            return self._shared_savers(tuple([name for name in self._children if name in owing]))
        return self._shared_savers(tuple(handed)) if handed else ()

    def _shared_savers(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The one tuple equal to ``names`` that every request with these savers shares."""
        shared = self._saver_tuples.get(names)
        if shared is None:
            shared = self._saver_tuples.setdefault(names, names)
        return shared

    def take_events(self) -> list[Any]:
        events: list[Any] = []
        failures: list[tuple[str, Exception]] | None = None
        answers: dict[str, Any] = {}
        for name, child in self._fan.take_events:  # every step: no helper
            try:
                answers[name] = found = list(child.take_events())
            except Exception as exc:
                failures = _failed(failures, name, exc)
                continue
            events.extend(found)
        if failures is not None:
            self._absorb("take_events", failures, "its events of this step dropped")
        return events

    def has_pending_block_frees(self) -> bool:
        answers = self._gather_soft(
            "has_pending_block_frees", lambda _, c: c.has_pending_block_frees(), "counted as no"
        )
        return any(answers.values())

    def has_pending_push_work(self) -> bool:
        answers = self._gather_soft(
            "has_pending_push_work", lambda _, c: c.has_pending_push_work(), "counted as no"
        )
        return any(answers.values())

    def set_xfer_handshake_metadata(self, metadata: dict[int, Any]) -> None:
        """Each child gets its own entries of :class:`NamedHandshakeMetadata`, by name."""
        self._route_handshake(metadata, "set_xfer_handshake_metadata")

    def set_xfer_handshake_metadata_pp_aware(self, metadata: dict[tuple[int, int], Any]) -> None:
        self._route_handshake(metadata, "set_xfer_handshake_metadata_pp_aware")

    def _route_handshake(self, metadata: Mapping[Any, Any], method: str) -> None:
        """Every child, in order, gets its own entries (``{}`` when it has none: vLLM's class
        calls every child too)."""

        def route(name: str, child: Any) -> None:
            mine = {
                rank: meta.children[name]
                for rank, meta in metadata.items()
                if isinstance(meta, NamedHandshakeMetadata) and name in meta.children
            }
            getattr(child, method)(mine)

        self._gather(method, route)

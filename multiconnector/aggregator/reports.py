"""The save side's reports: a connector finished saving a request's KV.

:meth:`~MultiConnector.transfer_finished` (the hottest event) and
:meth:`~MultiConnector.transfer_finished_many` (a batch), each with the decision and the applied
case inlined; the drain of a cancelled request, and why an ignored report is ignored.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Final

from .._validate import check_block_ids, check_blocks, check_name, check_request_id, shown
from ..errors import ConnectorFailures, InvalidArgumentError
from ..machine import DECISIONS, TERMINAL, RequestTransferState, Step, step
from ..outcome import Outcome
from ._books import (
    _APPLIED,
    _CANCELLED,
    _DRAINED,
    _DUPLICATE,
    _NOT_READY,
    _PHANTOM,
    _TERMINAL,
    _UNKNOWN_CONNECTOR,
    _UNKNOWN_REQUEST,
    _UNREGISTERED,
    Books,
)

__all__ = ["Reports"]

# The hot event's compiled decisions (see machine.DECISIONS): one dict lookup and one guard call.
_ON_TRANSFER_FINISHED: Final = DECISIONS["transfer_finished"]


class Reports(Books):
    """``transfer_finished`` and ``transfer_finished_many``: saves reported."""

    __slots__ = ()

    def transfer_finished(self, request_id: str, name: str, blocks: Sequence[int] = ()) -> Outcome:
        """Connector ``name`` reports that it finished saving ``request_id``'s KV.

        Applied only when the request is live and awaits ``name``: the name stops being awaited,
        the connector's ``on_finished(request_id, blocks)`` is called (after the update, outside
        any lock), and a request with nothing left to await becomes ``finished``. Any other
        report is ignored; the returned :class:`Outcome` says why.

        Raises :class:`InvalidNameError` when ``name`` is not a connector name (an ``int`` index,
        ``""``, say) and :class:`InvalidArgumentError` for a bad ``request_id`` or ``blocks``.
        When ``on_finished`` raises, :class:`ConnectorFailures` carries the outcome applied as its
        ``result``.
        """
        if name.__class__ is not str:
            name = check_name(name)  # raises unless a str subclass, which it makes a str
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        if blocks.__class__ is not tuple and blocks.__class__ is not list:
            check_blocks(blocks)
        elif blocks:
            check_block_ids(blocks)
        if self._closed:
            self._shut("transfer_finished")
        index = hash(request_id) & self._mask
        lock = self._locks[index]
        lock.acquire()
        try:
            record = self._requests.get(request_id)
            # The decision and the applied case inlined: the hottest event skips method calls.
            # An ignored report is classified and counted by `_ignored`. transfer_finished_many
            # inlines the same; tests/test_batch.py checks the two against each other on
            # arbitrary sequences, and tests/test_stateful.py this one against a reference model.
            dest = None
            if record is not None and name in record.awaiting:
                decision = _ON_TRANSFER_FINISHED.get(record.state)
                if decision is None:  # a state whose candidates need a walk (machine.DECISIONS)
                    dest = step(record, "transfer_finished", name)
                else:
                    guard, yes, no = decision
                    dest = yes if guard is None or guard(record, name) else no
            if dest is None:
                outcome = self._ignored(record, name, index)
            elif dest is _CANCELLED:  # the drain: it stays cancelled, awaiting one name less
                assert record is not None
                outcome = self._drain(record, "transfer_finished", name, index)
            else:
                assert record is not None
                awaiting = record.awaiting
                following = self._without.get(awaiting)
                rest = None if following is None else following.get(name)
                record.awaiting = self._minus(awaiting, name) if rest is None else rest
                source = record.state
                record.state = dest
                if record.history is not None:
                    record.history.append(Step("transfer_finished", source, dest, name))
                if (
                    dest is not source
                    and dest in TERMINAL
                    and (record.loader is None or record.loaded)
                ):  # else its load is in flight: load_finished or connector_gone settles it
                    self._done.append(record)  # last: take() may hand it over at once
                applied = self._applied[index]
                applied[name] = applied.get(name, 0) + 1
                outcome = _APPLIED
        finally:
            lock.release()
        if outcome is not _APPLIED:
            self._log_ignored("transfer_finished", request_id, name, outcome)
            return outcome
        # The registry's current entries, read as `entry(name)` does, without the call.
        entry = self._registry._entries.get(name)
        if entry is not None and entry.on_finished is not None:
            self._call_back(outcome, entry, entry.on_finished, request_id, blocks)
        return outcome

    def transfer_finished_many(
        self, name: str, request_ids: Iterable[str], blocks: Sequence[int] = ()
    ) -> list[Outcome]:
        """Connector ``name`` reports that it finished saving each of ``request_ids``.

        Each report gets the decision :meth:`transfer_finished` would give it — the same
        outcomes, counts and states — without a method call, argument checks and a lock round
        per report. Servers learn completions in batches (a vLLM worker's ``get_finished``
        returns one set per connector per step), and a step's worth of reports is where a
        per-call overhead adds up. Each report is applied under its request's lock; a batch of
        at least half as many ids as there are lock stripes holds every stripe while it
        applies, instead of one lock round per report.

        Unlike one call per id, every report of the batch is applied before any ``on_finished``
        call: the callbacks (and debug logging) come afterwards, in the order of
        ``request_ids``, with no lock held. So a callback that cancels a request or unregisters
        the connector does not change how the rest of the batch was applied. A connector
        unregistered (or replaced) by then is not called back for the rest of the batch.

        Returns the outcomes in the order of ``request_ids``. Every argument is checked before
        any report is applied, so a bad one changes nothing: :class:`InvalidNameError` for
        ``name``, :class:`InvalidArgumentError` for ``request_ids`` that is a ``str`` or not
        iterable, for an item that is not a ``str``, or for bad ``blocks``. When ``on_finished``
        callbacks raise, every report is still applied and every callback still called, then
        :class:`ConnectorFailures` is raised with the outcomes as its ``result``.

        .. versionadded:: 0.1.0
        """
        if name.__class__ is not str or name not in self._registry._entries:
            name = check_name(name)  # a registered plain str is a valid name: no scan
        if blocks.__class__ is not tuple and blocks.__class__ is not list:
            check_blocks(blocks)
        elif blocks:
            check_block_ids(blocks)
        if self._closed:
            self._shut("transfer_finished_many")
        # Walked twice (reports, then callbacks): a tuple or frozenset as it is, anything else
        # copied once, so a callback or another thread changing the caller's list or set (vLLM's
        # get_finished gives sets) cannot change what the batch is.
        ids: Collection[str] = request_ids  # type: ignore[assignment]
        kind = ids.__class__
        if kind is not tuple and kind is not frozenset:
            if (kind is not list and kind is not set) and (
                isinstance(ids, str | bytes) or not isinstance(ids, Iterable)
            ):
                raise InvalidArgumentError(
                    f"request_ids={shown(ids)} must be an iterable of request ids (str)"
                )
            ids = list(ids)
        for request_id in ids:
            if request_id.__class__ is not str or not request_id:
                check_request_id(request_id, "an item of request_ids")
                ids = [check_request_id(i, "an item of request_ids") for i in ids]
                break
        outcomes: list[Outcome] = []
        append = outcomes.append
        requests, locks, mask, ignore = self._requests, self._locks, self._mask, self._ignored
        decisions, without, done, applied_counts = (
            _ON_TRANSFER_FINISHED,
            self._without,
            self._done,
            self._applied,
        )
        # A batch as large as half the stripes takes every stripe lock once, in order (as
        # _connector_gone does, so no two callers can deadlock), instead of one lock round per
        # report: a lock round costs about as much as the report itself.
        every = len(ids) >= len(locks) >> 1
        applied_here = 0
        ignored = False
        if every:
            for lock in locks:
                lock.acquire()
        try:
            for request_id in ids:
                index = hash(request_id) & mask
                if not every:
                    lock = locks[index]
                    lock.acquire()
                try:
                    record = requests.get(request_id)
                    # The decision and the applied case inlined, as in transfer_finished.
                    dest = None
                    if record is not None and name in record.awaiting:
                        decision = decisions.get(record.state)
                        if decision is None:  # candidates that need a walk
                            dest = step(record, "transfer_finished", name)
                        else:
                            guard, yes, no = decision
                            dest = yes if guard is None or guard(record, name) else no
                    if dest is None:
                        append(ignore(record, name, index))
                        ignored = True
                        continue
                    assert record is not None
                    if dest is _CANCELLED:  # the drain, as in transfer_finished
                        append(self._drain(record, "transfer_finished", name, index))
                        ignored = True  # logged, not called back
                        continue
                    awaiting = record.awaiting
                    following = without.get(awaiting)
                    rest = None if following is None else following.get(name)
                    record.awaiting = self._minus(awaiting, name) if rest is None else rest
                    source = record.state
                    record.state = dest
                    if record.history is not None:
                        record.history.append(Step("transfer_finished", source, dest, name))
                    if (
                        dest is not source
                        and dest in TERMINAL
                        and (record.loader is None or record.loaded)
                    ):
                        done.append(record)
                    if every:
                        applied_here += 1  # counted once, below, while every lock is held
                    else:
                        applied = applied_counts[index]
                        applied[name] = applied.get(name, 0) + 1
                    append(_APPLIED)
                finally:
                    if not every:
                        lock.release()
        finally:
            if every:
                if applied_here:  # counted even when the loop was interrupted
                    applied = applied_counts[0]
                    applied[name] = applied.get(name, 0) + applied_here
                for lock in reversed(locks):
                    lock.release()
        # No lock held from here: callbacks may call back into the aggregator.
        registry = self._registry
        entries = registry._entries  # a new dict on every registry change
        entry = entries.get(name)
        on_finished = None if entry is None else entry.on_finished
        if on_finished is None and not ignored:
            return outcomes  # nothing to call back, nothing ignored to log
        failures: list[Exception] | None = None
        for request_id, outcome in zip(ids, outcomes, strict=True):
            if outcome is not _APPLIED:
                self._log_ignored("transfer_finished", request_id, name, outcome)
            elif on_finished is not None and (
                registry._entries is entries or registry._entries.get(name) is entry
            ):  # still registered: a callback may have unregistered it
                try:
                    on_finished(request_id, blocks)
                except Exception as exc:
                    failures = [] if failures is None else failures
                    failures.append(exc)
        if failures is not None:
            raise ConnectorFailures(
                f"connector {name!r} raised in {len(failures)} callback(s)",
                failures,
                failed=[name] * len(failures),
                result=outcomes,
            )
        return outcomes

    def _drain(self, record: RequestTransferState, event: str, name: str, index: int) -> Outcome:
        """A report from ``name``, which cancelled ``record`` awaits: it is released from it and
        stays cancelled; counted as drained. The caller holds lock ``index``."""
        record.awaiting = self._minus(record.awaiting, name)
        if record.history is not None:
            record.history.append(Step(event, _CANCELLED, _CANCELLED, name))
        self._count(index, _DRAINED, name)
        self._settle(record)
        return _DRAINED

    def _ignored(self, record: RequestTransferState | None, name: str, index: int) -> Outcome:
        """Count and return why ``name``'s report for ``record`` (``None``: not held) is
        ignored, once the decision found no transition; the caller holds lock ``index``."""
        if name not in self._registry._entries:  # a registered name is a valid one
            check_name(name)  # before anything is counted
        outcome = _UNKNOWN_REQUEST if record is None else self._classify(record, name)
        self._count(index, outcome, name)
        return outcome

    def _classify(self, record: RequestTransferState, name: str) -> Outcome:
        """Why a report from ``name`` for ``record`` is ignored."""
        if record.state in TERMINAL:
            return _TERMINAL
        if name in record.abandoned:
            return _UNREGISTERED
        if name in record.expected:
            return _DUPLICATE
        entry = self._registry.entry(name)
        if entry is None:
            return _UNKNOWN_CONNECTOR
        if entry.connector is None:
            return _NOT_READY
        return _PHANTOM

"""The save side's reports: a connector finished saving a request's KV.

:meth:`~MultiConnector.transfer_finished` (the hottest event) and
:meth:`~MultiConnector.transfer_finished_many` (a batch) apply each report as the transfer
report rule's verdict says (:mod:`multiconnector.rule`, the one definition), in ``_report``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable, Sequence

from .._validate import (
    check_block_ids,
    check_blocks,
    check_name,
    check_request_id,
    check_request_ids,
)
from ..errors import ConnectorFailures
from ..machine import RequestTransferState, Step
from ..outcome import Outcome
from ..rule import safe_to_hand_back
from ._books import (
    _APPLIED,
    _CANCELLED,
    _DRAINED,
    _EARLY,
    _PHANTOM,
    _UNKNOWN_REQUEST,
    Books,
    logger,
)

__all__ = ["Reports"]


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

        Accepted after :meth:`shutdown` too (from inside a connector's own ``shutdown()``, say):
        a report settles what a connector owes, it asks nothing new.
        """
        if name.__class__ is not str:
            name = check_name(name)  # raises unless a str subclass, which it makes a str
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        if blocks.__class__ is not tuple and blocks.__class__ is not list:
            check_blocks(blocks)
        elif blocks:
            check_block_ids(blocks)
        index = hash(request_id) & self._mask
        lock = self._locks[index]
        lock.acquire()
        try:
            outcome = self._report(self._requests.get(request_id), name, index, blocks)
        finally:
            lock.release()
        if outcome is not _APPLIED:
            self._log_ignored("transfer_finished", request_id, name, outcome)
            return outcome
        # entry(name)'s value, read without the call (~2 % of a lifecycle: docs/bench.md).
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
        :class:`ConnectorFailures` is raised with the outcomes as its ``result``. Accepted after
        :meth:`shutdown`, as :meth:`transfer_finished` is.

        .. versionadded:: 0.1.0
        """
        if name.__class__ is not str or name not in self._registry.entries:
            name = check_name(name)  # a registered plain str is a valid name: no scan
        if blocks.__class__ is not tuple and blocks.__class__ is not list:
            check_blocks(blocks)
        elif blocks:
            check_block_ids(blocks)
        ids = check_request_ids(request_ids)
        kind = ids.__class__
        if ids is request_ids and kind is not tuple and kind is not frozenset:
            # Walked twice (reports, then callbacks): the caller's list or set (vLLM's
            # get_finished gives sets) copied once, so that a callback or another thread
            # changing it cannot change what the batch is.
            ids = list(ids)
        outcomes = self._reports(name, ids, blocks)
        return self._reported(name, ids, blocks, outcomes)

    def _reports(
        self, name: str, ids: Collection[str], blocks: Sequence[int] = ()
    ) -> list[Outcome]:
        """Apply ``name``'s report for each of ``ids`` (``blocks``: for an early one's
        callback), each under its request's lock; the outcomes, in order."""
        outcomes: list[Outcome] = []
        append, requests, report = outcomes.append, self._requests, self._report
        locks, mask = self._locks, self._mask
        if len(ids) >= len(locks) >> 1:
            # A batch as large as half the stripes takes every stripe lock once, in order (as
            # _connector_gone does, so no two callers can deadlock), instead of one lock round
            # per report.
            for lock in locks:
                lock.acquire()
            try:
                for request_id in ids:
                    record = requests.get(request_id)
                    append(report(record, name, hash(request_id) & mask, blocks))
            finally:
                for lock in reversed(locks):
                    lock.release()
            return outcomes
        for request_id in ids:
            index = hash(request_id) & mask
            lock = locks[index]
            lock.acquire()
            try:
                append(report(requests.get(request_id), name, index, blocks))
            finally:
                lock.release()
        return outcomes

    def _reported(
        self, name: str, ids: Collection[str], blocks: Sequence[int], outcomes: list[Outcome]
    ) -> list[Outcome]:
        """The batch's callbacks and debug logging, in the order of ``ids``, with no lock held
        (a callback may call back into the aggregator); raises :class:`ConnectorFailures` when
        callbacks raised, after every one was called."""
        registry = self._registry
        entries = registry.entries  # a new mapping on every registry change
        entry = entries.get(name)
        on_finished = None if entry is None else entry.on_finished
        if on_finished is None and not logger.isEnabledFor(logging.DEBUG):
            return outcomes  # nothing to call back, nothing to log
        failures: list[Exception] | None = None
        for request_id, outcome in zip(ids, outcomes, strict=True):
            if outcome is not _APPLIED:
                self._log_ignored("transfer_finished", request_id, name, outcome)
            elif on_finished is not None and (
                registry.entries is entries or registry.entry(name) is entry
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

    def _report(
        self,
        record: RequestTransferState | None,
        name: str,
        index: int,
        blocks: Sequence[int] = (),
    ) -> Outcome:
        """Apply ``name``'s transfer report to ``record`` (``None``: not held) as the rule's
        verdict says (:func:`multiconnector.rule.transfer_report`), and count it; the caller
        holds lock ``index``. The hottest path: the remembered verdict is read directly.

        While a request_finished asks about ``record``, a report from a ready connector it does
        not await is early: kept with its ``blocks`` (for ``on_finished``), not counted, and
        decided when the claim is dropped (:meth:`_drop_claim`)."""
        if record is None:
            outcome = _UNKNOWN_REQUEST
        else:
            try:  # the remembered verdict (a KeyError when ignored or new)
                outcome, dest, rest, completes = self._verdicts.by_state[record.state][
                    record.awaiting
                ][name]
            except KeyError:
                outcome, dest, rest, completes = self._verdicts.of(
                    record.state, record.awaiting, record.expected, record.abandoned, name
                )
            if outcome is _APPLIED:
                assert dest is not None
                source = record.state
                record.awaiting = rest
                record.state = dest
                if record.history is not None:
                    record.history.append(Step("transfer_finished", source, dest, name))
                if completes and safe_to_hand_back(
                    dest,
                    rest,
                    record.loader,
                    record.loaded,
                    record.loader_gone,
                    parts_owed=record.parts_owed,
                ):
                    # Else its load is in flight: load_finished or connector_gone settles it.
                    self._done.append(record)  # last: take() may hand it over at once
                applied = self._applied[index]
                applied[name] = applied.get(name, 0) + 1
                return outcome
            if outcome is _DRAINED:  # a cancelled request awaits one name less
                record.awaiting = rest
                if record.history is not None:
                    record.history.append(Step("transfer_finished", _CANCELLED, _CANCELLED, name))
                self._count(index, outcome, name)
                self._settle(record)
                return outcome
            if self._asking and id(record) in self._asking:
                early = self._early_report(record, name, blocks, index)
                if early is not None:
                    return early
        if name not in self._registry.entries:  # a registered name is a valid one
            check_name(name)  # before anything is counted
        if outcome is _PHANTOM:
            outcome = self._stranger(name)
        self._count(index, outcome, name)
        return outcome

    def _early_report(
        self, record: RequestTransferState, name: str, blocks: Sequence[int], index: int
    ) -> Outcome | None:
        """The rule's verdict on a report from ``name`` that ``record`` does not await, while a
        request_finished asks about it: ``early`` (kept), ``duplicate`` (kept already, counted)
        or ``None`` when ``name`` is no ready connector (the usual rules decide)."""
        if self._stranger(name) is not _PHANTOM:
            return None
        kept = self._early.get(id(record))
        outcome = self._verdicts.of(
            record.state, record.awaiting, record.expected, record.abandoned, name, early=kept or ()
        )[0]
        if outcome is _EARLY:
            if kept is None:
                kept = self._early[id(record)] = {}
            kept[name] = blocks
            return outcome
        self._count(index, outcome, name)
        return outcome

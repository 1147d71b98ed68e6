"""The load side: which connector loads a pending request's KV, and its report.

One load path: :meth:`~MultiConnector.choose_loader` tells the core the loader (and a split
load's parts), and :meth:`~MultiConnector.match_tokens` asks the ready connectors, then tells
the core the loader their answers chose (in two halves, which the model check runs as events of
their own, ``_ask_match`` and ``_record_match``: :mod:`multiconnector.check.halves`); both
mark the request (``_mark``) and apply the one update, ``_choose``.
:meth:`~MultiConnector.load_finished` applies its report, or the drain of a terminal request's
load, as the load report rule says (:func:`multiconnector.rule.load_report`, the one
definition). A load report that comes while ``match_tokens`` still asks is early: kept, and
decided once the loader is recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from .._validate import bad_argument, check_int, check_name, check_request_id, shown
from ..errors import (
    ConnectorFailures,
    InvalidArgumentError,
    InvalidValueError,
    RoleError,
    UnknownConnectorError,
    UnknownRequestError,
)
from ..lookup import choose
from ..machine import RequestTransferState
from ..outcome import Outcome
from ..registry import Entry, Role
from ..rule import load_report, part_report
from ._books import (
    _APPLIED,
    _DRAINED,
    _EARLY,
    _PENDING,
    _PHANTOM,
    _UNKNOWN_REQUEST,
    Books,
)

__all__ = ["Loading"]


#: What match_tokens' first half gathered, for its second half (:meth:`Loading._ask_match`):
#: the marked record, its lock stripe, the chosen loader's entry and count (``None``: nobody
#: has tokens), whether a connector answered ``None``, and the failures. A plain tuple, as
#: request_finished's halves hand over.
Matched = tuple[RequestTransferState, int, Entry | None, int, bool, list[Exception], list[str]]


class Loading(Books):
    """``match_tokens`` and ``load_finished``: the loader chosen, its report applied."""

    __slots__ = ()

    def match_tokens(
        self, request_id: str, num_computed_tokens: int = 0, *, remaining: int | None = None
    ) -> int | None:
        """How many tokens can be loaded for a pending request, choosing the loader by name.

        Ready connectors that have ``get_num_new_matched_tokens`` are asked in registration
        order, except those registered with ``role=Role.save``: they are never asked, so never
        chosen to load. The first that answers ``None`` ("not known yet") ends the asking, as
        in vLLM: the answer is ``None``, the rest are not asked, and nothing is remembered.
        Otherwise the first connector with more than 0 tokens is remembered as the request's
        ``loader`` and its count returned; 0 means nothing to load. A connector that raises
        counts as 0 and :class:`ConnectorFailures` is raised after the others were asked.

        A connector may start its load while it is asked and report it (``load_finished``)
        before this call returns: from inside ``get_num_new_matched_tokens`` or from a thread
        it starts there. Such a report is :attr:`Outcome.early`: kept, and decided once the
        loader is recorded, as if it arrived right after (applied, with its
        ``on_load_finished`` called by this call, when it is the loader chosen). After a
        ``None`` answer, which records nothing, it is decided against the loader recorded
        before (most often none: a ``phantom``). A ``cancel`` that overtakes the call leaves
        the request cancelled and records no loader; the cancelled request is not handed
        back by :meth:`take` until the call returns.

        Which answer wins is the aggregator's ``lookup`` policy (:class:`~multiconnector.Lookup`;
        ``first``, vLLM's rule, described above, by default): ``longest`` asks every connector
        and chooses the most tokens, a ``None`` holding the request until every connector
        answered. Under either, a ``None`` does not hold the request once a connector asked
        before it covers ``remaining``, the tokens the request has left to compute, when given.

        Raises :class:`UnknownRequestError` for a request that is not held; returns 0 for one
        that is no longer pending.
        """
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        if num_computed_tokens.__class__ is not int or num_computed_tokens < 0:
            num_computed_tokens = check_int(num_computed_tokens, "num_computed_tokens")
        if remaining is not None and (remaining.__class__ is not int or remaining < 0):
            remaining = check_int(remaining, "remaining")
        if self._closed:
            self._shut("match_tokens")
        asked = self._ask_match(request_id, num_computed_tokens, remaining)
        if asked.__class__ is int:
            return asked
        return self._record_match(*asked)  # type: ignore[misc]

    def _ask_match(
        self, request_id: str, num_computed_tokens: int = 0, remaining: int | None = None
    ) -> Matched | int:
        """match_tokens' first half: mark held ``request_id`` and ask the ready connectors, with
        no lock held. Returns what the second half, :meth:`_record_match`, takes (the mark is
        held until it drops it), or 0 for a request no longer pending (nobody asked)."""
        record = self._requests.get(request_id)
        if record is None:
            raise UnknownRequestError(f"request_id={request_id!r} is not held")
        if record.state is not _PENDING:
            return 0
        index = hash(request_id) & self._mask
        self._mark(record, index)  # a load report from now on is early (see load_finished)
        try:
            chooser, tokens, unknown, errors, failed = self._ask_tokens(
                request_id, num_computed_tokens, remaining
            )
        except BaseException:
            with self._locks[index]:
                applied = self._drop_match(record, index)
            # A kept report, decided; what interrupted the asking is raised, not a callback's.
            with contextlib.suppress(ConnectorFailures):
                self._call_back_load(record.request_id, applied)
            raise
        return record, index, chooser, tokens, unknown, errors, failed

    def _ask_tokens(
        self, request_id: str, num_computed_tokens: int, remaining: int | None
    ) -> tuple[Entry | None, int, bool, list[Exception], list[str]]:
        """Ask the ready connectors ``get_num_new_matched_tokens`` as the lookup policy reads
        their answers (:func:`~multiconnector.lookup.choose`), with no lock held: the chosen
        loader's entry and count, whether a ``None`` holds the lookup, the failures."""
        errors: list[Exception] = []
        failed: list[str] = []
        chooser, chosen, held = choose(
            self._lookup,
            self._answers(request_id, num_computed_tokens, errors, failed),
            remaining,
        )
        return chooser, chosen, held, errors, failed

    def _answers(
        self, request_id: str, num_computed_tokens: int, errors: list[Exception], failed: list[str]
    ) -> Iterator[tuple[Entry, int | None]]:
        """Each ready connector that may load, asked when read, with its answer; one that
        raises or answers what is not an int >= 0 or ``None`` is a failure (in ``errors`` and
        ``failed``), not an answer."""
        for entry in self._registry._ready:  # what ready_entries() returns, without the call
            if entry.get_num_new_matched_tokens is None:  # none, or its role is Role.save
                continue
            try:
                tokens = entry.get_num_new_matched_tokens(request_id, num_computed_tokens)
                if tokens is not None and (type(tokens) is not int or tokens < 0):
                    raise bad_argument(type(tokens) is int)(
                        f"connector {entry.name!r} answered tokens={shown(tokens)}; "
                        "must be an int >= 0 or None"
                    )
            except Exception as exc:
                errors.append(exc)
                failed.append(entry.name)
                continue
            yield entry, tokens

    def choose_loader(
        self, request_id: str, name: str | None, *, parts: Sequence[str] = ()
    ) -> None:
        """The caller chose ``name`` to load a pending request (``None``: nobody loads it).

        The same decision as :meth:`match_tokens`' second half, for a side that asks its
        connectors itself (the vLLM adapter's scheduler, whose children want vLLM's request
        object) or learns the choice from elsewhere (a vLLM worker, from the scheduler's
        metadata): the loader is recorded by name, and its load report is then applied by
        :meth:`load_finished` as if :meth:`match_tokens` had chosen it. No connector is called.
        A request that is no longer pending keeps what it had.

        A *split load* reads a request's tokens from several connectors, each a range of them:
        ``name`` loads the first range and ``parts`` names the loaders of the next ranges, in
        order. Each owes a load report of its own (:func:`multiconnector.rule.part_report`
        decides those of ``parts``), and the record is :attr:`~RequestTransferState.loading`
        until every one reported or was unregistered: :meth:`take` hands it back only then.

        Choosing again replaces the previous choice, its loader and parts (a report of theirs
        is then a phantom): choose again only once the previous load reported, as vLLM does
        (it looks a request up again only after its load completed or failed).

        Raises :class:`UnknownRequestError` for a request that is not held,
        :class:`~multiconnector.UnknownConnectorError` for a name that is not registered,
        :class:`~multiconnector.RoleError` for one registered with ``role=Role.save`` (it never
        loads), :class:`~multiconnector.InvalidValueError` for one registered with ``None`` (not
        ready: it never reports; a part registered with ``None`` owes nothing, and is abandoned
        at once) and :class:`~multiconnector.InvalidArgumentError` for ``parts`` that are not
        distinct names other than ``name`` (or any when ``name`` is ``None``); nothing changes
        then.

        .. versionadded:: 0.1.0
        """
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        chooser = None if name is None else self._loader_entry(name)
        if chooser is not None and chooser.connector is None:
            # A None slot never reports (its reports are not_ready): a load recorded for it
            # would hold the request until it is unregistered.
            raise InvalidValueError(
                f"name={chooser.name!r} is registered with None (not ready: it failed to "
                "start, say), so it cannot load; choose a ready connector, or None"
            )
        further = self._part_entries(name, parts) if parts else ()
        if self._closed:
            self._shut("choose_loader")
        record = self._requests.get(request_id)
        if record is None:
            raise UnknownRequestError(f"request_id={request_id!r} is not held")
        index = hash(request_id) & self._mask
        self._mark(record, index)
        self._call_back_load(request_id, self._choose(record, index, chooser, further))

    def _part_entries(self, name: str | None, parts: Any) -> tuple[tuple[str, Entry | None], ...]:
        """The entries of a split load's further loaders ``parts`` (see :meth:`choose_loader`),
        each checked as the loader is."""
        if isinstance(parts, str) or not isinstance(parts, Sequence):
            raise InvalidArgumentError(
                f"parts={shown(parts)} must be a sequence of connector names"
            )
        names = [check_name(part, "parts") for part in parts]
        if name is None or name in names or len(set(names)) < len(names):
            raise InvalidArgumentError(
                f"parts={shown(parts)} must be distinct names other than the loader "
                f"name={name!r}, and a split load needs a loader"
            )
        return tuple((part, self._loader_entry(part)) for part in names)

    def _loader_entry(self, name: str) -> Entry | None:
        """The registry's entry of ``name``, which :meth:`choose_loader` records as the loader
        (``None`` for a name registered with ``None``: its load report is then refused)."""
        registry = self._registry
        if name.__class__ is not str or name not in registry.entries:  # registered: a name
            name = check_name(name, "name")
            if name not in registry.entries:
                raise UnknownConnectorError(f"name={name!r} is not registered")
        if registry.role(name) is Role.save:
            raise RoleError(
                f"name={name!r} is registered with role=Role.save: it never loads",
                connector=name,
                answer=None,
            )
        return registry.entry(name)

    def _mark(self, record: RequestTransferState, index: int) -> None:
        """Mark ``record`` as asked about by one more match_tokens or choose_loader, under lock
        ``index``: a load report from a ready connector is early until the mark is dropped."""
        with self._locks[index]:
            matching = self._matching
            matching[id(record)] = matching.get(id(record), 0) + 1

    def _record_match(  # noqa: PLR0917
        self,
        record: RequestTransferState,
        index: int,
        chooser: Entry | None,
        tokens: int,
        unknown: bool,
        errors: list[Exception],
        failed: list[str],
    ) -> int | None:
        """match_tokens' second half: tell the core the loader its answers chose (nothing when
        a ``None`` held the lookup: :meth:`_choose`), and return (or raise) the result."""
        applied = self._choose(record, index, chooser, (), decisive=not unknown)
        result = None if unknown else tokens
        if applied is not None:
            try:
                self._call_back_load(record.request_id, applied)
            except ConnectorFailures as exc:
                errors += exc.exceptions
                failed += exc.failed
        if errors:
            raise ConnectorFailures(
                f"{len(errors)} connector(s) failed to answer for request {record.request_id!r}",
                errors,
                failed=failed,
                result=result,
            )
        return result

    def _choose(
        self,
        record: RequestTransferState,
        index: int,
        chooser: Entry | None,
        parts: tuple[tuple[str, Entry | None], ...],
        *,
        decisive: bool = True,
    ) -> list[str] | None:
        """The core told the loader of marked ``record`` (``chooser``, ``None``: nobody loads
        it) and a split load's ``parts`` (choose_loader, or match_tokens once its connectors
        answered; not ``decisive``: a ``None`` answer held the lookup, nothing is recorded):
        the one update of both, under the request's lock. A request no longer pending keeps
        what it had. Drops the mark and decides the load reports that came early; returns the
        names of those applied (see :meth:`_drop_match`)."""
        with self._locks[index]:
            if decisive and record.state is _PENDING:
                entry = self._registry.entry
                record.loader = chooser.name if chooser is not None else None
                record.loaded = False
                # Unregistered while we asked: its load report can never be applied.
                record.loader_gone = chooser is not None and entry(chooser.name) is not chooser
                if parts or record.parts:
                    self._record_parts(record, parts)
            return self._drop_match(record, index)

    def _record_parts(
        self, record: RequestTransferState, parts: tuple[tuple[str, Entry | None], ...]
    ) -> None:
        """Record a split load's further loaders on ``record`` (the caller holds its lock):
        each is owed its report, but one unregistered meanwhile (or registered with ``None``),
        whose report can never be applied: that one is abandoned."""
        entry = self._registry.entry
        names = tuple([name for name, _ in parts])
        record.parts = names
        record.parts_owed = tuple(
            [
                name
                for name, e in parts
                if e is not None and e.connector is not None and entry(name) is e
            ]
        )
        gone = [n for n in names if n not in record.parts_owed and n not in record.abandoned]
        if gone:
            record.abandoned = (*record.abandoned, *gone)

    def _drop_match(self, record: RequestTransferState, index: int) -> list[str] | None:
        """Drop one match_tokens' mark on ``record`` under lock ``index``; when it was the
        last, hand a record a cancel kept back to take() and decide the load reports that came
        early, each as if it arrived now. Returns the names of those applied (the loader's,
        and a split load's parts': whose ``on_load_finished`` the caller calls once the lock is
        released), if any."""
        matching = self._matching
        key = id(record)
        left = matching[key] - 1
        if left:
            matching[key] = left
            return None
        del matching[key]
        if self._parked:
            self._unpark(record)  # first: a drain below settles it once, not twice
        kept = self._early_loads.pop(key, None) if self._early_loads else None
        if kept is None:
            return None
        held = self._requests.get(record.request_id) is record  # else: taken meanwhile
        applied = None
        for name in kept:
            if self._load_report(record if held else None, name, index) is _APPLIED:
                applied = [name] if applied is None else [*applied, name]
        return applied

    def load_finished(self, request_id: str, name: str) -> Outcome:
        """Connector ``name`` reports that it finished loading ``request_id``'s KV.

        Applied once, from the chosen loader, while the request is live; the connector's
        ``on_load_finished(request_id)`` is then called, and the record's ``loaded`` is true
        from then on (on a terminal request the report is its drain, ``drained``, and sets it
        too). A duplicate, late, or phantom load
        report is ignored like any other: from the chosen loader unregistered since it was
        chosen (even when a new connector took its name) it is ``unregistered``, from a
        connector never chosen ``phantom``. When ``on_load_finished`` raises,
        :class:`ConnectorFailures` carries the outcome applied as its ``result``.

        A report from a ready connector while a :meth:`match_tokens` for the request is still
        asking is :attr:`Outcome.early` (a second one from the same name, ``duplicate``): kept,
        not counted yet, and decided by that call once it recorded the loader, as if it
        arrived right after (see :meth:`match_tokens`). Accepted after :meth:`shutdown`, as
        :meth:`transfer_finished` is.
        """
        name = check_name(name)
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        index = hash(request_id) & self._mask
        lock = self._locks[index]
        lock.acquire()
        try:
            outcome = self._load_report(self._requests.get(request_id), name, index)
        finally:
            lock.release()
        if outcome is not _APPLIED:
            self._log_ignored("load_finished", request_id, name, outcome)
            return outcome
        entry = self._registry.entry(name)
        if entry is not None and entry.on_load_finished is not None:
            self._call_back(outcome, entry, entry.on_load_finished, request_id)
        return outcome

    def _load_report(self, record: RequestTransferState | None, name: str, index: int) -> Outcome:
        """Apply ``name``'s load report to ``record`` (``None``: not held) as the rule's verdict
        says (:func:`multiconnector.rule.load_report`), and count it; the caller holds lock
        ``index``. While a match_tokens asks about ``record``, a report from a ready connector
        is kept (early, not counted) for :meth:`_drop_match` to decide."""
        if record is None:
            self._count(index, _UNKNOWN_REQUEST, name)
            return _UNKNOWN_REQUEST
        early = None
        if self._matching and id(record) in self._matching and self._stranger(name) is _PHANTOM:
            early = self._early_loads.get(id(record), ())
        if record.parts and early is None and name in record.parts and name != record.loader:
            outcome, record.parts_owed = part_report(
                record.state, record.parts_owed, record.abandoned, name
            )
            if outcome is _DRAINED:
                self._settle(record)
            self._count(index, outcome, name)
            return outcome
        outcome, loaded = load_report(
            record.state,
            record.loader,
            name,
            loaded=record.loaded,
            loader_gone=record.loader_gone,
            abandoned=record.abandoned,
            early=early,
        )
        if outcome is _EARLY:
            self._early_loads.setdefault(id(record), []).append(name)
            return outcome
        if outcome is _APPLIED or outcome is _DRAINED:  # the verdicts that set `loaded`
            record.loaded = loaded
            if outcome is _DRAINED:
                self._settle(record)
        elif outcome is _PHANTOM:
            outcome = self._stranger(name)
        self._count(index, outcome, name)
        return outcome

    def _call_back_load(self, request_id: str, names: list[str] | None) -> None:
        """The ``on_load_finished`` calls of the early load reports :meth:`_drop_match`
        applied (``names``; ``None``: none was), in order, with no lock held; the failures
        raised together once each was called."""
        if names is None:
            return
        failures: list[ConnectorFailures] = []
        for name in names:
            entry = self._registry.entry(name)
            if entry is not None and entry.on_load_finished is not None:
                try:
                    self._call_back(_APPLIED, entry, entry.on_load_finished, request_id)
                except ConnectorFailures as exc:
                    failures.append(exc)
        if len(failures) == 1:
            raise failures[0]
        if failures:
            raise ConnectorFailures(
                f"{len(failures)} connectors raised in their callbacks",
                [e for f in failures for e in f.exceptions],
                failed=[n for f in failures for n in f.failed],
                result=_APPLIED,
            )

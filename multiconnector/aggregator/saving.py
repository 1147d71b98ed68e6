"""The save side's decision: a request finished generating, and who saves it.

One finish path: :meth:`~MultiConnector.request_finished_by` tells the core the savers, and
:meth:`~MultiConnector.request_finished` asks every ready connector, then tells the core what
they answered (in two halves, ``_claim`` with ``_gather``, then ``_apply_answers``, which the
model check runs as events of their own: :mod:`multiconnector.check.halves`). Both claim the
request (``_claim``) and apply the one update, ``_finish_by``: the savers' awaited and expected
names (``_awaited``), then the decision ``_finish``, or the overtaken drain when a cancel came while
the connectors were asked. The claims that make a second, concurrent call a duplicate live here
too.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

from .._validate import (
    check_block_ids,
    check_blocks,
    check_bool,
    check_name,
    check_request_id,
    shown,
)
from ..errors import (
    ConnectorFailures,
    InvalidArgumentError,
    InvalidParamsError,
    KeyClashError,
    RoleError,
    UnknownConnectorError,
)
from ..machine import DECISIONS, STATES, TABLE, RequestTransferState
from ..outcome import Outcome
from ..params import merge_transfer_params
from ..registry import Entry, Role
from ..rule import SHARED_LIMIT, decide, finish_answer, finish_refused
from ._books import (
    _APPLIED,
    _CANCELLED,
    _DUPLICATE,
    _NO_NAME,
    _OVERTAKEN,
    _UNKNOWN_REQUEST,
    Awaited,
    Books,
)

__all__ = ["Saving"]

# The hot event's compiled decisions (see machine.DECISIONS): one dict lookup and one guard call.
_ON_REQUEST_FINISHED: Final = DECISIONS["request_finished"]
_LOAD: Final = Role.load
#: States with no ``request_finished`` transition at all: refused before asking any connector.
_NOT_FINISHABLE: Final = frozenset(
    state for state in STATES if not TABLE[state].get("request_finished")
)


#: The connectors that failed while asked, each with its exception (``None``: none failed).
Failures = list[tuple[str, Exception]] | None
#: What request_finished's first half gathered, for its second half (_apply_answers): the
#: claimed record, the claim the first half took (the second half drops that one, no other),
#: its lock stripe, the ready snapshot asked, the savers, the failures, the merged params and
#: the params error. A plain tuple: a NamedTuple took about 5x the time to build (timeit,
#: CPython 3.11).
Asked = tuple[
    RequestTransferState,
    object,
    int,
    tuple[Entry, ...],
    list[Entry],
    Failures,
    dict[str, Any] | None,
    Exception | None,
]


class Saving(Books):
    """``request_finished`` and ``request_finished_by``: the request awaits its savers."""

    __slots__ = ()

    def request_finished(
        self, request_id: str, blocks: Sequence[int] = ()
    ) -> tuple[Outcome, dict[str, Any] | None]:
        """The request finished generating: ask every ready connector, then update it once.

        Each ready connector's ``request_finished(request_id, blocks)`` is called in registration
        order and answers ``(saves_asynchronously, params)``: a ``bool`` and a ``Mapping`` or
        ``None``. With no asynchronous saver the request becomes ``finished``; otherwise
        ``finishing``, awaiting exactly those names. Params are merged by
        :func:`merge_transfer_params`. Returns ``(outcome, merged params)``.

        All answers are gathered first and the state changes once, so a failure cannot leave a
        committed save untracked. When a connector raises it counts as not saving (it made no
        promise). Any other answer that is not such a pair (``True``, ``None``, a 1- or 3-tuple,
        a list, a non-bool ``saves``, params that are not a Mapping) is awaited (it may have
        started a save), its params are dropped, and an :class:`InvalidAnswerError` naming the
        connector and the answer is raised. Either way the others are still asked and applied,
        and :class:`ConnectorFailures` is raised afterwards. A second ``request_finished`` for a
        request, while the first is still asking, is a ``duplicate`` and asks nobody. On a
        params clash the request is still updated from every answer (finishing and awaiting
        every saver: no save goes untracked, no block is freed early), its params stay ``None``,
        and :class:`KeyClashError` is raised (inside ``ConnectorFailures`` when a connector also
        failed). Each error's ``result`` is the ``(outcome, params)`` applied, and the state is
        final: later events follow the normal rules.

        A ``cancel`` that overtakes the call while it asks wins: the outcome is
        :attr:`Outcome.overtaken`, the request stays ``cancelled``, and it awaits every
        connector that promised a save (its drain), so ``take()`` hands it back only once they
        reported or were unregistered. Until the call has applied its answers, the cancelled
        request is not handed back.

        The params returned are a new dict, the caller's to change: the record keeps its own.
        """
        # The asking form of request_finished_by, in two halves: claim the request and ask
        # every ready connector, no lock held (_claim, _gather); then tell the core what they
        # answered (_apply_answers: _finish_by, under the lock). The model check runs each half
        # as an event of its own (multiconnector.check.halves).
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        if blocks.__class__ is not list and blocks.__class__ is not tuple:
            check_blocks(blocks)
        elif blocks:
            check_block_ids(blocks)
        if self._closed:
            self._shut("request_finished")
        # The first half: claim, then ask (no lock held). Its steps are called here one by one,
        # not through a method handing them over as a tuple (~3 % of a lifecycle).
        claimed = self._claim(request_id)
        if claimed.__class__ is not tuple:
            return claimed, None  # type: ignore[return-value]
        record, claim, index = claimed
        try:
            ready = self._registry._ready
            savers, failures, merged, clash = self._gather(ready, request_id, blocks)
        except BaseException:
            self._release(record, claim, index)
            raise
        return self._apply_answers(record, claim, index, ready, savers, failures, merged, clash)

    def _claim(self, request_id: str) -> tuple[RequestTransferState, object, int] | Outcome:
        """Claim held ``request_id`` for one request_finished or request_finished_by: the
        record, the claim and the lock stripe; or the refusal (counted and logged) when the
        request is not held, not pending, or claimed by a call still asking.

        Claimed with an atomic dict.setdefault: a concurrent second call finds the claim, is a
        duplicate and asks nobody (no save only one call would track). A claim is released
        after its call wrote the state, so the state is read again once claimed; a cancel that
        overtakes a call keeps the record from take() until then (_settle). Keyed by the record
        (its id): a request taken and begun again while an old call asks is a new record."""
        record = self._requests.get(request_id)
        index = hash(request_id) & self._mask
        if record is None:
            refused = _UNKNOWN_REQUEST
        elif record.state in _NOT_FINISHABLE:
            refused = finish_refused(record.state)
        else:
            claim = object()  # ours alone: only the call that set it removes it
            try:
                if self._asking.setdefault(id(record), claim) is not claim:
                    refused = _DUPLICATE
                elif record.state in _NOT_FINISHABLE:  # finished or cancelled since our look
                    self._release(record, claim, index)
                    refused = finish_refused(record.state)
                else:
                    return record, claim, index
            except BaseException:
                self._release(record, claim, index)
                raise
        self._refused(index, refused)
        self._log_ignored("request_finished", request_id, None, refused)
        return refused

    def _gather(
        self, ready: tuple[Entry, ...], request_id: str, blocks: Sequence[int]
    ) -> tuple[list[Entry], Failures, dict[str, Any] | None, Exception | None]:
        """Ask each of ``ready`` ``request_finished(request_id, blocks)``, with no lock held:
        the savers (garbage answers included: they may have started a save), the failures
        (``None`` when none), the merged params and the params error (``None`` when none)."""
        savers: list[Entry] = []
        answers: list[Any] = []  # the params of each connector that answered, in order
        failures: Failures = None  # made on the first failure
        # merge_transfer_params' result for plain dicts with str keys and no clash, built as we
        # go; anything else (``plain`` false) goes to merge_transfer_params itself.
        merged: dict[str, Any] | None = None
        supplied = 0
        plain = True
        for entry in ready:
            try:
                answer = entry.request_finished(request_id, blocks)  # type: ignore[misc]
            except Exception as exc:
                failures = [] if failures is None else failures
                failures.append((entry.name, exc))
                continue
            saves, params, error = finish_answer(entry.name, answer)
            if saves:
                savers.append(entry)
            if error is not None:  # garbage: awaited (it may have started a save), reported
                failures = [] if failures is None else failures
                failures.append((entry.name, error))
                continue
            answers.append(params)
            if params is None:
                continue
            if params.__class__ is not dict:
                plain = False
            elif merged is None:
                merged = params.copy()
                supplied = len(params)
            else:
                merged |= params
                supplied += len(params)
        if merged is not None and plain:
            # A key supplied twice, or one that is not a str: merge_transfer_params decides.
            plain = len(merged) == supplied and all(k.__class__ is str for k in merged)
        if plain:
            return savers, failures, merged, None
        failed = {name for name, _ in failures or ()}
        names = [e.name for e in ready if e.name not in failed]
        try:
            merged = merge_transfer_params(
                list(zip(names, answers, strict=True)), allow_equal=self._allow_equal
            )
        except (KeyClashError, InvalidParamsError) as exc:
            return savers, failures, None, exc
        return savers, failures, merged, None

    def _apply_answers(  # noqa: PLR0917
        self,
        record: RequestTransferState,
        claim: object,
        index: int,
        ready: tuple[Entry, ...],
        savers: list[Entry],
        failures: Failures,
        merged: dict[str, Any] | None,
        clash: Exception | None,
    ) -> tuple[Outcome, dict[str, Any] | None]:
        """request_finished's second half: tell the core who answered that it saves (the one
        decision, :meth:`_finish_by`, which drops ``claim``, the first half's), and return (or
        raise) the call's result."""
        request_id = record.request_id
        try:
            cached = self._ready_names
            if len(savers) == len(ready) and cached[0] is ready:
                names = cached[1]  # every ready connector saves: the shared tuple of their names
            else:
                names = tuple([e.name for e in savers])
            outcome, early = self._finish_by(request_id, record, names, index, claim, ready, merged)
        except BaseException:
            # Ours alone: once _finish_by dropped it, another call may have claimed the record
            # (a claim takes no lock), and that claim is not ours to drop.
            self._release(record, claim, index)
            raise
        # A copy for the caller: the record keeps its own (no aliasing of the books).
        result = (outcome, merged.copy() if merged is not None and outcome is _APPLIED else None)
        if early is not None:
            called_back = self._call_back_early(request_id, early)
            if called_back:
                failures = [] if failures is None else failures
                failures += called_back
        if failures is None:
            if clash is not None:
                clash.result = result  # type: ignore[attr-defined]
                raise clash  # a lone KeyClashError or InvalidParamsError
            return result
        errors = [exc for _, exc in failures]
        if clash is not None:
            clash.result = result  # type: ignore[attr-defined]
            errors.append(clash)
        raise ConnectorFailures(
            f"{len(errors)} failure(s) while finishing request {request_id!r}",
            errors,
            failed=[name for name, _ in failures],
            result=result,
        )

    def _overtaken(
        self,
        record: RequestTransferState,
        awaited: tuple[str, ...],
        expected: tuple[str, ...],
        index: int,
    ) -> Outcome:
        """A cancel overtook request_finished while it asked: the cancelled ``record`` awaits
        every saver that can still report (its drain); the caller holds lock ``index``."""
        record.awaiting = awaited
        record.expected = expected
        gone = [n for n in expected if n not in awaited and n not in record.abandoned]
        if gone:
            record.abandoned = (*record.abandoned, *gone)
        self._count(index, _OVERTAKEN, _NO_NAME)
        return _OVERTAKEN

    def _release(self, record: RequestTransferState, claim: object, index: int) -> None:
        """Drop ``claim`` on ``record`` if it is still held, under the request's lock, and hand a
        record a cancel kept back meanwhile to take() (see :meth:`_settle`)."""
        lock = self._locks[index]
        lock.acquire()
        try:
            if self._asking.get(id(record)) is claim:
                # Not applied: the record is pending (interrupted), finished or cancelled, so no
                # early report (none it awaited: those were applied) is applied now.
                self._drop_claim(record, index)
        finally:
            lock.release()

    def request_finished_by(
        self, request_id: str, savers: Iterable[str], *, allow_unregistered: bool = False
    ) -> Outcome:
        """The request finished generating, and the caller knows who saves it asynchronously.

        The core's one finish path: :meth:`request_finished` asks its connectors, then takes
        it. Here the caller learned the savers elsewhere (the vLLM adapter asks its children
        itself): no connector is called, ``params`` stays ``None``. The request awaits the names in
        ``savers`` that are ready registered connectors, in registration order; any other name
        can never report, so it is abandoned at once (in ``expected`` and ``abandoned``), as a
        saver unregistered while :meth:`request_finished` asked it is. While a
        :meth:`request_finished` for the same request is asking its connectors, this is a
        ``duplicate`` and changes nothing (those connectors' answers decide).

        A name in ``savers`` that is not registered at all is far more often a typo than a saver
        unregistered a moment ago, so it raises :class:`UnknownConnectorError` unless
        ``allow_unregistered=True`` (then it is abandoned at once, as above).

        Returns the :class:`Outcome`. Raises :class:`InvalidArgumentError` for a bad
        ``request_id`` or ``savers`` (a ``str``, or not iterable), :class:`InvalidNameError`
        for an item that is not a connector name and :class:`RoleError` for one registered with
        ``role=Role.load`` (it never saves); nothing changes then.

        .. versionadded:: 0.1.0
        """
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        if allow_unregistered is not False:
            check_bool(allow_unregistered, "allow_unregistered")
        if self._closed:
            self._shut("request_finished_by")
        names = savers
        if names.__class__ is not tuple:
            if isinstance(names, str | bytes) or not isinstance(names, Iterable):
                raise InvalidArgumentError(
                    f"savers={shown(names)} must be an iterable of connector names (str)"
                )
            names = tuple(names)
        entries = self._registry.entries
        plain = True
        for given in names:
            if given.__class__ is not str or given not in entries:  # registered: a valid name
                name = check_name(given, "an item of savers")
                if name not in entries and not allow_unregistered:
                    raise UnknownConnectorError(
                        f"an item of savers={name!r} is not registered (pass "
                        "allow_unregistered=True if it may have been unregistered)"
                    )
                if given.__class__ is not str:
                    plain = False
            elif entries[given].role is _LOAD:
                raise RoleError(
                    f"an item of savers={given!r} is registered with role=Role.load: it never "
                    "saves, so it is never awaited",
                    connector=given,
                    answer=None,
                )
        if not plain:
            names = tuple([str(name) for name in names])
        claimed = self._claim(request_id)  # refused: while a request_finished asks, say
        if claimed.__class__ is not tuple:
            return claimed  # type: ignore[return-value]
        record, claim, index = claimed
        try:
            outcome, early = self._finish_by(request_id, record, names, index, claim)
        except BaseException:
            self._release(record, claim, index)  # interrupted: ours, if still held
            raise
        if outcome is not _APPLIED:
            self._log_ignored("request_finished", request_id, None, outcome)
        if early is not None:
            called_back = self._call_back_early(request_id, early)
            if called_back:
                raise ConnectorFailures(
                    f"{len(called_back)} callback(s) raised while finishing {request_id!r}",
                    [exc for _, exc in called_back],
                    failed=[name for name, _ in called_back],
                    result=outcome,
                )
        return outcome

    def _refused(self, index: int, outcome: Outcome) -> Outcome:
        """Count a refused ``request_finished`` under lock ``index``; returns ``outcome``."""
        lock = self._locks[index]
        lock.acquire()
        try:
            self._count(index, outcome, _NO_NAME)
        finally:
            lock.release()
        return outcome

    def _finish_by(  # noqa: PLR0917
        self,
        request_id: str,
        claimed: RequestTransferState,
        names: tuple[str, ...],
        index: int,
        claim: object,
        asked: tuple[Entry, ...] | None = None,
        params: dict[str, Any] | None = None,
    ) -> tuple[Outcome, list[tuple[str, Sequence[int]]] | None]:
        """The core told that ``names`` save ``claimed`` (a request_finished_by, or a
        request_finished once its connectors answered: then ``asked`` is the ready snapshot it
        asked and ``params`` their merged params): the one update of both, under the request's
        lock. Drops ``claim``, the caller's, there, after the state is written, and returns the
        outcome and the early reports applied then (whose ``on_finished`` the caller calls).
        The claim is dropped without a look: the caller took it and only its taker drops a
        claim (:meth:`_release`, or here), so it is held.

        A cancel that came after the claim overtook a call that asked: its connectors may have
        promised saves meanwhile, so the cancelled request awaits them (:meth:`_overtaken`).
        A call told the savers is applied at once, after the cancel: the request is terminal.
        """
        record = claimed  # held while claimed: a cancel parks it, take() leaves it
        lock = self._locks[index]
        lock.acquire()
        try:
            cached = self._ready_names
            if names is cached[1] and cached[0] is self._registry._ready:
                awaited = expected = names  # every ready connector saves (the usual case)
            else:
                awaited, expected = self._awaited(names, asked)
            if asked is not None and record.state is _CANCELLED:
                outcome = self._overtaken(record, awaited, expected, index)
            else:
                outcome = self._finish(record, awaited, expected, params, index)
        finally:
            try:
                early = self._drop_claim(claimed, index)
            finally:
                lock.release()
        return outcome, early

    def _awaited(self, names: tuple[str, ...], asked: tuple[Entry, ...] | None) -> Awaited:
        """``(awaited, expected)`` for the savers ``names``: the ready ones in registration
        order, then every other name, which can never report (abandoned at once). With
        ``asked``, the snapshot a request_finished asked them in: a saver whose registration
        changed since (unregistered, or registered again) is one of those others, and
        ``expected`` keeps the order they answered in. The caller holds a request's lock."""
        ready = self._registry._ready  # what ready_entries() returns, without the call
        cached = self._ready_names
        if cached[0] is not ready:
            cached = (ready, self._intern(tuple([e.name for e in ready])), {})
            self._ready_names = cached
        if asked is not None and asked is not ready:  # the registry changed while it asked
            entry = self._registry.entry
            gone = {e.name for e in asked if e.name in names and entry(e.name) is not e}
            if gone:
                awaited = self._intern(tuple([n for n in names if n not in gone]))
                return awaited, self._intern(names)
        if names is cached[1] or names == cached[1]:
            return cached[1], cached[1]
        known = cached[2].get(names)
        if known is None:
            known = self._awaited_of(ready, names, cached[2])
        return known

    def _awaited_of(
        self,
        ready: tuple[Entry, ...],
        names: tuple[str, ...],
        known: dict[tuple[str, ...], Awaited],
    ) -> Awaited:
        """``(awaited, expected)`` for savers ``names`` under ready snapshot ``ready``: the ready
        ones in registration order, then every other name (abandoned at once); remembered in
        ``known``, that snapshot's table (up to :data:`SHARED_LIMIT` tuples of savers)."""
        given = set(names)
        awaited = self._intern(tuple([e.name for e in ready if e.name in given]))
        rest = [n for n in dict.fromkeys(names) if n not in awaited]
        found: Awaited = (awaited, self._intern((*awaited, *rest)) if rest else awaited)
        if len(known) < SHARED_LIMIT:
            known[names] = found
        return found

    def _finish(
        self,
        record: RequestTransferState,
        awaited: tuple[str, ...],
        expected: tuple[str, ...],
        params: dict[str, Any] | None,
        index: int,
    ) -> Outcome:
        """Apply ``request_finished`` to held ``record`` and count it; the caller holds lock
        ``index``. The one decision behind :meth:`request_finished` and
        :meth:`request_finished_by`: ``awaited`` are the savers that can still report,
        ``expected`` every saver (``awaited`` itself when they are the same).
        """
        dest = decide(_ON_REQUEST_FINISHED, record, awaited)
        if dest is None:
            outcome = finish_refused(record.state)
            self._count(index, outcome, _NO_NAME)
            return outcome
        record.awaiting = awaited
        record.expected = expected
        if expected is not awaited:
            gone = [n for n in expected if n not in awaited and n not in record.abandoned]
            record.abandoned = (*record.abandoned, *gone)
        record.params = params
        self._transition(record, "request_finished", dest, None)  # last: take() may see it
        self._finishes[index] += 1
        return _APPLIED

"""The aggregator: one request's transfer, fanned out to every connector, tracked by name.

Rules, in one place (docs/concepts.md explains them at length):

* **Ignore, don't crash.** A transfer report is applied only when its request is held, live, and
  awaits that name. Everything else is ignored with a typed :class:`Outcome`, counted per kind
  and per connector, and logged at debug level.
* **Nothing freed early.** A request reaches ``finished`` only when every name that committed to
  an asynchronous save reported, or was unregistered. Duplicate and phantom reports cannot
  shorten the wait: the awaited set holds names, not a count.
* **The unregister rule.** Unregistering a connector releases every request awaiting it: the name
  moves from ``awaiting`` to ``abandoned`` (its later reports are ignored as ``unregistered``) and
  a request with nothing left to await becomes ``finished``. A connector that is gone can never
  report, so waiting for it would strand the request forever; unregister a connector only once it
  no longer touches KV blocks (after its shutdown, say). ``abandoned`` tells the caller which
  saves were never confirmed.
* **No state outlives its request.** Terminal requests are held until :meth:`MultiConnector.take`
  hands them back, then dropped.
* **Atomic per request, no global lock.** Each request's transitions happen under one of a fixed
  set of striped locks chosen by the request id's hash. Connectors are never called under a lock,
  so a connector may call back into the aggregator.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Final, NoReturn, final

import attrs

from ._validate import (
    check_block_ids,
    check_blocks,
    check_bool,
    check_int,
    check_name,
    check_request_id,
    check_stripes,
    shown,
)
from .errors import (
    ConnectorFailures,
    DuplicateRequestError,
    InvalidAnswerError,
    InvalidArgumentError,
    InvalidParamsError,
    KeyClashError,
    ShutDownError,
    UnknownConnectorError,
    UnknownRequestError,
)
from .machine import (
    DECISIONS,
    STATES,
    TABLE,
    TERMINAL,
    RequestTransferState,
    State,
    Step,
    step,
)
from .outcome import Outcome
from .params import merge_transfer_params
from .registry import Connector, ConnectorRegistry, Entry

__all__ = ["MultiConnector"]

logger: Final = logging.getLogger("multiconnector")

# Enum members read through their class cost ~70 ns each on CPython 3.11: the hot paths use
# these module constants instead.
_APPLIED: Final = Outcome.applied
_UNKNOWN_REQUEST: Final = Outcome.unknown_request
_TERMINAL: Final = Outcome.terminal
_DUPLICATE: Final = Outcome.duplicate
_PHANTOM: Final = Outcome.phantom
_UNKNOWN_CONNECTOR: Final = Outcome.unknown_connector
_NOT_READY: Final = Outcome.not_ready
_UNREGISTERED: Final = Outcome.unregistered
_ABANDONED: Final = Outcome.abandoned
_DRAINED: Final = Outcome.drained
_OVERTAKEN: Final = Outcome.overtaken
_PENDING: Final = State.pending
_CANCELLED: Final = State.cancelled
#: Counter key for events that concern a request, not a connector.
_NO_NAME: Final = None
# The hot events' compiled decisions (see machine.DECISIONS): one dict lookup and one guard call.
_ON_REQUEST_FINISHED: Final = DECISIONS["request_finished"]
_ON_TRANSFER_FINISHED: Final = DECISIONS["transfer_finished"]
#: States with no ``request_finished`` transition at all: refused before asking any connector.
_NOT_FINISHABLE: Final = frozenset(
    state for state in STATES if not TABLE[state].get("request_finished")
)
#: Distinct name tuples kept for sharing (awaiting sets are few; requests are many).
_INTERN_LIMIT: Final = 4096
#: Distinct (outcome, name) counters kept per lock stripe; later names count under OTHER_NAMES.
_COUNTER_LIMIT: Final = 1024
#: The name under which every name past the counter limit is counted (see connector_counts).
OTHER_NAMES: Final = "<other names>"


def _garbage(name: str, answer: Any) -> InvalidAnswerError:
    """The error for a ``request_finished`` answer that is not a ``(bool, Mapping | None)``
    pair; the connector is awaited anyway (it may have started a save)."""
    return InvalidAnswerError(
        f"connector {name!r} answered request_finished with {shown(answer)}; it must answer a "
        "(saves: bool, params: Mapping | None) pair. It is awaited, in case it started a save, "
        "and its params are dropped",
        connector=name,
        answer=answer,
    )


@final
class MultiConnector:
    """Fans each request out to the connectors of a :class:`ConnectorRegistry` and tracks it.

    >>> from multiconnector import ConnectorRegistry, MultiConnector
    >>> class Saver:
    ...     def request_finished(self, request_id, blocks):
    ...         return True, {"saved_by": "disk"}
    >>> mc = MultiConnector(ConnectorRegistry({"disk": Saver(), "broken": None}))
    >>> mc.begin("r1")
    >>> mc.request_finished("r1", [0, 1])
    (<Outcome.applied: 'applied'>, {'saved_by': 'disk'})
    >>> mc.transfer_finished("r1", "broken")        # a None slot: ignored, not a crash
    <Outcome.not_ready: 'not_ready'>
    >>> mc.transfer_finished("r1", "disk")
    <Outcome.applied: 'applied'>
    >>> [(r.request_id, r.state.value) for r in mc.take()]
    [('r1', 'finished')]
    >>> len(mc)
    0

    ``trace=True`` records each request's applied transitions in its ``history`` (off by default:
    then it costs one attribute test per transition). ``allow_equal_params`` is passed to
    :func:`merge_transfer_params`. ``stripes`` is the number of request locks, a power of two
    from 1 to 65 536.

    Every argument follows one rule per kind of input (docs/bad-input.md): a request id is a
    non-empty ``str`` (a subclass is made a plain ``str``), a connector name is a printable
    ``str`` of 1 to 128 characters without whitespace, ``,`` or ``=``, blocks are a sequence of
    ``int``. A bad one raises a typed error naming it, and nothing changes. After
    :meth:`shutdown`, calls that would do work raise :class:`ShutDownError`.

    .. versionadded:: 0.1.0
    """

    __slots__ = (
        "__weakref__",  # the registry holds our unregister listener weakly
        "_allow_equal",
        "_applied",
        "_asking",
        "_closed",
        "_counts",
        "_done",
        "_finishes",
        "_halves",
        "_interned",
        "_locks",
        "_mask",
        "_parked",
        "_ready_names",
        "_registry",
        "_requests",
        "_trace",
        "_without",
    )

    def __init__(
        self,
        registry: ConnectorRegistry | Mapping[str, Connector | None] | None = None,
        *,
        trace: bool = False,
        allow_equal_params: bool = False,
        stripes: int = 64,
    ) -> None:
        if registry is None:
            registry = ConnectorRegistry()
        elif isinstance(registry, Mapping):
            registry = ConnectorRegistry(registry)
        elif not isinstance(registry, ConnectorRegistry):
            raise InvalidArgumentError(
                f"registry={shown(registry)} must be a ConnectorRegistry, a Mapping or None"
            )
        for argument, value in (("trace", trace), ("allow_equal_params", allow_equal_params)):
            if not isinstance(value, bool):
                raise InvalidArgumentError(f"{argument}={shown(value)} must be a bool")
        stripes = check_stripes(stripes)
        self._closed = False
        self._registry = registry
        self._trace = trace
        self._allow_equal = allow_equal_params
        self._requests: dict[str, RequestTransferState] = {}
        self._done: deque[RequestTransferState] = deque()
        # Records a request_finished (or request_finished_by) is applying, each with that
        # call's claim token; see request_finished.
        self._asking: dict[RequestTransferState, object] = {}
        # Cancelled records kept from take() while a request_finished still asks (see _settle).
        self._parked: set[RequestTransferState] = set()
        # Set only by _ask (the model check): request_finished then stops after asking.
        self._halves: list[tuple[Any, ...]] | None = None
        self._locks = tuple(threading.Lock() for _ in range(stripes))
        self._mask = stripes - 1
        # One counter dict per stripe, only ever written under that stripe's lock.
        self._counts: tuple[dict[tuple[Outcome, str | None], int], ...] = tuple(
            {} for _ in range(stripes)
        )
        # The hot paths count applied events here, by name alone: no key tuple to build and hash.
        self._applied: tuple[dict[str | None, int], ...] = tuple({} for _ in range(stripes))
        # Applied request_finished events, one slot per stripe (written under its lock).
        self._finishes: list[int] = [0] * stripes
        # Name tuples shared by every request with the same awaited set (memory), and each
        # tuple's "minus one name" successors (time): both small, both capped.
        self._interned: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._without: dict[tuple[str, ...], dict[str, tuple[str, ...]]] = {}
        # The names of a ready snapshot, for the common "every ready connector saves".
        self._ready_names: tuple[tuple[Entry, ...], tuple[str, ...]] = ((), ())
        registry.subscribe(self._connector_gone)

    # -- connectors ----------------------------------------------------------------------------

    @property
    def registry(self) -> ConnectorRegistry:
        """The registry; changing it directly is safe (unregistering applies the rule above)."""
        return self._registry

    def register(self, name: str, connector: Connector | None) -> None:
        """Same as ``self.registry.register(name, connector)``; refused after :meth:`shutdown`."""
        if self._closed:
            self._shut("register")
        self._registry.register(name, connector)

    def unregister(self, name: str) -> Connector | None:
        """Unregister ``name``, releasing every request awaiting it (the unregister rule).

        Requests awaiting ``name`` stop awaiting it: the name moves to their ``abandoned``, and
        one with nothing left to await becomes ``finished``. Returns the connector.
        """
        return self._registry.unregister(name)

    def _connector_gone(self, entry: Entry) -> None:
        # Called under the registry lock, after `entry` was removed. The scan holds every stripe
        # lock: a request_finished that checked the registry before the removal writes its
        # awaited names under its stripe lock, so the scan sees them, or it checked after and
        # leaves the name out itself. A scan without the locks could miss such a request and
        # strand it. Unregistering is rare; the scan is O(held requests).
        name = entry.name
        locks = self._locks
        for lock in locks:
            lock.acquire()
        try:
            for record in list(self._requests.values()):
                if record.loader == name:
                    if record.state not in TERMINAL:
                        record.loader_gone = True  # its load report can never be applied now
                    if not record.loaded:
                        # Its load is over: the connector that was loading is gone.
                        record.loaded = True
                        if name not in record.abandoned and name not in record.awaiting:
                            record.abandoned = (*record.abandoned, name)
                        if record.state in TERMINAL:
                            self._settle(record)  # a drain: take() may hand it back now
                if name not in record.awaiting:
                    continue
                dest = step(record, "connector_gone", name)
                if dest is None:  # never: every state that awaits a name declares it
                    continue
                record.awaiting = tuple([n for n in record.awaiting if n != name])
                record.abandoned = (*record.abandoned, name)
                self._transition(record, "connector_gone", dest, name)
                self._count(hash(record.request_id) & self._mask, _ABANDONED, name)
                if dest is _CANCELLED:
                    self._settle(record)  # a drain: take() may hand it back now
        finally:
            for lock in reversed(locks):
                lock.release()

    # -- requests ------------------------------------------------------------------------------

    def begin(self, request_id: str) -> None:
        """Start tracking ``request_id`` in ``pending``.

        Raises :class:`DuplicateRequestError` while the id is still held (live, or terminal and
        not yet taken): that would discard the first request's bookkeeping. Nothing changes then.
        """
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        if self._closed:
            self._shut("begin")
        record = RequestTransferState(request_id)
        if self._trace:
            record.history = []
        if self._requests.setdefault(request_id, record) is not record:
            raise DuplicateRequestError(f"request_id={request_id!r} is already held")

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
        # Two halves: this body claims the request and asks every ready connector, with no lock
        # held; _answer applies the answers under the lock. The model check runs each half as
        # an event of its own (see _ask), with any other event in between.
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        if blocks.__class__ is not list and blocks.__class__ is not tuple:
            check_blocks(blocks)
        elif blocks:
            check_block_ids(blocks)
        if self._closed:
            self._shut("request_finished")
        # The hot path: decisions (machine.DECISIONS), the common merge and the counters inlined.
        # The request is claimed first (refused ones ask nobody), then updated from every answer
        # under its lock; no lock is held while connectors are asked.
        requests = self._requests
        asking = self._asking
        # Claim the request's record with an atomic dict.setdefault: a second, concurrent
        # request_finished finds the first one's claim, is a duplicate and asks nobody, so no
        # connector commits to a save that only one of two calls would track. A claim is
        # released only after its call wrote the new state, so the state is read again once
        # claimed: a call that claims just after another one finished sees it finished. A cancel
        # may still overtake us while we ask: it sees the claim and keeps the record from take()
        # until _answer recorded our savers (see _settle).
        # Claims are keyed by the record, not the id: a request taken and begun again while an
        # old call still asks is a new record, free to claim.
        record = requests.get(request_id)
        claim = object()  # ours alone: only the call that set it removes it
        index = hash(request_id) & self._mask
        try:
            refused: Outcome | None = None
            if record is None:
                refused = _UNKNOWN_REQUEST
            elif record.state in _NOT_FINISHABLE:
                refused = self._refuse_finish(record)
            elif asking.setdefault(record, claim) is not claim:
                refused = _DUPLICATE
            elif record.state in _NOT_FINISHABLE:  # finished or cancelled since our look
                self._release(record, claim, index)
                refused = self._refuse_finish(record)
            if refused is not None:
                self._refused(index, refused)
                self._log_ignored("request_finished", request_id, None, refused)
                return refused, None
            assert record is not None
            ready = self._registry._ready  # what ready_entries() returns, without the call
            savers: list[Entry] = []
            answers: list[Any] = []  # the params of each connector that answered, in order
            failures: list[tuple[str, Exception]] | None = None  # made on the first failure
            clash: Exception | None = None
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
                if answer.__class__ is tuple:
                    try:
                        saves, params = answer
                    except ValueError:  # not a pair: garbage, below
                        saves = params = None
                    if params is None:
                        if saves is True:
                            savers.append(entry)
                            answers.append(None)
                            continue
                        if saves is False:
                            answers.append(None)
                            continue
                    elif (saves is True or saves is False) and (
                        params.__class__ is dict or isinstance(params, Mapping)
                    ):
                        if saves:
                            savers.append(entry)
                        answers.append(params)
                        if params.__class__ is not dict:
                            plain = False
                        elif merged is None:
                            merged = params.copy()
                            supplied = len(params)
                        else:
                            merged |= params
                            supplied += len(params)
                        continue
                # Garbage: it may have started a save, so it is awaited (conservative); its
                # params are dropped and the answer is reported.
                savers.append(entry)
                failures = [] if failures is None else failures
                failures.append((entry.name, _garbage(entry.name, answer)))
            if merged is not None and plain:
                if len(merged) != supplied:
                    plain = False  # a key supplied twice
                else:
                    for param in merged:
                        if param.__class__ is not str:
                            plain = False
                            break
            if not plain:
                merged = None
                try:
                    failed = {name for name, _ in failures or ()}
                    names = [e.name for e in ready if e.name not in failed]
                    merged = merge_transfer_params(
                        list(zip(names, answers, strict=True)), allow_equal=self._allow_equal
                    )
                except (KeyClashError, InvalidParamsError) as exc:
                    clash = exc
            asked = (record, claim, index, ready, savers, failures, merged, clash)
            halves = self._halves
            if halves is None:
                return self._answer(asked)
            halves.append(asked)  # _ask's caller applies it later
            return _UNKNOWN_REQUEST, None  # not read
        except BaseException:
            if record is not None:
                self._release(record, claim, index)  # unless _answer released it
            raise

    def _ask(self, request_id: str, blocks: Sequence[int]) -> tuple[Any, ...]:
        """request_finished's first half alone, for the model check (one thread): claim the
        request and ask every ready connector. Returns ``(outcome, None)`` when refused (nobody
        asked), else the answers for :meth:`_answer`, ``(record, claim, index, ready, savers,
        failures, merged, clash)``, whose claim is held until :meth:`_answer` drops it.
        ``request_finished`` is the two halves in sequence, in one call."""
        halves: list[tuple[Any, ...]] = []
        self._halves = halves
        try:
            refused = self.request_finished(request_id, blocks)
        finally:
            self._halves = None
        return halves[0] if halves else refused

    def _answer(self, asked: tuple[Any, ...]) -> tuple[Outcome, dict[str, Any] | None]:
        """request_finished's second half: apply the answers :meth:`_ask` gathered, under the
        request's lock, release the claim, and return (or raise) the call's result."""
        record: RequestTransferState
        savers: list[Entry]
        record, _, index, ready, savers, failures, merged, clash = asked
        request_id = record.request_id
        registry = self._registry
        lock = self._locks[index]
        lock.acquire()
        try:
            if self._requests.get(request_id) is not record:
                outcome = _UNKNOWN_REQUEST  # never while we hold the claim: kept for safety
            else:
                # A saver unregistered while we asked it can never report: abandoned at once.
                # While the registry publishes the snapshot we asked (every change publishes a
                # new one), every saver is still registered.
                if registry._ready is not ready:
                    awaited = self._intern(
                        tuple([e.name for e in savers if registry.entry(e.name) is e])
                    )
                elif len(savers) != len(ready):
                    awaited = self._intern(tuple([e.name for e in savers]))
                else:
                    cached = self._ready_names
                    if cached[0] is ready:
                        awaited = cached[1]
                    else:
                        awaited = self._intern(tuple([e.name for e in ready]))
                        self._ready_names = (ready, awaited)
                expected = (
                    awaited
                    if len(awaited) == len(savers)
                    else self._intern(tuple([e.name for e in savers]))
                )
                if record.state is _CANCELLED:  # a cancel overtook us while we asked
                    outcome = self._overtaken(record, awaited, expected, index)
                else:
                    outcome = self._finish(record, awaited, expected, merged, index)
            if outcome is _UNKNOWN_REQUEST:
                self._count(index, outcome, _NO_NAME)
        finally:
            del self._asking[record]  # our claim, released after the state was written
            if self._parked:
                self._unpark(record)
            lock.release()
        # A copy for the caller: the record keeps its own (no aliasing of the books).
        result = (outcome, merged.copy() if merged is not None and outcome is _APPLIED else None)
        if failures is None:
            if clash is not None:
                clash.result = result
                raise clash  # a lone KeyClashError or InvalidParamsError
            return result
        errors = [exc for _, exc in failures]
        if clash is not None:
            clash.result = result
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
            asking = self._asking
            if asking.get(record) is claim:
                del asking[record]
                if self._parked:
                    self._unpark(record)
        finally:
            lock.release()

    def _unpark(self, record: RequestTransferState) -> None:
        """``record``'s claim was just dropped: queue it if a cancel kept it back for that;
        the caller holds its lock."""
        parked = self._parked
        if record in parked:
            parked.discard(record)
            self._settle(record)

    def _settle(self, record: RequestTransferState) -> None:
        """Queue terminal ``record`` for take() once it is safe to free; the caller holds its
        lock. It is not while a connector may still touch its blocks (``in_flight``: a drain
        event settles it again), nor while a request_finished that a cancel overtook is still
        asking (its connectors may be promising saves): then it is parked, and the call's
        release settles it."""
        if record.awaiting or (record.loader is not None and not record.loaded):
            return
        if record.state is _CANCELLED and record in self._asking:
            self._parked.add(record)
            return
        self._done.append(record)

    def _drain(self, record: RequestTransferState, event: str, name: str, index: int) -> Outcome:
        """A report from ``name``, which cancelled ``record`` awaits: it is released from it and
        stays cancelled; counted as drained. The caller holds lock ``index``."""
        record.awaiting = self._minus(record.awaiting, name)
        if record.history is not None:
            record.history.append(Step(event, _CANCELLED, _CANCELLED, name))
        self._count(index, _DRAINED, name)
        self._settle(record)
        return _DRAINED

    def request_finished_by(
        self, request_id: str, savers: Iterable[str], *, allow_unregistered: bool = False
    ) -> Outcome:
        """The request finished generating, and the caller knows who saves it asynchronously.

        The same transition as :meth:`request_finished` — the same decision and bookkeeping —
        for a side that learns the savers from elsewhere instead of asking its connectors: a
        vLLM worker learns them from the scheduler's connector metadata. No connector is called
        and no params are merged (``params`` stays ``None``). The request awaits the names in
        ``savers`` that are ready registered connectors, in registration order; any other name
        can never report, so it is abandoned at once (in ``expected`` and ``abandoned``), as a
        saver unregistered while :meth:`request_finished` asked it is. While a
        :meth:`request_finished` for the same request is asking its connectors, this is a
        ``duplicate`` and changes nothing (those connectors' answers decide).

        A name in ``savers`` that is not registered at all is far more often a typo than a saver
        unregistered a moment ago, so it raises :class:`UnknownConnectorError` unless
        ``allow_unregistered=True`` (then it is abandoned at once, as above).

        Returns the :class:`Outcome`. Raises :class:`InvalidArgumentError` for a bad
        ``request_id`` or ``savers`` (a ``str``, or not iterable) and :class:`InvalidNameError`
        for an item that is not a connector name; nothing changes then.

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
        entries = self._registry._entries
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
        if not plain:
            names = tuple([str(name) for name in names])
        index = hash(request_id) & self._mask
        # Claimed as request_finished claims (see there): while a request_finished asks the
        # connectors of this very record, this call is a duplicate and changes nothing.
        asking = self._asking
        record = self._requests.get(request_id)
        claim = object()
        try:
            if record is not None and asking.setdefault(record, claim) is not claim:
                outcome = self._refused(index, _DUPLICATE)
            else:
                outcome = self._finish_by(request_id, record, names, index, claim)
        finally:
            if record is not None and asking.get(record) is claim:  # interrupted: not released
                self._release(record, claim, index)
        if outcome is not _APPLIED:
            self._log_ignored("request_finished", request_id, None, outcome)
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

    def _finish_by(
        self,
        request_id: str,
        claimed: RequestTransferState | None,
        names: tuple[str, ...],
        index: int,
        claim: object,
    ) -> Outcome:
        """request_finished_by's update, under the request's lock; releases ``claim`` there,
        after the state is written."""
        registry = self._registry
        lock = self._locks[index]
        lock.acquire()
        try:
            record = self._requests.get(request_id)
            if record is None or record is not claimed:  # not held, or taken and begun again
                outcome = _UNKNOWN_REQUEST
                self._count(index, outcome, _NO_NAME)
            else:
                ready = registry._ready
                cached = self._ready_names
                if cached[0] is not ready:
                    cached = (ready, self._intern(tuple([e.name for e in ready])))
                    self._ready_names = cached
                if names == cached[1]:
                    awaited = expected = cached[1]
                else:
                    given = set(names)
                    awaited = self._intern(tuple([e.name for e in ready if e.name in given]))
                    rest = [n for n in dict.fromkeys(names) if n not in awaited]
                    expected = self._intern((*awaited, *rest)) if rest else awaited
                outcome = self._finish(record, awaited, expected, None, index)
        finally:
            if claimed is not None and self._asking.get(claimed) is claim:
                del self._asking[claimed]
                if self._parked:
                    self._unpark(claimed)
            lock.release()
        return outcome

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
        decision = _ON_REQUEST_FINISHED.get(record.state)
        if decision is None:
            dest = step(record, "request_finished", awaited)
        else:
            guard, yes, no = decision
            dest = yes if guard is None or guard(record, awaited) else no
        if dest is None:
            outcome = self._refuse_finish(record)
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

    @staticmethod
    def _refuse_finish(record: RequestTransferState) -> Outcome:
        """Why ``request_finished`` does not apply to ``record``."""
        return _TERMINAL if record.state in TERMINAL else _DUPLICATE

    def _intern(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The shared tuple equal to ``names`` (``names`` itself when new or when full)."""
        shared = self._interned.get(names)
        if shared is not None:
            return shared
        if len(self._interned) < _INTERN_LIMIT:
            return self._interned.setdefault(names, names)
        return names

    def _minus(self, awaiting: tuple[str, ...], name: str) -> tuple[str, ...]:
        """``awaiting`` without ``name``, shared, remembered for the next request."""
        rest = self._intern(tuple([n for n in awaiting if n != name]))
        if len(self._without) < _INTERN_LIMIT:
            self._without.setdefault(awaiting, {})[name] = rest
        return rest

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

    def cancel(self, request_id: str) -> Outcome:
        """Cancel a live request: it becomes ``cancelled`` and never changes state again.

        Cancelling is the caller's decision to stop the request, not to stop waiting for the
        connectors that may still touch its blocks: a cancelled request is held, *draining*,
        while it awaits a save or its chosen loader's load (``in_flight``). Reports from the
        names it awaits are applied to the drain (:attr:`Outcome.drained`: it awaits one name
        less, stays ``cancelled``, no callback); unregistering an awaited connector releases it
        as for any request. :meth:`take` hands it back once nothing is in flight. Every other
        later event is ignored, and no connector is asked again.
        """
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        index = hash(request_id) & self._mask
        lock = self._locks[index]
        lock.acquire()
        try:
            record = self._requests.get(request_id)
            if record is None:
                outcome = _UNKNOWN_REQUEST
            elif (dest := step(record, "cancel", None)) is None:
                outcome = _TERMINAL
            else:
                self._transition(record, "cancel", dest, None)
                outcome = _APPLIED
            self._count(index, outcome, _NO_NAME)
        finally:
            lock.release()
        if outcome is not _APPLIED:
            self._log_ignored("cancel", request_id, None, outcome)
        return outcome

    def take(self) -> list[RequestTransferState]:
        """Hand back every terminal request that is safe to free, and forget it.

        A record handed back is safe to free: no connector that promised a save for it, or was
        chosen to load it, still owes a report; each one reported or was unregistered (see
        ``abandoned``). That holds for ``finished`` and for ``cancelled`` records: a cancelled
        request is held while it drains (see :meth:`cancel`), and so is a finished one whose
        load is still in flight. Each request is handed back exactly once, in the order it
        became safe to free. :meth:`held` counts the draining ones; :meth:`oldest` finds those
        held longer than expected (a connector that never reports).
        """
        done = self._done
        if not done:
            return []
        taken: list[RequestTransferState] = []
        pop = done.popleft
        requests = self._requests
        try:
            while done:
                record = pop()
                held = requests.pop(record.request_id, None)
                if held is not record and held is not None:  # never: a held id is not re-begun
                    requests[record.request_id] = held
                taken.append(record)
        except IndexError:  # another thread took the last ones between our test and our pop
            pass
        return taken

    # -- loading -------------------------------------------------------------------------------

    def match_tokens(self, request_id: str, num_computed_tokens: int = 0) -> int | None:
        """How many tokens can be loaded for a pending request, choosing the loader by name.

        Ready connectors that have ``get_num_new_matched_tokens`` are asked in registration
        order. The first that answers ``None`` ("not known yet") ends the asking, as in vLLM:
        the answer is ``None``, the rest are not asked, and nothing is remembered. Otherwise the
        first connector with more than 0 tokens is remembered as the request's ``loader`` and its
        count returned; 0 means nothing to load. A connector that raises counts as 0 and
        :class:`ConnectorFailures` is raised after the others were asked.

        Raises :class:`UnknownRequestError` for a request that is not held; returns 0 for one
        that is no longer pending.
        """
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        if num_computed_tokens.__class__ is not int or num_computed_tokens < 0:
            num_computed_tokens = check_int(num_computed_tokens, "num_computed_tokens")
        if self._closed:
            self._shut("match_tokens")
        record = self._requests.get(request_id)
        if record is None:
            raise UnknownRequestError(f"request_id={request_id!r} is not held")
        if record.state is not _PENDING:
            return 0
        unknown = False
        chosen: tuple[str, int] | None = None
        chooser: Entry | None = None
        errors: list[Exception] = []
        failed: list[str] = []
        for entry in self._registry._ready:  # what ready_entries() returns, without the call
            if entry.get_num_new_matched_tokens is None:
                continue
            try:
                tokens = entry.get_num_new_matched_tokens(request_id, num_computed_tokens)
                if tokens is not None and (type(tokens) is not int or tokens < 0):
                    raise InvalidArgumentError(
                        f"connector {entry.name!r} answered tokens={shown(tokens)}; "
                        "must be an int >= 0 or None"
                    )
            except Exception as exc:
                errors.append(exc)
                failed.append(entry.name)
                continue
            if tokens is None:
                unknown = True
                break  # "not known yet": vLLM asks no further
            if tokens > 0 and chosen is None:
                chosen, chooser = (entry.name, tokens), entry
        result: int | None
        if unknown:
            result = None
        else:
            index = hash(request_id) & self._mask
            with self._locks[index]:
                if record.state is _PENDING:
                    record.loader = chosen[0] if chosen else None
                    record.loaded = False
                    # Unregistered while we asked: its load report can never be applied.
                    record.loader_gone = (
                        chosen is not None and self._registry.entry(chosen[0]) is not chooser
                    )
            result = chosen[1] if chosen else 0
        if errors:
            raise ConnectorFailures(
                f"{len(errors)} connector(s) failed to answer for request {request_id!r}",
                errors,
                failed=failed,
                result=result,
            )
        return result

    def load_finished(self, request_id: str, name: str) -> Outcome:
        """Connector ``name`` reports that it finished loading ``request_id``'s KV.

        Applied once, from the chosen loader, while the request is live; the connector's
        ``on_load_finished(request_id)`` is then called. A duplicate, late, or phantom load
        report is ignored like any other: from the chosen loader unregistered since it was
        chosen (even when a new connector took its name) it is ``unregistered``, from a
        connector never chosen ``phantom``. When ``on_load_finished`` raises,
        :class:`ConnectorFailures` carries the outcome applied as its ``result``.
        """
        name = check_name(name)
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        if self._closed:
            self._shut("load_finished")
        index = hash(request_id) & self._mask
        lock = self._locks[index]
        lock.acquire()
        try:
            record = self._requests.get(request_id)
            if record is None:
                outcome = _UNKNOWN_REQUEST
            elif record.state in TERMINAL:
                if record.loader == name and not record.loaded:  # the drain of its load
                    record.loaded = True
                    outcome = _DRAINED
                    self._settle(record)
                else:
                    outcome = _TERMINAL
            elif record.loader == name:
                if record.loader_gone:  # unregistered while the match asked it
                    outcome = _UNREGISTERED
                elif not record.loaded:
                    outcome = _APPLIED
                    record.loaded = True
                elif name in record.abandoned:  # its load ended when it was unregistered
                    outcome = _UNREGISTERED
                else:
                    outcome = _DUPLICATE
            else:
                entry = self._registry.entry(name)
                if entry is None:
                    outcome = _UNKNOWN_CONNECTOR
                elif entry.connector is None:
                    outcome = _NOT_READY
                else:
                    outcome = _PHANTOM
            self._count(index, outcome, name)
        finally:
            lock.release()
        if outcome is not _APPLIED:
            self._log_ignored("load_finished", request_id, name, outcome)
            return outcome
        entry = self._registry.entry(name)
        if entry is not None and entry.on_load_finished is not None:
            self._call_back(outcome, entry, entry.on_load_finished, request_id)
        return outcome

    # -- inspection ----------------------------------------------------------------------------

    def get(self, request_id: str) -> RequestTransferState | None:
        """A copy of the request's record, or ``None`` if it is not held.

        The copy's ``params`` and ``history`` are copies too: changing them changes nothing held.
        """
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        record = self._requests.get(request_id)
        if record is None:
            return None
        with self._locks[hash(request_id) & self._mask]:
            copy = attrs.evolve(record)
            if record.history is not None:
                copy.history = list(record.history)
            if record.params is not None:
                copy.params = dict(record.params)
            return copy

    def peek(self, request_id: str) -> RequestTransferState | None:
        """The held record itself, not a copy, or ``None`` if the request is not held.

        Read-only: never assign to its fields, and expect them to change as events apply (each
        field read is atomic, but two reads may straddle an update made by another thread).
        :meth:`get` copies the record under its lock, for a consistent snapshot; ``peek`` is
        for a hot path that needs one field and owns the request's events (the vLLM adapter,
        whose step-wise calls come from one thread).

        .. versionadded:: 0.1.0
        """
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        return self._requests.get(request_id)

    def __len__(self) -> int:
        """How many requests are held: live, draining (terminal, a transfer still in flight),
        or terminal and queued for :meth:`take`. :meth:`held` tells them apart."""
        return len(self._requests)

    def held(self) -> dict[str, int]:
        """How many held requests are ``live`` (pending or finishing), ``draining`` (finished
        or cancelled, with a save or a load still in flight: not yet safe to free) and
        ``queued`` (safe to free, waiting for :meth:`take`). The three add up to ``len()``.

        A scan of the held requests, without locks: under concurrent events, a count each
        request had at some moment of the scan.

        .. versionadded:: 0.1.0
        """
        live = draining = 0
        records = list(self._requests.values())
        for record in records:
            if record.state not in TERMINAL:
                live += 1
            elif record.awaiting or (record.loader is not None and not record.loaded):
                draining += 1
        return {"live": live, "draining": draining, "queued": len(records) - live - draining}

    def oldest(self, count: int = 1, *, draining: bool = False) -> list[RequestTransferState]:
        """Copies of the ``count`` requests held longest, oldest first (in the order they were
        begun); with ``draining=True``, only requests that are terminal but not yet safe to free.

        Held requests are kept in begin order, so without ``draining`` this reads only the first
        ones. A request that stays among the oldest for longer than a transfer takes names, in
        its ``awaiting`` (or its ``loader`` without ``loaded``), a connector that never
        reported: once that connector no longer touches KV blocks, unregister it and the request
        is released. (Call it periodically and compare: records carry no timestamp, which would
        cost every ``begin`` a clock read.)

        .. versionadded:: 0.1.0
        """
        check_int(count, "count", minimum=0)
        check_bool(draining, "draining")
        found: list[RequestTransferState] = []
        if count == 0:
            return found
        for request_id, record in list(self._requests.items()):
            if draining and not (record.state in TERMINAL and record.in_flight):
                continue
            copy = self.get(request_id)
            if copy is None:
                continue  # taken meanwhile
            found.append(copy)
            if len(found) == count:
                break
        return found

    def __contains__(self, request_id: object) -> bool:
        """Whether ``request_id`` is held; ``False`` for anything that is not a ``str`` (an
        unhashable ``[]`` included), as no such id can be held."""
        if request_id.__class__ is str:
            return request_id in self._requests
        return isinstance(request_id, str) and str(request_id) in self._requests

    def request_ids(self) -> list[str]:
        """The ids of every held request."""
        return list(self._requests)

    def counts(self) -> dict[Outcome, int]:
        """How many events had each outcome, since this aggregator was made."""
        totals: dict[Outcome, int] = {}
        for (outcome, _), n in self._merged_counts().items():
            totals[outcome] = totals.get(outcome, 0) + n
        return totals

    def connector_counts(self) -> dict[str, dict[Outcome, int]]:
        """Event outcomes per connector name (reports and load reports).

        Names are whatever reports carried, registered or not. To keep memory bounded, each lock
        stripe keeps at most 1 024 distinct (outcome, name) counters; further names are counted
        under :data:`OTHER_NAMES` (``"<other names>"``).
        """
        per: dict[str, dict[Outcome, int]] = {}
        for (outcome, name), n in self._merged_counts().items():
            if name is not None:
                per.setdefault(name, {})[outcome] = n
        return per

    def _merged_counts(self) -> dict[tuple[Outcome, str | None], int]:
        merged: dict[tuple[Outcome, str | None], int] = {}
        stripes = zip(self._locks, self._counts, self._applied, strict=True)
        for index, (lock, counts, applied) in enumerate(stripes):
            with lock:
                items = [*counts.items(), *(((_APPLIED, k), n) for k, n in applied.items())]
                if self._finishes[index]:
                    items.append(((_APPLIED, _NO_NAME), self._finishes[index]))
            for key, n in items:
                merged[key] = merged.get(key, 0) + n
        return merged

    def stats(self) -> dict[str, Any]:
        """Each ready connector's ``get_stats()``, keyed by its registration name.

        Two connectors of one class never collide: the key is the name. A connector that raises
        is left out and :class:`ConnectorFailures` (``result``: the others' stats) is raised.
        Refused after :meth:`shutdown`.
        """
        if self._closed:
            self._shut("stats")
        stats: dict[str, Any] = {}
        errors: list[Exception] = []
        failed: list[str] = []
        for entry in self._registry.ready_entries():
            get_stats = getattr(entry.connector, "get_stats", None)
            if get_stats is None:
                continue
            try:
                stats[entry.name] = get_stats()
            except Exception as exc:
                errors.append(exc)
                failed.append(entry.name)
        if errors:
            raise ConnectorFailures(
                "connectors failed to give stats", errors, failed=failed, result=stats
            )
        return stats

    def shutdown(self) -> None:
        """Call ``shutdown()`` on every ready connector that has one; raise every failure.

        Every connector is attempted even when earlier ones raise; the failures are raised
        together as :class:`ConnectorFailures`, in registration order. The aggregator is shut
        down either way: from then on, every call that would do work (begin, finish, report or
        load a request, ask connectors, register one) raises :class:`ShutDownError` and changes
        nothing, while :meth:`cancel`, :meth:`take`, :meth:`unregister` and reading still work.
        A second ``shutdown()`` does nothing: no connector is shut down twice.
        """
        if self._closed:
            return
        self._closed = True  # first: a connector being shut down is never asked again
        errors: list[Exception] = []
        failed: list[str] = []
        for entry in self._registry.ready_entries():
            shutdown = getattr(entry.connector, "shutdown", None)
            if shutdown is None:
                continue
            try:
                shutdown()
            except Exception as exc:
                errors.append(exc)
                failed.append(entry.name)
        if errors:
            raise ConnectorFailures(
                f"{len(errors)} connector(s) failed to shut down: {', '.join(failed)}",
                errors,
                failed=failed,
            )

    # -- internals -----------------------------------------------------------------------------

    def _transition(
        self, record: RequestTransferState, event: str, dest: State, name: str | None
    ) -> None:
        """Move ``record`` to ``dest``; caller holds its lock and has written every other field
        (a terminal record is queued for :meth:`take`, which may hand it over at once).

        ``transfer_finished`` and ``transfer_finished_many`` inline this for their applied case,
        the hottest event."""
        source = record.state
        record.state = dest
        if record.history is not None:
            record.history.append(Step(event, source, dest, name))
        if dest is not source and dest in TERMINAL:
            if record.awaiting or record.loader is not None or dest is _CANCELLED:
                self._settle(record)  # maybe draining, or parked
            else:
                self._done.append(record)

    def _count(self, index: int, outcome: Outcome, name: str | None) -> None:
        counts = self._counts[index]
        key = (outcome, name)
        n = counts.get(key)
        if n is None and len(counts) >= _COUNTER_LIMIT:
            # Reports may carry any name at all: past the limit, new names share one key, so
            # a flood of made-up names cannot grow memory without bound.
            key = (outcome, OTHER_NAMES)
            n = counts.get(key)
        counts[key] = 1 if n is None else n + 1

    @staticmethod
    def _log_ignored(event: str, request_id: str, name: str | None, outcome: Outcome) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "ignored %s for request %r from %r: %s", event, request_id, name, outcome.value
            )

    @staticmethod
    def _call_back(outcome: Outcome, entry: Entry, method: Any, *args: Any) -> None:
        try:
            method(*args)
        except Exception as exc:
            raise ConnectorFailures(
                f"connector {entry.name!r} raised in its callback",
                [exc],
                failed=[entry.name],
                result=outcome,  # applied before the callback: the caller learns it
            ) from None

    def _shut(self, call: str) -> NoReturn:
        raise ShutDownError(f"{call}() refused: this MultiConnector was shut down")

    def __repr__(self) -> str:
        return f"MultiConnector({self._registry!r}, held={len(self._requests)})"

"""The checker's own references: how each event's outcome is classified, how params merge.

Written from the documentation (:class:`~multiconnector.Outcome`, ``request_finished``), not
from the aggregator's code, and independent of :mod:`multiconnector.params`: the properties in
:mod:`.properties` compare the aggregator with them. Each reads what one transition saw (the
records and the registry as they were before the event, the checker's ledger, the answers the
savers gave), never the state after it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Final

from ..machine import TABLE, TERMINAL, RequestTransferState, State, step
from ..outcome import Outcome
from .scenario import (
    _APPLY_ANSWERS,
    COUNTED_LOAD,
    COUNTED_SAVE,
    View,
    _Last,
    _Request,
    _World,
)

_APPLIED: Final = Outcome.applied
_DRAINED: Final = Outcome.drained
_UNKNOWN_REQUEST: Final = Outcome.unknown_request
_TERMINAL: Final = Outcome.terminal
_DUPLICATE: Final = Outcome.duplicate
#: What a report may do to a record: the outcomes that change it.
_TAKEN_IN: Final = frozenset({_APPLIED, _DRAINED})


def report_outcome(
    view: View | None,
    name: str,
    registry: Sequence[tuple[str, bool]],
    early: Collection[str] | None = None,
) -> Outcome:
    """The outcome of a ``transfer_finished`` from ``name`` for a record in ``view``.

    The documented rules, in order: not held; awaited (applied while live, drained while
    terminal); early, while a request_finished asks (``early`` is then the names whose early
    reports are kept: one of them reporting again is a duplicate), from a ready connector;
    terminal; unregistered while awaited (``abandoned``); reported already or promised and
    reported (``expected``); not registered; registered as ``None``; phantom.
    """
    if view is None:
        return _UNKNOWN_REQUEST
    state, awaiting, expected, abandoned = view
    if name in awaiting:
        return _DRAINED if state in TERMINAL else _APPLIED
    if early is not None and _by_registry(name, registry) is Outcome.phantom:
        return _DUPLICATE if name in early else Outcome.early
    if state in TERMINAL:
        return _TERMINAL
    if name in abandoned:
        return Outcome.unregistered
    if name in expected:
        return _DUPLICATE
    return _by_registry(name, registry)


def _by_registry(name: str, registry: Sequence[tuple[str, bool]]) -> Outcome:
    """Why a report from ``name`` that nothing awaited or expected is ignored: by the registry
    (``(name, ready)`` pairs)."""
    for registered, ready in registry:
        if registered == name:
            return Outcome.phantom if ready else Outcome.not_ready
    return Outcome.unknown_connector


def counted_rank(ranks: Sequence[str], owing: Collection[str]) -> str:
    """The report name a counted connector's next report settles, by the checker's ledger:
    the first of its names (``ranks``, in order) that ``owing`` says still owes the report
    (a promised save neither reported nor unregistered; or, of a load, the chosen loader's
    report, then the split part's), else the last. Restated from the documentation of the vLLM
    adapter's counted children (docs/vllm.md), not read from the rule the world applies."""
    return next((rank for rank in ranks if rank in owing), ranks[-1])


def _reported(view: View, name: str, outcome: Outcome) -> View:
    """``view`` after a report from ``name`` with ``outcome``: a batch's next report sees it.

    The next state is the declared transition's (:func:`multiconnector.machine.step`, on a
    scratch record): the machine is written down in one place only.
    """
    if outcome not in _TAKEN_IN:
        return view
    state, awaiting, expected, abandoned = view
    dest = step(RequestTransferState("", state=state, awaiting=awaiting), "transfer_finished", name)
    awaiting = tuple(n for n in awaiting if n != name)
    return (state if dest is None else dest, awaiting, expected, abandoned)


def _early_of(last: _Last, i: int) -> tuple[str, ...] | None:
    """Request ``i``'s early reports before ``last`` (``None``: it was not being asked)."""
    return last.early[i] if last.early else None


def settled_early(last: _Last, early: Sequence[str]) -> tuple[tuple[str, Outcome], ...]:
    """What the early reports ``early`` (in the order they came) turn out to be when the
    second half ``last`` records its answers: each is decided as if it arrived right after
    them, on the answers alone (no early report sees another).

    The record after the answers, from what the checker saw before: a cancelled request
    stays cancelled, else it becomes what the declared ``request_finished`` transition says;
    it awaits the savers still registered, expects every saver, and abandons the others.
    """
    before = last.before[last.event[1]]
    assert before is not None
    state, _, _, abandoned = before
    expected = tuple(n for n, _ in last.savers)
    awaiting = tuple(n for n, current in last.savers if current)
    gone = tuple(n for n, current in last.savers if not current and n not in abandoned)
    if state is not State.cancelled:
        dest = step(RequestTransferState("", state=state), "request_finished", awaiting)
        assert dest is not None
        state = dest
    view: View = (state, awaiting, expected, (*abandoned, *gone))
    return tuple((name, report_outcome(view, name, last.registry)) for name in early)


def expected_outcomes(last: _Last, atomic: bool) -> tuple[Outcome, ...] | None:
    """The outcomes the event ``last`` applied should have returned, from what it saw before.

    ``None`` for an event that returns none; ``()`` for request_finished's first half when it
    asks the connectors (the outcome comes with its second half).
    """
    event = last.event
    kind = event[0]
    if kind not in _REQUEST_KINDS and kind not in _REPORTS:
        return None
    registry = last.registry
    if kind == "transfer_finished":
        i = event[1]
        return (report_outcome(last.before[i], event[2], registry, _early_of(last, i)),)
    if kind == COUNTED_SAVE:  # never while a request_finished asks: no early report
        assert last.routed is not None
        return (report_outcome(last.before[event[1]], last.routed, registry),)
    if kind == "transfer_finished_many":
        name = event[1]
        views: list[View | None] = list(last.before)
        kept = [None if e is None else set(e) for e in last.early] or [None] * len(views)
        out = []
        for i in event[2]:
            view = views[i]
            outcome = report_outcome(view, name, registry, kept[i])
            out.append(outcome)
            seen = kept[i]
            if seen is not None and outcome is Outcome.early:
                seen.add(name)
            elif view is not None:
                views[i] = _reported(view, name, outcome)
        return tuple(out)
    before = last.before[event[1]]
    if before is None:
        return (_UNKNOWN_REQUEST,)
    state = before[0]
    if kind == "cancel":
        return (_TERMINAL if state in TERMINAL else _APPLIED,)
    if kind in ("request_finished", "request_finished_by"):
        if state in TERMINAL:
            return (_TERMINAL,)
        # No request_finished declared from its state (finishing), or being asked already.
        if not TABLE[state].get("request_finished") or last.claimed:
            return (_DUPLICATE,)
        # Told: applied at once; asked: applied by its second half unless atomic.
        return (_APPLIED,) if atomic or kind == "request_finished_by" else ()
    if kind == _APPLY_ANSWERS:  # a cancel that came in between wins
        return (Outcome.overtaken if state is State.cancelled else _APPLIED,)
    if kind in (COUNTED_LOAD, "load_finished"):
        load = last.load
        assert load is not None
        name = event[2] if last.routed is None else last.routed
        if load.early is not None and _by_registry(name, registry) is Outcome.phantom:
            return (_DUPLICATE if name in load.early else Outcome.early,)
        ledger = (load.loader, load.loaded, load.loader_gone, load.load_owed)
        part = (load.part, load.part_owed)
        return (_load_outcome(state, before[3], name, ledger, registry, part=part),)
    raise AssertionError(kind)  # pragma: no cover - _REQUEST_KINDS has no other kind


#: The checker's ledger of a request's load: (loader, loaded, loader gone, load owed).
Ledger = tuple[str | None, bool, bool, str | None]
#: The checker's ledger of a split load's second part: (its loader, whether it is owed).
Part = tuple[str | None, bool]


def _load_outcome(
    state: State,
    abandoned: Collection[str],
    name: str,
    ledger: Ledger,
    registry: Sequence[tuple[str, bool]],
    *,
    part: Part = (None, False),
) -> Outcome:
    """The documented outcome of a load report from ``name`` for a held request in ``state``,
    from the checker's ledger: on a terminal request the drain of the load the ledger says is
    owed; from the chosen loader, unregistered when it went since it was chosen, applied when
    not delivered yet, unregistered when its name was abandoned, else a duplicate; from any
    other name what the registry says (phantom, not ready, unknown connector).

    A split load's second loader (``part``) is a loader of its own: its report drains the
    part while owed on a terminal request (else ``terminal``), is applied while owed on a live
    one, else ``unregistered`` when its name was abandoned, else a duplicate."""
    loader, loaded, gone, owed = ledger
    if part[0] is not None and name == part[0] and name != loader:
        if state in TERMINAL:
            return _DRAINED if part[1] else _TERMINAL
        if part[1]:
            return _APPLIED
        return Outcome.unregistered if name in abandoned else _DUPLICATE
    if state in TERMINAL:
        return _DRAINED if owed == name else _TERMINAL
    if name == loader:
        if gone:
            return Outcome.unregistered
        if not loaded:
            return _APPLIED
        return Outcome.unregistered if name in abandoned else _DUPLICATE
    return _by_registry(name, registry)


def settle_loads(world: _World, request: _Request) -> tuple[tuple[str, Outcome], ...]:
    """What the early load reports of ``request`` (in the order they came) turn out to be when
    its match_tokens records the loader: each is decided as if it arrived right after, from
    the checker's ledger as that match's answers leave it (a pending request's loader is the
    first connector its scripted answers gave tokens, unless one answered ``None``; any other
    request's ledger is unchanged), the state read before the event."""
    view = request.view
    if view is None:  # taken meanwhile (finished: nothing parks it)
        return tuple((name, _UNKNOWN_REQUEST) for name in request.load_early)
    state = view[0]
    decisive, chose, entries = request.match_seen
    ledger: Ledger = (request.loader, request.loaded, request.loader_gone, request.load_owed)
    part: Part = (request.part, request.part_owed)
    if state is State.pending and decisive:
        current = chose is not None and world.mc.registry.entry(chose) is dict(entries)[chose]
        owed = chose if current and chose not in request.window_loads else None
        ledger = (chose, False, chose is not None and not current, owed)
        part = (None, False)  # the match chose anew: no part of a split before it
    out = []
    for name in request.load_early:
        outcome = _load_outcome(state, view[3], name, ledger, world.registry, part=part)
        out.append((name, outcome))
        if outcome in _TAKEN_IN:  # its load delivered: the ledger owes it no more
            loader, _, gone, owed = ledger
            if name == part[0] and name != loader:
                part = (name, False)
            else:
                ledger = (loader, True, gone, None if owed == name else owed)
    return tuple(out)


_REQUEST_KINDS: Final = frozenset(
    {
        "cancel",
        "request_finished",
        _APPLY_ANSWERS,
        "request_finished_by",
        "load_finished",
        COUNTED_LOAD,
    }
)
_REPORTS: Final = frozenset({"transfer_finished", "transfer_finished_many", COUNTED_SAVE})


def reference_merge(
    answered: Iterable[tuple[str, Mapping[str, Any] | None]], allow_equal: bool
) -> tuple[dict[str, Any] | None, list[str]]:
    """The merged params of ``answered`` ((name, params) in the order asked), and the keys
    that clash (supplied twice, with different values when ``allow_equal``).

    The documented merge: ``None`` contributes nothing; nothing at all contributed gives
    ``None``; a key supplied by two connectors is a clash, unless ``allow_equal`` and the values
    are equal. Merged is ``None`` when anything clashes.
    """
    merged: dict[str, Any] | None = None
    clashing: list[str] = []
    for _, params in answered:
        if params is None:
            continue
        if merged is None:
            merged = {}
        for key, value in params.items():
            if key not in merged:
                merged[key] = value
            elif not (allow_equal and merged[key] == value) and key not in clashing:
                clashing.append(key)
    return (None if clashing else merged), clashing

"""The report rules and the decisions every side shares, written once.

The decisions held here:

* :func:`transfer_report`: what "connector ``name`` finished saving" does. From a request's
  state (``None``: not held), the names it still awaits, expects and abandoned, and the
  reporting name, it gives a :data:`Verdict`: the :class:`~multiconnector.Outcome`, the state
  the request moves to, what it awaits afterwards, and whether the report completes it (moves
  it into a terminal state). The state it moves to comes from
  :data:`multiconnector.machine.DECISIONS`, so from the one declaration the model checker
  explores.
* :func:`load_report`: what "connector ``name`` finished loading" does; :func:`part_report`,
  when ``name`` loads a further part of a split load.
* :func:`counted_name`: which of a counted child's report names (``<name>@1`` to ``<name>@k``,
  one per worker that reports its transfer) one more of its reports settles, on a request's
  record: the next one the request still owes, of its save or of its load.
* :func:`refined`: why a stranger's report is ignored (``phantom`` refined into
  ``unknown_connector`` or ``not_ready`` by what the caller knows of the name).
* :func:`count`: the capped counter every table of outcomes per name is kept with.
* :func:`load_owed`: whether a request's load is still owed (defined in
  :mod:`multiconnector.machine`, beside the record whose ``in_flight`` reads it, and read
  from here by every other side).
* :func:`safe_to_hand_back`: whether ``take()`` may hand a record back: terminal, and not in
  flight (:func:`multiconnector.machine.in_flight_of`, the one spelling of "a connector may
  still touch its blocks", which the record's ``in_flight`` reads too).
* :func:`decide`: the state an event leads a record to, from its
  :data:`~multiconnector.machine.DECISIONS` entry: every side that fires an event (the
  aggregator's ``request_finished``, ``cancel`` and unregistering, the report rules here)
  applies the entry through it.
* :func:`finish_refused`: why ``request_finished`` does not apply to a held request
  (``terminal`` or ``duplicate``).
* :func:`one_completion`: what becomes of a completion a vLLM side is about to pass on (vLLM
  frees a request's blocks, or runs a loaded request, on the first completion of it it sees):
  passed on, held back while its load still owes a report, or dropped (a load completion of a
  request that saves: its one completion is its save's). Read by a vLLM worker for the saves
  it reports, and by the vLLM scheduler for every load completion (a counted loader's
  included).
* :func:`may_look_up`, :func:`slow_lookup` and :func:`next_cooldown`: what a child's health
  (:mod:`multiconnector.health`) means: whether it is asked to look up (and so may be chosen to
  load), whether a lookup that answered was too slow (a failure, its answer taken), and how
  long a child stays open when it opens (the cooldown, doubled after each failed probe up to a
  bound). Nothing here touches the transfer books: health never drops what a child owes.
* :func:`failure_kind` and :func:`failure_counts`: which of a child's failures its health
  machine counts (``health.count``: by kind, :data:`FAILURE_KINDS`; by default those of what
  the breaker gates, :data:`DEFAULT_FAILURE_KINDS`).
* :func:`finish_answer`: what a connector's ``request_finished`` answer promises (a garbage
  answer is awaited, in case it started a save; a load-only connector is never awaited), read
  by the aggregator's ``request_finished``, the registry's load-only connectors and the vLLM
  scheduler, which asks its children itself and tells the aggregator who saves.

Every side that applies a report reads its verdict here: the aggregator's
:meth:`~multiconnector.MultiConnector.transfer_finished`,
:meth:`~multiconnector.MultiConnector.transfer_finished_many` and
:meth:`~multiconnector.MultiConnector.load_finished` (and the decision of the reports that came
early), :class:`~multiconnector.SaveLedger` (a vLLM worker's saves), and the vLLM adapter's
books of the children that report on fewer workers than all (which also route each report by
:func:`counted_name`, as the model checker's ``counted`` connectors do).
``multiconnector.check.reference`` is the exception on purpose: the checker's oracle restates
the rules independently, to catch these. ``tests/test_rule_once.py`` reads the package's source
to keep it so.

A second ``request_finished`` is refused in three places, which do not decide the same
question, so no function here is shared by them: the aggregator refuses it by the record's
state (``unknown_request``, ``terminal``, or ``duplicate`` while finishing or while another
call asks: :data:`~multiconnector.machine.DECISIONS` has no transition for it); the ledger has
no states, holds a request only while savers owe it reports, and calls a request it holds a
``duplicate`` (the aggregator's outcome for a finishing request), while one it does not hold
is a new finish (a worker learns of a request only when it finished); the vLLM scheduler
answers vLLM for a request whose saves it handed off (``True``: the blocks stay held) without
asking the children, as vLLM's interface wants an answer, not an outcome, and its core books
no longer hold that request.

Verdicts for a report the request awaits are many and alike (every request of a deployment
awaits one of a few name tuples), so :class:`Verdicts` remembers them, keyed by what they depend
on: the state, the awaited tuple and the name (``transfer_finished``'s guards read the awaited
names alone). The hot paths read that memo directly and call :meth:`Verdicts.of` on a miss.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import Enum
from typing import Any, Final

from ._validate import shown
from .errors import InvalidAnswerError, RoleError
from .health import Health
from .machine import (
    DECISIONS,
    STATES,
    TERMINAL,
    Decision,
    RequestTransferState,
    State,
    in_flight_of,
    load_owed,
)
from .outcome import Outcome

__all__ = [
    "COUNTER_LIMIT",
    "DEFAULT_FAILURE_KINDS",
    "DROP",
    "FAILURE_KINDS",
    "HOLD",
    "OTHER_NAMES",
    "PASS",
    "SHARED_LIMIT",
    "LoadVerdict",
    "Verdict",
    "Verdicts",
    "count",
    "counted_name",
    "decide",
    "failure_counts",
    "failure_kind",
    "finish_answer",
    "finish_refused",
    "load_owed",
    "load_report",
    "may_look_up",
    "next_cooldown",
    "one_completion",
    "part_report",
    "refined",
    "safe_to_hand_back",
    "slow_lookup",
    "transfer_report",
]

#: ``(outcome, state after, awaited after, completes)``. ``state after`` is ``None`` when the
#: report is ignored (then ``awaited after`` is the awaited tuple given); ``completes`` is true
#: when the report moved the request into a terminal state.
Verdict = tuple[Outcome, State | None, tuple[str, ...], bool]

#: ``(outcome, loaded)``: the outcome of a load report, and whether the record's ``loaded`` is
#: true after it (an applied load, or the drain of a terminal request's load).
LoadVerdict = tuple[Outcome, bool]

#: Distinct name tuples (and verdicts) kept for sharing: awaited sets are few, requests many, and
#: made-up names cannot grow the tables past this.
SHARED_LIMIT: Final = 4096
#: Distinct ``(outcome, name)`` counters kept per table; later names count under OTHER_NAMES.
COUNTER_LIMIT: Final = 1024
#: The name under which every name past the counter limit is counted.
OTHER_NAMES: Final = "<other names>"


_PHANTOM: Final = Outcome.phantom
_UNKNOWN_CONNECTOR: Final = Outcome.unknown_connector
_NOT_READY: Final = Outcome.not_ready


def count(
    counts: dict[tuple[Outcome, Any], int],
    outcome: Outcome,
    name: str | None,
    n: int = 1,
) -> None:
    """Add ``n`` to ``counts[(outcome, name)]``. Reports may carry any name at all: past
    :data:`COUNTER_LIMIT` distinct keys, new names share the key ``(outcome, OTHER_NAMES)``, so a
    flood of made-up names cannot grow memory without bound. (``counts``' names are ``str`` or
    ``None``: typed ``Any`` so that tables keyed by ``str`` alone are counted here too.)"""
    key = (outcome, name)
    had = counts.get(key)
    if had is None and len(counts) >= COUNTER_LIMIT:
        key = (outcome, OTHER_NAMES)
        had = counts.get(key)
    counts[key] = n if had is None else had + n


def refined(outcome: Outcome, known: bool, ready: bool) -> Outcome:
    """Why a report from a stranger is ignored: ``outcome`` (a verdict's) refined by what the
    caller knows of the reporting name. A ``phantom`` from a name with no connector
    (``known`` false) is ``unknown_connector``, from a name registered with ``None`` (``ready``
    false) ``not_ready``; a ready connector's stays ``phantom``. Any other outcome is returned
    as it is: the rules tested before ``phantom`` come first."""
    if outcome is not _PHANTOM:
        return outcome
    if not known:
        return _UNKNOWN_CONNECTOR
    if not ready:
        return _NOT_READY
    return outcome


def counted_name(ranks: tuple[str, ...], record: RequestTransferState | None, *, load: bool) -> str:
    """The report name one more report of a counted child settles: the first of its
    ``ranks`` (its report names, ``<name>@1`` to ``<name>@k``, non-empty) that ``record``
    still owes, else the last (the core then says why the report is ignored: a duplicate, a
    terminal request, an unknown one when ``record`` is ``None``).

    A save report (``load`` false) settles a name the record still awaits
    (:attr:`~multiconnector.RequestTransferState.awaiting`); a load report (``load`` true) a
    name that still owes a load report (:meth:`~multiconnector.RequestTransferState.owes_load`:
    the loader of a split load, then its parts), never a save's: a request that saves under
    the same names while it loads (aborted while loading, say) would otherwise have a load
    report settle a save's name, and its load's part owed for ever.
    """
    if record is not None:
        for rank in ranks:
            if record.owes_load(rank) if load else rank in record.awaiting:
                return rank
    return ranks[-1]


#: What :func:`finish_answer` gives: ``(saves, params, error)``.
FinishAnswer = tuple[bool, Mapping[str, Any] | None, InvalidAnswerError | RoleError | None]


def finish_answer(name: str, answer: Any, *, load_only: bool = False) -> FinishAnswer:
    """What connector ``name``'s ``request_finished`` answer commits it to: ``(saves, params,
    error)``.

    A ``(bool, Mapping | None)`` pair says what it says. Anything else is garbage: it may have
    started a save, so it counts as saving (awaited), its params are dropped, and ``error`` is
    an :class:`~multiconnector.InvalidAnswerError` naming the connector and the answer. A
    ``load_only`` connector (``role=Role.load``) is never awaited: any answer but
    ``(False, params)`` counts as not saving, its params dropped, with a
    :class:`~multiconnector.RoleError`.
    """
    if answer.__class__ is tuple and len(answer) == 2:
        saves, params = answer
        if (
            (saves is True or saves is False)
            and (params is None or params.__class__ is dict or isinstance(params, Mapping))
            and not (load_only and saves)
        ):
            return saves, params, None
    if not load_only:
        return True, None, _garbage(name, answer)
    promised = (
        "promised an asynchronous save"
        if answer.__class__ is tuple and len(answer) == 2 and answer[0] is True
        else "did not answer a (False, params) pair"
    )
    return (
        False,
        None,
        RoleError(
            f"connector {name!r} is registered with role=Role.load, yet answered "
            f"request_finished with {shown(answer)}: it {promised}. A load-only connector is "
            "never awaited: it counts as not saving and its params are dropped",
            connector=name,
            answer=answer,
        ),
    )


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


class Completion(Enum):
    """What :func:`one_completion` decides of a completion: passed on, held back, dropped."""

    passed = "passed"
    held = "held"
    dropped = "dropped"


PASS: Final = Completion.passed
HOLD: Final = Completion.held
DROP: Final = Completion.dropped


def one_completion(*, load: bool, saves: bool, owed: bool) -> Completion:
    """One completion per request: what becomes of a completion of a request (of its load when
    ``load``, else of its saves) that a side is about to pass on to vLLM, which frees a
    request's blocks (or runs a loaded request) on the first completion of it it sees.

    ``owed``: the request's load still owes a report on this side's books (on a worker, its load
    is in flight there; on the scheduler, a counted loader's report names are owed): the
    completion is held back (:data:`HOLD`) and decided again when the load's report came, so
    that vLLM never frees blocks a load still writes, nor runs a request a part of whose load
    has not arrived. Otherwise a load completion of a request that ``saves`` is dropped
    (:data:`DROP`): its one completion is its save's (the load's report is still applied to
    the books), and anything else is passed on (:data:`PASS`)."""
    if owed:
        return HOLD
    if load and saves:
        return DROP
    return PASS


def safe_to_hand_back(
    state: State,
    awaiting: tuple[str, ...],
    loader: str | None,
    loaded: bool,
    loader_gone: bool,
    *,
    parts_owed: tuple[str, ...] = (),
) -> bool:
    """Whether :meth:`~multiconnector.MultiConnector.take` may hand back a record with these
    fields: it is terminal, it awaits no save, its load is not owed (:func:`load_owed`) and no
    part of a split load is (``parts_owed``). No connector touches its blocks then. (A terminal
    record that is not is *draining*.)"""
    return state in TERMINAL and not in_flight_of(awaiting, parts_owed, loader, loaded, loader_gone)


def decide(
    decisions: Mapping[State, Decision], record: RequestTransferState, arg: Any
) -> State | None:
    """The state one event leads ``record`` to, ``None`` when no transition applies, from the
    event's entry of :data:`~multiconnector.machine.DECISIONS` (``decisions``) and the guard's
    argument ``arg``: the one place an entry is applied (``machine.step``'s walk, in one guard
    call). Does not change ``record``: the caller writes the state with its bookkeeping."""
    guard, yes, no = decisions[record.state]
    return yes if guard is None or guard(record, arg) else no


def finish_refused(state: State) -> Outcome:
    """Why ``request_finished`` does not apply to a held request in ``state`` (no transition, or
    another call holds it): ``terminal`` once it is finished or cancelled, else ``duplicate``
    (it is finishing, or another call is finishing it)."""
    return Outcome.terminal if state in TERMINAL else Outcome.duplicate


_DECIDE: Final = DECISIONS["transfer_finished"]
_APPLIED: Final = Outcome.applied
_DRAINED: Final = Outcome.drained
_EARLY: Final = Outcome.early
_UNKNOWN: Final[Verdict] = (Outcome.unknown_request, None, (), False)


def transfer_report(
    state: State | None,
    awaiting: tuple[str, ...],
    expected: tuple[str, ...],
    abandoned: tuple[str, ...],
    name: str,
    *,
    early: Collection[str] | None = None,
) -> Verdict:
    """The verdict on connector ``name``'s transfer report for a request in ``state``.

    Applied when the request awaits ``name`` and the declaration has a transition for it: one
    name less is awaited, and the last one moves a ``finishing`` request to ``finished``. On a
    terminal request (``cancelled``) the same report is its drain: ``drained``, the state
    unchanged.

    An early report is one the request cannot decide yet: ``early`` is not ``None`` when a
    ``request_finished`` for the request is still asking the connectors (its answers are not
    recorded: ``name`` may be promising a save right now), ``name`` is a ready connector, and
    ``early`` holds the names whose early reports are kept already. A report it does not await
    is then ``early``: kept, and decided (by this rule, with ``early`` ``None``) once the
    answers are recorded, as if it arrived right after them; or a ``duplicate`` when ``name``
    is kept already. The state is unchanged either way.

    Any other report is ignored, and the outcome says why, tested in this order:
    ``unknown_request`` (``state`` is ``None``), ``terminal``, ``unregistered`` (``name`` was
    abandoned), ``duplicate`` (it was expected and already reported), else ``phantom``. A caller
    that knows the name's connector refines ``phantom`` into ``unknown_connector`` (no such
    connector) or ``not_ready`` (a ``None`` slot).
    """
    if state is None:
        return _UNKNOWN
    if name in awaiting:
        # The guards are methods of the record (machine.py): they read it, so they get one.
        probe = RequestTransferState(
            "", state, awaiting=awaiting, expected=expected, abandoned=abandoned
        )
        dest = decide(_DECIDE, probe, name)
        if dest is not None:
            rest = tuple([n for n in awaiting if n != name])
            if dest is state and state in TERMINAL:
                return (_DRAINED, dest, rest, False)
            return (_APPLIED, dest, rest, dest is not state and dest in TERMINAL)
    if early is not None:
        return (Outcome.duplicate if name in early else _EARLY, None, awaiting, False)
    if state in TERMINAL:
        outcome = Outcome.terminal
    elif name in abandoned:
        outcome = Outcome.unregistered
    elif name in expected:
        outcome = Outcome.duplicate
    else:
        outcome = Outcome.phantom
    return (outcome, None, awaiting, False)


def load_report(
    state: State | None,
    loader: str | None,
    name: str,
    *,
    loaded: bool = False,
    loader_gone: bool = False,
    abandoned: Collection[str] = (),
    early: Collection[str] | None = None,
) -> LoadVerdict:
    """The verdict on connector ``name``'s load report for a request in ``state`` whose chosen
    loader is ``loader`` (``loaded``: its report was applied or drained already;
    ``loader_gone``: it was unregistered since it was chosen), ``abandoned`` its record's.

    An early report is one the request cannot decide yet: ``early`` is not ``None`` when a
    ``match_tokens`` for the request is still asking the connectors (the loader it chooses is
    not recorded: ``name`` may be starting that very load), ``name`` is a ready connector, and
    ``early`` holds the names whose early load reports are kept already. The report is then
    ``early``: kept, and decided (by this rule, with ``early`` ``None``) once the loader is
    recorded, as if it arrived right after; or a ``duplicate`` when ``name`` is kept already.

    Otherwise, in this order: ``unknown_request`` (``state`` is ``None``); on a terminal
    request, the drain of its load (``drained``) from a loader that neither reported nor was
    unregistered, else ``terminal``; from the chosen loader, ``unregistered`` when it was
    unregistered since it was chosen, ``applied`` when it has not reported, ``unregistered``
    when its name was abandoned (its load ended when it was unregistered), else
    ``duplicate``; from any other name ``phantom``, which a caller that knows the name's
    connector refines into ``unknown_connector`` or ``not_ready``.
    """
    if state is None:
        return _UNKNOWN_LOAD
    if early is not None:
        return (Outcome.duplicate if name in early else _EARLY, loaded)
    if state in TERMINAL:
        if loader == name and load_owed(loader, loaded, loader_gone):
            return _DRAINED_LOAD
        return (Outcome.terminal, loaded)
    if loader == name:
        if loader_gone:
            return (Outcome.unregistered, loaded)
        if not loaded:
            return _APPLIED_LOAD
        if name in abandoned:
            return (Outcome.unregistered, loaded)
        return (Outcome.duplicate, loaded)
    return (Outcome.phantom, loaded)


def part_report(
    state: State,
    parts_owed: tuple[str, ...],
    abandoned: Collection[str],
    name: str,
) -> tuple[Outcome, tuple[str, ...]]:
    """The verdict on the load report of ``name``, a further loader of a held request's split
    load (one of its record's ``parts``), whose ``parts_owed`` are still owed: the outcome, and
    the parts owed after it.

    Each part is its own load: its first report is ``applied`` while the request is live and
    its drain (``drained``) once it is terminal; either way it is owed no more. A part
    unregistered before it reported (its name ``abandoned``, no longer owed) is
    ``unregistered``; a part that reported already is a ``duplicate`` while live and
    ``terminal`` once terminal. (:func:`load_report` decides the first part, the loader's, and
    the reports that cannot be decided yet.)
    """
    if name in parts_owed:
        rest = tuple([n for n in parts_owed if n != name])
        return (_DRAINED if state in TERMINAL else _APPLIED, rest)
    if state in TERMINAL:
        return (Outcome.terminal, parts_owed)
    if name in abandoned:
        return (Outcome.unregistered, parts_owed)
    return (Outcome.duplicate, parts_owed)


_UNKNOWN_LOAD: Final[LoadVerdict] = (Outcome.unknown_request, False)
_DRAINED_LOAD: Final[LoadVerdict] = (Outcome.drained, True)
_APPLIED_LOAD: Final[LoadVerdict] = (Outcome.applied, True)


class Verdicts:
    """:func:`transfer_report`'s verdicts on reports a request awaits, remembered; and the name
    tuples they share.

    ``by_state[state][awaiting][name]`` is the verdict on a report from ``name``, which a
    request in ``state`` awaiting ``awaiting`` awaits. The hot paths read it directly (three
    dict lookups, the guard call saved) and call :meth:`of` when it misses. Ignored reports are
    not remembered: their verdict depends on more than the key, and they are the rare case.
    Bounded by :data:`SHARED_LIMIT` (then verdicts are computed, not kept). Not locked: each
    write stores a value that is a function of its key alone, so a lost or repeated write
    changes nothing read.
    """

    __slots__ = ("by_state", "interned", "kept")

    def __init__(self) -> None:
        self.by_state: dict[State, dict[tuple[str, ...], dict[str, Verdict]]] = {
            state: {} for state in STATES
        }
        #: Name tuples shared by every request with the same names (memory).
        self.interned: dict[tuple[str, ...], tuple[str, ...]] = {}
        self.kept = 0

    def intern(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """The shared tuple equal to ``names`` (``names`` itself when new or when full)."""
        shared = self.interned.get(names)
        if shared is not None:
            return shared
        if len(self.interned) < SHARED_LIMIT:
            return self.interned.setdefault(names, names)
        return names

    def of(
        self,
        state: State | None,
        awaiting: tuple[str, ...],
        expected: tuple[str, ...],
        abandoned: tuple[str, ...],
        name: str,
        *,
        early: Collection[str] | None = None,
    ) -> Verdict:
        """:func:`transfer_report`'s verdict, remembered when the request awaits ``name``."""
        if state is None or name not in awaiting:
            return transfer_report(state, awaiting, expected, abandoned, name, early=early)
        by_awaiting = self.by_state[state]
        known = by_awaiting.get(awaiting)
        if known is not None:
            verdict = known.get(name)
            if verdict is not None:
                return verdict
        outcome, dest, rest, completes = transfer_report(state, awaiting, expected, abandoned, name)
        if dest is None:  # ignored (a state that awaits nothing): not a function of the key
            return (outcome, dest, rest, completes)
        verdict = (outcome, dest, self.intern(rest), completes)
        if self.kept < SHARED_LIMIT:
            self.kept += 1
            by_awaiting.setdefault(awaiting, {})[name] = verdict
        return verdict


def may_look_up(state: Health) -> bool:
    """Whether a child in health ``state`` is asked to look up (so may be chosen to load):
    yes unless it is ``open``. A ``half_open`` child is asked: its answers are the probes.
    Saves, per-step and per-layer hooks, ``request_finished`` and shutdown are asked whatever
    the state: a save it takes is awaited as any, and vLLM's contract (``request_finished``
    once per request) holds for every child."""
    return state is not Health.open


def slow_lookup(seconds: float, bound: float | None) -> bool:
    """Whether a lookup that took ``seconds`` is a failure under the composition's
    ``slow_lookup_seconds`` ``bound`` (``None``: off). Python cannot interrupt a call: the
    answer is taken, and counted a failure, so that the next ones are not waited for."""
    return bound is not None and seconds > bound


def next_cooldown(cooldown: float, *, base: float, most: float, probe_failed: bool) -> float:
    """How long a child that opens now stays open: ``base`` when it opens from ``closed``;
    twice its last ``cooldown`` (at most ``most``) when a probe failed (it opens from
    ``half_open``): a store that is still down is asked less and less often."""
    if not probe_failed:
        return base
    return min(cooldown * 2, most)


#: The kinds of a child's failure its health machine may count, each a family of hooks
#: (:func:`failure_kind`): ``lookup`` (its lookups: ``get_num_new_matched_tokens``, a slow or
#: an impatient answer, ``may_load_async``, and what vLLM asks of the loader it chose:
#: ``get_loaded_kv_cache_group_ids``, ``get_external_cache_hit_sources``), ``load`` (a load
#: reported failed, its blocks' load errors, ``update_state_after_alloc``), ``overdue`` (a
#: load's report owed past ``report_overdue_seconds``), ``save`` (``request_finished`` and
#: ``register_finished_partial_tail``: where a child decides a save) and ``step`` (every other
#: per-step hook: ``build_connector_meta``, ``update_connector_output``, stats, events, ...).
FAILURE_KINDS: Final = ("lookup", "load", "overdue", "save", "step")

#: What the breaker counts unless told otherwise: the failures of what it gates (an open child
#: is not asked to look up nor chosen to load), so that a child failing only its stats, its
#: events or ``request_finished`` (still called whatever its health) is not bypassed for
#: lookups it answers well.
DEFAULT_FAILURE_KINDS: Final = frozenset({"lookup", "load", "overdue"})

_KIND_OF_HOOK: Final[Mapping[str, str]] = {
    "get_num_new_matched_tokens": "lookup",
    "may_load_async": "lookup",
    "get_loaded_kv_cache_group_ids": "lookup",
    "get_external_cache_hit_sources": "lookup",
    "update_state_after_alloc": "load",
    "update_state_after_alloc_range": "load",
    "finished_recving": "load",
    "get_block_ids_with_load_errors": "load",
    "finished_recving_overdue": "overdue",
    "finished_sending_overdue": "overdue",
    "request_finished": "save",
    "request_finished_all_groups": "save",
    "register_finished_partial_tail": "save",
}


def failure_kind(hook: str) -> str:
    """The kind (:data:`FAILURE_KINDS`) of a child's failure in ``hook`` (the hook's name, or
    the pseudo-hook under which a load reported failed or a report overdue is counted): a hook
    not listed is a per-step one, ``step``."""
    return _KIND_OF_HOOK.get(hook, "step")


def failure_counts(hook: str | None, kinds: Collection[str]) -> bool:
    """Whether a child's failure in ``hook`` is a failure of its health machine, under the
    composition's ``kinds`` (``health.count``); ``None``: a failure with no hook (told to the
    book directly), always counted. A failure not counted is still counted and logged as the
    child's (:mod:`multiconnector.vllm.trouble`): only the breaker does not see it."""
    return hook is None or failure_kind(hook) in kinds

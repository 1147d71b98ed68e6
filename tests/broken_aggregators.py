"""Deliberately broken aggregators: the model checker must be able to fail.

Each entry plants one bug that real aggregators have had, as a small subclass of the real
:class:`~multiconnector.MultiConnector` (``@final`` is for type checkers only) or as a patch of
the compiled transition table, and names the property the checker must fail with the length of
the known shortest counterexample. ``tests/test_check_broken.py`` runs the checker on each.
"""

from __future__ import annotations
import __future__

import inspect
import os
import textwrap
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import attrs
import pytest

from multiconnector import InvalidAnswerError, MultiConnector, Outcome, State
from multiconnector import machine as machine_module
from multiconnector._table import decision as decision_of
from multiconnector.aggregator import saving as saving_module
from multiconnector.check import ALPHABET, LOAD_EVENTS, SPLIT_EVENTS
from multiconnector.machine import Compiled, RequestTransferState
from multiconnector.params import merge_transfer_params


class CountBasedDraining(MultiConnector):  # type: ignore[misc]
    """Counts reports instead of tracking names: a duplicate from one saver drains another.

    vLLM's original aggregator decremented a counter per completion, so a connector reporting
    twice released a request another connector was still saving.
    """

    def transfer_finished(self, request_id: str, name: str, blocks: Sequence[int] = ()) -> Outcome:
        record = self._requests.get(request_id)
        if (
            record is not None
            and record.state is State.finishing
            and name in record.expected
            and name not in record.awaiting
            and record.awaiting
        ):
            name = record.awaiting[0]  # the bug: any committed saver's report counts one down
        return super().transfer_finished(request_id, name, blocks)


class LateCompletionAfterCancel(MultiConnector):  # type: ignore[misc]
    """Applies a transfer report that arrives after the request was cancelled as if it were
    still finishing: the last one resurrects it as ``finished``."""

    def transfer_finished(self, request_id: str, name: str, blocks: Sequence[int] = ()) -> Outcome:
        record = self._requests.get(request_id)
        if record is not None and record.state is State.cancelled and name in record.awaiting:
            record.state = State.finishing  # the bug: the report is applied as a live one
        return super().transfer_finished(request_id, name, blocks)


class OvertakenSaversDropped(MultiConnector):  # type: ignore[misc]
    """Drops the savers that answered a request_finished a cancel overtook: the cancelled
    request is handed back at once, while they save from its blocks."""

    def _overtaken(
        self,
        record: RequestTransferState,
        awaited: tuple[str, ...],
        expected: tuple[str, ...],
        index: int,
    ) -> Outcome:
        return super()._overtaken(record, (), (), index)  # the bug: the promises are lost


class DrainingCancelHandedBack(MultiConnector):  # type: ignore[misc]
    """Hands a cancelled request back at once, while saves (or a load) are still in flight."""

    def cancel(self, request_id: str) -> Outcome:
        outcome = super().cancel(request_id)
        record = self._requests.get(request_id)
        if outcome is Outcome.applied and record is not None and record.in_flight:
            self._done.append(record)  # the bug: take() hands it back before it drained
        return outcome


class BareTrueNoPromise(MultiConnector):  # type: ignore[misc]
    """Treats a bare ``True`` answer to request_finished as a raise: "made no promise"."""

    def _apply_answers(self, *asked: Any) -> tuple[Outcome, dict[str, Any] | None]:
        record, claim, index, ready, savers, failures, merged, clash = asked
        bare = {
            name
            for name, exc in failures or ()
            if isinstance(exc, InvalidAnswerError) and exc.answer is True
        }
        savers = [e for e in savers if e.name not in bare]  # the bug: not awaited
        return super()._apply_answers(  # type: ignore[no-any-return]
            record, claim, index, ready, savers, failures, merged, clash
        )


class NoneSlotDereferenced(MultiConnector):  # type: ignore[misc]
    """Looks a reporting connector up and uses it, though the slot may hold ``None``.

    The position-indexed original crashed the server on a report from a connector that had
    failed to start.
    """

    def transfer_finished(self, request_id: str, name: str, blocks: Sequence[int] = ()) -> Outcome:
        record = self._requests.get(request_id)
        entry = self.registry.entry(name)
        if record is not None and entry is not None and name not in record.awaiting:
            entry.connector.request_finished  # the bug: AttributeError on a None slot  # noqa: B018
        return super().transfer_finished(request_id, name, blocks)


class FinishedNeverDropped(MultiConnector):  # type: ignore[misc]
    """Hands terminal requests back but keeps holding them: their state outlives them."""

    def take(self) -> list[RequestTransferState]:
        taken = list(self._done)
        self._done.clear()  # the bug: self._requests still holds every one of them
        return taken


class PhantomAccepted(MultiConnector):  # type: ignore[misc]
    """Counts a report from a ready connector that never promised a save for the request."""

    def transfer_finished(self, request_id: str, name: str, blocks: Sequence[int] = ()) -> Outcome:
        record = self._requests.get(request_id)
        entry = self.registry.entry(name)
        if (
            record is not None
            and record.state is State.finishing
            and entry is not None
            and entry.connector is not None
            and name not in record.expected
        ):
            name = record.awaiting[0]  # the bug: the phantom report stands in for a real one
        return super().transfer_finished(request_id, name, blocks)


class DuplicateLoadAccepted(MultiConnector):  # type: ignore[misc]
    """Applies the chosen loader's load completion every time it arrives, not once.

    vLLM's MultiConnector crashed on a duplicate load completion (vLLM issues #51786, #53049);
    one that applies it twice releases the loaded blocks twice.
    """

    def load_finished(self, request_id: str, name: str) -> Outcome:
        record = self._requests.get(request_id)
        if record is not None and record.loader == name:
            record.loaded = False  # the bug: forgets that the completion was already applied
        return super().load_finished(request_id, name)


class UnchosenLoaderAccepted(MultiConnector):  # type: ignore[misc]
    """Applies a load completion from a ready connector other than the chosen loader."""

    def load_finished(self, request_id: str, name: str) -> Outcome:
        record = self._requests.get(request_id)
        entry = self.registry.entry(name)
        if (
            record is not None
            and record.state not in (State.finished, State.cancelled)
            and record.loader is not None
            and record.loader != name
            and entry is not None
            and entry.connector is not None
        ):
            record.loaded = True  # the bug: any ready connector's completion counts as the load
            return Outcome.applied
        return super().load_finished(request_id, name)


class UnregisteredLoaderAccepted(MultiConnector):  # type: ignore[misc]
    """Forgets that a request's chosen loader was unregistered: its completion is still applied.

    A completion under that name (from the connector that is gone, or from a new one registered
    under its name) is then applied, and the new connector gets ``on_load_finished`` for a
    request it never matched.
    """

    def _connector_gone(self, entry: Any) -> None:
        loading = {id(r): r.loaded for r in self._requests.values() if r.loader == entry.name}
        super()._connector_gone(entry)
        for record in self._requests.values():
            if id(record) in loading:
                # the bug: the loader's unregistration is forgotten, both that it is gone and
                # that its load ended with it (either alone still ignores its completion)
                record.loader_gone = False
                record.loaded = loading[id(record)]


#: Set by tools/mutate.py: a planted bug whose line a mutant changed is then skipped (neutral),
#: so that mutant must be killed by a failing test of its own, not by the planted bug's build.
MUTATING = os.environ.get("MULTICONNECTOR_MUTATING") == "1"


class Planted:
    """A subclass of :class:`MultiConnector` whose ``method`` is the real one's source with each
    ``(old, new)`` of ``changes`` made: a bug planted inside a method too long to copy
    (``_gather``'s inlined merge). Called, it builds an aggregator, as a factory does.

    Built on first use, not at import: each ``old`` must occur exactly once in the real source,
    and when it does not (the real method changed, or a mutant changed that line) only the tests
    that check this bug fail (or, under mutation testing, are skipped); the module still loads.
    """

    def __init__(self, name: str, method: str, *changes: tuple[str, str], doc: str) -> None:
        self.__name__ = self.name = name
        self.__doc__ = doc
        self.method = method
        self.changes = changes
        self._built: type[MultiConnector] | None = None

    def build(self) -> type[MultiConnector]:
        """The subclass; raises AssertionError (skips, under mutation testing) when a change's
        ``old`` is not in the real method exactly once."""
        if self._built is not None:
            return self._built
        real = getattr(MultiConnector, self.method)
        source = textwrap.dedent(inspect.getsource(real))
        for old, new in self.changes:
            if source.count(old) != 1:
                message = f"{self.name}: {old!r} is not in {self.method} exactly once"
                if MUTATING:
                    pytest.skip(message)
                raise AssertionError(message)
            source = source.replace(old, new)
        flags = __future__.annotations.compiler_flag
        code = compile(source, f"<{self.name}.{self.method}>", "exec", flags, True)
        namespace: dict[str, Any] = {}
        # Its module's names (the module is not changed), and State for the planted lines.
        exec(code, {**real.__globals__, "State": State}, namespace)
        self._built = type(
            self.name,
            (MultiConnector,),
            {self.method: namespace[self.method], "__doc__": self.__doc__},
        )
        return self._built

    def __call__(self, *args: Any, **kwargs: Any) -> MultiConnector:
        return self.build()(*args, **kwargs)


MergeMutatesInput = Planted(
    "MergeMutatesInput",
    "_gather",
    ("merged = params.copy()", "merged = params"),
    doc="""Adopts the first saver's params dict and merges the others into it, in place.

    vLLM's MultiConnector merged params this way: the first connector's dict changed under it.
    """,
)

FastPathDuplicateKeyUntested = Planted(
    "FastPathDuplicateKeyUntested",
    "_gather",
    ("plain = len(merged) == supplied and all(", "plain = all("),
    doc="""The inlined merge of plain dicts no longer tests for a key supplied twice: a clash
    is merged silently, the later saver's value winning.""",
)

ClashRaisedBeforeRecorded = Planted(
    "ClashRaisedBeforeRecorded",
    "_gather",
    (
        "except (KeyClashError, InvalidParamsError) as exc:\n"
        "        return savers, failures, None, exc",
        "except (KeyClashError, InvalidParamsError):\n        raise",
    ),
    doc="""Raises a params clash as soon as the merge finds it, before the answers are applied:
    the request stays pending and the savers that promised a save are not recorded.""",
)


SaveOnlyLookedUp = Planted(
    "SaveOnlyLookedUp",
    "_answers",
    (
        "if entry.get_num_new_matched_tokens is None:",
        "if getattr(entry.connector, 'get_num_new_matched_tokens', None) is None:",
    ),
    (
        "tokens = entry.get_num_new_matched_tokens(",
        "tokens = entry.connector.get_num_new_matched_tokens(",
    ),
    doc="""Asks each connector itself for matched tokens, not its registration: a save-only
    connector (``Role.save``) is asked, and chosen to load when it answers tokens.""",
)

LoadOnlyAwaited = Planted(
    "LoadOnlyAwaited",
    "_gather",
    (
        "answer = entry.request_finished(request_id, blocks)",
        "answer = entry.connector.request_finished(request_id, blocks)",
    ),
    doc="""Asks each connector itself at request_finished, not its registration: a load-only
    connector (``Role.load``) that promises a save is awaited for a report it never owes.""",
)


ToldUnclaimed = Planted(
    "ToldUnclaimed",
    "request_finished_by",
    (
        "claimed = self._claim(request_id)  # refused: while a request_finished asks, say",
        "record = self._requests.get(request_id)\n"
        "    if record is not None and record.state is State.pending:\n"
        "        claimed = (record, object(), hash(request_id) & self._mask)\n"
        "    else:\n"
        "        claimed = self._claim(request_id)",
    ),
    (  # and so, holding none, it updates the record without the claim's bookkeeping
        "outcome, early = self._finish_by(request_id, record, names, index, claim)",
        "if self._asking.get(id(record)) is claim:\n"
        "            outcome, early = self._finish_by(request_id, record, names, index, claim)\n"
        "        else:\n"
        "            with self._locks[index]:\n"
        "                awaited, expected = self._awaited(names, None)\n"
        "                outcome = self._finish(record, awaited, expected, None, index)\n"
        "            early = None",
    ),
    doc="""Takes no claim on a pending request ("it asks nobody: no claim needed"): told while a
    request_finished asks, it applies, and the savers that call's connectors promise are then
    refused as a duplicate, never awaited.""",
)

SplitPartDropped = Planted(
    "SplitPartDropped",
    "choose_loader",
    (
        "further = self._part_entries(name, parts) if parts else ()",
        "further = self._part_entries(name, parts)[1:] if parts else ()",
    ),
    doc="""Records a split load's parts without the first (as if ``parts`` began with the
    loader): that part's loader loads into the request's blocks, owed nothing, and the request
    is handed back while it still loads.""",
)


def _overwriting_merge(contributions: Any, *, allow_equal: bool = False) -> dict[str, Any] | None:
    """``merge_transfer_params`` that lets a later connector's value win a clash."""
    merged: dict[str, Any] | None = None
    for _, params in contributions:
        if params is not None:
            merged = {**(merged or {}), **params}
    return merged


def _inverted_merge(contributions: Any, *, allow_equal: bool = False) -> dict[str, Any] | None:
    """``merge_transfer_params`` with ``allow_equal`` inverted."""
    return merge_transfer_params(contributions, allow_equal=not allow_equal)


class BatchDecidesFromStaleRecords(MultiConnector):  # type: ignore[misc]
    """Decides whether a finishing request awaits each report of a batch from the records as
    they were when the batch began: a request reported twice in one batch has the duplicate
    applied again (counted, called back, returned as applied)."""

    def _reports(
        self, name: str, ids: Collection[str], blocks: Sequence[int] = ()
    ) -> list[Outcome]:
        stale = {
            i: r.awaiting
            for i in ids
            if (r := self._requests.get(i)) is not None and r.state is State.finishing
        }
        outcomes: list[Outcome] = []
        for request_id in ids:
            record = self._requests.get(request_id)
            if (
                record is not None
                and record.state is State.finishing
                and name not in record.awaiting
                and name in stale.get(request_id, ())
            ):
                applied = self._applied[0]  # the bug: applied as the stale record says
                applied[name] = applied.get(name, 0) + 1
                outcomes.append(Outcome.applied)
                continue
            outcomes.extend(super()._reports(name, (request_id,), blocks))
        return outcomes


class OutcomeRulesOutOfOrder(MultiConnector):  # type: ignore[misc]
    """Tests ``expected`` before ``abandoned`` when classifying an ignored report: a report from
    a saver unregistered while awaited is called a ``duplicate`` instead of ``unregistered``."""

    def _report(
        self,
        record: RequestTransferState | None,
        name: str,
        index: int,
        blocks: Sequence[int] = (),
    ) -> Outcome:
        if (
            record is not None
            and record.state not in (State.finished, State.cancelled)
            and name not in record.awaiting
            and name in record.expected
        ):
            self._count(index, Outcome.duplicate, name)  # the bug: before the abandoned test
            return Outcome.duplicate
        return super()._report(record, name, index, blocks)


class DrainCountedAsApplied(MultiConnector):  # type: ignore[misc]
    """Counts a drained report (one a cancelled request still awaited) as applied."""

    def _count(self, index: int, outcome: Outcome, name: str | None) -> None:
        if outcome is Outcome.drained:
            outcome = Outcome.applied  # the bug: the counters say it applied
        super()._count(index, outcome, name)


class EarlyReportDropped(MultiConnector):  # type: ignore[misc]
    """Decides a report that comes while request_finished still asks (the connector reports
    from inside its own request_finished, or from a thread it started there) at once, from the
    record as it is: a phantom, though the connector is promising that very save. Its answer,
    recorded next, makes the request await a report that was already delivered: stranded."""

    def _early_report(
        self, record: RequestTransferState, name: str, blocks: Sequence[int], index: int
    ) -> Outcome | None:
        return None  # the bug: never kept, so the usual rules call it a phantom


class EarlyLoadReportDropped(MultiConnector):  # type: ignore[misc]
    """Decides a load report that comes while match_tokens still asks (the connector starts
    its load inside get_num_new_matched_tokens, or on a thread it starts there, and reports
    it) at once, from the record as it is: a phantom, though the connector is starting that
    very load. The loader, recorded next, then owes a load report it already delivered."""

    def load_finished(self, request_id: str, name: str) -> Outcome:
        record = self._requests.get(request_id)
        if record is not None and id(record) in self._matching:
            entry = self.registry.entry(name)
            if entry is not None and entry.connector is not None:
                self._count(hash(request_id) & self._mask, Outcome.phantom, name)  # the bug
                return Outcome.phantom
        return super().load_finished(request_id, name)


class CallbackForIgnoredReport(MultiConnector):  # type: ignore[misc]
    """Calls the reporting connector's ``on_finished`` for every report, ignored ones too."""

    def transfer_finished(self, request_id: str, name: str, blocks: Sequence[int] = ()) -> Outcome:
        outcome = super().transfer_finished(request_id, name, blocks)
        entry = self.registry.entry(name)
        if outcome.ignored and entry is not None and entry.on_finished is not None:
            entry.on_finished(request_id, blocks)  # the bug: only an applied report is called back
        return outcome


@contextmanager
def patched_table(changes: Mapping[tuple[State, str], tuple[Compiled, ...]]) -> Iterator[None]:
    """Replace some (state, event) entries of the compiled table, and restore them after.

    The hot path's per-event decisions (``machine.DECISIONS``) are derived from the table, so
    they are patched to match (each patch must be one guard call's decision, as every pair of
    DECISIONS is); the declaration (``TRANSITIONS``) is left alone, which is what makes the
    patched runtime wrong.
    """
    table: Any = machine_module.TABLE
    decisions: Any = machine_module.DECISIONS
    saved_table = {key: table[key[0]].get(key[1]) for key in changes}
    saved_decisions = {key: decisions[key[1]].get(key[0]) for key in changes if key[1] in decisions}
    for (state, event), candidates in changes.items():
        assert decision_of(candidates) is not None, (state, event)
    try:
        for (state, event), candidates in changes.items():
            table[state][event] = candidates
            if event in decisions:
                decisions[event][state] = decision_of(candidates)
        yield
    finally:
        for (state, event), old in saved_table.items():
            if old is None:
                table[state].pop(event, None)
            else:
                table[state][event] = old
        for (state, event), old_decision in saved_decisions.items():
            if old_decision is None:
                decisions[event].pop(state, None)
            else:
                decisions[event][state] = old_decision


@attrs.frozen(kw_only=True)
class Broken:
    """One planted bug: how to build it, the property it breaks, its shortest trace's length."""

    name: str
    prop: str
    shortest: int
    why: str
    factory: Callable[..., MultiConnector] = MultiConnector
    #: The alphabet to check it with (``None``: the default one).
    events: tuple[str, ...] | None = None
    #: Connectors to check it with (``None``: the tests' bound).
    connectors: Mapping[str, str | None] | None = None
    table: Mapping[tuple[State, str], tuple[Compiled, ...]] = attrs.field(factory=dict)
    #: Names of ``multiconnector.aggregator.saving`` (request_finished's module) replaced while
    #: it is checked.
    patch: Mapping[str, Any] = attrs.field(factory=dict)
    #: Whether to check it with the savers answering params (``params=True``).
    params: bool = False
    #: Other properties it fails, each only as a consequence of the bug, with why.
    also: Mapping[str, str] = attrs.field(factory=dict)

    @contextmanager
    def installed(self) -> Iterator[Callable[..., MultiConnector]]:
        """The factory to check, with the table patch and the module patch (if any) in force.
        A :class:`Planted` bug is built here, in the test, so a planted line that is gone fails
        (or skips) the test that checks it, before the check runs."""
        if isinstance(self.factory, Planted):
            self.factory.build()
        saved = {name: getattr(saving_module, name) for name in self.patch}
        try:
            for name, value in self.patch.items():
                setattr(saving_module, name, value)
            with patched_table(self.table):
                yield self.factory
        finally:
            for name, value in saved.items():
                setattr(saving_module, name, value)

    def options(self) -> dict[str, Any]:
        """The check's keyword arguments besides the bound: alphabet, factory aside."""
        return {"events": self.events, "params": self.params}


#: The connectors the params bugs are checked with.
PARAMS_CONNECTORS: Mapping[str, str | None] = {"a": "saver", "b": "saver"}
#: The connectors the roles bugs are checked with: one connector of the role, alone (with a
#: saver beside the store, the load side's search grows from 48 distinct states to 9,791).
STORE_CONNECTORS: Mapping[str, str | None] = {"s": "store"}
LOADER_CONNECTORS: Mapping[str, str | None] = {"l": "loader"}
#: The connectors the split-load bug is checked with: one counted connector alone, whose load is
#: the split load of its two report names (60 distinct states; savers a and b: 14,172).
COUNTED_CONNECTORS: Mapping[str, str | None] = {"c": "counted"}

#: The catalog. ``shortest`` is the length of the shortest event sequence that exposes the bug
#: in the scenario the tests use (savers ``a`` and ``b``, a ``None`` slot, one request; plus a
#: connector answering garbage where ``connectors`` says so). ``request_finished`` is two events
#: there: it asks, then applies its answers.
CATALOG: tuple[Broken, ...] = (
    Broken(
        name="count-based draining",
        prop="no early free",
        shortest=4,
        why="begin, request_finished_by(r1, [a, b]), transfer_finished a twice: b is drained",
        factory=CountBasedDraining,
    ),
    Broken(
        name="late completion after cancel accepted",
        prop="terminal absorbing",
        shortest=4,
        why="begin, request_finished_by(r1, [a]), cancel, transfer_finished a",
        factory=LateCompletionAfterCancel,
    ),
    Broken(
        name="savers answering after a concurrent cancel dropped",
        prop="no early free",
        shortest=4,
        why="begin, request_finished asks (a saves), cancel, request_finished applies: "
        "queued for take while a saves",
        factory=OvertakenSaversDropped,
    ),
    Broken(
        name="draining cancelled request handed back",
        prop="no early free",
        shortest=3,
        why="begin, request_finished_by(r1, [a]), cancel: queued while a saves",
        factory=DrainingCancelHandedBack,
    ),
    Broken(
        name="bare True treated as no promise",
        prop="no early free",
        shortest=3,
        why="begin, request_finished asks (g answers True), applies: finished while g saves",
        factory=BareTrueNoPromise,
        connectors={"a": "saver", "g": "garbage"},
    ),
    Broken(
        name="None slot dereferenced",
        prop="no exception",
        shortest=2,
        why="begin, transfer_finished from the None slot",
        factory=NoneSlotDereferenced,
    ),
    Broken(
        name="finished request never dropped",
        prop="no leak",
        shortest=3,
        why="begin, cancel (nothing in flight), take: still held",
        factory=FinishedNeverDropped,
    ),
    Broken(
        name="terminal state left again",
        prop="terminal absorbing",
        shortest=3,
        why="begin, request_finished_by(r1, []) (finished), cancel: finished -> cancelled",
        table={(State.finished, "cancel"): ((None, True, State.cancelled),)},
    ),
    Broken(
        name="phantom report accepted",
        prop="no early free",
        shortest=3,
        why="begin, request_finished_by(r1, [a]), transfer_finished b (never promised)",
        factory=PhantomAccepted,
    ),
    Broken(
        name="last report does not finish",
        prop="no trap",
        shortest=3,
        why="begin, request_finished_by(r1, [a]), transfer_finished a: finishing, awaiting nothing",
        table={
            (State.finishing, "transfer_finished"): (
                (RequestTransferState.is_last, True, State.finishing),
                (RequestTransferState.is_last, False, State.finishing),
            )
        },
    ),
    Broken(
        name="duplicate load completion accepted",
        prop="load once",
        shortest=5,
        why="begin, match_tokens with a answering 1 (asks, records), load_finished a twice",
        factory=DuplicateLoadAccepted,
        events=ALPHABET + LOAD_EVENTS,
    ),
    Broken(
        name="load completion from an unchosen connector accepted",
        prop="load once",
        shortest=4,
        why="begin, match_tokens with a answering 1 (asks, records: a is chosen), load_finished b",
        factory=UnchosenLoaderAccepted,
        events=ALPHABET + LOAD_EVENTS,
        also={
            "no leak": "a completion from another connector while the match asks, applied, "
            "then the match records the one that delivered it: its load awaited for ever",
        },
    ),
    Broken(
        name="load completion from an unregistered loader accepted",
        prop="load once",
        shortest=5,
        why="begin, match_tokens with a answering 1 (asks, records: a is chosen), unregister a, "
        "load_finished a",
        factory=UnregisteredLoaderAccepted,
        events=ALPHABET + LOAD_EVENTS,
        also={
            "no early free": "its unregistering forgotten, a cancelled request whose loader went"
            " is settled again when the name is unregistered again: queued twice",
            "no exception": "take() raises on the record queued twice",
            "no leak": "sooner, 4 events: the loader's unregistering forgotten, its request "
            "awaits the load of a connector that is gone (stranded)",
        },
    ),
    # -- params (checked with params=True; two savers, no None slot, to stay small) ----------
    Broken(
        name="params clash merged by overwriting",
        prop="params merged",
        shortest=3,
        why="begin, request_finished asks (a and b answer the shared key), applies: no clash",
        patch={"merge_transfer_params": _overwriting_merge},
        connectors=PARAMS_CONNECTORS,
        params=True,
    ),
    Broken(
        name="params input mutated",
        prop="params merged",
        shortest=2,
        why="begin, request_finished asks with a and b answering params: a's changed",
        factory=MergeMutatesInput,
        connectors=PARAMS_CONNECTORS,
        params=True,
    ),
    Broken(
        name="params clash raised before the savers are recorded",
        prop="params merged",
        shortest=2,
        why="begin, request_finished asks, with a clash: raised, the request pending",
        factory=ClashRaisedBeforeRecorded,
        connectors=PARAMS_CONNECTORS,
        params=True,
        also={
            "no early free": "the savers' promises are lost with the answers: one event later "
            "(a second request_finished saving nothing) the request is finished while a saves"
        },
    ),
    Broken(
        name="params allow_equal inverted",
        prop="params merged",
        shortest=3,
        why="begin, request_finished asks (a and b answer the shared key equal), applies",
        patch={"merge_transfer_params": _inverted_merge},
        connectors=PARAMS_CONNECTORS,
        params=True,
    ),
    Broken(
        name="params duplicate key untested in the inlined merge",
        prop="params merged",
        shortest=3,
        why="begin, request_finished asks (a and b answer the shared key), applies: no clash",
        factory=FastPathDuplicateKeyUntested,
        connectors=PARAMS_CONNECTORS,
        params=True,
    ),
    # -- outcomes, counters, callbacks, batches -------------------------------------------
    Broken(
        name="ignored report's outcome misclassified",
        prop="right outcome",
        shortest=3,
        why="begin, request_finished_by(r1, [a, b], every name that cannot report), "
        "transfer_finished none: duplicate, not unregistered (none was abandoned)",
        factory=OutcomeRulesOutOfOrder,
        also={
            "counters": "an early report of a, kept while request_finished asks, then a "
            "unregistered: decided on the answers by the same misclassifying _report, it returned "
            "early and is counted duplicate (the rule says unregistered); as short, 5 events"
        },
    ),
    Broken(
        name="drained report counted as applied",
        prop="counters",
        shortest=4,
        why="begin, request_finished_by(r1, [a]), cancel, transfer_finished a",
        factory=DrainCountedAsApplied,
    ),
    Broken(
        name="on_finished called for an ignored report",
        prop="callbacks",
        shortest=1,
        why="transfer_finished(r1, a) for a request not begun: a is called back",
        factory=CallbackForIgnoredReport,
    ),
    Broken(
        name="batch applies a duplicate twice",
        prop="right outcome",
        shortest=3,
        why="begin, request_finished_by(r1, [a, b]), transfer_finished_many(a, [r1, r1]): "
        "applied twice",
        factory=BatchDecidesFromStaleRecords,
    ),
    Broken(
        name="early report dropped as a phantom",
        prop="right outcome",
        shortest=3,
        why="begin, request_finished asks (a saves), transfer_finished a before the answers are "
        "recorded: phantom, not early",
        factory=EarlyReportDropped,
        also={
            "no leak": "request_finished then applies its answers: finishing, awaiting a, "
            "which already reported (stranded)",
        },
    ),
    Broken(
        name="early load report dropped as a phantom",
        prop="right outcome",
        shortest=3,
        why="begin, match_tokens asks (a answers 1), load_finished a before the loader is "
        "recorded: phantom, not early",
        factory=EarlyLoadReportDropped,
        events=ALPHABET + LOAD_EVENTS,
        also={
            "no leak": "match_tokens then records a as the loader: pending, awaiting the load "
            "of a, which already reported it (stranded)",
        },
    ),
    # -- roles (checked with one connector of the role alone) --------------------------------
    Broken(
        name="save-only connector looked up",
        prop="roles kept",
        shortest=2,
        why="begin, match_tokens asks: the store s is asked for tokens",
        factory=SaveOnlyLookedUp,
        events=ALPHABET + LOAD_EVENTS,
        connectors=STORE_CONNECTORS,
    ),
    # -- the told path (request_finished_by; choose_loader with parts) ----------------------
    Broken(
        name="told path takes no claim",
        prop="no early free",
        shortest=3,
        why="begin, request_finished asks (a saves), request_finished_by(r1, []) applies: "
        "finished while a saves (its promise, applied next, is refused as a duplicate)",
        factory=ToldUnclaimed,
        also={
            "right outcome": "the told call returns applied, not duplicate (a call asks)",
            "no exception": "the asking call's answers meet a record that is no longer pending "
            "(the checker's reference of its early reports asserts it is)",
            "terminal absorbing": "a cancelled record the told call made await a saver is "
            "changed by the asking call's answers",
            "no leak": "a record the told call finished is changed by the asking call's answers",
        },
    ),
    Broken(
        name="split load's part dropped",
        prop="no early free",
        shortest=4,
        why="begin, choose_loader(r1, c@1, parts=[c@2]) (counted c's split load): c@2's part "
        "is not owed, cancel, c reports a load (c@1's): handed back while c@2 loads",
        factory=SplitPartDropped,
        events=ALPHABET + LOAD_EVENTS + SPLIT_EVENTS,
        connectors=COUNTED_CONNECTORS,
        also={
            "load once": "c's second load report is c@2's, a phantom: its load never completes",
            "right outcome": "the same report returns phantom, not applied",
        },
    ),
    Broken(
        name="load-only connector awaited",
        prop="roles kept",
        shortest=3,
        why="begin, request_finished asks (l promises a save), applies: l is awaited",
        factory=LoadOnlyAwaited,
        connectors=LOADER_CONNECTORS,
        also={
            "no leak": "the same state: l is awaited, and owes no report (its promise is none)",
        },
    ),
)

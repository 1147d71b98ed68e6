"""The children counted on fewer workers than all, both roles: :class:`Counted` (the
scheduler's books) and :class:`Forwarded` (a worker's share).

vLLM's output aggregator passes a request on as finished sending (or receiving) once every
worker reported it. A child whose ``get_finished_count()`` is ``k``, fewer than the workers,
reports on ``k`` of them only: its workers forward its reports to the scheduler in their worker
metadata (``sent``, ``loaded``), each worker reporting its own part done at once. Such a
child's transfer is awaited on the scheduler's core books under ``k`` names of its own,
``<name>@1`` to ``<name>@k``, one per report owed, and each forwarded report is applied to the
next of them a request still owes (:func:`~multiconnector.rule.counted_name`, which the model
checker's ``counted`` connectors explore too): the core decides every outcome (applied, duplicate,
terminal, ...), and :meth:`~multiconnector.MultiConnector.take` hands a request back only once
every one came. A save awaits them beside the workers' confirmation
(:meth:`~multiconnector.MultiConnector.request_finished_by`); a load is a split load of ``k``
parts (:meth:`~multiconnector.MultiConnector.choose_loader` with ``parts``), whose completion
is held back from vLLM until the last part came (:attr:`Counted.held`, as
:func:`~multiconnector.rule.one_completion` decides in the scheduler part).

On each worker, :class:`Forwarded` keeps which counted child saves or loads each request there,
and the reports to forward in the next worker metadata; the worker's own part of such a request
is done at once (it reports the request finished there), since vLLM awaits every worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from .._validate import check_request_ids
from ..aggregator import MultiConnector as Aggregator
from ..machine import State
from ..registry import Role
from ..rule import count, counted_name, load_report, refined, transfer_report
from .children import Children, Slot
from .errors import ChildrenConflictError

__all__ = ["COUNTED_EXPECTED_LIMIT", "WORKERS", "Counted", "Forwarded", "not_taken"]

#: The name, on the scheduler's core books, of every worker's confirmation that a request's
#: saves are done there (:meth:`Counted.awaited`).
WORKERS: Final = "@workers"
_WORKERS_ONLY: Final = (WORKERS,)
_FINISHING: Final = State.finishing

#: At most this many finished requests' counted savers remembered on a worker (the oldest
#: forgotten first): a worker a counted child never reports on would otherwise keep them all.
COUNTED_EXPECTED_LIMIT: Final = 65_536


def not_taken(name: str, children: set[str]) -> None:
    """A :class:`ChildrenConflictError` when a child bears ``name``, a name the scheduler's
    books give a report (:data:`WORKERS`, a counted child's ``<name>@<i>``)."""
    if name in children:
        raise ChildrenConflictError(
            f"child name {name!r} is a name the scheduler's books give a report: rename that "
            "child (multiconnector_name)"
        )


class Counted:
    """The report names of the children counted on fewer workers, on the scheduler's books."""

    __slots__ = ("_failed", "_held", "_kids", "_tracker", "outcomes", "owner", "ranks")

    def __init__(self, children: Children, tracker: Aggregator) -> None:
        self._kids = children
        self._tracker = tracker
        #: Per counted child, its report names, ``<name>@1`` to ``<name>@k``; each one's child.
        self.ranks: dict[str, tuple[str, ...]] = {}
        self.owner: dict[str, str] = {}
        #: Per (outcome, name), forwarded reports of names that are no counted child's.
        self.outcomes: dict[tuple[Any, str], int] = {}
        #: Load completions every worker reported, held back until the child's last report.
        self._held: set[str] = set()
        #: Counted loads a forwarded report said failed, with their child.
        self._failed: dict[str, str] = {}

    def _names(self) -> dict[str, tuple[str, ...]]:
        """The report names, registered on the books when first needed."""
        if not self.ranks:
            counted = self._kids.counted()
            taken = set(self._kids.names)
            for name, k in counted.items():
                self.ranks[name] = tuple(f"{name}@{i}" for i in range(1, k + 1))
                self.owner.update((rank, name) for rank in self.ranks[name])
            for rank in self.owner:
                not_taken(rank, taken)
                self._tracker.register(rank, Slot(rank), Role.both)
        return self.ranks

    def child_of(self, name: str) -> str:
        """The child a name on the books stands for (itself, or a report name's child)."""
        return self.owner.get(name, name)

    def awaited(self, savers: tuple[str, ...]) -> tuple[str, ...]:
        """The names the books await for a request ``savers`` save: every worker's
        confirmation (:data:`WORKERS`: a worker reports the request once every saver that
        reports on every worker reported there), and each counted saver's report names."""
        if not savers:
            return ()
        counted = self._kids.counted()
        if not counted or all(name not in counted for name in savers):
            return _WORKERS_ONLY
        ranks = self._names()
        names = [WORKERS]
        for name in savers:
            names += ranks.get(name, ())
        return tuple(names)

    def load_started(self, request_id: str, loader: str) -> None:
        """Counted child ``loader`` loads ``request_id`` asynchronously: the books await its
        report names as the parts of the load."""
        ranks = self._names()[loader]
        self._tracker.choose_loader(request_id, ranks[0], parts=ranks[1:])

    def load_failed(self, request_id: str, loader: str) -> None:
        """``loader``'s load of ``request_id`` is reported failed by the workers, as one: its
        own reports are no longer awaited."""
        self._tracker.choose_loader(request_id, loader)

    def owed(self) -> dict[str, dict[str, int]]:
        """Each request still owed reports by counted children, with how many each owes."""
        owed: dict[str, dict[str, int]] = {}
        tracker = self._tracker
        for request_id in tracker.request_ids():
            record = tracker.peek(request_id)
            for name in () if record is None else self._owing(record):
                child = self.owner.get(name)
                if child is not None:
                    mine = owed.setdefault(request_id, {})
                    mine[child] = mine.get(child, 0) + 1
        return owed

    @staticmethod
    def _owing(record: Any) -> tuple[str, ...]:
        """The names ``record`` still awaits a save or a load report of."""
        return (*record.awaiting, *record.owed_loads)

    def counting(self, record: Any) -> bool:
        """Whether ``record``'s load is a counted child's, with a report still owed."""
        return record is not None and record.loader in self.owner and record.loading

    def saves(self, sent: Mapping[str, Mapping[str, int]]) -> None:
        """``sent[name][r]`` workers reported ``name`` finished sending ``r``: each report is
        applied to the next report name ``r`` awaits of it (the last when none is: a duplicate,
        or why ignored)."""
        tracker = self._tracker
        ranks = self._names() if self._kids.counted() else {}
        for name, counts in sent.items():
            mine = ranks.get(name)
            for request_id, n in counts.items():
                for _ in range(n):
                    if mine is None:
                        self._stranger(name, request_id, save=True)
                        continue
                    record = tracker.peek(request_id)
                    tracker.transfer_finished(request_id, counted_name(mine, record, load=False))

    def loads(self, worker_meta: Any) -> None:
        """Apply the load reports the workers forwarded (``worker_meta.loaded``), each to the
        next report name of its child's load a request still owes; remember the loads a report
        said failed, for when their completion is passed on (:meth:`failed_of`)."""
        tracker = self._tracker
        ranks = self._names() if self._kids.counted() else {}
        for name, counts in worker_meta.loaded.items():
            failed_of = worker_meta.load_failed.get(name, {})
            mine = ranks.get(name)
            for request_id, n in counts.items():
                if mine is None:
                    for _ in range(n):
                        self._stranger(name, request_id, save=False)
                    continue
                if request_id in failed_of:
                    self._failed[request_id] = name
                for _ in range(n):
                    record = tracker.peek(request_id)
                    # Only its load's names: a report of a load is never a save's.
                    tracker.load_finished(request_id, counted_name(mine, record, load=True))

    @property
    def held(self) -> set[str]:
        """The load completions every worker reported, held back until the counted loader's
        last report came (:func:`~multiconnector.rule.one_completion`)."""
        return self._held

    def failed_of(self, passed: set[str]) -> dict[str, str]:
        """Of the load completions ``passed`` on, those a forwarded report said failed, with
        their child (forgotten here): they are not passed on now (vLLM reads
        ``failed_recving`` before ``update_connector_output`` runs, so a failure added there
        would go unseen and the blocks nothing wrote would be taken as loaded): the caller has
        every worker report them failed, as any load the scheduler knows failed, and vLLM sees
        the failure with their completion."""
        if not self._failed or self._failed.keys().isdisjoint(passed):
            return {}
        return {r: self._failed.pop(r) for r in passed if r in self._failed}

    def active(self) -> bool:
        """Whether a load completion is held back, or a failure kept for one."""
        return bool(self._held or self._failed)

    def _stranger(self, name: str, request_id: str, *, save: bool) -> None:
        """Count a forwarded report of ``name``, which is no counted child: as the report rule
        says of a name no request awaits (the workers' metadata may name anything)."""
        record = self._tracker.peek(request_id)
        state = None if record is None else record.state
        outcome = (
            transfer_report(state, (), (), (), name)[0]
            if save
            else load_report(state, None, name)[0]
        )
        count(self.outcomes, refined(outcome, name in self._kids.by_name, True), name)


class Forwarded:
    """A worker's share of the counted children: which of them save or load each request here,
    and their reports to forward to the scheduler (which counts them by name, :class:`Counted`)
    with the next worker metadata."""

    __slots__ = ("expected", "load_failed", "loaded", "loading", "outcomes", "sent")

    def __init__(self) -> None:
        #: Each finished request's counted savers that have not reported here yet.
        self.expected: dict[str, set[str]] = {}
        #: Each asynchronous load by a counted child not yet reported here, with it.
        self.loading: dict[str, str] = {}
        #: Counted savers' reports to forward with this step's worker metadata.
        self.sent: dict[str, dict[str, int]] = {}
        #: Counted loaders' reports to forward likewise, and the loads (or split loads' parts,
        #: of any child) reported failed here.
        self.loaded: dict[str, dict[str, int]] = {}
        self.load_failed: dict[str, dict[str, int]] = {}
        #: Per (outcome, name), the counted children's reports ignored here.
        self.outcomes: dict[tuple[Any, str], int] = {}

    def expect_saves(
        self, savers: Mapping[str, tuple[str, ...]], counted: Mapping[str, int]
    ) -> tuple[dict[str, tuple[str, ...]], list[str]]:
        """The counted savers of ``savers`` are awaited here (their reports forwarded).
        Returns each request's savers that report on every worker (the ledger's to await), and
        the requests with none: this worker's part of them is done at once."""
        every: dict[str, tuple[str, ...]] = {}
        done: list[str] = []
        expected = self.expected
        for request_id, names in savers.items():
            mine = tuple(name for name in names if name not in counted)
            if len(mine) < len(names):
                expected[request_id] = {n for n in names if n in counted}
                if len(expected) > COUNTED_EXPECTED_LIMIT:
                    # On a worker a counted child never reports on, its requests would stay
                    # here: the oldest is forgotten (a late report of it counts as unknown).
                    del expected[next(iter(expected))]
            if mine:
                every[request_id] = mine
            else:
                done.append(request_id)
        return every, done

    def expect_load(self, request_id: str, name: str) -> None:
        """Counted child ``name`` loads ``request_id``: its report is forwarded when it comes
        (the worker reports its own part finished at once)."""
        loading = self.loading
        loading[request_id] = name
        if len(loading) > COUNTED_EXPECTED_LIMIT:
            del loading[next(iter(loading))]  # as for counted saves: the oldest forgotten

    def saved(self, name: str, request_ids: Any) -> None:
        """Counted child ``name`` finished saving ``request_ids`` here: each forwarded once per
        request and worker, and only where it saves (else counted as ignored)."""
        expected = self.expected
        for request_id in check_request_ids(request_ids):
            owing = expected.get(request_id)
            if owing is None or name not in owing:
                # Why ignored, as the report rule says: unknown here, or not (or no longer)
                # awaited of ``name`` (the worker's books have no states: a held request is
                # a finishing one, awaiting what it owes).
                state = None if owing is None else _FINISHING
                outcome = transfer_report(state, tuple(owing or ()), (), (), name)[0]
                count(self.outcomes, outcome, name)
                continue
            owing.discard(name)
            if not owing:
                del expected[request_id]
            self.sent.setdefault(name, {})[request_id] = 1

    def load_reported(self, name: str, request_id: str, failed: bool) -> bool:
        """Whether ``request_id``'s load report by ``name`` is a counted loader's: then
        forwarded (with its failure), and nothing else of it is done here."""
        if self.loading.get(request_id) != name:
            return False
        del self.loading[request_id]
        self.loaded.setdefault(name, {})[request_id] = 1
        if failed:
            self.part_failed(name, request_id)
        return True

    def part_failed(self, name: str, request_id: str) -> None:
        """Child ``name``'s load (a counted loader's, or its part of a split load) of
        ``request_id`` failed here: the scheduler learns whose it was."""
        self.load_failed.setdefault(name, {})[request_id] = 1

    def pending(self) -> bool:
        """Whether a report is waiting to be forwarded."""
        return bool(self.sent or self.loaded or self.load_failed)

    def take(
        self,
    ) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]], dict[str, dict[str, int]]]:
        """The reports to forward (sent, loaded, load_failed), each emptied here."""
        taken = self.sent, self.loaded, self.load_failed
        if self.sent:
            self.sent = {}
        if self.loaded:
            self.loaded = {}
        if self.load_failed:
            self.load_failed = {}
        return taken

"""Loads and saves reported from every point of their windows, by many threads at once.

Each connector loads and saves every request, and reports each at a random point: from inside
``get_num_new_matched_tokens`` or ``request_finished`` (before the aggregator recorded its
answer), from a thread it starts there (racing the answer), or after the call returned. No
report may be lost, and every request must be handed back by ``take()`` exactly when nothing
is owed for it: not before its loader's and savers' reports were delivered, and not never.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence

import pytest

from multiconnector import ConnectorRegistry, MultiConnector, Outcome
from tests.broken_aggregators import EarlyLoadReportDropped
from tests.test_threads import frequent_switches

#: Where in the window a report comes.
WHEN = ("inside", "racing", "after")


class Racing:
    """Loads (when chosen) and saves every request, each reported at a random point."""

    def __init__(self, name: str, mc: Callable[[], MultiConnector], seed: int) -> None:
        self.name = name
        self.mc = mc
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        #: (request id, "load" or "save") delivered, marked before the report is sent.
        self.delivered: set[tuple[str, str]] = set()
        self.later: list[tuple[str, str]] = []
        self.threads: list[threading.Thread] = []
        self.outcomes: dict[str, set[Outcome]] = {"load": set(), "save": set()}

    def deliver(self, rid: str, what: str) -> None:
        with self.lock:
            self.delivered.add((rid, what))
        mc = self.mc()
        if what == "load":
            outcome = mc.load_finished(rid, self.name)
        else:
            outcome = mc.transfer_finished(rid, self.name)
        with self.lock:
            self.outcomes[what].add(outcome)

    def report(self, rid: str, what: str) -> None:
        with self.lock:
            when = self.rng.choice(WHEN)
        if when == "inside":
            self.deliver(rid, what)
        elif when == "racing":
            thread = threading.Thread(target=self.deliver, args=(rid, what))
            with self.lock:
                self.threads.append(thread)
            thread.start()
        else:
            with self.lock:
                self.later.append((rid, what))

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int:
        # Only the first connector asked is chosen: it alone loads (and reports its load).
        if self.name == "a":
            self.report(request_id, "load")
            return 8
        return 0

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, None]:
        self.report(request_id, "save")
        return True, None

    def flush(self) -> None:
        with self.lock:
            later, self.later = self.later, []
        for rid, what in later:
            self.deliver(rid, what)


def test_loads_and_saves_reported_anywhere_in_their_windows_are_never_lost(
    factory: Callable[..., MultiConnector] = MultiConnector,
) -> None:
    names = ("a", "b", "c")
    box: list[MultiConnector] = []
    connectors = {n: Racing(n, lambda: box[0], seed) for seed, n in enumerate(names)}
    mc = factory(ConnectorRegistry(connectors), stripes=4)
    box.append(mc)
    workers, per_worker = 8, 40
    taken: list[tuple[str, set[tuple[str, str]]]] = []
    taken_lock = threading.Lock()
    errors: list[BaseException] = []

    def owed(rid: str) -> set[tuple[str, str]]:
        due = {(n, "save") for n in names} | {("a", "load")}
        return {(n, w) for n, w in due if (rid, w) not in connectors[n].delivered}

    def take() -> None:
        for record in mc.take():
            with taken_lock:
                taken.append((record.request_id, owed(record.request_id)))

    def worker(w: int) -> None:
        try:
            for k in range(per_worker):
                rid = f"w{w}-r{k}"
                mc.begin(rid)
                assert mc.match_tokens(rid) == 8
                take()
                assert mc.request_finished(rid)[0] is Outcome.applied
                take()
                for connector in connectors.values():
                    connector.flush()
                take()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    with frequent_switches():
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for connector in connectors.values():
            for t in connector.threads:
                t.join()
            connector.flush()
        take()
    assert errors == []
    total = workers * per_worker
    # Nothing freed early: every record was handed back after its load and saves were delivered.
    assert [(rid, due) for rid, due in taken if due] == []
    # Nothing stranded: every request was handed back, exactly once.
    assert len(taken) == total, f"{total - len(taken)} requests stranded, never taken"
    assert sorted(rid for rid, _ in taken) == sorted(
        f"w{w}-r{k}" for w in range(workers) for k in range(per_worker)
    )
    assert len(mc) == 0 and mc._early == {} and mc._asking == {}
    assert mc._early_loads == {} and mc._matching == {} and mc._parked == set()
    # Every report counted once, as applied: none lost, none counted twice. a also loads; a
    # load reported after the request finished (its saves all in) is its drain.
    counts = mc.connector_counts()
    assert set(counts["a"]) <= {Outcome.applied, Outcome.drained}
    assert sum(counts["a"].values()) == 2 * total
    assert connectors["a"].outcomes["load"] <= {Outcome.early, Outcome.applied, Outcome.drained}
    assert {n: dict(counts[n]) for n in ("b", "c")} == {
        n: {Outcome.applied: total} for n in ("b", "c")
    }
    # The windows were hit: some reports came early, the others after the answers.
    assert {Outcome.early, Outcome.applied} <= connectors["a"].outcomes["load"]
    assert {o for c in connectors.values() for o in c.outcomes["save"]} == {
        Outcome.early,
        Outcome.applied,
    }


def test_the_stress_fails_an_aggregator_that_drops_early_load_reports() -> None:
    with pytest.raises(AssertionError, match=r"stranded|taken|applied"):
        test_loads_and_saves_reported_anywhere_in_their_windows_are_never_lost(
            EarlyLoadReportDropped
        )

"""Completions from many threads at once give the result of a sequential run."""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from multiconnector import ConnectorRegistry, MultiConnector, Outcome, RequestTransferState
from tests.connectors import Scripted
from tests.stripes import DEFAULT_STRIPES, STRIPE_COUNTS, spread

# Ten requests on every stripe of the default count (so on every stripe of 1 and 2 as well),
# whatever the string hash seed: no stripe goes unexercised by luck.
REQUESTS = spread(DEFAULT_STRIPES, per_stripe=10)
NAMES = ("cache", "pd@0", "pd@1")


@contextmanager
def frequent_switches() -> Iterator[None]:
    """Make the interpreter switch threads as often as it can, to provoke races."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


def prepared(stripes: int = DEFAULT_STRIPES) -> tuple[MultiConnector, dict[str, Scripted]]:
    connectors = {name: Scripted() for name in NAMES}
    mc = MultiConnector(ConnectorRegistry({**connectors, "dead": None}), stripes=stripes)
    for rid in REQUESTS:
        mc.begin(rid)
        mc.request_finished(rid, [1])
    return mc, connectors


def completions() -> list[tuple[str, str]]:
    """Every report once, plus phantom, unknown and None-slot reports."""
    events = [(rid, name) for rid in REQUESTS for name in NAMES]
    events += [(rid, "dead") for rid in REQUESTS[::7]]
    events += [(rid, "ghost") for rid in REQUESTS[::11]]
    events += [("nobody", "cache")] * 5
    return events


def in_threads(n: int, work: Callable[[int], None]) -> None:
    barrier = threading.Barrier(n)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            barrier.wait()
            work(i)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def summary(records: list[RequestTransferState]) -> dict[str, tuple[object, ...]]:
    return {r.request_id: (r.state, r.awaiting, r.expected, r.abandoned, r.params) for r in records}


@pytest.mark.parametrize("attempt", range(2))  # races are probabilistic: several attempts
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("stripes", STRIPE_COUNTS)
def test_eight_threads_delivering_the_same_completions_match_a_sequential_run(
    attempt: int, batched: bool, stripes: int
) -> None:
    sequential, _ = prepared()
    for rid, name in completions():
        sequential.transfer_finished(rid, name)
    expected = summary(sequential.take())

    concurrent, connectors = prepared(stripes)
    outcomes: list[Counter[Outcome]] = [Counter() for _ in range(8)]

    def deliver(i: int) -> None:
        if batched:  # per-name batches of mixed sizes (see batches)
            for name, ids in batches(i):
                outcomes[i].update(concurrent.transfer_finished_many(name, ids))
        else:
            outcomes[i].update(concurrent.transfer_finished(r, n) for r, n in completions())

    with frequent_switches():
        in_threads(8, deliver)
    total = sum(outcomes, Counter())
    assert summary(concurrent.take()) == expected
    assert len(concurrent) == 0
    # Each real report applied exactly once; every other delivery ignored, none lost.
    assert total[Outcome.applied] == len(REQUESTS) * len(NAMES)
    assert total[Outcome.unknown_request] == 8 * 5
    assert sum(total.values()) == 8 * len(completions())
    assert set(total) <= {
        Outcome.applied,
        Outcome.duplicate,
        Outcome.terminal,
        Outcome.not_ready,
        Outcome.unknown_connector,
        Outcome.unknown_request,
    }
    for name in NAMES:
        calls = Counter(rid for rid, _ in connectors[name].on_finished_calls)
        assert calls == Counter(REQUESTS), name  # on_finished once per request and name
        assert concurrent.connector_counts()[name][Outcome.applied] == len(REQUESTS)


@pytest.mark.parametrize("stripes", STRIPE_COUNTS)
def test_concurrent_take_hands_every_request_back_exactly_once(stripes: int) -> None:
    mc, _ = prepared(stripes)
    taken: list[RequestTransferState] = []
    stop = threading.Event()

    def taker() -> None:
        while not stop.is_set():
            taken.extend(mc.take())
        taken.extend(mc.take())

    thread = threading.Thread(target=taker)
    with frequent_switches():
        thread.start()
        in_threads(4, lambda i: [mc.transfer_finished(r, n) for r, n in completions()[i::4]])
        for rid in REQUESTS[::5]:
            mc.cancel(rid)  # already terminal: ignored
        stop.set()
        thread.join()
    assert Counter(r.request_id for r in taken) == Counter(REQUESTS)
    assert len(mc) == 0


@pytest.mark.parametrize("stripes", STRIPE_COUNTS)
def test_cancel_racing_reports_leaves_each_request_terminal_once(stripes: int) -> None:
    mc, _ = prepared(stripes)
    with frequent_switches():
        in_threads(
            4,
            lambda i: [
                mc.cancel(rid) if i == 3 else mc.transfer_finished(rid, NAMES[i])
                for rid in REQUESTS
            ],
        )
    taken = mc.take()
    assert Counter(r.request_id for r in taken) == Counter(REQUESTS)
    for record in taken:
        if record.state == "finished":
            assert record.awaiting == () and set(record.reported) == set(NAMES)
        else:
            assert record.state == "cancelled"
            assert set(record.awaiting) | set(record.reported) == set(NAMES)


@pytest.mark.parametrize("stripes", STRIPE_COUNTS)
def test_results_do_not_depend_on_the_number_of_locks(stripes: int) -> None:
    mc = MultiConnector(ConnectorRegistry({n: Scripted() for n in NAMES}), stripes=stripes)
    for rid in REQUESTS[:DEFAULT_STRIPES]:
        mc.begin(rid)
        mc.request_finished(rid)
    with frequent_switches():
        in_threads(
            3, lambda i: [mc.transfer_finished(r, NAMES[i]) for r in REQUESTS[:DEFAULT_STRIPES]]
        )
    assert sorted(r.request_id for r in mc.take()) == sorted(REQUESTS[:DEFAULT_STRIPES])


def batches(i: int) -> list[tuple[str, list[str]]]:
    """Thread ``i``'s share of completions() as per-name batches of mixed sizes: batches of at
    least half the stripes take every stripe lock at once, smaller ones a lock per report."""
    by_name: dict[str, list[str]] = {}
    for rid, name in completions():
        by_name.setdefault(name, []).append(rid)
    sizes = (1, 5, 40, 200)
    out: list[tuple[str, list[str]]] = []
    for name, ids in by_name.items():
        start, k = 0, i
        while start < len(ids):
            size = sizes[k % len(sizes)]
            out.append((name, ids[start : start + size]))
            start, k = start + size, k + 1
    return out


@pytest.mark.parametrize("stripes", STRIPE_COUNTS)
def test_large_batches_and_unregistering_never_deadlock(stripes: int) -> None:
    # Both take every stripe lock (in the same order); a report may also read the registry
    # while another thread holds the registry lock to unregister.
    mc, _ = prepared(stripes)

    def work(i: int) -> None:
        if i == 0:
            for _ in range(30):
                mc.unregister("pd@1")
                mc.register("pd@1", Scripted())
            return
        for name, ids in batches(i):
            mc.transfer_finished_many(name, ids)

    done = threading.Event()

    def run() -> None:
        in_threads(4, work)
        done.set()

    with frequent_switches():
        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        runner.join(timeout=60)
    assert done.is_set(), "deadlocked"
    taken = mc.take()
    # Every request was reported by cache and pd@0; pd@1 reported or was abandoned.
    assert sorted(r.request_id for r in taken) == sorted(REQUESTS)
    assert all(r.state == "finished" for r in taken)
    assert len(mc) == 0

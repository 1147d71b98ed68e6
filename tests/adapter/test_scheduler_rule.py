"""The adapter's scheduler side against the transfer report rule, on every sequence of a bounded
alphabet.

The scheduler side tells its core books (the aggregator's records) who saves each finished
request, under the names its reports take there: a saver that reports on every worker by its
name, a child counted on fewer workers under one name per report owed, and the workers' own
confirmation (docs/vllm.md, "One completion per request"); vLLM frees what ``take()`` hands
back. This test checks that translation, with the workers' ledgers and vLLM's
``KVOutputAggregator`` beneath it, against :func:`multiconnector.rule.transfer_report`, on
every sequence of up to :data:`DEPTH` events of an alphabet of what the scheduler side meets:

- ``finish r {savers}``: vLLM's ``request_finished`` for request ``r`` (``r1`` or ``r2``), each
  saving child answering ``True`` when it is in ``savers`` (every subset) and ``False`` else.
  vLLM's abort reaches the connector as this very call (``Scheduler.finish_requests`` frees the
  request, which calls ``request_finished``), so an abort is a finish of a request that arrived
  or not; a finish of a request vLLM still holds (a duplicate) is in the alphabet too;
- ``arrive r``: the request arrives and is matched (``get_num_new_matched_tokens``), only while
  vLLM does not hold ``r`` (vLLM's request ids are unique among the requests it holds);
- ``step``: one engine step: the scheduler side builds the step's metadata (pickled, as vLLM ships
  it), each worker-role connector binds it and asks its children's transfer results, in which
  the listed children report the listed requests finished sending on the listed workers (a
  saver's report, a duplicate, a phantom from the child that does not save, a report before
  the request finished); the workers' outputs go through vLLM's real ``KVOutputAggregator``
  (two workers) or straight to the scheduler side (one), whose ``update_connector_output``
  makes the ``finished_sending`` vLLM frees blocks from. A step may also carry, in the workers'
  metadata, a report from a name that is no child (``X``): the metadata the adapter defines.

The reference (``rule_worlds.Reference``) is a small loop over the same events that changes nothing
but through :func:`~multiconnector.rule.transfer_report`'s verdicts, at the two levels the
adapter has: each worker's books (its ledger of the savers that report on every worker, and its
books of a child counted on fewer workers), and the scheduler's, where a request awaits each
worker's release and each counted child's report. For every event the test asserts:

- vLLM frees a request (``request_finished`` answers ``False``, or the request is in the
  ``finished_sending`` the scheduler side passes on) exactly in the event in which the rule says
  nothing is owed any more: never earlier, never later, never twice (a request vLLM no longer
  holds must not be in it);
- every report's outcome, as the connectors count them (``connector_counts()`` of the scheduler
  side and of each worker), is the rule's;
- what is held agrees: ``saving`` is what vLLM holds, each worker's ledger awaits what the rule
  says, the scheduler's counted books owe what it says.

Two configurations: ``one_worker`` (two requests; children ``S1`` and ``S2`` that save when
asked, ``N`` that never saves) and ``two_workers`` (one request; ``S1``, ``S2``, ``N`` and
``H``, which saves and reports on one worker of two: ``get_finished_count() == 1``, as
``ExampleHiddenStatesConnector``).

The real adapter classes run: the vLLM-facing ``MultiConnector`` built by vLLM's connector
factory from a real ``VllmConfig``, for the scheduler role and for each worker, over scripted
children (``vllm_children``), with real ``Request`` objects and vLLM's ``KVOutputAggregator``.
vLLM's ``Scheduler`` does not run in the enumeration: it calls the scheduler side exactly as
above (``request_finished`` from ``_free_request``, ``build_connector_meta`` from ``schedule``,
``update_connector_output`` before it frees the blocks of ``finished_sending``), and it would
about double the enumeration's cost (building a Scheduler with a worker connector took 0.9 ms
of CPU against 0.4 ms for the connectors alone, an empty step 0.08 ms against 0.03 ms: the means
of 50 builds and 200 steps, ``time.process_time``), past this test's budget of about 30 s of
CPU. It also makes only some of these calls: it never finishes a request it holds again, and an
arrival would schedule the request.
:func:`test_every_short_sequence_agrees_under_the_scheduler` runs the one-worker alphabet but
arrivals under the real Scheduler, every sequence of up to three events, against the same
reference; ``test_vllm_completions.py`` and the fuzz cover the Scheduler further.

Every sequence is covered without running each: two sequences that reach the same joint state
(the adapter's connectors' whole state but their counters, vLLM's aggregator's, and the
reference's) behave alike from there on, and counters are only ever added to. So each joint
state is expanded once, at the least depth that reaches it, by replaying the sequence that first
reached it on a fresh world (or on a world already in that state: see ``rule_worlds.explore``);
every event's effect is compared there. ``rule_worlds.sequences`` counts the sequences so covered
from the transitions seen. The pieces (the alphabet, the worlds, the reference, the enumeration)
are in ``rule_worlds.py``.
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from rule_worlds import (  # noqa: E402
    Arrive,
    Mismatch,
    SchedulerWorld,
    Setup,
    World,
    explore,
    one_worker,
    prepare,
    two_workers,
)
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402

import multiconnector.rule as rule_module  # noqa: E402
from multiconnector import Outcome  # noqa: E402
from multiconnector.rule import OTHER_NAMES  # noqa: E402
from multiconnector.vllm import NamedMultiConnectorWorkerMetadata  # noqa: E402
from multiconnector.vllm.counted import Counted  # noqa: E402
from multiconnector.vllm.reported import Reported  # noqa: E402

# vLLM logs every connector it builds: thousands here.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300), pytest.mark.usefixtures("quiet")]


#: The length bound of the sequences.
DEPTH = 5


@pytest.mark.parametrize("make", [one_worker, two_workers], ids=["one worker", "two workers"])
def test_every_sequence_agrees_with_the_rule(model: Path, make: Callable[[], Setup]) -> None:
    setup = prepare(make(), model)
    started, cpu = time.perf_counter(), time.process_time()
    found = explore(setup, DEPTH)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(
        f"{setup.name}: {len(setup.alphabet)} events, depth {DEPTH}: {found.sequences} "
        f"sequences, {found.states} joint states, {found.expansions} events checked, "
        f"{found.worlds} fresh worlds, {elapsed:.1f} s ({cpu:.1f} s of CPU)"
    )
    # The search went everywhere it should: every kind of report outcome each side can meet
    # was met, and frees of both kinds happened.
    met = {(where, name, outcome.value) for where, name, outcome in found.met}
    assert met == setup.outcomes, sorted(met ^ setup.outcomes)
    assert found.frees["finish"] and found.frees["step"], found.frees
    # Every sequence of enabled events was covered, not a few.
    assert found.sequences > len(setup.alphabet) ** (DEPTH - 1)


#: The length bound of the sequences run under vLLM's Scheduler.
SCHEDULER_DEPTH = 3


def test_every_short_sequence_agrees_under_the_scheduler(model: Path) -> None:
    """The one-worker alphabet but arrivals, under vLLM's real ``Scheduler``: vLLM makes the
    calls the enumeration above makes itself, and frees what the rule says, when it says."""
    setup = prepare(one_worker(), model)
    setup.alphabet = tuple(e for e in setup.alphabet if not isinstance(e, Arrive))
    started, cpu = time.perf_counter(), time.process_time()
    found = explore(setup, SCHEDULER_DEPTH, world=SchedulerWorld)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    print(
        f"under the Scheduler: {len(setup.alphabet)} events, depth {SCHEDULER_DEPTH}: "
        f"{found.sequences} sequences, {found.states} joint states, {found.expansions} events "
        f"checked, {found.worlds} fresh worlds, {elapsed:.1f} s ({cpu:.1f} s of CPU)"
    )
    assert found.frees["finish"] and found.frees["step"], found.frees
    assert found.sequences == sum(len(setup.alphabet) ** n for n in range(1, SCHEDULER_DEPTH + 1))


def test_forwarded_reports_from_made_up_names_are_counted_in_bounded_memory(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every forwarded report is counted now, whoever sent it: names past the counter limit
    share one key per outcome, as the core's counters do."""
    monkeypatch.setattr(rule_module, "COUNTER_LIMIT", 3)  # the one capped counter's limit
    scheduler = World(prepare(one_worker(), model)).scheduler
    sent = {f"made-up {i}": {"r1": 2} for i in range(10)}
    scheduler.update_connector_output(
        KVConnectorOutput(kv_connector_worker_meta=NamedMultiConnectorWorkerMetadata({}, sent=sent))
    )
    counts = scheduler.connector_counts()
    assert len(counts) == 4
    assert counts[OTHER_NAMES] == {Outcome.unknown_request: 2 * 7}
    assert sum(n for per in counts.values() for n in per.values()) == 2 * 10


# -- planted bugs in the counted path: the enumeration must find each ------------------------------


def _one_report_enough(monkeypatch: pytest.MonkeyPatch) -> None:
    """The books await no report of a counted child: the workers' confirmation frees it."""
    awaited = Counted.awaited

    def planted(counted: Counted, savers: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(name for name in awaited(counted, savers) if name not in counted.owner)

    monkeypatch.setattr(Counted, "awaited", planted)


def _workers_confirm_every_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers' confirmation is applied to every name the books await, a counted child's
    reports included."""

    def planted(reported: Reported, finished: Any) -> list[str]:
        tracker = reported._tracker
        for request_id in finished:
            record = tracker.peek(request_id)
            for name in () if record is None else record.awaiting:
                tracker.transfer_finished(request_id, name)
        return [r for r in finished if r not in tracker]

    monkeypatch.setattr(Reported, "_saves_confirmed", planted)


@pytest.mark.parametrize(
    "plant", [_one_report_enough, _workers_confirm_every_name], ids=lambda f: f.__name__[1:]
)
def test_a_planted_bug_in_the_counted_path_is_found(
    model: Path, monkeypatch: pytest.MonkeyPatch, plant: Callable[[pytest.MonkeyPatch], None]
) -> None:
    """The translation of a counted child's reports onto the core books is checked, not
    trusted: a wrong one frees a request before every report it owes came."""
    plant(monkeypatch)
    with pytest.raises(Mismatch, match=r"vLLM frees|counted owed"):
        explore(prepare(two_workers(), model), DEPTH)

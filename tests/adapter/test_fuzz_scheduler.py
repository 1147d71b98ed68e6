"""The adapter fuzzed inside vLLM's real v1 Scheduler (see fuzz_machine.py), and vLLM's class.

``make test`` runs a few hundred examples (profiles ``dev`` and ``ci``), a quarter of them with
split loads (``SplitMachine``); ``make test-deep`` (profile ``deep``) many thousands. Each run
asserts that every rule fired (with split loads: that loads were split in two and three parts,
synchronously and not, and that parts reported apart, failed, raised and were aborted). vLLM's own
``MultiConnector`` fails the same machine: a strict expected failure, so the day vLLM fixes it
the run says so. The orderings of vLLM's tracker are pinned below for both classes, and four
planted bugs show that the fuzz finds what it is for (two more, in split loads, the split run).
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import os  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from fuzz_machine import (  # noqa: E402
    RULE_EVENTS,
    SPLIT_EVENTS,
    AdapterMachine,
    Fuzzed,
    SplitMachine,
    World,
    make_request,
)
from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_harness import BLOCK  # noqa: E402

from multiconnector import Outcome  # noqa: E402
from multiconnector.ledger import SaveLedger  # noqa: E402
from multiconnector.vllm import MultiConnector  # noqa: E402
from multiconnector.vllm.worker import WorkerPart  # noqa: E402

# vLLM logs every connector it builds, and our adapter every ignored report: thousands.
pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800), pytest.mark.usefixtures("quiet")]

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
#: Examples of the fuzz: a few hundred in ``make test``, many thousands in ``make test-deep``.
EXAMPLES = {"deep": 6000, "mutate": 50}.get(PROFILE, 300)
#: Of which a quarter with split loads (:class:`SplitMachine`).
SPLIT_EXAMPLES = EXAMPLES // 4
STEPS = 40


def fuzz_settings(examples: int, **kwargs: Any) -> settings:
    kwargs.setdefault("derandomize", PROFILE != "deep")
    return settings(
        max_examples=examples,
        stateful_step_count=STEPS,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        **kwargs,
    )


class OursMachine(AdapterMachine):
    OURS = True


class TheirsMachine(AdapterMachine):
    OURS = False


class CountedSaverMachine(AdapterMachine):
    """Child c reports on one worker of two (``get_finished_count() == 1``), as
    ``ExampleHiddenStatesConnector`` does; it saves, and loads when chosen (see
    test_a_counted_child_chosen_to_load_is_not_stranded)."""

    COUNTS = (None, None, 1)


class CountedSplitMachine(SplitMachine):
    """Split loads beside a child that reports on one worker of two: it never loads a part, nor
    is a load it was chosen for split (see test_a_counted_loaders_load_is_not_split)."""

    COUNTS = (None, None, 1)


def coverage_line(fired: dict[str, int], labels: tuple[str, ...] = RULE_EVENTS) -> str:
    return "rules fired: " + ", ".join(f"{label}={fired.get(label, 0)}" for label in labels)


def fuzzed(machine: Any, examples: int) -> dict[str, int]:
    """Run ``machine`` for ``examples`` examples: how often each rule fired."""
    machine.fired.clear()
    run_state_machine_as_test(machine, settings=fuzz_settings(examples))
    return dict(machine.fired)


def test_the_adapter_survives_the_fuzz(capsys: pytest.CaptureFixture[str]) -> None:
    fired = fuzzed(OursMachine, EXAMPLES - SPLIT_EXAMPLES)
    with capsys.disabled():
        print(f"\n{EXAMPLES - SPLIT_EXAMPLES} examples; {coverage_line(fired)}")
    missing = [label for label in RULE_EVENTS if not fired.get(label)]
    assert not missing, f"rules that never fired: {missing}"


def test_the_adapter_survives_the_fuzz_with_a_child_reporting_on_one_worker() -> None:
    assert fuzzed(CountedSaverMachine, EXAMPLES // 3)["report-save"]


def test_the_adapter_survives_the_fuzz_with_split_loads(capsys: pytest.CaptureFixture[str]) -> None:
    fired = fuzzed(SplitMachine, SPLIT_EXAMPLES)
    with capsys.disabled():
        line = coverage_line(fired, (*RULE_EVENTS, *SPLIT_EVENTS))
        print(f"\n{SPLIT_EXAMPLES} examples with split loads; {line}")
    # The rules of the machine without splits are asserted by the run above.
    missing = [label for label in SPLIT_EVENTS if not fired.get(label)]
    assert not missing, f"split loads never did: {missing}"


def test_the_adapter_survives_split_loads_with_a_child_reporting_on_one_worker() -> None:
    assert fuzzed(CountedSplitMachine, SPLIT_EXAMPLES // 3)["split-async"]


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="vLLM's MultiConnector breaks")
def test_vllm_multiconnector_fails_the_fuzz() -> None:
    # It fails at once; not shrunk (the pinned orderings below are the short examples).
    run_state_machine_as_test(
        TheirsMachine,
        settings=fuzz_settings(
            min(EXAMPLES, 100), phases=[Phase.generate], report_multiple_bugs=False
        ),
    )


# -- the orderings of vLLM's tracker, pinned, for both classes ----------------------------------


def checked(world: World) -> None:
    """Every invariant of the machine that holds between rules."""
    if world.early_frees:
        raise Fuzzed("; ".join(world.early_frees))
    if world.problems:
        raise Fuzzed("; ".join(world.problems))
    if world.load_problems:
        raise Fuzzed("; ".join(world.load_problems))
    world.check_counts()
    world.check_events()


def add(
    world: World, request_id: str, *, tokens: int = 40, max_tokens: int = 1, **who: Any
) -> None:
    """A request; ``hit=name`` (or several names) loads one block from it asynchronously,
    ``saves=names`` commit to a save at finish."""
    hits = who.get("hit", ())
    for name in (hits,) if isinstance(hits, str) else hits:
        world.boards[name].hits[request_id] = 16
    for name in who.get("saves", ()):
        world.boards[name].saves.add(request_id)
    world.scheduler.add_request(make_request(request_id, 0, tokens, max_tokens))


def report(world: World, name: str, request_id: str, kind: str, ranks: Any = None) -> None:
    child = world.boards[name]
    for rank in range(len(world.workers)) if ranks is None else ranks:
        w = child.workers[rank]
        (w.sending if kind == "save" else w.recving).add(request_id)


def step(world: World, n: int = 1) -> None:
    for _ in range(n):
        world.step()
        checked(world)


def pin_52954(world: World) -> None:
    """vLLM #52954 (and #46240's same-step form): an abort while an asynchronous load is in
    flight, then a ``finished_sending`` that was never registered, then the load's
    ``finished_recving``, then the real saver's report."""
    add(world, "r", hit="a", saves=("b",))
    step(world)
    assert world.scheduler.requests["r"].status is RequestStatus.WAITING_FOR_REMOTE_KVS
    world.scheduler.finish_requests("r", RequestStatus.FINISHED_ABORTED)
    report(world, "c", "r", "save")  # c never committed to a save of r
    step(world)
    report(world, "a", "r", "load")
    step(world)
    report(world, "b", "r", "save")
    step(world)
    world.drain()


def pin_51786(world: World) -> None:
    """vLLM #51786: the same load reported twice, the second time once the request runs."""
    add(world, "r", hit="a", max_tokens=4)
    step(world)
    report(world, "a", "r", "load")
    step(world, 2)
    assert world.scheduler.requests["r"].status is RequestStatus.RUNNING
    report(world, "a", "r", "load")
    step(world)
    world.drain()


def pin_53049(world: World) -> None:
    """vLLM #53049: a child that was not chosen to load reports a load, late, once the request
    is gone."""
    add(world, "r", hit=("a", "b"), max_tokens=2)
    step(world)
    report(world, "a", "r", "load")
    step(world, 4)
    assert "r" not in world.scheduler.requests
    report(world, "b", "r", "load")
    step(world)
    world.drain()


def pin_3332(world: World) -> None:
    """vllm-ascend #3332: a saver that reports on one worker (``get_finished_count() == 1``)
    beside one that reports on every worker: not released before each child's reporting
    workers reported, and not stranded after."""
    add(world, "r", saves=("a", "c"))
    step(world)
    report(world, "c", "r", "save", ranks=[0])
    report(world, "a", "r", "save", ranks=[0])
    step(world)
    assert "r" in world.scheduler.requests  # worker 1's a still saving
    report(world, "a", "r", "save", ranks=[1])
    step(world)
    assert "r" not in world.scheduler.requests
    world.drain()


PINNED: dict[str, tuple[Callable[[World], None], dict[str, Any]]] = {
    "52954": (pin_52954, {}),
    "51786": (pin_51786, {}),
    "53049": (pin_53049, {}),
    "3332": (pin_3332, {"counts": (None, None, 1)}),
}
#: Where vLLM's class breaks (strict: the day it does not, the run says so).
THEIRS_BREAK = {"52954", "51786", "53049", "3332"}


@pytest.mark.parametrize("issue", sorted(PINNED))
def test_pinned_ordering_ours(issue: str) -> None:
    pin, options = PINNED[issue]
    world = World(ours=True, **options)
    pin(world)
    if issue == "53049":
        counts = {}
        for w in world.workers:
            for outcome, n in w.connector_counts().get("b", {}).items():
                counts[outcome] = counts.get(outcome, 0) + n
        assert counts and Outcome.applied not in counts  # counted, never passed on


@pytest.mark.parametrize(
    "issue",
    [
        pytest.param(
            issue,
            marks=pytest.mark.xfail(
                strict=True, raises=AssertionError, reason=f"vLLM's MultiConnector: {issue}"
            ),
        )
        if issue in THEIRS_BREAK
        else issue
        for issue in sorted(PINNED)
    ],
)
def test_pinned_ordering_vllm(issue: str) -> None:
    pin, options = PINNED[issue]
    pin(World(ours=False, **options))


# -- what the fuzz found in the adapter, pinned ----------------------------------------------------


def test_a_counted_child_chosen_to_load_is_not_stranded() -> None:
    world = World(ours=True, counts=(None, None, 1))
    add(world, "r", hit="c", tokens=17)
    step(world, 2)
    assert world.owed() == [("c", 0, "r", "load")]  # its one reporting worker
    world.drain()


def test_a_counted_childs_load_is_one_completion_with_saves_in_flight() -> None:
    # Aborted while c (one reporting worker) loads; a (every worker) saves. a's saves report
    # first: vLLM is told nothing until c's load reported too, then once (nothing is freed
    # under the load: checked() after every step).
    world = World(ours=True, counts=(None, None, 1))
    add(world, "r", hit="c", saves=("a",), tokens=17)
    step(world)
    world.scheduler.finish_requests("r", RequestStatus.FINISHED_ABORTED)
    step(world)
    report(world, "a", "r", "save")
    step(world, 2)
    assert "r" in world.scheduler.requests
    assert world.owed() == [("c", 0, "r", "load")]
    report(world, "c", "r", "load", ranks=[0])
    step(world)
    assert "r" not in world.scheduler.requests
    world.check_counts()
    world.drain()


def test_a_counted_childs_failed_load_reaches_the_scheduler_once_counted() -> None:
    # vLLM reads failed_recving before it calls update_connector_output: a counted loader's
    # failure, known in that hook, reaches vLLM the step after, from every worker, with the
    # load's one completion (as any load the scheduler knows failed).
    world = World(ours=True, counts=(None, None, 1))
    seen: list[tuple[set[str], set[str], set[str]]] = []
    update = world.connector.update_connector_output

    def watched(connector_output: Any) -> None:
        read_by_vllm = set(connector_output.failed_recving)  # before the hook, as vLLM reads it
        update(connector_output)
        finished = set(connector_output.finished_recving or ())
        seen.append((finished, set(connector_output.failed_recving), read_by_vllm))

    world.connector.update_connector_output = watched
    add(world, "r", hit="c", tokens=17)
    step(world, 2)
    assert all("r" not in finished for finished, _, _ in seen)  # every worker's, held back
    world.boards["c"].workers[0].failed.add("r")
    step(world)
    assert "r" not in seen[-1][0]  # its last report came, failed: not passed on as loaded
    step(world)
    assert seen[-1] == ({"r"}, {"r"}, {"r"})
    assert sum("r" in finished for finished, _, _ in seen) == 1
    world.check_counts()
    world.drain()


def test_a_counted_childs_applied_reports_are_counted() -> None:
    world = World(ours=True, counts=(None, None, 1))
    add(world, "r", saves=("c",))
    step(world)
    report(world, "c", "r", "save", ranks=[0])
    step(world)
    assert "r" not in world.scheduler.requests
    world.check_counts()


def test_a_counted_loaders_load_is_not_split() -> None:
    """c reports on one worker of two and holds the first block, a the next two. Split, vLLM
    was handed the load's completion in the step that scheduled it, while a still loaded its
    part, and freed the blocks under it: a load by a counted loader is not split."""
    world = World(ours=True, counts=(None, None, 1), split=True)
    for name, first, end in (("c", 0, 1), ("a", 1, 3)):
        world.boards[name].starts["r"] = first * BLOCK
        world.boards[name].hits["r"] = end * BLOCK
    world.scheduler.add_request(make_request("r", 0, 3 * BLOCK + 1, 2))
    step(world)
    assert world.owed() == [("c", 0, "r", "load")]  # c alone: a owes nothing
    record = world.connector._scheduler.tracker.peek("r")
    assert record is not None and record.parts == ()
    report(world, "c", "r", "load", ranks=[0])
    step(world, 4)
    assert "r" not in world.scheduler.requests
    world.drain()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_load_a_child_failed_to_start_is_loaded_again_by_the_next_loader(workers: int) -> None:
    """a raises in start_load_kv and never reports: its load is failed, vLLM recomputes, and
    its next lookup chooses b (``load_fallback: failover``). The worker's books held a's
    load, cancelled, until a reported, and ignored b's: the request waited for remote KVs
    forever (and with two workers, once a did report, the one that cancelled did not know
    b's load)."""
    world = World(ours=True, workers=workers, failover=True)
    add(world, "r", hit=("a", "b"), max_tokens=2)
    for rank in range(workers):
        world.boards["a"].workers[rank].raise_in.add("start_load_kv")
        world.armed[rank].add(("a", "start_load_kv"))
    for _ in range(3):
        world.step()
    assert world.scheduler.requests["r"].status is RequestStatus.WAITING_FOR_REMOTE_KVS
    assert [o[0] for o in world.owed()] == ["a"] * workers + ["b"] * workers  # b loads it now
    report(world, "b", "r", "load")
    for _ in range(4):
        world.step()
    assert "r" not in world.scheduler.requests  # it ran, finished, and is gone
    assert all(len(w.load_tracker) == 0 for w in world.workers)
    checked(world)
    world.drain()  # a never reports (given up); nothing waits for it


def test_a_failed_load_of_an_aborted_request_leaves_nothing_of_its_lookups() -> None:
    """Aborted while a loads it, then a reports the load failed: a is not asked again for a
    request that is gone, and nothing of its lookups is kept (it was, forever)."""
    world = World(ours=True)
    add(world, "r", hit="a")
    step(world)
    world.scheduler.finish_requests("r", RequestStatus.FINISHED_ABORTED)
    for w in world.boards["a"].workers:
        w.failed.add("r")
    step(world)
    assert "r" not in world.scheduler.requests
    assert world.connector._scheduler.lookups.held() == 0
    world.drain()


# -- planted bugs: the fuzz must find each -------------------------------------------------------


def _release_on_first_saver(monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker ledger releases a request on its first saver's report."""
    original = SaveLedger.report

    def report(self: SaveLedger, name: str, request_ids: Any, released: set[str]) -> None:
        ids = list(request_ids)
        before = {request_id: self.awaiting(request_id) for request_id in ids}
        original(self, name, ids, released)
        for request_id in ids:
            if name in before[request_id] and request_id in self:  # others still owe: released
                del self._awaiting[request_id]
                del self._expected[request_id]
                released.add(request_id)

    monkeypatch.setattr(SaveLedger, "report", report)


def _pass_on_unchosen_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker passes on a load completion from a child that was not chosen to load."""
    report_loaded = WorkerPart._report_loaded

    def planted(self: WorkerPart, name: str, child_results: Any, results: Any) -> None:
        for request_id in child_results.finished_recving | child_results.failed_recving:
            record = self.loads.peek(request_id)
            if record is not None and record.loader not in (None, name) and not record.loaded:
                results.finished_recving.add(request_id)
        report_loaded(self, name, child_results, results)

    monkeypatch.setattr(WorkerPart, "_report_loaded", planted)


def _free_aborted_saves_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The scheduler side tells vLLM to free an aborted request at once, saves or not (vLLM
    asks a connector that supports HMA its ``request_finished_all_groups``)."""
    request_finished = MultiConnector.request_finished_all_groups

    def planted(self: MultiConnector, request: Any, block_ids: Any) -> Any:
        delay, params = request_finished(self, request, block_ids)
        if request.status is RequestStatus.FINISHED_ABORTED:
            return False, params
        return delay, params

    monkeypatch.setattr(MultiConnector, "request_finished_all_groups", planted)


def _ignore_the_second_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """The connector tells vLLM's output aggregator one worker's report is enough: the second
    worker's report of a request is ignored."""
    monkeypatch.setattr(MultiConnector, "get_finished_count", lambda self: 1)


def _complete_a_split_load_at_each_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker passes a split load's completion on as each part arrives, its first included
    (vLLM runs the request while the other parts still write into its blocks)."""
    part_arrived = WorkerPart._part_arrived

    def planted(self: WorkerPart, request_id: str, name: str, results: Any) -> bool:
        applied = part_arrived(self, request_id, name, results)
        if applied:
            results.finished_recving.add(request_id)
        return applied

    monkeypatch.setattr(WorkerPart, "_part_arrived", planted)


def _fail_the_request_of_a_failed_part(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker reports a split load whose part failed as failed as a whole (vLLM recomputes
    the other parts' tokens too)."""
    report_loaded = WorkerPart._report_loaded

    def planted(self: WorkerPart, name: str, child_results: Any, results: Any) -> None:
        for request_id in child_results.failed_recving:
            split = self._split_of.get(request_id)
            if split is not None and name in split:
                results.failed_recving.add(request_id)
        report_loaded(self, name, child_results, results)

    monkeypatch.setattr(WorkerPart, "_report_loaded", planted)


class PlantedMachine(AdapterMachine):
    OURS = True


class PlantedSplitMachine(SplitMachine):
    OURS = True


#: Each planted bug, the machine that must find it, and the examples within which it must
#: (derandomized, so the same every run; what each took is printed).
PLANTS: dict[str, tuple[Callable[[pytest.MonkeyPatch], None], type[AdapterMachine], int]] = {
    "ledger releases on the first saver": (_release_on_first_saver, PlantedMachine, 100),
    "unchosen load passed on": (_pass_on_unchosen_loads, PlantedMachine, 100),
    "aborted save freed at once": (_free_aborted_saves_at_once, PlantedMachine, 100),
    "second worker ignored": (_ignore_the_second_worker, PlantedMachine, 100),
    "split load complete at each part": (
        _complete_a_split_load_at_each_part,
        PlantedSplitMachine,
        100,
    ),
    "failed part fails the request": (_fail_the_request_of_a_failed_part, PlantedSplitMachine, 100),
}


@pytest.mark.parametrize("plant", list(PLANTS))
def test_the_fuzz_finds_a_planted_bug(
    plant: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    patch, machine, budget = PLANTS[plant]
    patch(monkeypatch)
    machine.made = 0
    with pytest.raises(AssertionError) as caught:
        run_state_machine_as_test(
            machine,
            settings=fuzz_settings(
                budget, phases=[Phase.generate], report_multiple_bugs=False, derandomize=True
            ),
        )
    with capsys.disabled():
        print(f"\nplanted {plant!r}: found in example {machine.made}: {caught.value}")
    assert machine.made <= budget
    # An invariant of the machine, or vLLM's own assert: not the plant failing to apply.
    cause = caught.value.__cause__
    assert cause is None or type(cause) is AssertionError, cause

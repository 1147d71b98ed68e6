"""The fuzz inside vLLM's real Scheduler (fuzz_machine.py), with each child's health machine
on and its transitions interleaved with every other event: a child opens at any point (its
first failure, or one injected by the ``trip`` rule, mid-load, mid-save, mid-split), the clock
moves by hand (``cool``), and the machine's invariants still hold: nothing freed while a part
of a transfer is owed, each load's completion delivered once, every report counted, and
everything drained at the end. Each run asserts the health transitions and skipped lookups
happened."""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import os  # noqa: E402
from collections import Counter  # noqa: E402
from typing import Any, ClassVar  # noqa: E402

import pytest  # noqa: E402
from fuzz_machine import NAMES, AdapterMachine, Fuzzed, SplitMachine  # noqa: E402
from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import rule, run_state_machine_as_test  # noqa: E402

from multiconnector.health import Health  # noqa: E402
from multiconnector.healthbook import HealthBook  # noqa: E402
from multiconnector.vllm.counted import WORKERS  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800), pytest.mark.usefixtures("quiet")]

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "dev")
EXAMPLES = {"deep": 2000, "mutate": 20}.get(PROFILE, 80)

#: What each run must have seen happen, besides the rules of the machine without health.
HEALTH_EVENTS = (
    "trip",
    "cool",
    "health-closed_to_open",
    "health-open_to_half_open",
    "health-half_open_to_closed",
    "health-half_open_to_open",
    "lookup-skipped",
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class _Health:
    """The health rules, mixed into the fuzz machines (before the machine: its world is built
    with each child's health machine on, whose book then reads the run's clock)."""

    HEALTH: ClassVar[bool] = True
    seen: ClassVar[Counter[str]] = Counter()
    world: Any

    def __init__(self) -> None:
        super().__init__()
        self._install()

    def teardown(self) -> None:
        super().teardown()  # type: ignore[misc]
        self._count_health()

    def _install(self) -> None:
        self.clock = Clock()
        self.book = self.world.connector._scheduler.health
        self.book.clock = self.clock

    @rule(name=st.sampled_from(NAMES))
    def trip(self, name: str) -> None:
        """A failure of ``name`` from outside the run's events (a hook elsewhere raised)."""
        self.fire("trip")  # type: ignore[attr-defined]
        self.book.failed(name)

    @rule(seconds=st.sampled_from([0.5, 1.0, 3.0]))
    def cool(self, seconds: float) -> None:
        """The clock moves: the next step's tick may end a cooldown."""
        self.fire("cool")  # type: ignore[attr-defined]
        self.clock.now += seconds

    def _count_health(self) -> None:
        for moves in self.book.moves().values():
            for move, n in moves.items():
                type(self).seen[f"health-{move}"] += n
        hits = self.world.connector.child_hits()
        type(self).seen["lookup-skipped"] += sum(h.get("skipped", 0) for h in hits.values())


class HealthMachine(_Health, AdapterMachine):
    """The fuzz machine with each child's health machine and the health rules."""


class HealthSplitMachine(_Health, SplitMachine):
    """:class:`HealthMachine` with ``split_loads`` (the split machine's rules too)."""


def fuzzed(machine: Any, examples: int) -> dict[str, int]:
    machine.fired.clear()
    machine.seen.clear()
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=40,
            deadline=None,
            database=None,
            derandomize=PROFILE != "deep",
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    return {**machine.fired, **machine.seen}


@pytest.mark.parametrize("machine", [HealthMachine, HealthSplitMachine], ids=["one", "split"])
def test_health_transitions_drop_nothing_owed(
    machine: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    seen = fuzzed(machine, EXAMPLES)
    with capsys.disabled():
        line = ", ".join(f"{label}={seen.get(label, 0)}" for label in HEALTH_EVENTS)
        print(f"\n{EXAMPLES} examples with health; {line}")
    missing = [label for label in HEALTH_EVENTS if not seen.get(label)]
    assert not missing, f"never happened: {missing}"
    assert seen.get("report-load") and seen.get("report-save")


#: The scheduler part of each planted machine's health book, by the book's id.
_PARTS: dict[int, Any] = {}


class DropsSavesWhenOpening(HealthMachine):
    """A planted bug (installed by the test below): opening a child settles the saves it owes
    as if its workers had reported them (what a breaker that "gives up" on a child's transfers
    would do)."""

    def _install(self) -> None:
        super()._install()
        _PARTS[id(self.book)] = self.world.connector._scheduler


def test_the_fuzz_finds_a_breaker_that_drops_a_save_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fire = HealthBook._fire

    def dropping(book: HealthBook, record: Any, event: str, now: float) -> None:
        fire(book, record, event, now)
        part = _PARTS.get(id(book))
        if part is not None and record.state is Health.open:
            for request_id, savers in part.saving.items():
                if record.name in savers:
                    part.tracker.transfer_finished(request_id, WORKERS)

    monkeypatch.setattr(HealthBook, "_fire", dropping)
    with pytest.raises(Fuzzed, match="still owe"):
        run_state_machine_as_test(
            DropsSavesWhenOpening,
            settings=settings(
                max_examples=EXAMPLES,
                stateful_step_count=40,
                deadline=None,
                database=None,
                derandomize=True,
                phases=[Phase.generate],
                report_multiple_bugs=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            ),
        )

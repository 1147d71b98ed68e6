"""``multiconnector simulate``: every fault kind at small N with zero violations, and the
simulator catching planted bugs (count-based draining, lost cancellations) in the aggregator."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from multiconnector import InvalidArgumentError, MultiConnector, Outcome, State
from multiconnector._workload.pool import BlockPool, Violations
from multiconnector.simulate import FAULT_KINDS, SimulationConfig, render_summary, run_cli, simulate

SMALL = 1500

pytestmark = pytest.mark.timeout(120)  # simulations: longer than the default time limit


def _stable(result_json: dict[str, Any]) -> dict[str, Any]:
    """The JSON minus wall-clock figures."""
    return {k: v for k, v in result_json.items() if k not in {"elapsed_s", "events_per_second"}}


# -- a clean library: nothing found ------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_every_fault_kind_and_no_violation(seed: int) -> None:
    result = simulate(SimulationConfig(requests=SMALL, seed=seed, fault_rate=0.05, blocks=512))
    assert result.ok, render_summary(result)
    assert result.early_frees == 0
    assert not any(result.leaks.values())
    assert result.finished + result.cancelled == SMALL
    assert result.cancelled > 0
    # Every kind was injected, and the library met each with the rule meant for it.
    assert set(result.faults) == set(FAULT_KINDS)
    assert all(n > 0 for n in result.faults.values()), result.faults
    assert result.simulator["clashes"] > 0
    assert result.simulator["connector_failures"] > 0
    assert result.simulator["callback_failures"] > 0
    assert result.simulator["unregistrations"] > 0
    assert result.reports["phantom"].get("phantom", 0) > 0
    assert result.reports["duplicate"].get("duplicate", 0) > 0
    assert result.reports["unknown"].get("unknown_connector", 0) > 0
    assert result.reports["unknown"].get("not_ready", 0) > 0
    assert result.reports["late"].get("unknown_request", 0) > 0
    assert result.outcomes["applied"] > 2 * SMALL


def test_all_outcomes_occur_over_a_few_seeds() -> None:
    seen: set[str] = set()
    for seed in range(3):
        result = simulate(SimulationConfig(requests=SMALL, seed=seed, fault_rate=0.08))
        assert result.ok, render_summary(result)
        seen |= {o for o, n in result.outcomes.items() if n}
    # Every outcome the counters can show: an early report is counted once decided, as what it
    # turned out to be, never as early.
    assert seen == {o.value for o in Outcome if o is not Outcome.early}


def test_no_faults_means_no_fault_outcomes() -> None:
    result = simulate(SimulationConfig(requests=SMALL, faults=frozenset()))
    assert result.ok, render_summary(result)
    assert result.faults == {}
    for ignored in ("phantom", "duplicate", "unknown_connector", "not_ready", "unregistered"):
        assert result.outcomes.get(ignored, 0) == 0, ignored
    assert result.simulator["unregistrations"] == 0


def test_threads_keep_every_invariant() -> None:
    config = SimulationConfig(requests=4000, seed=7, threads=4, fault_rate=0.05, blocks=256)
    result = simulate(config)
    assert result.ok, render_summary(result)
    assert result.finished + result.cancelled == 4000
    assert result.simulator["admission_waits"] > 0  # the small pool made the scheduler wait


@pytest.mark.parametrize("stripes", [64, 2])
def test_worker_threads_deliver_saves_in_batches(stripes: int) -> None:
    # With 2 stripes every batch takes every stripe lock at once; with 64, one lock per report.
    config = SimulationConfig(requests=3000, seed=5, threads=3, fault_rate=0.05, stripes=stripes)
    result = simulate(config)
    assert result.ok, render_summary(result)
    assert result.finished + result.cancelled == 3000
    stats = result.simulator
    assert 0 < stats["report_batches"] < stats["batched_reports"]
    assert "reports delivered in batches" in render_summary(result)
    single = simulate(SimulationConfig(requests=300, seed=5))
    assert single.simulator["report_batches"] == 0  # one thread delivers each report at once


def test_a_run_is_a_function_of_its_seed() -> None:
    config = SimulationConfig(requests=800, seed=11, fault_rate=0.05)
    first, second = simulate(config).to_json(), simulate(config).to_json()
    assert _stable(first) == _stable(second)
    other = simulate(SimulationConfig(requests=800, seed=12, fault_rate=0.05)).to_json()
    assert _stable(other) != _stable(first)


def test_a_run_does_not_depend_on_the_string_hash_seed(tmp_path: Path) -> None:
    outputs = []
    for hash_seed in ("1", "2"):
        out = tmp_path / f"run{hash_seed}.json"
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        args = ["simulate", "--requests", "600", "--seed", "3", "--progress", "none"]
        code = (
            "import sys; from multiconnector.cli import main; "
            f"sys.exit(main({[*args, '--json', str(out)]!r}))"
        )
        subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
        outputs.append(_stable(json.loads(out.read_text())))
    assert outputs[0] == outputs[1]


# -- the command -------------------------------------------------------------------------------


def test_cli_writes_json_and_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "simulate.json"
    argv = ["--requests", "500", "--seed", "2", "--progress", "plain", "--json", str(out)]
    assert run_cli(argv) == 0
    captured = capsys.readouterr()
    assert ": OK" in captured.out
    for row in ("finished", "cancelled", "ignored: duplicate", "violations", "early frees"):
        assert row in captured.out
    assert "500/500 requests" in captured.err
    data = json.loads(out.read_text())
    assert data["ok"] is True
    assert data["requests"]["finished"] + data["requests"]["cancelled"] == 500
    assert data["violations"]["total"] == 0
    assert data["events"]["total"] == data["events"]["applied"] + sum(
        data["events"]["ignored"].values()
    )


def test_cli_picks_fault_kinds(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    argv = ["--requests", "400", "--faults", "clash,phantom", "--progress", "none"]
    assert run_cli([*argv, "--json", str(out)]) == 0
    assert set(json.loads(out.read_text())["faults"]) == {"clash", "phantom"}


@pytest.mark.parametrize(
    "argv",
    [
        ["--faults", "raise,meteor"],
        ["--threads", "0"],
        ["--requests", "-1"],
        ["--fault-rate", "1.5"],
        ["--blocks", "4"],
        ["--stripes", "3"],
    ],
)
def test_cli_rejects_bad_arguments(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        run_cli(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert argv[0].lstrip("-").split("-")[0] in err


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("requests", -1),
        ("requests", 1.5),
        ("seed", "0"),
        ("threads", 0),
        ("faults", "raise"),
        ("faults", {"raise", "meteor"}),
        ("fault_rate", 2),
        ("cancel_rate", True),
        ("blocks", 8),
        ("stripes", 0),
        ("stripes", 12),
    ],
)
def test_config_rejects_bad_values_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=f"{field}="):
        SimulationConfig(**{field: value})


# -- the pool, on its own ----------------------------------------------------------------------


def test_pool_flags_early_and_double_frees() -> None:
    owing = {"r1": ["pd@0"]}
    violations = Violations()
    pool = BlockPool(8, 3, lambda rid: owing.get(rid, []), violations)
    a = pool.allocate(0, 3)
    b = pool.allocate(1, 5)
    assert a is not None and b is not None and not set(a) & set(b)
    assert pool.allocate(2, 1) is None  # full: the request waits
    pool.free(0, "r0", a)
    pool.free(1, "r1", b)  # pd@0 still owes r1: an early free
    pool.free(0, "r0", a)  # twice
    assert pool.early_frees == 1
    assert violations.by_kind == {"early_free": 1, "double_free": 1}
    assert "pd@0" in violations.examples[0]["detail"]
    assert pool.in_use == 0 and pool.never_freed() == 0


# -- planted bugs: the simulator must find them ------------------------------------------------


def _count_based_draining(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bug this library replaces: any report, even a duplicate or phantom, counts as one of
    the awaited ones (a counter of outstanding saves instead of a set of names)."""
    original = MultiConnector.transfer_finished

    def counting(
        self: MultiConnector, request_id: str, name: str, blocks: Sequence[int] = ()
    ) -> Outcome:
        outcome = original(self, request_id, name, blocks)
        if outcome in (Outcome.duplicate, Outcome.phantom):
            record = self.get(request_id)
            if record is not None and record.state is State.finishing and record.awaiting:
                original(self, request_id, record.awaiting[0], blocks)
        return outcome

    monkeypatch.setattr(MultiConnector, "transfer_finished", counting)


def test_count_based_draining_is_caught(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _count_based_draining(monkeypatch)
    out = tmp_path / "s.json"
    argv = ["--requests", "2000", "--fault-rate", "0.05", "--progress", "none"]
    assert run_cli([*argv, "--json", str(out)]) == 1
    data = json.loads(out.read_text())
    assert data["ok"] is False
    assert data["early_frees"] > 0
    assert data["violations"]["by_kind"]["early_free"] == data["early_frees"]
    assert any("still owed by" in e["detail"] for e in data["violations"]["examples"])
    assert ": VIOLATIONS" in capsys.readouterr().out


def test_count_based_draining_is_caught_with_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    _count_based_draining(monkeypatch)
    result = simulate(SimulationConfig(requests=2000, threads=3, fault_rate=0.05))
    assert not result.ok
    assert result.early_frees > 0


@pytest.mark.parametrize("threads", [1, 3])
def test_handing_back_a_draining_cancelled_request_is_caught(
    monkeypatch: pytest.MonkeyPatch, threads: int
) -> None:
    """The old take(): a cancelled request handed back at once, saves or a load in flight."""
    original = MultiConnector.take

    def hasty(self: MultiConnector) -> list[Any]:
        taken = original(self)
        for record in list(self._requests.values()):
            if record.state is State.cancelled and record.in_flight:
                del self._requests[record.request_id]
                taken.append(record)
        return taken

    monkeypatch.setattr(MultiConnector, "take", hasty)
    config = SimulationConfig(requests=SMALL, faults=frozenset(), cancel_rate=0.3, threads=threads)
    result = simulate(config)
    assert result.early_frees > 0
    assert result.violations["early_free"] == result.early_frees


def test_requests_never_handed_back_are_leaks(monkeypatch: pytest.MonkeyPatch) -> None:
    original = MultiConnector.take

    def losing(self: MultiConnector) -> list[Any]:
        return [r for r in original(self) if r.state is not State.cancelled]

    monkeypatch.setattr(MultiConnector, "take", losing)
    result = simulate(SimulationConfig(requests=SMALL, faults=frozenset(), cancel_rate=0.2))
    assert not result.ok
    assert result.leaks["requests_not_handed_back"] > 0
    assert result.leaks["blocks_in_use"] > 0
    assert result.violations["leak"] >= 2


def test_handing_back_requests_still_finishing_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A take() that also returns requests still awaiting saves: freed early, handed back twice."""
    original = MultiConnector.take

    def eager(self: MultiConnector) -> list[Any]:
        taken = original(self)
        for rid in self.request_ids()[:1]:
            record = self.get(rid)
            if record is not None and record.state is State.finishing:
                taken.append(record)
        return taken

    monkeypatch.setattr(MultiConnector, "take", eager)
    result = simulate(SimulationConfig(requests=SMALL, faults=frozenset()))
    assert result.early_frees > 0
    assert result.violations["not_terminal"] > 0
    assert result.violations["handed_back_twice"] > 0


def test_zero_requests_is_refused_as_check_refuses_it() -> None:
    from multiconnector.errors import InvalidValueError  # noqa: PLC0415
    from multiconnector.simulate import SimulationConfig  # noqa: PLC0415

    with pytest.raises(InvalidValueError, match="requests=0"):
        SimulationConfig(requests=0)

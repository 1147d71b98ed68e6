"""The model checker: the real aggregator passes complete bounds; the report, JSON, CLI, engine.

The planted bugs it must catch are in ``test_check_broken.py``.
"""

from __future__ import annotations

import copy
import functools
import itertools
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import attrs
import pytest
from transitions import Machine

from multiconnector import (
    InvalidArgumentError,
    InvalidNameError,
    InvalidValueError,
    KeyClashError,
    MultiConnector,
    MultiConnectorError,
    Outcome,
    State,
)
from multiconnector import _explore as engine
from multiconnector.check import (
    ALPHABET,
    CALLBACKS,
    COUNTERS,
    EXIT_STATUS,
    LOAD_EVENTS,
    LOAD_ONCE,
    PARAM_CHOICES,
    PARAMS_MERGED,
    PROPERTIES,
    RIGHT_OUTCOME,
    CheckReport,
    UnknownPropertyError,
    check_aggregator,
    declared_transitions,
    explore,
    independent,
    reachable_in,
    run_cli,
)
from multiconnector.check import run as run_module
from multiconnector.check.fork import forkable
from multiconnector.check.reference import reference_merge, report_outcome
from multiconnector.check.scenario import scripted_params
from multiconnector.machine import EVENTS, STATES, build_machine
from multiconnector.params import merge_transfer_params
from tests.broken_aggregators import CATALOG
from tests.checked import checked

ROOT = Path(__file__).resolve().parent.parent
SMALL = {"a": "saver", "b": "saver", "none": None}

pytestmark = pytest.mark.timeout(120)  # model-check bounds: longer than the default time limit


def declared() -> set[tuple[str, str, str]]:
    return set(declared_transitions(build_machine())[1])


#: What the report lists when the alphabet has the load side: ``load once`` after ``no leak``.
_AFTER_LEAK = PROPERTIES.index("no leak") + 1
LOAD_PROPERTIES = [*PROPERTIES[:_AFTER_LEAK], LOAD_ONCE, *PROPERTIES[_AFTER_LEAK:]]


def assert_all_pass(report: CheckReport, properties: Any = PROPERTIES) -> None:
    assert report.ok, report.to_text()
    assert report.finished
    assert [p.name for p in report.properties] == list(properties)
    fired = {(c.source, c.event, c.dest) for c in report.coverage if c.count > 0}
    assert fired == declared()
    assert report.states_reached == tuple(s.value for s in STATES)


# -- the real aggregator, complete bounds -------------------------------------------------------


def test_one_request_every_kind_of_connector_passes() -> None:
    report = check_aggregator(
        {"a": "saver", "b": "saver", "none": None, "boom": "raises"}, requests=1
    )
    assert_all_pass(report)
    # Figures are exact: the search is deterministic.
    assert (report.distinct_states, report.max_depth) == (428, 11)
    assert report.states_generated > report.edges > report.distinct_states


def test_two_requests_bound_in_make_test_passes() -> None:
    """The bound `make test` explores completely: two requests, two savers, a None slot.

    ``register`` is left out here to keep it fast; the default bound (``make check``) has it.
    """
    report = check_aggregator(SMALL, requests=2, events=set(ALPHABET) - {"register"})
    assert_all_pass(report)
    assert (report.distinct_states, report.max_depth) == (1928, 13)


# -- the load side (opt-in: it more than doubles the default bound) -----------------------------


def test_load_side_bound_in_make_test_passes() -> None:
    """The load side's bound in `make test`: one request, two savers and a None slot, every event.

    ``match_tokens`` with every answer (0, 1, None) of each ready saver, ``load_finished`` from
    every name (savers, the None slot, ``ghost``), among all the other events. (With a raising
    connector too, the bound has 28,470 states: too many for `make test`.)
    """
    # The same search as test_check_broken's: run once (tests/checked.py).
    report = checked(connectors=SMALL, requests=1, events=ALPHABET + LOAD_EVENTS)
    assert_all_pass(report, LOAD_PROPERTIES)
    assert (report.distinct_states, report.max_depth) == (25038, 21)
    assert report.bounds["events"] == [*ALPHABET, *LOAD_EVENTS]


@pytest.mark.slow  # 48,205 states (match_tokens in its two halves)
def test_load_side_with_two_requests_keeps_the_behavioural_properties() -> None:
    """Two requests' loads interleaved; without (un)registering, to stay within seconds.

    Without ``unregister`` the declared ``connector_gone`` transitions cannot fire: coverage
    says so and passes (they are unreachable here); with ``strict_coverage`` it fails.
    """
    events = set(ALPHABET + LOAD_EVENTS) - {"register", "unregister"}
    report = check_aggregator(SMALL, requests=2, events=events)
    assert report.finished and report.ok, report.to_text()
    assert "not reachable in this configuration: finishing --connector_gone--> finished" in (
        report.result("transitions fired").message
    )
    assert report.result(LOAD_ONCE).passed
    assert (report.distinct_states, report.max_depth) == (48205, 14)


# -- params, outcomes, counters, callbacks, batches ---------------------------------------------


def test_params_bound_in_make_check_passes() -> None:
    """``make check``'s params scenario: savers a and b answer every combination of params."""
    report = check_aggregator(requests=1, params=True)
    assert report.ok and report.finished, report.to_text()
    assert [p.name for p in report.properties] == [
        *PROPERTIES[:-3],
        PARAMS_MERGED,
        *PROPERTIES[-3:],
    ]
    assert (report.distinct_states, report.max_depth) == (1342, 9)
    assert report.bounds["params"] == "every saver answers one of: None, own, equal, differ"


def test_params_follow_the_factorys_allow_equal() -> None:
    """With ``allow_equal_params`` the reference lets equal values through; the real aggregator
    passes, and one whose merge inverts the flag fails at the first equal values."""
    factory = functools.partial(MultiConnector, allow_equal_params=True)
    report = check_aggregator(requests=1, params=True, factory=factory)
    assert report.ok and report.finished, report.to_text()
    bug = next(b for b in CATALOG if b.name == "params allow_equal inverted")
    with bug.installed():
        report = check_aggregator(requests=1, params=True, factory=factory)
    result = report.result(PARAMS_MERGED)
    assert not result.passed and result.message.startswith("request_finished(r1) raised KeyClash")
    assert "no key clashes" in result.message
    assert [p.name for p in report.failures] == [PARAMS_MERGED]


def test_scripted_params_are_new_dicts_made_from_the_name() -> None:
    first, second = scripted_params("a", "differ"), scripted_params("a", "differ")
    assert first == second == {"a": 1, "=shared": "a"} and first is not second
    assert scripted_params("b", "equal") == {"b": 1, "=shared": 1}
    assert scripted_params("b", "own") == {"b": 1}
    assert scripted_params("b", None) is None
    assert PARAM_CHOICES == (None, "own", "equal", "differ")


@pytest.mark.parametrize("allow_equal", [False, True])
def test_the_reference_merge_agrees_with_the_library_on_every_scripted_answer(
    allow_equal: bool,
) -> None:
    """The checker's own merge (written apart) and merge_transfer_params agree on every
    combination the scenario can script, three savers, both allow_equal settings."""
    names = ("a", "b", "c")
    for choice in itertools.product(PARAM_CHOICES, repeat=len(names)):
        answers = [(n, scripted_params(n, c)) for n, c in zip(names, choice, strict=True)]
        merged, clashing = reference_merge(answers, allow_equal)
        try:
            real = merge_transfer_params(answers, allow_equal=allow_equal)
        except KeyClashError as exc:
            assert merged is None and sorted(exc.clashes) == sorted(clashing), choice
        else:
            assert not clashing and real == merged, choice


def test_a_report_is_classified_by_the_documented_rules() -> None:
    registry = (("a", True), ("none", False))
    finishing: Any = (State.finishing, ("a",), ("a", "b"), ("b",))
    cancelled: Any = (State.cancelled, ("a",), ("a",), ())
    assert report_outcome(None, "a", registry) is Outcome.unknown_request
    assert report_outcome(finishing, "a", registry) is Outcome.applied
    assert report_outcome(cancelled, "a", registry) is Outcome.drained
    assert report_outcome(finishing, "b", registry) is Outcome.unregistered
    assert report_outcome((State.finishing, (), ("a",), ()), "a", registry) is Outcome.duplicate
    assert report_outcome(finishing, "ghost", registry) is Outcome.unknown_connector
    assert report_outcome(finishing, "none", registry) is Outcome.not_ready
    pending: Any = (State.pending, (), (), ())
    assert report_outcome(pending, "a", registry) is Outcome.phantom
    assert report_outcome((State.finished, (), ("a",), ()), "a", registry) is Outcome.terminal


def test_cli_params_flag_adds_the_params_property(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--requests", "1", "--params", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert f"PASS  {PARAMS_MERGED}: request_finished returns (and raises)" in out
    assert "params every saver answers one of" in out


def test_a_batch_is_reported_only_where_it_applies_a_report() -> None:
    """transfer_finished_many is in the default alphabet: a batch of two reports under an
    awaited name (the same request twice with one request)."""
    assert "transfer_finished_many" in ALPHABET
    report = check_aggregator(requests=1)
    bug = next(b for b in CATALOG if b.name == "batch applies a duplicate twice")
    trace = check_aggregator(requests=1, factory=bug.factory).result(RIGHT_OUTCOME).counterexample
    assert trace is not None
    assert trace.steps[-1].event in {f"transfer_finished_many({n}, [r1, r1])" for n in "ab"}
    assert trace.steps[-1].data[:2] == ["transfer_finished_many", trace.steps[-1].data[1]]
    assert trace.steps[-1].data[2] == ["r1", "r1"]
    assert report.ok
    without = check_aggregator(requests=1, events=set(ALPHABET) - {"transfer_finished_many"})
    # The batch adds transitions, not states.
    assert without.distinct_states == report.distinct_states
    assert without.states_generated < report.states_generated


def test_the_new_properties_are_reported_in_order() -> None:
    report = check_aggregator({"a": "saver"}, requests=1)
    names = [p.name for p in report.properties]
    assert names.index("no leak") < names.index(RIGHT_OUTCOME) < names.index(COUNTERS)
    assert names.index(COUNTERS) < names.index(CALLBACKS) < names.index("no trap")
    assert all(p.passed for p in report.properties)


def test_the_default_alphabet_leaves_the_load_side_out() -> None:
    report = check_aggregator(SMALL, requests=1)
    assert LOAD_ONCE not in [p.name for p in report.properties]
    assert not set(LOAD_EVENTS) & set(ALPHABET)
    assert not set(LOAD_EVENTS) & set(report.bounds["events"])


class _LoadNeverApplied(MultiConnector):  # type: ignore[misc]
    """Ignores every load completion: the chosen loader's load never completes."""

    def load_finished(self, request_id: str, name: str) -> Outcome:
        return Outcome.duplicate


class _LoadAppliedUnchosen(MultiConnector):  # type: ignore[misc]
    """Applies a load completion though no connector was chosen (a ``None`` answer came)."""

    def load_finished(self, request_id: str, name: str) -> Outcome:
        outcome = super().load_finished(request_id, name)
        record = self._requests.get(request_id)
        if record is not None and record.loader is None and name in self.registry:
            return Outcome.applied
        return outcome


@pytest.mark.parametrize(
    ("factory", "message", "shortest", "also", "wrong"),
    [
        # Returns an outcome it never counted: the counters see that too; and "duplicate" for
        # a request not begun (1 event), which right outcome sees.
        # match_tokens is two events: it asks, then records the loader. Its loader awaited
        # after it delivered: stranded (no leak).
        (
            _LoadNeverApplied,
            "not applied: the load never completes",
            4,
            ["counters", "no leak"],
            1,
        ),
        # Returns applied for a report it counted as ignored, and calls nobody back. 20.5 s of
        # CPU alone: for `make test-slow` (the 2x-loaded machine would take it past its limit).
        pytest.param(
            _LoadAppliedUnchosen,
            "though no connector was chosen to load it",
            2,
            ["counters", "callbacks"],
            2,
            marks=pytest.mark.slow,
        ),
    ],
)
def test_load_once_is_checked_against_what_the_checker_saw(
    factory: Any, message: str, shortest: int, also: list[str], wrong: int
) -> None:
    # Neither bug touches a request's state or saves: only the checker's own record of the
    # token answers it scripted tells that the outcome is wrong (load once, and right outcome,
    # which classifies every outcome from that record).
    report = checked(factory, connectors=SMALL, requests=1, events=ALPHABET + LOAD_EVENTS)
    result = report.result(LOAD_ONCE)
    assert not result.passed and message in result.message, report.to_text()
    assert result.counterexample is not None and len(result.counterexample) == shortest
    assert {p.name for p in report.failures} == {LOAD_ONCE, "right outcome", *also}
    assert len(report.result("right outcome").counterexample or ()) == wrong


def test_a_none_answer_chooses_no_loader() -> None:
    """``match_tokens`` where one saver answers None: nothing is remembered, no load is due.

    The search of test_load_once_is_checked_against_what_the_checker_saw: run once."""
    report = checked(
        _LoadAppliedUnchosen, connectors=SMALL, requests=1, events=ALPHABET + LOAD_EVENTS
    )
    trace = report.result(LOAD_ONCE).counterexample
    assert trace is not None
    assert [s.event.split("(")[0] for s in trace.steps] == ["begin", "load_finished"]
    text = report.to_text()
    assert "match_tokens" not in text.split("FAIL  load once")[1].split("PASS")[0]


def test_cli_load_flag_adds_the_load_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "check.json"
    argv = ["--connectors", "a,b,none=none", "--requests", "1", "--load", "--json", str(out)]
    assert run_cli([*argv, "--no-progress"]) == 0
    assert f"PASS  {LOAD_ONCE}: load applied at most once" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["bounds"]["events"] == [*ALPHABET, *LOAD_EVENTS]
    assert [p["name"] for p in data["properties"]] == LOAD_PROPERTIES
    # --load adds to a narrowed alphabet too.
    assert run_cli(["--connectors", "a,b", "--requests", "1", "--events", "begin,take", "--load"])
    assert "events begin, take, match_tokens, load_finished" in capsys.readouterr().out


def test_symmetry_merges_states_without_changing_the_verdict() -> None:
    events = {"begin", "request_finished", "transfer_finished", "cancel", "unregister", "take"}
    on = check_aggregator({"a": "saver", "b": "saver"}, requests=2, events=events)
    off = check_aggregator({"a": "saver", "b": "saver"}, requests=2, events=events, symmetry=False)
    assert on.ok and off.ok, on.to_text()
    assert on.distinct_states < off.distinct_states
    assert on.max_depth == off.max_depth
    # Each merged state stands for at most 4 renamings (2 request ids x 2 saver names).
    assert off.distinct_states <= 4 * on.distinct_states
    assert "4 renamings" in on.to_text() and "symmetry off" in off.to_text()


def test_the_alphabet_fires_every_event_of_the_declaration() -> None:
    # connector_gone is fired by unregistering a connector a request awaits.
    assert set(EVENTS) - {"connector_gone"} <= set(ALPHABET)
    assert {t[1] for t in declared()} == set(EVENTS)


def test_a_narrow_alphabet_fails_the_structural_properties_only_when_strict() -> None:
    events = {"begin", "request_finished", "transfer_finished", "take"}
    lenient = check_aggregator(SMALL, requests=1, events=events)
    assert lenient.ok and lenient.verdict == "PASS", lenient.to_text()
    assert "not reachable in this configuration: cancelled" in (
        lenient.result("states reached").message
    )
    report = check_aggregator(SMALL, requests=1, events=events, strict_coverage=True)
    assert not report.ok and report.verdict == "FAIL"
    assert report.result("states reached").message == "never entered: cancelled"
    fired = report.result("transitions fired")
    assert not fired.passed and "never fired: pending --cancel--> cancelled" in fired.message
    # The behavioural properties still hold (without transfer_finished, "no trap" would not).
    for name in ("no exception", "terminal absorbing", "no early free", "no leak", "no trap"):
        assert report.result(name).passed


def test_bounds_cut_the_search_and_say_so() -> None:
    report = check_aggregator(SMALL, requests=1, max_depth=3)
    assert not report.finished and report.max_depth == 3
    assert report.ok  # the unexplored rest counts as able to reach the goal: no false trap
    capped = check_aggregator(SMALL, requests=1, max_states=50)
    assert not capped.finished and capped.distinct_states == 50


# -- the report and its JSON --------------------------------------------------------------------


def test_text_report_has_every_figure() -> None:
    text = check_aggregator(SMALL, requests=1).to_text()
    for needle in (
        "bounds: connectors a (saver), b (saver), none (None slot); unknown names ghost",
        "states generated",
        "distinct",
        "edges",
        "max depth 10",
        "search: complete: every reachable state was explored (max depth 10)",
        "distinct states/s (",
        "states generated/s)",
        "PASS  no trap",
        "pending --request_finished--> finishing",
        "result: PASS",
    ):
        assert needle in text


def test_asking_a_report_for_a_property_it_lacks_is_a_typed_error() -> None:
    report = check_aggregator(SMALL, requests=1, max_depth=2)
    with pytest.raises(UnknownPropertyError, match="no property 'load once' in this report"):
        report.result(LOAD_ONCE)
    assert issubclass(UnknownPropertyError, KeyError)
    assert issubclass(UnknownPropertyError, MultiConnectorError)


def test_json_report_round_trips(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    assert run_cli(["--connectors", "a,b,none=none", "--requests", "1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["ok"] is True and data["finished"] is True
    assert data["distinct_states"] == 204
    assert [p["name"] for p in data["properties"]] == list(PROPERTIES)
    assert {p["result"] for p in data["properties"]} == {"PASS"}
    assert {(c["source"], c["event"], c["dest"]) for c in data["coverage"]} == declared()
    assert data["bounds"]["requests"] == 1
    for key in ("states_generated", "edges", "max_depth", "wall_time"):
        assert data[key] > 0
    assert data["distinct_per_second"] == pytest.approx(
        data["distinct_states"] / data["wall_time"], rel=0.01
    )
    assert data["generated_per_second"] == pytest.approx(
        data["states_generated"] / data["wall_time"], rel=0.01
    )
    assert data["verdict"] == "PASS" and data["stopped_by"] == []
    assert data["complete_depth"] == data["max_depth"]


# -- the command --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--requests", "0"],
        ["--requests", "two"],
        ["--connectors", "a=weird"],
        ["--connectors", "a,a"],
        ["--events", "begin,teleport"],
        ["--unknown", "a", "--connectors", "a"],
        ["--no-such-option"],
        ["--requests", "9"],
        ["--max-seconds", "0"],
        ["--max-seconds", "soon"],
        ["--max-seconds", "inf"],
        ["--params=yes"],
    ],
)
def test_bad_arguments_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(argv) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--help"]) == 0
    assert "--connectors" in capsys.readouterr().out


def test_a_correct_one_saver_configuration_passes(capsys: pytest.CaptureFixture[str]) -> None:
    """One saver cannot make a request wait for a second report: not a failure of the run."""
    argv = ["--connectors", "lmcache,nixl=none", "--requests", "1", "--no-progress"]
    assert run_cli(argv) == 0
    out = capsys.readouterr().out
    assert "PASS  transitions fired" in out and "result: PASS" in out
    assert (
        "never fired, not reachable in this configuration: "
        "finishing --transfer_finished--> finishing" in out
    )
    # Asked for, every declared transition must fire: the same run fails.
    assert run_cli([*argv, "--strict-coverage"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  transitions fired" in out
    assert "never fired: finishing --transfer_finished--> finishing" in out


def test_reachable_coverage_still_fails() -> None:
    """A transition the configuration can fire, never fired, fails even without strictness."""
    reachable = reachable_in({"a": "saver", "b": "saver"}, ALPHABET)
    assert reachable(("finishing", "transfer_finished", "finishing"))
    assert not reachable_in({"a": "saver"}, ALPHABET)(("finishing", "connector_gone", "finishing"))
    assert not reachable_in(SMALL, {"begin", "request_finished"})(
        ("pending", "cancel", "cancelled")
    )
    # Reachable by any call that fires the event (machine.CALL_EVENTS): told, or in a batch.
    told = reachable_in(SMALL, {"begin", "request_finished_by", "cancel"})
    assert told(("pending", "request_finished", "finishing"))
    assert told(("cancelled", "transfer_finished", "cancelled")) is False  # nothing reports
    batch = reachable_in(SMALL, {"begin", "request_finished", "transfer_finished_many"})
    assert batch(("finishing", "transfer_finished", "finished"))
    assert not batch(("finishing", "connector_gone", "finished"))  # nothing unregisters
    # A patched table that never leaves finishing by a report: that one is reachable, so FAIL.
    bug = next(b for b in CATALOG if b.name == "last report does not finish")
    with bug.installed() as factory:
        report = check_aggregator(SMALL, requests=1, factory=factory)
    fired = report.result("transitions fired")
    assert not fired.passed
    assert "never fired: finishing --transfer_finished--> finished" in fired.message


@pytest.mark.parametrize(
    ("bound", "stop"),
    [(["--max-states", "10"], "max states"), (["--max-seconds", "0.2"], "max seconds")],
)
def test_a_search_cut_short_is_inconclusive_exit_3(
    bound: list[str], stop: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli([*bound, "--no-progress"]) == 3
    out = capsys.readouterr().out
    assert f"search: NOT complete ({stop} hit): every event sequence of up to " in out
    assert "result: INCONCLUSIVE (no violation within " in out
    assert "SKIP  transitions fired" in out and "PASS  transitions fired" not in out


def test_max_seconds_stops_cleanly_with_the_complete_depth() -> None:
    full = check_aggregator(SMALL, requests=1)
    cut = check_aggregator(SMALL, requests=1, max_seconds=0.05)
    assert cut.stopped_by == ("max seconds",) and not cut.finished
    assert cut.verdict == "INCONCLUSIVE" and cut.ok
    assert cut.wall_time < 5
    assert 0 < cut.distinct_states < full.distinct_states
    assert cut.complete_depth < full.max_depth
    # Every sequence of up to complete_depth events was explored: every state that shallow
    # was found (a search bounded there finds no more).
    bounded = check_aggregator(SMALL, requests=1, max_depth=cut.complete_depth)
    assert bounded.distinct_states <= cut.distinct_states
    assert f"every event sequence of up to {cut.complete_depth} event" in cut.explored()


EIGHT_RANKS = "lmcache," + ",".join(f"p2p@{rank}" for rank in range(8))


def test_max_seconds_holds_on_eight_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    """``--max-seconds 5`` on a cache and eight ranks with two requests: inconclusive (exit 3)
    in under 7 s, set-up, search, trap search and report included."""
    argv = ["--connectors", EIGHT_RANKS, "--requests", "2", "--max-seconds", "5", "--no-progress"]
    start = time.perf_counter()
    assert run_cli(argv) == 3
    assert time.perf_counter() - start < 7
    out = capsys.readouterr().out
    assert "search: NOT complete (max seconds hit)" in out and "result: INCONCLUSIVE" in out


def test_a_budget_the_set_up_spent_stops_after_the_initial_state() -> None:
    report = check_aggregator(SMALL, requests=1, max_seconds=1e-9)
    assert report.verdict == "INCONCLUSIVE" and report.stopped_by == ("max seconds",)
    assert report.distinct_states == 1 and report.complete_depth == 0
    assert report.bounds["max seconds"] == 1e-9  # the bound as given, not what was left of it


def test_the_trap_search_keeps_to_the_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Out of time in the trap search: no trap is claimed that a spared edge might undo, and
    the search says it was cut short. Two independent switches; both on is the goal; the state
    reached by the second switch first sleeps on the first, so only the trap search finds its
    way to the goal."""

    def events(m: list[int]) -> list[int]:
        return [i for i in (0, 1) if not m[i]]

    def apply(m: list[int], i: int) -> None:
        m[i] = 1

    def search(**kwargs: Any) -> Any:
        return engine.explore(
            lambda: [0, 0],
            events,
            apply,
            tuple,
            goal=lambda m: m == [1, 1],
            config=engine.SearchConfig(independent=lambda a, b: a != b, **kwargs),
        )

    assert search().verdict == "PASS" and search().reexpanded == 1
    real = engine.search._Search.expand_traps

    def late(self: Any, good: bytearray) -> bytearray:
        self.deadline = 0.0  # already past when the trap search starts
        return real(self, good)

    monkeypatch.setattr(engine.search._Search, "expand_traps", late)
    report = search(max_seconds=60)
    assert report.stopped_by == ("max seconds",) and report.result("no trap").passed
    assert report.verdict == "INCONCLUSIVE" and report.reexpanded == 0


def test_a_max_depth_bound_is_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--max-depth", "3", "--requests", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "search: bounded by max depth: every event sequence of up to 3 events" in out
    assert "result: PASS (bounded: every sequence of up to 3 events)" in out


def test_a_violation_exits_1_even_when_cut_short(capsys: pytest.CaptureFixture[str]) -> None:
    bug = next(b for b in CATALOG if b.name == "finished request never dropped")
    with bug.installed() as factory:
        report = check_aggregator(SMALL, requests=1, factory=factory, max_states=200)
    assert not report.finished and report.verdict == "FAIL"
    assert EXIT_STATUS[report.verdict] == 1


def test_python_dash_m_runs_the_command(tmp_path: Path) -> None:
    out = tmp_path / "check.json"
    run = subprocess.run(
        [sys.executable, "-m", "multiconnector", "check", "--requests", "1", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "result: PASS" in run.stdout
    assert json.loads(out.read_text())["ok"] is True


def test_unwritable_json_path_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    argv = ["--connectors", "a", "--requests", "1", "--json", str(blocker / "check.json")]
    assert run_cli(argv) == 2
    err = capsys.readouterr().err
    assert "argument --json" in err and "is not a folder" in err and len(err.splitlines()) == 1


# -- arguments of the API -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "needle"),
    [
        ({"connectors": {}}, InvalidArgumentError, "connectors={}"),
        ({"connectors": {"a": "sometimes"}}, InvalidArgumentError, "connectors['a']='sometimes'"),
        ({"connectors": {3: "saver"}}, InvalidNameError, "connectors key=3"),
        ({"requests": 0}, InvalidArgumentError, "requests=0"),
        ({"requests": True}, InvalidArgumentError, "requests=True"),
        ({"unknown": "ghost"}, InvalidArgumentError, "unknown='ghost'"),
        ({"unknown": ["a"]}, InvalidArgumentError, "names a connector: 'a'"),
        ({"events": ["begin", "jump"]}, InvalidArgumentError, "unknown kinds ['jump']"),
        ({"events": ["loading"]}, InvalidArgumentError, "'load_finished', 'split_load']"),
        ({"symmetry": 1}, InvalidArgumentError, "symmetry=1"),
        ({"params": "yes"}, InvalidArgumentError, "params='yes'"),
        ({"max_depth": 0}, InvalidArgumentError, "max_depth=0"),
        ({"factory": lambda registry, **kw: object()}, InvalidArgumentError, "factory returned"),
    ],
)
def test_bad_api_arguments_raise_typed_errors(
    kwargs: dict[str, Any], error: type[Exception], needle: str
) -> None:
    kwargs.setdefault("connectors", {"a": "saver"})
    with pytest.raises(error, match=re.escape(needle)):
        check_aggregator(**kwargs)


def test_factory_gets_a_traced_single_stripe_aggregator() -> None:
    made: list[MultiConnector] = []

    def factory(registry: Any, **options: Any) -> MultiConnector:
        assert options == {"trace": True, "stripes": 1}
        made.append(MultiConnector(registry, **options))
        return made[-1]

    report = check_aggregator({"a": "saver"}, requests=1, events={"begin", "take"}, factory=factory)
    assert report.result("no exception").passed and made


# -- the engine, on a machine of its own ---------------------------------------------------------


class Light:
    """A traffic light that counts its cycles, up to a bound."""

    def __init__(self) -> None:
        self.state = "red"
        self.cycles = 0
        self.fired: list[tuple[str, str, str]] = []


LIGHT = Machine(
    model=None,
    states=["red", "green", "yellow", "broken"],
    initial="red",
    transitions=[
        {"trigger": "go", "source": "red", "dest": "green"},
        {"trigger": "slow", "source": "green", "dest": "yellow"},
        {"trigger": "stop", "source": "yellow", "dest": "red"},
        {"trigger": "smash", "source": "*", "dest": "broken"},
    ],
    auto_transitions=False,
)


def light_apply(light: Light, trigger: str) -> None:
    source = light.state
    LIGHT.events[trigger].trigger(light)
    if trigger == "stop":
        light.cycles += 1
    light.fired = [(source, trigger, light.state)]


def light_events(light: Light) -> list[str]:
    return [t for t in LIGHT.get_triggers(light.state) if light.cycles < 2 or t != "go"]


def test_explore_counts_every_state_of_a_small_machine() -> None:
    def not_too_many_cycles(light: Light) -> bool:
        """at most two cycles"""
        return light.cycles <= 2

    report = explore(
        Light,
        light_events,
        light_apply,
        lambda light: (light.state, light.cycles),
        {"cycles": not_too_many_cycles},
        goal=lambda light: light.state in {"red", "broken"},
        machine=LIGHT,
        fired=lambda light: light.fired,
    )
    assert report.ok, report.to_text()
    # red0 green0 yellow0 red1 green1 yellow1 red2, and broken after 0, 1 or 2 cycles.
    assert report.distinct_states == 10
    assert report.max_depth == 7  # red2 --smash--> broken2
    assert report.result("cycles").description == "at most two cycles"
    counts = {(c.source, c.event, c.dest): c.count for c in report.coverage}
    assert counts[("red", "go", "green")] == 2
    assert counts[("broken", "smash", "broken")] == 3
    assert all(c.declared for c in report.coverage)


def test_explore_reports_the_shortest_counterexample() -> None:
    def at_most_one_cycle(light: Light) -> str | None:
        return None if light.cycles <= 1 else f"{light.cycles} cycles"

    report = explore(
        Light,
        light_events,
        light_apply,
        lambda light: (light.state, light.cycles),
        {"one cycle": at_most_one_cycle},
        describe=lambda light: f"{light.state}/{light.cycles}",
        label=str,
    )
    result = report.result("one cycle")
    assert not result.passed and result.message == "2 cycles"
    assert result.counterexample is not None
    assert [s.event for s in result.counterexample.steps] == ["go", "slow", "stop"] * 2
    assert result.counterexample.steps[-1].state == "red/2"
    assert result.counterexample.initial == "red/0"
    assert "  6. stop  -> red/2" in report.to_text()


def test_explore_reports_exceptions_assertions_and_traps() -> None:
    def apply(light: Light, trigger: str) -> None:
        if light.state == "yellow" and trigger == "smash":
            raise RuntimeError("glass everywhere")
        light_apply(light, trigger)

    def never_broken(light: Light) -> None:
        assert light.state != "broken", "the light broke"

    report = explore(
        Light,
        light_events,
        apply,
        lambda light: (light.state, light.cycles),
        {"intact": never_broken},
        goal=lambda light: light.state == "green",
        label=str,
    )
    crash = report.result("no exception")
    assert crash.message == "RuntimeError: glass everywhere"
    assert crash.counterexample is not None
    assert [s.event for s in crash.counterexample.steps] == ["go", "slow", "smash"]
    assert crash.counterexample.steps[-1].state.startswith("raised RuntimeError")
    assert report.result("intact").message.startswith("the light broke")
    assert len(report.result("intact").counterexample or ()) == 1
    trap = report.result("no trap")  # broken can never turn green again
    assert not trap.passed and [s.event for s in trap.counterexample.steps] == ["smash"]  # type: ignore[union-attr]


def test_explore_ways_out_limits_the_escape_routes() -> None:
    report = explore(
        Light,
        light_events,
        light_apply,
        lambda light: (light.state, light.cycles),
        goal=lambda light: light.state == "broken",
        ways_out=lambda trigger: trigger != "smash",
    )
    trap = report.result("no trap")
    assert not trap.passed
    assert trap.counterexample is not None and len(trap.counterexample) == 0  # red0 is a trap


def test_explore_detects_a_nondeterministic_model() -> None:
    ticks = iter(range(10**6))

    with pytest.raises(engine.NondeterminismError, match="replaying the path to state"):
        explore(
            Light,
            light_events,
            light_apply,
            lambda light: (light.state, light.cycles, next(ticks) if light.cycles else 0),
        )


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"initial": None}, "initial=None"),
        ({"events": 3}, "events=3"),
        ({"invariants": {"x": 3}}, "invariants="),
        ({"invariants": [lambda light: True]}, "invariants="),
        ({"goal": "green"}, "goal='green'"),
        ({"machine": LIGHT}, "must be given together"),
        ({"expected": True}, "expected=True"),
        ({"config": {"max_states": 1}}, "config={'max_states': 1}"),
    ],
)
def test_explore_rejects_bad_arguments(kwargs: dict[str, Any], needle: str) -> None:
    arguments: dict[str, Any] = {
        "initial": Light,
        "events": light_events,
        "apply": light_apply,
        "snapshot": lambda light: (light.state, light.cycles),
        **kwargs,
    }
    with pytest.raises(InvalidArgumentError, match=re.escape(needle)):
        explore(**arguments)


@pytest.mark.parametrize(
    ("kwargs", "needle", "error"),
    [
        ({"max_states": 0}, "max_states=0", InvalidValueError),
        ({"max_depth": "3"}, "max_depth='3'", InvalidArgumentError),
        ({"keep_models": -1}, "keep_models=-1", InvalidValueError),
        ({"progress": "yes"}, "progress='yes'", InvalidArgumentError),
        ({"max_seconds": 0}, "max_seconds=0", InvalidValueError),
        ({"max_seconds": float("inf")}, "max_seconds=inf", InvalidValueError),
        ({"max_seconds": "1"}, "max_seconds='1'", InvalidArgumentError),
        ({"independent": 1}, "independent=1", InvalidArgumentError),
        ({"actor": len, "independent": max}, "not both", InvalidArgumentError),
        ({"views": len}, "views needs actor", InvalidArgumentError),
        ({"title": 3}, "title=3", InvalidArgumentError),
        ({"bounds": [1]}, "bounds=[1]", InvalidArgumentError),
    ],
)
def test_a_search_config_checks_every_field_once_made(
    kwargs: dict[str, Any], needle: str, error: type[Exception]
) -> None:
    with pytest.raises(error, match=re.escape(needle)) as caught:
        engine.SearchConfig(**kwargs)
    assert isinstance(caught.value, InvalidArgumentError)
    config = engine.SearchConfig(max_states=5)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.max_states = 6  # type: ignore[misc]
    with pytest.raises(error, match=re.escape(needle)):
        attrs.evolve(config, **kwargs)  # an evolved config is checked too


def test_check_aggregator_takes_a_search_config_or_its_keywords() -> None:
    by_config = check_aggregator(SMALL, requests=1, config=engine.SearchConfig(max_depth=3))
    by_keyword = check_aggregator(SMALL, requests=1, max_depth=3)
    assert by_config.distinct_states == by_keyword.distinct_states
    assert by_config.stopped_by == by_keyword.stopped_by == ("max depth",)
    with pytest.raises(InvalidArgumentError, match="not both"):
        check_aggregator(SMALL, requests=1, max_depth=3, config=engine.SearchConfig())
    with pytest.raises(InvalidArgumentError, match="config=3"):
        check_aggregator(SMALL, requests=1, config=3)  # type: ignore[arg-type]


def test_an_invariant_returning_garbage_is_an_error() -> None:
    with pytest.raises(InvalidArgumentError, match="an invariant returned 3"):
        explore(
            Light,
            light_events,
            light_apply,
            lambda light: light.state,
            {"bad": lambda light: 3},
        )


def test_declared_transitions_reads_a_transitions_machine() -> None:
    states, transitions = declared_transitions(build_machine())
    assert states == tuple(s.value for s in STATES)
    assert ("finishing", "transfer_finished", "finishing") in transitions
    assert len(transitions) == 10  # with the two drains of cancelled
    with pytest.raises(InvalidArgumentError, match="machine="):
        declared_transitions(object())


# -- progress -----------------------------------------------------------------------------------


def test_progress_prints_plain_lines_off_a_terminal(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(engine.progress, "PROGRESS_AFTER", 0.0)
    report = check_aggregator(SMALL, requests=1, progress=True)
    err = capsys.readouterr().err
    assert report.ok
    assert re.search(r"check: depth \d+, [\d,]+ distinct states, [\d,]+ generated", err), err


def test_progress_uses_rich_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    rich_status = pytest.importorskip("rich.status")
    started: list[Any] = []

    class Status:
        def __init__(self, text: str, console: Any) -> None:
            self.texts = [text]
            started.append(self)

        def start(self) -> None:
            pass

        def update(self, text: str) -> None:
            self.texts.append(text)

        def stop(self) -> None:
            self.texts.append("stopped")

    monkeypatch.setattr(rich_status, "Status", Status)
    monkeypatch.setattr(engine.progress, "PROGRESS_AFTER", 0.0)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert check_aggregator(SMALL, requests=1, progress=True).ok
    (status,) = started
    assert any("distinct states" in t for t in status.texts) and status.texts[-1] == "stopped"


def test_no_progress_when_not_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(engine.progress, "PROGRESS_AFTER", 0.0)
    check_aggregator(SMALL, requests=1)
    assert capsys.readouterr().err == ""


# -- the how-to page ----------------------------------------------------------------------------


def test_docs_check_md_examples_run(capsys: pytest.CaptureFixture[str]) -> None:
    """Every python block of docs/check.md, top to bottom, in one namespace."""
    page = (ROOT / "docs" / "check.md").read_text(encoding="utf-8")
    code = re.findall(r"^```python\n(.*?)^```", page, flags=re.S | re.M)
    assert len(code) == 6
    namespace: dict[str, Any] = {"__name__": "docs_check"}
    for block in code:
        exec(compile(block, "docs/check.md", "exec"), namespace)
    assert re.fullmatch(r"\d+ states, depth \d+\n", capsys.readouterr().out)
    assert not namespace["trap"].passed


def test_docs_quote_the_real_text_of_a_counterexample() -> None:
    """The sample failure on the page is what the checker prints for that planted bug."""
    page = (ROOT / "docs" / "check.md").read_text(encoding="utf-8")
    (sample,) = re.findall(r"^```text\n(.*?)^```", page, flags=re.S | re.M)
    bug = next(b for b in CATALOG if b.name == "savers answering after a concurrent cancel dropped")
    with bug.installed() as factory:
        report = check_aggregator({"a": "saver", "b": "saver"}, requests=1, factory=factory)
    assert sample.rstrip("\n") in report.to_text()


def test_independence_is_by_request_and_generic_over_per_request_kinds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from multiconnector.check import scenario as check_module  # noqa: PLC0415 - patched below

    assert independent(("transfer_finished", 0, "a"), ("cancel", 1))
    assert independent(("begin", 1), ("request_finished", 0, ("a",)))
    assert not independent(("transfer_finished", 0, "a"), ("cancel", 0))
    for shared in (("take",), ("unregister", "a"), ("register", "a")):
        assert not independent(shared, ("cancel", 1))
        assert not independent(("cancel", 1), shared)
    # A new per-request kind is covered once it is listed as one; unlisted, it is dependent.
    assert not independent(("finish_asking", 0), ("cancel", 1))
    monkeypatch.setattr(check_module, "_PER_REQUEST", check_module._PER_REQUEST | {"finish_asking"})
    assert independent(("finish_asking", 0), ("cancel", 1))
    assert not independent(("finish_asking", 0), ("cancel", 0))


# -- copies instead of replays -------------------------------------------------------------------


def _figures(report: CheckReport) -> dict[str, Any]:
    data = report.to_dict()
    for timing in ("wall_time", "distinct_per_second", "generated_per_second"):
        data.pop(timing)
    return data


@pytest.mark.parametrize(
    "bound",
    [
        {},
        {"connectors": {"a": "saver", "b": "saver", "none": None, "boom": "raises"}, "requests": 1},
        # Two requests, replayed: 14 s alone (--durations, -p no:xdist).
        pytest.param(
            {"connectors": {"a": "saver", "junk": "garbage"}, "requests": 2},
            marks=pytest.mark.slow,
        ),
        {"connectors": {"a": "saver", "b": "saver"}, "requests": 1, "params": True},
        {
            "connectors": {"a": "saver", "b": "saver"},
            "requests": 1,
            "events": ALPHABET + LOAD_EVENTS,
        },
    ],
    ids=["default", "every-kind", "garbage", "params", "load"],
)
def test_copied_worlds_explore_exactly_what_replayed_ones_do(
    bound: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search copies a world instead of replaying its path (check/fork.py): the same
    states, edges, coverage counts, verdicts and report, figure for figure."""
    copied = check_aggregator(**bound)
    monkeypatch.setattr(run_module, "_fork", lambda world: None)
    replayed = check_aggregator(**bound)
    assert _figures(copied) == _figures(replayed)
    assert copied.verdict == "PASS" and copied.distinct_states > 100


def test_the_copy_knows_every_slot_of_the_aggregator() -> None:
    """The checker copies a world with the aggregator's own copy (``copy.deepcopy``); a slot
    added to the books without its line there leaves it unset in the copy: tests/test_copy.py
    fails, as the checker would."""
    mc = MultiConnector()
    assert forkable(mc)
    assert not forkable(type("Sub", (MultiConnector,), {"__slots__": ()})())
    mc.begin("r")
    record = mc.peek("r")
    mine = copy.copy(record)
    twin = copy.deepcopy(mc, {id(record): mine})
    assert twin is not None and twin.registry is not mc.registry
    assert twin.registry.entries is mc.registry.entries  # published entries are shared
    assert twin.peek("r") is mine  # the record the memo gave
    twin.begin("s")
    assert mc.peek("s") is None  # the books are its own
    mc.registry.subscribe(lambda entry: None)  # a second listener: not copied
    with pytest.raises(copy.Error):
        copy.deepcopy(mc)


def test_early_reports_chooses_which_reports_between_the_halves_are_explored() -> None:
    """``early_reports``: ``off`` explores no report that comes while request_finished asks,
    ``savers`` only those of the connectors that call asked and that said they save, ``all``
    those of every ready connector not awaited: each a superset of the one before."""
    bound: dict[str, Any] = {"connectors": {"a": "saver", "b": "saver"}, "requests": 1}
    reports = {m: check_aggregator(**bound, early_reports=m) for m in ("off", "savers", "all")}
    for report in reports.values():
        assert_all_pass(report)
    off, savers, every = (reports[m].distinct_states for m in ("off", "savers", "all"))
    assert off < savers < every
    assert reports["savers"].bounds["early reports"] == "from the savers of the call asking"
    assert reports["off"].bounds["early reports"] == "off"
    with pytest.raises(InvalidArgumentError, match="early_reports"):
        check_aggregator(**bound, early_reports="some")


def test_the_dropped_early_report_is_found_only_where_early_reports_are_explored() -> None:
    bug = next(b for b in CATALOG if b.name == "early report dropped as a phantom")
    bound: dict[str, Any] = {"connectors": {"a": "saver", "b": "saver"}, "requests": 1}
    off = check_aggregator(**bound, factory=bug.factory, early_reports="off")
    assert off.ok  # never reached: no report comes between the halves
    for mode in ("savers", "all"):
        found = check_aggregator(**bound, factory=bug.factory, early_reports=mode)
        result = found.result("right outcome")
        assert not result.passed
        assert result.counterexample is not None
        assert len(result.counterexample.steps) == 3

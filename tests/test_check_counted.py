"""The model check knows counted connectors (issue #34): a connector reported on two workers,
booked under ``<name>@1`` and ``<name>@2`` as the vLLM adapter books a child counted on fewer
workers (``multiconnector.vllm.counted``), whose reports are routed by
:func:`multiconnector.rule.counted_name`, the one decision the adapter and the checker's world
share. The real aggregator passes with them; a routing bug planted in that decision (the world
reads it from ``multiconnector.check.apply``) fails with a short trace.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from multiconnector import MultiConnector
from multiconnector.check import (
    ALPHABET,
    LOAD_EVENTS,
    RIGHT_OUTCOME,
    SPLIT_EVENTS,
    CheckReport,
    check_aggregator,
    run_cli,
)
from multiconnector.check import apply as apply_module
from multiconnector.check import run as run_module
from multiconnector.check.apply import _apply
from multiconnector.check.canonical import Enumerated
from multiconnector.check.properties import _no_leak, _right_outcome
from multiconnector.check.scenario import _APPLY_ANSWERS, COUNTED_LOAD
from multiconnector.errors import InvalidValueError
from multiconnector.machine import RequestTransferState, State
from multiconnector.rule import counted_name

pytestmark = pytest.mark.timeout(120)  # model-check bounds: longer than the default time limit

SPLIT = ALPHABET + LOAD_EVENTS + SPLIT_EVENTS
RANKS = ("c@1", "c@2")
ROOT = Path(__file__).resolve().parents[1]

Router = Callable[..., str]


# -- the rule ------------------------------------------------------------------------------------


def _record(**fields: Any) -> RequestTransferState:
    return RequestTransferState("r", **fields)


def test_a_save_report_settles_the_first_name_still_awaited() -> None:
    record = _record(state=State.finishing, awaiting=RANKS, expected=RANKS)
    assert counted_name(RANKS, record, load=False) == "c@1"
    record = _record(state=State.finishing, awaiting=("c@2",), expected=RANKS)
    assert counted_name(RANKS, record, load=False) == "c@2"


def test_a_load_report_settles_the_loader_then_the_part() -> None:
    loading = {"loader": "c@1", "parts": ("c@2",), "parts_owed": ("c@2",)}
    assert counted_name(RANKS, _record(**loading), load=True) == "c@1"
    assert counted_name(RANKS, _record(**loading, loaded=True), load=True) == "c@2"


def test_a_load_report_never_settles_a_saves_name() -> None:
    """The reviewer's case: a request that saves under the same names while it loads (here
    aborted while loading): its second load report settles the part, not the awaited c@1."""
    record = _record(
        state=State.cancelled,
        awaiting=RANKS,
        expected=RANKS,
        loader="c@1",
        loaded=True,
        parts=("c@2",),
        parts_owed=("c@2",),
    )
    assert counted_name(RANKS, record, load=True) == "c@2"
    assert counted_name(RANKS, record, load=False) == "c@1"


def test_with_nothing_owed_a_report_goes_to_the_last_name() -> None:
    assert counted_name(RANKS, None, load=False) == "c@2"
    assert counted_name(RANKS, None, load=True) == "c@2"
    assert counted_name(RANKS, _record(state=State.finished, expected=RANKS), load=False) == "c@2"
    assert counted_name(RANKS, _record(loader="c@1", loaded=True), load=True) == "c@2"


def test_the_adapter_routes_by_the_rule() -> None:
    """The vLLM adapter's counted books call the rule for saves and loads, and decide nothing
    of their own (no helper of their own picks a name)."""
    source = (ROOT / "multiconnector" / "vllm" / "counted.py").read_text(encoding="utf-8")
    calls = [
        node
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "counted_name"
    ]
    loads = sorted(
        next(k.value.value for k in call.keywords if k.arg == "load")  # type: ignore[attr-defined]
        for call in calls
    )
    assert loads == [False, True]
    assert "def _next" not in source


# -- the real aggregator -------------------------------------------------------------------------


def _passes(report: CheckReport) -> None:
    assert report.ok and report.finished, report.to_text()


@pytest.mark.parametrize(
    ("bound", "states"),
    [
        ({"connectors": {"c": "counted"}, "events": SPLIT}, 55),
        ({"connectors": {"a": "saver", "c": "counted"}}, 76),
        ({"connectors": {"a": "saver", "c": "counted"}, "events": SPLIT}, 1427),
        ({"connectors": {"c": "counted", "d": "counted"}, "events": SPLIT}, 259),
        ({"connectors": {"a": "saver", "c": "counted"}, "events": SPLIT, "params": True}, 2711),
        ({"connectors": {"c": "counted"}, "events": SPLIT, "requests": 2}, 1540),
    ],
    ids=["counted-split", "saver-counted", "saver-counted-split", "two-counted", "params", "two"],
)
def test_the_real_aggregator_passes_with_counted_connectors(
    bound: dict[str, Any], states: int
) -> None:
    report = check_aggregator(**{"requests": 1, **bound})
    _passes(report)
    assert report.distinct_states == states
    fired = {(t.source, t.event, t.dest): t.count for t in report.coverage}
    # A counted save awaits two names: the first report leaves the request finishing.
    assert fired[("finishing", "transfer_finished", "finishing")] > 0


@pytest.mark.parametrize(
    "bound",
    [
        {"connectors": {"a": "saver", "b": "saver", "c": "counted"}, "requests": 1},
        {"connectors": {"c": "counted"}, "requests": 2, "events": SPLIT},
    ],
    ids=["symmetric-savers", "two-requests-split"],
)
def test_the_search_is_the_same_without_copies_reduction_or_signatures(
    monkeypatch: pytest.MonkeyPatch, bound: dict[str, Any]
) -> None:
    """Copies, partial-order reduction and the symmetry's signatures change nothing found: a
    counted connector's names are never renamed, its reports are its request's alone."""
    copied = check_aggregator(**bound)
    _passes(copied)
    unreduced = check_aggregator(**bound, reduction=False)
    _passes(unreduced)
    assert unreduced.distinct_states == copied.distinct_states
    monkeypatch.setattr(run_module, "_fork", lambda world: None)
    monkeypatch.setattr(run_module, "_canonical_form", Enumerated)
    replayed = check_aggregator(**bound)
    figures = [(r.distinct_states, r.max_depth, r.edges) for r in (copied, replayed)]
    assert figures[0] == figures[1]


def test_two_requests_by_views_pass() -> None:
    report = check_aggregator(
        {"a": "saver", "c": "counted"}, requests=2, events=SPLIT, per_request=True
    )
    _passes(report)


# -- planted routing bugs ------------------------------------------------------------------------


def _load_settles_a_save(ranks: tuple[str, ...], record: Any, *, load: bool) -> str:
    """The bug a reviewer found in the adapter: a load report may settle a name the request
    awaits a save of, so a request that saves while it loads has its load's part owed for
    ever."""
    if record is not None:
        for rank in ranks:
            if rank in record.awaiting or (load and record.owes_load(rank)):
                return rank
    return ranks[-1]


def _always_first(ranks: tuple[str, ...], record: Any, *, load: bool) -> str:
    """Every report settles the first name: the second is awaited for ever."""
    return ranks[0]


def _planted(monkeypatch: pytest.MonkeyPatch, bug: Router, **bound: Any) -> CheckReport:
    monkeypatch.setattr(apply_module, "counted_name", bug)
    return check_aggregator({"c": "counted"}, requests=1, max_depth=8, **bound)


def _failed(report: CheckReport) -> dict[str, int]:
    """Each failed property, with its counterexample's length."""
    return {
        p.name: len(p.counterexample.steps)
        for p in report.properties
        if not p.passed and p.counterexample is not None
    }


def test_a_load_report_settling_a_save_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    report = _planted(monkeypatch, _load_settles_a_save, events=SPLIT)
    failed = _failed(report)
    assert failed == {"no leak": 5, "load once": 7, RIGHT_OUTCOME: 5}, report.to_text()
    text = report.to_text()
    assert "counted report (load) of r1 by c returned duplicate; the checker expected applied" in (
        text
    )
    assert "awaiting the load part of c@2, which owes none" in text
    # Saves alone never meet the bug: it is in the load path.
    _passes(_planted(monkeypatch, _load_settles_a_save, events=ALPHABET))


def test_a_request_aborted_while_loading_and_saving_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The reviewer's case itself, event by event: cancelled while it loads, with its saves
    awaited, the request's second load report meets the save's name (``terminal``) instead of
    draining the part, which stays owed: the properties say so on that very event."""
    monkeypatch.setattr(apply_module, "counted_name", _load_settles_a_save)
    _, world = run_module._scenario(
        {"c": "counted"}, (), 1, frozenset(SPLIT), MultiConnector, symmetry=True, params=False
    )
    path = [
        ("begin", 0),
        ("split_load", 0, "c@1", "c@2"),
        ("request_finished", 0, ("c",)),
        (_APPLY_ANSWERS, 0),
        ("cancel", 0),
        (COUNTED_LOAD, 0, "c"),
        (COUNTED_LOAD, 0, "c"),
    ]
    for event in path:
        world.sync()
        _apply(world, event)
    assert _right_outcome(world) == (
        "counted report (load) of r1 by c returned terminal; the checker expected drained"
    )
    assert "awaiting the load part of c@2, which owes none" in str(_no_leak(world))


@pytest.mark.parametrize(
    ("events", "failed"),
    [
        (ALPHABET, {"no leak": 4, RIGHT_OUTCOME: 4, "no trap": 2}),
        (SPLIT, {"no leak": 4, RIGHT_OUTCOME: 4, "no trap": 2}),
    ],
    ids=["saves", "split"],
)
def test_every_report_settling_the_first_name_is_caught(
    monkeypatch: pytest.MonkeyPatch, events: tuple[str, ...], failed: dict[str, int]
) -> None:
    report = _planted(monkeypatch, _always_first, events=events)
    assert {k: v for k, v in _failed(report).items() if k in failed} == failed, report.to_text()


# -- the arguments -------------------------------------------------------------------------------


def test_the_scenario_registers_a_counted_connector_under_its_names() -> None:
    scenario, probe = run_module._scenario(
        {"a": "saver", "c": "counted"},
        (),
        1,
        frozenset(ALPHABET),
        MultiConnector,
        symmetry=True,
        params=False,
    )
    assert list(probe.mc.registry) == ["a", "c@1", "c@2"]
    assert scenario.ranks == {"c": RANKS}
    assert scenario.batchers == ("a",)  # its names are reported by its own reports only


def test_a_name_clashing_with_a_report_name_is_refused() -> None:
    with pytest.raises(InvalidValueError, match="report name of counted connector 'c'"):
        check_aggregator({"c": "counted", "c@2": "saver"})
    with pytest.raises(InvalidValueError, match="report name of counted connector 'c'"):
        check_aggregator({"c": "counted"}, unknown=["c@1"])


def test_cli_takes_the_counted_kind(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--connectors", "a,c=counted", "--requests", "1", "--split", "--no-progress"]
    assert run_cli(argv) == 0
    out = capsys.readouterr().out
    assert "connectors a (saver), c (counted: c@1, c@2)" in out
    assert "1,427 distinct" in out
    assert "counted report" not in out  # nothing failed: no trace

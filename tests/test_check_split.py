"""The model check of split loads: two loaders for one request (``--split``).

``split_load`` is ``choose_loader(request_id, a, parts=[b])`` on a pending request, for every
ordered pair of ready connectors that may load; with it, every order of the two loaders'
reports, their early reports around a ``match_tokens``, a cancel, a ``request_finished`` and
their unregistering is explored. The real aggregator passes every property; a bug planted in
the split path is caught, with a shortest trace.
"""

from __future__ import annotations

import pytest

from multiconnector.check import ALPHABET, LOAD_EVENTS, SPLIT_EVENTS, check_aggregator
from multiconnector.check.cli import run_cli
from tests.broken_aggregators import Planted

pytestmark = pytest.mark.timeout(300)

EVENTS = ALPHABET + LOAD_EVENTS + SPLIT_EVENTS
SAVERS = {"a": "saver", "b": "saver"}


def test_the_real_aggregator_passes_with_split_loads() -> None:
    report = check_aggregator(SAVERS, requests=1, events=EVENTS)
    assert report.ok, report.to_text()
    assert report.finished
    # The split grows the load side's search: the two loaders' orders are explored.
    without = check_aggregator(SAVERS, requests=1, events=ALPHABET + LOAD_EVENTS)
    assert report.distinct_states > without.distinct_states


@pytest.mark.slow  # 85 s: a saver, a loader and a store with the load side grow the search
def test_a_load_only_connector_and_a_store_split_as_their_roles_allow() -> None:
    """A store (``Role.save``) is never one of the two loaders; a load-only connector is."""
    report = check_aggregator(
        {"a": "saver", "l": "loader", "s": "store"}, requests=1, events=EVENTS
    )
    assert report.ok, report.to_text()


PartForgottenOnTake = Planted(
    "PartForgottenOnTake",
    "_settle",
    ("parts_owed=record.parts_owed,", "parts_owed=(),"),
    doc="""Hands a terminal record back once its loader reported, the split load's other
    part still in flight: its blocks are freed while that connector writes into them.""",
)

PartAppliedTwice = Planted(
    "PartAppliedTwice",
    "_load_report",
    (
        "record.state, record.parts_owed, record.abandoned, name",
        "record.state, record.parts, record.abandoned, name",
    ),
    doc="""Decides a part's report by the parts chosen, not those still owed: every report
    of that connector is applied, a duplicate included.""",
)


@pytest.mark.parametrize(
    ("bug", "prop", "shortest"),
    [
        # begin, choose_loader(r1, a, parts=[b]), cancel, a reports: handed back while b loads
        (PartForgottenOnTake, "no early free", 4),
        # begin, choose_loader(r1, a, parts=[b]), b reports, b reports again
        (PartAppliedTwice, "load once", 4),
    ],
    ids=["part forgotten on take", "part applied twice"],
)
def test_a_bug_planted_in_the_split_path_is_caught(bug: Planted, prop: str, shortest: int) -> None:
    # Breadth first: every shorter sequence was explored before the trace found, so a bound
    # just past it keeps the trace the shortest and the check short.
    report = check_aggregator(SAVERS, requests=1, events=EVENTS, factory=bug, max_depth=6)
    failed = {p.name: p for p in report.failures}
    assert prop in failed, report.to_text()
    trace = failed[prop].counterexample
    assert trace is not None and len(trace) == shortest, report.to_text()
    assert any(step.event.startswith("choose_loader(r1") for step in trace.steps)
    # Without split loads the same aggregator passes (to the same depth): the bug is in the
    # split path alone.
    without = ALPHABET + LOAD_EVENTS
    assert check_aggregator(SAVERS, requests=1, events=without, factory=bug, max_depth=6).ok


def test_the_cli_split_flag_adds_the_split_events(capsys: pytest.CaptureFixture[str]) -> None:
    code = run_cli(["--connectors", "a,b", "--requests", "1", "--split"])
    out = capsys.readouterr().out
    assert code == 0, out
    (bounds,) = [line for line in out.splitlines() if line.startswith("bounds:")]
    assert "match_tokens, load_finished, split_load;" in bounds
    assert "PASS  no early free" in out

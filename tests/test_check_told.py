"""The model check of the told path: ``request_finished_by`` (``TOLD_EVENTS``, in ``ALPHABET``).

The vLLM adapter asks its children itself and tells the core who saves
(``request_finished_by``) and who loads (``choose_loader``, a counted child's load the split
load of its report names). With ``request_finished_by`` in the alphabet (the default one) the
check tells the core every subset of the ready savers (a counted connector's report names in its
place), and once every name that cannot report besides, amid every other event: cancels,
unregistering, a ``request_finished`` asking the same request, take. The real aggregator passes;
a bug planted in ``request_finished_by`` is caught by the told events alone, and both told-path
bugs by ``make check``'s configurations.
"""

from __future__ import annotations

import itertools

import pytest

from multiconnector import MultiConnector, Outcome, State
from multiconnector.check import (
    ALPHABET,
    LOAD_EVENTS,
    SPLIT_EVENTS,
    TOLD_EVENTS,
    check_aggregator,
)
from multiconnector.check.alike import _alike, _chosen_alike, _permuted
from multiconnector.check.cli import _parse_connectors, run_cli
from multiconnector.check.events import _events
from multiconnector.check.run import _alphabet, _scenario
from multiconnector.check.snapshot import _snapshot
from tests.broken_aggregators import CATALOG
from tests.checked import BOUND

pytestmark = pytest.mark.timeout(300)

TOLD = ALPHABET
#: The asking path alone: the default alphabet without the told events.
ASKED = tuple(e for e in ALPHABET if e not in TOLD_EVENTS)


def test_the_default_alphabet_drives_the_told_path() -> None:
    assert set(TOLD_EVENTS) <= set(ALPHABET)
    report = check_aggregator({"a": "saver", "b": "saver"}, requests=1)
    assert "request_finished_by" in report.bounds["events"]


@pytest.mark.parametrize(
    "connectors",
    [
        BOUND["connectors"],
        {"a": "saver", "g": "garbage", "x": "raises"},
        {"a": "saver", "c": "counted", "none": None},
        {"s": "store", "l": "loader"},
    ],
    ids=["savers-none", "garbage-raises", "counted", "roles"],
)
def test_the_real_aggregator_passes_with_the_told_path(connectors: dict[str, str | None]) -> None:
    report = check_aggregator(connectors, requests=1, events=TOLD)
    assert report.ok and report.finished, report.to_text()
    # The told calls add transitions (and states: names abandoned at once) to the asked ones.
    asked = check_aggregator(connectors, requests=1, events=ASKED)
    assert report.states_generated > asked.states_generated


def test_the_real_aggregator_passes_with_two_requests_told() -> None:
    report = check_aggregator({"a": "saver", "b": "saver"}, requests=2, events=TOLD)
    assert report.ok and report.finished, report.to_text()


def test_the_told_path_with_counted_split_loads_passes() -> None:
    events = TOLD + LOAD_EVENTS + SPLIT_EVENTS
    report = check_aggregator({"a": "saver", "c": "counted"}, requests=1, events=events)
    assert report.ok and report.finished, report.to_text()


def test_the_told_events_are_every_subset_and_once_every_name_that_cannot_report() -> None:
    connectors = {"a": "saver", "c": "counted", "none": None}
    _, world = _scenario(
        dict(connectors),
        ("ghost",),
        1,
        _alphabet(TOLD),
        MultiConnector,
        symmetry=False,
        params=False,
    )
    told = [e for e in _events(world) if e[0] == "request_finished_by"]
    assert told == [
        ("request_finished_by", 0, ()),
        ("request_finished_by", 0, ("a",)),
        ("request_finished_by", 0, ("c@1", "c@2")),
        ("request_finished_by", 0, ("a", "c@1", "c@2")),
        ("request_finished_by", 0, ("a", "c@1", "c@2"), True),
    ]
    # Applied to a begun request: every name that cannot report is expected and abandoned.
    world.mc.begin("r1")
    outcome = world.mc.request_finished_by(
        "r1", ("a", "c@1", "c@2", "none", "ghost"), allow_unregistered=True
    )
    record = world.mc.get("r1")
    assert outcome is Outcome.applied and record is not None
    assert (record.state, record.awaiting, record.abandoned) == (
        State.finishing,
        ("a", "c@1", "c@2"),
        ("none", "ghost"),
    )


def test_a_bug_in_request_finished_by_is_found_by_the_told_events_alone() -> None:
    bug = next(b for b in CATALOG if b.name == "told path takes no claim")
    with bug.installed() as factory:
        asked = check_aggregator(**BOUND, events=ASKED, factory=factory)
        told = check_aggregator(**BOUND, factory=factory)  # the default alphabet
    assert asked.ok  # the asked path never calls request_finished_by
    result = told.result("no early free")
    assert not result.passed and result.counterexample is not None
    assert len(result.counterexample) == 3
    text = told.to_text()
    assert "request_finished_by(r1, [])" in text


def test_the_cli_takes_the_told_events(capsys: pytest.CaptureFixture[str]) -> None:
    events = ",".join(TOLD)
    status = run_cli(["--connectors", "a,b", "--requests", "1", "--events", events])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "request_finished_by" in out


#: ``make check``'s configurations that drive the told path's two entries, as check_aggregator's
#: arguments: ``multiconnector check`` (the default bound) and the Makefile's split-load line
#: (``--requests 1 --connectors a,c=counted,none=none --load --split``).
MAKE_CHECK_DEFAULT: dict[str, object] = {}
MAKE_CHECK_SPLIT: dict[str, object] = {
    "connectors": {"a": "saver", "c": "counted", "none": None},
    "requests": 1,
    "events": ALPHABET + LOAD_EVENTS + SPLIT_EVENTS,
}


@pytest.mark.parametrize(
    ("bug_name", "bound", "shortest"),
    [
        ("told path takes no claim", MAKE_CHECK_DEFAULT, 3),
        ("split load's part dropped", MAKE_CHECK_SPLIT, 4),
    ],
    ids=["request_finished_by", "choose_loader-parts"],
)
def test_make_checks_configurations_find_each_told_path_bug(
    bug_name: str, bound: dict[str, object], shortest: int
) -> None:
    bug = next(b for b in CATALOG if b.name == bug_name)
    # Breadth first, two events deeper than the trace: the whole search finds the same
    # shortest trace at the same depth (with a planted bug it may not end: states pile up).
    with bug.installed() as factory:
        report = check_aggregator(**bound, factory=factory, max_depth=shortest + 2)  # type: ignore[arg-type]
    result = report.result(bug.prop)
    assert not result.passed and result.counterexample is not None, report.to_text()
    assert len(result.counterexample) == shortest


#: ``make check``'s eight-rank lines: a cache and eight interchangeable ranks.
EIGHT_RANKS = "lmcache,p2p@0,p2p@1,p2p@2,p2p@3,p2p@4,p2p@5,p2p@6,p2p@7"


def test_the_told_events_alike_under_symmetry_are_chosen_not_arranged() -> None:
    """After a told event, every told event naming as many of a class's interchangeable ranks
    is spared (a renaming of it leads to a renamed state), and nothing else: the choices
    ``_chosen_alike`` makes are exactly the arrangements ``_permuted`` makes, made cheaply."""
    _, world = _scenario(
        _parse_connectors(EIGHT_RANKS),
        ("ghost",),
        1,
        _alphabet(TOLD),
        MultiConnector,
        symmetry=True,
        params=False,
    )
    _snapshot(world)  # the renamings that map the state onto itself (world.fixed)
    automorphisms, classes = world.fixed
    (nine,) = classes  # before any event, the cache and the ranks are interchangeable
    assert set(nine) == set(EIGHT_RANKS.split(","))
    position = {name: i for i, (name, _) in enumerate(world.registry)}
    for k in range(10):
        for event in (
            ("request_finished_by", 0, nine[:k]),
            ("request_finished_by", 0, nine[9 - k :], True),
            ("request_finished", 0, nine[:k]),
        ):
            chosen = _chosen_alike(event, classes, position)
            assert chosen is not None and chosen[0] == event
            assert sorted(chosen) == sorted(_permuted(event, classes, position))
            assert len(set(chosen)) == len(chosen) == len(list(itertools.combinations(nine, k)))
    told = ("request_finished_by", 0, nine[:4], True)
    spared = {e for e in _alike(world, told) if e[0] == "request_finished_by"}
    assert automorphisms and spared == {
        ("request_finished_by", 0, four, True) for four in itertools.combinations(nine, 4)
    }


def test_the_alike_told_events_keep_states_and_verdicts_without_the_reduction() -> None:
    """A cache and four interchangeable ranks: the alike told events are spared (not applied),
    and the search finds the states and verdicts it finds without any reduction."""
    bound = {"connectors": _parse_connectors(EIGHT_RANKS.rsplit(",", 4)[0]), "requests": 1}
    reduced = check_aggregator(**bound)  # type: ignore[arg-type]
    full = check_aggregator(**bound, reduction=False)  # type: ignore[arg-type]
    assert reduced.verdict == full.verdict == "PASS"
    assert reduced.distinct_states == full.distinct_states
    assert reduced.alike > 0
    assert reduced.states_generated + reduced.pruned + reduced.alike == full.states_generated

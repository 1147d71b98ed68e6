"""Settled records forget what nothing reads again (``forget``, on by default): the same verdicts.

A finished or cancelled record outside a call's window keeps only its awaited names in the state
(and a finished one not whether it was cancelled): the argument is in
:func:`multiconnector.check.snapshot._part`. Held to the search without it on every planted bug
of the tests (``tests/broken_aggregators.py``, the split path's, the counted connectors', the
coupled requests'): the same properties fail, each with a trace of the same length; and on the
real aggregator, which passes either way in fewer states with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from multiconnector import MultiConnector
from multiconnector.check import (
    ALPHABET,
    LOAD_EVENTS,
    SPLIT_EVENTS,
    CheckReport,
    check_aggregator,
    run_cli,
)
from multiconnector.check import apply as apply_module
from multiconnector.errors import InvalidArgumentError
from tests.broken_aggregators import CATALOG, Broken, Planted
from tests.checked import BOUND, checked_bug, is_load
from tests.test_check_counted import _always_first, _load_settles_a_save
from tests.test_check_split import PartAppliedTwice, PartForgottenOnTake
from tests.test_check_views import CancelCancelsEveryone

pytestmark = pytest.mark.timeout(600)

SPLIT = ALPHABET + LOAD_EVENTS + SPLIT_EVENTS


def _failed(report: CheckReport) -> dict[str, int]:
    """Each failed property, with its counterexample's length (0: a coverage property)."""
    return {p.name: len(p.counterexample or ()) for p in report.properties if not p.passed}


def _compare(forgetting: CheckReport, keeping: CheckReport) -> None:
    """The same verdict, the same failed properties with traces of the same length, and no more
    states with forget than without."""
    assert forgetting.verdict == keeping.verdict, (forgetting.to_text(), keeping.to_text())
    assert _failed(forgetting) == _failed(keeping), (forgetting.to_text(), keeping.to_text())
    assert forgetting.distinct_states <= keeping.distinct_states


#: The planted bugs' bounds: the tests' one (one request, complete), and two requests to depth 6
#: (4 with params: the savers' answers multiply the events).
BOUNDS = {"1-request": {"requests": 1}, "2-depth-6": {"requests": 2, "max_depth": 6}}


@pytest.mark.parametrize(
    ("bound", "bug"),
    [
        pytest.param(
            bound,
            bug,
            id=f"{name}-{bug.name}",
            # A load bug's search: 8,000 to 10,500 states each way (10 s or more): make test-slow.
            marks=[pytest.mark.slow] if is_load(bug) and bug.connectors is None else [],
        )
        for name, bound in BOUNDS.items()
        for bug in CATALOG
    ],
)
def test_every_planted_bug_fails_alike_with_and_without_forget(
    bug: Broken, bound: dict[str, Any]
) -> None:
    if bug.params and bound["requests"] == 2:
        bound = {**bound, "max_depth": 4}
    _compare(checked_bug(bug, **bound), checked_bug(bug, **bound, forget=False))


@contextmanager
def _unchanged() -> Iterator[None]:
    yield


@contextmanager
def _routed(router: Callable[..., str]) -> Iterator[None]:
    """A counted connector's reports routed by a planted ``counted_name`` (test_check_counted)."""
    saved = apply_module.counted_name
    apply_module.counted_name = router
    try:
        yield
    finally:
        apply_module.counted_name = saved


#: The planted bugs of the other test files: (id, the factory, how to install it, the bound).
OTHERS: list[tuple[str, Callable[..., MultiConnector], Callable[[], Any], dict[str, Any]]] = [
    (
        "part forgotten on take",
        PartForgottenOnTake,
        _unchanged,
        {"connectors": {"a": "saver", "b": "saver"}, "events": SPLIT, "max_depth": 6},
    ),
    (
        "part applied twice",
        PartAppliedTwice,
        _unchanged,
        {"connectors": {"a": "saver", "b": "saver"}, "events": SPLIT, "max_depth": 6},
    ),
    (
        "cancel cancels everyone",
        CancelCancelsEveryone,
        _unchanged,
        {"connectors": BOUND["connectors"], "requests": 2, "max_depth": 6},
    ),
    (
        "a load report settles a save",
        MultiConnector,
        lambda: _routed(_load_settles_a_save),
        {"connectors": {"c": "counted"}, "events": SPLIT, "max_depth": 8},
    ),
    (
        "every report settles the first name",
        MultiConnector,
        lambda: _routed(_always_first),
        {"connectors": {"c": "counted"}, "max_depth": 8},
    ),
]


@pytest.mark.parametrize(
    ("factory", "installed", "bound"),
    [pytest.param(f, i, b, id=name) for name, f, i, b in OTHERS],
)
def test_the_other_planted_bugs_fail_alike_with_and_without_forget(
    factory: Callable[..., MultiConnector],
    installed: Callable[[], Any],
    bound: dict[str, Any],
) -> None:
    bound = {"requests": 1, **bound}
    if isinstance(factory, Planted):
        factory.build()  # a planted source line: built here, as Broken.installed does
    with installed():
        forgetting = check_aggregator(**bound, factory=factory)
        keeping = check_aggregator(**bound, factory=factory, forget=False)
    assert forgetting.verdict == "FAIL"
    _compare(forgetting, keeping)


@pytest.mark.parametrize(
    "bound",
    [
        {"connectors": {"a": "saver", "b": "saver"}, "requests": 2},
        {"connectors": {"disk": "saver", "pd@0": "saver", "broken": None}, "requests": 1},
        {"connectors": {"a": "saver", "c": "counted", "none": None}, "requests": 1},
    ],
    ids=["default", "none-slot", "counted"],
)
def test_the_real_aggregator_passes_in_fewer_states(bound: dict[str, Any]) -> None:
    forgetting = check_aggregator(**bound)
    keeping = check_aggregator(**bound, forget=False)
    assert forgetting.ok and keeping.ok and forgetting.finished and keeping.finished
    assert forgetting.distinct_states < keeping.distinct_states
    assert forgetting.bounds["settled records"] != keeping.bounds["settled records"]


def test_the_cli_turns_it_off(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--connectors", "a,b", "--requests", "1", "--no-progress"]
    assert run_cli(argv) == 0
    forgetting = capsys.readouterr().out
    assert run_cli([*argv, "--no-forget"]) == 0
    keeping = capsys.readouterr().out
    assert "keep only what is read again" in forgetting and "keep every name" in keeping


def test_forget_must_be_a_bool() -> None:
    with pytest.raises(InvalidArgumentError, match="forget="):
        check_aggregator(requests=1, forget="no")  # type: ignore[arg-type]


#: The realistic configuration a user's CI runs (docs/check.md), early reports on.
REALISTIC = {"disk": "saver", "pd@0": "saver", "pd@1": "saver", "broken": None}


@pytest.mark.slow  # about 125 s on a loaded machine: make test-slow
@pytest.mark.timeout(1200)
def test_the_realistic_configuration_fits_in_45000_states() -> None:
    report = check_aggregator(REALISTIC, requests=2)
    assert report.ok and report.finished, report.to_text()
    assert "request_finished_by" in report.bounds["events"]
    assert report.distinct_states <= 45_000

"""``multiconnector check --health``: each child's health machine explored with everything else.

The real aggregator and a real :class:`~multiconnector.healthbook.HealthBook` pass; each planted
bug of ``tests/broken_books.py`` fails the property meant, with its shortest trace.
"""

from __future__ import annotations

from typing import Any

import pytest

from multiconnector import InvalidArgumentError
from multiconnector.check import ALPHABET, BREAKER_KEPT, LOAD_EVENTS, check_aggregator, run_cli
from multiconnector.check import run as run_module
from multiconnector.check.breaker import DECLARED, HEALTH_EVENTS
from multiconnector.health import HEALTH_TRANSITIONS, Health
from tests.broken_books import OpeningAbandonsSaves, failed_probe_closes

pytestmark = pytest.mark.timeout(120)  # model-check bounds: longer than the default time limit

#: One saver that loads, one request, the load side and health: every health state meets every
#: state of a request's saves and load.
LOAD_BOUND: dict[str, Any] = {
    "connectors": {"a": "saver"},
    "requests": 1,
    "events": ALPHABET + LOAD_EVENTS,
    "health": True,
}


def test_the_real_code_passes_with_health_and_the_load_side() -> None:
    report = check_aggregator(**LOAD_BOUND)
    assert report.ok, report.to_text()
    assert report.finished
    assert report.result(BREAKER_KEPT).passed
    assert report.distinct_states == 1_710
    text = report.to_text()
    assert "failure, cooled" in text and "threshold 2, probes 1" in text


def test_the_cli_checks_health_with_two_savers(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--health", "--requests", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "6,300 distinct" in out
    assert f"PASS  {BREAKER_KEPT}" in out


def test_without_health_the_check_is_unchanged() -> None:
    report = check_aggregator(requests=1, max_depth=4)
    assert all(p.name != BREAKER_KEPT for p in report.properties)
    assert "failure" not in report.to_text()


def test_every_declared_health_transition_is_known_to_the_check() -> None:
    # self-loops ("=") and every source of a list: the set the property compares with
    for t in HEALTH_TRANSITIONS:
        sources = t["source"] if isinstance(t["source"], list) else [t["source"]]
        for source in sources:
            dest = source if t["dest"] == "=" else t["dest"]
            assert (Health(source), t["trigger"], Health(dest)) in DECLARED
    assert (Health.half_open, "failure", Health.closed) not in DECLARED
    assert HEALTH_EVENTS == ("failure", "cooled")


def test_opening_that_abandons_its_saves_frees_early() -> None:
    report = check_aggregator(**LOAD_BOUND, health_book=OpeningAbandonsSaves)
    result = report.result("no early free")
    assert not result.passed
    trace = result.counterexample
    assert trace is not None and len(trace) == 4, report.to_text()
    # begin, request_finished_by(r1, [a]), failure(a) twice: a opens with a save owed
    assert [s.event for s in trace.steps][-2:] == ["failure(a)", "failure(a)"]
    assert report.result(BREAKER_KEPT).passed  # the health machine itself moved as declared


def test_a_failed_probe_that_closes_breaks_the_breaker() -> None:
    report = check_aggregator(**LOAD_BOUND, health_book=failed_probe_closes)
    result = report.result(BREAKER_KEPT)
    assert not result.passed
    trace = result.counterexample
    assert trace is not None and len(trace) == 4, report.to_text()
    assert "half_open -> closed on failure" in (result.message or "")
    assert [p.name for p in report.failures] == [BREAKER_KEPT]


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [({"health": "yes"}, "health"), ({"health": True, "health_book": 3}, "health_book")],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], named: str) -> None:
    with pytest.raises(InvalidArgumentError, match=named):
        check_aggregator(requests=1, **kwargs)


def test_bad_cli_use_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--health=yes"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert "--health" in err


def test_copied_worlds_with_a_book_explore_exactly_what_replayed_ones_do(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under health the search copies a world's book too (check/fork.py): the same states,
    edges and verdicts as replaying every path."""
    copied = check_aggregator(**LOAD_BOUND)
    monkeypatch.setattr(run_module, "_fork", lambda world: None)
    replayed = check_aggregator(**LOAD_BOUND)
    figures = [(r.distinct_states, r.edges, r.max_depth, r.verdict) for r in (copied, replayed)]
    assert figures[0] == figures[1] == (1_710, figures[0][1], figures[0][2], "PASS")
    assert [p.passed for p in copied.properties] == [p.passed for p in replayed.properties]

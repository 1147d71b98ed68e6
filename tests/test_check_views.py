"""The search by views (``check_aggregator(per_request=True)``, ``--per-request``).

Each request's view (the registry and its own record) is explored once instead of every
combination of the requests' states. These tests hold it to the whole search: the same verdicts
and the same shortest traces on every planted bug and on the real aggregator, the assumption it
rests on checked (``actors apart``) and caught when a planted bug breaks it, and the generic
``explore(config=SearchConfig(views=...))`` equal to the whole search on a small model of its own.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Iterator
from typing import Any

import pytest

from multiconnector import MultiConnector
from multiconnector._explore import ACTORS_APART, NO_TRAP, SearchConfig, explore
from multiconnector.check import ALPHABET, LOAD_EVENTS, check_aggregator
from multiconnector.check.cli import run_cli
from multiconnector.errors import InvalidArgumentError
from tests.broken_aggregators import CATALOG, Broken

pytestmark = pytest.mark.timeout(300)

BOUND: dict[str, str | None] = {"a": "saver", "b": "saver", "none": None}
#: A batch reports the same request twice only with one request (with two, a batch is the pair):
#: the whole search with two requests passes it too (tests/test_check_broken.py).
ONE_REQUEST_ONLY = frozenset({"batch applies a duplicate twice"})
LOAD_BUGS = [b for b in CATALOG if b.events is not None]
#: Every planted bug but two of the three load ones; the load one checked (about 25 s with two
#: requests, pytest --durations, load average about 2.5) in make test-slow.
BUGS = [pytest.param(b, id=b.name) for b in CATALOG if b.events is None] + [
    pytest.param(b, id=b.name, marks=pytest.mark.slow) for b in LOAD_BUGS[:1]
]


def _statuses(report: Any) -> dict[str, tuple[str, int]]:
    return {p.name: (p.status, len(p.counterexample or ())) for p in report.properties}


@pytest.mark.parametrize("bug", BUGS)
def test_each_planted_bug_is_caught_by_views_with_its_shortest_trace(bug: Broken) -> None:
    """Two requests, complete: the bug's property fails with its known shortest trace (one
    request's), and the verdict of every property is the one-request search's."""
    connectors = bug.connectors or BOUND
    with bug.installed() as factory:
        views = check_aggregator(
            connectors, requests=2, **bug.options(), factory=factory, per_request=True
        )
        one = check_aggregator(connectors, requests=1, **bug.options(), factory=factory)
    assert views.finished
    assert views.result(ACTORS_APART).passed  # the planted bugs keep requests apart
    result = views.result(bug.prop)
    if bug.name in ONE_REQUEST_ONLY:
        assert result.passed and views.verdict == "PASS"
        return
    assert not result.passed, views.to_text()
    assert len(result.counterexample or ()) == bug.shortest
    mine, theirs = _statuses(views), _statuses(one)
    del mine[ACTORS_APART]
    # Coverage may fail in more ways with two requests (a transition fired next to another).
    coverage = ("states reached", "transitions fired")
    assert {k: v for k, v in mine.items() if k not in coverage} == {
        k: v for k, v in theirs.items() if k not in coverage
    }


@pytest.mark.parametrize(
    ("connectors", "events", "params"),
    [
        (BOUND, None, False),
        ({"a": "saver", "b": "saver"}, ALPHABET + LOAD_EVENTS, False),
        ({"a": "saver", "b": "saver"}, None, True),
        ({"a": "saver", "g": "garbage", "boom": "raises"}, None, False),
    ],
    ids=["none-slot", "load", "params", "garbage-raises"],
)
def test_views_pass_the_real_aggregator_where_the_whole_search_does(
    connectors: dict[str, str | None], events: tuple[str, ...] | None, params: bool
) -> None:
    """The real aggregator, two requests: every property the whole search judges passes by
    views too, and every state one request reaches is a view (at least as many views)."""
    views = check_aggregator(connectors, requests=2, events=events, params=params, per_request=True)
    one = check_aggregator(connectors, requests=1, events=events, params=params)
    assert views.verdict == one.verdict == "PASS" and views.finished, views.to_text()
    # Each view once with no other request held and once with one (a deeper way in).
    assert views.views >= one.distinct_states
    assert views.max_depth >= one.max_depth
    assert {p.name for p in views.properties} == {p.name for p in one.properties} | {ACTORS_APART}


def test_views_agree_with_the_whole_search_on_two_requests() -> None:
    """Where the whole search of two requests finishes: the same verdicts, and each view's
    shortest way in is no longer than the whole search's deepest state."""
    whole = check_aggregator(BOUND, requests=2)
    views = check_aggregator(BOUND, requests=2, per_request=True)
    assert whole.verdict == views.verdict == "PASS"
    assert views.distinct_states <= whole.distinct_states
    assert views.max_depth <= whole.max_depth
    assert "by views:" in views.to_text() and "by views:" not in whole.to_text()


class CancelCancelsEveryone(MultiConnector):  # type: ignore[misc]
    """Cancels every held request when one is cancelled: one request's event changes another's
    record, the interaction the search by views assumes away (and checks)."""

    def cancel(self, request_id: Any) -> Any:
        outcome = super().cancel(request_id)
        for other in list(self._requests):
            if other != request_id:
                super().cancel(other)
        return outcome


def test_a_bug_that_couples_requests_fails_actors_apart() -> None:
    """begin r1, cancel r2 (not begun): r1 cancelled by r2's event, a shortest trace of 2."""
    report = check_aggregator(BOUND, requests=2, factory=CancelCancelsEveryone, per_request=True)
    result = report.result(ACTORS_APART)
    assert not result.passed and report.verdict == "FAIL"
    assert result.message.startswith("an event of 1 changed the view of 0")
    assert result.counterexample is not None
    assert [s.event for s in result.counterexample.steps] == ["begin(r1)", "cancel(r2)"]
    # One request alone cannot show it.
    assert check_aggregator(BOUND, requests=1, factory=CancelCancelsEveryone).ok


def test_views_on_eight_ranks_keep_to_the_budget(capsys: pytest.CaptureFixture[str]) -> None:
    ranks = "lmcache," + ",".join(f"p2p@{rank}" for rank in range(8))
    argv = ["--connectors", ranks, "--requests", "2", "--per-request", "--max-seconds", "3"]
    start = time.perf_counter()
    assert run_cli([*argv, "--no-progress"]) == 3
    assert time.perf_counter() - start < 5
    out = capsys.readouterr().out
    assert "by views:" in out and "result: INCONCLUSIVE" in out
    assert "each request's view once" in out


# -- explore(views=...) on a model of its own -----------------------------------------------------

#: Two counters, each an actor: ``("inc", i)`` raises counter i up to 3 (at 2 it may also
#: jam, forever), ``("reset",)`` (no actor) sets both back to 0 unless one is jammed.
Model = list[int]


def _events(m: Model) -> Iterator[tuple[Any, ...]]:
    for i in (0, 1):
        if 0 <= m[i] < 3:
            yield ("inc", i)
        if m[i] == 2:
            yield ("jam", i)
    yield ("reset",)


def _apply(m: Model, e: tuple[Any, ...]) -> None:
    if e[0] == "inc":
        m[e[1]] += 1
    elif e[0] == "jam":
        m[e[1]] = -1
    elif -1 not in m:
        m[:] = [0, 0]


def _views(m: Model) -> list[tuple[Hashable, Hashable, Hashable, bool]]:
    return [(i, m[i], None, m[i] == 3) for i in (0, 1)]


def _search(views: bool, **kw: Any) -> Any:
    return explore(
        lambda: [0, 0],
        _events,
        _apply,
        tuple,
        goal=lambda m: m[0] == 3 and m[1] == 3,
        config=SearchConfig(
            actor=lambda e: e[1] if len(e) > 1 else None, views=_views if views else None, **kw
        ),
    )


def test_explore_by_views_finds_the_whole_searchs_trap_as_early() -> None:
    whole, views = _search(False), _search(True)
    assert whole.result(NO_TRAP).counterexample is not None
    assert not views.result(NO_TRAP).passed
    assert len(views.result(NO_TRAP).counterexample or ()) == len(
        whole.result(NO_TRAP).counterexample or ()
    )
    assert views.views == 5  # each counter: 0, 1, 2, 3, jammed
    assert views.distinct_states < whole.distinct_states


def test_explore_views_need_an_actor() -> None:
    with pytest.raises(InvalidArgumentError, match="views needs actor"):
        SearchConfig(views=_views)
    with pytest.raises(InvalidArgumentError, match="views="):
        SearchConfig(actor=lambda e: None, views=3)  # type: ignore[arg-type]

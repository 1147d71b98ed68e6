"""The canonical form by signatures finds exactly what trying every renaming finds.

``multiconnector/check/canonical.py`` keeps the enumeration (:class:`Enumerated`) as the
reference; :class:`Signatures` is the one the checker uses. On every configuration where both
finish, and on every planted bug, the two searches agree figure for figure (states, edges, the
events applied and spared, depths, every verdict and counterexample length): the new form
merges exactly the states the enumeration merges.
"""

from __future__ import annotations

import functools
import itertools
import random
import time
from collections.abc import Callable
from typing import Any

import pytest

from multiconnector.check import ALPHABET, LOAD_EVENTS, CheckReport, check_aggregator
from multiconnector.check import run as run_module
from multiconnector.check.canonical import (
    Enumerated,
    Signatures,
    _Interner,
    _key,
    arrangements,
)
from tests.broken_aggregators import Broken
from tests.checked import bugs, checked, checked_bug, is_load

pytestmark = pytest.mark.timeout(300)


def _figures(report: CheckReport) -> dict[str, Any]:
    data = report.to_dict()
    for timing in ("wall_time", "distinct_per_second", "generated_per_second"):
        data.pop(timing)
    for p in data["properties"]:  # which of two symmetric traces is found may differ
        if p["counterexample"] is not None:
            p["counterexample"] = p["counterexample"]["length"]
    return data


def _both(
    monkeypatch: pytest.MonkeyPatch, search: Callable[..., CheckReport] = checked, **bound: Any
) -> tuple[CheckReport, CheckReport]:
    """The search with the enumeration, and with the signatures (the checker's own: the search
    other tests make too, shared with them, see tests/checked.py)."""
    monkeypatch.setattr(run_module, "_canonical_form", Enumerated)
    reference = search(**bound)
    monkeypatch.setattr(run_module, "_canonical_form", Signatures)
    signatures = search(**bound)
    return reference, signatures


@pytest.mark.parametrize(
    "bound",
    [
        {},
        {"connectors": {"a": "saver", "b": "saver", "none": None, "boom": "raises"}, "requests": 1},
        {"connectors": {"a": "saver", "b": "saver", "c": "saver"}, "requests": 1},
        {"connectors": {"a": "saver", "b": "saver", "n1": None, "n2": None}, "requests": 1},
        {"connectors": {"a": "saver", "j": "garbage"}, "requests": 2, "max_depth": 8},
        {"connectors": {"a": "saver", "b": "saver"}, "requests": 1, "params": True},
        {
            "connectors": {"a": "saver", "b": "saver", "c": "saver"},
            "requests": 1,
            "events": ALPHABET + LOAD_EVENTS,
            "max_depth": 6,
        },
        {"connectors": {"a": "saver", "b": "saver", "c": "saver"}, "requests": 3, "max_depth": 5},
    ],
    ids=["default", "every-kind", "three-savers", "two-none", "garbage", "params", "load", "three"],
)
def test_signatures_find_what_every_renaming_finds(
    bound: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    reference, signatures = _both(monkeypatch, **bound)
    assert _figures(signatures) == _figures(reference)
    assert signatures.ok and signatures.distinct_states > 100


# A load bug's enumerated search costs 11 s of CPU or more: every one is left to `make test-slow`
# (the load side's own configuration above stays in `make test`).
@pytest.mark.parametrize("bug", bugs(slow=is_load))
def test_every_planted_bug_is_caught_alike_by_both_forms(
    bug: Broken, monkeypatch: pytest.MonkeyPatch
) -> None:
    reference, signatures = _both(monkeypatch, functools.partial(checked_bug, bug))
    assert _figures(signatures) == _figures(reference)
    assert not signatures.result(bug.prop).passed
    assert len(signatures.result(bug.prop).counterexample or ()) == bug.shortest


def test_nine_interchangeable_names_cost_no_permutations() -> None:
    """Nine savers (a cache and eight ranks): 9! renamings per state for the enumeration; the
    signatures find the canonical form of each new state at once."""
    connectors = {"lmcache": "saver", **{f"p2p@{i}": "saver" for i in range(8)}}
    start = time.perf_counter()
    report = check_aggregator(connectors, requests=1, max_depth=4)
    assert time.perf_counter() - start < 120  # trying 9! renamings per state: hours
    assert report.ok and report.verdict == "PASS"
    assert "725,760 renamings" not in report.to_text()  # one request: 9! only
    assert "362,880 renamings" in report.to_text()


def _random_part(rng: random.Random, names: list[str]) -> tuple[Any, ...]:
    def some() -> tuple[str, ...]:
        return tuple(sorted(rng.sample(names, rng.randint(0, 2))))

    view = (rng.choice(["pending", "finishing"]), some(), some(), some())
    load = ("live", rng.choice([None, *names]), rng.random() < 0.5, False, None, False, False, None)
    asking = (tuple(sorted((n, rng.random() < 0.5) for n in some())),) if rng.random() < 0.3 else ()
    early = some() if asking else ()  # the early reports kept while a call asks (a key)
    matching = None  # a match between its halves: what it chose, asked, kept and delivered
    if rng.random() < 0.3:
        chose = rng.choice([None, *names])
        asked = tuple(sorted((n, rng.random() < 0.5) for n in some()))
        matching = (True, chose, asked, chose, rng.random() < 0.5, False, some(), some())
    return ("request", 1, view, frozenset(some()), False, load, asking, early, matching)


def test_the_key_is_a_renaming_of_the_state_and_the_same_for_every_renaming() -> None:
    """On random states of two requests and four names: the signatures' key is one of the
    state's renamings (sound), and equal for all of them (complete)."""
    rng = random.Random(28)
    kinds = {"a": "saver", "b": "saver", "c": "saver", "n": None}
    enumerated = Enumerated(kinds, 2, on=True)
    signatures = Signatures(kinds, 2, on=True)
    numbers = _Interner()
    for _ in range(200):
        registry = ("registered", tuple(sorted((n, n != "n") for n in rng.sample(list(kinds), 3))))
        parts = tuple(numbers.number(_random_part(rng, list(kinds))) for _ in range(2))
        raw = (numbers.number(registry), parts, (0,), ())
        orbit = {_key(numbers, raw, perm, rename) for perm, rename in enumerated.renamings}
        key, _ = signatures._canonical(numbers, raw)
        assert key in orbit
        for other in orbit:
            assert signatures._canonical(numbers, other)[0] == key


def test_arrangements_are_each_distinct_ordering_once() -> None:
    labels = ["x", "x", "y", None]
    assert sorted(arrangements(labels), key=repr) == sorted(
        set(itertools.permutations(labels)), key=repr
    )
    assert len(list(arrangements([0] * 9))) == 1

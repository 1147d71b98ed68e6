"""The figures docs/check.md gives for a search are that search's: states are deterministic.

(The times are the machine's; the state counts are not, so a change to the checker or the
aggregator that changes them must change the page too.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from multiconnector.check import ALPHABET, LOAD_EVENTS, check_aggregator
from tests.checked import checked

PAGE = (Path(__file__).resolve().parent.parent / "docs" / "check.md").read_text(encoding="utf-8")
SMALL = {"a": "saver", "b": "saver", "none": None}


def _number(text: str) -> int:
    return int(text.replace(",", ""))


@pytest.mark.timeout(120)  # 5,398 states: about 3 s of CPU time
def test_the_default_bounds_figures_are_its_search() -> None:
    found = re.search(
        r"The default bound .*?: ([\d,]+) distinct states,\s+([\d,]+) generated, ([\d,]+) edges, "
        r"maximum depth (\d+)",
        PAGE,
        flags=re.S,
    )
    assert found, "docs/check.md no longer gives the default bound's figures"
    headline = re.search(
        r"^\| `multiconnector check` \| `PASS`, complete \(depth (\d+)\) \| "
        r"([\d,]+) distinct, ([\d,]+) generated",
        PAGE,
        flags=re.M,
    )
    assert headline, "docs/check.md's first table no longer gives the default bound"
    report = checked()  # `multiconnector check`: the default bound (tests/checked.py)
    assert (report.distinct_states, report.states_generated, report.edges, report.max_depth) == (
        tuple(map(_number, found.groups()))
    )
    depth, distinct, generated = map(_number, headline.groups())
    assert (depth, distinct, generated) == (
        report.max_depth,
        report.distinct_states,
        report.states_generated,
    )


@pytest.mark.timeout(120)  # 26,461 states: about 20 s, more on a busy machine
def test_the_load_sides_figure_is_its_search() -> None:
    found = re.search(
        r"--load --requests 1 --connectors\s+a,b,none=none`\) it explores ([\d,]+) distinct "
        r"states \(([\d,]+) generated, maximum depth (\d+)\)",
        PAGE,
    )
    assert found, "docs/check.md no longer gives the load side's figure"
    # The same search as tests/test_check.py's load-side bound: run once (tests/checked.py).
    report = checked(connectors=SMALL, requests=1, events=ALPHABET + LOAD_EVENTS)
    figures = (report.distinct_states, report.states_generated, report.max_depth)
    assert figures == tuple(map(_number, found.groups()))


@pytest.mark.slow  # 10,796 states: about 10 s of CPU time
@pytest.mark.timeout(300)
def test_the_none_slots_figure_is_its_search() -> None:
    found = re.search(
        r"that\s+bound grows to ([\d,]+) distinct states \(([\d,]+) generated, ([\d,]+) edges, "
        r"depth (\d+)\)",
        PAGE,
    )
    assert found, "docs/check.md no longer gives the figure of --connectors a,b,none=none"
    report = check_aggregator(SMALL)  # `multiconnector check --connectors a,b,none=none`
    figures = (report.distinct_states, report.states_generated, report.edges, report.max_depth)
    assert figures == tuple(map(_number, found.groups()))

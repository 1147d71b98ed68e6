"""Load selection (``match_tokens``) and load reports, against a reference written here.

tests/test_aggregator.py has the worked example; these are independent guards: a property over
arbitrary answers, registration order, the states that refuse, and the counters and callbacks.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multiconnector import (
    ConnectorFailures,
    ConnectorRegistry,
    InvalidArgumentError,
    MultiConnector,
    Outcome,
    State,
)
from tests.connectors import Scripted

#: What a connector does when asked for tokens: an answer, or one of the special behaviours.
ANSWERS = st.one_of(
    st.none(),
    st.integers(0, 3),
    st.sampled_from(["raise", "negative", "bool", "float", "no method", "None slot"]),
)


class Answering(Scripted):
    def __init__(self, answer: Any) -> None:
        super().__init__(tokens=None)
        self.answer = answer
        self.asked: list[tuple[str, int]] = []

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int | None:
        self.asked.append((request_id, num_computed_tokens))
        answers = {"raise": None, "negative": -1, "bool": True, "float": 2.0}
        if self.answer == "raise":
            raise OSError("lookup failed")
        return answers.get(self.answer, self.answer)  # type: ignore[no-any-return]


class NoLoads:
    """A connector without get_num_new_matched_tokens: never asked, never chosen."""

    def request_finished(self, request_id: str, blocks: Any) -> tuple[bool, None]:
        return False, None


def make(answers: list[Any]) -> tuple[MultiConnector, dict[str, Any]]:
    connectors: dict[str, Any] = {}
    for i, answer in enumerate(answers):
        name = f"c{i}"
        if answer == "no method":
            connectors[name] = NoLoads()
        elif answer == "None slot":
            connectors[name] = None
        else:
            connectors[name] = Answering(answer)
    return MultiConnector(ConnectorRegistry(connectors)), connectors


def reference(answers: list[Any]) -> tuple[int | None, str | None, list[str]]:
    """(result, loader, failed names) as match_tokens documents them."""
    failed, unknown, chosen = [], False, None
    for i, answer in enumerate(answers):
        name = f"c{i}"
        if answer in ("no method", "None slot"):
            continue
        if answer in ("raise", "negative", "bool", "float"):
            failed.append(name)
        elif answer is None:
            unknown = True
            break  # "not known yet": asking stops, as vLLM's does
        elif answer > 0 and chosen is None:
            chosen = (name, answer)
    if unknown:
        return None, None, failed
    return (chosen[1] if chosen else 0), (chosen[0] if chosen else None), failed


@given(st.lists(ANSWERS, max_size=6), st.integers(0, 50))
def test_match_tokens_follows_the_reference(answers: list[Any], computed: int) -> None:
    mc, connectors = make(answers)
    mc.begin("r")
    result, loader, failed = reference(answers)
    if failed:
        with pytest.raises(ConnectorFailures) as info:
            mc.match_tokens("r", computed)
        assert info.value.result == result
        assert list(info.value.failed) == failed
        bad = [e for e in info.value.exceptions if not isinstance(e, OSError)]
        assert all(isinstance(e, InvalidArgumentError) for e in bad)
    else:
        assert mc.match_tokens("r", computed) == result
    record = mc.get("r")
    assert record is not None
    assert (record.state, record.loader, record.loaded) == (State.pending, loader, False)
    stop = answers.index(None) if None in answers else len(answers)
    for i, c in enumerate(connectors.values()):  # asked once, up to the first "not known yet"
        if isinstance(c, Answering):
            assert c.asked == ([("r", computed)] if i <= stop else [])


def test_registration_order_decides_between_two_loaders() -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(tokens=4), "b": Scripted(tokens=9)}))
    mc.begin("r")
    assert mc.match_tokens("r") == 4 and mc.get("r").loader == "a"  # type: ignore[union-attr]
    a = mc.unregister("a")
    mc.register("a", a)  # registered again: now after b
    assert mc.match_tokens("r") == 9 and mc.get("r").loader == "b"  # type: ignore[union-attr]
    mc.unregister("b")
    assert mc.match_tokens("r") == 4 and mc.get("r").loader == "a"  # type: ignore[union-attr]


def test_a_later_answer_replaces_the_choice_while_pending() -> None:
    a = Scripted(tokens=5)
    mc = MultiConnector(ConnectorRegistry({"a": a}))
    mc.begin("r")
    assert mc.match_tokens("r") == 5
    assert mc.load_finished("r", "a") is Outcome.applied
    a.tokens = 0
    assert mc.match_tokens("r") == 0  # nothing to load any more: no loader, not loaded
    record = mc.get("r")
    assert record is not None and (record.loader, record.loaded) == (None, False)
    assert mc.load_finished("r", "a") is Outcome.phantom


@pytest.mark.parametrize("leave", ["finish", "cancel"])
def test_a_request_past_pending_loads_nothing_and_keeps_its_choice(leave: str) -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(tokens=5), "b": Scripted(tokens=7)}))
    mc.begin("r")
    assert mc.match_tokens("r") == 5
    if leave == "finish":
        mc.request_finished("r")
    else:
        mc.cancel("r")
    assert mc.match_tokens("r") == 0
    record = mc.get("r")
    assert record is not None and (record.loader, record.loaded) == ("a", False)


def test_load_reports_are_counted_and_called_back_once() -> None:
    loader, other = Scripted(tokens=3), Scripted(tokens=0)
    mc = MultiConnector(ConnectorRegistry({"other": other, "loader": loader, "dead": None}))
    mc.begin("r")
    assert mc.match_tokens("r") == 3
    outcomes = [mc.load_finished("r", n) for n in ("loader", "loader", "other", "dead", "ghost")]
    assert outcomes == [
        Outcome.applied,
        Outcome.duplicate,
        Outcome.phantom,
        Outcome.not_ready,
        Outcome.unknown_connector,
    ]
    assert mc.get("r").loaded is True  # type: ignore[union-attr]
    assert loader.loads == ["r"] and other.loads == []
    per = mc.connector_counts()
    assert per["loader"] == {Outcome.applied: 1, Outcome.duplicate: 1}
    assert per["other"] == {Outcome.phantom: 1}
    assert per["dead"] == {Outcome.not_ready: 1}
    assert per["ghost"] == {Outcome.unknown_connector: 1}
    mc.cancel("r")
    assert mc.load_finished("r", "loader") is Outcome.terminal
    mc.take()
    assert mc.load_finished("r", "loader") is Outcome.unknown_request
    assert mc.counts()[Outcome.applied] == 2  # the load and the cancel
    assert loader.loads == ["r"]

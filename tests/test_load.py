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
    record = mc.get("r")
    assert record is not None and (record.loaded, record.loader_gone) == (True, False)
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


class Asked(Scripted):
    """Records the ``num_computed_tokens`` each match asked with."""

    def __init__(self, tokens: int | None) -> None:
        super().__init__(tokens=tokens)
        self.computed: list[int] = []

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int | None:
        self.computed.append(num_computed_tokens)
        return super().get_num_new_matched_tokens(request_id, num_computed_tokens)


def test_computed_tokens_default_to_zero_and_are_passed_on() -> None:
    a = Asked(tokens=0)
    mc = MultiConnector(ConnectorRegistry({"a": a}))
    mc.begin("r")
    assert mc.match_tokens("r") == 0
    assert mc.match_tokens("r", 7) == 0
    assert a.computed == [0, 7]


def test_a_bad_token_count_is_explained() -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(tokens=-2), "b": Scripted(tokens=1)}))
    mc.begin("r")
    with pytest.raises(ConnectorFailures) as info:
        mc.match_tokens("r")
    (error,) = info.value.exceptions
    assert isinstance(error, InvalidArgumentError)
    assert str(error) == "connector 'a' answered tokens=-2 (type int); must be an int >= 0 or None"
    assert info.value.result == 1 and info.value.failed == ("a",)


def test_a_loader_that_unregisters_itself_while_asked_can_never_apply_its_load() -> None:
    mc: MultiConnector

    class Leaving(Scripted):
        def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int:
            mc.unregister("a")
            mc.register("a", Scripted())  # a new connector under the same name
            return 5

    mc = MultiConnector(ConnectorRegistry({"a": Leaving()}))
    mc.begin("r")
    assert mc.match_tokens("r") == 5
    record = mc.get("r")
    assert record is not None and (record.loader, record.loader_gone) == ("a", True)
    assert (record.loaded, record.in_flight) == (False, False)  # over, and never reported
    assert mc.load_finished("r", "a") is Outcome.unregistered
    assert not record.loaded
    # Nothing is in flight: cancelled, it is handed back at once, not held draining.
    assert mc.cancel("r") is Outcome.applied
    assert [r.request_id for r in mc.take()] == ["r"]


def test_a_loader_chosen_again_after_it_was_unregistered() -> None:
    # Chosen, unregistered (its load over), registered and chosen again while still pending:
    # its new load applies once; a second report is from a name the request abandoned.
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(tokens=2)}))
    mc.begin("r")
    assert mc.match_tokens("r") == 2
    mc.unregister("a")
    again = Scripted(tokens=2)
    mc.register("a", again)
    assert mc.match_tokens("r") == 2
    assert mc.load_finished("r", "a") is Outcome.applied
    assert mc.load_finished("r", "a") is Outcome.unregistered
    assert again.loads == ["r"]
    assert mc.connector_counts()["a"] == {Outcome.applied: 1, Outcome.unregistered: 1}


class _Id(str):
    """A str subclass request id."""


def test_a_str_subclass_request_id_is_called_back_as_a_plain_str() -> None:
    loader = Scripted(tokens=2)
    mc = MultiConnector(ConnectorRegistry({"a": loader}))
    mc.begin("r")
    mc.match_tokens("r")
    assert mc.load_finished(_Id("r"), "a") is Outcome.applied
    assert loader.loads == ["r"] and loader.loads[0].__class__ is str


def test_a_gone_loaders_name_unregistered_again_settles_nothing_twice() -> None:
    """Found by the model check: a cancelled request whose loader was unregistered (its load
    over, unreported: loader_gone) is queued once; a new connector under the name, unregistered
    in turn, is not its loader and queues nothing again."""
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(tokens=0), "b": Scripted(tokens=1)}))
    mc.begin("r1")
    assert mc.match_tokens("r1") == 1
    mc.cancel("r1")
    mc.unregister("b")
    mc.register("b", Scripted())
    mc.unregister("b")
    (record,) = mc.take()
    assert (record.loaded, record.loader_gone, record.abandoned) == (False, True, ("b",))
    assert mc.take() == [] and len(mc) == 0


def test_a_live_request_whose_loader_reported_and_left_ignores_a_new_connectors_load() -> None:
    # Loaded, then the loader is unregistered while the request is live: a load report under
    # its name (from a new connector that took it) is from a gone loader, not a duplicate.
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(tokens=2)}))
    mc.begin("r")
    assert mc.match_tokens("r") == 2
    assert mc.load_finished("r", "a") is Outcome.applied
    mc.unregister("a")
    record = mc.get("r")
    assert record is not None and (record.loaded, record.loader_gone) == (True, True)
    assert record.abandoned == ()  # its load was reported: nothing was abandoned
    again = Scripted()
    mc.register("a", again)
    assert mc.load_finished("r", "a") is Outcome.unregistered
    assert again.loads == []
    assert mc.connector_counts()["a"] == {Outcome.applied: 1, Outcome.unregistered: 1}

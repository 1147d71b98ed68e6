"""The lookup policy: which connector's answer loads a request (multiconnector.lookup)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multiconnector import (
    ConnectorRegistry,
    InvalidArgumentError,
    InvalidValueError,
    Lookup,
    MultiConnector,
    Outcome,
    Role,
    RoleError,
    UnknownConnectorError,
    UnknownRequestError,
)
from multiconnector.lookup import choose, settled, wins


class Answers:
    """A connector that answers ``get_num_new_matched_tokens`` from a fixed value."""

    def __init__(self, tokens: int | None) -> None:
        self.tokens = tokens
        self.asked = 0

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> Any:
        self.asked += 1
        return self.tokens

    def request_finished(self, request_id: str, blocks: Any) -> tuple[bool, None]:
        return False, None


def _matched(
    answers: list[int | None], lookup: Lookup | str = Lookup.first, remaining: int | None = None
) -> tuple[int | None, str | None, list[int]]:
    children = {f"c{i}": Answers(tokens) for i, tokens in enumerate(answers)}
    mc = MultiConnector(ConnectorRegistry(children), lookup=lookup)
    mc.begin("r")
    tokens = mc.match_tokens("r", 0, remaining=remaining)
    record = mc.peek("r")
    assert record is not None
    return tokens, record.loader, [child.asked for child in children.values()]


def test_first_is_the_default_and_vllms_rule() -> None:
    assert _matched([0, 64, 4000]) == (64, "c1", [1, 1, 1])
    assert _matched([0, 64, 4000], "first") == (64, "c1", [1, 1, 1])


def test_longest_takes_the_most_tokens_ties_in_order() -> None:
    assert _matched([0, 64, 4000], Lookup.longest) == (4000, "c2", [1, 1, 1])
    assert _matched([64, 4000, 4000], "longest") == (4000, "c1", [1, 1, 1])
    assert _matched([0, 0], "longest") == (0, None, [1, 1])


def test_first_stops_at_a_none_unless_the_prompt_is_covered() -> None:
    assert _matched([64, None, 10]) == (None, None, [1, 1, 0])
    # the first child covers all 64 tokens left: the None cannot change the choice
    assert _matched([64, None, 10], remaining=64) == (64, "c0", [1, 1, 1])
    assert _matched([None, 64], remaining=64) == (None, None, [1, 0])


def test_longest_asks_every_connector_and_a_none_holds() -> None:
    assert _matched([64, None, 10], "longest") == (None, None, [1, 1, 1])
    assert _matched([None, 64], "longest", remaining=64) == (64, "c1", [1, 1])
    assert _matched([None, 32], "longest", remaining=64) == (None, None, [1, 1])


@pytest.mark.parametrize("bad", ["last", 1, None, Lookup])
def test_a_bad_lookup_is_refused_naming_it(bad: Any) -> None:
    with pytest.raises(InvalidArgumentError, match=r"lookup="):
        MultiConnector(ConnectorRegistry({}), lookup=bad)


def test_a_bad_remaining_is_refused_and_changes_nothing() -> None:
    mc = MultiConnector(ConnectorRegistry({"c": Answers(8)}))
    mc.begin("r")
    with pytest.raises(InvalidArgumentError, match=r"remaining="):
        mc.match_tokens("r", 0, remaining="8")  # type: ignore[arg-type]
    record = mc.peek("r")
    assert record is not None and record.loader is None


answers = st.lists(st.one_of(st.none(), st.integers(0, 100)), min_size=1, max_size=5)


@given(answers, st.one_of(st.none(), st.integers(0, 100)))
def test_longest_never_loads_fewer_tokens_than_first(
    given_answers: list[int | None], remaining: int | None
) -> None:
    first, _, _ = _matched(given_answers, "first", remaining)
    longest, loader, _ = _matched(given_answers, "longest", remaining)
    if first is not None and longest is not None:
        assert longest >= first
        if longest:
            assert loader == f"c{given_answers.index(longest)}"
    if None not in given_answers:  # no one still looking up: both decide, from the same hits
        assert first is not None and longest == max(given_answers)  # type: ignore[type-var]


@given(st.integers(0, 100), st.integers(0, 100), st.booleans())
def test_the_rules(tokens: int, best: int, chosen: bool) -> None:
    assert wins(Lookup.first, tokens, best, chosen) == (tokens > 0 and not chosen)
    assert wins(Lookup.longest, tokens, best, chosen) == (tokens > best)
    assert settled(best, None) is False
    assert settled(best, tokens) == (best > 0 and best >= tokens)


@given(
    st.lists(st.one_of(st.none(), st.integers(0, 5000)), max_size=6),
    st.sampled_from(Lookup),
    st.one_of(st.none(), st.integers(0, 5000)),
)
def test_choose_is_match_tokens_decision(
    answers: list[int | None], policy: Lookup, remaining: int | None
) -> None:
    """choose(), fed the answers lazily, decides as match_tokens does (which uses it) and
    reads no answer past the one that ends the lookup: the adapter's scheduler feeds it its
    children's answers, asking each when read."""
    read: list[int] = []

    def lazily() -> Any:
        for index, tokens in enumerate(answers):
            read.append(index)
            yield f"c{index}", tokens

    key, tokens, held = choose(policy, lazily(), remaining)
    matched, loader, asked = _matched(answers, policy, remaining)
    assert (None if held else tokens) == matched
    if not held:
        assert key == loader
    assert [1 if i in read else 0 for i in range(len(answers))] == asked


def test_choose_loader_records_a_loader_chosen_elsewhere() -> None:
    """choose_loader is match_tokens' second half for a caller that asked its connectors
    itself: the loader's report is then applied, a stranger's is a phantom."""
    mc = MultiConnector(ConnectorRegistry({"a": Answers(0), "b": Answers(0)}))
    mc.begin("r")
    mc.choose_loader("r", "b")
    assert [e.connector.asked for e in mc.registry.entries.values()] == [0, 0]
    assert mc.load_finished("r", "a") is Outcome.phantom
    assert mc.load_finished("r", "b") is Outcome.applied
    mc.begin("s")
    mc.choose_loader("s", None)
    record = mc.peek("s")
    assert record is not None and record.loader is None


def test_choose_loader_refuses_what_cannot_load_and_changes_nothing() -> None:
    registry = ConnectorRegistry({"a": Answers(0), "store": Answers(0)}, roles={"store": Role.save})
    mc = MultiConnector(registry)
    mc.begin("r")
    with pytest.raises(UnknownConnectorError, match="'zz'"):
        mc.choose_loader("r", "zz")
    with pytest.raises(RoleError, match="'store'"):
        mc.choose_loader("r", "store")
    with pytest.raises(UnknownRequestError, match="'nope'"):
        mc.choose_loader("nope", "a")
    with pytest.raises(InvalidArgumentError, match="request_id"):
        mc.choose_loader(7, "a")  # type: ignore[arg-type]
    record = mc.peek("r")
    assert record is not None and record.loader is None


def test_choose_loader_refuses_a_none_slot_which_would_never_report() -> None:
    """A name registered with ``None`` (a connector that failed to start) never reports: its
    reports are ``not_ready``. Chosen to load, it would hold the request until unregistered."""
    mc = MultiConnector(ConnectorRegistry({"a": Answers(0), "dead": None}))
    mc.begin("r")
    with pytest.raises(InvalidValueError, match=r"name='dead' is registered with None"):
        mc.choose_loader("r", "dead")
    record = mc.peek("r")
    assert record is not None and record.loader is None  # nothing changed
    assert mc.load_finished("r", "dead") is Outcome.not_ready

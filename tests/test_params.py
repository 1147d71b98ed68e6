"""merge_transfer_params: the contract, proven by properties and a table of bad inputs."""

from __future__ import annotations

import contextlib
import copy
import time
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from multiconnector import (
    DuplicateConnectorError,
    InvalidNameError,
    InvalidParamsError,
    KeyClashError,
    MultiConnectorError,
    merge_transfer_params,
)
from tests.strategies import contributions, names, params


def reference_fold(items: list[tuple[str, Any]]) -> dict[str, Any] | None:
    """The obvious merge, for disjoint inputs."""
    out: dict[str, Any] | None = None
    for _, p in items:
        if p is not None:
            out = {} if out is None else out
            for k, v in p.items():
                out[k] = v
    return out


def supplied(items: list[tuple[str, Any]]) -> dict[str, list[str]]:
    who: dict[str, list[str]] = {}
    for name, p in items:
        for k in p or {}:
            who.setdefault(k, []).append(name)
    return who


@given(contributions(disjoint=True))
def test_equals_reference_fold_when_disjoint(items: list[tuple[str, Any]]) -> None:
    assert merge_transfer_params(items) == reference_fold(items)


@given(contributions(disjoint=True))
def test_key_order_is_connector_order_then_own_order(items: list[tuple[str, Any]]) -> None:
    merged = merge_transfer_params(items)
    expected = [k for _, p in items for k in (p or {})]
    assert list(merged or {}) == expected


@given(contributions())
def test_inputs_are_never_mutated(items: list[tuple[str, Any]]) -> None:
    before = copy.deepcopy(items)
    with contextlib.suppress(KeyClashError):
        merge_transfer_params(items)
    assert items == before


@given(contributions(disjoint=True))
def test_result_shares_no_mapping_with_an_input(items: list[tuple[str, Any]]) -> None:
    merged = merge_transfer_params(items)
    assert all(p is None or merged is not p for _, p in items)
    if merged is not None:
        merged["__probe__"] = 1  # mutating the result leaves every input alone
        assert all("__probe__" not in (p or {}) for _, p in items)


@given(contributions())
def test_clash_raised_iff_a_key_is_supplied_twice(items: list[tuple[str, Any]]) -> None:
    who = supplied(items)
    expected = {k: tuple(v) for k, v in who.items() if len(v) > 1}
    if expected:
        with pytest.raises(KeyClashError) as info:
            merge_transfer_params(items)
        assert dict(info.value.clashes) == expected
        assert list(info.value.clashes) == [k for k in who if k in expected]  # first-seen order
        for key, connectors in expected.items():
            assert repr(key) in str(info.value)
            assert all(c in str(info.value) for c in connectors)
    else:
        merge_transfer_params(items)


@given(contributions())
def test_clash_message_is_deterministic(items: list[tuple[str, Any]]) -> None:
    messages = set()
    for _ in range(2):
        try:
            merge_transfer_params(list(items))
        except KeyClashError as exc:
            messages.add(str(exc))
    assert len(messages) <= 1


@given(contributions(disjoint=True), names, st.sampled_from([None, {}]))
def test_none_and_empty_are_neutral(items: list[tuple[str, Any]], extra: str, neutral: Any) -> None:
    if extra in {n for n, _ in items}:
        return
    base = merge_transfer_params(items)
    with_extra = merge_transfer_params([*items, (extra, neutral)])
    if base is None:
        assert with_extra == (None if neutral is None else {})  # {} contributes, None does not
    else:
        assert with_extra == base


@given(contributions(disjoint=True), st.integers(0, 6))
def test_merging_in_two_batches_equals_merging_at_once(
    items: list[tuple[str, Any]], cut: int
) -> None:
    left, right = items[:cut], items[cut:]
    a, b = merge_transfer_params(left), merge_transfer_params(right)
    batched = merge_transfer_params([("left", a), ("right", b)])
    assert batched == merge_transfer_params(items)


@given(contributions(disjoint=True), st.randoms(use_true_random=False))
def test_disjoint_result_does_not_depend_on_connector_order(
    items: list[tuple[str, Any]], rnd: Any
) -> None:
    shuffled = list(items)
    rnd.shuffle(shuffled)
    assert merge_transfer_params(shuffled) == merge_transfer_params(items)


@given(params, names, names)
def test_allow_equal_accepts_equal_values_only(p: dict[str, Any], a: str, b: str) -> None:
    if a == b or not p:
        return
    assert merge_transfer_params([(a, p), (b, dict(p))], allow_equal=True) == p
    changed = {k: ("changed", v) for k, v in p.items()}
    with pytest.raises(KeyClashError) as info:
        merge_transfer_params([(a, p), (b, changed)], allow_equal=True)
    assert set(info.value.clashes) == set(p)
    with pytest.raises(KeyClashError):
        merge_transfer_params([(a, p), (b, dict(p))])  # strict by default


def test_none_when_nothing_contributes() -> None:
    assert merge_transfer_params([]) is None
    assert merge_transfer_params([("a", None), ("b", None)]) is None
    assert merge_transfer_params(iter([("a", {})])) == {}


def test_accepts_any_mapping_and_returns_a_new_dict() -> None:
    proxy = MappingProxyType({"k": 1})
    merged = merge_transfer_params([("a", proxy)])
    assert type(merged) is dict and merged == {"k": 1}


def test_all_clashes_reported_at_once() -> None:
    items = [("a", {"x": 1, "y": 1}), ("b", {"x": 2}), ("c", {"y": 3, "x": 4})]
    with pytest.raises(KeyClashError) as info:
        merge_transfer_params(items)
    assert info.value.clashes == {"x": ("a", "b", "c"), "y": ("a", "c")}
    assert str(info.value) == (
        "transfer params clash: 2 keys supplied by more than one connector: "
        "'x' from a, b, c; 'y' from a, c"
    )
    assert isinstance(info.value, ValueError) and isinstance(info.value, MultiConnectorError)


@pytest.mark.parametrize(
    ("items", "kwargs", "error", "words"),
    [
        ([("a", [("k", 1)])], {}, InvalidParamsError, ["'a'", "list"]),
        ([("a", "k=1")], {}, InvalidParamsError, ["'a'", "str"]),
        ([("a", {1: "x"})], {}, InvalidParamsError, ["'a'", "key=1", "int"]),
        ([("a", {}), ("a", {})], {}, DuplicateConnectorError, ["'a'", "twice"]),
        ([(3, {})], {}, InvalidNameError, ["contributions[0][0]", "int"]),
        ([("", {})], {}, InvalidNameError, ["contributions[0][0]"]),
        ([("a", {}, "extra")], {}, TypeError, ["contributions[0]=('a', {}, 'extra')", "tuple"]),
        ({"a": {}}, {}, TypeError, ["contributions={'a': {}}", "dict"]),
        ([], {"allow_equal": "yes"}, TypeError, ["allow_equal='yes'", "str"]),
    ],
)
def test_bad_inputs(items: Any, kwargs: Any, error: type[Exception], words: list[str]) -> None:
    before = copy.deepcopy(items)
    with pytest.raises(error) as info:
        merge_transfer_params(items, **kwargs)
    assert isinstance(info.value, MultiConnectorError)
    assert all(w in str(info.value) for w in words), str(info.value)
    assert items == before


def test_type_errors_are_also_type_errors() -> None:
    with pytest.raises(TypeError):
        merge_transfer_params([("a", 5)])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="twice"):
        merge_transfer_params([("a", None), ("a", None)])


def test_linear_time_on_100k_keys() -> None:
    items: list[tuple[str, Mapping[str, Any] | None]] = [
        (f"c{i}", {f"k{i}_{j}": j for j in range(20_000)}) for i in range(5)
    ]
    # This thread's CPU time, not the wall clock: with the suite on parallel workers (or other
    # work on the machine) a wall-clock limit would time the neighbours too.
    start = time.thread_time()
    merged = merge_transfer_params(items)
    elapsed = time.thread_time() - start
    assert merged is not None and len(merged) == 100_000
    assert Counter(k.split("_")[0] for k in merged) == {f"k{i}": 20_000 for i in range(5)}
    assert elapsed < 1.0, f"{elapsed:.3f} CPU s for 100 000 keys"


def test_allow_equal_compares_values_not_identity() -> None:
    # Equal values that are distinct objects: not a clash under allow_equal, a clash without.
    first, again = {"k": [1, 2], "n": 10**20}, {"k": [1, 2], "n": int("1" + "0" * 20)}
    assert first["k"] is not again["k"] and first["n"] is not again["n"]
    assert merge_transfer_params([("a", first), ("b", again)], allow_equal=True) == first
    with pytest.raises(KeyClashError):
        merge_transfer_params([("a", first), ("b", again)])


def test_allow_equal_reports_an_ambiguous_comparison_as_invalid_params() -> None:
    class Ambiguous:
        """Like an array: its == cannot be read as one bool."""

        def __eq__(self, other: object) -> bool:
            raise ValueError("truth value is ambiguous")

        __hash__ = object.__hash__

    # Not a clash (the values may well be equal): a typed error naming the key and connectors.
    with pytest.raises(InvalidParamsError, match="key='k' from a, b"):
        merge_transfer_params(
            [("a", {"k": Ambiguous()}), ("b", {"k": Ambiguous()})], allow_equal=True
        )
    same = Ambiguous()  # the very same object is equal to itself, without asking ==
    merged = merge_transfer_params([("a", {"k": same}), ("b", {"k": same})], allow_equal=True)
    assert merged == {"k": same}


def test_str_subclass_keys_are_accepted() -> None:
    class Key(str):
        pass

    merged = merge_transfer_params([("a", {Key("k"): 1}), ("b", {"j": 2})])
    assert merged == {"k": 1, "j": 2}


def test_an_invalid_name_is_refused_on_every_merge() -> None:
    """An invalid name is refused however often valid ones were merged before and after it."""
    for _ in range(2):
        assert merge_transfer_params([("cache", {"k": 1})]) == {"k": 1}
        for bad in ("a,b", "a=b", "a b", ""):
            with pytest.raises(InvalidNameError, match=r"contributions\[1\]\[0\]"):
                merge_transfer_params([("cache", {"k": 1}), (bad, {"j": 2})])

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from multiconnector import (
    ConnectorFailures,
    ConnectorRegistry,
    DuplicateConnectorError,
    InvalidArgumentError,
    InvalidNameError,
    MultiConnector,
    MultiConnectorError,
    UnknownConnectorError,
)
from multiconnector.registry import Entry
from tests.connectors import Scripted


def test_names_in_registration_order_with_none_slots() -> None:
    a, b = Scripted(), Scripted()
    registry = ConnectorRegistry([("b", b), ("dead", None), ("a", a)])
    assert registry.names() == ("b", "dead", "a")
    assert registry.ready() == ("b", "a")
    assert list(registry) == ["b", "dead", "a"]
    assert registry["dead"] is None and registry["a"] is a
    assert "dead" in registry and "zz" not in registry and len(registry) == 3


def test_register_and_unregister_at_run_time() -> None:
    registry = ConnectorRegistry()
    c = Scripted()
    registry.register("x", c)
    first = registry.entry("x")
    assert registry.unregister("x") is c
    assert registry.names() == ()
    registry.register("x", c)
    assert registry.entry("x") is not first  # a new registration is a new entry


def test_errors_are_distinct_and_subclass_builtins() -> None:
    registry = ConnectorRegistry({"x": None})
    with pytest.raises(DuplicateConnectorError) as dup:
        registry.register("x", Scripted())
    with pytest.raises(UnknownConnectorError) as unknown:
        registry.unregister("nope")
    with pytest.raises(InvalidNameError) as bad:
        registry.register(3, Scripted())  # type: ignore[arg-type]
    assert isinstance(dup.value, ValueError)
    assert isinstance(unknown.value, KeyError)
    assert isinstance(bad.value, TypeError)
    assert len({type(dup.value), type(unknown.value), type(bad.value)}) == 3
    for exc in (dup.value, unknown.value, bad.value):
        assert isinstance(exc, MultiConnectorError)
    assert str(unknown.value) == "name='nope' is not registered"
    assert "name=3 (type int) must be a non-empty str" in str(bad.value)
    assert registry.names() == ("x",)


@pytest.mark.parametrize("name", ["", None, 0, b"x", ("a",)])
def test_bad_names_rejected_and_nothing_changes(name: object) -> None:
    registry = ConnectorRegistry({"x": None})
    with pytest.raises(InvalidNameError, match="name="):
        registry.register(name, Scripted())  # type: ignore[arg-type]
    with pytest.raises(InvalidNameError):
        registry.unregister(name)  # type: ignore[arg-type]
    assert registry.names() == ("x",)


def test_object_without_request_finished_is_rejected() -> None:
    registry = ConnectorRegistry()
    with pytest.raises(InvalidArgumentError, match=r"connector=.*request_finished"):
        registry.register("x", object())  # type: ignore[arg-type]
    assert registry.names() == ()


@pytest.mark.parametrize(
    ("connectors", "words"),
    [(5, "connectors=5"), ([("a",)], "connectors[0]=('a',)"), (["ab"], "connectors[0]='ab'")],
)
def test_bad_constructor_input_is_named(connectors: object, words: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        ConnectorRegistry(connectors)  # type: ignore[arg-type]
    assert words in str(info.value)


def test_listeners_are_held_weakly_and_all_called() -> None:
    registry = ConnectorRegistry({"a": Scripted(), "b": Scripted()})
    aggregators = [MultiConnector(registry) for _ in range(5)]
    refs = [weakref.ref(mc) for mc in aggregators]
    del aggregators
    gc.collect()
    assert all(r() is None for r in refs)  # subscribing kept none of them alive

    seen: list[str] = []

    def failing(entry: Entry) -> None:
        raise RuntimeError("listener")

    registry.subscribe(failing)
    registry.subscribe(lambda entry: seen.append(entry.name))
    a = registry["a"]
    with pytest.raises(ConnectorFailures) as info:
        registry.unregister("a")
    assert seen == ["a"] and registry.names() == ("b",)
    assert [str(e) for e in info.value.exceptions] == ["listener"]
    assert info.value.result is a  # what unregister would have returned
    with pytest.raises(InvalidArgumentError, match="listener=5"):
        registry.subscribe(5)  # type: ignore[arg-type]


def test_get_repr_and_entries_of_a_registry() -> None:
    quick, fallback = Scripted(), Scripted()
    registry = ConnectorRegistry({"quick": quick, "dead": None})
    assert registry.get("quick") is quick
    assert registry.get("dead", fallback) is None  # registered as not ready: not the default
    assert registry.get("ghost") is None
    assert registry.get("ghost", fallback) is fallback
    assert repr(registry) == "ConnectorRegistry({'quick': Scripted, 'dead': None})"
    assert repr(ConnectorRegistry()) == "ConnectorRegistry({})"
    dead = registry.entry("dead")
    assert dead is not None and (dead.name, dead.connector) == ("dead", None)
    assert dead.request_finished is None and dead.on_finished is None


def test_an_optional_method_set_to_none_is_left_out() -> None:
    class Odd(Scripted):
        on_load_finished = None  # type: ignore[assignment]

    registry = ConnectorRegistry({"odd": Odd()})
    entry = registry.entry("odd")
    assert entry is not None
    assert entry.on_load_finished is None and entry.on_finished is not None


@pytest.mark.parametrize(
    "attr",
    ["get_num_new_matched_tokens", "on_finished", "on_load_finished", "get_stats", "shutdown"],
)
def test_an_optional_method_that_is_not_callable_is_refused_at_registration(attr: str) -> None:
    """It would otherwise be skipped without a word (an ``on_finished`` never called back)."""
    odd = Scripted()
    setattr(odd, attr, 3)
    registry = ConnectorRegistry({"a": Scripted()})
    with pytest.raises(
        InvalidArgumentError, match=rf"connector\.{attr}=3 \(type int\) must be callable"
    ):
        registry.register("odd", odd)
    assert registry.names() == ("a",)
    with pytest.raises(InvalidArgumentError, match=rf"connector\.{attr}="):
        MultiConnector({"odd": odd})


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (
            lambda: ConnectorRegistry(5),  # type: ignore[arg-type]
            ["connectors=5 (type int) must be a Mapping or an iterable of (name, connector) pairs"],
        ),
        (
            lambda: ConnectorRegistry().register("x", object()),
            ["connector=<object object", "callable request_finished"],
        ),
    ],
)
def test_errors_show_the_value_and_what_was_expected(make: Any, words: list[str]) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        make()
    assert all(w in str(info.value) for w in words), str(info.value)
    assert str(info.value).endswith(words[-1])


def test_entries_is_a_snapshot_replaced_on_every_change() -> None:
    registry = ConnectorRegistry({"a": None})
    before = registry.entries
    assert list(before) == ["a"] and before["a"].connector is None
    assert registry.entries is before  # unchanged registry: the same snapshot
    registry.register("b", None)
    assert registry.entries is not before and list(registry.entries) == ["a", "b"]
    assert list(before) == ["a"]  # a snapshot read once stays what it was
    registry.unregister("a")
    assert list(registry.entries) == ["b"]

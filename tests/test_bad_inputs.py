"""Every public call, given a bad argument, raises a typed error naming it and changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import pytest

from multiconnector import (
    ConnectorRegistry,
    DuplicateConnectorError,
    DuplicateRequestError,
    InvalidArgumentError,
    InvalidNameError,
    MultiConnector,
    MultiConnectorError,
    UnknownConnectorError,
    UnknownRequestError,
)
from tests.connectors import Scripted


def world() -> MultiConnector:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(), "b": Scripted(), "dead": None}))
    for rid in ("p", "f", "c"):
        mc.begin(rid)
    mc.request_finished("f", [1])
    mc.request_finished("c", [1])
    mc.cancel("c")
    return mc


def snapshot(mc: MultiConnector) -> Any:
    records = {rid: attrs.asdict(mc.get(rid)) for rid in mc.request_ids()}  # type: ignore[arg-type]
    return records, mc.registry.items(), mc.counts(), mc.connector_counts()


Call = Callable[[MultiConnector], object]
CASES: list[tuple[str, Call, type[Exception], type[Exception], str]] = [
    # (id, call, our error, builtin, words in the message)
    ("begin int", lambda m: m.begin(7), InvalidArgumentError, TypeError, "request_id=7 (type int)"),
    ("begin empty", lambda m: m.begin(""), InvalidArgumentError, TypeError, "request_id=''"),
    ("begin None", lambda m: m.begin(None), InvalidArgumentError, TypeError, "request_id=None"),
    ("begin held", lambda m: m.begin("f"), DuplicateRequestError, ValueError, "request_id='f'"),
    ("finished rid", lambda m: m.request_finished(b"f"), InvalidArgumentError, TypeError,
     "request_id=b'f'"),
    ("finished blocks str", lambda m: m.request_finished("p", "012"), InvalidArgumentError,
     TypeError, "blocks='012'"),
    ("finished blocks int", lambda m: m.request_finished("p", 3), InvalidArgumentError, TypeError,
     "blocks=3"),
    ("finished blocks None", lambda m: m.request_finished("p", None), InvalidArgumentError,
     TypeError, "blocks=None"),
    ("transfer index", lambda m: m.transfer_finished("f", 0), InvalidNameError, TypeError,
     "name=0 (type int)"),
    ("transfer None name", lambda m: m.transfer_finished("f", None), InvalidNameError, TypeError,
     "name=None"),
    ("transfer rid", lambda m: m.transfer_finished(1.5, "a"), InvalidArgumentError, TypeError,
     "request_id=1.5"),
    ("transfer blocks", lambda m: m.transfer_finished("f", "a", {1: 2}), InvalidArgumentError,
     TypeError, "blocks={1: 2}"),
    ("cancel rid", lambda m: m.cancel(["f"]), InvalidArgumentError, TypeError, "request_id=['f']"),
    ("load name", lambda m: m.load_finished("p", 1), InvalidNameError, TypeError, "name=1"),
    ("load rid", lambda m: m.load_finished(None, "a"), InvalidArgumentError, TypeError,
     "request_id=None"),
    ("match rid", lambda m: m.match_tokens(3), InvalidArgumentError, TypeError, "request_id=3"),
    ("match unknown", lambda m: m.match_tokens("zz"), UnknownRequestError, KeyError,
     "request_id='zz'"),
    ("match negative", lambda m: m.match_tokens("p", -1), InvalidArgumentError, TypeError,
     "num_computed_tokens=-1"),
    ("match float", lambda m: m.match_tokens("p", 2.0), InvalidArgumentError, TypeError,
     "num_computed_tokens=2.0"),
    ("match bool", lambda m: m.match_tokens("p", True), InvalidArgumentError, TypeError,
     "num_computed_tokens=True"),
    ("register name", lambda m: m.register(5, Scripted()), InvalidNameError, TypeError, "name=5"),
    ("register empty", lambda m: m.register("", Scripted()), InvalidNameError, TypeError,
     "name=''"),
    ("register taken", lambda m: m.register("a", Scripted()), DuplicateConnectorError, ValueError,
     "name='a'"),
    ("register object", lambda m: m.register("z", object()), InvalidArgumentError, TypeError,
     "connector="),
    ("unregister unknown", lambda m: m.unregister("zz"), UnknownConnectorError, KeyError,
     "name='zz'"),
    ("unregister int", lambda m: m.unregister(0), InvalidNameError, TypeError, "name=0"),
    ("get list", lambda m: m.get([]), InvalidArgumentError, TypeError, "request_id=[]"),
    ("peek int", lambda m: m.peek(3), InvalidArgumentError, TypeError, "request_id=3"),
    ("registry item", lambda m: m.registry[3], InvalidNameError, TypeError, "name=3"),
    ("registry unknown", lambda m: m.registry["zz"], UnknownConnectorError, KeyError, "name='zz'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "error", "builtin", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_argument_raises_typed_error_and_changes_nothing(
    call: Call, error: type[Exception], builtin: type[Exception], words: str
) -> None:
    mc = world()
    before = snapshot(mc)
    with pytest.raises(error) as info:
        call(mc)
    assert isinstance(info.value, MultiConnectorError)
    assert isinstance(info.value, builtin)
    assert words in str(info.value), str(info.value)
    assert snapshot(mc) == before


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"registry": [("a", None)]}, "registry="),
        ({"trace": 1}, "trace=1"),
        ({"allow_equal_params": "no"}, "allow_equal_params='no'"),
        ({"stripes": 3}, "stripes=3"),
        ({"stripes": 0}, "stripes=0"),
        ({"stripes": "8"}, "stripes='8'"),
    ],
)
def test_bad_constructor_arguments(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        MultiConnector(**kwargs)
    assert isinstance(info.value, TypeError) and words in str(info.value)


def test_ignorable_events_are_not_errors() -> None:
    """The other side of the table: unknown ids and names are outcomes, not exceptions."""
    mc = world()
    before = snapshot(mc)[:2]
    assert mc.transfer_finished("zz", "a").ignored
    assert mc.transfer_finished("f", "").ignored
    assert mc.load_finished("zz", "zz").ignored
    assert mc.cancel("zz").ignored
    assert mc.request_finished("zz")[0].ignored
    assert snapshot(mc)[:2] == before

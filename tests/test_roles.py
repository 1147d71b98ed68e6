"""Roles per connector: a save-only connector never loads, a load-only one is never a saver."""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from multiconnector import (
    ConnectorFailures,
    ConnectorRegistry,
    InvalidArgumentError,
    InvalidValueError,
    MultiConnector,
    Outcome,
    Role,
    RoleError,
    ShutDownError,
    State,
    UnknownConnectorError,
)
from tests.connectors import Scripted


class Recording(Scripted):
    """A Scripted connector that also records every ``get_num_new_matched_tokens`` call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.asked: list[tuple[str, int]] = []

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int | None:
        self.asked.append((request_id, num_computed_tokens))
        return super().get_num_new_matched_tokens(request_id, num_computed_tokens)


class Answers:
    """request_finished answers ``answer`` as it is, whatever it is."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.transfers: list[str] = []

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> Any:
        return self.answer

    def on_finished(self, request_id: str, blocks: Sequence[int]) -> None:
        self.transfers.append(request_id)


def test_role_values() -> None:
    assert [r.value for r in Role] == ["save", "load", "both"]
    assert Role("load") is Role.load


# -- a save-only connector is never asked to load -------------------------------------------------


def test_a_save_only_connector_is_never_asked_for_matched_tokens() -> None:
    store = Recording(tokens=7)
    other = Recording(tokens=3)
    mc = MultiConnector(ConnectorRegistry({"store": store, "other": other}))
    mc.register("late", Recording(tokens=9), Role.both)
    mc.unregister("late")
    mc.registry.unregister("store")
    mc.register("store", store, Role.save)
    mc.begin("r1")
    assert mc.match_tokens("r1", 5) == 3
    assert store.asked == []
    assert other.asked == [("r1", 5)]
    assert mc.get("r1").loader == "other"  # type: ignore[union-attr]


def test_a_save_only_connector_is_never_a_loader() -> None:
    store = Recording(tokens=7)
    mc = MultiConnector(ConnectorRegistry({"store": store}, roles={"store": Role.save}))
    mc.begin("r1")
    assert mc.match_tokens("r1") == 0
    assert store.asked == []
    record = mc.get("r1")
    assert record is not None and record.loader is None
    # Its load report is one it never committed to: ignored, no callback.
    assert mc.load_finished("r1", "store") is Outcome.phantom
    assert store.loads == []
    # It still saves.
    assert mc.request_finished("r1") == (Outcome.applied, None)
    assert mc.get("r1").awaiting == ("store",)  # type: ignore[union-attr]
    assert mc.transfer_finished("r1", "store", [1]) is Outcome.applied
    assert store.on_finished_calls == [("r1", (1,))]
    assert [r.state for r in mc.take()] == [State.finished]


# -- a load-only connector is never a saver -------------------------------------------------------


def test_a_load_only_connector_loads_and_is_not_asked_to_confirm_a_save() -> None:
    loader = Recording(saves=False, params={"from": "loader"}, tokens=4)
    mc = MultiConnector(ConnectorRegistry({"loader": loader}, roles={"loader": Role.load}))
    mc.begin("r1")
    assert mc.match_tokens("r1") == 4
    assert mc.load_finished("r1", "loader") is Outcome.applied
    assert loader.loads == ["r1"]
    assert mc.request_finished("r1") == (Outcome.applied, {"from": "loader"})
    assert [r.state for r in mc.take()] == [State.finished]


def test_a_load_only_connector_promising_a_save_is_a_role_error_and_is_not_awaited() -> None:
    disk = Scripted(saves=True, params={"disk": 1})
    loader = Scripted(saves=True, params={"loader": 1})
    mc = MultiConnector(
        ConnectorRegistry({"loader": loader, "disk": disk}, roles={"loader": Role.load})
    )
    mc.begin("r1")
    with pytest.raises(ConnectorFailures) as info:
        mc.request_finished("r1", [3])
    # The defined path of a connector that raised: the others asked and applied, then raised.
    assert info.value.failed == ("loader",)
    (error,) = info.value.exceptions
    assert isinstance(error, RoleError) and isinstance(error, ValueError)
    assert error.connector == "loader"
    assert error.answer == (True, {"loader": 1})
    assert "'loader'" in str(error) and "Role.load" in str(error)
    assert info.value.result == (Outcome.applied, {"disk": 1})
    record = mc.get("r1")
    assert record is not None
    assert record.state is State.finishing
    assert record.awaiting == ("disk",)
    assert record.expected == ("disk",)
    assert disk.finished_calls == loader.finished_calls == [("r1", (3,))]
    # Its transfer report is one it never committed to: ignored, no callback.
    assert mc.transfer_finished("r1", "loader") is Outcome.phantom
    assert loader.on_finished_calls == []
    assert mc.take() == []
    assert mc.transfer_finished("r1", "disk") is Outcome.applied
    (taken,) = mc.take()
    assert (taken.request_id, taken.state, taken.abandoned) == ("r1", State.finished, ())
    assert len(mc) == 0


def test_a_lone_load_only_connector_promising_a_save_leaves_the_request_free() -> None:
    mc = MultiConnector()
    mc.register("loader", Scripted(saves=True), role=Role.load)
    mc.begin("r1")
    with pytest.raises(ConnectorFailures) as info:
        mc.request_finished("r1")
    assert info.value.result == (Outcome.applied, None)
    (taken,) = mc.take()
    assert taken.state is State.finished
    assert taken.awaiting == ()
    assert mc.counts()[Outcome.applied] == 1


@pytest.mark.parametrize(
    "answer",
    [True, None, (True,), (False, 3), (True, None, None), [False, None], ("no", None)],
    ids=repr,
)
def test_a_load_only_connectors_garbage_answer_is_a_role_error_not_a_wait(answer: Any) -> None:
    """A garbage answer is awaited from a connector that may save (it may have started one);
    a load-only connector never saves, so it is not awaited."""
    mc = MultiConnector(ConnectorRegistry({"loader": Answers(answer)}, roles={"loader": Role.load}))
    mc.begin("r1")
    with pytest.raises(ConnectorFailures) as info:
        mc.request_finished("r1")
    (error,) = info.value.exceptions
    assert isinstance(error, RoleError)
    assert error.answer is answer
    (taken,) = mc.take()
    assert taken.state is State.finished and taken.expected == ()


def test_a_role_error_pickles() -> None:
    error = RoleError("m", connector="c", answer=(True, None))
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.connector, copy.answer) == ("m", "c", (True, None))


# -- arguments ------------------------------------------------------------------------------------


def test_roles_are_queried_by_name() -> None:
    registry = ConnectorRegistry(
        [("a", Scripted()), ("b", None), ("c", Scripted())],
        roles={"a": Role.save, "b": Role.load},
    )
    assert [registry.role(n) for n in ("a", "b", "c")] == [Role.save, Role.load, Role.both]
    with pytest.raises(UnknownConnectorError, match="'d'"):
        registry.role("d")
    registry.unregister("a")
    registry.register("a", Scripted())
    assert registry.role("a") is Role.both  # a new registration, a new role
    assert registry.entry("a").role is Role.both  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("roles", "error", "words"),
    [
        ({"nobody": Role.save}, InvalidValueError, "roles="),
        ({3: Role.save}, InvalidValueError, "roles="),
        ({"a": "save"}, InvalidArgumentError, r"roles\['a'\]='save'.*Role\('save'\)"),
        ({"a": None}, InvalidArgumentError, r"roles\['a'\]=None"),
        ([("a", Role.save)], InvalidArgumentError, "roles="),
        ("a", InvalidArgumentError, "roles="),
    ],
)
def test_bad_roles_are_refused(roles: Any, error: type[Exception], words: str) -> None:
    connector = Scripted()
    with pytest.raises(error, match=words):
        ConnectorRegistry({"a": connector}, roles=roles)
    assert connector.finished_calls == []


@pytest.mark.parametrize("role", ["save", None, 1, Role])
def test_a_bad_role_is_refused_by_register_and_nothing_changes(role: Any) -> None:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted()}))
    entries = mc.registry.entries
    with pytest.raises(InvalidArgumentError, match="role="):
        mc.register("b", Scripted(), role)
    with pytest.raises(InvalidArgumentError, match="role="):
        mc.registry.register("b", None, role=role)
    assert mc.registry.entries is entries
    assert "b" not in mc.registry


def test_register_after_shutdown_is_refused_whatever_the_role() -> None:
    mc = MultiConnector()
    mc.shutdown()
    with pytest.raises(ShutDownError):
        mc.register("a", Scripted(), Role.save)


class Plain:
    def __init__(self, saves: bool, params: Mapping[str, Any] | None, tokens: int) -> None:
        self.answer = (saves, params)
        self.tokens = tokens

    def request_finished(
        self, request_id: str, blocks: Sequence[int]
    ) -> tuple[bool, Mapping[str, Any] | None]:
        return self.answer

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int:
        return self.tokens


def _lifecycle(mc: MultiConnector) -> list[Any]:
    mc.begin("r1")
    seen: list[Any] = [mc.match_tokens("r1")]
    seen.append(mc.request_finished("r1"))
    for name in mc.registry.ready():
        seen.append(mc.transfer_finished("r1", name))
        seen.append(mc.load_finished("r1", name))
    seen += [(r.request_id, r.state, r.loader, r.expected) for r in mc.take()]
    return seen


def test_the_default_role_both_changes_nothing() -> None:
    def connectors() -> dict[str, Plain]:
        return {"a": Plain(False, {"a": 1}, 0), "b": Plain(True, None, 2), "c": Plain(True, {}, 5)}

    plain = _lifecycle(MultiConnector(ConnectorRegistry(connectors())))
    both = _lifecycle(
        MultiConnector(ConnectorRegistry(connectors(), roles=dict.fromkeys("abc", Role.both)))
    )
    assert plain == both
    registry = ConnectorRegistry(connectors(), roles={})
    entry = registry.entry("b")
    assert entry is not None and entry.role is Role.both
    assert entry.request_finished == entry.connector.request_finished  # type: ignore[union-attr]


def test_request_finished_by_refuses_a_load_only_saver_and_changes_nothing() -> None:
    """A caller that names the savers itself cannot make a request await a load-only
    connector (it never reports a save): RoleError, and the request is as it was."""
    mc = MultiConnector(
        ConnectorRegistry({"a": Scripted(), "l": Scripted()}, roles={"l": Role.load})
    )
    mc.begin("r")
    with pytest.raises(RoleError, match="'l'"):
        mc.request_finished_by("r", ["a", "l"])
    record = mc.peek("r")
    assert record is not None and record.state.name == "pending" and record.awaiting == ()
    assert mc.request_finished_by("r", ["a"]) is Outcome.applied
    assert mc.peek("r").awaiting == ("a",)  # type: ignore[union-attr]

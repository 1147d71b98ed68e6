"""Which children a per-step or per-layer hook calls: not those whose class leaves it a no-op.

vLLM's ``MultiConnector`` calls every child for every hook, every layer; ours calls only the
children that do something there (docs/vllm.md, "Which children a hook calls"). What vLLM's base
class does by default is read from vLLM's own code, so a vLLM whose defaults start doing
something makes these tests fail rather than skip its children silently.
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

from collections.abc import Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402
from unittest.mock import MagicMock  # noqa: E402

import pytest  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorRole,
)
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (  # noqa: E402
    ExampleConnector,
)
from vllm_children import QuietConnector, ScriptedConnector, child, script  # noqa: E402
from vllm_harness import make_config, make_connector  # noqa: E402

from multiconnector.vllm.fanout import HOOKS, Fanout, calls, does_nothing  # noqa: E402

pytestmark = pytest.mark.vllm

PER_LAYER = ("start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save")
#: Hooks whose base-class default is not a constant answer (calls() knows them by name).
NOT_CONSTANT = ("get_transfer_results", "get_block_ids_with_load_errors")


def _pass() -> None:
    pass


def _docstring() -> None:
    """Only a docstring."""


def _return_none() -> None:
    return None


def _return_one() -> int:
    return 1


def _side_effect() -> None:
    print("saved")


def _generator() -> Iterator[None]:
    return
    yield


@pytest.mark.parametrize("hook", [hook for hook in HOOKS if hook not in NOT_CONSTANT])
def test_vllms_defaults_answer_nothing(hook: str) -> None:
    """Every hook's default in vLLM's base class is a no-op this module recognizes."""
    assert does_nothing(KVConnectorBase_V1.__dict__[hook], hook)


@pytest.mark.parametrize(
    ("function", "expected"),
    [
        (_pass, True),
        (_docstring, True),
        (_return_none, True),
        (lambda: None, True),
        (_return_one, False),
        (_side_effect, False),
        (_generator, False),
        (print, False),
    ],
)
def test_what_does_nothing(function: Any, expected: bool) -> None:
    assert does_nothing(function, "save_kv_layer") is expected


def test_a_constant_answer_counts_only_where_it_means_nothing() -> None:
    assert does_nothing(lambda: (), "take_events")
    assert not does_nothing(lambda: None, "take_events")  # list(None) raises: a failure to see
    assert does_nothing(lambda: (None, None), "get_finished")
    assert not does_nothing(lambda: (), "save_kv_layer")


def test_vllms_example_connector_is_not_called_per_layer_where_it_does_nothing() -> None:
    example = object.__new__(ExampleConnector)
    skipped = {hook for hook in HOOKS if not calls(example, hook)}
    assert {"wait_for_layer_load", "wait_for_save", "finish_forward"} <= skipped
    assert calls(example, "start_load_kv") and calls(example, "save_kv_layer")


def test_get_transfer_results_follows_get_finished() -> None:
    class Finishes(QuietConnector):
        get_transfer_results = KVConnectorBase_V1.get_transfer_results

        def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str], None]:
            return set(finished_req_ids), None

    class Silent(QuietConnector):
        get_transfer_results = KVConnectorBase_V1.get_transfer_results

    assert calls(object.__new__(Finishes), "get_transfer_results")
    assert not calls(object.__new__(Silent), "get_transfer_results")


def test_mocks_and_attributes_of_the_child_itself_are_called() -> None:
    mock = MagicMock(spec_set=KVConnectorBase_V1)
    assert all(calls(mock, hook) for hook in HOOKS)
    quiet = object.__new__(QuietConnector)
    quiet.save_kv_layer = lambda *args, **kwargs: None  # type: ignore[method-assign]
    assert calls(quiet, "save_kv_layer")
    assert not calls(quiet, "wait_for_layer_load")


def test_fanout_lists_children_in_configuration_order() -> None:
    quiet, loud = object.__new__(QuietConnector), object.__new__(ScriptedConnector)
    fan = Fanout((("q", quiet), ("a", loud), ("b", loud)))
    assert fan.of("save_kv_layer") == ("a", "b")
    assert fan.of("get_transfer_results") == ("q", "a", "b")  # Quiet overrides it for real


def _worker(model: Path, ours: bool = True) -> tuple[Any, Any, Any]:
    loud, quiet = script(), script()
    config = make_config(
        model, [child("loud", loud), child("quiet", quiet, "QuietConnector")], ours=ours
    )
    return make_connector(config, KVConnectorRole.WORKER), loud, quiet


#: The hooks :func:`_per_layer_calls` calls, in order.
PER_LAYER_CALLS = (
    "start_load_kv",
    "wait_for_layer_load",
    "save_kv_layer",
    "wait_for_layer_load",
    "save_kv_layer",
    "wait_for_save",
)


def _per_layer_calls(connector: Any) -> None:
    connector.start_load_kv(None)
    for layer in ("layer.0", "layer.1"):
        connector.wait_for_layer_load(layer)
        connector.save_kv_layer(layer, None, None)
    connector.wait_for_save()


def test_a_child_that_does_nothing_per_layer_is_not_called(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    connector, loud, _ = _worker(model)

    def raises(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("called")

    for hook in PER_LAYER:  # were the quiet child called, its failure would be counted
        monkeypatch.setattr(QuietConnector, hook, raises)
    _per_layer_calls(connector)
    assert "quiet" not in connector.child_failures()
    assert [call[0] for call in loud.calls] == list(PER_LAYER_CALLS)


def test_vllms_class_calls_every_child_every_layer(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The difference, measured on vLLM's own class: it calls the quiet child too."""
    connector, _, _ = _worker(model, ours=False)
    seen: list[str] = []
    for hook in PER_LAYER:
        monkeypatch.setattr(QuietConnector, hook, lambda *a, _h=hook, **k: seen.append(_h))
    _per_layer_calls(connector)
    assert seen == list(PER_LAYER_CALLS)


def test_a_failing_child_is_still_that_childs_failure(model: Path) -> None:
    connector, loud, _ = _worker(model)
    loud.raise_in["save_kv_layer"] = RuntimeError("disk full")
    connector.save_kv_layer("layer.0", None, None)
    assert connector.child_failures() == {"loud": {"save_kv_layer": 1}}


def test_children_put_in_place_are_fanned_out_anew(model: Path) -> None:
    connector, _, _ = _worker(model)
    assert connector._kids.fan.of("save_kv_layer") == ("loud",)
    loud, quiet = connector.sub_connectors
    connector._connectors = [quiet, loud]  # by position: "loud" is now the quiet object
    assert connector._kids.fan.of("save_kv_layer") == ("quiet",)


def test_a_class_with_its_own_attribute_lookup_is_called() -> None:
    """vLLM's own tests wrap a child in a class whose ``__getattribute__`` logs every method
    read: what it does is not in the method's code, so it is called for every hook."""

    class Logged(QuietConnector):
        def __getattribute__(self, name: str) -> Any:
            return object.__getattribute__(self, name)

    logged = object.__new__(Logged)
    assert all(calls(logged, hook) for hook in HOOKS)
    assert not calls(object.__new__(QuietConnector), "wait_for_layer_load")

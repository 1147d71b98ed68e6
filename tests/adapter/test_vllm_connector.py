"""The connector's methods called directly, with scripted children: both roles, no scheduler.

The worker side (per-layer load and save) needs a GPU model runner to run for real, so its
methods are exercised here the way the runner calls them.
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import dataclasses  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import traceback  # noqa: E402
from contextlib import nullcontext  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import msgspec  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from prometheus_client import REGISTRY, Counter, Gauge, Histogram  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorRole,
    KVConnectorTransferResults,
)
from vllm.distributed.kv_transfer.kv_connector.v1.example_connector import (  # noqa: E402
    ExampleConnectorMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.multi_connector import (  # noqa: E402
    MultiKVConnectorStats,
)
from vllm.distributed.kv_transfer.kv_connector.v1.nixl import NixlKVConnectorStats  # noqa: E402
from vllm.v1.metrics.prometheus import unregister_vllm_metrics  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm_children import (  # noqa: E402
    ScriptedConnector,
    ScriptedHandshake,
    ScriptedMetadata,
    ScriptedStats,
    ScriptedWorkerMetadata,
    child,
    script,
)
from vllm_harness import implemented, make_config, make_connector, make_request  # noqa: E402

import multiconnector.vllm.worker as worker_module  # noqa: E402
from multiconnector import (  # noqa: E402
    ConnectorFailures,
    DuplicateConnectorError,
    InvalidArgumentError,
    InvalidNameError,
    Outcome,
    State,
)
from multiconnector.vllm import (  # noqa: E402
    ChildClassError,
    ChildrenConflictError,
    ChildStartError,
    MetadataMismatchError,
    MultiConnector,
    NamedHandshakeMetadata,
    NamedMultiConnectorMetadata,
    NamedMultiConnectorStats,
    NamedMultiConnectorWorkerMetadata,
    NamedPromMetrics,
    child_specs,
    msgspec_dec_hook,
    msgspec_enc_hook,
)
from multiconnector.vllm.scheduler import WORKERS  # noqa: E402
from multiconnector.vllm.wire import ADAPTER_KEY  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]  # vLLM engine start-up


def named(name: Any, kv_connector: str) -> dict[str, Any]:
    """A child config; ``name`` (unless ``None``) where vLLM's checks accept it."""
    extra = {} if name is None else {"multiconnector_name": name}
    return {"kv_connector": kv_connector, "kv_role": "kv_both", "kv_connector_extra_config": extra}


def connector(model: Path, role: KVConnectorRole, **scripts: Any) -> Any:
    return make_connector(make_config(model, [child(name, s) for name, s in scripts.items()]), role)


def worker(model: Path, **scripts: Any) -> Any:
    return connector(model, KVConnectorRole.WORKER, **scripts)


def metadata(w: Any, **plan: Any) -> NamedMultiConnectorMetadata:
    return NamedMultiConnectorMetadata(
        {name: ScriptedMetadata(name) for name in w.children}, **plan
    )


# -- the whole base API ------------------------------------------------------------------------


def test_overrides_keep_the_base_signatures() -> None:
    for name in implemented(MultiConnector):
        base = inspect.getattr_static(KVConnectorBase_V1, name, None)
        if name.startswith("_") or not callable(base) or isinstance(base, property):
            continue
        ours = inspect.getattr_static(MultiConnector, name)
        assert type(ours) is type(base), name  # classmethods stay classmethods
        params = list(inspect.signature(getattr(KVConnectorBase_V1, name)).parameters)
        assert list(inspect.signature(getattr(MultiConnector, name)).parameters) == params


def test_the_roles_methods_override_the_base_ones() -> None:
    """The role mixins come before vLLM's base class: theirs are the methods vLLM calls."""
    mro = MultiConnector.__mro__
    assert mro.index(KVConnectorBase_V1) > max(
        i for i, klass in enumerate(mro) if klass.__module__.startswith("multiconnector.")
    )
    for name in implemented(MultiConnector) - {"__dict__", "__weakref__"}:
        owner = next(klass for klass in mro if name in vars(klass))
        assert owner.__module__.startswith("multiconnector."), name
        assert inspect.getattr_static(MultiConnector, name) is vars(owner)[name], name


# -- configuration -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "error", "message"),
    [
        ({}, InvalidArgumentError, "must be a non-empty list"),
        ({"connectors": []}, InvalidArgumentError, "must be a non-empty list"),
        ({"connectors": ["ExampleConnector"]}, InvalidArgumentError, "must be a mapping"),
        (
            {"connectors": [{"kv_connector": "X", "kv_role": "kv_both", "name": "a"}]},
            InvalidArgumentError,
            r"\['name'\]='a': a child's name goes in its own kv_connector_extra_config",
        ),
        ({"connectors": [named("", "X")]}, InvalidNameError, "non-empty"),
        ({"connectors": [named(3, "X")]}, InvalidNameError, "int"),
        ({"connectors": [{"kv_role": "kv_both"}]}, InvalidArgumentError, "kv_connector"),
        (
            {"connectors": [{"kv_connector": "X", "kv_connector_extra_config": "z"}]},
            InvalidArgumentError,
            "must be a mapping",
        ),
        (
            {"connectors": [{"kv_connector": "X", "kv_role": "kv_both", "colour": "red"}]},
            InvalidArgumentError,
            "not a valid KVTransferConfig",
        ),
        (
            {"connectors": [{"kv_connector": "X"}]},
            InvalidArgumentError,
            "specify kv_role",
        ),
        (
            {"connectors": [named("a", "X"), named("a", "Y")]},
            DuplicateConnectorError,
            "unique",
        ),
        (  # an explicit name that takes a default one
            {"connectors": [named("X#2", "Y"), named(None, "X"), named(None, "X")]},
            DuplicateConnectorError,
            r"name 'X#2' is already taken by kv_connector_extra_config\['connectors'\]\[0\]",
        ),
    ],
)
def test_bad_children_are_rejected_with_a_clear_message(
    extra: dict[str, Any], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        child_specs(extra)


def test_children_are_named_after_their_class_unless_named() -> None:
    specs = child_specs(
        {"connectors": [named(None, "A"), named("mine", "A"), named(None, "B"), named(None, "A")]}
    )
    assert [s.name for s in specs] == ["A", "mine", "B", "A#3"]
    # The name key is ours: the child is built without it.
    assert specs[1].config.kv_connector_extra_config == {}


def test_a_bad_child_starts_nothing(model: Path) -> None:
    a = script()
    config = make_config(model, [child("a", a), named("a", "X")])
    with pytest.raises(DuplicateConnectorError):
        make_connector(config, KVConnectorRole.SCHEDULER)
    assert a.instances == []


def test_children_take_the_parents_engine_id_unless_set() -> None:
    mine = {**named(None, "ExampleConnector"), "engine_id": "own"}
    first, second = child_specs(
        {"connectors": [named(None, "ExampleConnector"), mine]}, engine_id="engine-7"
    )
    assert first.config.engine_id == "engine-7"
    assert second.config.engine_id == "own"


@pytest.mark.parametrize(
    ("kv_connector", "module_path"),
    [("NoSuchConnector", None), ("NoSuchConnector", "vllm_children"), ("X", "no.such.module")],
)
def test_a_child_class_that_cannot_be_loaded_is_named(
    model: Path, kv_connector: str, module_path: str | None
) -> None:
    entry = child("cache", script())
    entry["kv_connector"] = kv_connector
    entry["kv_connector_module_path"] = module_path
    config = make_config(model, [child("a", script()), entry])
    with pytest.raises(ChildClassError) as caught:
        make_connector(config, KVConnectorRole.SCHEDULER)
    assert caught.value.name == "cache"
    assert "child connector 'cache'" in str(caught.value)
    assert f"kv_connector={kv_connector!r}" in str(caught.value)
    assert isinstance(caught.value, ValueError)  # as vLLM's "Unsupported connector type"


def test_a_failed_constructor_names_the_child_and_reports_shutdown_failures(
    model: Path,
) -> None:
    a = script(shutdown_error=RuntimeError("a stuck"))
    b = script()
    c = script(init_error=OSError("no device"))
    config = make_config(model, [child("a", a), child("b", b), child("c", c)])
    with pytest.raises(ChildStartError) as caught:
        make_connector(config, KVConnectorRole.SCHEDULER)
    error = caught.value
    assert (error.name, error.started) == ("c", ("a", "b"))
    assert (a.shutdowns, b.shutdowns) == (1, 1)
    assert list(error.shutdown_failures) == ["a"]
    assert "'c'" in str(error)
    assert "'a' raised RuntimeError('a stuck')" in str(error)
    assert isinstance(error.__cause__, OSError)
    assert isinstance(error, RuntimeError)


def test_class_level_queries_ask_every_child(model: Path, tmp_path: Path) -> None:
    example = {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(tmp_path)},
    }
    config = make_config(model, [example, child("a", script())])
    extra = config.kv_transfer_config.kv_connector_extra_config
    assert MultiConnector.requires_piecewise_for_cudagraph(extra) is False
    assert MultiConnector.supports_sleep_mode(config.kv_transfer_config) is True
    assert MultiConnector.get_required_kvcache_layout(config) is None


# -- metadata across processes -----------------------------------------------------------------


def test_metadata_survives_a_pickle_round_trip() -> None:
    example = ExampleConnectorMetadata()
    example.add_request([1, 2, 3, 4], [0], 2, is_store=True, mm_hashes=[])
    sent = NamedMultiConnectorMetadata(
        {"disk": example, "pd": ScriptedMetadata("pd", ["r1"])},
        savers={"r1": ("disk", "pd")},
        loads={"r2": "pd"},
    )
    received = pickle.loads(pickle.dumps(sent))
    assert received.savers == {"r1": ("disk", "pd")}
    assert received.loads == {"r2": "pd"}
    assert received.children["pd"] == ScriptedMetadata("pd", ["r1"])
    assert torch.equal(
        received.children["disk"].requests[0].slot_mapping, example.requests[0].slot_mapping
    )


def test_metadata_survives_a_msgspec_round_trip() -> None:
    sent = NamedMultiConnectorMetadata(
        {"a": ScriptedMetadata("a", ["r1", "r2"]), "b": ScriptedMetadata("b")},
        savers={"r1": ("a", "b")},
        loads={"r2": "b"},
    )
    data = msgspec.msgpack.encode(sent, enc_hook=msgspec_enc_hook)
    received = msgspec.msgpack.decode(
        data, type=NamedMultiConnectorMetadata, dec_hook=msgspec_dec_hook
    )
    assert received == sent
    assert type(received.children["a"]) is ScriptedMetadata
    assert received.savers["r1"] == ("a", "b")


def test_msgspec_decoding_refuses_a_type_that_is_not_metadata() -> None:
    forged = msgspec.msgpack.encode({"children": {"a": ["builtins:dict", {}]}})
    with pytest.raises(msgspec.ValidationError, match="KVConnectorMetadata subclass"):
        msgspec.msgpack.decode(forged, type=NamedMultiConnectorMetadata, dec_hook=msgspec_dec_hook)


def test_metadata_must_name_exactly_the_children(model: Path) -> None:
    w = worker(model, a=script(), b=script())
    with pytest.raises(MetadataMismatchError, match=r"missing \['b'\]"):
        w.bind_connector_metadata(NamedMultiConnectorMetadata({"a": ScriptedMetadata()}))
    with pytest.raises(MetadataMismatchError, match=r"unexpected \['z'\]"):
        w.bind_connector_metadata(metadata(w, savers={"r1": ("a", "z")}))
    with pytest.raises(InvalidArgumentError):
        w.bind_connector_metadata(ScriptedMetadata())


def test_each_child_is_bound_its_own_metadata_and_cleared(model: Path) -> None:
    w = worker(model, a=script(), b=script())
    w.bind_connector_metadata(metadata(w))
    assert w.has_connector_metadata()
    assert [c.bound[-1].label for c in w.children.values()] == ["a", "b"]
    w.handle_preemptions(metadata(w))
    w.clear_connector_metadata()
    assert not w.has_connector_metadata()
    assert not any(c.has_connector_metadata() for c in w.children.values())


# -- worker: releasing saves -------------------------------------------------------------------


def test_a_request_is_released_once_every_saver_reported(model: Path) -> None:
    a, b, c = script(), script(), script()
    w = worker(model, a=a, b=b, c=c)
    w.bind_connector_metadata(metadata(w, savers={"r1": ("a", "b")}))
    a.sending.add("r1")
    c.sending.add("r1")  # phantom
    c.sending.add("r9")  # a request nobody saves
    assert w.get_finished({"r1"}) == (None, None)
    a.sending.add("r1")  # duplicate
    assert w.get_finished(set()) == (None, None)
    b.sending.add("r1")
    assert w.get_finished(set()) == ({"r1"}, None)
    b.sending.add("r1")  # late
    assert w.get_finished(set()) == (None, None)
    counts = w.connector_counts()
    assert counts["a"] == {Outcome.applied: 1, Outcome.duplicate: 1}
    assert counts["b"] == {Outcome.applied: 1, Outcome.unknown_request: 1}
    assert counts["c"] == {Outcome.phantom: 1, Outcome.unknown_request: 1}
    assert len(w.ledger) == 0


@pytest.mark.parametrize("trouble", ["raises", "garbage ids"])
def test_a_child_failing_in_a_step_holds_back_no_other_childs_completions(
    model: Path, trouble: str
) -> None:
    # a's report releases r1 (and a's load completion is due) in the step where b fails: b's
    # failure is b's, counted; a's completions are returned in that very step, once.
    a = script()
    b = (
        script(raise_in={"get_transfer_results": RuntimeError("b")})
        if trouble == "raises"
        else script()
    )
    w = worker(model, a=a, b=b)
    w.bind_connector_metadata(metadata(w, savers={"r1": ("a",)}, loads={"r2": "a"}))
    a.sending.add("r1")
    a.recving.add("r2")
    if trouble == "garbage ids":
        b.sending.add(3)  # type: ignore[arg-type]
    assert w.get_finished(set()) == ({"r1"}, {"r2"})
    assert w.child_failures() == {"b": {"get_transfer_results": 1}}
    assert len(w.ledger) == 0
    b.raise_in.clear()
    assert w.get_finished(set()) == (None, None)  # returned once


def test_binding_the_same_metadata_twice_changes_nothing(model: Path) -> None:
    a = script()
    w = worker(model, a=a, b=script())
    shipped = metadata(w, savers={"r1": ("a",)})
    w.bind_connector_metadata(shipped)
    w.bind_connector_metadata(shipped)
    a.sending.add("r1")
    assert w.get_finished(set()) == ({"r1"}, None)


# -- worker: load completions ------------------------------------------------------------------


def test_one_load_completion_per_load_from_the_loader(model: Path) -> None:
    a, b = script(), script()
    w = worker(model, a=a, b=b)
    w.bind_connector_metadata(metadata(w, loads={"r1": "a"}))
    b.recving.add("r1")  # phantom: b does not load r1
    assert w.get_finished(set()) == (None, None)
    a.recving.add("r1")
    a.failed.add("r1")
    results = w.get_transfer_results(set())
    assert (results.finished_recving, results.failed_recving) == ({"r1"}, {"r1"})
    a.recving.add("r1")  # duplicate
    assert w.get_finished({"r1"}) == (None, None)
    a.recving.add("r1")  # late: the request is gone
    assert w.get_finished(set()) == (None, None)
    assert w.connector_counts()["a"] == {
        Outcome.applied: 1,
        Outcome.duplicate: 1,
        Outcome.unknown_request: 1,
    }
    assert w.connector_counts()["b"] == {Outcome.phantom: 1}
    assert len(w.load_tracker) == 0


def test_a_request_finished_while_loading_gets_its_one_completion(model: Path) -> None:
    a = script()
    w = worker(model, a=a)
    w.bind_connector_metadata(metadata(w, loads={"r1": "a"}))
    assert w.get_finished({"r1"}) == (None, None)  # aborted before the load finished
    assert "r1" in w.load_tracker
    a.recving.add("r1")
    assert w.get_finished(set()) == (None, {"r1"})
    assert len(w.load_tracker) == 0


def test_a_request_loaded_again_after_preemption_takes_the_new_loader(model: Path) -> None:
    a, b = script(), script()
    w = worker(model, a=a, b=b)
    w.bind_connector_metadata(metadata(w, loads={"r1": "a"}))
    a.recving.add("r1")
    assert w.get_finished(set()) == (None, {"r1"})
    w.bind_connector_metadata(metadata(w, loads={"r1": "b"}))
    a.recving.add("r1")
    b.recving.add("r1")
    assert w.get_finished(set()) == (None, {"r1"})
    assert w.connector_counts()["a"][Outcome.phantom] == 1


# -- worker: the other fan-outs ----------------------------------------------------------------


def test_every_child_is_called_and_every_failure_counted(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = script(raise_in={"wait_for_save": RuntimeError("a")})
    b = script(raise_in={"wait_for_save": OSError("b")})
    c = script()
    w = worker(model, a=a, b=b, c=c)
    with caplog.at_level("WARNING", logger="multiconnector"):
        w.wait_for_save()
    assert w.child_failures() == {"a": {"wait_for_save": 1}, "b": {"wait_for_save": 1}}
    assert "'a' failed in wait_for_save: RuntimeError: a" in caplog.text
    assert "'b' failed in wait_for_save: OSError: b" in caplog.text
    assert c.names("wait_for_save") == [("wait_for_save",)]


@pytest.mark.parametrize(
    ("role", "method", "args"),
    [
        (KVConnectorRole.SCHEDULER, "on_new_request", (make_request("r1"),)),
        (KVConnectorRole.WORKER, "clear_connector_metadata", ()),
        (KVConnectorRole.WORKER, "get_kv_connector_kv_cache_events", ()),
        (KVConnectorRole.WORKER, "wait_for_save", ()),
    ],
)
def test_a_per_step_call_reaches_every_child_and_counts_every_failure(
    model: Path, role: Any, method: str, args: tuple[Any, ...]
) -> None:
    a = script(raise_in={method: RuntimeError("a")})
    b, c = script(), script(raise_in={method: OSError("c")})
    built = connector(model, role, a=a, b=b, c=c)
    getattr(built, method)(*args)  # a child's failure is never the call's
    getattr(built, method)(*args)
    assert built.child_failures() == {"a": {method: 2}, "c": {method: 2}}
    assert [len(s.names(method)) for s in (a, b, c)] == [2, 2, 2]


def test_layer_calls_reach_every_child(model: Path) -> None:
    a, b = script(), script()
    w = worker(model, a=a, b=b)
    w.register_kv_caches({})
    w.start_load_kv(None)
    w.wait_for_layer_load("layer.0")
    w.save_kv_layer("layer.0", torch.zeros(1), None)
    w.finish_forward()
    w.reset_capture_state()
    w.unregister_kv_caches()
    w.restore_kv_caches()
    w.set_host_xfer_buffer_ops(lambda *args: None)
    for s in (a, b):
        assert [call[0] for call in s.calls] == [
            "start_load_kv",
            "wait_for_layer_load",
            "save_kv_layer",
        ]
    assert w.get_block_ids_with_load_errors() == set()
    assert w.get_finished_count() is None
    assert w.get_kv_connector_kv_cache_events() is None


def test_only_one_child_may_provide_a_memory_pool(model: Path) -> None:
    w = worker(model, a=script(), b=script())
    assert w.get_mem_pool_context() is None
    pool = nullcontext()
    w.children["a"].get_mem_pool_context = lambda: pool
    assert w.get_mem_pool_context() is pool
    w.children["b"].get_mem_pool_context = nullcontext
    with pytest.raises(ChildrenConflictError, match=r"\['a', 'b'\]"):
        w.get_mem_pool_context()


def test_worker_metadata_is_keyed_and_aggregated_by_name(model: Path) -> None:
    a, b = script(), script()
    w = worker(model, a=a, b=b)
    mine = w.build_connector_worker_meta()
    assert mine == NamedMultiConnectorWorkerMetadata(
        {"a": ScriptedWorkerMetadata([a.label]), "b": ScriptedWorkerMetadata([b.label])}
    )
    other = NamedMultiConnectorWorkerMetadata({"b": ScriptedWorkerMetadata(["other"])})
    merged = mine.aggregate(other)
    assert merged.children["a"].seen == [a.label]
    assert merged.children["b"].seen == [b.label, "other"]
    assert mine.children["b"].seen == [b.label]  # a new object
    with pytest.raises(InvalidArgumentError):
        mine.aggregate(ScriptedWorkerMetadata())


def test_handshake_metadata_goes_back_to_its_own_child(model: Path) -> None:
    a, b, c = script(handshake="a-side"), script(handshake="b-side"), script()
    w = worker(model, a=a, b=b, c=c)
    handshake = w.get_handshake_metadata()
    assert handshake == NamedHandshakeMetadata(
        {"a": ScriptedHandshake("a-side"), "b": ScriptedHandshake("b-side")}
    )
    scheduler = connector(model, KVConnectorRole.SCHEDULER, a=a, b=b, c=c)
    scheduler.set_xfer_handshake_metadata_pp_aware({(0, 0): handshake, (0, 1): handshake})
    assert a.names("set_xfer_handshake_metadata")[-1][1] == {
        0: ScriptedHandshake("a-side"),
        1: ScriptedHandshake("a-side"),
    }
    assert b.names("set_xfer_handshake_metadata")[-1][1][1] == ScriptedHandshake("b-side")
    # c has no entry of its own: it is still called, with none (vLLM's class calls every child).
    assert c.names("set_xfer_handshake_metadata") == [("set_xfer_handshake_metadata", {})]


# -- stats and shutdown ------------------------------------------------------------------------


def test_stats_are_keyed_by_name_and_rebuilt_from_their_payload(model: Path) -> None:
    w = worker(model, a=script(stats=1), b=script(stats=2), c=script())
    assert type(w.children["a"]) is type(w.children["b"])  # two children of one class
    stats = w.get_kv_connector_stats()
    assert isinstance(stats, NamedMultiConnectorStats)
    assert isinstance(stats, MultiKVConnectorStats)
    assert stats.reduce() == {"a": {"count": 1}, "b": {"count": 2}}  # vLLM's shape
    payload = json.loads(json.dumps(stats.to_dict()))  # crosses to the front end
    rebuilt = MultiConnector.build_kv_connector_stats(payload)
    assert rebuilt.reduce() == {"a": {"count": 1}, "b": {"count": 2}}
    assert isinstance(rebuilt.data["a"], ScriptedStats)
    rebuilt.aggregate(stats)
    assert rebuilt.reduce() == {"a": {"count": 2}, "b": {"count": 4}}
    assert not rebuilt.is_empty()
    rebuilt.reset()
    assert rebuilt.is_empty()
    assert MultiConnector.build_kv_connector_stats() == NamedMultiConnectorStats()
    with pytest.raises(InvalidArgumentError, match="'a'"):
        MultiConnector.build_kv_connector_stats({"a": [1]})


def test_vllms_stats_payload_rebuilds_as_vllm_rebuilds_it() -> None:
    nixl = {"transfer_duration": [1.5], "bytes_transferred": [1024], "num_descriptors": [10]}
    payload = {"NixlConnector": nixl}
    stats = MultiConnector.build_kv_connector_stats(payload)
    assert isinstance(stats, MultiKVConnectorStats)
    assert isinstance(stats.data["NixlConnector"], NixlKVConnectorStats)
    assert stats.to_dict() == payload  # written back in vLLM's shape
    # A class vLLM's registry does not know: vLLM's error, a ValueError with vLLM's words.
    with pytest.raises(ValueError, match=r"^Connector 'Unknown' is not registered\.$"):
        MultiConnector.build_kv_connector_stats({"Unknown": {"x": [1]}})
    # vLLM's own accumulator takes ours, and ours takes vLLM's.
    theirs = MultiKVConnectorStats(data={"NixlConnector": NixlKVConnectorStats(data=dict(nixl))})
    assert stats.aggregate(theirs) is stats
    assert stats.data["NixlConnector"].data["transfer_duration"] == [1.5, 1.5]


def test_no_child_with_stats_means_no_stats(model: Path) -> None:
    assert worker(model, a=script()).get_kv_connector_stats() is None


def test_a_childs_failures_reach_the_stats_by_name_once(model: Path) -> None:
    """The failures of a step are in that step's stats, under the child's name and the hook,
    beside the children's own stats; they survive the payload's trip and add up over workers;
    the next step without failures (and without stats) has none."""
    w = worker(
        model,
        a=script(stats=1),
        b=script(raise_in={"wait_for_save": OSError("disk"), "get_kv_connector_stats": KeyError()}),
    )
    w.wait_for_save()
    stats = w.get_kv_connector_stats()
    assert isinstance(stats, NamedMultiConnectorStats)
    assert stats.counts == {"b": {"failed.wait_for_save": 1, "failed.get_kv_connector_stats": 1}}
    assert stats.reduce() == {
        "a": {"count": 1},
        ADAPTER_KEY: {"b.failed.get_kv_connector_stats": 1, "b.failed.wait_for_save": 1},
    }
    payload = json.loads(json.dumps(stats.to_dict()))
    assert payload["b"]["stats"] is None  # b's own stats raised: only our counts of it
    rebuilt = MultiConnector.build_kv_connector_stats(payload)
    assert rebuilt.counts == stats.counts and rebuilt.reduce() == stats.reduce()
    rebuilt.aggregate(MultiConnector.build_kv_connector_stats(payload))  # a second worker's
    assert rebuilt.counts == {"b": {"failed.wait_for_save": 2, "failed.get_kv_connector_stats": 2}}
    assert rebuilt.data["a"].data == {"count": 2}
    rebuilt.reset()
    assert rebuilt.is_empty() and rebuilt.counts == {}
    # the next step: b fails only in its stats hook again, counted once more, nothing else
    again = w.get_kv_connector_stats()
    assert again is not None and again.counts == {"b": {"failed.get_kv_connector_stats": 1}}
    assert w.child_failures() == {"b": {"wait_for_save": 1, "get_kv_connector_stats": 2}}
    quiet = worker(model, c=script(raise_in={"wait_for_save": OSError("disk")}))
    quiet.wait_for_save()
    assert quiet.get_kv_connector_stats() is not None
    assert quiet.get_kv_connector_stats() is None  # reported once


def _prom_metrics(model: Path) -> NamedPromMetrics:
    unregister_vllm_metrics()  # as vLLM's Prometheus logger does before building its metrics
    config = make_config(model, [child("a", script()), child("b", script())])
    metrics = MultiConnector.build_prom_metrics(
        config, {Gauge: Gauge, Counter: Counter, Histogram: Histogram}, ["engine"], {0: ["0"]}
    )
    assert isinstance(metrics, NamedPromMetrics)
    return metrics


def test_prometheus_metrics_are_routed_by_name(model: Path) -> None:
    metrics = _prom_metrics(model)
    assert metrics.by_name == {}  # the scripted class has no metrics of its own
    metrics.observe({"a": {"stats": {}}})


def test_a_childs_failures_are_a_prometheus_counter_by_child_and_hook(model: Path) -> None:
    metrics = _prom_metrics(model)
    w = worker(model, a=script(), b=script(raise_in={"wait_for_save": OSError("disk")}))
    for _ in range(3):
        w.wait_for_save()
        stats = w.get_kv_connector_stats()
        assert stats is not None
        metrics.observe(json.loads(json.dumps(stats.to_dict())))
    name = "vllm:multiconnector_child_failures_total"
    assert (
        REGISTRY.get_sample_value(name, {"engine": "0", "child": "b", "hook": "wait_for_save"}) == 3
    )
    assert (
        REGISTRY.get_sample_value(name, {"engine": "0", "child": "a", "hook": "wait_for_save"})
        is None
    )


def test_a_childs_metrics_that_raise_are_counted_and_the_others_recorded(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # vLLM's front end calls observe() outside the connector's calls: a child's class's
    # metrics that raise there are that child's failure, not the server's.
    class Broken:
        def observe(self, stats: Any, engine_idx: int = 0) -> None:
            raise RuntimeError("metrics broke")

    class Recording:
        def __init__(self) -> None:
            self.seen: list[Any] = []

        def observe(self, stats: Any, engine_idx: int = 0) -> None:
            self.seen.append(stats)

    metrics = _prom_metrics(model)
    good = Recording()
    metrics.by_name = {"a": Broken(), "b": good}
    for step in range(2):
        metrics.observe({"a": {"stats": {"n": step}}, "b": {"stats": {"n": step}}})
    assert good.seen == [{"n": 0}, {"n": 1}]
    name = "vllm:multiconnector_child_failures_total"
    labels = {"engine": "0", "child": "a", "hook": "observe"}
    assert REGISTRY.get_sample_value(name, labels) == 2
    logged = [r for r in caplog.records if "Prometheus metrics failed" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None  # once, with its traceback


def test_shutdown_attempts_every_child(model: Path) -> None:
    a, b = script(shutdown_error=RuntimeError("a")), script()
    w = worker(model, a=a, b=b)
    with pytest.raises(ConnectorFailures) as caught:
        w.shutdown()
    assert caught.value.failed == ("a",)
    assert (a.shutdowns, b.shutdowns) == (1, 1)


@pytest.mark.parametrize("failing", [("a",), ("a", "b")])
def test_a_failure_raised_together_prints_each_childs_error_once(
    model: Path, failing: tuple[str, ...]
) -> None:
    # The group is raised outside the handler of any child's error: its traceback shows each
    # child's error once, inside the group, not also as the context the group was raised in.
    scripts = {n: script(shutdown_error=RuntimeError(f"{n} is stuck")) for n in failing}
    w = worker(model, **{"a": script(), "b": script(), **scripts})
    with pytest.raises(ConnectorFailures) as caught:
        w.shutdown()
    text = "".join(traceback.format_exception(caught.value))
    for name in failing:
        assert text.count(f"{name} is stuck") == 1, text
    assert "During handling of the above exception" not in text
    assert "direct cause" not in text


# -- scheduler side, called directly -----------------------------------------------------------


def test_a_child_that_takes_the_partial_tail_is_awaited(model: Path) -> None:
    a, b = script(tail=True), script()
    s = connector(model, KVConnectorRole.SCHEDULER, a=a, b=b)
    request = make_request("r1")
    s.on_new_request(request)
    assert s.register_finished_partial_tail(request, ([1, 2],), [(0, 1, 2)]) is True
    assert s.request_finished(request, [1, 2]) == (True, None)
    assert s.saving == {"r1": ("a",)}  # handed off to the workers, which await it
    record = s.tracker.get("r1")  # and the core's books, until the workers report it
    assert record is not None and record.state is State.finishing
    assert record.awaiting == (WORKERS,)


def test_scheduler_fan_outs(model: Path) -> None:
    a, b = script(), script()
    s = connector(model, KVConnectorRole.SCHEDULER, a=a, b=b)
    assert list(s.take_events()) == [f"event-{a.label}", f"event-{b.label}"]
    assert s.has_pending_block_frees() is False
    assert s.has_pending_push_work() is False
    assert s.reset_cache() is True
    assert s.requires_kv_delivery is True  # kv_both produces KV
    assert s.supports_divergent_local_hybrid_hits is False
    request = make_request("r1")
    assert s.get_num_new_matched_tokens(request, 0) == (0, False)
    assert s.get_loaded_kv_cache_group_ids(request) == (0,)
    assert s.get_external_cache_hit_sources(request, 0) == {}
    with pytest.raises(InvalidArgumentError):
        s.update_connector_output(KVConnectorOutput(kv_connector_worker_meta=object()))


# -- issue 25: loads from a child not chosen, new result fields, layouts, reset_cache ------------


def test_a_load_from_a_child_not_chosen_is_counted_and_warned_once_a_minute(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = script(), script()
    w = worker(model, a=a, b=b)
    w.bind_connector_metadata(metadata(w, loads={"r1": "a", "r2": "a"}))
    b.recving.update({"r1", "r2"})  # b was not chosen for either
    with caplog.at_level("WARNING", logger="multiconnector"):
        assert w.get_finished(set()) == (None, None)
        b.recving.add("r1")
        assert w.get_finished(set()) == (None, None)
    assert w.connector_counts()["b"] == {Outcome.phantom: 3}
    warned = [r for r in caplog.records if "not chosen to load" in r.getMessage()]
    assert len(warned) == 1  # rate-limited: one a minute per child
    assert "'b'" in warned[0].getMessage()
    assert len(w.load_tracker) == 2  # a's loads still awaited, untouched


def test_a_transfer_results_field_vllm_adds_is_passed_through(
    model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    @dataclasses.dataclass
    class Later(KVConnectorTransferResults):  # what a later vLLM may add (PR #54733's kind)
        failed_recving_groups: dict[str, set[int]] = dataclasses.field(default_factory=dict)
        note: str = ""

    monkeypatch.setattr(worker_module, "KVConnectorTransferResults", Later)
    a, b = script(), script()
    w = worker(model, a=a, b=b)
    w.children["a"].get_transfer_results = lambda ids: Later(failed_recving_groups={"r1": {0}})
    w.children["b"].get_transfer_results = lambda ids: Later(
        failed_recving_groups={"r2": {1}}, note="x"
    )
    results = w.get_transfer_results(set())
    assert type(results) is Later
    assert results.failed_recving_groups == {"r1": {0}, "r2": {1}}
    assert results.note == "x"
    w.children["a"].get_transfer_results = lambda ids: Later(note="y")
    results = w.get_transfer_results(set())  # "y" from a, then "x" from b: b's failure
    assert results.note == "y"
    assert w.child_failures() == {"b": {"get_transfer_results": 1}}


@pytest.mark.parametrize(("first", "second"), [("HND", "LBHNC"), ("NHD", "LBNHC")])
def test_layout_aliases_are_one_layout(
    model: Path, monkeypatch: pytest.MonkeyPatch, first: str, second: str
) -> None:
    a, b = script(), script()
    config = make_config(model, [child("a", a), child("b", b)])
    wanted = {a.label: first, b.label: second}

    def layout(cls: Any, vllm_config: Any) -> str:
        return wanted[vllm_config.kv_transfer_config.kv_connector_extra_config["script"]]

    monkeypatch.setattr(ScriptedConnector, "get_required_kvcache_layout", classmethod(layout))
    assert MultiConnector.get_required_kvcache_layout(config) == first
    wanted[b.label] = "LBNHC" if first == "HND" else "LBHNC"
    with pytest.raises(ChildrenConflictError, match=r"by a; .* by b"):
        MultiConnector.get_required_kvcache_layout(config)


def test_reset_cache_logs_children_that_answer_none(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = worker(model, a=script(), b=script(), c=script())
    w.children["a"].reset_cache = lambda: True
    w.children["b"].reset_cache = lambda: None
    w.children["c"].reset_cache = lambda: None
    with caplog.at_level("WARNING", logger="multiconnector"):
        assert w.reset_cache() is True  # vLLM's rule: not False
    (record,) = [r for r in caplog.records if "reset_cache" in r.getMessage()]
    assert "b, c" in record.getMessage()
    w.children["b"].reset_cache = lambda: True
    w.children["c"].reset_cache = lambda: True
    caplog.clear()
    with caplog.at_level("WARNING", logger="multiconnector"):
        assert w.reset_cache() is True
    assert not caplog.records


def test_a_child_raising_in_reset_cache_did_not_reset(model: Path) -> None:
    w = worker(model, a=script(), b=script())
    w.children["a"].reset_cache = lambda: True

    def broken() -> bool:
        raise OSError("store unreachable")

    w.children["b"].reset_cache = broken
    assert w.reset_cache() is False  # b's failure is its own: it did not reset, counted
    assert w.child_failures() == {"b": {"reset_cache": 1}}

"""vLLM 0.34's changes that touch a composition, under vLLM's real ``Scheduler``.

Each test runs on every installed vLLM where the behaviour exists, and skips elsewhere with the
reason printed (``-rs``): the children's ``kv_role`` deciding the producer and consumer roles,
``NixlConnector`` built as ``NixlPullConnector`` or ``NixlPushConnector`` by ``transfer_mode``,
the cap on in-flight KV loads (``--max-num-inflight-kv-loads``) and its aborted loads,
``on_new_request`` before the request is queued, and preempted requests scheduled again as new.
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import json  # noqa: E402
import logging  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import vllm  # noqa: E402
from prometheus_client import REGISTRY, Counter, Gauge, Histogram  # noqa: E402
from vllm.config import KVTransferConfig, SchedulerConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorBase_V1,
    KVConnectorRole,
)
from vllm.v1.metrics.prometheus import unregister_vllm_metrics  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_children import Script, child, script  # noqa: E402
from vllm_harness import (  # noqa: E402
    BLOCK,
    Engine,
    builtin_config,
    make_config,
    make_connector,
    make_request,
    make_scheduler,
)

from multiconnector import InvalidArgumentError, InvalidValueError, Role  # noqa: E402
from multiconnector.vllm import (  # noqa: E402
    HIT_METRICS_KEY,
    ROLE_KEY,
    MultiConnector,
    NamedPromMetrics,
)
from multiconnector.vllm.config import OVERDUE_KEY  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

VERSION = vllm.__version__
PROM_TYPES = {Gauge: Gauge, Counter: Counter, Histogram: Histogram}


def built_class(child: dict[str, Any]) -> type[Any]:
    """The class vLLM's factory builds for a child config."""
    return KVConnectorFactory.get_connector_class(KVTransferConfig(**child))  # type: ignore[no-any-return]


# -- NixlConnector as NixlPullConnector or NixlPushConnector ------------------------------------


def nixl(mode: str | None = None, kv_connector: str = "NixlConnector") -> dict[str, Any]:
    extra = {} if mode is None else {"transfer_mode": mode}
    return {"kv_connector": kv_connector, "kv_role": "kv_both", "kv_connector_extra_config": extra}


def nixl_pair(spelling: str) -> list[dict[str, Any]]:
    """A pull and a push NIXL child: by ``transfer_mode`` (vLLM 0.34), or by class name."""
    if spelling == "transfer_mode":
        push = nixl("push")
        if built_class(push).__name__ != "NixlPushConnector":
            pytest.skip(
                f"vLLM {VERSION} builds NixlConnector as {built_class(push).__name__} whatever "
                "its transfer_mode (vLLM 0.34 reads it)"
            )
        return [nixl("pull"), push]
    return [nixl(kv_connector="NixlPullConnector"), nixl(kv_connector="NixlPushConnector")]


#: The children's names (their configured classes): by transfer_mode, both are NixlConnector.
NAMES = {
    "transfer_mode": ("NixlConnector", "NixlConnector#2"),
    "class_name": ("NixlPullConnector", "NixlPushConnector"),
}


@pytest.mark.parametrize("spelling", ["transfer_mode", "class_name"])
def test_a_pull_and_a_push_nixl_child_share_one_set_of_prometheus_metrics(
    model: Path, spelling: str
) -> None:
    # Both classes build NIXL's metrics (the same names): built once per class, the second
    # raised Prometheus's DuplicateTimeseries, and the server did not start.
    config = builtin_config(model, nixl_pair(spelling), ours=True)
    unregister_vllm_metrics()
    metrics = MultiConnector.build_prom_metrics(config, PROM_TYPES, ["engine"], {0: ["0"]})
    assert isinstance(metrics, NamedPromMetrics)
    pull, push = NAMES[spelling]
    assert sorted(metrics.by_name) == [pull, push]
    assert metrics.by_name[pull] is metrics.by_name[push]


@pytest.mark.parametrize("spelling", ["transfer_mode", "class_name"])
def test_nixl_childrens_stats_go_by_child_name_and_rebuild_with_the_class_vllm_built(
    model: Path, spelling: str
) -> None:
    children = nixl_pair(spelling)
    config = builtin_config(model, children, ours=True)
    assert config.kv_transfer_config is not None
    config.kv_transfer_config.kv_connector_extra_config[HIT_METRICS_KEY] = True
    engine = Engine(config, worker=False)  # NIXL's worker side needs NIXL and a GPU
    pull, push = engine.connector.children
    assert (pull, push) == NAMES[spelling]  # the configuration's names, on every vLLM
    engine.add(make_request("r", num_tokens=40, max_tokens=1))
    outputs = engine.step()
    stats = next(iter(outputs.values())).scheduler_stats.kv_connector_stats
    payload = json.loads(json.dumps(stats))  # as vLLM's front end receives it
    # By the children's names, stable across vLLM versions; each rebuilt by the class vLLM
    # built for it (vLLM's own class keys them by that class's name instead).
    assert sorted(payload) == sorted([pull, push])
    assert payload[pull]["kv_connector"] == "NixlPullConnector"
    assert payload[push]["kv_connector"] == "NixlPushConnector"
    assert payload[push]["counts"]["lookup.asked"] == 1
    rebuilt = MultiConnector.build_kv_connector_stats(data=payload)
    assert sorted(rebuilt.data) == [] and rebuilt.counts[push] == {"lookup.asked": 1}
    unregister_vllm_metrics()
    metrics = MultiConnector.build_prom_metrics(config, PROM_TYPES, ["engine"], {0: ["0"]})
    metrics.observe(payload)
    for name in (pull, push):
        labels = {"engine": "0", "child": name, "count": "asked"}
        assert REGISTRY.get_sample_value("vllm:multiconnector_child_lookups_total", labels) == 1


# -- the cap on in-flight KV loads, and an aborted load whose child never reports ---------------

OVERDUE = 0.05  # report_overdue_seconds in these tests


def capped_config(model: Path, children: list[dict[str, Any]], cap: int) -> Any:
    """A config whose scheduler holds at most ``cap`` asynchronous KV loads in flight."""
    if "max_num_inflight_kv_loads" not in SchedulerConfig.__dataclass_fields__:
        pytest.skip(f"vLLM {VERSION} has no --max-num-inflight-kv-loads (added in 0.34)")
    config = make_config(model, children, extra={OVERDUE_KEY: OVERDUE})
    config.scheduler_config.max_num_inflight_kv_loads = cap
    return config


def told(made: Script, request_id: str) -> list[int]:
    return [call[2] for call in made.names("update_state_after_alloc") if call[1] == request_id]


def test_an_aborted_load_its_child_never_reports_holds_an_admission_slot_and_is_overdue(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pd, disk = script(tokens=2 * BLOCK, load_async=True), script()
    engine = Engine(capped_config(model, [child("pd", pd), child("disk", disk)], cap=1))
    scheduler = engine.scheduler
    engine.add(make_request("a", num_tokens=40, max_tokens=2))
    engine.step()
    assert told(pd, "a") == [2 * BLOCK]  # its load started: the one slot taken
    scheduler.finish_requests("a", RequestStatus.FINISHED_ABORTED)  # the client went away
    assert scheduler._aborted_kv_loads == {"a"} and engine.held("a")
    engine.add(make_request("bb", num_tokens=40, max_tokens=2))
    time.sleep(OVERDUE * 2)
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        for _ in range(3):
            engine.step()
    # vLLM: the slot stays taken by the aborted load, so "bb" is not admitted.
    assert told(pd, "bb") == [] and "bb" not in {r for s in engine.scheduled for r in s}
    assert scheduler._aborted_kv_loads == {"a"} and engine.held("a")
    # Ours: the load owed past report_overdue_seconds is counted (once) and warned about.
    assert engine.connector.child_failures() == {"pd": {"finished_recving_overdue": 1}}
    assert any("its load of request 'a'" in r.getMessage() for r in caplog.records)
    # The child reports at last: the slot is freed with the blocks, and "bb" is admitted.
    pd.recving.add("a")
    engine.step()
    assert scheduler._aborted_kv_loads == set() and not engine.held("a")
    engine.step()
    assert told(pd, "bb") == [2 * BLOCK]
    pd.recving.add("bb")
    for _ in range(4):
        engine.step()
    assert "bb" in engine.outputs and scheduler.requests == {}
    assert engine.connector.child_failures() == {"pd": {"finished_recving_overdue": 1}}


# -- on_new_request before the request is queued; preempted requests scheduled again as new -----


def vllm_at_least(major: int, minor: int) -> bool:
    return tuple(int(part) for part in VERSION.split(".")[:2]) >= (major, minor)


def test_on_new_request_reaches_every_child_once_before_its_first_lookup(model: Path) -> None:
    a, b = script(tokens=BLOCK), script()
    engine = Engine(make_config(model, [child("a", a), child("b", b)]))
    scheduler = engine.scheduler
    seen: list[tuple[bool, bool]] = []
    first = a.instances[0]  # the scheduler's child "a"
    told_new = first.on_new_request

    def on_new_request(request: Any) -> None:
        # Whether vLLM holds the request yet, and whether ours already tracks it.
        seen.append(
            (request.request_id in scheduler.requests, "r" in engine.connector._scheduler.live)
        )
        told_new(request)

    first.on_new_request = on_new_request
    engine.add(make_request("r", num_tokens=40, max_tokens=1))
    # vLLM 0.34 calls it before queueing the request (0.32 and 0.33: after); ours has its
    # record by then either way, so a hook that reads it (may_load_async) finds it.
    assert seen == [(not vllm_at_least(0, 34), True)]
    engine.step()
    for made in (a, b):
        calls = [c[0] for c in made.calls if len(c) > 1 and c[1] == "r"]
        assert calls.count("on_new_request") == 1
        assert calls[0] == "on_new_request"
    assert "r" in engine.outputs and scheduler.requests == {}


def test_an_on_new_request_our_books_refuse_leaves_vllm_without_the_request(model: Path) -> None:
    # Ours refuses a request id its books cannot hold (a typed error naming it). vLLM 0.34 asks
    # before it queues the request: nothing of it is left behind in vLLM either.
    if not vllm_at_least(0, 34):
        pytest.skip(
            f"vLLM {VERSION} calls on_new_request after queueing the request (0.34: before)"
        )
    a = script()
    engine = Engine(make_config(model, [child("a", a)]))
    bad = make_request("r", num_tokens=40, max_tokens=1)
    bad.request_id = ""  # no id: ours refuses it
    with pytest.raises(InvalidArgumentError, match="request_id"):
        engine.add(bad)
    assert engine.scheduler.requests == {} and not engine.scheduler.has_requests()
    assert a.names("on_new_request") == []
    engine.add(make_request("ok", num_tokens=40, max_tokens=1))
    for _ in range(3):
        engine.step()
    assert "ok" in engine.outputs


def test_a_preempted_request_is_looked_up_again_and_finishes_once(model: Path) -> None:
    disk, other = script(holds=2 * BLOCK, saves=True), script()
    engine = Engine(make_config(model, [child("disk", disk), child("other", other)]))
    config = engine.config
    scheduler = engine.scheduler = make_scheduler(config, num_blocks=12)  # room for fewer
    outputs: list[Any] = []
    schedule = scheduler.schedule

    def recorded() -> Any:
        outputs.append(schedule())
        return outputs[-1]

    scheduler.schedule = recorded
    for request_id in ("p", "qq"):  # two prompts (made from the id's length)
        engine.add(make_request(request_id, num_tokens=40, max_tokens=70))
    reported: set[str] = set()
    for _ in range(400):
        engine.step()
        for request_id in set(engine.outputs) - reported:
            disk.sending.add(request_id)  # its save reports on the next step
            reported.add(request_id)
        if not scheduler.requests:
            break
    preempted = {r for out in outputs for r in out.preempted_req_ids or ()}
    assert preempted, "no request was preempted: the test's cache is too large"
    victim = sorted(preempted)[0]
    # Resumed after preemption: vLLM 0.34 (and 0.33's new model runner) sends it again as a new
    # request; the children's metadata lists it as vLLM did (ours passes vLLM's output on).
    again = [
        i
        for i, out in enumerate(outputs)
        if i > 0 and victim in {r.req_id for r in out.scheduled_new_reqs}
    ]
    v2 = bool(getattr(scheduler, "use_v2_model_runner", False))
    assert bool(again) == (vllm_at_least(0, 34) or v2)
    # Looked up again (from what vLLM's prefix cache kept of it); finished once, freed once.
    asked = [c[2] for c in disk.names("get_num_new_matched_tokens") if c[1] == victim]
    assert len(asked) >= 2, asked
    assert [c[1] for c in disk.names("request_finished")].count(victim) == 1
    assert [c[1] for c in other.names("request_finished")].count(victim) == 1
    assert {"p", "qq"} <= set(engine.outputs) and scheduler.requests == {}
    assert engine.connector.child_failures() == {}
    assert engine.worker.child_failures() == {}


# -- roles: the children's kv_role (vLLM 0.34) and multiconnector_role (ours) ------------------


def roled(name: str, made: Script, kv_role: str, role: str | None) -> dict[str, Any]:
    entry = child(name, made, kv_role=kv_role)
    if role is not None:
        entry["kv_connector_extra_config"][ROLE_KEY] = role
    return entry


@pytest.mark.parametrize(("role", "kv_role"), [("save", "kv_consumer"), ("load", "kv_producer")])
def test_a_multiconnector_role_that_contradicts_the_childs_kv_role_is_refused(
    model: Path, role: str, kv_role: str
) -> None:
    # vLLM reads each child's kv_role (0.34: for the engine's producer and consumer roles too);
    # ours holds each child to its multiconnector_role. A save-only consumer or a load-only
    # producer is a contradiction: refused before any child starts, naming both keys.
    a, b = script(), script()
    config = make_config(model, [child("a", a), roled("b", b, kv_role, role)])
    with pytest.raises(InvalidValueError) as raised:
        make_connector(config, KVConnectorRole.SCHEDULER)
    message = str(raised.value)
    assert f"['connectors'][1]['kv_connector_extra_config']['{ROLE_KEY}']='{role}'" in message
    assert f"['connectors'][1]['kv_role']='{kv_role}'" in message and "name='b'" in message
    assert a.instances == [] and b.instances == []


@pytest.mark.parametrize(
    ("role", "kv_role"),
    [
        ("save", "kv_producer"),
        ("save", "kv_both"),
        ("load", "kv_consumer"),
        ("load", "kv_both"),
        (None, "kv_producer"),
        (None, "kv_consumer"),
    ],
)
def test_a_multiconnector_role_that_agrees_with_the_childs_kv_role_is_kept(
    model: Path, role: str | None, kv_role: str
) -> None:
    config = make_config(model, [child("a", script()), roled("b", script(), kv_role, role)])
    connector = make_connector(config, KVConnectorRole.SCHEDULER)
    assert connector._kids.roles["b"] is Role(role or "both")


def test_the_childrens_kv_role_decides_the_engines_roles_on_vllm_034(model: Path) -> None:
    if not vllm_at_least(0, 34):
        pytest.skip(
            f"vLLM {VERSION} reads the top-level kv_role for the engine's producer and consumer "
            "roles (0.34: the children's)"
        )
    # A prefill side: every child only produces; the top-level kv_role says otherwise and no
    # longer counts. Ours awaits the savers as it does on every version.
    disk, nixl_like = script(saves=True), script(saves=True)
    config = make_config(
        model,
        [roled("disk", disk, "kv_producer", "save"), roled("pd", nixl_like, "kv_producer", None)],
        kv_role="kv_consumer",
    )
    transfer = config.kv_transfer_config
    assert transfer is not None and transfer.is_kv_producer and not transfer.is_kv_consumer
    engine = Engine(config)
    engine.add(make_request("r", num_tokens=40, max_tokens=1))
    for _ in range(3):
        engine.step()
    assert "r" in engine.outputs and engine.held("r")  # both saves awaited
    assert disk.names("get_num_new_matched_tokens") == []  # save-only: never looked up
    disk.sending.add("r")
    nixl_like.sending.add("r")
    engine.step()
    assert not engine.held("r")


def test_a_load_only_child_does_not_make_the_engine_await_kv_delivery(model: Path) -> None:
    # vLLM's scheduler reads requires_kv_delivery (recompute a request preempted while its
    # hand-off is pending). A child's own answer defaults to its kv_role producing KV; a
    # load-only child (kv_both, as a decode side's transport often is) is never awaited for a
    # save under ours, so it hands nothing off and its answer does not count.
    if "requires_kv_delivery" not in vars(KVConnectorBase_V1):
        pytest.skip(f"vLLM {VERSION} has no requires_kv_delivery")
    loads_only = make_config(model, [roled("pd", script(), "kv_both", "load")])
    assert Engine(loads_only).scheduler.requires_kv_delivery is False
    also_saves = make_config(
        model, [roled("pd", script(), "kv_both", "load"), roled("disk", script(), "kv_both", None)]
    )
    assert Engine(also_saves).scheduler.requires_kv_delivery is True

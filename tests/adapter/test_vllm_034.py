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
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
import vllm  # noqa: E402
from prometheus_client import REGISTRY, Counter, Gauge, Histogram  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.v1.metrics.prometheus import unregister_vllm_metrics  # noqa: E402
from vllm_harness import Engine, builtin_config, make_request  # noqa: E402

from multiconnector.vllm import HIT_METRICS_KEY, MultiConnector, NamedPromMetrics  # noqa: E402

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
    names = sorted(metrics.by_name)
    assert names == [
        "Nixl" + ("" if spelling == "transfer_mode" else "Pull") + "Connector",
        names[1],
    ]
    assert metrics.by_name[names[0]] is metrics.by_name[names[1]]


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

"""Hits per child, by name, under vLLM's real Scheduler: lookups asked, hits, tokens offered,
loads chosen, loads completed and failed; in the stats payload and as a Prometheus counter
(docs/vllm.md, "Hits per child")."""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from prometheus_client import REGISTRY, Counter, Gauge, Histogram  # noqa: E402
from vllm.v1.metrics.prometheus import unregister_vllm_metrics  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_children import child, script  # noqa: E402
from vllm_harness import Engine, make_config, make_request  # noqa: E402

from multiconnector import InvalidArgumentError  # noqa: E402
from multiconnector.vllm import (  # noqa: E402
    HIT_METRICS_KEY,
    LOOKUP_KEY,
    SPLIT_KEY,
    MultiConnector,
    NamedPromMetrics,
)
from multiconnector.vllm.hits import Hits  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]


def test_two_children_of_one_class_are_counted_apart(model: Path) -> None:
    short, long = script(tokens=16), script(tokens=32)
    config = make_config(
        model,
        [child("local", short), child("remote", long)],
        extra={LOOKUP_KEY: "longest", HIT_METRICS_KEY: True},
    )
    engine = Engine(config)
    for request_id in ("a", "bb", "ccc"):  # three prompts (made from the id's length)
        engine.add(make_request(request_id, num_tokens=40, max_tokens=1))
    outputs = engine.step()
    hits = engine.connector.child_hits()
    assert hits == {
        "local": {"asked": 3, "hits": 3, "tokens_offered": 48},
        "remote": {"asked": 3, "hits": 3, "tokens_offered": 96, "chosen": 3, "tokens_chosen": 96},
    }
    # vLLM's scheduler collected the step's stats: the payload its front end gets
    stats = next(iter(outputs.values())).scheduler_stats.kv_connector_stats
    payload = json.loads(json.dumps(stats))
    assert payload["remote"]["counts"]["lookup.tokens_chosen"] == 96
    assert payload["local"]["counts"]["lookup.hits"] == 3
    assert engine.connector.get_kv_connector_stats() is None  # each count reported once

    unregister_vllm_metrics()
    metrics = MultiConnector.build_prom_metrics(
        config, {Gauge: Gauge, Counter: Counter, Histogram: Histogram}, ["engine"], {0: ["0"]}
    )
    assert isinstance(metrics, NamedPromMetrics)
    metrics.observe(payload)
    name = "vllm:multiconnector_child_lookups_total"
    sample = REGISTRY.get_sample_value
    assert sample(name, {"engine": "0", "child": "remote", "count": "tokens_chosen"}) == 96
    assert sample(name, {"engine": "0", "child": "local", "count": "tokens_offered"}) == 48
    assert sample(name, {"engine": "0", "child": "local", "count": "chosen"}) is None


def test_asynchronous_loads_are_counted_completed_or_failed(model: Path) -> None:
    pd = script(tokens=32, load_async=True)
    engine = Engine(make_config(model, [child("pd", pd), child("disk", script())]))
    engine.add(make_request("ok", num_tokens=40, max_tokens=1))
    engine.add(make_request("bad!", num_tokens=40, max_tokens=1))
    engine.step()
    pd.recving.update({"ok", "bad!"})
    pd.failed.add("bad!")
    for _ in range(4):
        engine.step()
    hits = engine.connector.child_hits()["pd"]
    assert hits["chosen"] == 2 and hits["tokens_chosen"] == 64
    assert hits["loads_completed"] == 1 and hits["loads_failed"] == 1
    assert "chosen" not in engine.connector.child_hits().get("disk", {})


def test_hit_metrics_are_asked_for_not_reported_by_default(model: Path) -> None:
    """By default the payload is vLLM's class's (no counts of ours); the totals are kept."""
    engine = Engine(make_config(model, [child("a", script(tokens=16)), child("b", script())]))
    engine.add(make_request("r", num_tokens=40, max_tokens=1))
    outputs = engine.step()
    stats = next(iter(outputs.values())).scheduler_stats
    assert stats is None or stats.kv_connector_stats is None
    assert engine.connector.child_hits()["a"] == {
        "asked": 1,
        "hits": 1,
        "tokens_offered": 16,
        "chosen": 1,
        "tokens_chosen": 16,
    }
    assert engine.connector._scheduler.hits._unreported == {}  # nothing piles up unreported


def test_a_bad_hit_metrics_value_is_refused(model: Path) -> None:
    with pytest.raises(InvalidArgumentError, match=rf"\['{HIT_METRICS_KEY}'\]"):
        Engine(make_config(model, [child("a", script())], extra={HIT_METRICS_KEY: "yes"}))


def test_every_steps_new_counts_are_reported_not_only_the_first() -> None:
    """Each take of the unreported counts hands out what came since the last one, step after
    step (the taken dict used to stay the one written to: later steps reported nothing)."""
    hits = Hits(report=True)
    hits.add("a", "asked")
    assert hits.take_unreported() == {"a": {"asked": 1}}
    assert hits.take_unreported() == {}
    hits.add("a", "asked")
    hits.chosen("b", 16)
    assert hits.take_unreported() == {"a": {"asked": 1}, "b": {"chosen": 1, "tokens_chosen": 16}}
    assert hits.counts() == {"a": {"asked": 2}, "b": {"chosen": 1, "tokens_chosen": 16}}


@pytest.mark.parametrize("where", ["worker", "alloc", "metadata"])
def test_a_failed_part_of_a_split_load_is_counted_failed_not_completed(
    model: Path, where: str
) -> None:
    # A part of a split load is its child's load (counted chosen for it): a part that failed
    # (reported failed on the worker, or its child raising in update_state_after_alloc_range
    # or in build_connector_meta) is counted loads_failed, once, and never loads_completed.
    fast, slow = script(holds=16, load_async=True), script(holds=32, load_async=True)
    if where == "alloc":
        slow.raise_in["update_state_after_alloc_range"] = RuntimeError("boom")
    elif where == "metadata":
        slow.raise_in["build_connector_meta"] = RuntimeError("boom")
    config = make_config(
        model,
        [child("fast", fast, "RangeConnector"), child("slow", slow, "RangeConnector")],
        extra={SPLIT_KEY: True},
    )
    assert config.kv_transfer_config is not None
    config.kv_transfer_config.kv_load_failure_policy = "recompute"
    e = Engine(config)
    request = e.add(make_request("r", num_tokens=40, max_tokens=2))
    e.step()
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    fast.recving.add("r")
    if where == "worker":
        slow.recving.add("r")
        slow.failed.add("r")
    for _ in range(5):
        e.step()
    assert {"r": 40 - 16} in e.scheduled  # slow's part recomputed, fast's 16 tokens kept
    assert "r" in e.outputs
    hits = e.connector.child_hits()
    assert hits["fast"]["chosen"] == 1 and hits["fast"]["loads_completed"] == 1
    assert "loads_failed" not in hits["fast"]
    assert hits["slow"]["chosen"] == 1
    assert "loads_completed" not in hits["slow"], hits["slow"]
    assert hits["slow"]["loads_failed"] == 1, hits["slow"]

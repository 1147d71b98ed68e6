"""A child's bad answer in what crosses processes must not crash vLLM's engine.

vLLM's ``KVOutputAggregator`` merges the workers' KV cache events outside any ``try`` of ours:
``combined.add_events(other.get_all_events())`` and ``combined.increment_workers(1)`` on the
first worker's :class:`NamedKVEvents`, which calls each child's own events object's methods.
vLLM's own ``MultiConnector`` never asks its children for events (the base's ``None``), so a
child whose events object misbehaves is harmless there; with ours it must be that child's
failure (its events of the step dropped, counted), never the engine's, and the other children's
events must still arrive, merged over the workers as they would be alone.
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import copy  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm.distributed.kv_events import BlockRemoved, KVConnectorKVEvents  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # noqa: E402
    KVConnectorRole,
    KVConnectorWorkerMetadata,
)
from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import (  # noqa: E402
    LMCacheKVEvents,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm_children import child, script  # noqa: E402
from vllm_harness import connector_output, make_config, make_connector  # noqa: E402

pytestmark = pytest.mark.vllm

#: Per worker, the block hashes the good child's (LMCache's class) events remove.
LM_BLOCKS = ([1, 2], [1, 3])


def lm_events(worker: int) -> LMCacheKVEvents:
    made = LMCacheKVEvents(num_workers=1)
    made.add_events([BlockRemoved(block_hashes=[h], medium="CPU") for h in LM_BLOCKS[worker]])
    return made


class BrokenEvents(KVConnectorKVEvents):  # type: ignore[misc]
    """A child's events object one of whose methods raises (a child's bug)."""

    def __init__(self, broken: str) -> None:
        self.broken = broken
        self.events: list[Any] = [BlockRemoved(block_hashes=[99], medium="CPU")]

    def _check(self, method: str) -> None:
        if method == self.broken:
            raise RuntimeError(f"child's events: {method} broke")

    def add_events(self, events: list[Any]) -> None:
        self._check("add_events")
        self.events.extend(events)

    def aggregate(self) -> BrokenEvents:
        self._check("aggregate")
        return self

    def increment_workers(self, count: int = 1) -> None:
        self._check("increment_workers")

    def get_all_events(self) -> list[Any]:
        self._check("get_all_events")
        return list(self.events)

    def get_number_of_workers(self) -> int:
        return 1

    def clear_events(self) -> None:
        self.events.clear()


def bad_events(kind: str) -> Any:
    if kind == "a list of events":  # take_events' type, not a KVConnectorKVEvents
        return [BlockRemoved(block_hashes=[99], medium="CPU")]
    return BrokenEvents(kind)


BAD = ["add_events", "get_all_events", "increment_workers", "a list of events"]


def one_step(model: Path, kind: str, *, ours: bool) -> tuple[Any, Any, list[Any]]:
    """Two workers, each with a good child ("lm", LMCache's events class) and a bad one; one
    step through vLLM's real KVOutputAggregator to the scheduler's connector. Returns the
    scheduler's connector, what the good child publishes (``take_events``) and the workers'
    connectors."""
    lm, bad = script(), script()
    children = [child("lm", lm, "LMCacheEventsConnector"), child("bad", bad)]
    config = make_config(model, children, ours=ours)
    scheduler = make_connector(config, KVConnectorRole.SCHEDULER)
    workers = [make_connector(config, KVConnectorRole.WORKER) for _ in range(2)]
    lm.events.extend(lm_events(i) for i in range(2))  # worker 0 asks first, then worker 1
    bad.events.extend(bad_events(kind) for _ in range(2))
    outputs = [
        connector_output(KVConnectorOutput(kv_cache_events=w.get_kv_connector_kv_cache_events()))
        for w in workers
    ]
    merged = KVOutputAggregator(expected_finished_count=2).aggregate(outputs)
    assert merged is not None
    scheduler.update_connector_output(merged.kv_connector_output)
    good = scheduler.sub_connectors[0]  # "lm", first in configuration order
    return scheduler, sorted(e.block_hashes[0] for e in good.take_events()), workers


def alone(model: Path) -> list[int]:
    """What the good child publishes as vLLM's only connector over the same two workers."""
    config = make_config(model, [child("lm", script(), "LMCacheEventsConnector")], ours=False)
    only = make_connector(config, KVConnectorRole.SCHEDULER).sub_connectors[0]
    outputs = [connector_output(KVConnectorOutput(kv_cache_events=lm_events(i))) for i in range(2)]
    merged = KVOutputAggregator(expected_finished_count=2).aggregate(outputs)
    assert merged is not None
    only.update_connector_output(merged.kv_connector_output)
    return sorted(e.block_hashes[0] for e in only.take_events())


@pytest.mark.parametrize("kind", BAD)
def test_vllms_class_serves_a_child_with_broken_events(model: Path, kind: str) -> None:
    # The comparison: vLLM's MultiConnector never asks its children for events, so the
    # aggregator never touches the bad child's object. (It passes: it is the bar ours must meet.)
    scheduler, _, _ = one_step(model, kind, ours=False)
    assert scheduler is not None


@pytest.mark.parametrize("kind", BAD)
def test_a_childs_broken_events_do_not_crash_the_aggregator(model: Path, kind: str) -> None:
    # Ours: NamedKVEvents.add_events calls the child's add_events / get_all_events /
    # increment_workers outside any try, inside vLLM's KVOutputAggregator.aggregate (the engine
    # core's step loop): the exception ends the engine where vLLM's own class serves.
    scheduler, taken, workers = one_step(model, kind, ours=True)
    # The good child's events still arrive, merged over both workers as they would be alone.
    assert taken == alone(model)
    # And the bad child's failure is its own, counted where it was seen (docs/vllm.md, "When a
    # child fails"): an answer of the wrong type by each worker that got it; an object whose
    # methods raise by the scheduler, which vLLM hands the merged events.
    hook = {"get_kv_connector_kv_cache_events": 1}
    if kind == "a list of events":
        assert [w.child_failures() for w in workers] == [{"bad": hook}] * 2
        assert scheduler.child_failures() == {}
    else:
        assert scheduler.child_failures() == {"bad": hook}
        assert [w.child_failures() for w in workers] == [{}, {}]


class BrokenStats(KVConnectorStats):  # type: ignore[misc]
    """A child's stats one of whose methods raises where vLLM calls it (a child's bug)."""

    def __init__(self, broken: str) -> None:
        super().__init__(data={"count": 1})
        self.broken = broken

    def _check(self, method: str) -> None:
        if method == self.broken:
            raise RuntimeError(f"child's stats: {method} broke")

    def aggregate(self, other: KVConnectorStats) -> Any:
        self._check("aggregate")
        return None if self.broken == "aggregate into None" else self

    def reduce(self) -> dict[str, int | float]:
        self._check("reduce")
        return {"count": 1}

    def is_empty(self) -> bool:
        self._check("is_empty")
        return False

    def to_dict(self) -> dict[str, Any]:
        self._check("to_dict")
        return {"data": dict(self.data)}

    def reset(self) -> None:
        self._check("reset")


class BrokenWorkerMetadata(KVConnectorWorkerMetadata):  # type: ignore[misc]
    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        raise RuntimeError("child's worker metadata: aggregate broke")


def two_workers(model: Path, answers: dict[str, Any]) -> tuple[Any, list[Any], Any]:
    """A scheduler's and two workers' connectors with a good child ("good", stats 1, its own
    worker metadata) and a bad one, whose worker-side hooks answer ``answers`` (a fresh answer
    a call, from a function); then vLLM's aggregation of the workers' outputs."""
    good, bad = script(stats=1), script()
    config = make_config(model, [child("good", good), child("bad", bad)])
    scheduler = make_connector(config, KVConnectorRole.SCHEDULER)
    workers = [make_connector(config, KVConnectorRole.WORKER) for _ in range(2)]
    for instance in bad.instances:
        for method, make in answers.items():
            setattr(instance, method, make)
    outputs = [
        connector_output(
            KVConnectorOutput(
                kv_connector_stats=w.get_kv_connector_stats(),
                kv_connector_worker_meta=w.build_connector_worker_meta(),
            ),
        )
        for w in workers
    ]
    merged = KVOutputAggregator(expected_finished_count=2).aggregate(outputs)
    assert merged is not None
    return scheduler, workers, merged.kv_connector_output


BROKEN_STATS = ["aggregate", "aggregate into None", "reduce", "is_empty", "to_dict", "reset"]


@pytest.mark.parametrize("broken", BROKEN_STATS)
def test_a_childs_broken_stats_are_its_failure_not_the_engines(model: Path, broken: str) -> None:
    # vLLM aggregates the workers' stats, asks is_empty(), logs reduce(), exports to_dict()
    # and resets, all outside the connector's calls: a child's stats that raise there (or
    # aggregate into what is no stats) are dropped and counted in that child's counts; the
    # other child's stats stand, aggregated over both workers.
    _, _, output = two_workers(model, {"get_kv_connector_stats": lambda: BrokenStats(broken)})
    stats = output.kv_connector_stats
    failed = {"bad": {"failed.get_kv_connector_stats": 1}}
    if broken == "is_empty":  # asked child by child until one is not empty: the bad one alone
        alone = type(stats)(data={"bad": stats.data["bad"]}, sources=dict(stats.sources))
        assert alone.is_empty() is False  # its failure is to be reported
        assert alone.counts == failed and not alone.data
    assert not stats.is_empty()
    reduced = stats.reduce()
    payload = copy.deepcopy(stats.to_dict())  # the stats' own dicts, which reset() clears
    counts = {name: dict(per) for name, per in stats.counts.items()}
    stats.reset()
    assert reduced["good"] == {"count": 2}  # both workers' counts, aggregated
    assert payload["good"]["stats"] == {"count": 2}
    if broken in ("reset", "is_empty"):
        assert reduced["bad"] == {"count": 1}
        assert stats.counts == (failed if broken == "reset" else {})  # reset: the next interval's
        return
    assert counts == failed
    assert ("bad" in reduced) is (broken == "to_dict")  # dropped where it raised, not before
    assert "bad" not in stats.data
    assert payload["bad"] == {
        "kv_connector": "ScriptedConnector",
        "kv_connector_module_path": payload["bad"]["kv_connector_module_path"],
        "stats": None,  # its entry carries the count alone
        "counts": {"failed.get_kv_connector_stats": 1},
    }


def test_a_childs_stats_of_the_wrong_type_are_its_failure_on_the_worker(model: Path) -> None:
    _, workers, output = two_workers(model, {"get_kv_connector_stats": lambda: {"count": 1}})
    assert output.kv_connector_stats.reduce()["good"] == {"count": 2}
    assert [w.child_failures() for w in workers] == [{"bad": {"get_kv_connector_stats": 1}}] * 2


@pytest.mark.parametrize("answer", ["raises in aggregate"])
def test_a_childs_broken_worker_metadata_is_its_failure_not_the_engines(
    model: Path, answer: str
) -> None:
    # vLLM aggregates the workers' metadata outside the connector's calls: a child's that
    # raises there, or is of the wrong type, is dropped for the step and counted; the other
    # child's metadata reaches it, aggregated over both workers.
    made = BrokenWorkerMetadata if answer == "raises in aggregate" else (lambda: "metadata")
    scheduler, workers, output = two_workers(model, {"build_connector_worker_meta": made})
    scheduler.update_connector_output(output)
    good = scheduler.sub_connectors[0].script
    seen = [call[1] for call in good.names("update_connector_output")]
    assert [meta.seen for meta in seen] == [[good.label, good.label]]
    hook = {"build_connector_worker_meta": 1}
    if answer == "a string":  # refused by each worker before it was sent
        assert [w.child_failures() for w in workers] == [{"bad": hook}] * 2
        assert scheduler.child_failures() == {}
    else:  # dropped while vLLM aggregated: the scheduler counts it
        assert scheduler.child_failures() == {"bad": hook}

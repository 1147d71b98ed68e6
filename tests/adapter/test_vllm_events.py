"""KV cache events per child: two real event classes, two workers, vLLM's output aggregator.

Each worker's children hand out events objects of their own classes (LMCache's and
MooncakeStore's ``KVConnectorKVEvents``); vLLM's ``KVOutputAggregator`` merges two workers'
outputs; the scheduler's connector hands each child its own object, and each child takes it with
its own class's ``update_connector_output`` and ``take_events``. What each child publishes must
be exactly what it publishes as vLLM's only connector, over the same two workers.
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import itertools  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from vllm.distributed.kv_events import BlockRemoved  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.utils import KVOutputAggregator  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.lmcache_connector import (  # noqa: E402
    LMCacheKVEvents,
)
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake.store.connector import (  # noqa: E402
    MooncakeStoreKVEvents,
)
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm_children import child, script  # noqa: E402
from vllm_harness import connector_output as output  # noqa: E402
from vllm_harness import make_config, make_connector  # noqa: E402

from multiconnector import InvalidArgumentError  # noqa: E402
from multiconnector.vllm import NamedKVEvents  # noqa: E402

pytestmark = pytest.mark.vllm

#: Per worker, the block hashes each child's events remove (two workers).
BLOCKS = {"lm": ([1, 2], [1, 3]), "mc": ([7], [7, 8])}
CLASSES = {"lm": LMCacheKVEvents, "mc": MooncakeStoreKVEvents}
KINDS = {"lm": "LMCacheEventsConnector", "mc": "MooncakeEventsConnector"}


def events_of(name: str, worker: int) -> Any:
    made = CLASSES[name](num_workers=1)
    made.add_events([BlockRemoved(block_hashes=[h], medium="CPU") for h in BLOCKS[name][worker]])
    return made


def published(model: Path, mix: tuple[frozenset[str], ...], names: tuple[str, ...], ours: bool):
    """What each child of ``names`` publishes (take_events) after one step over two workers,
    worker ``i`` having events from the children in ``mix[i]``; and the events objects each
    child's update_connector_output was given."""
    scripts = {name: script() for name in names}
    children = [child(name, scripts[name], KINDS[name]) for name in names]
    children.append(child("plain", script()))  # a child with no events at all
    config = make_config(model, children, ours=ours)
    scheduler = make_connector(config, KVConnectorRole.SCHEDULER)
    workers = [make_connector(config, KVConnectorRole.WORKER) for _ in mix]
    for name in names:  # worker 0 asks first, then worker 1
        scripts[name].events.extend(
            events_of(name, i) if name in has else None for i, has in enumerate(mix)
        )
    aggregator = KVOutputAggregator(expected_finished_count=len(workers))
    outputs = [
        output(KVConnectorOutput(kv_cache_events=w.get_kv_connector_kv_cache_events()))
        for w in workers
    ]
    merged = aggregator.aggregate(outputs).kv_connector_output
    scheduler.update_connector_output(merged)
    given = {name: scripts[name].names("update_connector_output")[-1][1] for name in names}
    by_name = dict(zip(names, scheduler.sub_connectors, strict=False))  # vLLM's has no names
    taken = {name: sorted(e.block_hashes[0] for e in by_name[name].take_events()) for name in names}
    return taken, given


def alone(model: Path, name: str, mix: tuple[frozenset[str], ...]) -> list[int]:
    """What child ``name`` publishes as vLLM's only connector over the same two workers."""
    made = script()
    config = make_config(model, [child(name, made, KINDS[name])], ours=False)
    scheduler = make_connector(config, KVConnectorRole.SCHEDULER)
    aggregator = KVOutputAggregator(expected_finished_count=len(mix))
    outputs = [
        output(KVConnectorOutput(kv_cache_events=events_of(name, i) if name in has else None))
        for i, has in enumerate(mix)
    ]
    scheduler.sub_connectors[0].update_connector_output(
        aggregator.aggregate(outputs).kv_connector_output
    )
    return sorted(e.block_hashes[0] for e in scheduler.sub_connectors[0].take_events())


SUBSETS = [frozenset(s) for n in range(3) for s in itertools.combinations(("lm", "mc"), n)]
MIXES = [mix for mix in itertools.product(SUBSETS, repeat=2) if any(mix)]


@pytest.mark.parametrize(
    "mix", MIXES, ids=lambda mix: "|".join(",".join(sorted(s)) or "-" for s in mix)
)
def test_each_child_gets_its_own_events_merged_over_the_workers(
    model: Path, mix: tuple[frozenset[str], ...]
) -> None:
    taken, given = published(model, mix, ("lm", "mc"), ours=True)
    for name in ("lm", "mc"):
        has = any(name in worker for worker in mix)
        # Its own object, of its own class, or nothing when no worker had any.
        assert (type(given[name]) is CLASSES[name]) if has else given[name] is None, name
        assert taken[name] == alone(model, name, mix), name


def test_a_worker_with_events_of_the_second_child_only_is_accepted(model: Path) -> None:
    # vLLM's aggregator asserts one events type over the workers: ours is always NamedKVEvents.
    mix = (frozenset({"mc"}), frozenset({"lm"}))
    taken, _ = published(model, mix, ("lm", "mc"), ours=True)
    assert taken == {"lm": [1, 3], "mc": [7]}


def test_named_events_refuse_foreign_items() -> None:
    with pytest.raises(InvalidArgumentError, match="NamedEvents"):
        NamedKVEvents().add_events([BlockRemoved(block_hashes=[1], medium=None)])


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="vLLM: children's events dropped")
def test_vllms_class_loses_the_childrens_events(model: Path) -> None:
    mix = (frozenset({"lm", "mc"}), frozenset({"lm", "mc"}))
    taken, _ = published(model, mix, ("lm", "mc"), ours=False)
    assert taken == {name: alone(model, name, mix) for name in ("lm", "mc")}

"""Failed loads under vLLM's real Scheduler: every block that failed to load reaches vLLM, and
every completed part of a split load is credited to its own child.

vLLM recomputes a request's tokens from its first block in the step's ``invalid_block_ids``
(``Scheduler._handle_invalid_blocks``): a block that failed to load and does not reach it is
taken as loaded, and the request runs over KV nothing wrote. The block ids come from two places
at once here, in one step: children whose classes implement ``get_block_ids_with_load_errors``
(each answering for its own request, on its own worker), and the adapter's own books (a part
of a split load that failed, a synchronous loader that failed): all of them, and nothing else,
must reach the scheduler, which then recomputes each request from its first failed block. A
child that answers its blocks in a list or a tuple is heard too; one that raises, or answers
what is no collection of block ids, loses only its own.

A split load whose parts all arrive is one load per part: each part's child is credited its
completed load in ``child_hits()`` and in the Prometheus counter vLLM's own stat logger records
(docs/vllm.md, "Split loads" and "Hits per child"), also when vLLM aborted the request while
it loaded.
"""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import json  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from prometheus_client import REGISTRY  # noqa: E402
from vllm.v1.metrics.loggers import PrometheusStatLogger  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_children import Script, child, script  # noqa: E402
from vllm_harness import BLOCK, Engine, Workers, make_config  # noqa: E402

from bench.scheduler_parts import make_request  # noqa: E402
from multiconnector.vllm import HIT_METRICS_KEY, SPLIT_KEY  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

#: Every prompt's length, and what the loading children hold of it: three blocks.
PROMPT = 56
HELD = 3 * BLOCK


def prompt(k: int) -> list[int]:
    """Request ``k``'s prompt, sharing no block with another's (no prefix-cache hit between
    them: each request's blocks are its own)."""
    return [(7 * i + 131 * k) % 900 + 10 for i in range(PROMPT)]


# -- load errors from children and from the adapter's books, in one step ------------------------

#: The requests, each loaded by its own child: ``r1`` by ``a`` and ``r2`` by ``b`` (both report
#: load errors themselves), ``r3`` split between ``fast`` (its first block) and ``slow`` (the
#: next two, the part that fails), ``r4`` by ``d`` (a synchronous loader that fails), ``r5`` by
#: ``e`` (a load that succeeds; ``e`` raises when asked its load errors).
REQUESTS = ("r1", "r2", "r3", "r4", "r5")
#: Per request, the first of its blocks that failed: vLLM recomputes from there (``None``: none).
FIRST_FAILED: dict[str, int | None] = {"r1": 1, "r2": 2, "r3": 1, "r4": 0, "r5": None}

#: How each case fails its two known loads: the split part and the synchronous loader.
#: ``alloc``: its child raises in the scheduler's allocation hook; ``metadata``: in the
#: scheduler's ``build_connector_meta``; ``worker``: in the workers' ``start_load_kv``;
#: ``report``: the part's child reports it failed (``failed_recving``).
CASES = {
    "sync-alloc": (False, "alloc", "alloc"),
    "sync-metadata": (False, "metadata", "metadata"),
    "sync-worker": (False, "worker", "worker"),
    "async-alloc": (True, "report", "alloc"),
    "async-metadata": (True, "report", "metadata"),
    "async-worker": (True, "report", "worker"),
}
#: The hook a child raises in, for each way of failing of :data:`CASES` (but ``report``).
HOOK_OF = {
    "alloc": "update_state_after_alloc",
    "metadata": "build_connector_meta",
    "worker": "start_load_kv",
}


class World:
    """Two workers under vLLM's scheduler; the children, each holding its own requests."""

    def __init__(self, model: Path, load_async: bool) -> None:
        def holding(*requests: str, **more: Any) -> Script:
            return script(load_async=load_async, only=frozenset(requests), **more)

        self.a = holding("r1", tokens=HELD)
        self.b = holding("r2", tokens=HELD)
        self.fast = holding("r3", holds=BLOCK)
        self.slow = holding("r3", holds=HELD)
        # d loads synchronously in every case: added in the step the others' loads complete.
        self.d = script(tokens=HELD, only=frozenset({"r4"}))
        self.e = holding("r5", tokens=HELD)
        children = [
            child("a", self.a, "ErrorsConnector"),
            child("b", self.b, "ErrorsConnector"),
            child("fast", self.fast, "RangeConnector"),
            child("slow", self.slow, "RangeConnector"),
            child("d", self.d),
            child("e", self.e, "ErrorsConnector"),
        ]
        # Room for every recompute in one step: the harness's runner samples a token for a
        # partial prefill too, which would finish a request before its prompt ran.
        self.world = Workers(model, 2, children, tokens_per_step=256, **{SPLIT_KEY: True})
        self.scheduler = self.world.engine.scheduler

    def add(self, request_id: str) -> None:
        k = REQUESTS.index(request_id)
        self.world.engine.add(make_request(request_id, prompt(k), max_tokens=1))

    def blocks(self, request_id: str) -> list[int]:
        """The blocks vLLM allocated to ``request_id`` (one KV cache group)."""
        (ids,) = self.scheduler.kv_cache_manager.get_block_ids(request_id)
        return list(ids)


def fail_known(world: World, split_part: str, loader: str) -> None:
    """Make ``slow``'s part of ``r3`` and ``d``'s load of ``r4`` fail as the case says, in the
    step they are scheduled (``report``: ``slow`` reports its part failed when it reports)."""
    boom = RuntimeError("boom")
    if split_part == "alloc":
        world.slow.raise_in["update_state_after_alloc_range"] = boom
    elif split_part != "report":
        world.slow.raise_in[HOOK_OF[split_part]] = boom
    world.d.raise_in[HOOK_OF[loader]] = boom
    # And a third child whose class implements the hook raises in it: the others' blocks and
    # the adapter's own still reach vLLM (its own, if it had any, are lost with its answer).
    world.e.raise_in["get_block_ids_with_load_errors"] = boom


@pytest.mark.parametrize("case", CASES)
def test_every_failed_block_reaches_vllm_from_children_and_the_adapter_in_one_step(
    model: Path, case: str
) -> None:
    """In one step: ``a`` reports ``r1``'s second block failed on worker 0, ``b`` reports
    ``r2``'s third on worker 1, ``slow``'s part of ``r3`` fails, ``d``'s synchronous load
    of ``r4`` fails, and ``e`` raises in ``get_block_ids_with_load_errors``. That step's
    ``invalid_block_ids`` is exactly those blocks (those of the failed part and load, all of
    theirs), no other step has any, and vLLM recomputes each request from its first failed
    block on, ``r5``'s load standing whole."""
    load_async, split_part, loader = CASES[case]
    world = World(model, load_async)
    for request_id in ("r1", "r2", "r3", "r5"):
        world.add(request_id)
    if load_async:
        world.world.step()  # the four loads start; they all complete in the next step
        waiting = {r: world.scheduler.requests[r].status for r in ("r1", "r2", "r3", "r5")}
        assert set(waiting.values()) == {RequestStatus.WAITING_FOR_REMOTE_KVS}, waiting
    world.add("r4")
    fail_known(world, split_part, loader)
    expected: set[int] = set()

    def worker_reports(rank: int) -> None:
        r1, r2, r3, r4 = (world.blocks(r) for r in ("r1", "r2", "r3", "r4"))
        nonlocal expected
        expected = {r1[1], r2[2], *r3[1:3], *r4[0:3]}
        if load_async:  # every worker reports every load it was told of
            world.a.recving.add("r1")
            world.b.recving.add("r2")
            world.fast.recving.add("r3")
            world.slow.recving.add("r3")
            world.e.recving.add("r5")
            if rank == 1:
                world.slow.failed.add("r3")  # slow's part failed on one worker
        if rank == 0:
            world.a.load_errors.add(r1[1])
        else:
            world.b.load_errors.add(r2[2])

    world.world.step(worker_reports)
    for made in (world.slow, world.d, world.e):
        made.raise_in.clear()
    failed_step = len(world.world.scheduled) - 1

    assert world.world.invalid_to_vllm[failed_step] == expected
    # vLLM's view: each request's computed tokens cut back to its first failed block.
    requests = world.scheduler.requests
    for request_id, first in FIRST_FAILED.items():
        if first is not None:
            assert requests[request_id].num_computed_tokens == first * BLOCK, request_id
    if load_async:
        assert requests["r5"].num_computed_tokens == HELD
    else:
        assert "r5" in world.world.outputs  # its prompt ran once, over the 48 loaded tokens

    for _ in range(12):
        world.world.step()
        if all(r in world.world.outputs for r in REQUESTS):
            break
    assert all(r in world.world.outputs for r in REQUESTS)
    world.world.step()  # the workers learn which requests finished
    assert not any(world.world.invalid_to_vllm[:failed_step])
    assert not any(world.world.invalid_to_vllm[failed_step + 1 :])
    # What vLLM computed: a synchronous load's step computed the tokens past the hit before
    # its failure was known; then each request from its first failed block to the prompt's end.
    for request_id, first in FIRST_FAILED.items():
        past_the_hit = PROMPT - HELD
        recomputed = 0 if first is None else PROMPT - first * BLOCK
        if not load_async or request_id == "r4":  # a synchronous load
            expected_tokens = past_the_hit + recomputed
        else:
            expected_tokens = recomputed or past_the_hit
        assert world.world.computed_for(request_id) == expected_tokens, request_id
    connector = world.world.engine.connector
    assert len(connector.tracker) == 0
    for worker in world.world.workers:
        assert len(worker.load_tracker) == 0
        assert worker.child_failures()["e"] == {"get_block_ids_with_load_errors": 1}


def _joined(found: set[int]) -> str:
    return ",".join(map(str, sorted(found)))


@pytest.mark.parametrize(
    ("answer", "taken"),
    [(frozenset, True), (sorted, True), (tuple, True), (_joined, False), (len, False)],
    ids=["frozenset", "list", "tuple", "string", "number"],
)
def test_load_errors_answered_as_any_collection_of_block_ids_reach_vllm(
    model: Path, answer: Any, taken: bool
) -> None:
    """``a`` answers ``get_block_ids_with_load_errors`` with its failed blocks in another
    collection than a set (vLLM's class dies: ``set |= list``): they reach vLLM all the same,
    since each names a block vLLM must not take as loaded. What is no collection of block ids
    (a string, a number) is ``a``'s failure, counted; ``b``'s blocks reach vLLM either way and
    nothing escapes into the model runner."""
    a = script(tokens=HELD, only=frozenset({"r1"}), errors_as=answer)
    b = script(tokens=HELD, only=frozenset({"r2"}))
    children = [child("a", a, "ErrorsConnector"), child("b", b, "ErrorsConnector")]
    world = Workers(model, 2, children, tokens_per_step=256)
    for k, request_id in enumerate(("r1", "r2")):
        world.engine.add(make_request(request_id, prompt(k), max_tokens=1))
    blocks: dict[str, list[int]] = {}

    def worker_reports(rank: int) -> None:
        for request_id in ("r1", "r2"):
            (ids,) = world.engine.scheduler.kv_cache_manager.get_block_ids(request_id)
            blocks[request_id] = list(ids)
        (a if rank == 0 else b).load_errors.update(blocks["r1" if rank == 0 else "r2"][1:3])

    world.step(worker_reports)
    reached = set(blocks["r2"][1:3]) | (set(blocks["r1"][1:3]) if taken else set())
    assert world.invalid_to_vllm[0] == reached
    requests = world.engine.scheduler.requests
    assert requests["r2"].num_computed_tokens == BLOCK
    if taken:
        assert requests["r1"].num_computed_tokens == BLOCK
    else:
        assert "r1" in world.outputs  # taken as loaded: a's failed blocks never reached vLLM
    failures = [worker.child_failures() for worker in world.workers]
    assert failures[0] == ({} if taken else {"a": {"get_block_ids_with_load_errors": 1}})
    assert failures[1] == {}


# -- a split load whose parts all arrive ---------------------------------------------------------


def split_engine(model: Path, n: int) -> tuple[Engine, list[Script]]:
    """An engine over ``n`` children, ``c0``, ``c1``, ..., child ``i`` holding the prompt's
    block ``i`` (a load of the first ``n`` blocks is split into one part per child), loading
    asynchronously; split loads and hit metrics on."""
    made = [script(holds_from=i * BLOCK, holds=(i + 1) * BLOCK, load_async=True) for i in range(n)]
    config = make_config(
        model,
        [child(f"c{i}", s, "RangeConnector") for i, s in enumerate(made)],
        extra={SPLIT_KEY: True, HIT_METRICS_KEY: True},
    )
    return Engine(config), made


@pytest.mark.parametrize(
    ("arrivals", "aborted"),
    [
        ([(0, 1)], False),
        ([(0,), (1,)], False),
        ([(1,), (0,)], False),
        ([(2,), (0, 1)], False),
        ([(1,), (2,), (0,)], False),
        ([(1,), (0,)], True),
    ],
    ids=[
        "together",
        "first-then-second",
        "second-then-first",
        "three-last-first",
        "three-apart",
        "aborted-while-loading",
    ],
)
def test_each_part_of_a_split_load_is_credited_to_its_own_child(
    model: Path, arrivals: list[tuple[int, ...]], aborted: bool
) -> None:
    """Each child holds one block of the prompt; the load is split into one part per child.
    Its parts arrive in the steps ``arrivals`` says (``aborted``: the request is aborted once
    the first arrived): once the last arrived, each child is credited one completed load, in
    ``child_hits()`` and in the Prometheus counter vLLM's stat logger records from the
    scheduler's stats; no load is counted failed, and the request runs once, over every
    loaded token (or, aborted, is freed once every part arrived)."""
    n = max(i for step in arrivals for i in step) + 1
    e, made = split_engine(model, n)
    stat_logger = PrometheusStatLogger(e.config, [0])  # vLLM's, registering its metrics anew

    def step() -> None:
        for outputs in e.step().values():
            stats = outputs.scheduler_stats
            if stats is not None and stats.kv_connector_stats is not None:
                # The payload crosses to the front end as data.
                stats.kv_connector_stats = json.loads(json.dumps(stats.kv_connector_stats))
            stat_logger.record(stats, None, engine_idx=0)

    request = e.add(make_request("r", prompt(0), max_tokens=2))
    step()
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    record = e.connector.tracker.get("r")
    assert (record.loader, *record.parts) == tuple(f"c{i}" for i in range(n))
    for k, arrived in enumerate(arrivals):
        for i in arrived:
            made[i].recving.add("r")
        step()
        step()
        if aborted and k == 0:
            e.scheduler.finish_requests("r", RequestStatus.FINISHED_ABORTED)
        done = k == len(arrivals) - 1
        if aborted:
            assert e.held("r") is not done  # its blocks held while a part still writes
        else:
            assert (request.status is RequestStatus.WAITING_FOR_REMOTE_KVS) is not done
        if not done:
            assert all("loads_completed" not in h for h in e.connector.child_hits().values())
    for _ in range(4):
        step()
    if not aborted:
        assert "r" in e.outputs
        assert {"r": PROMPT - n * BLOCK} in e.scheduled  # every part's tokens stood

    hits = e.connector.child_hits()
    for i in range(n):
        name = f"c{i}"
        assert hits[name]["chosen"] == 1 and hits[name]["tokens_chosen"] == BLOCK, hits
        assert hits[name]["loads_completed"] == 1, hits
        assert "loads_failed" not in hits[name], hits
    # Prometheus holds every count of every child, as child_hits() does: none lost or doubled
    # over the steps' stats, none credited to another child.
    model_name, engine = stat_logger.per_engine_labelvalues[0]
    exported: dict[str, dict[str, int]] = {}
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            if sample.name == "vllm:multiconnector_child_lookups_total":
                assert (sample.labels["model_name"], sample.labels["engine"]) == (
                    str(model_name),
                    str(engine),
                )
                per = exported.setdefault(sample.labels["child"], {})
                per[sample.labels["count"]] = int(sample.value)
    assert exported == hits
    assert len(e.connector.tracker) == 0 and len(e.worker.load_tracker) == 0


@pytest.mark.parametrize(
    ("n", "fails"),
    [(1, None), (1, "c0"), (2, None), (2, "c0"), (2, "c1")],
    ids=["one-loader", "one-loader-fails", "split", "split-first-fails", "split-last-fails"],
)
def test_a_load_aborted_while_loading_is_counted_as_it_ends(
    model: Path, n: int, fails: str | None
) -> None:
    """vLLM aborts the request while its load is in flight; the load (each part of a split
    one) then ends: each child is counted the load it made, completed or failed, as it would
    be had the request lived (the report settles what the load owed: its blocks are freed once
    every part came)."""
    e, made = split_engine(model, n)
    e.add(make_request("r", prompt(0), max_tokens=2))
    e.step()
    e.scheduler.finish_requests("r", RequestStatus.FINISHED_ABORTED)
    e.step()
    assert e.held("r")
    for i, s in enumerate(made):
        s.recving.add("r")
        if fails == f"c{i}":
            s.failed.add("r")
    for _ in range(3):
        e.step()
    assert not e.held("r")
    hits = e.connector.child_hits()
    for i in range(n):
        name = f"c{i}"
        ended = "loads_failed" if fails == name else "loads_completed"
        other = "loads_completed" if fails == name else "loads_failed"
        assert hits[name].get(ended) == 1 and other not in hits[name], (name, hits)
    assert len(e.connector.tracker) == 0 and len(e.worker.load_tracker) == 0

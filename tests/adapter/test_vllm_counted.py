"""Counted children (``get_finished_count()``) under vLLM's real ``Scheduler`` and its
``KVOutputAggregator``, several workers (``multiconnector/vllm/counted.py``).

A child whose count equals the number of workers reports on every worker, as a child answering
``None``: it is an ordinary child (it may take part in a split load, and its failures are handled
as any child's), so every observable of a run is the same as with ``None``. A child whose count
is 2 or more (of 3 workers) is awaited on that many workers: one worker's report, or one
worker's report twice, never releases the request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from vllm_support import require_vllm

require_vllm()
pytestmark = pytest.mark.vllm

from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_children import Script, child, script  # noqa: E402
from vllm_harness import Workers, make_request  # noqa: E402

from multiconnector.vllm import SPLIT_KEY  # noqa: E402

PROMPT = 40
RANGE = "RangeConnector"


class Counting(Workers):
    """:class:`Workers` whose children report what a step says (:meth:`report`)."""

    def report(self, reports: dict[int, list[tuple[Script, str]]]) -> None:
        """One step; ``reports[rank]``: (script, what) reported on worker ``rank``, ``what``
        one of ``sent``, ``loaded``, ``failed`` (a load that failed), of request ``r``."""

        def made_on(rank: int) -> None:
            for made, what in reports.get(rank, ()):
                {"sent": made.sending, "loaded": made.recving, "failed": made.failed}[what].add("r")
                if what == "failed":
                    made.recving.add("r")

        self.step(made_on)

    def observed(self) -> tuple[Any, ...]:
        """What a run shows of the connector: the tokens scheduled, what reached vLLM as
        finished sending, the per-child hits and failures, what the books still hold."""
        connector = self.engine.connector
        return (
            self.scheduled,
            self.sent_to_vllm,
            connector.child_hits(),
            sorted(connector.child_failures().items()),
            len(connector.tracker),
        )


def _split_run(model: Path, count: int | None, fail_fast: bool) -> tuple[Counting, Script]:
    """A split asynchronous load by ``fast`` (the first 16 tokens, counted on ``count``
    workers) and ``slow`` (the next 16), on 2 workers; ``fast``'s part fails when
    ``fail_fast``, on every worker."""
    fast = script(holds=16, load_async=True, finished_count=count)
    slow = script(holds=32, load_async=True)
    world = Counting(
        model, 2, [child("fast", fast, RANGE), child("slow", slow, RANGE)], **{SPLIT_KEY: True}
    )
    request = world.engine.add(make_request("r", num_tokens=PROMPT, max_tokens=2))
    world.step()
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    fast_report = "failed" if fail_fast else "loaded"
    world.report({rank: [(fast, fast_report), (slow, "loaded")] for rank in range(2)})
    for _ in range(4):
        world.step()
    return world, fast


@pytest.mark.parametrize("fail_fast", [False, True], ids=["loaded", "fast-part-failed"])
def test_a_child_counted_on_every_worker_is_an_ordinary_child(model: Path, fail_fast: bool) -> None:
    ordinary, _ = _split_run(model, None, fail_fast)
    counted, fast = _split_run(model, 2, fail_fast)
    # Not counted: no report names of its own on the scheduler's books, none forwarded.
    assert counted.engine.connector.finished_counts == {}
    assert counted.engine.connector._sched.counted.ranks == {}
    # It took part in the split load (told its range), and the run is the same as with None.
    assert [c[2:] for c in fast.names("update_state_after_alloc_range")] == [(0, 16)]
    assert counted.observed() == ordinary.observed()
    # Its part completed, or failed and was counted as its failed load, as any child's.
    hits = counted.engine.connector.child_hits()["fast"]
    assert hits.get("loads_failed", 0) == (1 if fail_fast else 0)
    assert hits.get("loads_completed", 0) == (0 if fail_fast else 1)


def test_a_child_counted_on_two_workers_of_three_never_releases_a_save_early(
    model: Path,
) -> None:
    h = script(saves=True, finished_count=2)
    world = Counting(model, 3, [child("h", h)])
    assert world.engine.connector.finished_counts == {"h": 2}
    world.engine.add(make_request("r", num_tokens=PROMPT, max_tokens=1))
    world.step()  # prefill; r finishes, h saves it
    world.step()
    assert world.engine.held("r")
    world.report({0: [(h, "sent")]})  # one worker of the two
    assert world.engine.held("r") and "r" not in set().union(*world.sent_to_vllm)
    world.report({0: [(h, "sent")]})  # the same worker again: a duplicate there
    assert world.engine.held("r") and "r" not in set().union(*world.sent_to_vllm)
    world.report({2: [(h, "sent")]})  # the second worker: released in this step
    assert not world.engine.held("r")
    assert world.sent_to_vllm[-1] == {"r"}
    assert len(world.engine.connector.tracker) == 0


def test_a_child_counted_on_two_workers_of_three_never_releases_a_load_early(
    model: Path,
) -> None:
    h = script(tokens=16, load_async=True, finished_count=2)
    world = Counting(model, 3, [child("h", h), child("b", script())])
    request = world.engine.add(make_request("r", num_tokens=PROMPT, max_tokens=2))
    world.step()
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    world.report({1: [(h, "loaded")]})
    world.report({1: [(h, "loaded")]})  # the same worker again: a duplicate there
    world.step()
    assert request.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    assert all("r" not in step for step in world.scheduled)
    world.report({0: [(h, "loaded")]})  # the second worker: the load completes
    world.step()
    assert request.status is not RequestStatus.WAITING_FOR_REMOTE_KVS
    assert any(step.get("r") == PROMPT - 16 for step in world.scheduled)

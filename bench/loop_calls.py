"""Where the scheduler loop's connector time goes, call by call, for both contenders.

A diagnostic for the ``scheduler loop`` row (``bench/scheduler_loop.py``), not a row of its own:
the same loop, sizes and children, with every connector call the loop makes timed (the thread's
CPU time, summed per call name), plus one pickle round trip of each step's connector metadata.
The contenders run interleaved, the order alternating; the figures are medians over the
repeats, in µs per request. The timers add about the same to every call of both contenders, so
read the differences, not the absolute figures::

    .venv/bin/python -m bench.loop_calls            # the first size
    .venv/bin/python -m bench.loop_calls --size 1   # full batches
"""

from __future__ import annotations

import argparse
import gc
import pickle
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from . import scheduler_loop as loop_row
from .scheduler_parts import BLOCK, write_model

#: The scheduler-role calls vLLM's scheduler makes (both contenders support HMA, so it calls
#: ``request_finished_all_groups``), and the worker-role calls the loop makes.
SCHEDULER_CALLS = (
    "on_new_request",
    "get_num_new_matched_tokens",
    "update_state_after_alloc",
    "build_connector_meta",
    "request_finished_all_groups",
    "update_connector_output",
    "take_events",
    "get_kv_connector_stats",
    "has_pending_push_work",
    "has_pending_block_frees",
)
WORKER_CALLS = (
    "bind_connector_metadata",
    "start_load_kv",
    "wait_for_layer_load",
    "save_kv_layer",
    "wait_for_save",
    "get_transfer_results",
    "get_block_ids_with_load_errors",
    "get_kv_connector_stats",
    "get_kv_connector_kv_cache_events",
    "build_connector_worker_meta",
    "clear_connector_metadata",
)


def timed(owner: Any, method: str, key: str, totals: dict[str, int]) -> None:
    """Replace ``owner.<method>`` by a wrapper adding its CPU nanoseconds to ``totals[key]``."""
    call = getattr(owner, method)
    clock = time.thread_time_ns

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = clock()
        try:
            return call(*args, **kwargs)
        finally:
            totals[key] = totals.get(key, 0) + clock() - start

    setattr(owner, method, wrapper)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=0, help="0: the first size; 1: full batches")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    shape = loop_row.SHAPES[args.size]
    requests = 128
    with tempfile.TemporaryDirectory() as folder:
        model = write_model(Path(folder) / "tiny-opt")
        _, seqs, tokens = shape
        blocks = 4 * requests * ((loop_row.PROMPT + loop_row.OUTPUT) // BLOCK + 1) + 64
        loops = {
            who: loop_row.Loop(loop_row.config(model, who == "ours", seqs, tokens), blocks)
            for who in ("vllm", "ours")
        }
        rng = random.Random(17)
        current: dict[str, dict[str, int]] = {who: {} for who in loops}
        for who, loop in loops.items():
            loop.run(loop_row.make_requests(f"warm-{who}", requests, rng))
            totals = current[who]
            for method in SCHEDULER_CALLS:
                timed(loop.scheduler.connector, method, f"scheduler {method}", totals)
            for method in WORKER_CALLS:
                timed(loop.worker, method, f"worker {method}", totals)
            schedule = loop.scheduler.schedule

            def pickled_schedule(schedule: Any = schedule, totals: dict[str, int] = totals) -> Any:
                output = schedule()
                start = time.thread_time_ns()
                pickle.loads(pickle.dumps(output.kv_connector_metadata))
                key = "metadata pickle round trip"
                totals[key] = totals.get(key, 0) + time.thread_time_ns() - start
                return output

            loop.scheduler.schedule = pickled_schedule
        runs: dict[str, list[dict[str, int]]] = {who: [] for who in loops}
        order = list(loops)
        gc.collect()
        gc.freeze()
        for repeat in range(args.repeats):
            for who in order:
                batch = loop_row.make_requests(f"{who}{repeat}", requests, rng)
                current[who].clear()
                gc.collect()
                gc.disable()
                start = time.thread_time_ns()
                loops[who].run(batch)
                loop_time = time.thread_time_ns() - start
                gc.enable()
                runs[who].append({**current[who], "whole loop (with the timers)": loop_time})
            order.reverse()
        gc.unfreeze()

    def per_request(who: str, key: str) -> float:
        return statistics.median(run.get(key, 0) for run in runs[who]) / requests / 1000

    keys = sorted({key for run in runs["ours"] + runs["vllm"] for key in run})
    print(f"{shape[0]}: µs per request, median of {args.repeats} interleaved repeats")
    print(f"{'call':52s} {'vLLM':>8s} {'ours':>8s} {'ours - vLLM':>12s}")
    rows = [(per_request("ours", k) - per_request("vllm", k), k) for k in keys]
    for _, key in sorted(rows, reverse=True):
        theirs, ours = per_request("vllm", key), per_request("ours", key)
        print(f"{key:52s} {theirs:8.2f} {ours:8.2f} {ours - theirs:12.2f}")


if __name__ == "__main__":
    main()

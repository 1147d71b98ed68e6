"""The benchmarks behind ``make bench``: prints a table and writes ``build/bench.json``.

Every ratio is measured side by side in one process: the contenders run in turn, interleaved,
repeat after repeat, with the collector off while timing (``gc.collect()`` between repeats), and
the ratio is the median of the per-repeat ratios, so a burst of load on a shared machine hits
both sides of a ratio alike. ``--quick`` runs every workload once at tiny sizes (the tests use
it to prove the runner works; its figures mean nothing).

docs/bench.md says what each figure means.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import importlib.util
import json
import math
import platform
import sys
import threading
import time
import tracemalloc
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from multiconnector import ConnectorRegistry, MultiConnector

from .baselines import MachinePerRequest, TrivialConnector, VllmStyleBookkeeping
from .common import BLOCKS, NAMES, QUICK, Report, Row, Sizes, median, p90, timed


def aggregator(trace: bool = False) -> MultiConnector:
    return MultiConnector(ConnectorRegistry({n: TrivialConnector(n) for n in NAMES}), trace=trace)


# -- lifecycle ------------------------------------------------------------------------------------


def lifecycles_ours(mc: MultiConnector, ids: Sequence[str]) -> Callable[[], object]:
    def run() -> None:
        begin, finish, report, take = mc.begin, mc.request_finished, mc.transfer_finished, mc.take
        blocks = BLOCKS
        for rid in ids:
            begin(rid)
            finish(rid, blocks)
            report(rid, "a")
            report(rid, "b")
            report(rid, "c")
            take()

    return run


def lifecycles_vllm_style(books: VllmStyleBookkeeping, ids: Sequence[str]) -> Callable[[], object]:
    def run() -> None:
        begin, finish, report, take = (
            books.begin,
            books.request_finished,
            books.transfer_finished,
            books.take,
        )
        blocks = BLOCKS
        for rid in ids:
            begin(rid)
            finish(rid, blocks)
            report(rid, 0)
            report(rid, 1)
            report(rid, 2)
            take()

    return run


def lifecycles_machine(books: MachinePerRequest, ids: Sequence[str]) -> Callable[[], object]:
    def run() -> None:
        for rid in ids:
            books.begin(rid)
            books.request_finished(rid, BLOCKS)
            for name in NAMES:
                books.transfer_finished(rid, name)
            books.take()

    return run


def bench_lifecycle(sizes: Sizes, report: Report) -> None:
    ids = [f"life-{i}" for i in range(sizes.lifecycle_batch)]
    machine_ids = ids[: sizes.machine_batch]
    mc = aggregator()
    connectors = [TrivialConnector(n) for n in NAMES]
    ours = lifecycles_ours(mc, ids)
    vllm_style = lifecycles_vllm_style(VllmStyleBookkeeping(connectors), ids)
    machine = lifecycles_machine(
        MachinePerRequest(dict(zip(NAMES, connectors, strict=True))), machine_ids
    )
    ours()  # warm up: first calls specialise the interpreter's code
    vllm_style()
    machine()
    t_ours: list[float] = []
    t_vllm: list[float] = []
    t_machine: list[float] = []
    for _ in range(sizes.lifecycle_repeats):
        t_ours.append(timed(ours) / len(ids))
        t_vllm.append(timed(vllm_style) / len(ids))
        t_machine.append(timed(machine) / len(machine_ids))
    assert len(mc) == 0, "every lifecycle must end taken"
    vs_vllm = [o / v for o, v in zip(t_ours, t_vllm, strict=True)]
    vs_machine = [m / o for o, m in zip(t_ours, t_machine, strict=True)]
    report.rows += [
        Row("lifecycle, ours (MultiConnector)", median(t_ours) * 1e6, p90(t_ours) * 1e6, "µs"),
        Row(
            "lifecycle, vLLM-style count bookkeeping",
            median(t_vllm) * 1e6,
            p90(t_vllm) * 1e6,
            "µs",
        ),
        Row(
            "lifecycle, transitions.Machine per request",
            median(t_machine) * 1e6,
            p90(t_machine) * 1e6,
            "µs",
        ),
        Row(
            "lifecycle ratio, ours ÷ vLLM-style",
            median(vs_vllm),
            p90(vs_vllm),
            "x",
            "≤ 3.5 (guard)",
            median(vs_vllm) <= 3.5,
        ),
        Row(
            "lifecycle speed-up, Machine per request ÷ ours",
            median(vs_machine),
            p90(vs_machine),
            "x",
            "≥ 15 (guard)",
            median(vs_machine) >= 15.0,
        ),
    ]
    report.figures["lifecycle_ratio_vs_vllm_baseline"] = median(vs_vllm)
    report.figures["lifecycle_speedup_vs_machine_per_request"] = median(vs_machine)
    report.figures["lifecycle_us"] = {
        "ours": median(t_ours) * 1e6,
        "vllm_style": median(t_vllm) * 1e6,
        "machine_per_request": median(t_machine) * 1e6,
    }


# -- memory ---------------------------------------------------------------------------------------


def bench_memory(sizes: Sizes, report: Report) -> None:
    n = sizes.memory_requests
    ids = [f"mem-{i}" for i in range(n)]
    mc = aggregator()
    mc.begin("warm")  # the interned name tuples and counter keys exist before we measure
    mc.request_finished("warm", BLOCKS)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for rid in ids:
            mc.begin(rid)
        pending = (tracemalloc.get_traced_memory()[0] - base) / n
        for rid in ids:
            mc.request_finished(rid, BLOCKS)
        finishing = (tracemalloc.get_traced_memory()[0] - base) / n
        for rid in ids:
            mc.transfer_finished(rid, "a")
        reported = (tracemalloc.get_traced_memory()[0] - base) / n
    finally:
        tracemalloc.stop()
    worst = max(pending, finishing, reported)
    report.rows += [
        Row(f"memory per request, {n:,} pending", pending, pending, "B"),
        Row(f"memory per request, {n:,} finishing (awaiting 3)", finishing, finishing, "B"),
        Row(f"memory per request, {n:,} finishing (1 of 3 reported)", reported, reported, "B"),
        Row("memory per in-flight request, worst of the above", worst, worst, "B", "≤ 400",
            worst <= 400),
    ]  # fmt: skip
    report.figures["bytes_per_inflight_request"] = worst
    report.figures["bytes_per_request"] = {
        "pending": pending,
        "finishing": finishing,
        "finishing_one_reported": reported,
    }


# -- flat with load -------------------------------------------------------------------------------


class SteadyState:
    """``inflight`` requests finishing (awaiting all three); each cycle completes the oldest
    (three reports, take) and starts a new one (begin, request finished): six events."""

    def __init__(self, inflight: int, cycles: int, repeats: int, prefix: str) -> None:
        total = inflight + cycles * (repeats + 1)
        self.ids = [f"{prefix}-{i}" for i in range(total)]
        self.mc = aggregator()
        self.live: deque[str] = deque()
        self.next = 0
        self.cycles = cycles
        for _ in range(inflight):
            self._start()

    def _start(self) -> None:
        rid = self.ids[self.next]
        self.next += 1
        self.mc.begin(rid)
        self.mc.request_finished(rid, BLOCKS)
        self.live.append(rid)

    def run(self) -> None:
        mc = self.mc
        begin, finish, report, take = mc.begin, mc.request_finished, mc.transfer_finished, mc.take
        live, ids, blocks = self.live, self.ids, BLOCKS
        popleft, append = live.popleft, live.append
        start = self.next
        for i in range(start, start + self.cycles):
            old = popleft()
            report(old, "a")
            report(old, "b")
            report(old, "c")
            take()
            new = ids[i]
            begin(new)
            finish(new, blocks)
            append(new)
        self.next = start + self.cycles


def bench_flat(sizes: Sizes, report: Report) -> None:
    small = SteadyState(sizes.flat_small, sizes.flat_cycles, sizes.flat_repeats, "small")
    large = SteadyState(sizes.flat_large, sizes.flat_cycles, sizes.flat_repeats, "large")
    events = 6 * sizes.flat_cycles
    small.run()
    large.run()
    # A million live records would make every collection before a timed batch a long walk:
    # they are set aside (gc.freeze) for the measurement and given back afterwards.
    gc.collect()
    gc.freeze()
    t_small: list[float] = []
    t_large: list[float] = []
    for _ in range(sizes.flat_repeats):
        t_small.append(timed(small.run) / events)
        t_large.append(timed(large.run) / events)
    ratios = [b / s for s, b in zip(t_small, t_large, strict=True)]
    assert len(large.mc) == sizes.flat_large
    report.rows += [
        Row(f"per event, {sizes.flat_small:,} in flight", median(t_small) * 1e9,
            p90(t_small) * 1e9, "ns"),
        Row(f"per event, {sizes.flat_large:,} in flight", median(t_large) * 1e9,
            p90(t_large) * 1e9, "ns"),
        Row("per event ratio, large ÷ small", median(ratios), p90(ratios), "x", "≤ 1.3",
            median(ratios) <= 1.3),
    ]  # fmt: skip
    report.figures["per_event_ratio_1m_vs_1k"] = median(ratios)
    report.figures["per_event_ns"] = {
        str(sizes.flat_small): median(t_small) * 1e9,
        str(sizes.flat_large): median(t_large) * 1e9,
    }
    gc.unfreeze()
    del small, large
    gc.collect()


# -- threads --------------------------------------------------------------------------------------


def _finishing(n: int, prefix: str) -> tuple[MultiConnector, list[str]]:
    mc = aggregator()
    ids = [f"{prefix}-{i}" for i in range(n)]
    for rid in ids:
        mc.begin(rid)
        mc.request_finished(rid, BLOCKS)
    return mc, ids


def _deliver(mc: MultiConnector, ids: Sequence[str]) -> None:
    report = mc.transfer_finished
    for rid in ids:
        report(rid, "a")
        report(rid, "b")
        report(rid, "c")


def _single(n: int) -> float:
    mc, ids = _finishing(n, "single")
    seconds = timed(lambda: _deliver(mc, ids))
    assert len(mc.take()) == n
    return 3 * n / seconds


def _threaded(n: int, threads: int) -> float:
    mc, ids = _finishing(n, "threaded")
    shards = [ids[i::threads] for i in range(threads)]
    barrier = threading.Barrier(threads + 1)

    def worker(shard: Sequence[str]) -> None:
        barrier.wait()
        _deliver(mc, shard)

    workers = [threading.Thread(target=worker, args=(s,)) for s in shards]
    for w in workers:
        w.start()

    def run() -> None:
        barrier.wait()
        for w in workers:
            w.join()

    seconds = timed(run)
    assert len(mc.take()) == n
    return 3 * n / seconds


def bench_threads(sizes: Sizes, report: Report) -> None:
    single: list[float] = []
    threaded: list[float] = []
    for _ in range(sizes.thread_repeats):
        single.append(_single(sizes.thread_requests))
        threaded.append(_threaded(sizes.thread_requests, sizes.threads))
    ratios = [t / s for s, t in zip(single, threaded, strict=True)]
    k = sizes.threads
    report.rows += [
        Row("completions/s, 1 thread", median(single), p90(single), "/s"),
        Row(f"completions/s, {k} threads (total)", median(threaded), p90(threaded), "/s"),
        Row(f"throughput ratio, {k} threads ÷ 1", median(ratios), p90(ratios), "x", "≥ 0.5",
            median(ratios) >= 0.5),
    ]  # fmt: skip
    report.figures["threads8_vs_single_throughput"] = median(ratios)


# -- the model checker ---------------------------------------------------------------------------


#: The realistic configuration docs/check.md checks: four connectors, two of them ranks of one,
#: a None slot; two requests; every default event (the load side off), early reports included.
REALISTIC: dict[str, str | None] = {
    "lmcache": "saver",
    "p2p@0": "saver",
    "p2p@1": "saver",
    "mooncake": None,
}
#: One 8-GPU node: a cache and a P/D connector of eight ranks (``make check``'s eight-rank run).
EIGHT_RANKS: dict[str, str | None] = {
    "lmcache": "saver",
    **{f"p2p@{rank}": "saver" for rank in range(8)},
}
#: The budget of each of those rows in a full run: past it the row says how far it got.
CHECK_SECONDS = 180.0


def _check_row(
    report: Report, run: Callable[..., Any], label: str, target: float | None, **kwargs: Any
) -> dict[str, Any]:
    gc.collect()
    cpu = time.process_time()
    result = run(**kwargs)
    cpu = time.process_time() - cpu
    complete = bool(result.finished)
    what = (
        f"{result.distinct_states:,} distinct, complete"
        if complete
        else f"{result.distinct_states:,} distinct, complete to depth {result.complete_depth}"
    )
    report.rows.append(
        Row(
            f"model checker distinct states/s, {label} ({what})",
            float(result.distinct_per_second),
            float(result.distinct_per_second),
            "/s",
            "reported",
            True,
        )
    )
    report.rows.append(
        Row(
            f"model checker wall time, {label}",
            float(result.wall_time),
            float(result.wall_time),
            "s",
            "reported" if target is None else f"≤ {target:g} s, complete",
            None if target is None else complete and result.wall_time <= target,
        )
    )
    return {
        "states_generated": result.states_generated,
        "distinct_states": result.distinct_states,
        "pruned": result.pruned,
        "seconds": result.wall_time,
        "cpu_seconds": cpu,
        "distinct_per_second": result.distinct_per_second,
        "generated_per_second": result.generated_per_second,
        "complete": complete,
        "complete_depth": result.complete_depth,
        "verdict": result.verdict,
    }


def bench_check(sizes: Sizes, report: Report) -> None:
    """``multiconnector check``: distinct states per second and wall time, on the default bound
    and on ``make check``'s configurations with two requests: the realistic one (every
    combination of states), and by views (``per_request``) eight ranks, params, the load side.

    ``--quick`` cuts every search after a few hundred distinct states; otherwise each of the
    two-request rows stops after :data:`CHECK_SECONDS` at most (``max_seconds``), and then
    says so (its target is 60 s, complete).
    """
    try:
        check = importlib.import_module("multiconnector.check")
    except ImportError:
        check = None
    run = getattr(check, "check_aggregator", None)
    if check is None or run is None:
        name = "model checker distinct states/s, default bound"
        report.notes.append("model checker: multiconnector.check.check_aggregator is not available")
        report.rows.append(Row(name, math.nan, math.nan, "/s", "reported", None))
        report.figures["check_distinct_per_second"] = None
        return
    quick = sizes.check_states is not None
    cut = f" (first {sizes.check_states:,})" if quick else ""
    default = _check_row(
        report, run, "default bound" + cut, None if quick else 10, max_states=sizes.check_states
    )
    report.figures["check_distinct_per_second"] = float(default["distinct_per_second"])
    report.figures["check"] = default
    rows: dict[str, tuple[str, dict[str, Any]]] = {
        # As make check runs it: early reports from the savers (the default).
        "check_realistic": (
            "realistic: " + ",".join(REALISTIC) + ", 2 requests",
            {"connectors": REALISTIC},
        ),
        "check_eight_ranks": (
            "eight ranks: lmcache,p2p@0..p2p@7, 2 requests, by views",
            {"connectors": EIGHT_RANKS, "per_request": True},
        ),
        "check_params": ("params, 2 requests, by views", {"params": True, "per_request": True}),
        "check_load": (
            "load, 2 requests, by views",
            {"events": (*check.ALPHABET, *check.LOAD_EVENTS), "per_request": True},
        ),
    }
    for key, (label, options) in rows.items():
        report.figures[key] = _check_row(
            report,
            run,
            label + cut,
            None if quick else 60,
            requests=2,
            max_states=sizes.check_states,
            max_seconds=None if quick else CHECK_SECONDS,
            **options,
        )


def bench_usermachine(sizes: Sizes, report: Report) -> None:
    """``check --machine`` on a machine whose model carries data (:mod:`bench.usermachine_row`):
    the CPU time on twice the states over that on the states, medians of interleaved runs."""
    from .usermachine_row import checked_seconds  # noqa: PLC0415 - imports transitions' Machine

    small, large = sizes.usermachine_states, 2 * sizes.usermachine_states
    times: dict[int, list[float]] = {small: [], large: []}
    reports: dict[int, Any] = {}
    for _ in range(sizes.usermachine_repeats):
        for states in (small, large):
            seconds, reports[states] = checked_seconds(states)
            times[states].append(seconds)
    ratio = median(times[large]) / median(times[small])
    distinct = {n: reports[n].distinct_states for n in (small, large)}
    report.rows.append(
        Row(
            f"check --machine, data-carrying: CPU time of {distinct[large]:,} states "
            f"÷ {distinct[small]:,}",
            ratio,
            ratio,
            "x",
            "≤ 2 (linear)",
            ratio <= 2.0 and all(r.verdict == "PASS" for r in reports.values()),
        )
    )
    report.figures["usermachine"] = {
        "states": distinct,
        "cpu_seconds": {str(n): median(t) for n, t in times.items()},
        "ratio": ratio,
    }


# -- vLLM -----------------------------------------------------------------------------------------


def bench_vllm(sizes: Sizes, report: Report) -> None:
    missing = [m for m in ("vllm", "multiconnector.vllm") if not _importable(m)]
    if missing:
        line = f"vLLM rows skipped: {', '.join(missing)} not importable (install the vllm extra)"
        report.notes.append(line)
        report.figures["lifecycle_ratio_vs_real_vllm"] = None
        return
    from . import vllm_rows  # noqa: PLC0415 - imports vLLM: only when it is there

    vllm_rows.bench(sizes, report)


def bench_scheduler_loop(sizes: Sizes, report: Report) -> None:
    missing = [m for m in ("vllm", "multiconnector.vllm") if not _importable(m)]
    if missing:
        line = f"scheduler-loop rows skipped: {', '.join(missing)} not importable"
        report.notes.append(line + " (install the vllm extra)")
        report.figures["scheduler_loop_ratio_vs_real_vllm"] = None
        return
    from . import scheduler_loop  # noqa: PLC0415 - imports vLLM: only when it is there

    scheduler_loop.bench(sizes, report)


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:
        return False


# -- output ---------------------------------------------------------------------------------------


def _figure(value: float, unit: str) -> str:
    if math.isnan(value):
        return "n/a"
    if unit == "/s":
        return f"{value:,.0f}"
    if unit == "B":
        return f"{value:,.0f} B"
    if unit == "x":
        return f"{value:.2f}x"
    return f"{value:,.2f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def table(report: Report) -> str:
    head = ("figure", "median", "p90", "target", "met")
    lines = [
        [r.name, _figure(r.median, r.unit), _figure(r.p90, r.unit), r.target,
         "" if r.met is None else ("met" if r.met else "NOT MET")]
        for r in report.rows
    ]  # fmt: skip
    widths = [max(len(x) for x in col) for col in zip(head, *lines, strict=True)]
    out = [
        "| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |",
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    for line in lines:
        cells = [line[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(line[1:], widths[1:], strict=True)
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out + [f"\n{note}" for note in report.notes])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: proves it runs")
    parser.add_argument("--only", help="comma-separated benchmarks to run (default: all)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else Sizes()
    report = Report()
    started = time.perf_counter()
    benches: tuple[tuple[str, Callable[[], None]], ...] = (
        ("lifecycle", lambda: bench_lifecycle(sizes, report)),
        ("memory", lambda: bench_memory(sizes, report)),
        ("flat", lambda: bench_flat(sizes, report)),
        ("threads", lambda: bench_threads(sizes, report)),
        ("check", lambda: bench_check(sizes, report)),
        ("usermachine", lambda: bench_usermachine(sizes, report)),
        ("vllm", lambda: bench_vllm(sizes, report)),
        ("scheduler-loop", lambda: bench_scheduler_loop(sizes, report)),
    )
    for name, bench in benches:
        if args.only and name not in args.only.split(","):
            continue
        t0 = time.perf_counter()
        bench()
        print(f"  {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    print(table(report))
    met = [r.met for r in report.rows if r.met is not None]
    report.figures["all_targets_met"] = all(met)
    report.figures["quick"] = args.quick
    report.figures["seconds"] = time.perf_counter() - started
    report.figures["python"] = platform.python_version()
    report.figures["rows"] = [r.__dict__ for r in report.rows]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.figures, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

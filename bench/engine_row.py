"""The engine row of ``make bench``: ours against vLLM's MultiConnector inside a real vLLM engine.

Run in the engine environment (``.venv-engine``, ``make engine``), after ``python -m bench.run``: it
prints its rows in the same table, and merges them into ``build/bench.json`` (``--json``).

What is measured: the CPU time of the engine (scheduler, model runner and connectors on one
thread, in one process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one torch thread) per generated
token, on the tiny random Llama of the engine tests, with two children that save asynchronously
and do no I/O at all (``DelayedSaveConnector`` with ``disk: false``, finishing 2 and 3 steps
late), so the connectors' bookkeeping is as large a share of the engine's work as it can be. Two
engines run in two processes, one per class; they take turns, four rounds a repeat in ABBA
order (the sides swap places each repeat), on the same fresh prompts (no prefix-cache hits),
while the other waits. Two processes of one class differ by a few percent, and a pair keeps
its draw for all its repeats, so the repeats are shared among ``--pairs`` fresh pairs of
processes (8 by default), one pair after the other, the side started first swapping from pair
to pair. The ratio is the median of the per-repeat
ratios ours ÷ vLLM's, with its interquartile range; each pair's median is printed and kept
(``pair_ratios``), and the whole process's CPU-time ratio beside it.

``--layers N``: the same row on a model of ``N`` layers of the same tiny width (default: the tiny
model's 2). The adapter's calls per attention layer (``save_kv_layer``, ``wait_for_layer_load``)
fan out to every child, so with 32 layers they are its largest cost; that row has its own names
in the table (``engine, 32 layers: ...``) and its own keys in ``bench.json``
(``engine_32_layers``, ``engine_32_layers_ratio_vs_real_vllm``), beside the tiny row's.

``--faults``: the same harness, ours against ours, with and without failing children (issue #33:
"the server's throughput stays within 10 % of the no-fault run"). Two children that save and load
through files (``FaultyExampleConnector``), on prompts of ``FAULT_PROMPT_TOKENS``; in the faulty
engine, the first fails the save of one prompt in ``FAIL_EVERY`` with an I/O error, truncates the
files of another one in ``FAIL_EVERY`` and raises in ``get_finished`` on every step. Each round
generates its prompts (saving them), resets the prefix cache and generates them again (loading them;
the failed loads are recomputed, ``kv_load_failure_policy: recompute``). The ratio is faulty ÷
healthy, of the engine's CPU per generated token and of the wall time per round.

``--hooks``: the same harness, ours against vLLM's, with every hook of both engines' connectors
timed (:mod:`bench.engine_hooks`): the hooks' share of each side's engine CPU and the
difference, the adapter's own part of the ratio, instead of the ratio's rows (the timers are in
the ratio then).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NoReturn

from . import engine_harness as h
from .engine_hooks import HookTimer, hook_rows, largest, summary

#: Ours ÷ vLLM's, on the tiny model (issue #34).
TARGET = 1.00
#: The many-layer row: its layer count, and its target (issue #34).
MANY_LAYERS = 32
MANY_LAYERS_TARGET = 0.98
#: The target per layer count; a row of any other count is measured and not judged.
TARGETS = {h.LAYERS: TARGET, MANY_LAYERS: MANY_LAYERS_TARGET}
#: --layers at most this: a default round's 256 blocks, at 32 KiB a block a layer, fill the KV
#: cache's 1 GiB (``engine_harness.ENGINE_ENV``) at 128 layers; 64 leaves half of it free.
MAX_LAYERS = 64
#: --faults: the faulty engine's figures within this factor of the healthy one's.
FAULTS_TARGET = 1.10
#: --faults: the prompts' length.
FAULT_PROMPT_TOKENS = 100
#: --faults: one prompt in this many has its save fail, and another one its files truncated.
FAIL_EVERY = 8
#: The interquartile range must lie within this fraction of the median.
SPREAD = 0.02
#: The start of an engine process's answer line on its stdout.
MARK = "BENCH-ENGINE "


class _Parser(argparse.ArgumentParser):
    """A usage error is one line on stderr, exit status 2, no traceback (as the library's own
    command line does)."""

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _bounded(low: int, high: int | None = None) -> Any:
    """An argparse type: an integer from ``low`` (to ``high``); else a usage error that names the
    option."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r} must be at least {low}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{text!r} must be at most {high}")
        return value

    return parse


def label(layers: int) -> str:
    """The row's label: ``engine``, or ``engine, N layers`` on a model other than the tiny one."""
    return "engine" if layers == h.LAYERS else f"engine, {layers} layers"


def key(base: str, layers: int) -> str:
    """The row's key in bench.json: ``base``, or ``base_N_layers`` off the tiny model."""
    return base if layers == h.LAYERS else f"{base}_{layers}_layers"


def _transfer(side: str, storage: Path) -> dict[str, Any]:
    if side in ("faulty", "healthy"):
        return _fault_transfer(side == "faulty", storage)
    children = [
        h.example_child(
            storage / label, label, None, "DelayedSaveConnector", save_delay_steps=delay, disk=False
        )
        for label, delay in (("a", 2), ("b", 3))
    ]
    return h.multi_config(children, ours=side == "ours")


def _fault_transfer(faulty: bool, storage: Path) -> dict[str, Any]:
    faults: dict[str, Any] = {}
    if faulty:
        faults = {"fail_every": FAIL_EVERY, "get_finished_raises": True}
    children = [
        h.example_child(storage / "first", "first", None, "FaultyExampleConnector", **faults),
        h.example_child(storage / "second", "second", None, "FaultyExampleConnector"),
    ]
    config = h.multi_config(children)
    config["kv_load_failure_policy"] = "recompute"
    return config


def serve(side: str, model: Path, prompts: int, tokens: int, *, hooks: bool = False) -> None:
    """One engine, one class: run a round per line on stdin, answer with its figures (with
    ``hooks``, its connectors' hooks timed too: :mod:`bench.engine_hooks`)."""
    with tempfile.TemporaryDirectory() as storage:
        llm, ready = h.bench_llm(model, _transfer(side, Path(storage)), ours=side != "vllm")
        timer = _timer(llm) if hooks else None
        print(MARK + json.dumps(ready), flush=True)
        # --faults: 3 full blocks of 32 and 4 tokens more, so ExampleConnector saves and loads
        # 96 tokens of each prompt (one shorter than a block is neither saved nor loaded).
        length = FAULT_PROMPT_TOKENS if side in ("faulty", "healthy") else 32
        for line in sys.stdin:
            seed = int(line)
            batch = h.prompts(prompts, length, seed=seed)
            if timer is not None:
                timer.take()  # what ran between rounds is not the round's
            cpu, wall = time.process_time(), time.perf_counter()
            main = time.thread_time()
            out = h.generate(llm, batch, tokens)
            core = h.engine_core(llm)
            steps = 0
            while core.scheduler.requests:  # the late saves: the connectors' work too
                llm.llm_engine.step()
                steps += 1
            if side in ("faulty", "healthy"):  # again, loading what was saved
                assert llm.reset_prefix_cache()
                again = h.generate(llm, batch, tokens)
                assert h.tokens(again) == h.tokens(out)  # a failed load is recomputed
                out += again
            main = time.thread_time() - main
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            generated = sum(len(o.outputs[0].token_ids) for o in out)
            assert generated == len(out) * tokens
            answer: dict[str, Any] = {"cpu": cpu, "main": main, "wall": wall}
            answer["tokens"] = generated
            answer["drain_steps"] = steps
            if timer is not None:
                answer["hooks"] = timer.take()
            if side == "faulty":  # what was injected so far: the faults did happen
                from .engine_children import FAULTS  # noqa: PLC0415 - vLLM-side module

                answer["faults"] = dict(FAULTS.get("first", {}))
            print(MARK + json.dumps(answer), flush=True)
        h.shut(llm)


def _timer(llm: Any) -> HookTimer:
    """A :class:`~bench.engine_hooks.HookTimer` on the engine's scheduler's and worker's
    connectors (two objects: the engine runs in this process)."""
    from vllm.distributed.kv_transfer.kv_transfer_state import (  # noqa: PLC0415
        get_kv_transfer_group,
    )

    timer = HookTimer()
    scheduler, worker = h.engine_core(llm).scheduler.connector, get_kv_transfer_group()
    assert scheduler is not worker
    assert timer.wrap(scheduler, "scheduler") and timer.wrap(worker, "worker")
    return timer


def _start(
    side: str,
    model: Path,
    prompts: int,
    tokens: int,
    hooks: bool = False,
    *,
    module: str = "bench.engine_row",
) -> subprocess.Popen[str]:
    command = [sys.executable, "-m", module, "--serve", side, "--model", str(model)]
    command += ["--prompts", str(prompts), "--tokens", str(tokens)]
    if hooks:
        command.append("--hooks")
    return subprocess.Popen(
        command,
        cwd=h.REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _ask(process: subprocess.Popen[str], seed: int | None = None) -> dict[str, Any]:
    assert process.stdin is not None and process.stdout is not None
    if seed is not None:
        process.stdin.write(f"{seed}\n")
        process.stdin.flush()
    for line in process.stdout:  # vLLM logs to stdout too: only the marked lines are answers
        if line.startswith(MARK):
            answer: dict[str, Any] = json.loads(line.removeprefix(MARK))
            return answer
    raise RuntimeError(f"the engine process exited ({process.wait()})")
    return answer


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def measure(
    prompts: int,
    tokens: int,
    repeats: int,
    blocks: int = 1,
    pair: tuple[str, str] = ("ours", "vllm"),
    *,
    layers: int = h.LAYERS,
    pairs: int = 1,
    hooks: bool = False,
    module: str = "bench.engine_row",
    keep: bool = False,
) -> dict[str, Any]:
    """``pair``'s engines in turn, on a model of ``layers`` layers: the figures of ``pair[0]`` ÷
    ``pair[1]``. ``pairs``: that many fresh pairs of processes, one after the other, each for
    its share of the ``repeats`` (two processes of one class differ by a few percent: their
    hash seeds and memory layouts differ, and a pair keeps its draw for all its repeats).
    ``hooks``: the connectors' hooks timed too (``figures["hooks"]``: :mod:`.engine_hooks`).
    ``module``: the module whose ``--serve`` runs each engine process (another row's, which
    answers the same lines); ``keep``: each side's answers of the timed rounds, in order, in
    ``figures["answers"]``."""
    a, b = pair
    per_token: dict[str, list[float]] = {a: [], b: []}
    process_cpu: dict[str, list[float]] = {a: [], b: []}
    walls: dict[str, list[float]] = {a: [], b: []}
    injected: dict[str, int] = {}
    pair_ratios: list[float] = []
    rounds: dict[str, list[dict[str, Any]]] = {a: [], b: []}  # the timed ones, with hooks
    ready: dict[str, Any] = {}
    shares = [repeats // pairs + (k < repeats % pairs) for k in range(pairs)]
    with tempfile.TemporaryDirectory() as folder:
        model = h.write_tiny_llama(h.model_folder(Path(folder), layers), layers)
        for number, share in enumerate(shares):
            # The side started first swaps from one pair to the next (its process may be
            # placed differently: the order is not a side's advantage).
            starting = pair if number % 2 == 0 else pair[::-1]
            sides = {
                side: _start(side, model, prompts, tokens, hooks, module=module)
                for side in starting
            }
            try:
                ready = {side: _ask(process) for side, process in sides.items()}
                print(f"engines: {ready}", file=sys.stderr, flush=True)
                first = len(per_token[a])
                for repeat in range(share + 1):  # repeat 0 warms up
                    # ABBA: two rounds a side, so a drift of the machine's load within the
                    # repeat weighs on both alike; the sides swap places from one repeat to
                    # the next.
                    order = (a, b, b, a) * blocks
                    if repeat % 2:
                        order = order[::-1]
                    sums = {side: [0.0, 0.0, 0, 0.0] for side in sides}
                    for turn, side in enumerate(order):
                        answer = _ask(sides[side], seed=1000 + 4 * blocks * repeat + turn // 2)
                        sums[side][0] += answer["main"]
                        sums[side][1] += answer["cpu"]
                        sums[side][2] += answer["tokens"]
                        sums[side][3] += answer["wall"]
                        if "faults" in answer:
                            injected = answer["faults"]
                        if repeat and (hooks or keep):
                            rounds[side].append(answer)
                    if repeat:
                        for side, (main, cpu, generated, seconds) in sums.items():
                            per_token[side].append(main / generated)
                            process_cpu[side].append(cpu / generated)
                            walls[side].append(seconds / generated)
                mine = zip(per_token[a][first:], per_token[b][first:], strict=True)
                pair_ratios.append(statistics.median(o / v for o, v in mine))
            finally:
                for process in sides.values():
                    if process.stdin is not None:
                        process.stdin.close()
                for process in sides.values():
                    process.wait(timeout=120)
    ratios = [o / v for o, v in zip(per_token[a], per_token[b], strict=True)]
    q1, ratio, q3 = quartiles(ratios)
    whole = [o / v for o, v in zip(process_cpu[a], process_cpu[b], strict=True)]
    wall = [o / v for o, v in zip(walls[a], walls[b], strict=True)]
    figures: dict[str, Any] = {
        "pair": list(pair),
        "layers": layers,
        "faults_injected": injected,
        "wall_ratio": statistics.median(wall),
        "wall_ratio_iqr": list(quartiles(wall)[::2]),
        "engines": ready,
        "process_cpu_ratio": statistics.median(whole),
        "process_cpu_ratio_iqr": list(quartiles(whole)[::2]),
        "prompts": prompts,
        "output_tokens": tokens,
        "repeats": repeats,
        "pairs": pairs,
        "pair_ratios": pair_ratios,
        "abba_blocks_per_repeat": blocks,
        "cpu_us_per_token": {side: statistics.median(v) * 1e6 for side, v in per_token.items()},
        "ratio": ratio,
        "ratio_q1": q1,
        "ratio_q3": q3,
        "iqr_within": max(ratio - q1, q3 - ratio) / ratio,
        "ratios": ratios,
    }
    if hooks:
        figures["hooks"] = summary(rounds, pair)
    if keep:
        figures["answers"] = rounds
    return figures


def fault_rows(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The --faults rows: faulty ÷ healthy, engine CPU per token and wall time."""
    cpu, wall = figures["ratio"], figures["wall_ratio"]
    layers = figures.get("layers", h.LAYERS)
    prefix = "faults" if layers == h.LAYERS else f"faults, {layers} layers"
    return [
        {"name": f"{prefix}: engine CPU per token, failing children ÷ none", "median": cpu,
         "p90": figures["ratio_q3"], "unit": "x", "target": f"≤ {FAULTS_TARGET:g}",
         "met": cpu <= FAULTS_TARGET},
        {"name": f"{prefix}: wall time per token, failing children ÷ none", "median": wall,
         "p90": figures["wall_ratio_iqr"][1], "unit": "x", "target": f"≤ {FAULTS_TARGET:g}",
         "met": wall <= FAULTS_TARGET},
    ]  # fmt: skip


def rows(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The table rows (``bench/run.py``'s Row fields; p90 holds the third quartile)."""
    us = figures["cpu_us_per_token"]
    spread = figures["iqr_within"]
    layers = figures.get("layers", h.LAYERS)
    # The tiny row's names as they always were; another model's say its layer count.
    name = "engine" if layers == h.LAYERS else f"{label(layers)}:"
    target = TARGETS.get(layers)
    ratio = {"name": f"{name} ratio, ours ÷ vLLM (IQR within)", "median": figures["ratio"],
             "p90": figures["ratio_q3"], "unit": "x", "target": "", "met": None}  # fmt: skip
    if target is not None:
        ratio["target"] = f"≤ {target:.2f}, IQR ±{SPREAD:.0%}"
        ratio["met"] = figures["ratio"] <= target and spread <= SPREAD
    return [
        {"name": f"{name} CPU per token, ours", "median": us["ours"], "p90": float("nan"),
         "unit": "µs", "target": "", "met": None},
        {"name": f"{name} CPU per token, vLLM's MultiConnector", "median": us["vllm"],
         "p90": float("nan"), "unit": "µs", "target": "", "met": None},
        ratio,
    ]  # fmt: skip


def _line(row: dict[str, Any]) -> str:
    value = row["median"]
    if row["unit"] == "x":
        shown = f"{value:.3f}x"
    elif row["unit"] == "%":
        shown = f"{value:.2f} %"
    else:
        shown = f"{value:,.1f} {row['unit']}"
    met = "" if row["met"] is None else ("met" if row["met"] else "NOT MET")
    return f"| {row['name']} | {shown} | {row['target']} | {met} |"


def row_parser(
    prog: str,
    doc: str | None,
    *,
    prompts: int,
    tokens: int,
    repeats: int,
    pairs: int,
    least_prompts: int = 1,
    prompts_help: str | None = None,
) -> _Parser:
    """A row's command line, with the options every engine row has: ``--json``, ``--prompts``,
    ``--tokens``, ``--repeats`` (at least 2: the quartiles take two values) and ``--pairs``
    (fresh sets of engine processes, at most ``--repeats``: :func:`check_pairs`)."""
    parser = _Parser(prog=prog, description=(doc or "").splitlines()[0])
    parser.add_argument("--json", type=Path, help="merge the figures into this bench.json")
    parser.add_argument(
        "--prompts", type=_bounded(least_prompts), default=prompts, help=prompts_help
    )
    parser.add_argument("--tokens", type=_bounded(1), default=tokens)
    parser.add_argument(
        "--repeats",
        type=_bounded(2),
        default=repeats,
        help="timed repeats, after one that warms up (at least 2)",
    )
    parser.add_argument(
        "--pairs",
        type=_bounded(1),
        default=pairs,
        help=f"fresh sets of engine processes, each for its share of the repeats (default "
        f"{pairs}; at most --repeats)",
    )
    return parser


def serve_arguments(parser: _Parser, sides: tuple[str, ...]) -> None:
    """``--quick`` (tiny sizes: proves it runs) and the hidden options by which the row runs
    each side's engine process (``--serve SIDE --model PATH``)."""
    parser.add_argument("--quick", action="store_true", help="tiny sizes: proves it runs")
    parser.add_argument("--serve", choices=sides, help=argparse.SUPPRESS)
    parser.add_argument("--model", type=Path, help=argparse.SUPPRESS)


def check_pairs(parser: _Parser, args: argparse.Namespace) -> None:
    """A usage error when ``--pairs`` is more than ``--repeats``."""
    if args.pairs > args.repeats:
        parser.error(f"--pairs {args.pairs} must be at most --repeats ({args.repeats})")


def main(argv: list[str] | None = None) -> int:
    parser = row_parser("bench.engine_row", __doc__, prompts=128, tokens=32, repeats=16, pairs=8)
    parser.add_argument("--blocks", type=_bounded(1), default=2, help="ABBA blocks a repeat")
    parser.add_argument(
        "--layers",
        type=_bounded(1, MAX_LAYERS),
        default=h.LAYERS,
        help=f"the model's layers, of the same tiny width (default {h.LAYERS}; "
        f"the many-layer row: {MANY_LAYERS})",
    )
    parser.add_argument(
        "--faults", action="store_true", help="ours with failing children ÷ ours without"
    )
    parser.add_argument(
        "--hooks",
        action="store_true",
        help="time the connectors' hooks in each engine (bench/engine_hooks.py): their rows "
        "instead of the ratio's",
    )
    serve_arguments(parser, ("ours", "vllm", "faulty", "healthy"))
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.model, args.prompts, args.tokens, hooks=args.hooks)
        return 0
    if args.quick:
        args.prompts, args.tokens, args.repeats, args.blocks, args.pairs = 4, 4, 2, 1, 1
    if args.hooks and args.faults:
        parser.error("--hooks times ours against vLLM's: not with --faults")
    check_pairs(parser, args)
    started = time.perf_counter()
    pair = ("faulty", "healthy") if args.faults else ("ours", "vllm")
    figures = measure(
        args.prompts,
        args.tokens,
        args.repeats,
        args.blocks,
        pair,
        layers=args.layers,
        pairs=args.pairs,
        hooks=args.hooks,
    )
    figures["seconds"] = time.perf_counter() - started
    if args.hooks:
        table = hook_rows(
            figures["hooks"], "engine" if args.layers == h.LAYERS else f"{label(args.layers)}:"
        )
    else:
        table = fault_rows(figures) if args.faults else rows(figures)
    print("| figure | median | target | met |\n|---|---|---|---|")
    for row in table:
        print(_line(row))
    print(
        f"\n{label(args.layers)} {pair[0]} ÷ {pair[1]}: {args.prompts} prompts x {args.tokens} "
        f"tokens, "
        f"{args.repeats} repeats in {args.pairs} pair(s) of processes; "
        f"ratio {figures['ratio']:.4f} "
        f"(IQR {figures['ratio_q1']:.4f}..{figures['ratio_q3']:.4f}, "
        f"within ±{figures['iqr_within']:.2%}); wall ratio {figures['wall_ratio']:.4f} "
        f"(IQR {figures['wall_ratio_iqr'][0]:.4f}..{figures['wall_ratio_iqr'][1]:.4f}), "
        f"{figures['seconds']:.0f} s; each pair's median ratio: "
        + ", ".join(f"{r:.4f}" for r in figures["pair_ratios"])
    )
    if args.faults:
        print(f"faults injected in the faulty engine: {figures['faults_injected']}")
    if args.hooks:
        print("per hook, the largest differences first (the ratio above has the timers in):")
        print("\n".join(largest(figures["hooks"])))
    if args.json:
        if args.hooks:
            keys = {key("engine_hooks", args.layers): figures}
        elif args.faults:
            keys = {key("engine_faults", args.layers): figures}
        else:
            keys = {key("engine", args.layers): figures}
            keys[key("engine", args.layers) + "_ratio_vs_real_vllm"] = figures["ratio"]
        merge(args.json, keys, table)
    return 0


def merge(path: Path, keys: dict[str, Any], table: list[dict[str, Any]]) -> None:
    """Merge ``keys`` and the rows of ``table`` into the bench.json at ``path`` (a row of the
    same name replaced), and say again whether every target is met."""
    merged: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    merged.update(keys)
    names = {row["name"] for row in table}
    merged["rows"] = [r for r in merged.get("rows", []) if r["name"] not in names]
    merged["rows"] += table
    met = [r["met"] for r in merged["rows"] if r.get("met") is not None]
    merged["all_targets_met"] = all(met)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())

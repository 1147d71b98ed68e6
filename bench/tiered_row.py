"""The tiered row of ``make bench`` (issue #48): a prompt's prefix split across a small fast tier
and a larger one, ours' ``lookup: longest`` and ``split_loads`` against vLLM's first hit.

Run in the engine environment (``.venv-engine``), after ``python -m bench.run``: it prints its rows
and merges them into ``build/bench.json`` (``--json``, key ``tiered``).

The scenario: two per-block children (``BlockStoreConnector``, ``bench/block_children.py``:
one entry per block, so a child answers the longest stored run from a prompt's start and loads
any block range), configured fast tier first: ``fast`` keeps the first ``FAST_BLOCKS`` blocks of
each prompt, ``large`` the first ``LARGE_BLOCKS`` of its ``PROMPT_BLOCKS`` full blocks. Three
engines, each in its own process (in-process engine, one torch thread, as ``bench.engine_row``):

- ``vllm``: vLLM's ``MultiConnector``, its rule: the first child with a hit loads (``fast``'s
  short prefix), the rest of the prompt is computed;
- ``longest``: ours with ``lookup: longest``: ``large``'s longer prefix loads;
- ``split``: ours with ``split_loads: true``: ``fast`` loads its blocks and ``large`` the rest of
  its prefix.

Each process first generates its prompts once (each tier saves what it keeps; not timed), then
serves rounds: a round empties the prefix cache and generates the same prompts again, loading
what the rule chooses. The sides take turns, two rounds each a repeat, in mirrored order (the
side that starts rotates from repeat to repeat); the first repeat warms up. Per round: the
prompt tokens computed (each prompt's length less its ``num_cached_tokens``, loaded tokens
included), the blocks each tier loaded, each request's time to first token (from the round's
start: every request arrives at once), the output tokens per second of wall time and the engine
thread's CPU per output token. The figures are each side's medians over the repeats, and the
medians and interquartile ranges of the per-repeat ratios ours ÷ vLLM's; every round's generated
tokens must be the same on every side (a block loaded into the wrong place would change them).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from . import engine_harness as h
from .engine_row import (
    MARK,
    _ask,
    _line,
    _start,
    check_pairs,
    merge,
    quartiles,
    row_parser,
    serve_arguments,
)

#: The sides, vLLM's class (the baseline) first.
#: This module, run once per side as an engine process (``--serve``).
MODULE = "bench.tiered_row"
SIDES = ("vllm", "longest", "split")
BASE = "vllm"
#: Each prompt: this many full blocks, and a few tokens more (the last is always computed).
PROMPT_BLOCKS = 8
PROMPT_TOKENS = PROMPT_BLOCKS * h.BLOCK_SIZE + 4
#: The blocks of each prompt the fast tier keeps, and the large one.
FAST_BLOCKS = 2
LARGE_BLOCKS = 6
#: The prompts' seed: every process generates the same prompts.
SEED = 48
#: The figures of a repeat, per side: what each one is, and its unit.
FIGURES = {
    "computed": ("prompt tokens computed", "tokens per prompt"),
    "ttft": ("time to first token", "ms"),
    "throughput": ("output throughput", "tokens/s"),
    "cpu_per_token": ("engine CPU per output token", "µs"),
}


def _child(storage: Path, label: str, blocks: int) -> dict[str, Any]:
    return {
        "kv_connector": "BlockStoreConnector",
        "kv_connector_module_path": "bench.block_children",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "shared_storage_path": str(storage / label),
            "label": label,
            "multiconnector_name": label,
            "max_blocks": blocks,
        },
    }


def transfer(side: str, storage: Path) -> dict[str, Any]:
    """``side``'s KV transfer config: the fast tier first, the large one second."""
    if side not in SIDES:
        raise ValueError(f"side: {side!r} is not one of {SIDES}")
    children = [_child(storage, "fast", FAST_BLOCKS), _child(storage, "large", LARGE_BLOCKS)]
    config = h.multi_config(children, ours=side != BASE)
    if side == "longest":
        config["kv_connector_extra_config"]["lookup"] = "longest"
    elif side == "split":
        config["kv_connector_extra_config"]["split_loads"] = True
    return config


def order(repeat: int) -> tuple[str, ...]:
    """The rounds of repeat ``repeat``: every side twice, mirrored (ABCCBA), the first side
    rotating from one repeat to the next."""
    shift = repeat % len(SIDES)
    turn = SIDES[shift:] + SIDES[:shift]
    return turn + turn[::-1]


def _generate(
    llm: Any, batch: list[list[int]], tokens: int, tag: str
) -> tuple[list[Any], list[float]]:
    """Every prompt of ``batch`` at once; the outputs and each request's seconds from the start
    to its first output token."""
    from vllm import SamplingParams  # noqa: PLC0415 - the engine environment only
    from vllm.inputs import TokensPrompt  # noqa: PLC0415

    params = SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)
    engine = llm.llm_engine
    ids = [f"{tag}-{i}" for i in range(len(batch))]
    started = time.perf_counter()
    for request_id, prompt in zip(ids, batch, strict=True):
        engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt), params)
    first: dict[str, float] = {}
    done: dict[str, Any] = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.request_id not in first and output.outputs[0].token_ids:
                first[output.request_id] = time.perf_counter() - started
            if output.finished:
                done[output.request_id] = output
    return [done[i] for i in ids], [first[i] for i in ids]


def serve(side: str, model: Path, prompts: int, tokens: int) -> None:
    """One engine, one side: prepare the tiers, then run a round per line on stdin and answer
    with its figures."""
    h.engine_environment(in_process=True)
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("BENCH_ENGINE_BIND", "0")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as folder:
        storage = Path(folder)
        llm = h.make_llm(model, transfer(side, storage))
        module = type(h.engine_core(llm).scheduler.connector).__module__
        expected = "vllm.distributed" if side == BASE else "multiconnector.vllm"
        assert module.startswith(expected), module
        import torch  # noqa: PLC0415 - vLLM imported it already, with the environment set

        torch.set_num_threads(1)
        children = importlib.import_module("bench.block_children")  # the module vLLM loaded
        batch = h.prompts(prompts, PROMPT_TOKENS, seed=SEED)
        step = max(1, h.MAX_BATCHED_TOKENS // PROMPT_TOKENS)  # a prompt's prefill in one step
        for start in range(0, prompts, step):  # each tier saves the blocks it keeps
            h.generate(llm, batch[start : start + step], 1)
        held = {label: children.held_blocks(storage / label) for label in ("fast", "large")}
        assert held == {"fast": prompts * FAST_BLOCKS, "large": prompts * LARGE_BLOCKS}, held
        ready = {"ready": module, "held": held, "threads": threading.active_count()}
        print(MARK + json.dumps(ready), flush=True)
        for line in sys.stdin:
            assert llm.reset_prefix_cache()
            calls = children.CALLS
            before = {label: calls[label]["loaded_blocks"] for label in ("fast", "large")}
            cpu, wall, main = time.process_time(), time.perf_counter(), time.thread_time()
            out, ttft = _generate(llm, batch, tokens, f"round{int(line)}")
            main = time.thread_time() - main
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
            generated = h.tokens(out)
            assert all(len(t) == tokens for t in generated)
            answer: dict[str, Any] = {"main": main, "cpu": cpu, "wall": wall, "ttft": ttft}
            answer["tokens"] = sum(len(t) for t in generated)
            answer["prompts"] = len(out)
            answer["computed"] = sum(PROMPT_TOKENS - c for c in h.cached(out))
            answer["loaded"] = {k: calls[k]["loaded_blocks"] - v for k, v in before.items()}
            answer["digest"] = hashlib.sha256(json.dumps(generated).encode()).hexdigest()
            print(MARK + json.dumps(answer), flush=True)
        h.shut(llm)


def per_repeat(answers: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """One repeat's figures per side, from its rounds' answers (see ``FIGURES``; TTFT in ms,
    CPU in µs): the median time to first token over every request of the side's rounds, the
    others summed over its rounds."""
    figures: dict[str, dict[str, float]] = {}
    for side, rounds in answers.items():
        tokens = sum(a["tokens"] for a in rounds)
        figures[side] = {
            "computed": sum(a["computed"] for a in rounds) / sum(a["prompts"] for a in rounds),
            "ttft": statistics.median(t for a in rounds for t in a["ttft"]) * 1e3,
            "throughput": tokens / sum(a["wall"] for a in rounds),
            "cpu_per_token": sum(a["main"] for a in rounds) / tokens * 1e6,
        }
    return figures


def summarize(repeats: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Each side's median of each figure over ``repeats`` (at least two), and for each of ours
    the per-repeat ratios ours ÷ vLLM's: their median and quartiles."""
    if len(repeats) < 2:
        raise ValueError(f"repeats: {len(repeats)} given, the quartiles take two at least")
    sides = {
        side: {name: statistics.median(r[side][name] for r in repeats) for name in FIGURES}
        for side in repeats[0]
    }
    ratios: dict[str, dict[str, dict[str, Any]]] = {}
    for side in sides:
        if side == BASE:
            continue
        ratios[side] = {}
        for name in FIGURES:
            values = [r[side][name] / r[BASE][name] for r in repeats]
            q1, median, q3 = quartiles(values)
            ratios[side][name] = {"median": median, "iqr": [q1, q3], "values": values}
    return {"sides": sides, "ratios": ratios}


def measure(prompts: int, tokens: int, repeats: int, pairs: int = 1) -> dict[str, Any]:
    """The three sides' engines in turn; ``pairs`` fresh sets of processes one after the other,
    each for its share of ``repeats``."""
    shares = [repeats // pairs + (k < repeats % pairs) for k in range(pairs)]
    timed: list[dict[str, dict[str, float]]] = []
    loaded: dict[str, dict[str, int]] = {side: {} for side in SIDES}
    digests: set[str] = set()
    ready: dict[str, Any] = {}
    number = 0
    with tempfile.TemporaryDirectory() as folder:
        model = h.write_tiny_llama(h.model_folder(Path(folder)))
        for group, share in enumerate(shares):
            started = SIDES[group % len(SIDES) :] + SIDES[: group % len(SIDES)]
            processes = {
                side: _start(side, model, prompts, tokens, module=MODULE) for side in started
            }
            try:
                ready = {side: _ask(process) for side, process in processes.items()}
                print(f"engines: {ready}", file=sys.stderr, flush=True)
                for repeat in range(share + 1):  # repeat 0 warms up
                    answers: dict[str, list[dict[str, Any]]] = {side: [] for side in SIDES}
                    for side in order(number):
                        answer = _ask(processes[side], number)
                        answers[side].append(answer)
                        digests.add(answer["digest"])
                        for tier, count in answer["loaded"].items():
                            loaded[side][tier] = loaded[side].get(tier, 0) + count
                    number += 1
                    if repeat:
                        timed.append(per_repeat(answers))
            finally:
                for process in processes.values():
                    if process.stdin is not None:
                        process.stdin.close()
                for process in processes.values():
                    process.wait(timeout=120)
    if len(digests) != 1:
        raise RuntimeError(f"the sides generated different tokens ({len(digests)} digests)")
    rounds = 2 * (repeats + pairs)  # every round's loads, the warm-up's included
    figures = summarize(timed)
    for side, tiers in loaded.items():
        per_prompt = {tier: count / (rounds * prompts) for tier, count in tiers.items()}
        figures["sides"][side]["loaded_blocks_per_prompt"] = per_prompt
    figures.update(
        {
            "prompts": prompts,
            "prompt_tokens": PROMPT_TOKENS,
            "tier_blocks": {"fast": FAST_BLOCKS, "large": LARGE_BLOCKS},
            "output_tokens": tokens,
            "repeats": repeats,
            "pairs": pairs,
            "engines": ready,
        }
    )
    return figures


def rows(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The table rows (``bench/run.py``'s Row fields; p90 holds the third quartile): each of
    ours ÷ vLLM's first hit, per figure; measured, not judged."""
    table = []
    for side, ratios in figures["ratios"].items():
        for name, (what, _) in FIGURES.items():
            ratio = ratios[name]
            table.append(
                {
                    "name": f"tiered: {what}, {side} ÷ vLLM's first hit",
                    "median": ratio["median"],
                    "p90": ratio["iqr"][1],
                    "unit": "x",
                    "target": "reported",
                    "met": None,
                }
            )
    return table


def report(figures: dict[str, Any]) -> str:
    """Each side's figures, then each ratio with its IQR."""
    lines = []
    for side, values in figures["sides"].items():
        shown = ", ".join(f"{FIGURES[n][0]} {values[n]:,.1f} {FIGURES[n][1]}" for n in FIGURES)
        blocks = values.get("loaded_blocks_per_prompt", {})
        tiers = ", ".join(f"{tier} {count:g}" for tier, count in blocks.items())
        lines.append(f"{side}: {shown}; blocks loaded per prompt: {tiers}")
    for side, ratios in figures["ratios"].items():
        for name, (what, _) in FIGURES.items():
            ratio = ratios[name]
            q1, q3 = ratio["iqr"]
            lines.append(f"{what}, {side} ÷ vllm: {ratio['median']:.3f} (IQR {q1:.3f}..{q3:.3f})")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = row_parser("bench.tiered_row", __doc__, prompts=16, tokens=16, repeats=8, pairs=2)
    serve_arguments(parser, SIDES)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.model, args.prompts, args.tokens)
        return 0
    if args.quick:
        args.prompts, args.tokens, args.repeats, args.pairs = 4, 4, 2, 1
    check_pairs(parser, args)
    started = time.perf_counter()
    figures = measure(args.prompts, args.tokens, args.repeats, args.pairs)
    figures["seconds"] = time.perf_counter() - started
    table = rows(figures)
    print("| figure | median | target | met |\n|---|---|---|---|")
    for row in table:
        print(_line(row))
    print(
        f"\ntiered: {args.prompts} prompts of {PROMPT_TOKENS} tokens x {args.tokens} output "
        f"tokens, {args.repeats} repeats in {args.pairs} set(s) of processes, "
        f"{figures['seconds']:.0f} s\n" + report(figures)
    )
    if args.json:
        merge(args.json, {"tiered": figures}, table)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The served row of ``make bench``: ``vllm bench serve`` against ``vllm serve``, ours against
vLLM's ``MultiConnector``.

Run in the engine environment (``.venv-engine``), after ``bench.engine_row``: it prints its rows
and merges them into ``build/bench.json`` (``--json``, key ``served``).

What is measured: the OpenAI-compatible server on the tiny model of the engine tests with its
byte-level BPE tokenizer (``bench/serve_harness.py``), on one core, over two of vLLM's
``ExampleConnector`` children (they save every prompt's KV to disk), under vLLM's class and
under ours (the one added line). Each run is a fresh server and one ``vllm bench serve
--dataset-name random --random-input-len 128 --num-prompts 64 --seed 1`` (all requests at
once, 128 output tokens each, EOS ignored). The sides take turns, one server at a time, in
ABBA order over the repeats; the figures are the medians and interquartile ranges of each
side's output throughput and median time to first token, and of the per-repeat ratios ours ÷
vLLM's. Repeats go on past ``--repeats`` (up to ``--max-repeats``) while the ratio's IQR is
wider than ``SPREAD`` of its median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import serve_harness as s

SIDES = ("ours", "vllm")
#: Repeats continue while the throughput ratio's IQR is wider than this fraction of its median.
SPREAD = 0.05


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def one_run(side: str, model: Path, folder: Path, prompts: int) -> dict[str, Any]:
    """A fresh server for ``side``, one ``vllm bench serve``; the figures kept."""
    folder.mkdir(parents=True)
    started = time.perf_counter()
    log = folder / "server.log"
    with s.Server(model, s.transfer(side, folder / "storage"), log) as server:
        up = time.perf_counter() - started
        result = s.bench_serve(server, model, folder / "bench", num_prompts=prompts)
    assert result["completed"] == prompts and not result.get("failed"), result
    return {
        "side": side,
        "start_s": up,
        "output_throughput": result["output_throughput"],
        "request_throughput": result["request_throughput"],
        "median_ttft_ms": result["median_ttft_ms"],
        "duration_s": result["duration"],
        "load_average": os.getloadavg()[0],
    }


def _spread(values: list[float]) -> float:
    q1, q2, q3 = quartiles(values)
    return max(q2 - q1, q3 - q2) / q2


def measure(repeats: int, max_repeats: int, prompts: int) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    ratios: dict[str, list[float]] = {"output_throughput": [], "median_ttft_ms": []}
    with tempfile.TemporaryDirectory() as tmp:
        model = s.write_served_model(Path(tmp) / "model")
        repeat = 0
        while repeat < repeats or (
            repeat < max_repeats and _spread(ratios["output_throughput"]) > SPREAD
        ):
            order = SIDES if repeat % 2 == 0 else SIDES[::-1]
            got = {}
            for side in order:
                got[side] = one_run(side, model, Path(tmp) / f"{repeat}-{side}", prompts)
                runs.append({"repeat": repeat, **got[side]})
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
            for key, values in ratios.items():
                values.append(got["ours"][key] / got["vllm"][key])
            repeat += 1
    return summary(runs, ratios, prompts)


def summary(
    runs: list[dict[str, Any]], ratios: dict[str, list[float]], prompts: int
) -> dict[str, Any]:
    per_side: dict[str, dict[str, list[float]]] = {}
    for side in SIDES:
        mine = [r for r in runs if r["side"] == side]
        per_side[side] = {
            key: list(quartiles([r[key] for r in mine]))
            for key in ("output_throughput", "median_ttft_ms", "start_s")
        }
    return {
        "command": "vllm bench serve --dataset-name random --random-input-len 128 "
        f"--random-output-len 128 --num-prompts {prompts} --seed 1 --ignore-eos",
        "repeats": len(ratios["output_throughput"]),
        "quartiles": per_side,
        "ratio_quartiles": {key: list(quartiles(v)) for key, v in ratios.items()},
        "ratios": ratios,
        "load_average": [
            min(r["load_average"] for r in runs),
            max(r["load_average"] for r in runs),
        ],
        "runs": runs,
    }


def rows(figures: dict[str, Any]) -> list[dict[str, Any]]:
    """The table rows (``bench/run.py``'s Row fields; p90 holds the third quartile)."""
    out = []
    for side, label in (("ours", "ours"), ("vllm", "vLLM's MultiConnector")):
        q = figures["quartiles"][side]
        out.append(
            {
                "name": f"served output tok/s, {label}",
                "median": q["output_throughput"][1],
                "p90": q["output_throughput"][2],
                "unit": "tok/s",
                "target": "",
                "met": None,
            }
        )
        out.append(
            {
                "name": f"served median TTFT, {label}",
                "median": q["median_ttft_ms"][1],
                "p90": q["median_ttft_ms"][2],
                "unit": "ms",
                "target": "",
                "met": None,
            }
        )
    for key, label in (("output_throughput", "throughput"), ("median_ttft_ms", "TTFT")):
        q = figures["ratio_quartiles"][key]
        out.append(
            {
                "name": f"served {label} ratio, ours ÷ vLLM",
                "median": q[1],
                "p90": q[2],
                "unit": "x",
                "target": "",
                "met": None,
            }
        )
    return out  # fmt: skip


def _line(row: dict[str, Any], figures: dict[str, Any]) -> str:
    value = row["median"]
    shown = f"{value:.3f}x" if row["unit"] == "x" else f"{value:,.1f} {row['unit']}"
    return f"| {row['name']} | {shown} | ≤ {row['p90']:,.3f} (third quartile) |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="merge the figures into this bench.json")
    parser.add_argument("--repeats", type=int, default=6, help="ABBA repeats at least")
    parser.add_argument("--max-repeats", type=int, default=10)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="one repeat, 8 prompts")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.max_repeats, args.prompts = 1, 1, 8
    started = time.perf_counter()
    figures = measure(args.repeats, args.max_repeats, args.prompts)
    figures["seconds"] = time.perf_counter() - started
    table = rows(figures)
    print("| figure | median | spread |\n|---|---|---|")
    for row in table:
        print(_line(row, figures))
    q = figures["ratio_quartiles"]
    shown = {key: "{1:.3f} (IQR {0:.3f}..{2:.3f})".format(*v) for key, v in q.items()}
    print(
        f"\nserved: {figures['repeats']} repeats; ours ÷ vLLM: throughput "
        f"{shown['output_throughput']}, TTFT {shown['median_ttft_ms']}; load average "
        f"{figures['load_average'][0]:.1f}..{figures['load_average'][1]:.1f}; "
        f"{figures['seconds']:.0f} s"
    )
    if args.json:
        merged: dict[str, Any] = json.loads(args.json.read_text()) if args.json.exists() else {}
        merged["served"] = figures
        merged["rows"] = [r for r in merged.get("rows", []) if not r["name"].startswith("served ")]
        merged["rows"] += table
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(merged, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

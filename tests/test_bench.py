"""``make bench``'s runner works: run once at tiny sizes. No timing is asserted here."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.adapter.vllm_support import missing_reason, require_vllm

ROOT = Path(__file__).resolve().parents[1]
KEYS = (
    "lifecycle_ratio_vs_vllm_baseline",
    "lifecycle_speedup_vs_machine_per_request",
    "bytes_per_inflight_request",
    "per_event_ratio_1m_vs_1k",
    "threads8_vs_single_throughput",
    "check_distinct_per_second",
)


def run(tmp_path: Path, *args: str) -> tuple[str, dict[str, Any]]:
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, json.loads(out.read_text())


def test_runner_prints_the_table_and_writes_every_key(tmp_path: Path) -> None:
    table, figures = run(tmp_path, "--only", "lifecycle,memory,flat,threads,check")
    for key in KEYS:
        assert key in figures, key
    for key in KEYS[:-1]:
        value = figures[key]
        assert isinstance(value, float) and math.isfinite(value) and value > 0, (key, value)
    check = figures["check_distinct_per_second"]
    assert isinstance(check, float) and check > 0  # asked for with --only: it must run
    assert figures["quick"] is True
    header = table.splitlines()[0]
    for column in ("figure", "median", "p90", "target", "met"):
        assert column in header
    for target in ("≤ 3.5 (guard)", "≥ 15 (guard)", "≤ 400", "≤ 1.3", "≥ 0.5"):
        assert target in table
    rows = figures["rows"]
    assert isinstance(rows, list)
    judged = [row for row in rows if row["met"] is not None]
    assert len(judged) >= 5
    assert figures["all_targets_met"] == all(row["met"] for row in judged)


def test_the_memory_figure_counts_what_requests_hold(tmp_path: Path) -> None:
    _, figures = run(tmp_path, "--only", "memory")
    per = figures["bytes_per_request"]
    assert isinstance(per, dict)
    # A pending request holds a record and a dict slot; a finishing one also its params.
    assert 50 < per["pending"] < per["finishing"]
    assert figures["bytes_per_inflight_request"] == max(per.values())


def test_vllm_rows_are_skipped_with_a_line_without_the_extra(tmp_path: Path) -> None:
    if missing_reason() is None:
        pytest.skip("the vLLM extra is installed: the rows run (see the vllm-marked test)")
    table, figures = run(tmp_path, "--only", "vllm")
    assert "vLLM rows skipped" in table
    assert figures["lifecycle_ratio_vs_real_vllm"] is None


def test_scheduler_loop_rows_are_skipped_with_a_line_without_the_extra(tmp_path: Path) -> None:
    if missing_reason() is None:
        pytest.skip("the vLLM extra is installed: the rows run (see the vllm-marked test)")
    table, figures = run(tmp_path, "--only", "scheduler-loop")
    assert "scheduler-loop rows skipped" in table
    assert figures["scheduler_loop_ratio_vs_real_vllm"] is None


@pytest.mark.vllm
@pytest.mark.slow  # 15 s alone (--durations, -p no:xdist): in `make test-slow`
@pytest.mark.timeout(300)  # vLLM's import, the scheduler's start, in the runner's process
def test_vllm_rows_and_scheduler_loop_rows_run(tmp_path: Path) -> None:
    """The vLLM rows (all three contenders) and the scheduler-loop rows (both connectors, both
    sizes), from one run of the runner: vLLM starts once for both."""
    require_vllm()
    table, figures = run(tmp_path, "--only", "vllm,scheduler-loop")
    ratios = figures["lifecycle_ratio_vs_real_vllm"]
    assert isinstance(ratios, dict)
    assert set(ratios) == {"adapter", "core"}
    assert all(isinstance(v, float) and v > 0 for v in ratios.values())
    assert isinstance(figures["yardstick_ratio_vs_real_vllm"], float)
    for row in ("vLLM MultiConnector", "our vLLM adapter", "our core MultiConnector", "yardstick"):
        assert row in table
    ratio = figures["scheduler_loop_ratio_vs_real_vllm"]
    assert isinstance(ratio, float) and math.isfinite(ratio) and ratio > 0
    assert isinstance(figures["scheduler_loop_ratio_vs_real_vllm_full_batches"], float)
    sizes = figures["scheduler_loop"]
    assert isinstance(sizes, dict) and len(sizes) == 2
    for entry in sizes.values():
        assert entry["vllm_us"] > 0 and entry["ours_us"] > 0
        assert entry["vllm_iqr_us"][0] <= entry["vllm_iqr_us"][1]
    for row in ("scheduler loop, 16 seqs", "scheduler loop, full batches of 128", "≤ 1.3"):
        assert row in table

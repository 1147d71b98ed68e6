"""Children that fail, inside a real vLLM engine: the engine keeps serving (issue #33).

One in-process engine (scheduler and worker in this process, so the test reads both sides'
connectors) with ours over two children: ``first``, a ``FaultyExampleConnector``
(``bench/engine_children.py``) whose saves fail with an I/O error for one prompt, whose files are
truncated for another, and whose ``get_finished`` raises on every step; ``second``, a healthy
``ExampleConnector``. vLLM's ``kv_load_failure_policy`` is ``recompute``. Checked: every request
is served with the tokens of the first pass; the loads that fail (a missing file, a truncated one)
are reported to vLLM as load errors, which it recomputes (its own ``_handle_invalid_blocks``
decides which requests); every failure is counted under ``first`` and the hook;
nothing is held afterwards, by vLLM or by our books.
"""

# vLLM is imported inside functions: the main environment collects this folder and has no engine.
# ruff: noqa: PLC0415

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import bench.engine_harness as h

pytestmark = [
    pytest.mark.engine,
    pytest.mark.timeout(300),
    pytest.mark.filterwarnings("ignore"),
]

PROMPT_TOKENS = 100
LOADED = 96  # 3 full blocks of 32: what ExampleConnector saves and loads
PROMPTS = h.prompts(6, PROMPT_TOKENS, seed=33)
OUTPUT_TOKENS = 8
#: The prompt whose first layer's save fails (its file is missing) and the one whose files are
#: truncated: loads of either from ``first`` fail.
SAVE_FAILS, TRUNCATED = 1, 4
#: report_overdue_seconds of the silent child's test.
OVERDUE = 2.0


def _transfer(tmp: Path) -> dict[str, Any]:
    records = tmp / "records"
    records.mkdir()
    faulty = h.example_child(
        tmp / "first",
        "first",
        records,
        "FaultyExampleConnector",
        multiconnector_name="first",
        save_fails=[PROMPTS[SAVE_FAILS][0]],
        truncate=[PROMPTS[TRUNCATED][0]],
        get_finished_raises=True,
    )
    healthy = h.example_child(tmp / "second", "second", records, multiconnector_name="second")
    config = h.multi_config([faulty, healthy])
    config["kv_load_failure_policy"] = "recompute"
    return config


def _worker_connector() -> Any:
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    return get_kv_transfer_group()


def _spy_recomputed(scheduler: Any) -> list[str]:
    """The request ids vLLM's scheduler recomputes after load errors, as it decides them (its
    own ``_handle_invalid_blocks``, called through)."""
    recomputed: list[str] = []
    handle = scheduler._handle_invalid_blocks

    def recording(*args: Any, **kwargs: Any) -> Any:
        failed = handle(*args, **kwargs)
        recomputed.extend(request_id.rsplit("-", 1)[0] for request_id in failed)
        return failed

    scheduler._handle_invalid_blocks = recording
    return recomputed


def _failures_metric(llm: Any, child: str = "first") -> dict[str, int]:
    """``vllm:multiconnector_child_failures`` of ``child`` per hook, as vLLM's
    Prometheus logger recorded it (``LLM.get_metrics``)."""
    found: dict[str, int] = {}
    for metric in llm.get_metrics():
        if metric.name == "vllm:multiconnector_child_failures":
            assert metric.labels["child"] == child, metric
            found[metric.labels["hook"]] = int(metric.value)
    return found


def _ids(outputs: Any) -> set[str]:
    """The scheduler's ids of these outputs' requests (vLLM adds a suffix to the user's id)."""
    return {output.request_id for output in outputs}


def _nothing_held(llm: Any) -> None:
    scheduler = h.engine_core(llm).scheduler
    assert not scheduler.requests
    assert scheduler.kv_cache_manager.usage == 0
    assert dict(scheduler.connector.saving) == {}


def test_a_failing_child_costs_recomputes_never_the_engine(
    tiny_model: Path, tmp_path: Path
) -> None:
    from bench.engine_children import FAULTS

    FAULTS.clear()
    h.engine_environment(in_process=True)
    llm = h.make_llm(tiny_model, _transfer(tmp_path), disable_log_stats=False)
    try:
        out1 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        assert h.cached(out1) == [0] * len(PROMPTS)
        assert FAULTS["first"]["save_fails"] == 1
        assert FAULTS["first"]["truncated"] == 2  # both layers' files
        worker = _worker_connector()
        failures = worker.child_failures()
        assert set(failures) == {"first"}
        assert failures["first"]["save_kv_layer"] == 1
        assert failures["first"]["get_transfer_results"] >= 1
        _nothing_held(llm)
        assert _failures_metric(llm) == failures["first"]  # vLLM's Prometheus metrics

        scheduler = h.engine_core(llm).scheduler
        recomputed = _spy_recomputed(scheduler)
        assert llm.reset_prefix_cache()
        out2 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        assert h.tokens(out2) == h.tokens(out1)
        failures = worker.child_failures()
        assert failures["first"]["start_load_kv"] >= 1  # the missing or truncated file
        loads = h.loads(tmp_path / "records")
        # first was asked to load all six; what it failed to load, vLLM recomputed
        assert loads["first"] == len(PROMPTS)
        assert "second" not in loads  # recomputed in place: vLLM does not look it up again
        assert _ids(out2[SAVE_FAILS : SAVE_FAILS + 1]) <= set(recomputed) <= _ids(out2)
        _nothing_held(llm)

        # a third pass, with first's broken prompts only: first is asked again (new requests),
        # its load fails again, both are recomputed
        seen = set(recomputed)
        assert llm.reset_prefix_cache()
        broken = [PROMPTS[SAVE_FAILS], PROMPTS[TRUNCATED]]
        out3 = h.generate(llm, broken, OUTPUT_TOKENS)
        assert h.tokens(out3) == [h.tokens(out1)[SAVE_FAILS], h.tokens(out1)[TRUNCATED]]
        assert (
            worker.child_failures()["first"]["start_load_kv"]
            == failures["first"]["start_load_kv"] + 1
        )
        assert set(recomputed) - seen == _ids(out3)
        _nothing_held(llm)
    finally:
        h.shut(llm)


def test_a_child_that_never_reports_is_overdue_and_its_requests_stay_held(
    tiny_model: Path, tmp_path: Path
) -> None:
    """A child that promised saves and went silent: the engine serves on, each of its requests
    is counted once as overdue past ``report_overdue_seconds`` (in ``child_failures()`` and in
    vLLM's Prometheus metrics), and their blocks stay held, as nothing may free KV a child may
    still be writing."""
    silent = h.example_child(
        tmp_path / "silent",
        "silent",
        None,
        "DelayedSaveConnector",
        multiconnector_name="silent",
        disk=False,
        never_reports=True,
    )
    healthy = h.example_child(tmp_path / "healthy", "healthy", None, multiconnector_name="healthy")
    config = h.multi_config([silent, healthy])
    config["kv_connector_extra_config"]["report_overdue_seconds"] = OVERDUE
    h.engine_environment(in_process=True)
    llm = h.make_llm(tiny_model, config, disable_log_stats=False)
    try:
        first = h.generate(llm, PROMPTS[:3], OUTPUT_TOKENS)
        assert [len(t) for t in h.tokens(first)] == [OUTPUT_TOKENS] * 3  # served
        scheduler = h.engine_core(llm).scheduler
        assert len(scheduler.requests) == 3  # finished, their blocks held for silent's saves
        # The workers learn who saves a finished request from the next step's metadata: their
        # clock starts then.
        later = h.generate(llm, PROMPTS[3:4], OUTPUT_TOKENS)
        worker = _worker_connector()
        assert worker.child_failures() == {}  # not overdue yet
        time.sleep(OVERDUE + 0.5)
        later += h.generate(llm, PROMPTS[4:5], OUTPUT_TOKENS)  # the engine steps again
        assert [len(t) for t in h.tokens(later)] == [OUTPUT_TOKENS] * 2
        assert worker.child_failures() == {"silent": {"finished_sending_overdue": 3}}
        assert _failures_metric(llm, "silent") == {"finished_sending_overdue": 3}
        assert len(scheduler.requests) == 5  # all held: silent never reported
        assert set(scheduler.connector.saving) == set(scheduler.requests)
    finally:
        h.shut(llm)

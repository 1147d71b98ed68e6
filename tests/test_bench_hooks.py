"""``bench.engine_row --hooks`` (``bench/engine_hooks.py``): the hook timer and its figures.
The row itself needs an engine (``.venv-engine``); here the timer on plain objects, the figures
from given rounds, and the hook names from vLLM's own base class."""

from __future__ import annotations

import time
import warnings
from typing import Any

import pytest

from bench import engine_hooks
from bench.engine_hooks import HookTimer


class _Connector:
    def __init__(self) -> None:
        self.seen: list[str] = []

    def get_finished(self, finished: set[str]) -> tuple[set[str], None]:
        self.seen.append("get_finished")
        time.sleep(0.002)
        return self.get_transfer_results(finished), None  # a hook that calls another

    def get_transfer_results(self, finished: set[str]) -> set[str]:
        self.seen.append("get_transfer_results")
        time.sleep(0.001)
        return set(finished)

    def fails(self) -> None:
        raise OSError("disk full")


def test_the_outermost_call_is_timed_once_and_take_starts_afresh() -> None:
    timer = HookTimer()
    child = _Connector()
    names = ("get_finished", "get_transfer_results", "fails", "not_there")
    assert timer.wrap(child, "worker", names) == 3  # what the object lacks is not wrapped
    assert child.get_finished({"r"}) == ({"r"}, None)  # answers pass through
    assert child.get_transfer_results({"s"}) == {"s"}
    with pytest.raises(OSError, match="disk full"):  # so do exceptions: counted all the same
        child.fails()
    assert child.seen == ["get_finished", "get_transfer_results", "get_transfer_results"]
    taken = timer.take()
    assert taken["worker.get_finished"][0] == 1
    assert taken["worker.get_finished"][1] >= 0.003  # its inner hook's time is in it
    assert taken["worker.get_transfer_results"][0] == 1  # the inner call is not counted again
    assert 0.001 <= taken["worker.get_transfer_results"][1] < taken["worker.get_finished"][1]
    assert taken["worker.fails"][0] == 1
    assert timer.take() == {}  # nothing since: hooks never called are left out
    child.get_transfer_results(set())
    assert list(timer.take()) == ["worker.get_transfer_results"]


def _round(main: float, tokens: int, hooks: dict[str, list[float]]) -> dict[str, Any]:
    return {"main": main, "tokens": tokens, "hooks": hooks}


def test_the_summary_pairs_rounds_and_sums_per_hook() -> None:
    rounds = {
        "ours": [
            _round(1.0, 100, {"s.a": [10, 0.02], "w.b": [5, 0.01]}),
            _round(2.0, 100, {"s.a": [10, 0.04]}),
        ],
        "vllm": [
            _round(1.0, 100, {"s.a": [10, 0.01]}),
            _round(1.0, 100, {"s.a": [10, 0.01], "w.b": [5, 0.005]}),
        ],
    }
    figures = engine_hooks.summary(rounds, ("ours", "vllm"))
    assert figures["share"]["ours"] == pytest.approx(0.025)  # median of 0.03 and 0.02
    assert figures["share"]["vllm"] == pytest.approx(0.0125)  # of 0.01 and 0.015
    # (0.03 - 0.01) / 1.0 and (0.04 - 0.015) / 1.0, per token alike.
    assert figures["difference"] == pytest.approx(0.0225)
    assert figures["difference_range"] == pytest.approx([0.02, 0.025])
    assert figures["per_hook_us"]["ours"]["s.a"] == [20, pytest.approx(3000.0)]
    assert figures["per_hook_us"]["vllm"]["w.b"] == [5, pytest.approx(1000.0)]
    rows = engine_hooks.hook_rows(figures, "engine")
    assert [row["median"] for row in rows] == pytest.approx([2.5, 1.25, 2.25])
    assert all(row["unit"] == "%" for row in rows)
    assert [row["met"] for row in rows] == [None, None, False]  # 2.25 % > the 1 % guard
    figures["difference"] = engine_hooks.GUARD
    assert engine_hooks.hook_rows(figures, "engine")[2]["met"] is True
    lines = engine_hooks.largest(figures)
    assert "s.a" in lines[0] and "+40.00 ms" in lines[0]  # 20 x 3 ms against 20 x 1 ms
    assert "w.b" in lines[1] and "+5.00 ms" in lines[1]
    with pytest.raises(ValueError, match="zip"):  # rounds out of step are an error, not a pair
        engine_hooks.summary({"ours": rounds["ours"], "vllm": rounds["vllm"][:1]}, ("ours", "vllm"))


@pytest.mark.vllm
def test_the_hooks_are_vllms_instance_methods() -> None:
    with warnings.catch_warnings():  # torch and vLLM warn about their own deprecations
        warnings.simplefilter("ignore")
        pytest.importorskip("vllm")
        names = engine_hooks.hook_names()
    for hook in (
        "get_num_new_matched_tokens",
        "update_state_after_alloc",
        "request_finished",
        "request_finished_all_groups",  # SupportsHMA's
        "save_kv_layer",
        "wait_for_layer_load",
        "get_finished",
        "bind_connector_metadata",
        "update_connector_output",
    ):
        assert hook in names
    for classmethod_ in ("build_kv_connector_stats", "get_required_kvcache_layout"):
        assert classmethod_ not in names  # vLLM calls those on the class
    assert len(names) == len(set(names))

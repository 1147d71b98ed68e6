"""``make bench``'s tiered row (``bench/tiered_row.py``): its arguments, configs, turn order,
figures and merge. The row itself needs an engine (``.venv-engine``); here its logic, from given
answers."""

from __future__ import annotations

import json
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from bench import tiered_row
from tests.bench_usage import refused

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--pairs", "0"], "must be at least 1"),
        (["--repeats", "1"], "must be at least 2"),
        (["--prompts", "x"], "is not an integer"),
        (["--repeats", "4", "--pairs", "5"], "--pairs 5 must be at most --repeats (4)"),
    ],
)
def test_a_bad_count_is_one_line_on_stderr_and_exit_2(
    tmp_path: Path, options: list[str], says: str
) -> None:
    line = refused("bench.tiered_row", options, tmp_path / "bench.json")
    assert options[-2] in line and says in line, line


def test_each_side_has_the_two_tiers_fast_first_and_its_own_rule(tmp_path: Path) -> None:
    configs = {side: tiered_row.transfer(side, tmp_path) for side in tiered_row.SIDES}
    for side, config in configs.items():
        children = config["kv_connector_extra_config"]["connectors"]
        extras = [child["kv_connector_extra_config"] for child in children]
        assert [e["label"] for e in extras] == ["fast", "large"]
        assert [e["max_blocks"] for e in extras] == [
            tiered_row.FAST_BLOCKS,
            tiered_row.LARGE_BLOCKS,
        ]
        assert len({e["shared_storage_path"] for e in extras}) == 2  # a folder per tier
        assert ("kv_connector_module_path" in config) is (side != "vllm")
    assert tiered_row.FAST_BLOCKS < tiered_row.LARGE_BLOCKS < tiered_row.PROMPT_BLOCKS
    with pytest.raises(ValueError, match="side: 'ours'"):
        tiered_row.transfer("ours", tmp_path)


@pytest.mark.vllm
def test_ours_configs_ask_for_longest_and_for_split_loads(tmp_path: Path) -> None:
    """The library's own option check reads each of ours' configs as the row says."""
    with warnings.catch_warnings():  # torch and vLLM warn about their own deprecations
        warnings.simplefilter("ignore")
        pytest.importorskip("vllm")
        from multiconnector.vllm.config import settings_of  # noqa: PLC0415

    def settings(side: str) -> Any:
        return settings_of(tiered_row.transfer(side, tmp_path)["kv_connector_extra_config"])

    longest, split = settings("longest"), settings("split")
    assert (longest.lookup.name, longest.split) == ("longest", False)
    assert (split.lookup.name, split.split) == ("first", True)


def test_every_repeat_runs_each_side_twice_mirrored_and_the_first_side_rotates() -> None:
    orders = [tiered_row.order(repeat) for repeat in range(6)]
    for turns in orders:
        assert Counter(turns) == dict.fromkeys(tiered_row.SIDES, 2)
        assert turns == turns[::-1]
    assert [turns[0] for turns in orders[:3]] == list(tiered_row.SIDES)
    assert orders[3] == orders[0]


def _answer(computed: int, ttft: list[float], wall: float, main: float) -> dict[str, Any]:
    return {
        "computed": computed,
        "prompts": 2,
        "ttft": ttft,
        "tokens": 8,
        "wall": wall,
        "main": main,
    }


def test_a_repeats_figures_and_the_ratios_median_and_quartiles() -> None:
    answers = {
        "vllm": [_answer(400, [0.010, 0.030], 1.0, 0.8), _answer(400, [0.020, 0.040], 1.0, 0.8)],
        "split": [_answer(100, [0.005, 0.015], 0.5, 0.4), _answer(100, [0.010, 0.020], 0.5, 0.4)],
    }
    figures = tiered_row.per_repeat(answers)
    assert figures["vllm"] == pytest.approx(
        {"computed": 200, "ttft": 25.0, "throughput": 8.0, "cpu_per_token": 1e5}
    )
    assert figures["split"] == pytest.approx(
        {"computed": 50, "ttft": 12.5, "throughput": 16.0, "cpu_per_token": 5e4}
    )
    # Three repeats; the second one's split side twice as slow to a first token.
    slower = {"vllm": figures["vllm"], "split": {**figures["split"], "ttft": 25.0}}
    summary = tiered_row.summarize([figures, slower, figures])
    assert summary["sides"]["split"]["ttft"] == pytest.approx(12.5)
    ttft = summary["ratios"]["split"]["ttft"]
    assert ttft["values"] == pytest.approx([0.5, 1.0, 0.5])
    assert ttft["median"] == pytest.approx(0.5) and ttft["iqr"] == pytest.approx([0.5, 0.75])
    assert summary["ratios"]["split"]["computed"]["median"] == pytest.approx(0.25)
    assert summary["ratios"]["split"]["throughput"]["median"] == pytest.approx(2.0)
    assert set(summary["ratios"]) == {"split"}  # vLLM's side is the baseline, not a ratio
    with pytest.raises(ValueError, match="repeats: 1 given"):
        tiered_row.summarize([figures])


def test_the_rows_merge_into_bench_json_beside_the_others(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one = tiered_row.per_repeat(
        {
            "vllm": [_answer(400, [0.02], 1.0, 0.8)],
            "longest": [_answer(100, [0.01], 0.5, 0.4)],
            "split": [_answer(100, [0.01], 0.8, 0.4)],
        }
    )
    seen: list[tuple[int, ...]] = []

    def measure(prompts: int, tokens: int, repeats: int, pairs: int) -> dict[str, Any]:
        seen.append((prompts, tokens, repeats, pairs))
        return tiered_row.summarize([one, one])

    monkeypatch.setattr(tiered_row, "measure", measure)
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"rows": [{"name": "lifecycle", "median": 1.0, "met": True}]}))
    assert tiered_row.main(["--quick", "--json", str(out)]) == 0
    assert tiered_row.main(["--json", str(out)]) == 0
    assert seen == [(4, 4, 2, 1), (16, 16, 8, 2)]
    printed = capsys.readouterr().out
    assert "| tiered: prompt tokens computed, longest ÷ vLLM's first hit | 0.250x |" in printed
    assert "| tiered: output throughput, split ÷ vLLM's first hit | 1.250x |" in printed
    merged = json.loads(out.read_text())
    names = [row["name"] for row in merged["rows"]]
    assert len(names) == 1 + 8 == len(set(names))  # the other row, and four per side of ours
    assert merged["tiered"]["ratios"]["longest"]["ttft"]["median"] == pytest.approx(0.5)
    assert merged["all_targets_met"] is True  # the tiered rows are reported, not judged

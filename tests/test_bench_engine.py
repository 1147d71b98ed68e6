"""``make bench``'s engine row (``bench/engine_row.py``): its arguments, labels, keys and merge.
The row itself needs an engine (``.venv-engine``); here its table and JSON, from given figures."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import engine_harness, engine_row
from tests.bench_usage import refused

ROOT = Path(__file__).resolve().parents[1]


def _figures(pair: tuple[str, str], ratio: float, layers: int) -> dict[str, Any]:
    return {
        "pair": list(pair),
        "layers": layers,
        "ratio": ratio,
        "ratio_q1": ratio - 0.01,
        "ratio_q3": ratio + 0.01,
        "iqr_within": 0.01 / ratio,
        "wall_ratio": ratio,
        "wall_ratio_iqr": [ratio - 0.01, ratio + 0.01],
        "cpu_us_per_token": {pair[0]: 100.0 * ratio, pair[1]: 100.0},
        "faults_injected": {},
        "pair_ratios": [ratio],
    }


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--layers", "0"], "must be at least 1"),
        (["--layers", "-3"], "must be at least 1"),
        (["--layers", "x"], "is not an integer"),
        (["--layers", ""], "is not an integer"),
        (["--layers", "2.5"], "is not an integer"),
        (
            ["--layers", str(engine_row.MAX_LAYERS + 1)],
            f"must be at most {engine_row.MAX_LAYERS}",
        ),
        (["--pairs", "0"], "must be at least 1"),
        (["--pairs", "x"], "is not an integer"),
        (["--repeats", "4", "--pairs", "5"], "--pairs 5 must be at most --repeats (4)"),
        (["--hooks", "--faults"], "--hooks times ours against vLLM's: not with --faults"),
    ],
)
def test_a_bad_layer_or_pair_count_is_one_line_on_stderr_and_exit_2(
    tmp_path: Path, options: list[str], says: str
) -> None:
    line = refused("bench.engine_row", options, tmp_path / "bench.json")
    named = next(o for o in ("--hooks", "--pairs", "--layers") if o in options)
    assert named in line and says in line, line


def test_the_layer_count_is_parsed_and_passed_to_the_model(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[tuple[Any, ...]] = []

    def measure(*args: Any, layers: int, pairs: int, hooks: bool) -> dict[str, Any]:
        assert hooks is False
        seen.append((*args, pairs, layers))
        return _figures(args[4], 0.97, layers)

    monkeypatch.setattr(engine_row, "measure", measure)
    assert engine_row.main(["--quick"]) == 0
    assert engine_row.main(["--quick", "--layers", "32"]) == 0
    assert [call[-1] for call in seen] == [engine_harness.LAYERS, 32]
    assert engine_harness.LAYERS == 2  # the tiny model, as before: the default is unchanged
    assert [call[-2] for call in seen] == [1, 1]  # --quick: one pair of processes
    assert engine_row.main([]) == 0
    assert seen[-1][2] == 16 and seen[-1][-2] == 8  # eight pairs share 16 repeats by default
    assert engine_row.main(["--repeats", "6", "--pairs", "3"]) == 0
    assert seen[-1][2] == 6 and seen[-1][-2] == 3


def test_each_layer_count_has_its_own_model_folder(tmp_path: Path) -> None:
    tiny = engine_harness.model_folder(tmp_path)
    assert tiny == tmp_path / "model"  # the tiny model's folder as before
    many = engine_harness.model_folder(tmp_path, 32)
    assert many != tiny and "32" in many.name
    assert len({engine_harness.model_folder(tmp_path, n) for n in range(1, 65)}) == 64


def test_labels_keys_and_targets() -> None:
    assert engine_row.label(2) == "engine"
    assert engine_row.label(32) == "engine, 32 layers"
    assert engine_row.key("engine", 2) == "engine"
    assert engine_row.key("engine", 32) == "engine_32_layers"
    assert engine_row.TARGET == 1.00
    assert engine_row.TARGETS == {2: 1.00, 32: 0.98}
    tiny = engine_row.rows(_figures(("ours", "vllm"), 0.99, 2))
    assert [row["name"] for row in tiny] == [  # the tiny row's names, unchanged
        "engine CPU per token, ours",
        "engine CPU per token, vLLM's MultiConnector",
        "engine ratio, ours ÷ vLLM (IQR within)",
    ]
    assert tiny[2]["target"] == "≤ 1.00, IQR ±2%" and tiny[2]["met"] is True
    many = engine_row.rows(_figures(("ours", "vllm"), 0.99, 32))
    assert all(row["name"].startswith("engine, 32 layers: ") for row in many)
    assert many[2]["target"] == "≤ 0.98, IQR ±2%" and many[2]["met"] is False  # 0.99 > 0.98
    other = engine_row.rows(_figures(("ours", "vllm"), 0.99, 8))
    assert other[2]["target"] == "" and other[2]["met"] is None  # no target: not judged
    faults = engine_row.fault_rows(_figures(("faulty", "healthy"), 1.0, 32))
    assert all(row["name"].startswith("faults, 32 layers: ") for row in faults)


def test_both_rows_merge_into_one_bench_json(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ratios = {2: 0.99, 32: 0.97}
    monkeypatch.setattr(
        engine_row,
        "measure",
        lambda *a, layers, pairs, hooks: _figures(a[4], ratios[layers], layers),
    )
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"rows": [{"name": "lifecycle", "median": 1.0, "met": True}]}))
    assert engine_row.main(["--quick", "--json", str(out)]) == 0
    assert engine_row.main(["--quick", "--layers", "32", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| engine, 32 layers: ratio, ours ÷ vLLM (IQR within) | 0.970x | ≤ 0.98" in printed
    assert "\nengine, 32 layers ours ÷ vllm: " in printed
    merged = json.loads(out.read_text())
    assert merged["engine"]["layers"] == 2 and merged["engine_ratio_vs_real_vllm"] == 0.99
    assert merged["engine_32_layers"]["layers"] == 32
    assert merged["engine_32_layers_ratio_vs_real_vllm"] == 0.97
    names = [row["name"] for row in merged["rows"]]
    assert len(names) == 7 == len(set(names))  # the other row, and three of each engine row
    assert merged["all_targets_met"] is True
    # A second run of the same row replaces its rows; the other row's stay.
    ratios[32] = 0.99
    assert engine_row.main(["--quick", "--layers", "32", "--json", str(out)]) == 0
    merged = json.loads(out.read_text())
    assert len(merged["rows"]) == 7
    assert merged["engine_32_layers_ratio_vs_real_vllm"] == 0.99
    assert merged["engine_ratio_vs_real_vllm"] == 0.99
    assert merged["all_targets_met"] is False

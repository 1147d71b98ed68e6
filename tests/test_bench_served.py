"""``make bench``'s served row (``bench/serve_row.py``): its figures from given runs. The row
itself needs ``vllm serve`` (``.venv-engine``); here its arithmetic and table, with no server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import serve_row


def _runs() -> tuple[list[dict[str, float | int | str]], dict[str, list[float]]]:
    runs: list[dict[str, float | int | str]] = []
    ratios: dict[str, list[float]] = {"output_throughput": [], "median_ttft_ms": []}
    for repeat, (ours, vllm) in enumerate([(100.0, 110.0), (120.0, 100.0), (90.0, 90.0)]):
        for side, tput in (("ours", ours), ("vllm", vllm)):
            runs.append({"repeat": repeat, "side": side, "output_throughput": tput,
                         "median_ttft_ms": 1000.0 / tput, "start_s": 100.0,
                         "load_average": 2.0 + repeat})  # fmt: skip
        ratios["output_throughput"].append(ours / vllm)
        ratios["median_ttft_ms"].append(vllm / ours)
    return runs, ratios


def test_summary_quartiles_per_side_and_of_the_ratios() -> None:
    runs, ratios = _runs()
    figures = serve_row.summary(runs, ratios, 64)
    assert figures["repeats"] == 3
    assert figures["quartiles"]["ours"]["output_throughput"] == [95.0, 100.0, 110.0]
    assert figures["quartiles"]["vllm"]["output_throughput"] == [95.0, 100.0, 105.0]
    q1, median, q3 = figures["ratio_quartiles"]["output_throughput"]
    assert median == pytest.approx(1.0)
    assert q1 == pytest.approx((100 / 110 + 1) / 2)
    assert q3 == pytest.approx((1 + 1.2) / 2)
    assert figures["load_average"] == [2.0, 4.0]
    assert "--num-prompts 64" in figures["command"]
    json.dumps(figures)  # it goes into bench.json


def test_rows_and_spread() -> None:
    runs, ratios = _runs()
    table = serve_row.rows(serve_row.summary(runs, ratios, 64))
    names = [row["name"] for row in table]
    assert len(names) == 6 and all(name.startswith("served ") for name in names)
    assert table[0]["median"] == 100.0 and table[0]["unit"] == "tok/s"
    assert serve_row._spread([1.0, 1.0, 1.0]) == 0.0
    assert serve_row._spread([0.9, 1.0, 1.2]) == pytest.approx(0.1)


def test_merge_keeps_the_other_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs, ratios = _runs()
    monkeypatch.setattr(serve_row, "measure", lambda *a: serve_row.summary(runs, ratios, 64))
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"rows": [{"name": "engine ratio", "median": 1.0}]}))
    assert serve_row.main(["--json", str(out), "--quick"]) == 0
    merged = json.loads(out.read_text())
    assert merged["rows"][0]["name"] == "engine ratio"
    assert len(merged["rows"]) == 7
    assert merged["served"]["repeats"] == 3

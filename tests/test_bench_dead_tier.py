"""``make bench``'s dead-tier row (``bench/dead_tier_row.py``): its round's plan, the step of a
readmission, what the rounds come to, its table, its arguments and its merge into bench.json.
The row itself needs an engine (``.venv-engine``); here its logic, from given answers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from bench import dead_tier_row as row
from multiconnector.healthbook import HealthSettings


def test_a_round_adds_its_requests_a_few_a_step_and_the_store_is_down_for_half_of_them() -> None:
    assert row.plan(96) == ([4] * 24, 12)
    assert row.plan(10) == ([4, 4, 2], 2)  # the rest in a last step
    assert row.plan(8, per_step=3) == ([3, 3, 2], 2)
    arrivals, down = row.plan(2 * row.PER_STEP)  # the fewest --prompts takes: one step down
    assert sum(arrivals) == 2 * row.PER_STEP and down == 1


def test_the_readmission_is_the_first_close_after_the_store_came_back() -> None:
    changes = [[1, "open", None], [3, "half_open", None], [4, "open", None],
               [9, "half_open", 0.4], [10, "closed", 0.45]]  # fmt: skip
    assert row.readmission(changes, 6) == [5, 0.45]  # step 10 is the 5th from step 6 on
    assert row.readmission(changes, 10) == [1, 0.45]  # closed within the first step back
    assert row.readmission(changes[:-1], 6) is None  # still half-open at the round's end
    assert row.readmission([[2, "closed", None]], 6) is None  # a close before it came back
    assert row.readmission([], 6) is None


def test_only_the_breakers_engine_has_health_with_the_bounds_it_states() -> None:
    breaker = row.transfer("breaker", Path("/tmp/x"))
    none = row.transfer("none", Path("/tmp/x"))
    extra = breaker["kv_connector_extra_config"]
    assert "health" not in none["kv_connector_extra_config"]
    assert extra["connectors"] == none["kv_connector_extra_config"]["connectors"]
    names = [c["kv_connector_extra_config"]["multiconnector_name"] for c in extra["connectors"]]
    assert names == ["live", row.DEAD]
    dead = extra["connectors"][1]
    assert dead["kv_connector"] == "DeadTierConnector"
    assert dead["kv_connector_extra_config"]["fail_seconds"] == row.FAIL_SECONDS > 0
    # Each key one of the health machine's bounds (an unknown one: TypeError), as the adapter
    # checks them in the engine (multiconnector.vllm.config.health_settings).
    assert extra["health"] == row.HEALTH and extra["health"] is not row.HEALTH
    settings = HealthSettings(**row.HEALTH)
    assert settings.max_cooldown_seconds >= settings.cooldown_seconds
    assert settings.threshold == row.HEALTH["threshold"] > 1


def _answer(seed: int, *, failed: int, readmitted: list[Any] | None, digest: str = "d",
            served: int = 96) -> dict[str, Any]:  # fmt: skip
    return {"seed": seed, "digest": f"{digest}{seed}", "served": served, "requests": 96,
            "down_steps": 12, "readmitted": readmitted,
            "dead": {"asked": failed + 3, "skipped": 93 - failed, "failed": failed}}  # fmt: skip


def _figures(breaker: list[dict[str, Any]], none: list[dict[str, Any]]) -> dict[str, Any]:
    return {"answers": {"breaker": breaker, "none": none}, "ratio": 0.99, "ratio_q1": 0.98,
            "ratio_q3": 1.0, "wall_ratio": 0.9, "wall_ratio_iqr": [0.88, 0.92]}  # fmt: skip


def test_the_rounds_come_to_the_served_the_spared_and_the_readmissions() -> None:
    breaker = [_answer(1, failed=7, readmitted=[4, 0.3]), _answer(2, failed=9, readmitted=None)]
    none = [_answer(1, failed=48, readmitted=None), _answer(2, failed=48, readmitted=None)]
    said = row.summary(_figures(breaker, none))
    assert said["served"] == {"breaker": [192, 192], "none": [192, 192]}
    assert said["all_served"] and said["tokens_equal"]
    assert said["dead"]["breaker"]["failed"] == 8 and said["dead"]["none"]["failed"] == 48
    assert said["failed_lookups_spared"] == 40  # medians of 41 and 39
    assert said["lookups_down"] == 12 * row.PER_STEP
    assert said["readmitted_steps"] == [4] and said["readmitted_seconds"] == [0.3]
    assert said["not_readmitted"] == 1
    table = row.rows({**_figures(breaker, none), "summary": said})
    assert all(r["name"].startswith("dead tier: ") for r in table)
    assert len({r["name"] for r in table}) == len(table)
    judged = {r["name"]: r["met"] for r in table if r["met"] is not None}
    assert judged == {
        "dead tier: steps from its store's return to its readmission": False,  # one was not
        "dead tier: requests served, both engines": True,
    }
    json.dumps(said)  # it goes into bench.json


def test_a_request_not_served_or_tokens_that_differ_are_not_met() -> None:
    back = [4, 0.3]
    short = row.summary(_figures([_answer(1, failed=7, readmitted=back, served=95)],
                                 [_answer(1, failed=48, readmitted=None)]))  # fmt: skip
    assert not short["all_served"] and short["tokens_equal"]
    other = row.summary(_figures([_answer(1, failed=7, readmitted=back, digest="e")],
                                 [_answer(1, failed=48, readmitted=None)]))  # fmt: skip
    assert other["all_served"] and not other["tokens_equal"]
    for said in (short, other):
        table = row.rows({**_figures([], []), "summary": said})
        assert table[-1]["met"] is False
        assert table[-2]["met"] is True  # readmitted in its one round


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--prompts", str(2 * row.PER_STEP - 1)], f"must be at least {2 * row.PER_STEP}"),
        (["--prompts", "x"], "is not an integer"),
        (["--repeats", "1"], "must be at least 2"),
        (["--repeats", "2", "--pairs", "3"], "--pairs 3 must be at most --repeats (2)"),
        (["--fail-seconds", "-0.001"], "must be within 0 and 1"),
        (["--fail-seconds", "nan"], "must be within 0 and 1"),
        (["--fail-seconds", "x"], "invalid float value"),
    ],
)
def test_a_bad_argument_is_one_line_on_stderr_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], says: str
) -> None:
    out = tmp_path / "bench.json"
    with pytest.raises(SystemExit) as exited:
        row.main([*options, "--json", str(out)])
    assert exited.value.code == 2
    printed = capsys.readouterr()
    lines = printed.err.splitlines()
    assert len(lines) == 1 and says in lines[0] and options[-2] in lines[0], lines
    assert lines[0].startswith("bench.dead_tier_row: error: ")
    assert printed.out == "" and not out.exists()  # nothing ran, nothing was written


def test_the_row_merges_into_bench_json_beside_the_others(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: dict[str, Any] = {}

    def measure(*args: Any, **kwargs: Any) -> dict[str, Any]:
        seen.update(kwargs, args=args)
        back = [3, 0.2]
        return _figures([_answer(1, failed=7, readmitted=back)],
                        [_answer(1, failed=48, readmitted=None)])  # fmt: skip

    monkeypatch.setattr(row, "measure", measure)
    monkeypatch.setenv(row.FAIL_ENV, "unset")  # restored after the test
    out = tmp_path / "bench.json"
    out.write_text(json.dumps({"rows": [{"name": "lifecycle", "median": 1.0, "met": True}]}))
    assert row.main(["--json", str(out)]) == 0
    assert seen["module"] == "bench.dead_tier_row" and seen["keep"] is True
    assert seen["args"] == (160, 8, 16, 2, row.SIDES) and seen["pairs"] == 2
    printed = capsys.readouterr().out
    assert "| dead tier: requests served, both engines | 100.00 % | all, tokens equal | met |" in (
        printed
    )
    merged = json.loads(out.read_text())
    assert merged["dead_tier"]["health"] == row.HEALTH
    assert merged["dead_tier"]["fail_seconds"] == row.FAIL_SECONDS
    assert float(os.environ[row.FAIL_ENV]) == row.FAIL_SECONDS  # for the engine processes
    assert row.main(["--fail-seconds", "0", "--json", str(out)]) == 0
    assert float(os.environ[row.FAIL_ENV]) == 0.0
    assert merged["dead_tier"]["summary"]["readmitted_steps"] == [3]
    assert merged["rows"][0]["name"] == "lifecycle"  # the other rows kept, first
    assert len(merged["rows"]) == 7 and merged["all_targets_met"] is True
    assert row.main(["--json", str(out)]) == 0  # again: its rows replaced, not added
    assert len(json.loads(out.read_text())["rows"]) == 7

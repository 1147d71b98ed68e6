"""``tests/vllm_own/compare.py``: what ``make test-vllm-own`` concludes from the four runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest


def _compare() -> ModuleType:
    path = Path(__file__).resolve().parent / "compare.py"
    spec = importlib.util.spec_from_file_location("vllm_own_compare", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


compare = _compare()

CASES = {
    "passes": "",
    "fails": '<failure message="boom"/>',
    "errs": '<error message="boom"/>',
    "skips": '<skipped type="pytest.skip" message="gpu"/>',
    "refused": '<skipped type="pytest.xfail" message="private"/>',
}


def _junit(folder: Path, name: str, outcomes: dict[str, str]) -> None:
    cases = "".join(
        f'<testcase classname="t" name="{test}">{CASES[kind]}</testcase>'
        for test, kind in outcomes.items()
    )
    (folder / name).write_text(
        f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>'
    )


def test_outcomes_are_read_from_junit(tmp_path: Path) -> None:
    _junit(tmp_path, "x.xml", {kind: kind for kind in CASES})
    assert compare.outcomes(tmp_path / "x.xml") == {
        "t::passes": "passed",
        "t::fails": "failed",
        "t::errs": "error",
        "t::skips": "skipped",
        "t::refused": "xfailed",
    }


def test_ours_passing_what_vllms_passes_or_xfailing_it_is_enough(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _junit(tmp_path, "0.33-vllm.xml", {"a": "passes", "b": "passes", "c": "fails", "d": "skips"})
    _junit(tmp_path, "0.33-ours.xml", {"a": "passes", "b": "refused", "c": "fails", "d": "skips"})
    assert compare.main(["compare", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "0.33: vLLM's class: 2 passed, 1 failed, 1 skipped; ours: 1 passed, 1 failed" in out


@pytest.mark.parametrize("kind", ["fails", "errs", "skips"])
def test_a_test_vllms_class_passes_and_ours_does_not_fails_the_comparison(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _junit(tmp_path, "0.32-vllm.xml", {"a": "passes", "b": "passes"})
    _junit(tmp_path, "0.32-ours.xml", {"a": "passes", "b": kind})
    assert compare.main(["compare", str(tmp_path)]) == 1
    assert "0.32: t::b" in capsys.readouterr().err


def test_no_runs_fail_the_comparison(tmp_path: Path) -> None:
    assert compare.main(["compare", str(tmp_path)]) == 1

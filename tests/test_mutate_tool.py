"""tools/mutate.py (``make mutate``): how it reads mutmut's results, without running mutmut.

mutmut is in the ``mutate`` extra only: without it these tests are skipped.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("mutmut")

ROOT = Path(__file__).resolve().parent.parent


def tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("mutate_tool", ROOT / "tools" / "mutate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def meta(path: Path, codes: dict[str, int | None]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": codes}))


def test_a_subpackage_is_every_file_of_it_a_module_its_own_file(tmp_path: Path) -> None:
    mutate = tool()
    base = tmp_path / "mutants" / "multiconnector"
    meta(base / "aggregator" / "saving.py.meta", {"s__mutmut_1": 1, "s__mutmut_2": 0})
    meta(base / "aggregator" / "queries.py.meta", {"q__mutmut_1": 33, "q__mutmut_2": None})
    meta(base / "params.py.meta", {"p__mutmut_1": 0})
    assert mutate.statuses(tmp_path, "aggregator") == {
        "q__mutmut_1": "no tests",
        "q__mutmut_2": "not checked",
        "s__mutmut_1": "killed",
        "s__mutmut_2": "survived",
    }
    assert mutate.statuses(tmp_path, "params") == {"p__mutmut_1": "survived"}
    assert mutate.sources("aggregator") == "aggregator/"
    assert mutate.sources("params") == "params.py"


def test_the_equivalent_mutants_table_is_read_row_by_row() -> None:
    found = tool().equivalents(ROOT / "docs" / "mutation.md")
    assert "multiconnector._table.x_events_of__mutmut_4" in found
    saving = "multiconnector.aggregator.saving.xǁSavingǁ_finish_by__mutmut_11"
    assert found[saving] == "`_NO_NAME` is `None`: the mutant writes the same key."
    assert all(reason for reason in found.values())


def test_report_only_reports_on_the_last_run_and_keeps_its_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mutate = tool()
    base = tmp_path / "mutate" / "mutants" / "multiconnector"
    meta(base / "params.py.meta", {"multiconnector.params.x__mutmut_1": 1})
    (tmp_path / "mutation.json").write_text(json.dumps({"modules": {"params": {"seconds": 7.5}}}))
    assert mutate.main(["--report-only", "--module", "params", "--build", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "mutation.json").read_text())
    assert result["modules"]["params"]["killed"] == 1
    assert result["modules"]["params"]["seconds"] == 7.5
    assert "no unexplained survivor" in capsys.readouterr().out
    assert mutate.main(["--report-only", "--build", str(tmp_path / "none")]) == 2


def test_a_mutant_is_killed_only_by_a_failing_test(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # pytest's exit 1 is a failing test; 2 (an error while collecting) and 3 (an internal
    # error, which mutmut calls killed) are no verdict on the mutant: an error, and a failure.
    mutate = tool()
    base = tmp_path / "mutate" / "mutants" / "multiconnector"
    codes = {f"multiconnector.params.x__mutmut_{code}": code for code in (1, 2, 3)}
    meta(base / "params.py.meta", codes)
    assert mutate.statuses(tmp_path / "mutate", "params") == {
        "multiconnector.params.x__mutmut_1": "killed",
        "multiconnector.params.x__mutmut_2": mutate.ERROR,
        "multiconnector.params.x__mutmut_3": mutate.ERROR,
    }
    assert mutate.main(["--report-only", "--module", "params", "--build", str(tmp_path)]) == 1
    params = json.loads((tmp_path / "mutation.json").read_text())["modules"]["params"]
    assert (params["killed"], params["errors"], params["unexplained"]) == (1, 2, 0)
    out = capsys.readouterr().out
    assert "no test verdict (pytest error, not a failing test) in params: " in out
    assert "2 mutant(s) without a test verdict" in out

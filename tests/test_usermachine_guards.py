"""``no overlapping guards`` judged on what the guards say, and traces that show the model's data.

The circuit breaker of docs/docs_example.py (``CircuitBreaker``, its model ``Breaker``) has two
``fail`` transitions out of ``closed``: ``failures < 3`` stays closed, ``failures >= 3`` opens.
With the model factory the guards run, so the pair never holds together and the machine passes;
``WrongBreaker`` (``<=`` for ``<``) lets both hold at three failures and fails, its trace showing
the count at each step. Without a factory, the guards' names are all there is to judge.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from transitions import Machine

from multiconnector.cli import main
from multiconnector.usermachine import DETERMINISTIC, check_machine

DOCS = Path(__file__).resolve().parent.parent / "docs"
BREAKER = ["check", "--machine", "docs_example:CircuitBreaker", "--no-progress"]


@pytest.fixture(autouse=True)
def _docs_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(DOCS))


def _trace(out: str, prop: str) -> list[str]:
    """The lines ``N. event -> state`` of ``prop``'s printed trace."""
    block = re.search(rf"FAIL  {prop}:[\s\S]*?shortest trace.*\n((?:[ ]+\d+\. .*\n)+)", out)
    assert block is not None, out
    return [line.split(". ", 1)[1] for line in block.group(1).splitlines()]


def test_the_correct_breaker_passes_with_its_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*BREAKER, "--model", "docs_example:Breaker"]) == 0
    out = capsys.readouterr().out
    assert f"PASS  {DETERMINISTIC}" in out and "result: PASS" in out


def test_the_wrong_breaker_fails_with_the_counts_in_its_trace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "wrong.json"
    argv = [*BREAKER, "--model", "docs_example:WrongBreaker", "--json", str(report)]
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "result: FAIL (1 property)" in out
    assert "both guards hold here with failures=3" in out
    assert "from: closed (failures=0)" in out
    steps = _trace(out, DETERMINISTIC)
    assert [re.sub(r"\s+", " ", s) for s in steps] == [
        f"fail -> closed (failures={n})" for n in (1, 2, 3)
    ]
    data = json.loads(report.read_text())
    (failed,) = [p for p in data["properties"] if p["result"] == "FAIL"]
    trace = failed["counterexample"]
    assert trace["initial"] == "closed (failures=0)"
    assert [s["state"] for s in trace["steps"]] == [f"closed (failures={n})" for n in (1, 2, 3)]
    # The trace with its values still draws: the diagram reads the states' names back.
    assert main(["diagram", "--machine", "docs_example:CircuitBreaker", "--path", str(report)]) == 0
    assert "closed --> closed: fail [below_limit] (steps 1, 2, 3)" in capsys.readouterr().out


@pytest.mark.parametrize(("model", "status"), [("Breaker", 0), ("WrongBreaker", 1)])
def test_the_command_as_ci_runs_it(model: str, status: int) -> None:
    """``python -m multiconnector check --machine ... --model ...`` from docs/: its exit status."""
    argv = [*BREAKER[1:], "--model", f"docs_example:{model}"]
    env = {**os.environ, "PYTHONPATH": str(DOCS.parent)}
    done = subprocess.run(
        [sys.executable, "-m", "multiconnector", "check", *argv],
        capture_output=True, text=True, cwd=DOCS, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == status, done.stdout + done.stderr
    assert done.stderr == ""


def test_without_a_model_the_guard_names_decide(capsys: pytest.CaptureFixture[str]) -> None:
    """Free guards: ``below_limit`` and ``at_limit`` are two names, which may hold together."""
    assert main(BREAKER) == 1
    assert f"FAIL  {DETERMINISTIC}" in capsys.readouterr().out
    assert main([*BREAKER, "--model", "docs_example:Breaker", "--free-guards"]) == 1
    assert f"FAIL  {DETERMINISTIC}" in capsys.readouterr().out


class _BreakerMachine(Machine):  # type: ignore[misc]
    """A machine that is its own model, its guards its methods: a factory of its own."""

    below = "<"

    def __init__(self) -> None:
        self.failures = 0
        super().__init__(
            states=["closed", "open"],
            initial="closed",
            transitions=[
                {"trigger": "fail", "source": "closed", "dest": "closed",
                 "conditions": self.below_limit, "after": "count"},
                {"trigger": "fail", "source": "closed", "dest": "open",
                 "conditions": lambda: self.failures >= 3},
                {"trigger": "reset", "source": "open", "dest": "closed", "after": "zero"},
            ],
            auto_transitions=False,
        )  # fmt: skip

    def below_limit(self) -> bool:
        return self.failures < 3 if self.below == "<" else self.failures <= 3

    def count(self) -> None:
        self.failures += 1

    def zero(self) -> None:
        self.failures = 0


def test_bound_methods_and_lambdas_are_run_on_each_model() -> None:
    assert check_machine(_BreakerMachine).result(DETERMINISTIC).passed

    class Slipped(_BreakerMachine):
        below = "<="

    result = check_machine(Slipped).result(DETERMINISTIC)
    assert not result.passed and result.counterexample is not None
    assert result.counterexample.steps[-1].state == "closed (failures=3)"
    assert "-> open [" in result.message and "with failures=3" in result.message


def test_a_guard_that_raises_is_not_an_overlap_but_an_exception() -> None:
    class Model:
        def ok(self) -> bool:
            return True

        def broken(self) -> bool:
            raise RuntimeError("guard down")

    decl: dict[str, Any] = {
        "states": ["a", "b", "c"],
        "initial": "a",
        "final": ["b", "c"],
        "transitions": [
            {"trigger": "go", "source": "a", "dest": "b", "conditions": "broken"},
            {"trigger": "go", "source": "a", "dest": "c", "conditions": "ok"},
        ],
    }
    report = check_machine(decl, model=Model)
    assert report.result(DETERMINISTIC).passed
    assert report.result("no exception").message == "RuntimeError: guard down"


class _Account:
    """A model whose balance a deposit raises, up to three."""

    def __init__(self) -> None:
        self.balance = 0

    def small(self) -> bool:
        return self.balance < 3

    def add(self) -> None:
        self.balance += 1


def under_two(model: Any) -> bool:
    """the balance stays under two"""
    return bool(model.balance < 2)


ACCOUNT_FLOW = {
    "states": ["open", "closed"],
    "initial": "open",
    "final": ["closed"],
    "transitions": [
        {"trigger": "deposit", "source": "open", "dest": None, "conditions": "small",
         "after": "add"},
        ["close", "open", "closed"],
    ],
}  # fmt: skip


def test_an_invariant_trace_shows_the_values_and_its_docstring_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    module = types.SimpleNamespace(Flow=ACCOUNT_FLOW, Account=_Account, under_two=under_two)
    monkeypatch.setitem(sys.modules, "account_flow", module)
    argv = ["check", "--machine", "account_flow:Flow", "--model", "account_flow:Account"]
    assert main([*argv, "--invariant", "account_flow:under_two", "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert out.count("the balance stays under two") == 1
    assert "it returned False in 'open' with balance=2" in out
    assert [re.sub(r"\s+", " ", s) for s in _trace(out, "under_two")] == [
        "deposit -> open (balance=1)",
        "deposit -> open (balance=2)",
    ]

"""`check --machine` / `diagram --machine`: a machine of your own, from the command line and API."""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from transitions import Machine
from transitions.extensions import GraphMachine

from multiconnector.check import validate
from multiconnector.cli import main
from multiconnector.errors import InvalidArgumentError, InvalidMachineError
from multiconnector.machine import build_machine
from multiconnector.usermachine import (
    DETERMINISTIC,
    FINAL_IS_FINAL,
    NO_DEADLOCK,
    NO_EXCEPTION,
    NO_TRAP,
    STATES_REACHED,
    TRANSITIONS_FIRED,
    check_machine,
    draw,
)
from tests.browser import mermaid_blocks

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@pytest.fixture(autouse=True)
def _docs_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(DOCS))


def test_cli_finds_the_planted_trap_with_its_shortest_trace(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["check", "--machine", "docs_example:OrderFlow", "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "FAIL  no trap" in out
    trace = re.search(r"FAIL  no trap.*?shortest trace \((\d+) events\)(.*?)\n  PASS", out, re.S)
    assert trace is not None
    assert trace.group(1) == "3"
    assert re.findall(r"\d\. (\w+)", trace.group(2)) == ["place", "pay", "hold"]
    assert "result: FAIL (1 property)" in out


def test_cli_passes_the_fixed_machine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--machine", "docs_example:FixedOrderFlow", "--no-progress"]) == 0
    assert "result: PASS" in capsys.readouterr().out


def test_json_report_and_its_trace_drawn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "r.json"
    argv = ["check", "--machine", "docs_example:OrderFlow", "--no-progress", "--json", str(report)]
    assert main(argv) == 1
    data = json.loads(report.read_text())
    assert data["ok"] is False
    trap = next(p for p in data["properties"] if p["name"] == NO_TRAP)
    assert [s["state"] for s in trap["counterexample"]["steps"]] == ["placed", "paid", "held"]
    for fmt in ("mermaid", "dot", "md"):
        assert (
            main(
                [
                    "diagram",
                    "--machine",
                    "docs_example:OrderFlow",
                    "--path",
                    str(report),
                    "--format",
                    fmt,
                ]
            )
            == 0
        )
        text = capsys.readouterr().out
        assert "(step 3)" in text or "step 3" in text, fmt
    assert (
        main(
            [
                "diagram",
                "--machine",
                "docs_example:OrderFlow",
                "--format",
                "mermaid",
                "--state",
                "held",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Class held s_final" in out and "Class paid s_default" in out


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is missing")
def test_svg_of_a_path() -> None:
    report = check_machine("docs_example:OrderFlow")
    svg = draw("docs_example:OrderFlow", path=report.result(NO_TRAP).counterexample).svg()
    assert svg.lstrip().startswith("<?xml") and "hold (step 3)" in svg
    bundle = draw("docs_example:OrderFlow")._repr_mimebundle_()
    assert set(bundle) == {"image/svg+xml", "text/markdown", "text/plain"}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["check", "--machine", "nosuchmodule:X"], r"no module named 'nosuchmodule'"),
        (["check", "--machine", "docs_example"], r"must be MODULE:ATTR"),
        (["check", "--machine", "docs_example:Nope"], r"has no attribute 'Nope'"),
        (["check", "--machine", "docs_example:OrderFlow", "--requests", "3"], r"--requests"),
        # The transfer machine's defaults, typed out, are refused as well: not ignored.
        (
            ["check", "--machine", "docs_example:OrderFlow", "--requests", "2"],
            r"error: --requests applies to the transfer machine, not to --machine$",
        ),
        (
            ["check", "--machine", "docs_example:OrderFlow", "--connectors", "a,b"],
            r"error: --connectors applies to the transfer machine",
        ),
        (
            ["check", "--machine", "docs_example:OrderFlow", "--early-reports", "savers"],
            r"--early-reports applies",
        ),
        (
            ["check", "--machine", "x:Y", "--connectors", "a,b", "--requests", "2"],
            r"--connectors, --requests apply to the transfer machine",
        ),
        (["check", "--machine", "docs_example:OrderFlow", "--per-request"], r"--per-request"),
        (["check", "--machine", "docs_example:OrderFlow", "--params"], r"--params"),
        (["check", "--invariant", "docs_example:OrderFlow"], r"--invariant needs --machine"),
        (["diagram", "--machine", "docs_example:OrderFlow", "--state", "x"], r"state='x'"),
        (["diagram", "--state", "held"], r"--state needs --machine"),
    ],
)
def test_bad_input_is_one_line_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(message, err, re.M), err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def _machine(transitions: list[Any], **extra: Any) -> dict[str, Any]:
    return {
        "states": ["a", "b", "c", "z"],
        "initial": "a",
        "final": ["z"],
        "transitions": transitions,
        **extra,
    }


@pytest.mark.parametrize(
    ("decl", "prop", "message"),
    [
        (_machine([["go", "a", "z"]]), STATES_REACHED, "never entered: b, c"),
        (
            _machine([["go", "a", "b"], ["go", "a", "c"], ["on", "b", "z"], ["on", "c", "z"]]),
            TRANSITIONS_FIRED,
            "never fired: a --go--> c",
        ),
        (
            _machine(
                [
                    {"trigger": "go", "source": "a", "dest": "b", "conditions": "x"},
                    {"trigger": "go", "source": "a", "dest": "c", "conditions": "y"},
                    ["on", ["b", "c"], "z"],
                ]
            ),
            DETERMINISTIC,
            "'go' in 'a' can take both -> b [x] and -> c [y]",
        ),
        (
            _machine([["go", "a", "b"], ["on", "b", "z"], ["back", "z", "c"], ["on", "c", "z"]]),
            FINAL_IS_FINAL,
            "final state 'z' has transitions out: back -> c",
        ),
        (_machine([["go", "a", "b"], ["go", "a", "z"]]), NO_DEADLOCK, "no event can fire in 'b'"),
        (
            _machine([["go", "a", "b"], ["on", "b", "c"], ["on", "c", "b"], ["end", "a", "z"]]),
            NO_TRAP,
            "no sequence of events leads",
        ),
    ],
)
def test_each_property_catches_its_problem(decl: dict[str, Any], prop: str, message: str) -> None:
    report = check_machine(decl)
    result = report.result(prop)
    assert not result.passed
    assert message in result.message
    with pytest.raises(InvalidMachineError) as caught:
        validate(decl)
    assert any(p.startswith(f"{prop}: ") for p in caught.value.problems)


def test_guards_told_apart_are_not_overlapping() -> None:
    decl = _machine(
        [
            {"trigger": "go", "source": "a", "dest": "b", "conditions": "x"},
            {"trigger": "go", "source": "a", "dest": "c", "unless": "x"},
            ["on", ["b", "c"], "z"],
        ]
    )
    assert validate(decl).ok


def test_declaration_problems_are_all_listed() -> None:
    with pytest.raises(InvalidMachineError) as caught:
        validate(
            {
                "states": ["a", "a"],
                "initial": "q",
                "final": ["w"],
                "transitions": [["go", "a", "nowhere"]],
                "colour": 1,
            }
        )
    text = "\n".join(caught.value.problems)
    for part in (
        "unknown keys ['colour']",
        "'a' is declared more than once",
        "initial state 'q'",
        "final state 'w'",
        "dest 'nowhere'",
    ):
        assert part in text


class Account(Machine):  # type: ignore[misc]
    """Guards and callbacks that read and write model data."""

    def __init__(self) -> None:
        self.balance = 0
        super().__init__(
            states=["open", {"name": "closed", "final": True}],
            initial="open",
            transitions=[
                {
                    "trigger": "deposit",
                    "source": "open",
                    "dest": None,
                    "conditions": "small",
                    "after": "add",
                },
                {"trigger": "close", "source": "open", "dest": "closed", "conditions": "empty"},
            ],
        )

    def small(self) -> bool:
        return self.balance < 3

    def add(self) -> None:
        self.balance += 1

    def empty(self) -> bool:
        return self.balance == 0


def under_two(model: Any) -> bool:
    """the balance stays under two"""
    return bool(model.balance < 2)


def test_a_machine_class_is_explored_with_its_own_models() -> None:
    report = check_machine(Account, invariants=[under_two])
    assert "your code" in report.bounds["guards"]
    assert report.distinct_states == 5  # balance 0..3 open, and closed
    deadlock = report.result(NO_DEADLOCK)
    assert not deadlock.passed and deadlock.counterexample is not None
    assert [s.event for s in deadlock.counterexample.steps] == ["deposit"] * 3
    broken = report.result("under_two")
    assert not broken.passed and broken.description == "the balance stays under two"
    free = check_machine(Account, free_guards=True)
    assert free.ok and "free choices" in free.bounds["guards"]


def test_an_exception_in_a_callback_is_a_violation() -> None:
    class Boom:
        def explode(self) -> None:
            raise ValueError("boom")

    decl = {
        "states": ["a", "z"],
        "initial": "a",
        "final": ["z"],
        "transitions": [{"trigger": "go", "source": "a", "dest": "z", "after": "explode"}],
    }
    report = check_machine(decl, model=Boom)
    assert report.result(NO_EXCEPTION).message == "ValueError: boom"


def test_bad_api_arguments_are_typed() -> None:
    with pytest.raises(InvalidArgumentError, match="machine=42"):
        check_machine(42)
    with pytest.raises(InvalidArgumentError, match="free_guards="):
        check_machine(_machine([]), free_guards="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="built-in property"):
        check_machine(_machine([]), invariants={NO_TRAP: under_two})


def test_build_machine_draws_once_a_model_is_attached() -> None:
    """A GraphMachine with no model has no graph (transitions' get_graph reads models[0])."""
    with pytest.raises(IndexError):
        build_machine(machine_cls=GraphMachine, graph_engine="mermaid").get_graph()
    machine = build_machine(
        machine_cls=GraphMachine, graph_engine="mermaid", model=types.SimpleNamespace()
    )
    assert "pending --> finishing" in machine.get_graph().source


def test_the_docs_page_shows_the_current_machine_and_diagram() -> None:
    page = (DOCS / "usermachine.md").read_text(encoding="utf-8")
    source = (DOCS / "docs_example.py").read_text(encoding="utf-8")
    flow = re.search(r"^OrderFlow = \{.*?^\}\n", source, re.S | re.M)
    assert flow is not None and f"```python\n{flow.group(0)}```" in page
    fixed = re.search(r"^FixedOrderFlow = \{.*?^\}\n", source, re.S | re.M)
    assert fixed is not None and f"```python\n{fixed.group(0)}```" in page
    for pattern in (  # the circuit breaker, its model, and the slip
        r"^CircuitBreaker = \{.*?^\}\n",
        r"^class Breaker:.*?\n(?=\n\n)",
        r"^class WrongBreaker\(Breaker\):.*\n",
    ):
        shown = re.search(pattern, source, re.S | re.M)
        assert shown is not None and f"```python\n{shown.group(0)}```" in page, pattern
    report = check_machine("docs_example:OrderFlow")
    drawn = draw(
        "docs_example:OrderFlow",
        path=report.result(NO_TRAP).counterexample,
        title="docs_example:OrderFlow: counterexample to 'no trap'",
    )
    assert mermaid_blocks(page) == [drawn.mermaid()]


# -- check --machine for CI: verdicts, exit status, time budget, cost --------------------------


def test_a_search_cut_short_exits_3_and_its_json_is_not_ok(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cut.json"
    argv = ["check", "--machine", "docs_example:OrderFlow", "--no-progress", "--max-states", "3"]
    assert main([*argv, "--json", str(out)]) == 3
    assert "result: INCONCLUSIVE" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["ok"] is False and data["verdict"] == "INCONCLUSIVE"
    assert data["bounds"]["max states"] == 3 and data["bounds"]["max depth"] is None


def test_a_passing_json_report_is_ok_with_numeric_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "pass.json"
    argv = ["check", "--machine", "docs_example:FixedOrderFlow", "--no-progress", "--max-depth"]
    assert main([*argv, "20", "--json", str(out)]) == 0
    assert "max depth 20" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["ok"] is True and data["verdict"] == "PASS"
    assert data["bounds"]["max depth"] == 20 and data["bounds"]["max states"] is None


class Ticker:
    """A model holding its machine whose data grows without end: ``tick`` adds 1."""

    limit: int | None = None

    def __init__(self) -> None:
        self.count = 0
        self.machine = Machine(
            model=self,
            states=["on", {"name": "off", "final": True}],
            initial="on",
            transitions=[
                {"trigger": "tick", "source": "on", "dest": "on", "conditions": "more",
                 "after": "add"},
                ["stop", "on", "off"],
            ],
            auto_transitions=False,
        )  # fmt: skip

    def more(self) -> bool:
        return self.limit is None or self.count < self.limit

    def add(self) -> None:
        self.count += 1


def test_max_seconds_ends_a_search_of_a_machine_without_end() -> None:
    start = time.perf_counter()
    report = check_machine(Ticker, max_seconds=1.0)
    assert time.perf_counter() - start < 2.0
    assert report.verdict == "INCONCLUSIVE" and report.stopped_by == ("max seconds",)
    assert report.bounds["max seconds"] == 1.0 and report.distinct_states > 10


def test_max_seconds_from_the_command_line_exits_3(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ticker_model", types.SimpleNamespace(Ticker=Ticker))
    argv = ["check", "--machine", "ticker_model:Ticker", "--max-seconds", "0.5", "--no-progress"]
    assert main(argv) == 3
    assert "NOT complete (max seconds hit)" in capsys.readouterr().out


def test_a_long_search_shows_progress_on_stderr(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "ticker_model", types.SimpleNamespace(Ticker=Ticker))
    assert main(["check", "--machine", "ticker_model:Ticker", "--max-seconds", "3"]) == 3
    captured = capsys.readouterr()
    assert re.search(r"check: depth \d+, [\d,]+ distinct states", captured.err)
    assert "check: depth" not in captured.out


def test_each_state_is_copied_not_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deep search applies each event once (a replay would apply the whole path again)."""
    applied = 0
    original = Ticker.add

    def counted(self: Ticker) -> None:
        nonlocal applied
        applied += 1
        original(self)

    monkeypatch.setattr(Ticker, "add", counted)
    monkeypatch.setattr(Ticker, "limit", 300)
    report = check_machine(Ticker)
    assert report.verdict == "PASS" and report.distinct_states == 2 * 301
    assert applied == 300  # replaying every path would be 300 * 301 / 2 = 45,150


class _NoCopy:
    """Data that refuses to be copied (as a handle would), equal to any other of its kind."""

    def __deepcopy__(self, memo: Any) -> Any:
        raise TypeError("cannot copy a handle")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _NoCopy)

    def __hash__(self) -> int:
        return 0


def test_a_model_that_cannot_be_copied_is_replayed() -> None:
    class Handle(Ticker):
        limit = 20

        def __init__(self) -> None:
            super().__init__()
            self.handle = _NoCopy()

    report = check_machine(Handle)
    assert report.verdict == "PASS" and report.distinct_states == 2 * 21


# -- path diagrams: marks where taken and terminal, the property drawn named -------------------


def test_a_path_ending_outside_a_final_state_has_no_terminal_mark() -> None:
    report = check_machine("docs_example:OrderFlow")
    trap = draw("docs_example:OrderFlow", path=report.result(NO_TRAP).counterexample)
    assert re.search(r"^\s*Class held s_final$", trap.mermaid(), re.M)  # held is not final
    held = re.search(r"^\theld \[(.*)\]$", trap.dot(), re.M)
    assert held is not None and "peripheries" not in held.group(1)
    steps = [["place", "cart", "placed"], ["pay", "placed", "paid"], ["ship", "paid", "shipped"]]
    delivered = draw("docs_example:OrderFlow", path=[*steps, ["deliver", "shipped", "delivered"]])
    assert re.search(r"^\s*Class delivered s_final_terminal$", delivered.mermaid(), re.M)
    node = re.search(r"^\tdelivered \[(.*)\]$", delivered.dot(), re.M)
    assert node is not None and "peripheries=2" in node.group(1)


TWO_FAILURES = {
    "states": ["a", "b", "z"],
    "initial": "a",
    "final": ["z"],
    # Both unguarded (overlapping guards), and b is a deadlock and a trap.
    "transitions": [["go", "a", "b"], ["go", "a", "z"]],
}


def test_several_failures_need_property_and_the_drawn_one_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "two_failures", types.SimpleNamespace(M=TWO_FAILURES))
    report = tmp_path / "r.json"
    assert main(["check", "--machine", "two_failures:M", "--no-progress", "--json", str(report)])
    capsys.readouterr()
    draw_it = ["diagram", "--machine", "two_failures:M", "--path", str(report)]
    assert main(draw_it) == 2
    err = capsys.readouterr().err
    assert "--property is needed: 3 properties failed with a counterexample" in err
    assert "('no deadlock', 'no overlapping guards', 'no trap')" in err
    assert len(err.strip().splitlines()) == 1
    assert main([*draw_it, "--property", "no trap"]) == 0
    assert "title: \"two_failures:M: counterexample to 'no trap'\"" in capsys.readouterr().out


@pytest.mark.parametrize("failed", [["x"], ["x", "y"]], ids=["one-failed", "two-failed"])
def test_a_transfer_machine_report_with_machine_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], failed: list[str]
) -> None:
    """Said first, before --property is asked for when several properties failed."""
    trace = {"paths": {"r1": [["cancel", "pending"]]}}
    report = tmp_path / "transfer.json"
    report.write_text(
        json.dumps(
            {
                "bounds": {"connectors": ["a"]},
                "properties": [{"name": name, "counterexample": trace} for name in failed],
            }
        )
    )
    argv = ["diagram", "--machine", "docs_example:OrderFlow", "--path", str(report)]
    assert main(argv) == 2
    assert "report of the transfer machine's check: draw it without --machine" in (
        capsys.readouterr().err
    )

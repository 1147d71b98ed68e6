"""Out of range is a ``ValueError``, everywhere: every public entry point beyond the aggregator's
own calls (those are ``tests/test_bad_inputs.py``'s table).

The rule (``multiconnector._validate``): an argument of the wrong type raises
:class:`InvalidArgumentError` (a ``TypeError``); one of the right type whose value is out of
range, empty, negative or not among the choices raises :class:`InvalidValueError` (a
``ValueError``, and still an ``InvalidArgumentError``). Each row is one entry point and one bad
value: the exact class, ``except ValueError`` (or not), the argument named, nothing changed.
"""

# ruff: noqa: E501  (CASES is a table: one row a line)

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from multiconnector import (
    ConnectorRegistry,
    DuplicateConnectorError,
    InvalidArgumentError,
    InvalidNameError,
    InvalidValueError,
    MultiConnector,
    SaveLedger,
)
from multiconnector._workload.config import SimulationConfig
from multiconnector.check import SearchConfig, check_aggregator
from multiconnector.diagram import find_path, render, steps
from multiconnector.usermachine import check_machine, draw
from multiconnector.usermachine.declaration import load
from tests.connectors import Scripted

MACHINE = {
    "states": ["a", "z"],
    "initial": "a",
    "final": ["z"],
    "transitions": [{"trigger": "go", "source": "a", "dest": "z"}],
}
GOOD_STEP = ["request_finished", "pending", "finished", None]


class Tokens(Scripted):
    """A connector whose ``get_num_new_matched_tokens`` answers ``answer``."""

    def __init__(self, answer: object) -> None:
        super().__init__()
        self.answer = answer

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> Any:
        return self.answer


def world() -> MultiConnector:
    mc = MultiConnector(ConnectorRegistry({"a": Scripted(), "b": Scripted()}))
    mc.begin("p")
    mc.begin("f")
    mc.request_finished("f")
    return mc


def snapshot(mc: MultiConnector) -> Any:
    records = {rid: attrs.asdict(mc.get(rid)) for rid in mc.request_ids()}  # type: ignore[arg-type]
    return repr(mc), records, mc.registry.items(), mc.counts(), mc.connector_counts()


def ledger() -> SaveLedger:
    books = SaveLedger(["a", "b"])
    books.expect({"r": ("a", "b")})
    return books


def ledger_state(books: SaveLedger) -> Any:
    return repr(books), books.held(), books.connector_counts()


Row = tuple[str, str, Callable[[MultiConnector, SaveLedger], object], type[Exception], str]
# (the entry point, the bad value, what runs, the error, the words naming the argument)
CASES: list[Row] = [
    # the aggregator's numbers, and a connector's answer
    ("MultiConnector()", "stripes=-1", lambda m, b: MultiConnector(stripes=-1), InvalidValueError, "stripes=-1"),
    ("MultiConnector()", "stripes=3.0", lambda m, b: MultiConnector(stripes=3.0), InvalidArgumentError, "stripes=3.0"),
    ("oldest()", "count=-1", lambda m, b: m.oldest(-1), InvalidValueError, "count=-1"),
    ("oldest()", "count='1'", lambda m, b: m.oldest("1"), InvalidArgumentError, "count='1'"),
    ("match_tokens()", "a connector's tokens=-1", lambda m, b: _tokens(-1), InvalidValueError, "tokens=-1"),
    ("match_tokens()", "a connector's tokens='1'", lambda m, b: _tokens("1"), InvalidArgumentError, "tokens='1'"),
    # SaveLedger
    ("SaveLedger()", "names=['a', 'a']", lambda m, b: SaveLedger(["a", "a"]), DuplicateConnectorError, "names='a'"),
    ("SaveLedger()", "names=['']", lambda m, b: SaveLedger([""]), InvalidNameError, "names=''"),
    ("SaveLedger()", "names='ab'", lambda m, b: SaveLedger("ab"), InvalidArgumentError, "names='ab'"),
    ("SaveLedger.expect()", "request id ''", lambda m, b: b.expect({"": ("a",)}), InvalidValueError, "savers=''"),
    ("SaveLedger.report()", "request_ids=['']", lambda m, b: b.report("a", [""], set()), InvalidValueError, "request_ids=''"),
    ("SaveLedger.report()", "request_ids=[3]", lambda m, b: b.report("a", [3], set()), InvalidArgumentError, "request_ids=3"),
    # SimulationConfig
    ("SimulationConfig()", "requests=0", lambda m, b: SimulationConfig(requests=0), InvalidValueError, "requests=0"),
    ("SimulationConfig()", "requests=1.0", lambda m, b: SimulationConfig(requests=1.0), InvalidArgumentError, "requests=1.0"),
    ("SimulationConfig()", "threads=0", lambda m, b: SimulationConfig(threads=0), InvalidValueError, "threads=0"),
    ("SimulationConfig()", "blocks=31", lambda m, b: SimulationConfig(blocks=31), InvalidValueError, "blocks=31"),
    ("SimulationConfig()", "stripes=6", lambda m, b: SimulationConfig(stripes=6), InvalidValueError, "stripes=6"),
    ("SimulationConfig()", "fault_rate=1.5", lambda m, b: SimulationConfig(fault_rate=1.5), InvalidValueError, "fault_rate=1.5"),
    ("SimulationConfig()", "fault_rate=nan", lambda m, b: SimulationConfig(fault_rate=float("nan")), InvalidValueError, "fault_rate=nan"),
    ("SimulationConfig()", "cancel_rate=-0.1", lambda m, b: SimulationConfig(cancel_rate=-0.1), InvalidValueError, "cancel_rate=-0.1"),
    ("SimulationConfig()", "cancel_rate='0.1'", lambda m, b: SimulationConfig(cancel_rate="0.1"), InvalidArgumentError, "cancel_rate='0.1'"),
    ("SimulationConfig()", "faults={'bogus'}", lambda m, b: SimulationConfig(faults={"bogus"}), InvalidValueError, "faults={'bogus'}"),
    ("SimulationConfig()", "faults={3}", lambda m, b: SimulationConfig(faults={3}), InvalidArgumentError, "faults={3}"),
    # check_aggregator
    ("check_aggregator()", "requests=0", lambda m, b: check_aggregator(requests=0), InvalidValueError, "requests=0"),
    ("check_aggregator()", "requests=7", lambda m, b: check_aggregator(requests=7), InvalidValueError, "requests=7"),
    ("check_aggregator()", "requests='2'", lambda m, b: check_aggregator(requests="2"), InvalidArgumentError, "requests='2'"),
    ("check_aggregator()", "max_states=0", lambda m, b: check_aggregator(max_states=0), InvalidValueError, "max_states=0"),
    ("check_aggregator()", "max_depth=-1", lambda m, b: check_aggregator(max_depth=-1), InvalidValueError, "max_depth=-1"),
    ("check_aggregator()", "max_seconds=0", lambda m, b: check_aggregator(max_seconds=0), InvalidValueError, "max_seconds=0"),
    ("check_aggregator()", "max_seconds=inf", lambda m, b: check_aggregator(max_seconds=float("inf")), InvalidValueError, "max_seconds=inf"),
    ("check_aggregator()", "max_seconds='1'", lambda m, b: check_aggregator(max_seconds="1"), InvalidArgumentError, "max_seconds='1'"),
    ("check_aggregator()", "connectors={}", lambda m, b: check_aggregator({}), InvalidValueError, "connectors={}"),
    ("check_aggregator()", "connectors={'a': 'bogus'}", lambda m, b: check_aggregator({"a": "bogus"}), InvalidValueError, "connectors['a']='bogus'"),
    ("check_aggregator()", "connectors={'a': 3}", lambda m, b: check_aggregator({"a": 3}), InvalidArgumentError, "connectors['a']=3"),
    ("check_aggregator()", "unknown=['a'] (a connector)", lambda m, b: check_aggregator({"a": "saver"}, unknown=["a"]), InvalidValueError, "unknown=['a']"),
    ("check_aggregator()", "events=['bogus']", lambda m, b: check_aggregator(events=["bogus"]), InvalidValueError, "events=['bogus']"),
    ("check_aggregator()", "early_reports='some'", lambda m, b: check_aggregator(early_reports="some"), InvalidValueError, "early_reports='some'"),
    ("check_aggregator()", "early_reports=None", lambda m, b: check_aggregator(early_reports=None), InvalidArgumentError, "early_reports=None"),
    # explore
    ("SearchConfig()", "max_states=0", lambda m, b: SearchConfig(max_states=0), InvalidValueError, "max_states=0"),
    ("SearchConfig()", "keep_models=0", lambda m, b: SearchConfig(keep_models=0), InvalidValueError, "keep_models=0"),
    ("SearchConfig()", "max_seconds=-1.0", lambda m, b: SearchConfig(max_seconds=-1.0), InvalidValueError, "max_seconds=-1.0"),
    ("SearchConfig()", "max_depth=1.5", lambda m, b: SearchConfig(max_depth=1.5), InvalidArgumentError, "max_depth=1.5"),
    # check_machine, load, draw
    ("check_machine()", "max_states=0", lambda m, b: check_machine(MACHINE, max_states=0), InvalidValueError, "max_states=0"),
    ("check_machine()", "max_depth=0", lambda m, b: check_machine(MACHINE, max_depth=0), InvalidValueError, "max_depth=0"),
    ("check_machine()", "max_seconds=0.0", lambda m, b: check_machine(MACHINE, max_seconds=0.0), InvalidValueError, "max_seconds=0.0"),
    ("check_machine()", "max_states='9'", lambda m, b: check_machine(MACHINE, max_states="9"), InvalidArgumentError, "max_states='9'"),
    ("check_machine()", "invariants={'': callable}", lambda m, b: check_machine(MACHINE, invariants={"": bool}), InvalidValueError, "invariants item ''"),
    ("check_machine()", "machine='nocolon'", lambda m, b: check_machine("nocolon"), InvalidValueError, "machine='nocolon'"),
    ("load()", "spec='no_such_module_x:M'", lambda m, b: load("no_such_module_x:M"), InvalidValueError, "spec='no_such_module_x:M'"),
    ("load()", "spec='json:NoSuch'", lambda m, b: load("json:NoSuch"), InvalidValueError, "spec='json:NoSuch'"),
    ("load()", "spec=3", lambda m, b: load(3), InvalidArgumentError, "spec=3"),  # type: ignore[arg-type]
    ("draw()", "state='q'", lambda m, b: draw(MACHINE, state="q"), InvalidValueError, "state='q'"),
    ("draw()", "path=[['go', 'z', 'a']]", lambda m, b: draw(MACHINE, path=[["go", "z", "a"]]), InvalidValueError, "path[0]"),
    ("Diagram.render()", "fmt='png'", lambda m, b: draw(MACHINE).render("png"), InvalidValueError, "fmt='png'"),
    ("Diagram.render()", "fmt=1", lambda m, b: draw(MACHINE).render(1), InvalidArgumentError, "fmt=1"),  # type: ignore[arg-type]
    # the transfer machine's diagram
    ("render()", "fmt='png'", lambda m, b: render("png"), InvalidValueError, "fmt='png'"),
    ("render()", "fmt=None", lambda m, b: render(None), InvalidArgumentError, "fmt=None"),  # type: ignore[arg-type]
    ("render()", "numbers=[0]", lambda m, b: render(path=[GOOD_STEP], numbers=[0]), InvalidValueError, "numbers=[0]"),
    ("render()", "numbers=['1']", lambda m, b: render(path=[GOOD_STEP], numbers=["1"]), InvalidArgumentError, "numbers=['1']"),  # type: ignore[list-item]
    ("steps()", "a state 'gone'", lambda m, b: steps([["cancel", "pending", "gone"]]), InvalidValueError, "path[0].dest='gone'"),
    ("steps()", "no such transition", lambda m, b: steps([["cancel", "pending", "finished"]]), InvalidValueError, "path[0]="),
    ("steps()", "a first step not from pending", lambda m, b: steps([["cancel", "finishing", "cancelled"]]), InvalidValueError, "path[0]="),
    ("find_path()", "request='r9' (no path)", lambda m, b: find_path({"r1": {"path": [GOOD_STEP]}}, "r9"), InvalidValueError, "request='r9'"),
    ("find_path()", "prop='bogus'", lambda m, b: find_path({"properties": []}, prop="bogus"), InvalidValueError, "prop='bogus'"),
]  # fmt: skip


def _tokens(answer: object) -> object:
    """match_tokens on an aggregator whose one connector answers ``answer`` (raised alone)."""
    mc = MultiConnector({"t": Tokens(answer)})
    mc.begin("r")
    try:
        return mc.match_tokens("r")
    except ExceptionGroup as group:  # a connector's failure comes in ConnectorFailures
        (error,) = group.exceptions
        raise error from None


@pytest.mark.parametrize(
    ("call", "error", "words"),
    [c[2:] for c in CASES],
    ids=[f"{c[0]} {c[1]}" for c in CASES],
)
def test_a_bad_value_raises_its_class_naming_it_and_changes_nothing(
    call: Callable[[MultiConnector, SaveLedger], object], error: type[Exception], words: str
) -> None:
    mc, books = world(), ledger()
    before, before_books = snapshot(mc), ledger_state(books)
    with pytest.raises(error) as info:
        call(mc, books)
    assert type(info.value) is error, repr(info.value)
    if issubclass(error, InvalidValueError) or error is DuplicateConnectorError:
        assert isinstance(info.value, ValueError)  # `except ValueError` catches it
    else:
        assert not isinstance(info.value, ValueError)  # a wrong type is no ValueError
        assert isinstance(info.value, TypeError)
    assert words in str(info.value), str(info.value)
    assert snapshot(mc) == before and ledger_state(books) == before_books


def test_every_invalid_value_error_is_still_an_invalid_argument_error() -> None:
    assert issubclass(InvalidValueError, InvalidArgumentError)
    assert issubclass(InvalidValueError, ValueError) and issubclass(InvalidValueError, TypeError)


# -- the command line's numbers --------------------------------------------------------------------


CLI_CASES = [
    ("check", "--requests", "0"),
    ("check", "--requests", "7"),
    ("check", "--max-states", "0"),
    ("check", "--max-depth", "-1"),
    ("check", "--max-seconds", "0"),
    ("check", "--max-seconds", "nan"),
    ("check", "--max-seconds", "inf"),
    ("simulate", "--requests", "0"),
    ("simulate", "--requests", "-5"),
    ("simulate", "--threads", "0"),
    ("simulate", "--blocks", "1"),
    ("simulate", "--stripes", "3"),
    ("simulate", "--fault-rate", "1.5"),
    ("simulate", "--fault-rate", "nan"),
    ("simulate", "--cancel-rate", "-0.1"),
    ("simulate", "--requests", "x"),
]


def test_a_bad_number_on_the_command_line_is_one_line_and_exit_2() -> None:
    # One interpreter for every row: each command parses its arguments before any work.
    script = (
        "import contextlib, io, sys\n"
        "from multiconnector.cli import main\n"
        f"for argv in {[[c, o, v] for c, o, v in CLI_CASES]!r}:\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        try:\n"
        "            status = main(argv)\n"
        "        except SystemExit as exc:\n"
        "            status = exc.code\n"
        "    print(repr((argv, status, err.getvalue())))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    results = [eval(line) for line in done.stdout.splitlines()]
    assert [argv for argv, _, _ in results] == [[c, o, v] for c, o, v in CLI_CASES]
    for argv, status, err in results:
        assert status == 2, (argv, status, err)
        assert err.count("\n") == 1 and err.startswith(f"multiconnector {argv[0]}: error: "), err
        assert err.endswith(" (see --help)\n"), err  # a usage error, as argparse's are
        assert "Traceback" not in err
        option = argv[1].removeprefix("--").replace("-", "_")
        assert argv[1] in err or f"{option}=" in err, err

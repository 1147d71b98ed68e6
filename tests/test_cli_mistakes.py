"""The command line's rule, for mistakes made in your own code and files and for odd
environments: a user mistake is one line on stderr naming the argument and exit status 2, never a
traceback. tests/test_cli.py holds the plain bad invocations.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: Enough address space for any legitimate small run; a command that tries to allocate
#: gigabytes (or thousands of thread stacks) fails fast instead of eating the machine.
SMALL_MEMORY = 1_000_000_000


def run(
    *argv: str,
    cwd: Path = ROOT,
    env: dict[str, str] | None = None,
    memory: int | None = None,
    timeout: float = 60,
    **kwargs: object,
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(env or {})}
    if "stdout" not in kwargs:
        kwargs["stdout"] = subprocess.PIPE
    kwargs.setdefault("stderr", subprocess.PIPE)
    preexec = None
    if memory is not None:
        resource = pytest.importorskip("resource")

        def preexec() -> None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    return subprocess.run(  # type: ignore[call-overload, no-any-return]  # noqa: PLW1510
        [sys.executable, "-m", "multiconnector", *argv],
        text=True,
        timeout=timeout,
        env=full_env,
        cwd=cwd,
        preexec_fn=preexec,
        **kwargs,
    )


def assert_usage_error(result: subprocess.CompletedProcess[str], argument: str) -> None:
    """Exit 2, one line on stderr naming ``argument``, no traceback."""
    shown = f"exit {result.returncode}, stderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr, shown
    assert result.returncode == 2, shown
    assert len(result.stderr.splitlines()) == 1, shown
    assert argument in result.stderr, shown


def assert_no_traceback(result: subprocess.CompletedProcess[str]) -> None:
    """An odd environment: no traceback and at most one line on stderr."""
    shown = f"exit {result.returncode}, stderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr, shown
    assert len(result.stderr.splitlines()) <= 1, shown


# -- your own machine: files that --machine, --model and --invariant import ----------------------

MACHINES = """
from transitions import Machine

DECL = {"states": ["a", "b"], "initial": "a", "final": ["b"], "transitions": [["go", "a", "b"]]}
GUARDED = {
    "states": ["a", "b"],
    "initial": "a",
    "final": ["b"],
    "transitions": [{"trigger": "go", "source": "a", "dest": "b", "conditions": "ok"}],
}
FINAL_LIST = {"states": ["a"], "initial": "a", "final": [["a"]]}
SOURCE_LIST = {"states": ["a", "b"], "initial": "a", "transitions": [["go", [["a"]], "b"]]}
DEST_LIST = {"states": ["a", "b"], "initial": "a", "transitions": [["go", "a", ["b"]]]}


def raising_factory():
    raise RuntimeError("boom")


class RaisingClass:
    def __init__(self):
        raise KeyError("k")


def raising_model():
    raise ValueError("model boom")


def none_model():
    return None


def int_model():
    return 5


class GuardRaises:
    def ok(self):
        raise RuntimeError("guard boom")


class NoGuard:
    pass
"""


@pytest.fixture
def machines(tmp_path: Path) -> Path:
    (tmp_path / "own_machines.py").write_text(MACHINES)
    (tmp_path / "exits_on_import.py").write_text("import sys\nsys.exit(3)\n")
    return tmp_path


@pytest.mark.parametrize("command", ["check", "diagram"])
@pytest.mark.parametrize("attr", ["raising_factory", "RaisingClass"])
def test_a_machine_factory_that_raises(machines: Path, command: str, attr: str) -> None:
    # Calling a machine class or factory runs your code: its exception is a bad --machine.
    result = run(command, "--machine", f"own_machines:{attr}", cwd=machines)
    assert_usage_error(result, "--machine")


@pytest.mark.parametrize("command", ["check", "diagram"])
@pytest.mark.parametrize("attr", ["FINAL_LIST", "SOURCE_LIST", "DEST_LIST"])
def test_a_declaration_with_a_list_where_a_state_name_goes(
    machines: Path, command: str, attr: str
) -> None:
    # A final, source or dest state must be a name: a list is one of the declaration's problems.
    result = run(command, "--machine", f"own_machines:{attr}", cwd=machines)
    assert_usage_error(result, "--machine")


@pytest.mark.parametrize("attr", ["raising_model", "none_model", "int_model"])
def test_a_model_factory_that_raises_or_makes_no_model(machines: Path, attr: str) -> None:
    # The factory runs when the search starts: what it raises, or a model it does not make, is a
    # bad --model.
    result = run(
        "check", "--no-progress", "--machine", "own_machines:DECL",
        "--model", f"own_machines:{attr}", cwd=machines,
    )  # fmt: skip
    assert_usage_error(result, "--model")


@pytest.mark.parametrize("attr", ["GuardRaises", "NoGuard"])
def test_a_guard_that_raises_or_is_missing_is_no_traceback(machines: Path, attr: str) -> None:
    # The guard is your code, as a transition's callback is: what it raises (an AttributeError
    # when it is missing) is a FAIL of "no exception", with its trace; "no deadlock" is not
    # blamed for a guard that could not answer.
    result = run(
        "check", "--no-progress", "--machine", "own_machines:GUARDED",
        "--model", f"own_machines:{attr}", cwd=machines,
    )  # fmt: skip
    assert result.returncode == 1 and result.stderr == "", result.stderr
    assert "FAIL  no exception" in result.stdout, result.stdout
    assert "PASS  no deadlock" in result.stdout, result.stdout


def test_a_machine_module_that_exits_while_imported(machines: Path) -> None:
    # A SystemExit while importing is a module that cannot be imported, not the command's exit
    # status (3 would read as INCONCLUSIVE).
    result = run("check", "--no-progress", "--machine", "exits_on_import:X", cwd=machines)
    assert_usage_error(result, "--machine")


@pytest.mark.parametrize(
    "option", [["--split"], ["--early-reports", "all"], ["--strict-coverage"], ["--no-reduction"]]
)
def test_a_transfer_machine_option_with_machine_is_refused(
    machines: Path, option: list[str]
) -> None:
    # The transfer machine's options mean nothing for your own machine: refused, not ignored.
    result = run("check", "--no-progress", "--machine", "own_machines:DECL", *option, cwd=machines)
    assert_usage_error(result, option[0])


# -- more than one line on stderr ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "argument"),
    [
        (["check", "--model", "x:y"], "--model"),
        (["check", "--free-guards"], "--free-guards"),
        (["check", "--invariant", "x:y"], "--invariant"),
        (["check", "--machine", "own_machines:DECL", "--requests", "3"], "--requests"),
        (["check", "--machine", "own_machines:DECL", "--load"], "--load"),
        (["diagram", "--state", "a"], "--state"),
        (["diagram", "--machine", "own_machines:DECL", "--request", "r1"], "--request"),
        (["diagram", "--machine", "own_machines:DECL", "--property", "p"], "--property"),
    ],
)
def test_a_conflict_is_one_line_not_the_usage_too(
    machines: Path, argv: list[str], argument: str
) -> None:
    # One line: the error, without the usage text before it.
    assert_usage_error(run(*argv, cwd=machines), argument)


def test_all_with_machine_is_one_line(machines: Path) -> None:
    result = run(
        "diagram", "--machine", "own_machines:DECL", "--all", str(machines / "out"),
        cwd=machines,
    )  # fmt: skip
    assert_usage_error(result, "--all")


# -- diagram --path -----------------------------------------------------------------------------


@pytest.mark.parametrize("machine", [[], ["--machine", "own_machines:DECL"]])
def test_a_path_nested_too_deep(machines: Path, machine: list[str]) -> None:
    # The JSON parser's RecursionError is a file that cannot be read.
    deep = machines / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    result = run("diagram", *machine, "--path", str(deep), cwd=machines)
    assert_usage_error(result, "--path")


def test_a_report_whose_properties_are_not_a_list(tmp_path: Path) -> None:
    # A report's "properties" must be a list.
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"properties": 5}))
    result = run("diagram", "--path", str(report), "--property", "p")
    assert_usage_error(result, "--path")


@pytest.mark.parametrize("machine", [[], ["--machine", "own_machines:DECL"]])
def test_path_from_a_closed_stdin(machines: Path, machine: list[str]) -> None:
    # Started with stdin closed, Python has no sys.stdin at all.
    script = (
        f"exec 0<&-; exec {sys.executable} -m multiconnector diagram "
        + " ".join(machine)
        + " --path -"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        ["sh", "-c", script], capture_output=True, text=True, env=env, cwd=machines,
        timeout=60, check=False,
    )  # fmt: skip
    assert_usage_error(result, "--path")


def test_an_undecodable_path_with_machine_names_path(machines: Path) -> None:
    # A file that is not UTF-8 is a bad --path, whatever --machine is.
    binary = machines / "binary.json"
    binary.write_bytes(b"\x00\xff\xfe\x01")
    result = run("diagram", "--machine", "own_machines:DECL", "--path", str(binary), cwd=machines)
    assert_usage_error(result, "--path")
    assert "--machine" not in result.stderr


@pytest.mark.parametrize("content", ["5", "null", "{}"])
def test_a_path_that_is_no_report_with_machine_names_path(machines: Path, content: str) -> None:
    # JSON that is neither a check report nor a list of steps: the message names --path.
    path = machines / "path.json"
    path.write_text(content)
    result = run("diagram", "--machine", "own_machines:DECL", "--path", str(path), cwd=machines)
    assert_usage_error(result, "--path")


@pytest.mark.skipif(shutil.which("dot") is None, reason="needs Graphviz's dot")
def test_an_svg_title_too_long_for_dot() -> None:
    # dot refuses a line of some 16,000 characters (and stops reading, a broken pipe): a title
    # is bounded before anything is drawn.
    result = run("diagram", "--format", "svg", "--title", "x" * 50_000)
    assert_usage_error(result, "--title")


# -- simulate: numbers too large ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("--requests", str(10**30)),  # more than the pool's bytearray can be
        ("--blocks", str(10**30)),
        ("--requests", str(10**11)),  # out of memory
        ("--blocks", str(10**10)),
        ("--threads", str(10**30)),  # one list per thread, forever
        ("--threads", "100000"),  # "can't start new thread"
        ("--requests", "10000001"),  # just above each bound
        ("--blocks", "1000001"),
        ("--threads", "257"),
    ],
)
def test_simulate_refuses_a_number_too_large(option: str, value: str) -> None:
    # SimulationConfig bounds them (MAX_REQUESTS, MAX_POOL_BLOCKS, MAX_THREADS) before the run.
    argv = ["simulate", "--requests", "5", "--progress", "none", option, value]
    result = run(*argv, memory=SMALL_MEMORY, timeout=60)
    assert_usage_error(result, option)


@pytest.mark.parametrize("count", [17, 60])
def test_check_refuses_too_many_connectors(count: int) -> None:
    # Every subset of the savers is a request_finished event (2**60 here), whatever
    # --max-states says: at most MAX_CONNECTORS (16) connectors.
    names = ",".join(f"c{i}" for i in range(count))
    argv = ["check", "--no-progress", "--requests", "1", "--max-states", "10"]
    result = run(*argv, "--connectors", names, memory=SMALL_MEMORY, timeout=60)
    assert_usage_error(result, "--connectors")


def test_check_takes_sixteen_connectors() -> None:
    names = ",".join(f"c{i}" for i in range(16))
    argv = ["check", "--no-progress", "--requests", "1", "--max-states", "10"]
    result = run(*argv, "--connectors", names, memory=SMALL_MEMORY, timeout=60)
    assert result.returncode == 3 and result.stderr == "", result.stderr  # INCONCLUSIVE


# -- duplicates -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "argument"),
    [
        (["check", "--no-progress", "--requests", "1", "--max-states", "5",
          "--events", "begin,begin"], "--events"),
        (["simulate", "--progress", "none", "--requests", "5", "--faults", "raise,raise"],
         "--faults"),
    ],
)  # fmt: skip
def test_a_kind_given_twice_is_refused_like_a_connector_given_twice(
    argv: list[str], argument: str
) -> None:
    # As --connectors a,a and --unknown x,x are.
    assert_usage_error(run(*argv), argument)


# -- odd environments -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv", [["--help"], ["--version"], ["check", "--help"], ["diagram"], ["demo"]]
)
def test_a_closed_stdout_is_refused(argv: list[str]) -> None:
    # Started with stdout closed, Python has no sys.stdout: nowhere to write, so the command is
    # refused (as `ls >&-` is), whatever it was.
    script = f"exec 1>&-; exec {sys.executable} -m multiconnector " + " ".join(argv)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        ["sh", "-c", script], stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
        timeout=60, check=False,
    )  # fmt: skip
    assert_usage_error(result, "standard output is closed")


@pytest.mark.parametrize(
    ("argv", "status", "escaped"),
    [
        (["diagram", "--format", "md"], 0, "\\u2014"),  # the table's em dash
        (["check", "--no-progress", "--requests", "1", "--max-states", "5", "--connectors", "é"],
         3, "\\xe9"),  # a connector's name in the report; INCONCLUSIVE (--max-states)
    ],
)  # fmt: skip
def test_an_ascii_stdout_gets_escapes(argv: list[str], status: int, escaped: str) -> None:
    # What stdout's encoding cannot write is written escaped, not raised.
    result = run(*argv, env={"PYTHONIOENCODING": "ascii"})
    assert_no_traceback(result)
    assert result.returncode == status, result.stderr
    assert escaped in result.stdout

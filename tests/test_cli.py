"""The command line never shows a traceback for a user mistake: one line on stderr, exit 2."""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import multiconnector
from multiconnector.cli import COMMANDS

ROOT = Path(__file__).resolve().parent.parent


def run(*argv: str, timeout: float = 60, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    if "stdout" not in kwargs:
        kwargs["capture_output"] = True
    return subprocess.run(  # type: ignore[call-overload, no-any-return]  # noqa: PLW1510
        [sys.executable, "-m", "multiconnector", *argv],
        text=True,
        timeout=timeout,
        env=env,
        cwd=ROOT,
        **kwargs,
    )


def bad_invocations(tmp: Path) -> list[list[str]]:
    existing = tmp / "existing.txt"
    existing.write_text("x")
    return [
        [],
        ["nope"],
        ["--nope"],
        ["check", "--events", ""],
        ["check", "--events", "begin,,take"],
        ["check", "--events", "begin,teleport"],
        ["check", "--connectors", "a="],
        ["check", "--connectors", "a b"],
        ["check", "--connectors", ""],
        ["check", "--connectors", "a,a"],
        ["check", "--connectors", "a=maybe"],
        ["check", "--connectors", "ghost", "--unknown", "ghost"],
        ["check", "--unknown", ""],
        ["check", "--requests", "0"],
        ["check", "--max-states", "x"],
        ["check", "--json", str(tmp)],
        ["check", "--json", str(tmp / "missing" / "report.json")],
        ["check", "--json", "/proc/report.json"],
        ["simulate", "--stripes", "1073741824"],
        ["simulate", "--stripes", "3"],
        ["simulate", "--requests", "-1"],
        ["simulate", "--requests", "0"],
        ["check", "--machine", "no_such_module:Machine"],
        ["check", "--machine", "json:nothing_here"],
        ["check", "--machine", "json:loads", "--max-seconds", "0"],
        ["simulate", "--fault-rate", "2"],
        ["simulate", "--faults", ""],
        ["simulate", "--faults", "raise,meteor"],
        ["simulate", "--json", str(tmp)],
        ["simulate", "--json", str(tmp / "missing" / "sim.json")],
        ["simulate", "--json", "/proc/sim.json"],
        ["diagram", "-o", str(tmp)],
        ["diagram", "-o", str(tmp / "missing" / "m.mmd")],
        ["diagram", "-o", "/proc/m.mmd"],
        ["diagram", "--all", str(existing)],
        ["diagram", "--all", str(tmp / "missing" / "deeper")],
        ["diagram", "--format", "png"],
        ["diagram", "--request", "r1"],
        ["diagram", "--path", str(tmp / "nothing.json")],
        ["demo", "--nope"],
    ]


@pytest.mark.timeout(120)  # about 40 commands, a second each on a busy 2-core machine
def test_every_bad_invocation_is_one_line_on_stderr_and_exit_2(tmp_path: Path) -> None:
    failures = []
    for argv in bad_invocations(tmp_path):
        result = run(*argv)
        lines = result.stderr.splitlines()
        if result.returncode != 2 or len(lines) != 1 or "Traceback" in result.stderr:
            failures.append((argv, result.returncode, result.stderr))
    assert not failures, "\n".join(map(repr, failures))
    assert not (tmp_path / "missing").exists()  # no folder was made on the way


def test_an_unwritable_output_fails_before_the_work_starts(tmp_path: Path) -> None:
    start = time.perf_counter()  # a billion requests would run for hours
    result = run("simulate", "--requests", "1000000000", "--json", str(tmp_path))
    assert result.returncode == 2 and time.perf_counter() - start < 30
    assert "--json" in result.stderr and "is a directory" in result.stderr


def test_version() -> None:
    result = run("--version")
    assert (
        result.returncode == 0 and result.stdout == f"multiconnector {multiconnector.__version__}\n"
    )


def test_a_closed_pipe_ends_quietly() -> None:
    read, write = os.pipe()
    os.close(read)  # nobody will ever read: the first write fails
    try:
        result = run("--help", stdout=write, stderr=subprocess.PIPE)
    finally:
        os.close(write)
    assert result.stderr == ""
    assert result.returncode in (0, 141)


def test_the_help_pipe_into_head_is_quiet() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        f"{sys.executable} -m multiconnector check --help | head -1",
        shell=True,
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert result.stdout.startswith("usage: multiconnector check") and result.stderr == ""


def test_the_writable_outputs_still_work(tmp_path: Path) -> None:
    out = tmp_path / "m.mmd"
    assert run("diagram", "-o", str(out)).returncode == 0 and out.read_text()
    assert run("diagram", "--all", str(tmp_path / "new")).returncode == 0
    assert sorted(p.name for p in (tmp_path / "new").iterdir())


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_has_plain_help(command: str) -> None:
    module = importlib.import_module(COMMANDS[command][0])
    parser: argparse.ArgumentParser = module._parser()
    for action in parser._actions:
        assert action.help, f"{command} {action.option_strings} has no help"
    text = parser.format_help()
    for markup in ("``", ":class:", ":func:", ":data:", ":mod:"):
        assert markup not in text, f"{command} --help shows {markup!r}"


def test_the_vllm_adapter_without_the_extra_says_how_to_install_it() -> None:
    code = "import sys; sys.modules['msgspec'] = None; import multiconnector.vllm"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 1
    assert "multiconnector[vllm]" in result.stderr.splitlines()[-1]


def test_the_demo_finishes_clean() -> None:
    result = run("demo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.rstrip().endswith("held requests left: 0")
    assert result.stderr == ""

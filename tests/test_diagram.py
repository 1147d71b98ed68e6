"""Diagrams drawn from the one declaration: every format, a request's path, the command."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from multiconnector import ConnectorRegistry, InvalidArgumentError, MultiConnector, State, Step
from multiconnector.cli import main
from multiconnector.diagram import FORMATS, GENERATED, find_path, read_path, render, run_cli, steps
from multiconnector.machine import TERMINAL, TRANSITIONS
from tests.connectors import Scripted

SVG = "{http://www.w3.org/2000/svg}"
HAS_DOT = shutil.which("dot") is not None
needs_dot = pytest.mark.skipif(not HAS_DOT, reason="Graphviz's dot is not installed")


def declared() -> list[tuple[str, str, str, list[str], list[str]]]:
    """(source, event, dest, conditions, unless), read straight from TRANSITIONS."""
    rows = []
    for t in TRANSITIONS:
        sources = [t["source"]] if isinstance(t["source"], str) else list(t["source"])
        for source in sources:
            dest = source if t["dest"] == "=" else t["dest"]
            conds, unless = (
                [g] if isinstance(g, str) else list(g or [])
                for g in (t.get("conditions"), t.get("unless"))
            )
            rows.append((source, t["trigger"], dest, conds, unless))
    return rows


def traced(script: str) -> list[Step]:
    """The history of request r1 after ``script``: s = request_finished, a/b = reports, ..."""
    registry = ConnectorRegistry({"a": Scripted(), "b": Scripted()})
    mc = MultiConnector(registry, trace=True)
    mc.begin("r1")
    for op in script.split():
        if op == "s":
            mc.request_finished("r1", [0])
        elif op == "x":
            mc.cancel("r1")
        elif op.startswith("-"):
            mc.unregister(op[1:])
        else:
            mc.transfer_finished("r1", op)
    record = mc.get("r1")
    assert record is not None and record.history is not None
    return record.history


# -- the machine ---------------------------------------------------------------------------------


def test_mermaid_has_every_state_and_declared_transition() -> None:
    text = render("mermaid")
    lines = [line.strip() for line in text.splitlines()]
    assert lines[:4] == ["---", 'title: "request transfer"', "---", "stateDiagram-v2"]
    for state in State:
        assert f'state "{state.value}" as {state.value}' in lines
    edges = {}
    for line in lines:
        m = re.fullmatch(r"(\w+) --> (\w+): (.*)", line)
        if m:
            edges[m[1], m[2]] = m[3].split(" | ")
    for source, event, dest, conds, unless in declared():
        guard = " & ".join(conds + [f"!{u}" for u in unless])
        label = f"{event} [{guard}]" if guard else event
        assert label in edges[source, dest], (source, event, dest)
    assert sum(len(v) for v in edges.values()) == len(declared())  # nothing drawn by hand
    assert "[*] --> pending" in lines
    for state in TERMINAL:  # terminal states styled as such, none highlighted
        assert f"Class {state.value} s_terminal" in lines
    assert "s_final" not in "".join(line for line in lines if line.startswith("Class"))


def test_dot_has_every_declared_transition() -> None:
    text = render("dot")
    assert text.startswith('digraph "request transfer" {')
    edges = {
        (m[1], m[2]): m[3] or m[4]
        for m in re.finditer(r'^\t(\w+) -> (\w+) \[label=(?:"([^"]*)"|(\w+))', text, re.M)
    }
    for source, event, dest, _, _ in declared():
        assert event in edges[source, dest]
    assert len(edges) == len({(s, d) for s, _, d, _, _ in declared()})
    assert re.search(r"^\t__initial__ -> pending$", text, re.M)


def test_markdown_table_is_the_declaration() -> None:
    text = render("md")
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \| (.*?) \| `(\w+)`( \(stays\))? \|$", text, re.M)
    expected = []
    for source, event, dest, conds, unless in declared():
        guard = " and ".join([f"`{c}`" for c in conds] + [f"not `{u}`" for u in unless]) or "—"
        expected.append((source, event, guard, dest, " (stays)" if dest == source else ""))
    assert sorted(rows) == sorted(expected)
    assert "| `finished` | any | — | terminal: the event is ignored |" in text
    assert "| `cancelled` | any other | — | terminal: the event is ignored |" in text  # drains
    assert "```mermaid\n" + render("mermaid") + "```\n" in text
    assert "- `has_savers`: Some connector said it saves asynchronously." in text


@needs_dot
def test_svg_shows_all_four_states() -> None:
    root = ET.fromstring(render("svg"))
    nodes = {
        g.findtext(f"{SVG}title"): "".join(t.text or "" for t in g.iter(f"{SVG}text"))
        for g in root.iter(f"{SVG}g")
        if g.get("class") == "node"
    }
    for state in State:
        assert nodes[state.value] == state.value
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "request_finished [has_savers]" in texts


@pytest.mark.parametrize("fmt", FORMATS)
def test_output_is_byte_identical_across_processes(fmt: str) -> None:
    if fmt == "svg" and not HAS_DOT:
        pytest.skip("Graphviz's dot is not installed")
    history = json.dumps(traced("s a b"))
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-m", "multiconnector", "diagram", "--format", fmt, "--path", "-"],
            input=history,
            capture_output=True,
            text=True,
            env=env,
            check=True,
        )
        outputs.add(done.stdout)
    assert outputs == {render(fmt, path=json.loads(history))}


# -- a request's path ----------------------------------------------------------------------------


def classes(mermaid: str) -> dict[str, str]:
    return dict(re.findall(r"^\s*Class (\w+) s_(\w+)$", mermaid, re.M))


def test_traced_history_is_marked_on_mermaid() -> None:
    history = traced("s a -b")  # request_finished, a reports, b unregistered: finished
    assert [(s.event, s.dest) for s in history] == [
        ("request_finished", State.finishing),
        ("transfer_finished", State.finishing),
        ("connector_gone", State.finished),
    ]
    text = render("mermaid", path=history, request="r1")
    assert 'title: "request transfer: path of r1"' in text
    assert classes(text) == {
        "pending": "visited",
        "finishing": "visited",
        "finished": "final_terminal",
        "cancelled": "terminal",
    }
    assert "pending --> finishing: request_finished [has_savers] (step 1)" in text
    assert "transfer_finished [!is_last] (step 2) | connector_gone [!is_last]\n" in text
    assert "transfer_finished [is_last] | connector_gone [is_last] (step 3)" in text


def test_repeated_transitions_list_every_step_number() -> None:
    registry = ConnectorRegistry({n: Scripted() for n in "abc"})
    mc = MultiConnector(registry, trace=True)
    mc.begin("r")
    mc.request_finished("r")
    for name in "abc":
        mc.transfer_finished("r", name)
    (record,) = mc.take()
    text = render("mermaid", path=record.history)
    assert "transfer_finished [!is_last] (steps 2, 3)" in text
    assert "(step 4)" in text


def test_cancelled_path_highlights_cancelled() -> None:
    text = render("dot", path=traced("x"))
    assert re.search(r'^\tcancelled \[.*fillcolor="#fde68a".*peripheries=2', text, re.M)
    assert re.search(r'^\tpending \[.*fillcolor="#dbeafe"', text, re.M)
    assert re.search(r'^\tfinishing \[label="finishing\\l"\]$', text, re.M)  # not visited
    assert re.search(
        r'^\tpending -> cancelled \[label="cancel \(step 1\)" color="#1d4ed8"', text, re.M
    )
    assert re.search(
        r"^\tpending -> finishing \[label=\"request_finished \[has_savers\]\"\]$", text, re.M
    )


def test_empty_path_ends_where_it_began() -> None:
    assert classes(render("mermaid", path=[]))["pending"] == "final"


def _node(dot: str, state: str) -> str:
    found = re.search(rf"^\t{state} \[(.*)\]$", dot, re.M)
    assert found is not None, dot
    return found.group(1)


def test_the_last_state_has_the_terminal_mark_only_when_terminal() -> None:
    """A path ending in ``finishing`` ends amber with a single border; one in ``finished``
    (terminal) keeps its double border, amber too."""
    unfinished = traced("s a")  # request_finished, a reports: b still owes its report
    assert unfinished[-1].dest is State.finishing
    assert classes(render("mermaid", path=unfinished))["finishing"] == "final"
    assert "s_final fill:#fde68a,color:#78350f,stroke:#b45309\n" in render("mermaid")
    node = _node(render("dot", path=unfinished), "finishing")
    assert 'fillcolor="#fde68a"' in node and "peripheries" not in node
    finished = traced("s a b")
    assert classes(render("mermaid", path=finished))["finished"] == "final_terminal"
    assert "peripheries=2" in _node(render("dot", path=finished), "finished")


def test_a_merged_edge_is_coloured_only_for_the_events_taken() -> None:
    """``transfer_finished [!is_last]`` and ``connector_gone [!is_last]`` share an edge; a path
    taking the first colours it alone, on an edge of its own."""
    dot = render("dot", path=traced("s a"))
    edges = re.findall(r"^\tfinishing -> finishing \[(.*)\]$", dot, re.M)
    assert edges == [
        'label="transfer_finished [!is_last] (step 2)" color="#1d4ed8" fontcolor="#1d4ed8" '
        "penwidth=2.5",
        'label="connector_gone [!is_last]"',
    ]
    # Without a path, the edges are merged as transitions draws them.
    plain = re.findall(r"^\tfinishing -> finishing \[(.*)\]$", render("dot"), re.M)
    assert plain == ['label="transfer_finished [!is_last] | connector_gone [!is_last]"']


@needs_dot
def test_svg_path_colours_visited_states_and_edges() -> None:
    root = ET.fromstring(render("svg", path=traced("s a b")))
    fills: dict[str, str | None] = {}
    strokes: dict[str, list[str | None]] = {}  # an edge's events taken and not: two edges
    for g in root.iter(f"{SVG}g"):
        title = g.findtext(f"{SVG}title") or ""
        shape = g.find(f"{SVG}path")
        if g.get("class") == "node" and shape is not None:
            fills[title] = shape.get("fill")
        elif g.get("class") == "edge" and shape is not None:
            strokes.setdefault(title.replace("&#45;&gt;", "->"), []).append(shape.get("stroke"))
    assert fills == {
        "pending": "#dbeafe",
        "finishing": "#dbeafe",
        "finished": "#fde68a",
        "cancelled": "white",
    }
    assert strokes["pending->finishing"] == ["#1d4ed8"]
    assert strokes["finishing->finished"] == ["#1d4ed8", "black"]  # connector_gone not taken
    assert strokes["finishing->finishing"] == ["#1d4ed8", "black"]
    assert strokes["pending->cancelled"] == strokes["pending->finished"] == ["black"]


def test_path_markdown_lists_steps_with_connectors() -> None:
    text = render("md", path=traced("s a b"), request="r|1")
    assert text.startswith("# The path of request `r\\|1`\n")
    assert "| 2 | `transfer_finished` | `finishing` | `finishing` | `a` |" in text
    assert "| 3 | `transfer_finished` | `finishing` | `finished` | `b` |" in text


@pytest.mark.parametrize(
    ("path", "match"),
    [
        ([["request_finished", "pending", "finished", None], ["cancel", "finished", "cancelled"]],
         r"path\[1\]=.*no 'cancel' leads from 'finished' to 'cancelled'"),
        ([["transfer_finished", "finishing", "finished", "a"]],
         r"path\[0\]=.* must start in 'pending', where every request starts"),
        ([["request_finished", "pending", "finishing", None],
          ["cancel", "pending", "cancelled", None]],
         r"path\[1\]=.* must start in 'finishing', where the previous step ended"),
        ([["cancel", "pending", "done", None]], r"path\[0\]\.dest='done' must be one of"),
        ([["cancel", "pending"]], r"path\[0\]=\['cancel', 'pending'\] .* must be a Step"),
        ([{"event": "cancel", "source": "pending"}], r"path\[0\]=.*'dest' is missing"),
        ([["cancel", "pending", "cancelled", 3]], r"path\[0\]\.name=3 \(type int\) must be"),
        ([[1, "pending", "cancelled", None]], r"path\[0\]\.event=1 \(type int\) must be a str"),
        ("cancel", r"path='cancel' \(type str\) must be an iterable of steps"),
        (None, None),
    ],
)  # fmt: skip
def test_bad_paths_are_rejected_naming_the_step(path: Any, match: str | None) -> None:
    if match is None:
        assert steps([]) == ()
        return
    with pytest.raises(InvalidArgumentError, match=match):
        render("mermaid", path=path)


def test_steps_accept_records_lists_and_mappings() -> None:
    as_step = Step("cancel", State.pending, State.cancelled, None)
    for item in (
        as_step,
        ["cancel", "pending", "cancelled"],
        {"event": "cancel", "source": "pending", "dest": "cancelled"},
    ):
        assert steps([item]) == (as_step,)


def test_bad_render_arguments() -> None:
    with pytest.raises(InvalidArgumentError, match=r"fmt='png' \(type str\) must be one of"):
        render("png")
    with pytest.raises(InvalidArgumentError, match=r"title=1 \(type int\)"):
        render("mermaid", title=1)  # type: ignore[arg-type]


# -- finding a path in JSON ----------------------------------------------------------------------

ONE = [["cancel", "pending", "cancelled", None]]
TWO = [["request_finished", "pending", "finished", None]]


def test_find_path_in_plain_lists_and_reports() -> None:
    assert find_path(ONE) == (None, steps(ONE))
    report = {
        "properties": [
            {"name": "p", "counterexample": {"requests": [{"request_id": "r0", "path": ONE}]}},
            {"name": "q", "counterexample": {"paths": {"r1": TWO}}},
        ]
    }
    assert find_path(report, "r1") == ("r1", steps(TWO))
    assert find_path(report, "r0") == ("r0", steps(ONE))
    with pytest.raises(InvalidArgumentError, match=r"request=None is ambiguous: .*\['r0', 'r1'\]"):
        find_path(report)
    with pytest.raises(InvalidArgumentError, match=r"request='r9' must be one of .*\['r0', 'r1'\]"):
        find_path(report, "r9")
    assert find_path(report, "r1", prop="q") == ("r1", steps(TWO))
    with pytest.raises(InvalidArgumentError, match=r"request='r1' must be one of .*\['r0'\]"):
        find_path(report, "r1", prop="p")
    with pytest.raises(InvalidArgumentError, match=r"prop='z' must name a .*\['p', 'q'\]"):
        find_path(report, prop="z")
    assert find_path({"x": {"path": ONE}}) == ("x", steps(ONE))
    with pytest.raises(InvalidArgumentError, match=r"data=\{'ok': True\} .* must be a list"):
        find_path({"ok": True})
    with pytest.raises(InvalidArgumentError, match="the data is a single path"):
        find_path(ONE, "r1")


def test_read_path_from_a_traced_history_file(tmp_path: Path) -> None:
    file = tmp_path / "history.json"
    file.write_text(json.dumps(traced("s b a")))
    request, path = read_path(file)
    assert request is None and path == tuple(traced("s b a"))


# -- the command ---------------------------------------------------------------------------------


def test_cli_writes_every_format(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diagram"]) == 0
    assert capsys.readouterr().out == render("mermaid")
    for fmt in FORMATS:
        if fmt == "svg" and not HAS_DOT:
            continue
        out = tmp_path / f"m.{fmt}"
        assert run_cli(["--format", fmt, "-o", str(out)]) == 0
        assert out.read_text(encoding="utf-8") == render(fmt)


def test_cli_all_writes_the_committed_set(tmp_path: Path) -> None:
    if not HAS_DOT:
        pytest.skip("Graphviz's dot is not installed")
    assert run_cli(["--all", str(tmp_path / "gen")]) == 0
    written = {p.name: p.read_text(encoding="utf-8") for p in (tmp_path / "gen").iterdir()}
    assert written == {name: render(fmt) for name, fmt in GENERATED.items()}


def test_cli_draws_a_path_from_a_check_report(tmp_path: Path) -> None:
    report = tmp_path / "check.json"
    report.write_text(json.dumps({"counterexample": {"paths": {"r0": ONE, "r1": TWO}}}))
    out = tmp_path / "path.md"
    assert (
        run_cli(["--format", "md", "--path", str(report), "--request", "r1", "-o", str(out)]) == 0
    )
    assert out.read_text() == render("md", path=TWO, request="r1")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--format", "png"], "invalid choice: 'png'"),
        (["--request", "r1"], "--request and --property need --path"),
        (["--property", "p"], "--request and --property need --path"),
        (["--path", "AMBIGUOUS", "--property", "p"], r"prop='p' must name a property .*\[\]"),
        (["--all", "x", "-o", "y"], "not allowed with argument"),
        (["--all", "x", "--path", "p"], "--all draws the machine only"),
        (["--path", "/nonexistent/p.json"], "No such file"),
        (["--path", "BAD"], "Expecting property name"),
        (["--path", "AMBIGUOUS"], "request=None is ambiguous"),
        (["--path", "WRONG"], r"no 'cancel' leads from 'finished'"),
        (["--bogus"], "unrecognized arguments"),
    ],
)
def test_cli_bad_arguments_exit_2(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = {
        "BAD": "{not json",
        "AMBIGUOUS": json.dumps({"paths": {"a": ONE, "b": TWO}}),
        "WRONG": json.dumps([*TWO, ["cancel", "finished", "cancelled", None]]),
    }
    for key, content in files.items():
        if key in argv:
            (tmp_path / key).write_text(content)
            argv = [str(tmp_path / key) if a == key else a for a in argv]
    assert run_cli(argv) == 2
    assert re.search(message, capsys.readouterr().err)


def test_cli_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--help"]) == 0
    assert "--format {mermaid,dot,svg,md}" in capsys.readouterr().out


def test_svg_without_dot_fails_with_a_hint(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": str(tmp_path)}  # no `dot` there
    done = subprocess.run(
        [sys.executable, "-m", "multiconnector", "diagram", "--format", "svg"],
        check=False,
        capture_output=True,
        text=True,
        env=env,
    )
    assert done.returncode == 2  # what to install: one line, as a usage error
    assert "apt-get install graphviz" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert done.stdout == ""


#: Runs its argv through ``multiconnector.cli.main`` with the ``graphviz`` package hidden (as
#: without the ``diagrams`` extra), in the repository's root (docs/ importable).
_NO_GRAPHVIZ = (
    "import sys; sys.modules['graphviz'] = None; sys.path.insert(0, 'docs')\n"
    "from multiconnector.cli import main\n"
    "raise SystemExit(main(sys.argv[1:]))\n"
)
ROOT = Path(__file__).resolve().parent.parent


def _without_graphviz(
    *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", _NO_GRAPHVIZ, *argv],
        check=False,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )


@pytest.mark.parametrize("machine", [(), ("--machine", "docs_example:OrderFlow")])
def test_dot_without_the_graphviz_package_is_the_same_text(
    machine: tuple[str, ...], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    done = _without_graphviz("diagram", *machine, "--format", "dot")
    assert done.returncode == 0, done.stderr
    monkeypatch.syspath_prepend(str(ROOT / "docs"))
    assert main(["diagram", *machine, "--format", "dot"]) == 0  # with the package, here
    assert done.stdout == capsys.readouterr().out
    assert done.stdout.startswith("digraph ") and "->" in done.stdout


@needs_dot
def test_svg_without_the_graphviz_package_needs_only_dot() -> None:
    done = _without_graphviz("diagram", "--format", "svg")
    assert done.returncode == 0, done.stderr
    assert ET.fromstring(done.stdout).tag == f"{SVG}svg"


def test_all_without_dot_writes_nothing(tmp_path: Path) -> None:
    out = tmp_path / "generated"
    env = {**os.environ, "PATH": str(tmp_path)}  # no `dot` there: svg fails
    done = _without_graphviz("diagram", "--all", str(out), env=env)
    assert done.returncode == 2
    assert "apt-get install graphviz" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in out.iterdir()) == []  # no partial set left behind


def test_a_passing_report_has_no_counterexample_to_draw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "check.json"
    assert main(["check", "--requests", "1", "--no-progress", "--json", str(report)]) == 0
    capsys.readouterr()
    for narrowing in ([], ["--property", "no early free"]):
        assert main(["diagram", "--path", str(report), *narrowing]) == 2
        err = capsys.readouterr().err
        assert "no counterexample" in err and "data=" not in err
        assert len(err.strip().splitlines()) == 1


def test_the_generated_markdown_names_the_command_not_a_make_target() -> None:
    text = render("md")
    assert "make " not in text
    assert "`multiconnector diagram --format md`" in text


def test_graphviz_is_present_where_it_is_required() -> None:
    """CI sets MULTICONNECTOR_REQUIRE_DOT=1: there the SVG tests must run, never skip."""
    if os.environ.get("MULTICONNECTOR_REQUIRE_DOT") != "1":
        pytest.skip("Graphviz is optional here (MULTICONNECTOR_REQUIRE_DOT is not set)")
    assert HAS_DOT, "Graphviz's dot is missing: `make system` installs it"


# -- which counterexample a report's path is drawn from ------------------------------------------


def _report(*names: str) -> dict[str, object]:
    """A check report whose properties ``names`` failed, each with a counterexample for r1."""
    return {
        "title": "multiconnector check: the transfer machine",
        "bounds": {"connectors": ["a", "b"]},
        "properties": [
            {"name": "passing", "result": "PASS", "counterexample": None},
            *(
                {"name": n, "result": "FAIL", "counterexample": {"paths": {"r1": path}}}
                for n, path in zip(names, (ONE, TWO), strict=False)
            ),
        ],
    }


def test_several_failures_need_property_and_the_title_names_the_one_drawn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "check.json"
    report.write_text(json.dumps(_report("no early free", "no leak")))
    assert run_cli(["--path", str(report)]) == 2
    err = capsys.readouterr().err
    assert "--property is needed: 2 properties failed" in err
    assert "'no early free', 'no leak'" in err and len(err.strip().splitlines()) == 1
    assert run_cli(["--path", str(report), "--property", "no leak"]) == 0
    out = capsys.readouterr().out
    assert "title: \"request transfer: path of r1, counterexample to 'no leak'\"" in out
    assert "pending --> finished: request_finished [!has_savers] (step 1)" in out
    report.write_text(json.dumps(_report("no leak")))  # one: drawn, and named
    assert run_cli(["--path", str(report)]) == 0
    assert "counterexample to 'no leak'" in capsys.readouterr().out


def test_a_report_of_your_own_machine_says_machine_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "docs"))
    report = tmp_path / "order.json"
    argv = ["check", "--machine", "docs_example:OrderFlow", "--no-progress", "--json"]
    assert main([*argv, str(report)]) == 1
    capsys.readouterr()
    for narrowing in ([], ["--property", "no trap"]):
        assert main(["diagram", "--path", str(report), *narrowing]) == 2
        err = capsys.readouterr().err
        assert "--machine is missing" in err and "--machine docs_example:OrderFlow" in err
        assert "no counterexample" not in err and len(err.strip().splitlines()) == 1

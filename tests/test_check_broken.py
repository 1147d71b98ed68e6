"""The checker must be able to fail: every planted bug is caught, with a shortest trace.

The catalog is ``tests/broken_aggregators.py``. Each bug is checked in a small complete bound
(savers ``a`` and ``b``, a ``None`` slot, the unknown name ``ghost``, one request, every event of
the default alphabet, plus the load events for the load bugs), in which the real aggregator passes
every property.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest

from multiconnector import MultiConnector, State
from multiconnector import check as check_module
from multiconnector import machine as machine_module
from multiconnector.check import (
    ALPHABET,
    LOAD_EVENTS,
    TOLD_EVENTS,
    check_aggregator,
    declared_transitions,
)
from multiconnector.check import run as run_module
from multiconnector.diagram import find_path
from multiconnector.diagram import run_cli as diagram_cli
from multiconnector.machine import build_machine
from tests import broken_aggregators as broken_module
from tests.broken_aggregators import CATALOG, Broken
from tests.checked import BOUND, bugs, checked, checked_bug, is_load, is_slow_load

pytestmark = pytest.mark.timeout(120)  # model-check bounds: longer than the default time limit

DECLARED = {(e, src, dst) for src, e, dst in declared_transitions(build_machine())[1]}

#: The property each planted bug breaks, and the length of its known shortest counterexample.
#: A request_finished is two events: it asks, then applies its answers; a request_finished_by
#: (told, in the default alphabet) is one: where it exposes the bug, the trace is one shorter.
KNOWN: dict[str, tuple[str, int]] = {
    "count-based draining": ("no early free", 4),  # begin, told a+b save, a reports twice
    "late completion after cancel accepted": ("terminal absorbing", 4),  # told a, cancel, a
    # begin, request_finished asks (a saves), cancel, request_finished applies: a is dropped
    "savers answering after a concurrent cancel dropped": ("no early free", 4),
    # begin, told a saves, cancel: queued for take while a saves
    "draining cancelled request handed back": ("no early free", 3),
    # begin, request_finished asks (g answers a bare True) and applies: finished while g saves
    # (checked with connectors a and g only)
    "bare True treated as no promise": ("no early free", 3),
    "None slot dereferenced": ("no exception", 2),  # begin, a report from the None slot
    "finished request never dropped": ("no leak", 3),  # begin, cancel, take
    "terminal state left again": ("terminal absorbing", 3),  # begin, told nobody, cancel
    "phantom report accepted": ("no early free", 3),  # begin, told a saves, b reports
    "last report does not finish": ("no trap", 3),  # begin, told a saves, a reports
    # begin, match_tokens choosing a (asks, records), a reports its load twice
    "duplicate load completion accepted": ("load once", 5),
    # begin, match_tokens choosing a (asks, records), b reports a load
    "load completion from an unchosen connector accepted": ("load once", 4),
    # begin, match_tokens choosing a (asks, records), unregister a, a reports its load
    "load completion from an unregistered loader accepted": ("load once", 5),
    # params (checked with params=True and savers a and b only): begin, request_finished asks
    # (a and b answer the shared key), applies it: no clash raised
    "params clash merged by overwriting": ("params merged", 3),
    # begin, request_finished asks with a and b answering params: a's changed, or raised
    "params input mutated": ("params merged", 2),
    "params clash raised before the savers are recorded": ("params merged", 2),
    # begin, request_finished asks (a and b answer the shared key equal), applies it
    "params allow_equal inverted": ("params merged", 3),
    "params duplicate key untested in the inlined merge": ("params merged", 3),
    # begin, told a and b and every name that cannot report (none abandoned), none reports
    "ignored report's outcome misclassified": ("right outcome", 3),
    # begin, told a saves, cancel, a reports (drained)
    "drained report counted as applied": ("counters", 4),
    # a reports for a request not begun
    "on_finished called for an ignored report": ("callbacks", 1),
    # begin, told a and b save, a reports r1 twice in one batch
    "batch applies a duplicate twice": ("right outcome", 3),
    # begin, request_finished asks (a saves), a reports before the answers are recorded
    "early report dropped as a phantom": ("right outcome", 3),
    # begin, match_tokens asks (a answers 1), a reports its load before the loader is recorded
    "early load report dropped as a phantom": ("right outcome", 3),
    # the told path: begin, request_finished asks (a saves), request_finished_by(r1, []) applies
    "told path takes no claim": ("no early free", 3),
    # (checked with one counted connector alone) begin, choose_loader(r1, c@1, parts=[c@2]),
    # cancel, c reports c@1's load: handed back while c@2 loads
    "split load's part dropped": ("no early free", 4),
    # roles (checked with one store or one loader alone): begin, match_tokens asks the store
    "save-only connector looked up": ("roles kept", 2),
    # begin, request_finished asks (the loader promises a save), applies: it is awaited
    "load-only connector awaited": ("roles kept", 3),
}

#: The planted bugs of the checker's later properties: each fails the property meant and
#: nothing else (but what its ``also`` names, a consequence of the bug).
ONLY: tuple[str, ...] = tuple(list(KNOWN)[13:])


def test_the_catalog_is_the_one_described_here() -> None:
    assert {b.name: (b.prop, b.shortest) for b in CATALOG} == KNOWN


@pytest.mark.parametrize("events", [None, ALPHABET + LOAD_EVENTS], ids=["default", "load"])
def test_the_real_aggregator_passes_the_same_bound(events: tuple[str, ...] | None) -> None:
    report = checked(**BOUND, events=events)
    assert report.ok and report.finished, report.to_text()


def test_the_real_aggregator_passes_with_a_garbage_answering_connector() -> None:
    bound = {**BOUND, "connectors": {"a": "saver", "g": "garbage"}}
    report = check_aggregator(**bound)
    assert report.ok and report.finished, report.to_text()


@pytest.mark.parametrize(
    ("symmetry", "bug"),
    [
        # Without symmetry a load bug's search has twice the states (16,608 for the
        # representative: 24 s of CPU): every one is left to `make test-slow`.
        pytest.param(
            symmetry,
            bug,
            id=f"{'symmetry' if symmetry else 'no-symmetry'}-{bug.name}",
            marks=[pytest.mark.slow]
            if is_slow_load(bug) or (is_load(bug) and not symmetry)
            else [],
        )
        for symmetry in (True, False)
        for bug in CATALOG
    ],
)
def test_each_planted_bug_fails_its_property_with_a_shortest_trace(
    bug: Broken, symmetry: bool
) -> None:
    report = checked_bug(bug, symmetry=symmetry)
    assert report.finished
    prop, shortest = KNOWN[bug.name]
    result = report.result(prop)
    assert not result.passed, f"{bug.name}: {prop} passed\n{report.to_text()}"
    assert result.message
    trace = result.counterexample
    assert trace is not None
    assert len(trace) == shortest, f"{bug.name}: {bug.why}\n{report.to_text()}"
    assert all(s.number == i for i, s in enumerate(trace.steps, 1))
    assert not report.ok
    text = report.to_text()
    assert f"FAIL  {prop}" in text and f"shortest trace ({len(trace)} events)" in text


@pytest.mark.parametrize(
    "name",
    [
        # A load bug but the representative is left to `make test-slow`, as everywhere (its
        # search: 19.6 s of CPU alone, past what the 2x-loaded machine allows `make test`).
        pytest.param(n, marks=[pytest.mark.slow] if is_slow_load(b) else [])
        for n in ONLY
        for b in CATALOG
        if b.name == n
    ],
)
def test_each_later_planted_bug_fails_only_the_property_meant(name: str) -> None:
    bug = next(b for b in CATALOG if b.name == name)
    report = checked_bug(bug)
    failed = {p.name: len(p.counterexample or ()) for p in report.failures}
    assert set(failed) == {bug.prop, *bug.also}, report.to_text()
    # The property meant fails first: the others only as the bug's consequence, no sooner (an
    # early report decided on the answers can show it in the counters at the same depth).
    assert all(n >= failed[bug.prop] for p, n in failed.items() if p != bug.prop)


def test_the_params_bugs_pass_without_params() -> None:
    """The scripted savers answer params only with ``params=True``: without, no merge bug
    shows (every saver answers ``None``)."""
    for bug in CATALOG:
        if not bug.params:
            continue
        with bug.installed() as factory:
            report = check_aggregator(bug.connectors, requests=1, factory=factory)
        assert report.ok, (bug.name, report.to_text())
        assert "params merged" not in [p.name for p in report.properties]


def test_the_module_patch_is_undone() -> None:
    from multiconnector.aggregator import saving  # noqa: PLC0415
    from multiconnector.params import merge_transfer_params  # noqa: PLC0415

    for bug in CATALOG:
        if bug.patch:
            with bug.installed():
                assert saving.merge_transfer_params is not merge_transfer_params
    assert saving.merge_transfer_params is merge_transfer_params


def test_the_table_patch_is_undone() -> None:
    before = {s: dict(events) for s, events in machine_module.TABLE.items()}
    decisions = {e: dict(d) for e, d in getattr(machine_module, "DECISIONS", {}).items()}
    for bug in CATALOG:
        if bug.table:
            with bug.installed():
                assert any(machine_module.TABLE[s].get(e) != before[s].get(e) for s, e in bug.table)
    assert {s: dict(events) for s, events in machine_module.TABLE.items()} == before
    assert {e: dict(d) for e, d in getattr(machine_module, "DECISIONS", {}).items()} == decisions
    mc = MultiConnector({"a": None})
    mc.begin("r")
    mc.request_finished("r")
    mc.cancel("r")  # the patched table would have left finished here
    (done,) = mc.take()
    assert done.state is State.finished


def test_a_counterexample_carries_each_requests_path_for_the_diagrams() -> None:
    bug = next(b for b in CATALOG if b.name == "count-based draining")
    # The asking path alone (told, the finish is one event): a step the path names is not the
    # event's number (request_finished is two events).
    report = checked_bug(bug, events=tuple(e for e in ALPHABET if e not in TOLD_EVENTS))
    data = json.loads(json.dumps(report.to_dict()))
    (prop,) = [p for p in data["properties"] if p["name"] == "no early free"]
    assert prop["result"] == "FAIL"
    trace = prop["counterexample"]
    assert trace["length"] == 5
    assert [s["data"] for s in trace["steps"]] == [
        ["begin", "r1"],
        ["request_finished", "r1", ["a", "b"]],
        ["request_finished_apply", "r1"],
        ["transfer_finished", "r1", "a"],
        ["transfer_finished", "r1", "a"],
    ]
    # The path names the connector of the event applied (the duplicate from a that finished
    # it), not the one the broken aggregator substituted (b), and gives each step's number.
    assert trace["paths"] == {
        "r1": [
            ["request_finished", "pending", "finishing", None],
            ["transfer_finished", "finishing", "finishing", "a"],
            ["transfer_finished", "finishing", "finished", "a"],
        ]
    }
    assert trace["path_steps"] == {"r1": [3, 4, 5]}  # request_finished is two events
    # The diagram generator reads the path straight from the report.
    request, steps = find_path(data, prop="no early free")
    assert request == "r1" and [s.dest for s in steps][-1] is State.finished


@pytest.mark.parametrize(
    "bug", [p for p in bugs() if is_load(p.values[0]) and p.values[0].connectors is None]
)
def test_the_load_bugs_pass_every_other_property_and_the_default_alphabet(bug: Broken) -> None:
    """Each load bug is caught by its property (``load once``, or ``right outcome`` for the
    early load report dropped, which strands its request under ``no leak`` too; the ones that
    apply a load twice also queue the request for take() twice, which ``no early free``
    catches; each returns an outcome its ledger calls wrong, which ``right outcome`` catches;
    the one that returns ``applied`` itself neither counts it nor calls back, which
    ``counters`` and ``callbacks`` catch), and only when the load side is checked."""
    report = checked_bug(bug, connectors=BOUND["connectors"])
    failed = {p.name: len(p.counterexample or ()) for p in report.failures}
    assert failed[bug.prop] == bug.shortest, report.to_text()
    # A consequence the bug lists may show sooner (a request stranded by the bug itself).
    assert min(n for p, n in failed.items() if p not in bug.also) == bug.shortest
    # A record queued twice (a forgotten unregistering settles it again) makes take()
    # raise: a consequence too.
    consequences = {
        "no early free",
        "right outcome",
        "counters",
        "callbacks",
        "no exception",
    }
    assert set(failed) - {bug.prop} <= consequences | set(bug.also), report.to_text()
    assert checked_bug(bug, connectors=BOUND["connectors"], events=None).ok


@pytest.mark.slow  # not the representative load bug (tests/checked.py)
def test_a_load_counterexample_names_the_chosen_loader() -> None:
    bug = next(
        b for b in CATALOG if b.name == "load completion from an unchosen connector accepted"
    )
    report = checked_bug(bug)
    data = json.loads(json.dumps(report.to_dict()))
    (prop,) = [p for p in data["properties"] if p["name"] == "load once"]
    begin, match, recorded, load = [s["data"] for s in prop["counterexample"]["steps"]]
    assert begin == ["begin", "r1"] and match[:2] == ["match_tokens", "r1"]
    assert recorded == ["match_tokens_apply", "r1"]  # its second half records the loader
    # The savers are asked in registration order (a, then b): the first answering more than 0
    # is chosen, and every answer must be known (None would leave the loader unchosen).
    tokens = match[2]
    assert list(tokens) == ["a", "b"] and None not in tokens.values()
    chosen = next(name for name, count in tokens.items() if count)
    other = load[2]
    assert load[:2] == ["load_finished", "r1"] and other in ("a", "b") and other != chosen
    assert prop["message"] == (
        f"load_finished(r1, {other}) was applied from {other}, "
        f"though {chosen} was chosen to load it"
    )


@pytest.mark.parametrize("bug", bugs())
def test_json_paths_printed_trace_and_diagram_agree_event_for_event(
    bug: Broken, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every step of every request's JSON path is the transition of the trace step it names.

    The connector of a step is the one the applied event named (a duplicate stays a duplicate),
    the printed trace shows that event at that number, and ``diagram --path`` (md) lists the
    same steps under the same numbers.
    """
    report = checked_bug(bug)
    data = json.loads(json.dumps(report.to_dict()))
    (prop,) = [p for p in data["properties"] if p["name"] == bug.prop]
    trace = prop["counterexample"]
    assert trace is not None and trace["length"] == bug.shortest
    steps = trace["steps"]
    text = report.to_text()
    lines = {s["n"]: s for s in steps}
    assert set(trace["paths"]) == set(trace["path_steps"])
    for rid, path in trace["paths"].items():
        numbers = trace["path_steps"][rid]
        assert len(numbers) == len(path) and numbers == sorted(numbers)
        for (event, _source, _dest, name), n in zip(path, numbers, strict=True):
            applied = lines[n]["data"]
            if event == "connector_gone":
                assert applied[0] == "unregister" and name == applied[1]
            elif applied[0] == "transfer_finished_many":  # [kind, name, request ids]
                assert event == "transfer_finished" and rid in applied[2] and name == applied[1]
            else:
                # request_finished's transition is applied by its second half (or told)
                told = ("request_finished_apply", "request_finished_by")
                kind = "request_finished" if applied[0] in told else applied[0]
                assert [kind, applied[1]] == [event, rid], (n, applied, event)
                if len(applied) > 2 and isinstance(applied[2], str):
                    assert name == applied[2]
            label = lines[n]["event"]
            assert re.search(rf"^ *{n}\. {re.escape(label)} ", text, re.M), (n, label)
        # The diagram, drawn from the report, numbers and names the same steps.
        file = tmp_path / "check.json"
        file.write_text(json.dumps(data))
        argv = ["--path", str(file), "--property", bug.prop, "--request", rid, "--format", "md"]
        if any(tuple(step[:3]) not in DECLARED for step in path):
            # The bug took an undeclared transition: the diagram refuses to draw it, naming it.
            assert diagram_cli(argv) == 2
            assert "is not a transition of the machine" in capsys.readouterr().err
            continue
        if any(later[1] != earlier[2] for earlier, later in itertools.pairwise(path)):
            # The bug moved the record from a state it was not in (a terminal one, say): the
            # diagram refuses the broken path, naming the step.
            assert diagram_cli(argv) == 2
            assert "where the previous step ended" in capsys.readouterr().err
            continue
        assert diagram_cli(argv) == 0
        table = [
            line for line in capsys.readouterr().out.splitlines() if re.match(r"^\| \d+ \|", line)
        ]
        assert len(table) == len(path)
        for row, (event, source, dest, name), n in zip(table, path, numbers, strict=True):
            shown_name = "—" if name is None else f"`{name}`"
            assert row == f"| {n} | `{event}` | `{source}` | `{dest}` | {shown_name} |"


#: With two requests and every event sequence of up to 6 events, each planted bug's shortest
#: trace is its one-request one (the bug needs one request only), except "last report does not
#: finish": a trap, which a bounded search cannot see (the unexplored rest may leave it).
TWO_REQUEST_DEPTH = 6
#: Bugs only one request shows: a batch reports the same request twice only with one request
#: (with two, a batch is the pair).
ONE_REQUEST_ONLY = frozenset({"batch applies a duplicate twice"})
#: The params bugs with two requests: every sequence of up to 4 events (each request_finished
#: event comes in 64 variants with two savers: depth 6 would take minutes).
PARAMS_TWO_REQUEST_DEPTH = 4
#: Bugs checked by the asking path alone with two requests, and their trace there: count-based
#: draining reads the awaited names' order (it drains ``awaiting[0]``), which the alike told
#: events assume away (they spare a told call's images under a renaming of interchangeable
#: savers): with ``request_finished_by`` the sleep sets and alike events find 1,716 states of
#: the 1,726 found without them at depth 6, at fa18b37 as now (the verdicts and traces equal).
ASKED_ONLY_TWO_REQUESTS = {"count-based draining": 5}


def _outcome(report: Any) -> tuple[Any, ...]:
    return (
        report.verdict,
        report.distinct_states,
        report.max_depth,
        report.complete_depth,
        tuple((p.name, p.status, len(p.counterexample or ())) for p in report.properties),
    )


@pytest.mark.parametrize(
    ("bound", "bug"),
    [
        # Without reduction a load bug's one-request search costs 11 s of CPU or more: every
        # one is left to `make test-slow`; with two requests (to depth 6), the representative's
        # costs 3 s.
        pytest.param(
            bound,
            bug,
            id=f"{name}-{bug.name}",
            marks=(
                [pytest.mark.slow]
                if is_slow_load(bug) or (is_load(bug) and bound["requests"] == 1)
                else []
            ),
        )
        for bound, name in (
            ({"requests": 1}, "1-request"),
            ({"requests": 2, "max_depth": TWO_REQUEST_DEPTH}, "2-depth-6"),
        )
        for bug in CATALOG
    ],
)
def test_partial_order_reduction_keeps_verdicts_states_and_trace_lengths(
    bug: Broken, bound: dict[str, Any]
) -> None:
    if bug.params and bound["requests"] == 2:
        bound = {**bound, "max_depth": PARAMS_TWO_REQUEST_DEPTH}
    expected: int | None = bug.shortest
    if bound["requests"] == 2 and bug.name in ASKED_ONLY_TWO_REQUESTS:
        bound = {**bound, "events": tuple(e for e in ALPHABET if e not in TOLD_EVENTS)}
        expected = ASKED_ONLY_TWO_REQUESTS[bug.name]
    reduced = checked_bug(bug, **bound)
    full = checked_bug(bug, **bound, reduction=False)
    assert _outcome(reduced) == _outcome(full), (reduced.to_text(), full.to_text())
    result = reduced.result(bug.prop)
    depth = bound.get("max_depth")
    if bound["requests"] == 2 and (
        bug.prop == "no trap" or bug.shortest > (depth or 0) or bug.name in ONE_REQUEST_ONLY
    ):
        expected = None
    if expected is None:
        assert result.passed and reduced.verdict == "PASS"
    else:
        assert not result.passed and len(result.counterexample or ()) == expected


@pytest.mark.parametrize("bug", bugs())
def test_the_registry_as_a_set_keeps_verdicts_and_trace_lengths(
    bug: Broken, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keeping the registry's order in the state (as the load side does) changes no verdict.

    Without the load side the registry is part of the state as a set (docs/check.md,
    "Reductions"): every planted bug is still caught, with a trace of the same length, and the
    order only splits states. (With the load side the order is kept either way: the two
    searches are one, run once.)
    """
    as_set = checked_bug(bug, params=False)
    monkeypatch.setattr(run_module, "_registry_order", lambda alphabet, params: True)
    in_order = checked_bug(bug, params=False)
    assert _outcome(as_set)[0] == _outcome(in_order)[0]
    assert _outcome(as_set)[4] == _outcome(in_order)[4]
    assert as_set.distinct_states <= in_order.distinct_states


@pytest.mark.parametrize(
    "bound",
    [
        # Two requests, complete, without reduction too: 6 s alone (--durations, -p no:xdist).
        pytest.param(
            {"connectors": {"a": "saver", "b": "saver"}, "requests": 2, "unknown": ()},
            marks=pytest.mark.slow,
        ),
        {
            "connectors": {"a": "saver", "none": None, "boom": "raises"},
            "requests": 2,
            "max_depth": 6,
        },
        {"connectors": {"a": "saver", "b": "saver"}, "requests": 3, "max_depth": 5},
    ],
    ids=["two-savers", "raising", "three-requests"],
)
def test_partial_order_reduction_on_the_real_aggregator(bound: dict[str, Any]) -> None:
    """Complete (or depth-bounded) searches find the same states with and without it."""
    reduced = check_aggregator(**bound)
    full = check_aggregator(**bound, reduction=False)
    assert _outcome(reduced) == _outcome(full)
    assert reduced.verdict == "PASS" and reduced.pruned > 0 and full.pruned == 0
    assert reduced.states_generated + reduced.pruned + reduced.alike == full.states_generated


@pytest.mark.slow  # 30 s of CPU alone (the bug's search, then the CLI's): for `make test-slow`
def test_the_cli_load_check_names_an_unregistered_loader(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``multiconnector check --load`` runs the property that catches the unregistered loader."""
    bug = next(
        b for b in CATALOG if b.name == "load completion from an unregistered loader accepted"
    )
    report = checked_bug(bug)
    failure = report.result("load once")
    assert failure.message in {  # a and b are interchangeable (symmetry)
        f"load_finished(r1, {n}) was applied from {n}, though it was unregistered after it was "
        "chosen to load it"
        for n in "ab"
    }
    assert [s.data[0] for s in failure.counterexample.steps] == [  # type: ignore[union-attr]
        "begin", "match_tokens", "match_tokens_apply", "unregister", "load_finished"
    ]  # fmt: skip
    argv = ["--connectors", "a,b,none=none", "--requests", "1", "--load", "--no-progress"]
    assert check_module.run_cli(argv) == 0  # the real aggregator passes it
    assert "PASS  load once" in capsys.readouterr().out


def test_a_planted_line_that_is_gone_fails_the_test_that_builds_it_not_the_import(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A planted bug is built from the real source when a test installs it: a line it patches
    that is gone (the method changed, or a mutant changed it) fails that test, and under
    mutation testing skips it, so a mutant is only ever killed by a test that fails."""
    gone = broken_module.Planted("Gone", "_gather", ("no such line", "x"), doc="gone")
    with pytest.raises(AssertionError, match="'no such line' is not in _gather exactly once"):
        gone.build()
    monkeypatch.setattr(broken_module, "MUTATING", True)
    with pytest.raises(pytest.skip.Exception):
        gone.build()


def test_every_planted_source_bug_builds_and_changes_its_method() -> None:
    planted = [b.factory for b in CATALOG if isinstance(b.factory, broken_module.Planted)]
    assert len(planted) == 7
    for bug in planted:
        cls = bug.build()
        assert issubclass(cls, MultiConnector) and cls.__name__ == bug.name
        assert getattr(cls, bug.method) is not getattr(MultiConnector, bug.method)


def test_a_dropped_early_report_strands_the_request_with_a_shortest_trace() -> None:
    """The issue the early reports fix: the report counted as a phantom, the request then
    awaits it for ever. ``no leak`` catches the stranding one event later, when the answers
    are recorded."""
    bug = next(b for b in CATALOG if b.name == "early report dropped as a phantom")
    report = checked_bug(bug)
    result = report.result("no leak")
    assert not result.passed
    assert "stranded" in result.message
    trace = result.counterexample
    assert trace is not None
    assert [s.data[0] for s in trace.steps] == [
        "begin",
        "request_finished",
        "transfer_finished",
        "request_finished_apply",
    ]

"""``multiconnector diagram``: the transfer state machine, drawn from its one declaration.

Nothing here is drawn by hand. Every format comes from the ``transitions`` machine that
:func:`~multiconnector.machine.build_machine` builds from the one declaration,
:data:`~multiconnector.machine.TRANSITIONS`:

* ``mermaid``: a ``stateDiagram-v2``, from the ``transitions`` mermaid engine (no other package);
* ``dot``: Graphviz DOT text, from the ``transitions`` graphviz engine (with the ``graphviz``
  Python package of the ``diagrams`` extra when it is installed; the same text without it);
* ``svg``: that DOT rendered by Graphviz's own ``dot`` program;
* ``md``: Markdown holding the mermaid diagram (code hosts render it) and the transition table.

Given a request's path (its recorded ``history`` when the aggregator traces, or a counterexample
from ``multiconnector check``), the same diagrams mark the states and transitions it went through,
number them in order, and highlight the state it ended in.

Output is deterministic, byte for byte, so committed diagrams can be checked for freshness.

>>> print(render("mermaid").splitlines()[3])
stateDiagram-v2
>>> "pending --> finishing: request_finished [has_savers]" in render("mermaid")
True
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, cast

from transitions.extensions import GraphMachine

from ._args import Parser, output_dir, output_file, read_json
from ._drawing import (
    FORMATS,
    DiagramMachine,
    Numbers,
    cell,
    last_style,
    machine_class,
    mark_initial,
    needs_property,
    render_failed,
    svg_of,
    titled_mermaid,
    traced_properties,
)
from ._validate import bad_argument, check_choice, shown
from .errors import GraphvizMissingError, InvalidArgumentError, InvalidValueError
from .machine import INITIAL, STATES, TERMINAL, RequestTransferState, State, Step, build_machine

__all__ = [
    "FORMATS",
    "GENERATED",
    "HEALTH_MACHINE",
    "HEALTH_TITLE",
    "TITLE",
    "find_path",
    "read_path",
    "render",
    "run_cli",
    "steps",
    "trace_numbers",
]

#: The title every diagram of the machine carries.
TITLE: Final = "request transfer"
#: The health machine's factory, as ``--machine`` names it: ``--health`` draws it from its one
#: declaration (:data:`multiconnector.health.HEALTH_TRANSITIONS`) as any machine of your own.
HEALTH_MACHINE: Final = "multiconnector.health:build_health_machine"
#: The title of its diagrams.
HEALTH_TITLE: Final = "child health"
#: The committed diagrams (``docs/generated/``), file name -> format. ``make docs-diagrams``
#: rewrites them; a test fails when one is stale.
GENERATED: Final[Mapping[str, str]] = {
    "machine.mmd": "mermaid",
    "machine.dot": "dot",
    "machine.svg": "svg",
    "machine.md": "md",
}


def _machine(engine: str, numbers: Numbers) -> DiagramMachine:
    machine = build_machine(
        machine_cls=machine_class(engine, "_Machine"),
        graph_engine=engine,
        show_conditions=True,
        show_state_attributes=False,
        title=TITLE,
    )
    diagram_machine = cast(DiagramMachine, machine)
    diagram_machine.step_numbers = numbers
    return diagram_machine


# -- paths ---------------------------------------------------------------------------------------


def _declared() -> frozenset[tuple[str, str, str]]:
    markup = build_machine(machine_cls=GraphMachine, graph_engine="mermaid").markup
    return frozenset(
        (t["trigger"], t["source"], t.get("dest", t["source"])) for t in markup["transitions"]
    )


def _one_step(item: Any, where: str) -> Step:
    if isinstance(item, Mapping):
        try:
            fields = [item["event"], item["source"], item["dest"], item.get("name")]
        except KeyError as exc:
            raise InvalidArgumentError(
                f"{where}={shown(item)} must have the keys 'event', 'source', 'dest' "
                f"(and optionally 'name'); {exc.args[0]!r} is missing"
            ) from None
    elif isinstance(item, Sequence) and not isinstance(item, str | bytes) and len(item) in (3, 4):
        fields = [*item, None][:4]
    else:
        raise InvalidArgumentError(
            f"{where}={shown(item)} must be a Step, an [event, source, dest, name] list "
            "or a mapping with those keys"
        )
    event, source, dest, name = fields
    for part, value in (("event", event), ("source", source), ("dest", dest)):
        if not isinstance(value, str):
            raise InvalidArgumentError(f"{where}.{part}={shown(value)} must be a str")
    if name is not None and not isinstance(name, str):
        raise InvalidArgumentError(f"{where}.name={shown(name)} must be a str or None")
    known = {s.value for s in STATES}
    for part, value in (("source", source), ("dest", dest)):
        if value not in known:
            raise InvalidValueError(
                f"{where}.{part}={value!r} must be one of the states {sorted(known)}"
            )
    return Step(event, State(source), State(dest), name)


def steps(path: Iterable[Any], argument: str = "path") -> tuple[Step, ...]:
    """Check a request's path against the declaration and return it as :class:`Step` records.

    Each item is a :class:`~multiconnector.Step`, an ``[event, source, dest, name]`` list (as
    ``json.dumps(record.history)`` writes it; ``name`` may be left out) or a mapping with those
    keys. Every step must be a declared transition and start where the previous one ended; the
    first starts in the initial state. Raises :class:`~multiconnector.InvalidArgumentError`
    naming the offending step otherwise.

    >>> (one,) = steps([["request_finished", "pending", "finished", None]])
    >>> one.dest, one.name
    (<State.finished: 'finished'>, None)

    .. versionadded:: 0.1.0
    """
    if isinstance(path, str | bytes | Mapping) or not isinstance(path, Iterable):
        raise InvalidArgumentError(f"{argument}={shown(path)} must be an iterable of steps")
    declared = _declared()
    result: list[Step] = []
    at = INITIAL
    for index, item in enumerate(path):
        where = f"{argument}[{index}]"
        one = _one_step(item, where)
        if (one.event, one.source.value, one.dest.value) not in declared:
            raise InvalidValueError(
                f"{where}={list(one)!r} is not a transition of the machine: no {one.event!r} "
                f"leads from {one.source.value!r} to {one.dest.value!r}"
            )
        if one.source is not at:
            raise InvalidValueError(
                f"{where}={list(one)!r} must start in {at.value!r}, where "
                + ("every request starts" if index == 0 else "the previous step ended")
            )
        result.append(one)
        at = one.dest
    return tuple(result)


def _looks_like_path(value: Any) -> bool:
    """A list of ``[event, source, dest, name]`` lists or of mappings with an ``"event"``."""
    return isinstance(value, list) and all(
        isinstance(item, list) or (isinstance(item, Mapping) and "event" in item) for item in value
    )


def _collect(data: Any, key: str | None, found: dict[str, Any]) -> None:
    """Every ``{"path": [...]}`` object in ``data``, keyed by its request id."""
    if isinstance(data, Mapping):
        if "path" in data and _looks_like_path(data["path"]):
            rid = next(
                (str(data[k]) for k in ("request_id", "request", "id") if k in data), key or "?"
            )
            found.setdefault(rid, data["path"])
            return
        for k, v in data.items():
            if k == "paths" and isinstance(v, Mapping):  # {"paths": {request id: [steps]}}
                for rid, path in v.items():
                    if _looks_like_path(path):
                        found.setdefault(str(rid), path)
            else:
                _collect(v, str(k), found)
    elif isinstance(data, list) and not _looks_like_path(data):
        for i, v in enumerate(data):
            _collect(v, f"{key}[{i}]" if key else str(i), found)


def find_path(
    data: Any, request: str | None = None, prop: str | None = None
) -> tuple[str | None, tuple[Step, ...]]:
    """The request id and checked steps of one path in parsed JSON.

    ``data`` is either a plain list of steps (``json.dumps(record.history)``) or a JSON document
    holding objects with a ``"path"`` list, or ``"paths"`` mappings of request id to steps, such
    as the report of ``multiconnector check --json``. An object with a ``"path"`` names its
    request with ``"request_id"``, ``"request"`` or ``"id"``, or by the key it is stored under.
    ``request`` picks one when there are several; the first found wins for a repeated id.
    ``prop`` first narrows a check report to the counterexample of the property of that name.

    .. versionadded:: 0.1.0
    """
    for argument, value in (("request", request), ("prop", prop)):
        if value is not None and not isinstance(value, str):
            raise InvalidArgumentError(f"{argument}={shown(value)} must be a str or None")
    if prop is not None:
        props = data.get("properties") if isinstance(data, Mapping) else None
        if props is not None and not isinstance(props, list):
            raise InvalidArgumentError(
                f"data's 'properties'={shown(props)} must be a list, as a check report's is"
            )
        named = {str(p.get("name")): p for p in props or () if isinstance(p, Mapping)}
        if prop not in named:
            raise InvalidValueError(
                f"prop={prop!r} must name a property of the check report: {sorted(named)}"
            )
        data = named[prop].get("counterexample")
        if not data:
            raise InvalidValueError(
                f"prop={prop!r}: the check report has no counterexample for it (it "
                f"{'passed' if named[prop].get('result') != 'FAIL' else 'failed with no trace'})"
            )
    if _looks_like_path(data):
        if request is not None:
            raise InvalidValueError(
                f"request={request!r} cannot be chosen: the data is a single path"
            )
        return None, steps(data)
    found: dict[str, Any] = {}
    _collect(data, None, found)
    if not found and _is_report(data):
        raise InvalidValueError(
            "the check report has no counterexample: no property failed with a trace"
        )
    if not found:
        raise InvalidArgumentError(
            f"data={shown(data)} must be a list of steps or hold objects with a 'path' list"
        )
    if request is None:
        if len(found) > 1:
            raise InvalidValueError(
                f"request=None is ambiguous: the data holds paths of {sorted(found)}; pick one"
            )
        request = next(iter(found))
    if request not in found:
        raise InvalidValueError(
            f"request={request!r} must be one of the requests with a path: {sorted(found)}"
        )
    return request, steps(found[request], f"path of {request!r}")


def _is_report(data: Any) -> bool:
    """Whether ``data`` is a check report (``multiconnector check --json``)."""
    return isinstance(data, Mapping) and isinstance(data.get("properties"), list)


def read_path(
    file: str | os.PathLike[str], request: str | None = None, prop: str | None = None
) -> tuple[str | None, tuple[Step, ...]]:
    """:func:`find_path` on a JSON file (``"-"``: standard input)."""
    return find_path(_load(file), request, prop)


def _load(file: str | os.PathLike[str]) -> Any:
    return read_json(os.fspath(file))


def trace_numbers(
    data: Any, request: str | None, prop: str | None, length: int
) -> tuple[int, ...] | None:
    """The trace step numbers of a check report's path, when the report gives them.

    ``multiconnector check --json`` stores, next to each counterexample's ``paths``, the
    ``path_steps`` at which each request's steps happened: a diagram numbered with them agrees
    with the printed trace step for step. ``None`` when there are none (number 1, 2, ...).

    .. versionadded:: 0.1.0
    """
    if prop is not None and isinstance(data, Mapping):
        props = data.get("properties")
        named = {
            str(p.get("name")): p
            for p in (props if isinstance(props, list) else ())
            if isinstance(p, Mapping)
        }
        data = (named.get(prop) or {}).get("counterexample") or {}
    found: list[Any] = []

    def walk(node: Any) -> None:
        if isinstance(node, Mapping):
            numbers = node.get("path_steps")
            if isinstance(numbers, Mapping) and request in numbers:
                found.append(numbers[request])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(data)
    for numbers in found:
        if (
            isinstance(numbers, list)
            and len(numbers) == length
            and all(type(n) is int and n > 0 for n in numbers)
        ):
            return tuple(numbers)
    return None


# -- rendering -----------------------------------------------------------------------------------


def _graph(engine: str, path: tuple[Step, ...] | None, at: Sequence[int] | None = None) -> Any:
    numbers: Numbers = {}
    for index, one in enumerate(path or ()):
        number = at[index] if at is not None else index + 1
        numbers.setdefault((one.event, one.source.value, one.dest.value), []).append(number)
    machine = _machine(engine, numbers)
    graph = machine.graph_cls(machine)
    for state in STATES:
        if state in TERMINAL:
            graph.set_node_style(state.value, "terminal")
    if path is not None:
        # The travelled transitions are styled by their step numbers (``_drawing``).
        final = path[-1].dest if path else INITIAL
        for state in {INITIAL, *(s.dest for s in path)}:
            style = last_style(state in TERMINAL) if state is final else "visited"
            graph.set_node_style(state.value, style)
    return graph.get_graph(title=TITLE)


def _mermaid(path: tuple[Step, ...] | None, title: str, at: Sequence[int] | None = None) -> str:
    return titled_mermaid(_graph("mermaid", path, at).source, title)


def _dot_graph(path: tuple[Step, ...] | None, title: str, at: Sequence[int] | None = None) -> Any:
    return mark_initial(_graph("graphviz", path, at), INITIAL.value, title)


def _svg(path: tuple[Step, ...] | None, title: str, at: Sequence[int] | None = None) -> str:
    return svg_of(_dot_graph(path, title, at))


def _guard_text(tran: Mapping[str, Any]) -> str:
    parts = [f"`{g}`" for g in tran.get("conditions", [])]
    parts += [f"not `{g}`" for g in tran.get("unless", [])]
    return " and ".join(parts) or "—"


def _markdown(
    path: tuple[Step, ...] | None, title: str, request: str | None, at: Sequence[int] | None = None
) -> str:
    markup = build_machine(machine_cls=GraphMachine, graph_engine="mermaid").markup
    out: list[str] = []
    if path is None:
        out += [
            "# The request transfer machine",
            "",
            "Generated from the declaration in `multiconnector/machine.py` by",
            "`multiconnector diagram --format md`. Do not edit it: that command draws it again.",
        ]
    else:
        who = "a request" if request is None else f"request `{cell(request)}`"
        final = path[-1].dest if path else INITIAL
        out += [
            f"# The path of {who}",
            "",
            f"{len(path)} step(s), ending in `{final.value}`. Travelled transitions carry their",
            "step numbers; visited states are blue, the final state is amber.",
        ]
    out += ["", "```mermaid", _mermaid(path, title, at).rstrip("\n"), "```", ""]
    if path is not None:
        out += ["| step | event | from | to | connector |", "| --- | --- | --- | --- | --- |"]
        for index, one in enumerate(path):
            number = at[index] if at is not None else index + 1
            name = "—" if one.name is None else f"`{cell(one.name)}`"
            out.append(
                f"| {number} | `{one.event}` | `{one.source.value}` | `{one.dest.value}` | {name} |"
            )
        return "\n".join(out) + "\n"
    order = {s.value: i for i, s in enumerate(STATES)}
    rows = sorted(markup["transitions"], key=lambda t: order[t["source"]])
    out += ["| state | event | guard | next state |", "| --- | --- | --- | --- |"]
    for tran in rows:
        dest = tran.get("dest", tran["source"])
        shown_dest = f"`{dest}` (stays)" if dest == tran["source"] else f"`{dest}`"
        out.append(
            f"| `{tran['source']}` | `{tran['trigger']}` | {_guard_text(tran)} | {shown_dest} |"
        )
    sources = {t["source"] for t in rows}
    for state in STATES:
        if state in TERMINAL:
            if state.value in sources:  # it drains: the events above keep it where it is
                out.append(f"| `{state.value}` | any other | — | terminal: the event is ignored |")
            else:
                out.append(f"| `{state.value}` | any | — | terminal: the event is ignored |")
    guards = sorted({g for t in rows for g in [*t.get("conditions", []), *t.get("unless", [])]})
    if guards:
        out += [
            "",
            "Guards, methods of `RequestTransferState` called with the event's argument:",
            "",
        ]
        for name in guards:
            doc = (getattr(RequestTransferState, name).__doc__ or "").strip().splitlines()[0]
            out.append(f"- `{name}`: {doc}")
    out += [
        "",
        f"The initial state is `{INITIAL.value}`. Only events in this table change a request;",
        "any other event for it is ignored with an `Outcome` naming the rule.",
    ]
    return "\n".join(out) + "\n"


def render(
    fmt: str = "mermaid",
    *,
    path: Iterable[Any] | None = None,
    title: str | None = None,
    request: str | None = None,
    numbers: Sequence[int] | None = None,
) -> str:
    """The machine in ``fmt`` (one of :data:`FORMATS`), optionally with a request's path marked.

    ``path`` is a request's steps, in any form :func:`steps` accepts (its recorded ``history``,
    say): visited states and travelled transitions are marked and numbered, and the state it ended
    in is highlighted. ``title`` replaces the diagram's title; ``request`` names the request in
    the default title of a path; ``numbers`` numbers the path's steps (default ``1, 2, ...``;
    a check report's counterexample gives its trace's, :func:`trace_numbers`).
    ``svg`` needs Graphviz's ``dot`` program (the ``graphviz`` Python package is optional).

    >>> from multiconnector import ConnectorRegistry, MultiConnector
    >>> class Saver:
    ...     def request_finished(self, request_id, blocks):
    ...         return True, None
    >>> mc = MultiConnector(ConnectorRegistry({"disk": Saver()}), trace=True)
    >>> mc.begin("r1"); _ = mc.request_finished("r1"); _ = mc.transfer_finished("r1", "disk")
    >>> (record,) = mc.take()
    >>> text = render("mermaid", path=record.history, request="r1")
    >>> "Class finished s_final" in text and "(step 2)" in text
    True

    .. versionadded:: 0.1.0
    """
    check_choice(fmt, "fmt", FORMATS)
    for argument, value in (("title", title), ("request", request)):
        if value is not None and not isinstance(value, str):
            raise InvalidArgumentError(f"{argument}={shown(value)} must be a str or None")
    checked = None if path is None else steps(path)
    at: tuple[int, ...] | None = None
    if numbers is not None:
        if (
            checked is None
            or isinstance(numbers, str)
            or not isinstance(numbers, Sequence)
            or len(numbers) != len(checked)
            or not all(type(n) is int and n > 0 for n in numbers)
        ):
            right_type = (
                isinstance(numbers, Sequence)
                and not isinstance(numbers, str)
                and all(type(n) is int for n in numbers)
            )
            raise bad_argument(right_type)(
                f"numbers={shown(numbers)} must give one step number (an int > 0) per step of path"
            )
        at = tuple(numbers)
    if title is None:
        if checked is None:
            title = TITLE
        else:
            title = f"{TITLE}: path of {request}" if request is not None else f"{TITLE}: a path"
    if fmt == "mermaid":
        return _mermaid(checked, title, at)
    if fmt == "md":
        return _markdown(checked, title, request, at)
    if fmt == "dot":
        source: str = _dot_graph(checked, title, at).source
        return source
    return _svg(checked, title, at)


# -- command -------------------------------------------------------------------------------------


def _all_dir(text: str) -> str:
    return str(output_dir(text, GENERATED))


def _output(text: str) -> str:
    return str(output_file(text))


#: The longest ``--title``: a title is one line of a diagram (Graphviz's ``dot`` refuses a line
#: of some 16,000 characters).
MAX_TITLE: Final = 200


def _title(text: str) -> str:
    if len(text) > MAX_TITLE:
        raise argparse.ArgumentTypeError(
            f"a title of {len(text):,} characters; at most {MAX_TITLE}"
        )
    return text


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="multiconnector diagram",
        description="Draw the request transfer state machine from its declaration.",
    )
    parser.add_argument(
        "--format", choices=FORMATS, default="mermaid", help="the output format (default: mermaid)"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "-o",
        "--output",
        type=_output,
        metavar="FILE",
        help="write here, not to stdout (its folder must exist)",
    )
    where.add_argument(
        "--all",
        type=_all_dir,
        metavar="DIR",
        help=f"write every committed diagram ({', '.join(GENERATED)}) into DIR (created if its "
        "parent folder exists)",
    )
    parser.add_argument(
        "--path",
        metavar="FILE",
        help="JSON with a request's path to mark: a list of [event, source, dest, name] steps "
        "(json.dumps of a traced history) or the report of 'multiconnector check --json' "
        "('-': stdin)",
    )
    parser.add_argument("--request", metavar="ID", help="the request whose path to draw")
    parser.add_argument(
        "--property",
        metavar="NAME",
        help="in a check report, the property whose counterexample to draw",
    )
    parser.add_argument(
        "--title", type=_title, help=f"the diagram's title (at most {MAX_TITLE} characters)"
    )
    parser.add_argument(
        "--machine",
        metavar="MODULE:ATTR",
        help="draw a transitions machine of your own (a Machine, a machine class or factory, "
        "or a declaration dict); --path then takes its 'check --machine --json' report",
    )
    parser.add_argument(
        "--state", metavar="NAME", help="with --machine: the state to highlight (the current one)"
    )
    parser.add_argument(
        "--health",
        action="store_true",
        help=f"draw a child's health machine (--machine {HEALTH_MACHINE}), not the transfer one",
    )
    return parser


def _write(file: str, text: str) -> None:
    with open(file, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)


def _read_path(
    args: argparse.Namespace, prog: str
) -> tuple[str | None, tuple[Step, ...], tuple[int, ...] | None, str | None] | int:
    """``--path``'s request, steps and trace step numbers, and the property whose
    counterexample they are (``None``: not a check report); or the exit status (2) once the
    reason why not is printed: several properties failed with a trace and ``--property`` does
    not choose one, the report is of a machine of your own (``--machine`` is missing), ..."""
    try:
        data = _load(args.path)
        traced = traced_properties(data)
        problem = _own_machine(data) if _is_report(data) else None
        if problem is None and args.property is None:
            problem = needs_property(traced)
        if problem is not None:
            print(f"{prog}: error: {problem}", file=sys.stderr)
            return 2
        request, path = find_path(data, args.request, args.property)
        numbers = trace_numbers(data, request, args.property, len(path))
    except (OSError, ValueError, InvalidArgumentError, RecursionError) as exc:
        text = "nested too deeply to read" if isinstance(exc, RecursionError) else str(exc)
        print(f"{prog}: error: --path {args.path}: {text}", file=sys.stderr)
        return 2
    drawn = args.property if args.property is not None else next(iter(traced), None)
    return request, path, numbers, drawn


def _own_machine(report: Mapping[str, Any]) -> str | None:
    """What is missing to draw ``report`` when it is a check of a machine of your own."""
    bounds = report.get("bounds")
    if not isinstance(bounds, Mapping) or "machine" not in bounds:
        return None
    machine = str(bounds["machine"])
    return (
        f"--machine is missing: the report is of 'check --machine {machine}'; draw its "
        f"counterexample with --machine {machine}"
    )


def run_cli(argv: Sequence[str]) -> int:
    """``multiconnector diagram``; returns 0, 1 when Graphviz's ``dot`` failed, 2 for bad
    arguments (Graphviz missing for ``svg`` included)."""
    parser = _parser()
    try:
        args = parser.parse_args(list(argv))
    except SystemExit as exc:  # argparse's own exit: 0 for --help, 2 for bad arguments
        return exc.code if isinstance(exc.code, int) else 2
    if args.health:
        if args.machine is not None:
            print(f"{parser.prog}: error: --health draws a machine of its own, not --machine",
                  file=sys.stderr)  # fmt: skip
            return 2
        args.machine = HEALTH_MACHINE
        args.title = HEALTH_TITLE if args.title is None else args.title
    if args.machine is not None:
        from .usermachine.diagram import run_cli as run_machine_cli  # noqa: PLC0415 - on demand

        return run_machine_cli(args, parser)
    if args.state is not None:
        print(f"{parser.prog}: error: --state needs --machine", file=sys.stderr)
        return 2
    narrowing = args.request is not None or args.property is not None
    if args.all is not None and (args.path is not None or narrowing):
        print(f"{parser.prog}: error: --all draws the machine only, not a path", file=sys.stderr)
        return 2
    if narrowing and args.path is None:
        print(f"{parser.prog}: error: --request and --property need --path", file=sys.stderr)
        return 2
    path: tuple[Step, ...] | None = None
    request = None
    numbers: tuple[int, ...] | None = None
    title = args.title
    if args.path is not None:
        read = _read_path(args, parser.prog)
        if isinstance(read, int):
            return read
        request, path, numbers, chosen = read
        if title is None and chosen is not None:
            who = f"path of {request}" if request is not None else "a path"
            title = f"{TITLE}: {who}, counterexample to {chosen!r}"
    try:
        if args.all is not None:  # the folder was made (not its parents) when it was checked
            # Every diagram drawn before any is written: a format that fails leaves no part.
            drawn = {name: render(fmt, title=args.title) for name, fmt in GENERATED.items()}
            for name, text in drawn.items():
                _write(os.path.join(args.all, name), text)
            return 0
        text = render(args.format, path=path, title=title, request=request, numbers=numbers)
    except (GraphvizMissingError, subprocess.CalledProcessError) as exc:
        return render_failed(exc, parser.prog)
    except OSError as exc:  # writable when checked, no longer
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        _write(args.output, text)
    except OSError as exc:
        print(f"{parser.prog}: error: cannot write --output: {exc}", file=sys.stderr)
        return 2
    return 0

"""Diagrams of your own ``transitions`` machine, in the four formats of ``multiconnector diagram``.

:func:`draw` returns a :class:`Diagram`: ``mermaid``, ``dot``, ``svg`` (Graphviz's ``dot``
program) or ``md`` (Markdown holding the mermaid diagram and the transition table, which code
hosts render). A notebook shows the object inline (``_repr_mimebundle_``). A path (a
counterexample of :func:`~multiconnector.usermachine.check_machine`, or the report of
``multiconnector check --machine ... --json``) is marked: visited states and travelled
transitions are numbered, and the state it ends in is highlighted; ``state`` highlights one
state (the current state of a model, say).

>>> d = draw({"states": ["a", "b"], "initial": "a", "final": ["b"],
...           "transitions": [["go", "a", "b"]]}, state="b")
>>> print(d.render("mermaid").splitlines()[3])
stateDiagram-v2
>>> "Class b s_final" in d.render("mermaid")
True
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, cast, final

import attrs

from .._args import read_json
from .._drawing import (
    FORMATS,
    DiagramMachine,
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
from .._explore import Counterexample
from .._validate import check_choice, shown
from ..errors import (
    GraphvizMissingError,
    InvalidArgumentError,
    InvalidMachineError,
    InvalidValueError,
)
from .declaration import Declared, declare, load
from .values import state_name

__all__ = ["Diagram", "draw", "path_of", "run_cli"]

Triple = tuple[str, str, str]


def path_of(declared: Declared, path: Any, argument: str = "path") -> tuple[Triple, ...]:
    """``path`` as checked ``(source, trigger, dest)`` steps of ``declared``.

    ``path`` is a :class:`~multiconnector.check.Counterexample`, its JSON form (``"initial"``
    and ``"steps"``, as ``--json`` writes it), or a list of ``[trigger, source, dest]`` steps.
    Each step must be a declared transition starting where the previous one ended, the first
    in the initial state. A counterexample's last step may be an event that changed nothing
    (an invariant broke on it): it is not drawn.

    .. versionadded:: 0.1.0
    """
    steps: list[tuple[str, str, str]] = []  # (trigger, source, dest)
    if isinstance(path, Counterexample):
        path = {
            "initial": path.initial,
            "steps": [{"event": s.event, "data": s.data, "state": s.state} for s in path.steps],
        }
    if isinstance(path, Mapping) and "steps" in path:
        # A trace shows each state with its model's values: ``closed (failures=3)``.
        at = state_name(str(path.get("initial")), declared.states)
        for item in path["steps"] or ():
            data = item.get("data") if isinstance(item, Mapping) else None
            trigger = data.get("trigger") if isinstance(data, Mapping) else data
            state = item.get("state") if isinstance(item, Mapping) else None
            if not isinstance(trigger, str) or not isinstance(state, str):
                raise InvalidArgumentError(f"{argument}: a step {shown(item)} has no trigger")
            state = state_name(state, declared.states)
            steps.append((trigger, at, state))
            at = state
    elif isinstance(path, Iterable) and not isinstance(path, str | bytes | Mapping):
        for i, item in enumerate(path):
            if (
                not isinstance(item, Sequence)
                or isinstance(item, str)
                or len(item) != 3
                or not all(isinstance(x, str) for x in item)
            ):
                raise InvalidArgumentError(
                    f"{argument}[{i}]={shown(item)} must be a [trigger, source, dest] list"
                )
            steps.append((item[0], item[1], item[2]))
    else:
        raise InvalidArgumentError(
            f"{argument}={shown(path)} must be a counterexample or a list of "
            "[trigger, source, dest] steps"
        )
    declared_triples = {t.triple for t in declared.transitions}
    out: list[Triple] = []
    at = declared.initial
    for i, (trigger, source, dest) in enumerate(steps):
        if (source, trigger, dest) not in declared_triples:
            if source == dest and i == len(steps) - 1:
                break  # the event a property broke on changed nothing
            raise InvalidValueError(
                f"{argument}[{i}]: no {trigger!r} leads from {source!r} to {dest!r} in the machine"
            )
        if source != at:
            raise InvalidValueError(
                f"{argument}[{i}] must start in {at!r}, where "
                + ("the machine starts" if i == 0 else "the previous step ended")
            )
        out.append((source, trigger, dest))
        at = dest
    return tuple(out)


@final
@attrs.frozen(kw_only=True)
class Diagram:
    """A drawing of a machine; ``render(fmt)`` gives the text, a notebook shows it inline.

    .. versionadded:: 0.1.0
    """

    declared: Declared
    title: str
    path: tuple[Triple, ...] = ()
    state: str | None = None

    @property
    def highlighted(self) -> str | None:
        """The state drawn in amber: ``state``, or where the path ends."""
        if self.state is not None:
            return self.state
        return self.path[-1][2] if self.path else None

    def _graph(self, engine: str) -> Any:
        numbers: dict[Triple, list[int]] = {}
        for n, (source, trigger, dest) in enumerate(self.path, start=1):
            numbers.setdefault((trigger, source, dest), []).append(n)
        machine = cast(
            DiagramMachine,
            self.declared.build(
                machine_class(engine, "_UserMachine"),
                graph_engine=engine,
                show_conditions=True,
                show_state_attributes=False,
                title=self.title,
            ),
        )
        machine.step_numbers = numbers
        graph = machine.graph_cls(machine)
        for s in self.declared.final:
            graph.set_node_style(s, "terminal")
        if self.path:  # its transitions are styled by their step numbers (``_drawing``)
            for s in {self.declared.initial, *(d for _, _, d in self.path)}:
                graph.set_node_style(s, "visited")
        if self.highlighted is not None:
            terminal = self.highlighted in self.declared.final
            graph.set_node_style(self.highlighted, last_style(terminal))
        return graph.get_graph(title=self.title)

    def mermaid(self) -> str:
        return titled_mermaid(self._graph("mermaid").source, self.title)

    def _dot_graph(self) -> Any:
        return mark_initial(self._graph("graphviz"), self.declared.initial, self.title)

    def dot(self) -> str:
        return str(self._dot_graph().source)

    def svg(self) -> str:
        """The SVG, drawn by Graphviz's ``dot`` program."""
        return svg_of(self._dot_graph())

    def markdown(self) -> str:
        d = self.declared
        out = [f"# {self.title}", ""]
        if self.path:
            out += [
                f"{len(self.path)} step(s), ending in `{self.path[-1][2]}`. Travelled "
                "transitions carry their step numbers; visited states are blue, the last is amber.",
                "",
            ]
        elif self.state is not None:
            out += [f"The highlighted state is `{self.state}`.", ""]
        out += ["```mermaid", self.mermaid().rstrip("\n"), "```", ""]
        if self.path:
            out += ["| step | event | from | to |", "| --- | --- | --- | --- |"]
            for n, (source, trigger, dest) in enumerate(self.path, start=1):
                out.append(f"| {n} | `{cell(trigger)}` | `{cell(source)}` | `{cell(dest)}` |")
            return "\n".join(out) + "\n"
        out += ["| state | event | guard | next state |", "| --- | --- | --- | --- |"]
        for t in d.transitions:
            guard = " and ".join(
                [*(f"`{g}`" for g in t.conditions), *(f"not `{g}`" for g in t.unless)]
            )
            dest = f"`{cell(t.dest)}`" + (" (stays)" if t.dest == t.source else "")
            out.append(
                f"| `{cell(t.source)}` | `{cell(t.trigger)}` | {cell(guard) or '—'} | {dest} |"
            )
        finals = ", ".join(f"`{cell(s)}`" for s in d.states if s in d.final) or "none"
        out += ["", f"The initial state is `{cell(d.initial)}`; final states: {finals}."]
        return "\n".join(out) + "\n"

    def render(self, fmt: str = "mermaid") -> str:
        """The diagram in ``fmt``, one of ``mermaid``, ``dot``, ``svg``, ``md``."""
        check_choice(fmt, "fmt", FORMATS)
        if fmt == "mermaid":
            return self.mermaid()
        if fmt == "dot":
            return self.dot()
        if fmt == "svg":
            return self.svg()
        return self.markdown()

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        """What a notebook shows: the SVG when Graphviz is there, and the Markdown (mermaid)."""
        bundle = {"text/markdown": self.markdown(), "text/plain": self.mermaid()}
        # Without Graphviz, the notebook draws the mermaid in the Markdown, if it can.
        with contextlib.suppress(RuntimeError, OSError, subprocess.CalledProcessError):
            bundle["image/svg+xml"] = self.svg()
        return bundle

    def __str__(self) -> str:
        return self.mermaid()


def draw(
    machine: Any,
    *,
    path: Any = None,
    state: str | None = None,
    title: str | None = None,
) -> Diagram:
    """A :class:`Diagram` of ``machine`` (any form :func:`~multiconnector.usermachine.check_machine`
    accepts), with ``path`` marked and ``state`` highlighted.

    .. versionadded:: 0.1.0
    """
    label = machine if isinstance(machine, str) else None
    declared = declare(machine)
    for argument, value in (("state", state), ("title", title)):
        if value is not None and not isinstance(value, str):
            raise InvalidArgumentError(f"{argument}={shown(value)} must be a str or None")
    if state is not None and state not in declared.states:
        raise InvalidValueError(
            f"state={state!r} must be one of the machine's states {list(declared.states)}"
        )
    steps = () if path is None else path_of(declared, path)
    if title is None:
        title = declared.name or label or getattr(machine, "__qualname__", None) or "state machine"
        if path is not None:
            title += ": a path"
    return Diagram(declared=declared, title=str(title), path=steps, state=state)


def _report_path(data: Any, prop: str | None) -> Any:
    """The counterexample to draw from a ``check --json`` report, or a plain list of steps."""
    if isinstance(data, list):
        if prop is not None:
            raise InvalidArgumentError("--property needs a check report, not a list of steps")
        return data
    props = data.get("properties") if isinstance(data, Mapping) else None
    if not isinstance(props, list):
        raise InvalidArgumentError(
            "must be a report of 'multiconnector check --machine ... --json' or a list of "
            "[trigger, source, dest] steps"
        )
    traced = {
        str(p.get("name")): p["counterexample"]
        for p in props
        if isinstance(p, Mapping) and p.get("counterexample")
    }
    if prop is None:
        if not traced:
            raise InvalidValueError("the report has no counterexample: every property passed")
        return next(iter(traced.values()))
    if prop not in traced:
        raise InvalidValueError(
            f"--property {prop!r} must name a property with a counterexample: {sorted(traced)}"
        )
    return traced[prop]


def _transfer_report(data: Any) -> str | None:
    """Why ``data`` cannot be drawn with ``--machine``: it is the transfer machine's report."""
    bounds = data.get("bounds") if isinstance(data, Mapping) else None
    if isinstance(bounds, Mapping) and "machine" not in bounds:
        return "is a report of the transfer machine's check: draw it without --machine"
    return None


def _read_path(args: Any, declared: Declared, prog: str) -> tuple[Any, str | None] | int:
    """``--path``'s steps, checked against ``declared``, and the property whose counterexample
    they are (``None``: a plain list of steps); or the exit status (2) once the reason why not
    is printed. Several properties failed with a trace: ``--property`` must choose one."""
    try:
        data = read_json(args.path)
    except (OSError, ValueError) as exc:
        print(f"{prog}: error: --path {args.path}: {exc}", file=sys.stderr)
        return 2
    traced = traced_properties(data)
    problem = _transfer_report(data)  # the wrong machine's report is said first
    if problem is not None:
        problem = f"--path {args.path}: {problem}"
    elif args.property is None:
        problem = needs_property(traced)
    if problem is not None:
        print(f"{prog}: error: {problem}", file=sys.stderr)
        return 2
    try:
        path = _report_path(data, args.property)
        path_of(declared, path, "path")  # its steps checked here, to name --path
    except (ValueError, InvalidArgumentError) as exc:
        print(f"{prog}: error: --path {args.path}: {exc}", file=sys.stderr)
        return 2
    return path, args.property if args.property is not None else next(iter(traced), None)


def run_cli(args: Any, parser: Any) -> int:
    """``multiconnector diagram --machine``: 0, 1 when Graphviz's ``dot`` failed, 2 for bad
    input (Graphviz missing for ``svg`` included)."""
    given = [o for o, v in (("--all", args.all), ("--request", args.request)) if v is not None]
    if given:
        verb = "draws" if len(given) == 1 else "draw"
        print(
            f"{parser.prog}: error: {' and '.join(given)} {verb} the transfer machine only, "
            "not --machine",
            file=sys.stderr,
        )
        return 2
    if args.property is not None and args.path is None:
        print(f"{parser.prog}: error: --property needs --path", file=sys.stderr)
        return 2
    try:
        declared = declare(load(args.machine, "--machine"))
    except (InvalidArgumentError, InvalidMachineError) as exc:
        # load() names --machine itself; the machine's own problems are prefixed with it.
        text = str(exc).replace(":\n  - ", ": ").replace("\n  - ", "; ")
        where = "" if text.startswith("--machine") else f"--machine {args.machine}: "
        print(f"{parser.prog}: error: {where}{text}", file=sys.stderr)
        return 2
    path, drawn = None, None
    if args.path is not None:
        read = _read_path(args, declared, parser.prog)
        if isinstance(read, int):
            return read
        path, drawn = read
    try:
        diagram = draw(declared, path=path, state=args.state, title=args.title)
    except InvalidArgumentError as exc:  # the only argument left unchecked: --state
        print(f"{parser.prog}: error: --state {args.state}: {exc}", file=sys.stderr)
        return 2
    if args.title is None:
        base = declared.name or args.machine
        if drawn is not None:
            base += f": counterexample to {drawn!r}"
        elif path is not None:
            base += ": a path"
        diagram = attrs.evolve(diagram, title=base)
    try:
        out = diagram.render(args.format)
    except (GraphvizMissingError, subprocess.CalledProcessError) as exc:
        return render_failed(exc, parser.prog)
    if args.output is None:
        sys.stdout.write(out)
        return 0
    try:
        with open(args.output, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(out)
    except OSError as exc:  # writable when checked, no longer
        print(f"{parser.prog}: error: cannot write --output: {exc}", file=sys.stderr)
        return 2
    return 0

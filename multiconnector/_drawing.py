"""What every diagram of this package is drawn with: the ``transitions`` graph machine that numbers
the travelled transitions, its styles per engine, and the text touches both drawings make.

:mod:`multiconnector.diagram` draws the transfer machine with it and
:mod:`multiconnector.usermachine.diagram` a user's own; neither imports the other for it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from typing import Any, Final, cast

from transitions.extensions import GraphMachine
from transitions.extensions.diagrams_base import BaseGraph
from transitions.extensions.diagrams_graphviz import Graph as GraphvizGraph

from ._dot import MISSING_DOT, Digraph
from .errors import GraphvizMissingError

__all__ = [
    "DOT_STYLES",
    "FORMATS",
    "MERMAID_STYLES",
    "DiagramMachine",
    "Numbers",
    "cell",
    "last_style",
    "machine_class",
    "mark_initial",
    "needs_property",
    "render_failed",
    "svg_of",
    "titled_mermaid",
    "traced_properties",
]

#: The formats every diagram is drawn in.
FORMATS: Final[tuple[str, ...]] = ("mermaid", "dot", "svg", "md")

VISITED_COLOUR: Final = "#1d4ed8"
FINAL_COLOUR: Final = "#b45309"

# Styles per engine: mermaid's classDef speaks CSS, Graphviz speaks its own attributes. Only the
# styles named here are emitted, so the mermaid text carries no unused classDef.
# The path's last state: amber; ``final_terminal`` adds the terminal mark to it.
_MERMAID_FINAL: Final = {"fillcolor": "#fde68a", "color": "#78350f", "stroke": FINAL_COLOUR}
_DOT_FINAL: Final = {"fillcolor": "#fde68a", "color": FINAL_COLOUR, "penwidth": "3"}
MERMAID_STYLES: Final[dict[str, Any]] = {
    "node": {
        "default": {"fillcolor": "white", "color": "black"},
        "terminal": {"fillcolor": "white", "color": "black", "stroke-width": "3px"},
        "visited": {"fillcolor": "#dbeafe", "color": "#1e3a8a", "stroke": VISITED_COLOUR},
        # The path's last state (or the state highlighted): amber, with the terminal mark (the
        # thick border) only when it is terminal.
        "final": _MERMAID_FINAL,
        "final_terminal": {**_MERMAID_FINAL, "stroke-width": "3px"},
    },
    "edge": {"default": {}},
    "graph": {"default": {}},
}
DOT_STYLES: Final[dict[str, Any]] = {
    "node": {
        "default": {
            "style": "rounded,filled",
            "shape": "rectangle",
            "fillcolor": "white",
            "color": "black",
            "fontname": "Helvetica",
        },
        "terminal": {"peripheries": "2"},
        "visited": {"fillcolor": "#dbeafe", "color": VISITED_COLOUR, "penwidth": "2"},
        "final": _DOT_FINAL,
        "final_terminal": {**_DOT_FINAL, "peripheries": "2"},
    },
    "edge": {
        "default": {"color": "black", "fontname": "Helvetica", "fontsize": "11"},
        "visited": {"color": VISITED_COLOUR, "fontcolor": VISITED_COLOUR, "penwidth": "2.5"},
    },
    "graph": {"default": {"fontname": "Helvetica"}},
}
_STYLES: Final = {"mermaid": MERMAID_STYLES, "graphviz": DOT_STYLES}

#: (event, source, dest) -> 1-based step numbers, for one rendering.
Numbers = dict[tuple[str, str, str], list[int]]


class _NumberedLabels(BaseGraph):
    """Mixed into a ``transitions`` graph class: travelled transitions get their step numbers."""

    def _transition_label(self, tran: dict[str, str]) -> str:
        label = super()._transition_label(tran)
        numbers: Numbers = getattr(self.machine, "step_numbers", {})
        found = numbers.get((tran["trigger"], tran["source"], tran.get("dest", tran["source"])))
        if not found:
            return label
        noun = "step" if len(found) == 1 else "steps"
        return f"{label} ({noun} {', '.join(map(str, found))})"


def last_style(terminal: bool) -> str:
    """The style of the state a path ends in (or the one highlighted): the terminal mark (a
    double border; in mermaid, a thick one) only when the state is terminal."""
    return "final_terminal" if terminal else "final"


class _TakenEdges(BaseGraph):
    """Mixed into a Graphviz graph class: a transition taken is drawn in the ``visited`` style,
    on an edge of its own when other events share its two states (``transitions`` draws them
    as one edge, labelled ``a | b``), so an event never taken is never coloured."""

    def _add_edges(self, transitions: list[dict[str, Any]], container: Any) -> None:
        numbers: Numbers = getattr(self.machine, "step_numbers", {})
        styles = cast(Any, self.machine).style_attributes.get("edge", {})
        # Grouped as transitions groups them (by source, then destination), then by taken.
        edges: dict[str, dict[str, dict[bool, list[str]]]] = {}
        for tran in transitions:
            dest = tran.get("dest", tran["source"])
            taken = (tran["trigger"], tran["source"], dest) in numbers
            by_taken = edges.setdefault(tran["source"], {}).setdefault(dest, {})
            by_taken.setdefault(taken, []).append(self._transition_label(tran))
        for source, dests in edges.items():
            for dest, by_taken in dests.items():
                for taken, labels in by_taken.items():
                    style = styles.get("visited" if taken else "", {})
                    container.edge(source, dest, label=" | ".join(labels), **style)


class _TextGraph(GraphvizGraph):
    """The ``transitions`` graphviz engine drawing into :class:`~multiconnector._dot.Digraph`
    (no ``graphviz`` package: DOT is text)."""

    def generate(self) -> None:
        """Nothing to prepare: each graph is built from scratch."""

    def get_graph(self, title: str | None = None, roi_state: Any = None) -> Any:
        if roi_state is not None:  # pragma: no cover - the diagrams draw whole machines
            raise NotImplementedError("a region of interest needs the graphviz package")
        title = title or self.machine.title
        styles: dict[str, dict[str, Any]] = cast(Any, self.machine).style_attributes
        graph = Digraph(
            name=title,
            node_attr=styles.get("node", {}).get("default", {}),
            edge_attr=styles.get("edge", {}).get("default", {}),
            graph_attr=styles.get("graph", {}).get("default", {}),
        )
        graph.graph_attr.update(**self.machine.machine_attributes)
        graph.graph_attr["label"] = title
        states, transitions = self._get_elements()
        self._add_nodes(states, graph)
        self._add_edges(transitions, graph)
        return graph


class DiagramMachine(GraphMachine):
    """A ``GraphMachine`` whose graphs number the travelled transitions, styled per engine."""

    step_numbers: Numbers

    def _init_graphviz_engine(self, graph_engine: str) -> type[BaseGraph]:
        base = super()._init_graphviz_engine(graph_engine)
        name = base.__module__.rsplit("_", 1)[-1]  # diagrams_mermaid -> mermaid
        if name != graph_engine:  # transitions falls back to mermaid when graphviz is missing
            base = _TextGraph
        # Mermaid's state diagrams cannot style one transition: only its label's step numbers.
        mixins = (_NumberedLabels,) if graph_engine == "mermaid" else (_NumberedLabels, _TakenEdges)
        return type(f"Numbered{base.__name__}", (*mixins, base), {})


def machine_class(engine: str, name: str) -> type[DiagramMachine]:
    """A :class:`DiagramMachine` class named ``name``, styled for ``engine`` (``"mermaid"`` or
    ``"graphviz"``)."""
    return cast(
        type[DiagramMachine],
        type(name, (DiagramMachine,), {"style_attributes": _STYLES[engine]}),
    )


def titled_mermaid(source: str, title: str) -> str:
    """Mermaid text with ``title`` in its front matter (``transitions`` writes the title as bare
    front matter; mermaid wants YAML with a ``title`` key), no trailing blanks on a line."""
    lines = source.splitlines()
    if len(lines) >= 3 and lines[0] == "---" and lines[2] == "---":
        lines[1] = f"title: {json.dumps(title)}"
    return "\n".join(line.rstrip() for line in lines) + "\n"


def mark_initial(graph: Any, initial: str, title: str) -> Any:
    """A Graphviz graph with the initial state's marker (as mermaid draws ``[*] --> initial``)
    and ``title`` as its name and label."""
    graph.node("__initial__", label="", shape="point", width="0.15", fillcolor="black")
    graph.edge("__initial__", initial)
    graph.name = title
    graph.graph_attr["label"] = title
    return graph


def svg_of(graph: Any) -> str:
    """``graph`` (the ``graphviz`` package's or :class:`~multiconnector._dot.Digraph`) drawn as
    SVG by Graphviz's ``dot``: :class:`~multiconnector.errors.GraphvizMissingError` when ``dot``
    is not on ``PATH``, with or without the package (whose own error would differ)."""
    if shutil.which("dot") is None:
        raise GraphvizMissingError(MISSING_DOT)
    return str(graph.pipe(format="svg", encoding="utf-8"))


def render_failed(exc: GraphvizMissingError | subprocess.CalledProcessError, prog: str) -> int:
    """Say on stderr, in one line, why a diagram could not be rendered, and return the exit
    status: 2 when Graphviz's ``dot`` is missing (what to install: a usage error), 1 when it
    ran and failed (its ``CalledProcessError``)."""
    if isinstance(exc, GraphvizMissingError):
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    said = exc.stderr.decode("utf-8", "replace") if isinstance(exc.stderr, bytes) else ""
    said = " ".join(said.split()) or f"exit status {exc.returncode}"
    print(f"{prog}: Graphviz's dot failed: {said}", file=sys.stderr)
    return 1


def traced_properties(data: Any) -> list[str]:
    """The properties of a check report (``check --json``) that failed with a counterexample,
    in the report's order; ``[]`` when ``data`` is not a report."""
    props = data.get("properties") if isinstance(data, dict) else None
    if not isinstance(props, list):
        return []
    return [str(p.get("name")) for p in props if isinstance(p, dict) and p.get("counterexample")]


def needs_property(traced: list[str]) -> str | None:
    """Why ``--property`` must be given to draw a path from a report whose ``traced``
    properties failed with a counterexample: several did, and none is drawn silently."""
    if len(traced) < 2:
        return None
    names = ", ".join(repr(name) for name in traced)
    return (
        f"--property is needed: {len(traced)} properties failed with a counterexample "
        f"({names}); name the one to draw"
    )


def cell(text: str) -> str:
    """``text`` safe in a Markdown table cell (and in backticks)."""
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "'")

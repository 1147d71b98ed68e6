"""DOT text without the ``graphviz`` Python package: the little of its ``Digraph`` the diagrams use.

DOT is text, so ``diagram --format dot`` needs no package: when ``graphviz`` is not installed,
the ``transitions`` graphviz engine draws into :class:`Digraph`, which writes the same source,
byte for byte (node and edge statements, attribute lists sorted, identifiers quoted by the
same rules), and renders SVG with Graphviz's ``dot`` program as the package does.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from typing import Any, Final

from .errors import GraphvizMissingError

__all__ = ["MISSING_DOT", "Digraph", "quote"]

#: What :class:`GraphvizMissingError` says: what is missing, and how to install it.
MISSING_DOT: Final = (
    "the svg format needs Graphviz's `dot` program, not found on PATH ('apt-get install "
    "graphviz', or your system's package manager, installs it)"
)

#: An identifier DOT takes unquoted: a name or a number.
_ID: Final = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*|-?(\.[0-9]+|[0-9]+(\.[0-9]*)?))$")
_HTML: Final = re.compile(r"<.*>$", re.DOTALL)
_KEYWORDS: Final = frozenset({"node", "edge", "graph", "digraph", "subgraph", "strict"})
#: A quote, after any escaped backslashes and with or without its own backslash.
_QUOTE: Final = re.compile(r'(?P<backslashes>(?:\\{2})*)\\?(?P<quote>")')


def quote(identifier: str) -> str:
    """``identifier`` as a DOT ID: unquoted when it is a name or a number (not a keyword) or an
    HTML string, otherwise in double quotes with its own quotes escaped."""
    if _HTML.match(identifier):
        return identifier
    if not _ID.match(identifier) or identifier.lower() in _KEYWORDS:
        return '"' + _QUOTE.sub(r"\g<backslashes>\\\g<quote>", identifier) + '"'
    return identifier


def _quote_edge(identifier: str) -> str:
    """An edge's end: ``node[:port[:compass]]``, each part quoted as needed."""
    node, _, rest = identifier.partition(":")
    parts = [quote(node)]
    if rest:
        port, _, compass = rest.partition(":")
        parts.append(quote(port))
        if compass:
            parts.append(compass)
    return ":".join(parts)


def _attributes(label: str | None, attrs: Mapping[str, Any]) -> str:
    items = [f"label={quote(label)}"] if label is not None else []
    items += [f"{quote(k)}={quote(str(v))}" for k, v in sorted(attrs.items()) if v is not None]
    return f" [{' '.join(items)}]" if items else ""


class Digraph:
    """A directed graph written as DOT text (``name``, ``graph_attr``, ``node``, ``edge``,
    ``source``, ``pipe``), what the ``transitions`` graphviz engine calls."""

    def __init__(
        self,
        name: str | None = None,
        *,
        graph_attr: Mapping[str, Any] | None = None,
        node_attr: Mapping[str, Any] | None = None,
        edge_attr: Mapping[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.graph_attr: dict[str, Any] = dict(graph_attr or {})
        self.node_attr: dict[str, Any] = dict(node_attr or {})
        self.edge_attr: dict[str, Any] = dict(edge_attr or {})
        self.body: list[str] = []
        self.engine = "dot"

    def node(self, name: str, label: str | None = None, **attrs: Any) -> None:
        self.body.append(f"\t{quote(name)}{_attributes(label, attrs)}\n")

    def edge(self, tail: str, head: str, label: str | None = None, **attrs: Any) -> None:
        ends = f"{_quote_edge(tail)} -> {_quote_edge(head)}"
        self.body.append(f"\t{ends}{_attributes(label, attrs)}\n")

    @property
    def source(self) -> str:
        lines = [f"digraph {quote(self.name)} {{\n" if self.name else "digraph {\n"]
        for kind, attrs in (
            ("graph", self.graph_attr),
            ("node", self.node_attr),
            ("edge", self.edge_attr),
        ):
            if attrs:
                lines.append(f"\t{kind}{_attributes(None, attrs)}\n")
        return "".join([*lines, *self.body, "}\n"])

    def pipe(self, format: str = "svg", encoding: str = "utf-8") -> str:
        """The graph rendered by Graphviz's ``dot`` program (:class:`GraphvizMissingError`, a
        ``RuntimeError``, when it is not on ``PATH``; ``CalledProcessError`` when it fails)."""
        program = shutil.which("dot")
        if program is None:
            raise GraphvizMissingError(MISSING_DOT)
        done = subprocess.run(
            [program, f"-K{self.engine}", f"-T{format}"],
            input=self.source.encode(encoding),
            capture_output=True,
            check=True,
        )
        return done.stdout.decode(encoding)

"""A griffe extension for the API reference: the package's reST docstring habits, in Markdown.

The docstrings are written for ``help()`` and doctest, in reST: ``>>>`` examples, roles such as
:class:`Outcome`, and ``.. versionadded::``. Markdown would read an example's output
``[('r1', 'finished')]`` as a link and its ``>>>`` prompts as quotes; this turns examples into
``pycon`` code blocks, roles into inline code and directives into a sentence. It changes only what
mkdocstrings renders, never the package.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(
    r":(?:py:)?(?:class|meth|func|attr|data|mod|exc|obj):`~?([^`<]*?)\s*(?:<[^>]*>)?`"
)
_DIRECTIVE = re.compile(r"^(\s*)\.\. versionadded:: (\S+)\s*$")


def _role(match: re.Match[str]) -> str:
    text = match.group(1).strip()
    if match.group(0).split("`", 1)[1].startswith("~"):
        text = text.rsplit(".", 1)[-1]
    return f"`{text}`"


def markdown(docstring: str) -> str:
    out: list[str] = []
    in_example = False
    for line in docstring.splitlines():
        stripped = line.strip()
        if not in_example and stripped.startswith(">>>"):
            indent = line[: len(line) - len(line.lstrip())]
            out += [f"{indent}```pycon"]
            in_example = True
        elif in_example and not stripped:
            out += [f"{indent}```"]
            in_example = False
        if in_example:
            out.append(line)
            continue
        directive = _DIRECTIVE.match(line)
        if directive:
            out.append(f"{directive[1]}*Added in version {directive[2]}.*")
            continue
        out.append(_ROLE.sub(_role, line))
    if in_example:
        out.append(f"{indent}```")
    return "\n".join(out)


class ReSTDocstrings(griffe.Extension):
    """Rewrites every docstring once the object tree is complete."""

    def __init__(self) -> None:
        super().__init__()
        self._done: set[int] = set()

    def _rewrite(self, obj: griffe.Object) -> None:
        docstring = obj.docstring
        if docstring is not None and id(docstring) not in self._done:
            self._done.add(id(docstring))
            docstring.value = markdown(docstring.value)

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        self._rewrite(obj)

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        self._rewrite(obj)  # the package's own docstring is complete only here

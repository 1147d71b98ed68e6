"""The API reference, docs/api.md, written from the package's docstrings.

A reader meets the reference in two places: the repository page, where only plain Markdown
renders, and the site. So the reference is plain Markdown, generated: every public name of
the modules in :data:`SECTIONS` (their ``__all__``), each class's public methods and
properties, each with its signature and the first paragraphs of its docstring, the reST roles
and literals the docstrings use for ``help()`` turned into Markdown code. The docstrings stay
the one source: ``make api-docs`` (``python tools/apidoc.py``) rewrites the page, and
``tests/test_apidoc.py`` fails when the committed page is not what this writes today
(``python tools/apidoc.py --check`` says the same).

On the site, :func:`on_page_markdown` (an mkdocs hook, mkdocs.yml) gives each heading of the
page the id of the name it documents (``multiconnector.MultiConnector.take``), so that the
other pages' cross-references (``[take()][multiconnector.MultiConnector.take]``) resolve to it;
the committed file keeps headings a repository page renders cleanly.
"""

from __future__ import annotations

import argparse
import ast
import enum
import importlib
import inspect
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, Final

ROOT: Final = Path(__file__).resolve().parent.parent
PAGE: Final = ROOT / "docs" / "api.md"
REGENERATE: Final = "make api-docs  (or: python tools/apidoc.py)"

#: The documented modules, in page order, each with what the page says it is for. A name
#: documented in an earlier section is listed again as a link (``multiconnector.vllm`` re-exports
#: ``SaveLedger``).
SECTIONS: Final = (
    ("multiconnector", "The library: the registry, the aggregator, its records and outcomes."),
    ("multiconnector.vllm", "The drop-in for vLLM's `MultiConnector` (docs/vllm.md)."),
    ("multiconnector.check", "The model checker (docs/check.md)."),
    ("multiconnector.usermachine", "Checking and drawing your own machine (docs/usermachine.md)."),
    ("multiconnector.machine", "The request state machine's one declaration."),
    ("multiconnector.health", "A child's health machine's one declaration."),
    ("multiconnector.healthbook", "Every child's health in one composition, on an injected clock."),
    ("multiconnector.rule", "The report rule: what a report does to a record, as pure functions."),
    ("multiconnector.diagram", "The diagrams drawn from the declaration (docs/diagrams.md)."),
    ("multiconnector.errors", "Every error the package raises, under one root."),
)

#: At most this many paragraphs of a docstring; a docstring's examples, literal blocks and
#: directives end it sooner (``help()`` shows the whole).
PARAGRAPHS: Final = 2
_LONG_VALUE: Final = 80

_ROLE = re.compile(
    r":(?:py:)?(?:class|meth|func|attr|data|mod|exc|obj):`(~?)([^`<]*?)\s*(?:<[^>]*>)?`"
)
_LITERAL = re.compile(r"``(.+?)``")
_CODE_SPAN = re.compile(r"(`[^`]*`)")
_FIELD = re.compile(r"^:[\w ]+:(\s|$)")  # a field list (:param x:, :returns:) ends the text


def _role(match: re.Match[str]) -> str:
    text = match[2].strip()
    return f"`{text.rsplit('.', 1)[-1] if match[1] else text}`"


def _escaped(text: str) -> str:
    """``text`` with ``<`` and ``>`` escaped outside code spans (Markdown reads ``<x>`` as HTML)."""
    parts = _CODE_SPAN.split(text)
    return "".join(
        part if i % 2 else part.replace("<", "&lt;").replace(">", "&gt;")
        for i, part in enumerate(parts)
    )


def markdown(docstring: str | None) -> str:
    """The first paragraphs of a reST ``docstring``, as Markdown (empty when there is none).

    >>> markdown(":class:`~multiconnector.Outcome` says why, in ``Outcome.phantom``.\\n\\n>>> 1")
    '`Outcome` says why, in `Outcome.phantom`.'
    """
    if not docstring:
        return ""
    kept: list[str] = []
    for paragraph in inspect.cleandoc(docstring).split("\n\n"):
        lines = paragraph.strip("\n").splitlines()
        if not lines or lines[0].startswith((">>>", "..", " ")) or _FIELD.match(lines[0]):
            break
        if len(kept) >= PARAGRAPHS and not kept[-1].endswith(":"):
            break
        text = "\n".join(_inline(item) for item in _items(lines))
        ends_block = text.endswith("::")
        kept.append(text[:-1] if ends_block else text)
        if ends_block:
            break
    return "\n\n".join(kept)


def _items(lines: list[str]) -> list[str]:
    """A paragraph's lines as one line, or a reST bullet list's items as Markdown items, each
    one line."""
    if not lines[0].startswith(("* ", "- ")):
        return [" ".join(line.strip() for line in lines)]
    items: list[str] = []
    for line in lines:
        if line.startswith(("* ", "- ")):
            items.append("- " + line[2:].strip())
        elif items:
            items[-1] += " " + line.strip()
    return items


def _inline(text: str) -> str:
    return _escaped(_LITERAL.sub(r"`\1`", _ROLE.sub(_role, text)))


def _annotation(value: Any) -> str:
    if value is inspect.Parameter.empty:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, type):
        return value.__name__
    return str(value).replace("typing.", "")


def _default(value: Any) -> str:
    if callable(value) and hasattr(value, "__qualname__"):
        return str(value.__qualname__)
    shown = _repr(value)
    return shown if " at 0x" not in shown else type(value).__name__


def signature(obj: Any, name: str) -> str:
    """``name(parameters) -> return``, its annotations as written (strings are not evaluated)."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return f"{name}(...)"
    shown: list[str] = []
    star_done = False
    kinds = inspect.Parameter
    params = list(sig.parameters.values())
    if params and params[0].name in ("self", "cls"):
        sig = sig.replace(parameters=params[1:])
    for param in sig.parameters.values():
        if param.kind is kinds.KEYWORD_ONLY and not star_done:
            shown.append("*")
        star_done = star_done or param.kind in (kinds.KEYWORD_ONLY, kinds.VAR_POSITIONAL)
        prefix = "*" if param.kind is kinds.VAR_POSITIONAL else ""
        prefix = "**" if param.kind is kinds.VAR_KEYWORD else prefix
        text = prefix + param.name
        note = _annotation(param.annotation)
        if note:
            text += f": {note}"
        if param.default is not kinds.empty:
            text += f" = {_default(param.default)}" if note else f"={_default(param.default)}"
        shown.append(text)
        if param.kind is kinds.POSITIONAL_ONLY and _last_positional_only(sig, param.name):
            shown.append("/")
    returns = "" if inspect.isclass(obj) else _annotation(sig.return_annotation)
    return f"{name}({', '.join(shown)})" + (f" -> {returns}" if returns else "")


def _last_positional_only(sig: inspect.Signature, name: str) -> bool:
    kinds = [p.kind for p in sig.parameters.values()]
    names = list(sig.parameters)
    i = names.index(name)
    return i + 1 == len(kinds) or kinds[i + 1] is not inspect.Parameter.POSITIONAL_ONLY


# -- what the source says beside names: `#:` comments and attribute docstrings ------------------


def _source_notes(module_name: str) -> dict[str, str]:
    """``{name: note}`` for a module's top-level names and its classes' attributes
    (``Class.attr``): a ``#:`` comment above the assignment, or a string right after it."""
    module = importlib.import_module(module_name)
    try:
        return _file_notes(Path(inspect.getfile(module)))
    except (OSError, TypeError):
        return {}


def _file_notes(path: Path) -> dict[str, str]:
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    notes: dict[str, str] = {}

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for i, node in enumerate(body):
            if isinstance(node, ast.ClassDef):
                walk(node.body, f"{prefix}{node.name}.")
                continue
            target = _assigned(node)
            if target is None:
                continue
            comment = _comment_above(lines, node.lineno - 1)
            after = body[i + 1] if i + 1 < len(body) else None
            if (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                comment = after.value.value
            if comment:
                notes[prefix + target] = comment

    walk(ast.parse(source).body, "")
    return notes


def _assigned(node: ast.stmt) -> str | None:
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
    elif isinstance(node, ast.AnnAssign):
        target = node.target
    else:
        return None
    return target.id if isinstance(target, ast.Name) else None


def _comment_above(lines: list[str], index: int) -> str:
    found: list[str] = []
    while index > 0 and lines[index - 1].strip().startswith("#:"):
        index -= 1
        found.insert(0, lines[index].strip()[2:].strip())
    return " ".join(found)


def _package_notes(module: ModuleType) -> dict[str, str]:
    """:func:`_source_notes` of ``module`` and, for a package, of the files under it, read, not
    imported (a constant re-exported by ``__init__`` has its comment where it is defined); the
    package's own win."""
    notes: dict[str, str] = {}
    if hasattr(module, "__path__"):
        for path in sorted(Path(inspect.getfile(module)).parent.rglob("*.py")):
            notes.update(_file_notes(path))
    return notes | _source_notes(module.__name__)


def _notes_for(obj: Any, fallback: str) -> dict[str, str]:
    module_name = getattr(obj, "__module__", None) or fallback
    try:
        return _source_notes(module_name)
    except ImportError:
        return {}


# -- the page -----------------------------------------------------------------------------------


def _members(cls: type[Any]) -> Iterator[tuple[str, Any]]:
    """The public methods and properties ``cls`` has from the package's own classes, in the
    order they are defined (a base class's first), each once."""
    seen: set[str] = set()
    for base in reversed(cls.__mro__):
        if not base.__module__.startswith("multiconnector"):
            continue
        for name, found in vars(base).items():
            if name.startswith("_") or name in seen:
                continue
            value = found.__func__ if isinstance(found, staticmethod | classmethod) else found
            if inspect.isfunction(value) or isinstance(value, property):
                seen.add(name)
                yield name, getattr(cls, name, value) if not isinstance(value, property) else value
    # a name a subclass overrides is listed where the base defined it, with the subclass's object


def _class_lines(cls: type[Any], name: str, module_name: str) -> list[str]:
    lines = [f"### `{name}`", ""]
    if issubclass(cls, enum.Enum):
        bases = ", ".join(b.__name__ for b in cls.__bases__)
        lines += [f"`class {name}({bases})`", "", *_paragraph(markdown(cls.__doc__))]
        notes = _notes_for(cls, module_name)
        for member in cls:
            note = markdown(notes.get(f"{cls.__name__}.{member.name}", ""))
            lines.append(f"- `{member.name}`" + (f": {note}" if note else ""))
        return [*lines, "", *_member_lines(cls, name)]
    if issubclass(cls, BaseException) or getattr(cls, "_is_protocol", False):
        bases = ", ".join(b.__name__ for b in cls.__bases__)
        lines += [f"`class {name}({bases})`", ""]
    else:
        lines += [f"`class {signature(cls, name)}`", ""]
    lines += _paragraph(markdown(cls.__doc__))
    return lines + _member_lines(cls, name)


def _member_lines(cls: type[Any], name: str) -> list[str]:
    lines: list[str] = []
    for member, value in _members(cls):
        if isinstance(value, property):
            lines += [f"#### `{name}.{member}`", "", "*property*", ""]
            lines += _paragraph(markdown(value.__doc__))
            continue
        lines += [f"#### `{name}.{member}`", "", f"`{signature(value, member)}`", ""]
        lines += _paragraph(markdown(value.__doc__))
    return lines


def _paragraph(text: str) -> list[str]:
    return [text, ""] if text else []


def _repr(value: Any) -> str:
    """``repr(value)``, the same in every process: a set's items sorted (their order follows
    the string hash, which differs from run to run), an enum member as ``Class.name``."""
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, set | frozenset):
        items = ", ".join(sorted(_repr(item) for item in value))
        return f"{type(value).__name__}({{{items}}})" if value else f"{type(value).__name__}()"
    if isinstance(value, tuple | list) and not hasattr(value, "_fields"):
        items = ", ".join(_repr(item) for item in value)
        comma = "," if isinstance(value, tuple) and len(value) == 1 else ""
        return f"({items}{comma})" if isinstance(value, tuple) else f"[{items}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_repr(k)}: {_repr(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _value_lines(name: str, value: Any, note: str) -> list[str]:
    shown = _repr(value)
    if len(shown) > _LONG_VALUE or " at 0x" in shown:
        sized = isinstance(value, tuple | list | dict | set | frozenset)
        shown = f"{type(value).__name__} of {len(value)}" if sized else ""
        code = f"`{name}`" + (f" ({shown})" if shown else "")
    else:
        code = f"`{name} = {shown}`"
    return [f"- {code}" + (f": {markdown(note)}" if note else "")]


def section(module_name: str, purpose: str, documented: dict[int, str]) -> list[str]:
    """The lines of one module's section; ``documented`` maps each object already written (by
    ``id``) to its anchor, and grows with this section's."""
    module = importlib.import_module(module_name)
    lines = [f"## `{module_name}`", "", purpose, "", *_paragraph(markdown(module.__doc__))]
    names = list(getattr(module, "__all__", ()))
    values: list[str] = []
    notes = _package_notes(module)
    for name in names:
        obj = getattr(module, name)
        anchor = f"{module_name}.{name}"
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and id(obj) in documented:
            values.append(f"- `{name}`: `{documented[id(obj)]}`, above")
            continue
        if inspect.isclass(obj):
            documented[id(obj)] = anchor
            lines += _class_lines(obj, name, module_name)
        elif inspect.isfunction(obj):
            documented[id(obj)] = anchor
            lines += [f"### `{name}`", "", f"`{signature(obj, name)}`", ""]
            lines += _paragraph(markdown(obj.__doc__))
        else:
            values += _value_lines(name, obj, notes.get(name, ""))
    if values:
        lines += ["### Constants and re-exports", "", *values, ""]
    return lines


def slug(heading: str) -> str:
    """The anchor a repository page gives a heading: lower case, punctuation dropped.

    >>> slug("`multiconnector.vllm`")
    'multiconnectorvllm'
    """
    return re.sub(r"[^\w -]", "", heading.lower()).replace(" ", "-")


def render() -> str:
    """The whole page, as :data:`PAGE` must read."""
    documented: dict[int, str] = {}
    body: list[str] = []
    for module_name, purpose in SECTIONS:
        body += section(module_name, purpose, documented)
    contents = [f"- [`{m}`](#{slug(m)}): {p}" for m, p in SECTIONS]
    head = [
        "# API reference",
        "",
        "<!-- Generated from the docstrings by tools/apidoc.py: do not edit. "
        "`make api-docs` rewrites it; tests/test_apidoc.py fails when it is stale. -->",
        "",
        "Every public name, each public method with its signature and the first paragraphs of "
        "its docstring (`help()` shows the whole, with examples).",
        "",
        *contents,
        "",
    ]
    text = "\n".join(head + body)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"


# -- the site: headings get the ids of their names ----------------------------------------------

_HEADING = re.compile(r"^(#{2,4}) `([\w.]+)`$")


def anchored(markdown_text: str) -> str:
    """``markdown_text`` (this page) with ``{#id}`` on each name's heading: the module's for a
    section, ``module.Name`` and ``module.Name.method`` below it (mkdocs' attr_list); the
    links to a section's repository-page anchor then point to that id."""
    module = ""
    out: list[str] = []
    sections: dict[str, str] = {}
    for line in markdown_text.splitlines():
        found = _HEADING.match(line)
        if found:
            level, name = found[1], found[2]
            module = name if level == "##" else module
            anchor = name if level == "##" else f"{module}.{name}"
            if level == "##":
                sections.setdefault(slug(name), anchor)
            out.append(f"{line} {{#{anchor}}}")
        else:
            out.append(line)
    text = "\n".join(out) + "\n"
    return re.sub(r"\]\(#([\w-]+)\)", lambda m: f"](#{sections.get(m[1], m[1])})", text)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """mkdocs hook: the API page's headings get their names' ids (:func:`anchored`)."""
    return anchored(markdown) if page.file.src_uri == "api.md" else markdown


def main(argv: list[str] | None = None, write: Callable[[str], object] = print) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/api.md is stale")
    args = parser.parse_args(argv)
    fresh = render()
    if args.check:
        if PAGE.read_text(encoding="utf-8") != fresh:
            write(f"docs/api.md is stale: regenerate it with {REGENERATE}")
            return 1
        return 0
    PAGE.write_text(fresh, encoding="utf-8")
    write(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))  # the checkout's package, not an installed one
    sys.exit(main())

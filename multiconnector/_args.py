"""What every command's argument parsing shares.

* :class:`Parser`: a usage error is one line on stderr and exit status 2; help is plain text.
* :func:`plain`: docstring markup (````x````, ``:class:`~a.B```) rendered as plain text.
* :func:`output_file`, :func:`output_dir`: output paths checked while the arguments are parsed,
  before any work starts. A directory, a missing parent folder, or a place that cannot be
  written is a usage error; no parent folder is ever created.
* :func:`name_list`: a comma-separated list of connector names, each by the library's name rule.
* :func:`read_json`: the JSON document an option names (``-``: standard input).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

from ._validate import name_problem
from .errors import InvalidJSONError

__all__ = [
    "Parser",
    "name_list",
    "output_dir",
    "output_file",
    "plain",
    "read_json",
    "split_list",
    "unique_list",
]

_ROLE = re.compile(r":[a-z]+:`~?([^`<]*?)\s*(?:<[^>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``")


def plain(text: str) -> str:
    """``text`` with reStructuredText roles and literals reduced to their words."""

    def role(match: re.Match[str]) -> str:
        target = match.group(1)
        return target.rsplit(".", 1)[-1] if "." in target and " " not in target else target

    return _LITERAL.sub(r"\1", _ROLE.sub(role, text))


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one line: ``PROG: error: ... (see --help)``."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        for key in ("description", "epilog"):
            if isinstance(kwargs.get(key), str):
                kwargs[key] = plain(kwargs[key])  # type: ignore[arg-type]
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        message = " ".join(message.split())  # one line, whatever argparse composed
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def split_list(text: str, what: str) -> list[str]:
    """The items of a comma-separated list; an empty list or an empty item is an error."""
    items = [item.strip() for item in text.split(",")]
    if not text.strip():
        raise argparse.ArgumentTypeError(f"an empty list; give one or more {what}, comma-separated")
    if "" in items:
        raise argparse.ArgumentTypeError(
            f"{text!r} has an empty item; give {what}, comma-separated"
        )
    return items


def unique_list(text: str, what: str) -> list[str]:
    """:func:`split_list`, with no item given twice."""
    return _once(split_list(text, what))


def _once(items: list[str]) -> list[str]:
    twice = sorted({n for n in items if items.count(n) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"{', '.join(map(repr, twice))} given twice")
    return items


def name_list(text: str) -> list[str]:
    """Connector names, comma-separated, each by the library's name rule, none twice."""
    names = split_list(text, "connector names")
    for name in names:
        _check_name(name)
    return _once(names)


def read_json(file: str) -> Any:
    """The JSON document in ``file`` (``"-"``: standard input), for an option naming it.

    Raises :class:`OSError` when it cannot be read (standard input closed included) and
    :class:`~multiconnector.errors.InvalidJSONError` (a ``ValueError``) when it is not JSON:
    not UTF-8, malformed, or nested too deeply for the parser (its :class:`RecursionError`).
    """
    try:
        if file == "-":
            if sys.stdin is None:  # the command was started with its stdin closed
                raise OSError("standard input is closed")
            text = sys.stdin.read()
        else:
            with open(file, encoding="utf-8") as fh:
                text = fh.read()
    except UnicodeDecodeError as exc:
        raise InvalidJSONError(f"not UTF-8 text: {exc}") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise InvalidJSONError("nested too deeply to read") from None
    except ValueError as exc:  # json.JSONDecodeError
        raise InvalidJSONError(str(exc)) from None


def _check_name(name: str) -> None:
    problem = name_problem(name)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"connector name {name!r} {problem}")


def _unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written as a file, or ``None``; leaves no file behind."""
    if path.is_dir():
        return "is a directory"
    parent = path.parent
    if not parent.exists():
        return f"folder {str(parent)!r} does not exist (it is not created)"
    if not parent.is_dir():
        return f"{str(parent)!r} is not a folder"
    existed = path.exists()
    try:
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        return f"cannot be written: {exc.strerror or exc}"
    if not existed:
        with contextlib.suppress(OSError):  # created a moment ago
            path.unlink()
    return None


def output_file(text: str) -> Path:
    """An argparse type: a file the command can write, checked now (before any work)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    path = Path(text)
    problem = _unwritable(path)
    if problem is not None:
        raise argparse.ArgumentTypeError(f"{text}: {problem}")
    return path


def output_dir(text: str, files: Iterable[str] = ()) -> Path:
    """A folder the command can write ``files`` into; created (never its parents) if missing."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is not a folder")
    if not path.exists():
        if not path.parent.is_dir():
            raise argparse.ArgumentTypeError(
                f"{text}: folder {str(path.parent)!r} does not exist (it is not created)"
            )
        try:
            os.mkdir(path)
        except OSError as exc:
            raise argparse.ArgumentTypeError(
                f"{text}: cannot be created: {exc.strerror or exc}"
            ) from None
    for name in files:
        problem = _unwritable(path / name)
        if problem is not None:
            raise argparse.ArgumentTypeError(f"{text}: {name} {problem}")
    return path

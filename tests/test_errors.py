"""The errors tree in multiconnector.errors' docstring, and ConnectorFailures' split."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
import warnings
from pathlib import Path

import pytest

import multiconnector
from multiconnector import errors
from multiconnector._args import read_json
from multiconnector._dot import Digraph
from multiconnector.diagram import render
from multiconnector.errors import ConnectorFailures, KeyClashError, MultiConnectorError

#: A line of the tree: its indent (the depth) and the class it names.
_LINE = re.compile(r"^(?P<indent>[ │]*)[├└]── (?P<name>\w+)")


def _documented() -> dict[str, str]:
    """Each class the tree lists, with its parent in the tree."""
    parents: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        match = _LINE.match(line)
        if match is None:
            continue
        depth, name = len(match["indent"]), match["name"]
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[name] = stack[-1][1] if stack else "Exception"
        stack.append((depth, name))
    return parents


def _defined() -> dict[str, str]:
    """Each subclass of MultiConnectorError in the package, with its parent in that tree."""
    packages = [multiconnector]
    while packages:  # pkgutil.walk_packages would import the adapter's package, below
        package = packages.pop()
        for module in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
            if module.name.endswith("__main__") or module.name == _ADAPTER:
                continue
            imported = importlib.import_module(module.name)
            if module.ispkg:
                packages.append(imported)
    if _HAS_VLLM:
        # torch and vLLM warn about their own deprecations while importing (as in
        # tests/adapter/conftest.py): not ours to fix.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(f"{_ADAPTER}.errors")
    parents = {"MultiConnectorError": "Exception"}
    todo: list[type[BaseException]] = [MultiConnectorError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.startswith("multiconnector."):  # not a test's own subclass
                parents[sub.__name__] = cls.__name__
                todo.append(sub)
    return parents


_ADAPTER = "multiconnector.vllm"
_HAS_VLLM = importlib.util.find_spec("vllm") is not None
#: The vLLM adapter's errors, listed in the tree; defined only where vLLM imports.
_ADAPTERS = {
    "ChildAnswerError",
    "ChildClassError",
    "ChildStartError",
    "ChildrenConflictError",
    "HMAUnsupportedError",
    "LookupPatienceError",
    "MetadataMismatchError",
    "SlowLookupError",
    "UncomposedHookError",
    "WrongRoleError",
}


def test_the_errors_tree_is_every_error_class_under_its_parent() -> None:
    documented = _documented()
    defined = _defined()
    if not _HAS_VLLM:
        documented = {k: v for k, v in documented.items() if k not in _ADAPTERS}
    assert documented == defined


def test_every_core_error_is_defined_in_the_errors_module() -> None:
    core = {k for k in _documented() if k not in _ADAPTERS and k != "MultiConnectorError"}
    assert core == set(errors.__all__) - {"MultiConnectorError"}
    for name in core:
        assert getattr(errors, name).__module__ == "multiconnector.errors", name


def test_unknown_property_error_is_one_class_wherever_imported() -> None:
    check = importlib.import_module("multiconnector.check")
    assert check.UnknownPropertyError is errors.UnknownPropertyError
    assert issubclass(errors.UnknownPropertyError, KeyError)
    assert str(errors.UnknownPropertyError("no property 'x'")) == "no property 'x'"


def _failures() -> ConnectorFailures:
    clash = KeyClashError({"k": ("a", "b")})
    return ConnectorFailures(
        "3 failure(s)",
        [RuntimeError("a"), ValueError("b"), ExceptionGroup("c", [OSError(), KeyError()]), clash],
        failed=["a", "b", "c"],  # the clash, last, names no connector
        result=("applied", None),
    )


def test_split_keeps_only_the_names_of_the_failures_it_keeps() -> None:
    group = _failures()
    runtime, rest = group.split(RuntimeError)
    assert runtime is not None and rest is not None
    assert runtime.failed == ("a",) and runtime.result == ("applied", None)
    assert rest.failed == ("b", "c")  # and the clash, unnamed
    assert len(rest.exceptions) == 3
    values, others = group.split(ValueError)  # the clash is a ValueError too
    assert values is not None and others is not None
    assert values.failed == ("b",) and len(values.exceptions) == 2
    assert others.failed == ("a", "c")


def test_a_nested_group_partly_kept_keeps_its_connectors_name() -> None:
    group = _failures()
    oserrors = group.subgroup(OSError)
    assert oserrors is not None
    assert oserrors.failed == ("c",)
    (inner,) = oserrors.exceptions
    assert isinstance(inner, ExceptionGroup) and len(inner.exceptions) == 1
    nothing = group.subgroup(ZeroDivisionError)
    assert nothing is None


@pytest.mark.parametrize("kind", [RuntimeError, OSError, KeyClashError])
def test_names_and_exceptions_stay_paired_after_split(kind: type[Exception]) -> None:
    kept, rest = _failures().split(kind)
    for part in (kept, rest):
        assert part is not None
        assert len(part.failed) in {len(part.exceptions), len(part.exceptions) - 1}


# -- the errors the commands' helpers raise: under the root too --------------------------------


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"{", "Expecting property name"),
        (b"[" * 100_000 + b"]" * 100_000, "nested too deeply"),
        (b"\x00\xff\xfe\x01", "not UTF-8"),
    ],
)
def test_a_file_that_is_not_json_is_an_invalid_json_error(
    tmp_path: Path, content: bytes, said: str
) -> None:
    file = tmp_path / "x.json"
    file.write_bytes(content)
    with pytest.raises(errors.InvalidJSONError, match=said) as caught:
        read_json(str(file))
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, MultiConnectorError)


def test_svg_without_dot_is_a_graphviz_missing_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "")
    for draw in (lambda: Digraph("g").pipe(), lambda: render("svg")):
        with pytest.raises(errors.GraphvizMissingError, match="apt-get install graphviz") as caught:
            draw()
        assert isinstance(caught.value, RuntimeError)
        assert isinstance(caught.value, MultiConnectorError)


def test_connector_failures_name_the_connectors_that_failed() -> None:
    """A message that does not name them is completed; one that does is kept as it is."""
    errors = [RuntimeError("x"), ValueError("y")]
    group = ConnectorFailures("2 failure(s) while finishing request 'r'", errors, failed=["a", "b"])
    assert group.message == "2 failure(s) while finishing request 'r' (connectors: a, b)"
    assert "(connectors: a, b)" in str(group)
    listed = ConnectorFailures("2 failed to shut down: a, b", errors, failed=["a", "b"])
    assert listed.message == "2 failed to shut down: a, b"
    one = ConnectorFailures("connector 'a' raised in its callback", errors[:1], failed=["a"])
    assert one.message == "connector 'a' raised in its callback"
    part = group.split(ValueError)[0]
    assert part is not None and part.failed == ("b",) and part.message == group.message

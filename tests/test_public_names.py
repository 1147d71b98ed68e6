"""A caller's mistakes are reported against ``MultiConnector``, not the base holding a method.

``MultiConnector`` is assembled from one base per concept (``multiconnector/aggregator/``); a
caller sees one class. Python's own arity errors and mypy's messages must name it.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from multiconnector import MultiConnector, aggregator

SOURCE = Path(aggregator.__file__)


def _function(name: str) -> Any:
    member = inspect.getattr_static(MultiConnector, name)
    return member.fget if isinstance(member, property) else member


@pytest.mark.parametrize("name", aggregator.PUBLIC)
def test_every_public_function_is_named_after_the_class(name: str) -> None:
    function = _function(name)
    assert function.__qualname__ == f"MultiConnector.{name}"
    assert function.__name__ == name  # help() and the docs read the same name


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda mc: mc.request_finished(), "MultiConnector.request_finished() missing 1 required"),
        (lambda mc: mc.begin(), "MultiConnector.begin() missing 1 required"),
        (lambda mc: mc.cancel("a", "b"), "MultiConnector.cancel() takes 2 positional"),
        (lambda mc: mc.take(1), "MultiConnector.take() takes 1 positional"),
        (lambda mc: mc.oldest(1, 2), "MultiConnector.oldest() takes from 1 to 2 positional"),
        (lambda mc: mc.transfer_finished("r"), "MultiConnector.transfer_finished() missing"),
        (lambda mc: mc.match_tokens(r="x"), "MultiConnector.match_tokens() got an unexpected"),
        (lambda mc: MultiConnector(bogus=1), "MultiConnector.__init__() got an unexpected"),
    ],
)
def test_an_arity_error_names_multiconnector(call: Any, words: str) -> None:
    with pytest.raises(TypeError) as info:
        call(MultiConnector())
    assert str(info.value).startswith(words), str(info.value)
    for base in ("Lifecycle", "Saving", "Reports", "Loading", "Queries", "Books"):
        assert base not in str(info.value)


def _declared() -> dict[str, ast.FunctionDef]:
    """The functions ``MultiConnector``'s body declares under ``if TYPE_CHECKING:``."""
    tree = ast.parse(SOURCE.read_text(encoding="utf-8"))
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "MultiConnector"]
    (block,) = [n for n in cls.body if isinstance(n, ast.If)]
    assert ast.unparse(block.test) == "TYPE_CHECKING"
    return {n.name: n for n in block.body if isinstance(n, ast.FunctionDef)}


def _shape(node: ast.FunctionDef) -> str:
    return ast.dump(node.args) + " -> " + ast.dump(node.returns or ast.Constant(None))


def test_the_declarations_for_type_checkers_are_the_bases_signatures() -> None:
    declared = _declared()
    assert set(declared) == {n for n in aggregator.PUBLIC if not n.startswith("_")}
    for name, node in declared.items():
        source = textwrap.dedent(inspect.getsource(_function(name)))
        (defined,) = ast.parse(source).body
        assert isinstance(defined, ast.FunctionDef)
        assert _shape(node) == _shape(defined), name
        assert [ast.unparse(d) for d in node.decorator_list] == [
            ast.unparse(d) for d in defined.decorator_list
        ], name


USER_CODE = """\
from multiconnector import MultiConnector

mc = MultiConnector()
mc.request_finished()
mc.begin(3)
mc.cancel("a", "b")
reveal_type(mc.registry)
"""


@pytest.mark.timeout(120)  # about 1 s; more on a loaded machine
def test_mypy_names_multiconnector_in_a_users_wrong_call(tmp_path: Path) -> None:
    from mypy import api  # noqa: PLC0415

    user = tmp_path / "user.py"
    user.write_text(USER_CODE, encoding="utf-8")
    started = time.perf_counter()
    out, err, status = api.run(
        ["--strict", "--no-incremental", "--cache-dir", str(tmp_path / "cache"), str(user)]
    )
    seconds = time.perf_counter() - started
    assert status == 1, out + err
    assert 'Missing positional argument "request_id" in call to "request_finished" of ' in out
    assert '"request_finished" of "MultiConnector"' in out
    assert 'Argument 1 to "begin" of "MultiConnector" has incompatible type "int"' in out
    assert 'Too many arguments for "cancel" of "MultiConnector"' in out
    assert 'Revealed type is "multiconnector.registry.ConnectorRegistry"' in out
    for base in ("Lifecycle", "Saving", "Reports", "Loading", "Queries", "Books"):
        assert f'"{base}"' not in out, out
    assert seconds < 110

"""The house has no circles: ``tools/imports.py``'s graph of ``multiconnector/`` and ``bench/``.

Every import counts (on demand, under ``TYPE_CHECKING``, ``importlib.import_module``), between
modules and between rooms (top-level modules and subpackages). No module imports another
package's private names or a private module from outside its package, and nothing puts
``tests/`` on ``sys.path``.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("imports_tool", ROOT / "tools" / "imports.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


tool = _tool()

#: ``sys.path`` edits that are features, not shortcuts between folders of this repository.
ALLOWED_PATH_EDITS = {
    # ``load("module:attr")`` searches the current directory first, as ``python -m`` does.
    "multiconnector.usermachine.declaration",
    # the A/B runners import other checkouts' copies of the package from a temporary folder.
    "bench.ab_loop",
    "bench.ab_lifecycle",
}


@pytest.fixture(scope="module")
def graph() -> Any:
    return tool.build(ROOT)


def test_no_module_cycle(graph: Any) -> None:
    assert tool.cycles(graph.arrows) == []


def test_no_room_cycle(graph: Any) -> None:
    assert tool.cycles(graph.room_arrows) == []


def test_no_private_name_crosses_a_package(graph: Any) -> None:
    assert [f"{i.importer}:{i.line} {i.target}.{i.name}" for i in graph.crossings()] == []


def test_nothing_edits_sys_path_into_another_folder(graph: Any) -> None:
    edits = {module for module, _ in graph.path_edits}
    assert edits <= ALLOWED_PATH_EDITS
    for module in edits:
        assert "tests" not in graph.modules[module].read_text()


def test_the_tool_finds_what_it_should(tmp_path: Path) -> None:
    """A planted cycle (one arrow on demand, one under TYPE_CHECKING), a planted crossing of a
    private name and of a private module (used from its own package, it is no crossing), and
    the floors: the tests above can fail."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "base.py": "_HIDDEN = 1\nVISIBLE = 2\n",
        "_inner.py": "X = 1\n",
        "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
        "b.py": "def f():\n    from . import a\nB = 1\n",
        "sub/__init__.py": "",
        "sub/user.py": "from ..base import _HIDDEN, VISIBLE\nfrom .. import _inner\n",
        "../other/user.py": "from pkg._inner import X\n",
        "sub/lazy.py": "import importlib\nimportlib.import_module('pkg.base')\n",
    }
    (tmp_path / "other").mkdir()
    for name, text in files.items():
        (pkg / name).write_text(textwrap.dedent(text))
    graph = tool.build(tmp_path, ("pkg", "other"))
    assert tool.cycles(graph.arrows) == [["pkg.a", "pkg.b"]]
    assert tool.cycles(graph.room_arrows) == [["pkg.a", "pkg.b"]]
    crossed = {(i.target, i.name) for i in graph.crossings()}
    assert crossed == {("pkg.base", "_HIDDEN"), ("pkg._inner", "X")}
    assert "pkg.base" in graph.arrows["pkg.sub.lazy"]
    levels = tool.floors(graph.room_arrows)
    assert levels["pkg.base"] == 0 and levels["pkg.sub"] == 1
    assert levels["pkg.a"] == levels["pkg.b"]


def test_the_script_prints_the_graph_and_says_whether_it_is_clean(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = tool.main([])
    out = capsys.readouterr().out
    assert "rooms by floor" in out and "module cycles:" in out and "summary:" in out
    clean = not tool.cycles(tool.build(ROOT).arrows)
    assert status == (0 if clean else 1)

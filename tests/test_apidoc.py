"""docs/api.md is what ``tools/apidoc.py`` writes from today's docstrings, and it documents
every public name: a stale or incomplete reference fails here (and so in CI's ``make test``)."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest

from tests.adapter.vllm_support import require_vllm

ROOT = Path(__file__).resolve().parent.parent


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("apidoc_tool", ROOT / "tools" / "apidoc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


tool = _tool()


@pytest.fixture(scope="module")
def fresh() -> str:
    require_vllm()  # the page documents multiconnector.vllm, which imports vLLM
    with warnings.catch_warnings():  # vLLM's own import-time warnings
        warnings.simplefilter("ignore", DeprecationWarning)
        return str(tool.render())


def test_the_committed_page_is_what_the_docstrings_give_today(fresh: str) -> None:
    committed = (ROOT / "docs" / "api.md").read_text(encoding="utf-8")
    assert committed == fresh, f"docs/api.md is stale: regenerate it with {tool.REGENERATE}"


@pytest.mark.timeout(120)  # a process that imports vLLM
def test_the_page_is_the_same_whatever_the_hash_seed(fresh: str) -> None:
    """A set's order follows the string hash, which differs from process to process: the
    page must not (``make api-docs`` on one machine, the test on another). This process has a
    random seed; the other has none (0)."""
    for seed in ("0",):
        done = subprocess.run(
            [sys.executable, "-W", "ignore", str(ROOT / "tools" / "apidoc.py"), "--check"],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": str(ROOT)},
            capture_output=True,
            text=True,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr


def test_a_stale_page_is_reported(
    fresh: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "api.md"
    said: list[str] = []
    monkeypatch.setattr(tool, "PAGE", page)
    page.write_text(fresh.replace("#### `MultiConnector.held`", "#### `MultiConnector.hold`"))
    assert tool.main(["--check"], write=said.append) == 1
    assert said == [f"docs/api.md is stale: regenerate it with {tool.REGENERATE}"]
    assert tool.main([], write=said.append) == 0 and page.read_text() == fresh
    assert tool.main(["--check"], write=said.append) == 0


def test_the_methods_newcomers_found_only_through_help_are_there(fresh: str) -> None:
    for method in ("held", "oldest", "stats", "choose_loader", "request_finished_by", "take"):
        found = re.search(rf"^#### `MultiConnector\.{method}`\n\n`{method}\((.*)$", fresh, re.M)
        assert found, f"MultiConnector.{method} has no entry with its signature"


def test_every_public_name_and_method_is_on_the_page(fresh: str) -> None:
    for module_name, _ in tool.SECTIONS:
        module = importlib.import_module(module_name)
        assert f"## `{module_name}`" in fresh
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name)
            assert f"`{name}" in fresh, f"{module_name}.{name} is not on the page"
            if not inspect.isclass(obj) or not obj.__module__.startswith("multiconnector"):
                continue
            for member, _value in tool._members(obj):
                assert f"`{obj.__name__}.{member}`" in fresh, f"{name}.{member} is missing"


def test_on_the_site_each_heading_gets_the_id_of_its_name() -> None:
    page = "- [`m`](#multiconnectorvllm)\n\n## `multiconnector.vllm`\n\n### `MultiConnector`\n\n"
    page += "#### `MultiConnector.saving`\n\n## `multiconnector`\n\n### `Outcome`\n"
    assert tool.anchored(page).splitlines() == [
        "- [`m`](#multiconnector.vllm)",
        "",
        "## `multiconnector.vllm` {#multiconnector.vllm}",
        "",
        "### `MultiConnector` {#multiconnector.vllm.MultiConnector}",
        "",
        "#### `MultiConnector.saving` {#multiconnector.vllm.MultiConnector.saving}",
        "",
        "## `multiconnector` {#multiconnector}",
        "",
        "### `Outcome` {#multiconnector.Outcome}",
    ]


def test_the_tools_own_examples_run() -> None:
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    out: list[str] = []
    for test in doctest.DocTestFinder().find(tool, "apidoc"):
        runner.run(test, out=out.append)
    assert runner.tries >= 2 and runner.failures == 0, "".join(out)

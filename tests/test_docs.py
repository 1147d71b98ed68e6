"""The documentation runs: every example in README.md and docs/, and every docstring doctest.

A page's fenced ``python`` blocks run top to bottom in one namespace, in a scratch directory, so
a later block may use what an earlier one defined. Blocks whose code starts with ``>>>`` (and
``pycon`` blocks) run as doctests. Other languages (``sh``, ``yaml``, ...) are not run.

A block may opt out only with the marker ``<!-- docs-test: skip -->`` on the line before its
fence, and only on ``docs/vllm.md``, for the vLLM configuration example (it needs a vLLM server).
A test enforces both.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil
import re
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import pytest

import multiconnector
from multiconnector import Outcome, State
from multiconnector.machine import EVENTS
from tests.adapter.vllm_support import require_vllm

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SKIP_MARKER = "<!-- docs-test: skip -->"
#: Pages where SKIP_MARKER is allowed, relative to the repository root.
MAY_SKIP = {"docs/vllm.md"}
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
#: Optional dependencies a module may need; a module that cannot import one is not doctested.
OPTIONAL = {"vllm", "torch", "rich", "graphviz"}


class Block(NamedTuple):
    lang: str
    line: int  # 1-based line of the block's first code line
    code: str
    skipped: bool


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if not fence:
            i += 1
            continue
        indent, ticks, lang = fence[1], fence[2], fence[3].lower()
        previous = next((t.strip() for t in reversed(lines[:i]) if t.strip()), "")
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(ticks):
            body.append(lines[j][len(indent) :] if lines[j].startswith(indent) else lines[j])
            j += 1
        found.append(Block(lang, i + 2, "\n".join(body) + "\n", previous == SKIP_MARKER))
        i = j + 1
    return found


def page_id(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


def run_doctest(code: str, globs: dict[str, object], name: str, line: int) -> None:
    test = doctest.DocTestParser().get_doctest(code, globs, name, name, line - 1)
    out: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test, out=out.append, clear_globs=False)
    assert runner.failures == 0, "".join(out)


#: The vLLM examples start the engine: more than the default time limit.
VLLM_MARKS = [pytest.mark.vllm, pytest.mark.timeout(300)]


#: docs/check.md's python blocks are model checks (the load side's bound: 7.5 s alone);
#: tests/test_check.py::test_docs_check_md_examples_run runs every one of them in `make test`,
#: this generic run is left to `make test-slow`.
SLOW_PAGES = {ROOT / "docs" / "check.md"}


def page_marks(page: Path) -> list[pytest.MarkDecorator]:
    if page.name == "vllm.md":
        return VLLM_MARKS
    return [pytest.mark.slow] if page in SLOW_PAGES else []


@pytest.mark.parametrize(
    "page",
    [pytest.param(p, marks=page_marks(p)) for p in PAGES],
    ids=page_id,
)
def test_page_examples_run(
    page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if page.name == "vllm.md":
        require_vllm()  # its configuration example builds vLLM's own KVTransferConfig
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(ROOT / "docs"))  # docs/docs_example.py, as `docs_example`
    namespace: dict[str, object] = {"__name__": "__docs__"}
    ran = 0
    for block in blocks(page):
        if block.skipped or block.lang not in {"python", "py", "pycon"}:
            continue
        name = f"{page_id(page)}:{block.line}"
        if block.lang == "pycon" or block.code.lstrip().startswith(">>>"):
            run_doctest(block.code, namespace, name, block.line)
        else:
            # Leading newlines keep tracebacks' line numbers those of the page.
            exec(compile("\n" * (block.line - 1) + block.code, page_id(page), "exec"), namespace)
        ran += 1
    capsys.readouterr()
    if page.name in {"index.md", "concepts.md", "diagrams.md", "README.md", "usermachine.md"}:
        assert ran > 0, f"{page_id(page)} has no python example: the parser missed them"


def test_only_the_vllm_config_example_may_opt_out() -> None:
    for page in PAGES:
        for block in blocks(page):
            if block.skipped:
                assert page_id(page) in MAY_SKIP, (
                    f"{page_id(page)}:{block.line}: only {sorted(MAY_SKIP)} may use {SKIP_MARKER}"
                )
                assert block.lang in {"python", "py"}, f"{page_id(page)}:{block.line}"


def test_block_parser_sees_markers_and_languages(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text(
        "# t\n\n```python\nx = 1\n```\n\n<!-- docs-test: skip -->\n```python\nimport vllm\n```\n"
        "\n```sh\nmake\n```\n\n- item\n\n    ```python\n    y = x\n    ```\n"
    )
    assert blocks(page) == [
        Block("python", 4, "x = 1\n", False),
        Block("python", 9, "import vllm\n", True),
        Block("sh", 13, "make\n", False),
        Block("python", 19, "y = x\n", False),
    ]


def test_a_failing_example_fails(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"Expected:\s+2\s+Got:\s+1"):
        run_doctest(">>> 1\n2\n", {}, "x", 1)


def test_concepts_cover_every_outcome_state_and_event() -> None:
    text = (ROOT / "docs" / "concepts.md").read_text(encoding="utf-8")
    for word in [*(o.value for o in Outcome), *(s.value for s in State), *EVENTS]:
        assert f"`{word}`" in text, f"docs/concepts.md does not mention `{word}`"


def modules() -> list[str]:
    """Every module of the package whose source holds a ``>>>`` example.

    Found without importing anything: a subpackage (``multiconnector.vllm``) imports optional
    dependencies, which may be missing or warn while importing.
    """
    names = []
    origin = multiconnector.__file__
    assert origin is not None
    found: list[tuple[str, str]] = [("multiconnector", origin)]
    packages = [(list(multiconnector.__path__), "multiconnector.")]
    while packages:
        path, prefix = packages.pop()
        for info in pkgutil.iter_modules(path, prefix):
            spec = info.module_finder.find_spec(info.name, None)
            assert spec is not None and spec.origin is not None
            found.append((info.name, spec.origin))
            if info.ispkg:
                assert spec.submodule_search_locations is not None
                packages.append((list(spec.submodule_search_locations), info.name + "."))
    for name, source in found:
        if ">>>" in Path(source).read_text(encoding="utf-8"):
            names.append(name)
    return sorted(names)


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=VLLM_MARKS) if "vllm" in n else n for n in modules()],
)
def test_docstring_examples_run(name: str) -> None:
    try:
        with warnings.catch_warnings():  # an optional dependency's own import-time warnings
            warnings.simplefilter("ignore", DeprecationWarning)
            module: ModuleType = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if name == "multiconnector.vllm" or name.startswith("multiconnector.vllm."):
            require_vllm()  # skips locally, fails in CI, without the vLLM extra
        if (exc.name or "").split(".")[0] in OPTIONAL:
            pytest.skip(f"{name} needs {exc.name}")
        raise
    tests = doctest.DocTestFinder().find(module, name)
    if name.endswith(".diagram") and shutil.which("dot") is None:
        tests = [t for t in tests if '"svg"' not in (t.docstring or "")]
    out: list[str] = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in tests:
        runner.run(test, out=out.append)
    assert runner.failures == 0, "".join(out)


@pytest.mark.timeout(120)  # a full mkdocs build
def test_docs_build_strict(tmp_path: Path) -> None:
    """``make docs``: mkdocs --strict builds with no warning and without the network."""
    # Not -q: at that level mkdocs drops the warnings that --strict would count.
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "api" / "index.html").exists()
    html = (tmp_path / "site" / "diagrams" / "index.html").read_text(encoding="utf-8")
    assert "fonts.googleapis" not in html

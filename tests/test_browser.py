"""Every diagram renders in a real browser, with the real mermaid library and no network.

The built docs site (``mkdocs build``) and a page holding each ``--format md`` output are opened
in headless Chromium (see tests/browser.py); every mermaid diagram must become an ``<svg>``,
without mermaid's syntax-error picture and without a script error. A diagram broken on purpose
must be caught, on both kinds of page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from multiconnector.diagram import render
from multiconnector.machine import RequestTransferState
from multiconnector.usermachine import NO_TRAP, check_machine, draw
from tests.browser import (
    REQUIRED,
    chromium,
    mermaid_blocks,
    mermaid_page,
    problems,
    rendered,
    require_chromium,
)

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_chromium()
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=ROOT,
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out


def _diagram_pages(site: Path) -> dict[Path, int]:
    pages = {}
    for page in sorted(site.rglob("*.html")):
        count = page.read_text(encoding="utf-8").count('class="mermaid"')
        if count:
            pages[page] = count
    return pages


def test_every_diagram_of_the_site_renders_offline(site: Path) -> None:
    pages = _diagram_pages(site)
    names = {p.relative_to(site).as_posix() for p in pages}
    assert {
        "generated/machine/index.html",
        "usermachine/index.html",
        "health/index.html",
    } <= names, names
    assert (site / "js" / "mermaid.min.js").is_file()
    for page, count in pages.items():
        result = rendered(page)
        assert result["mermaid"] == "object", page
        assert problems(result, count) == [], page


def test_a_broken_diagram_on_the_site_is_caught(site: Path) -> None:
    page = site / "generated" / "machine" / "index.html"
    broken = page.with_name("broken.html")
    text = page.read_text(encoding="utf-8")
    broken.write_text(text.replace("[*] --&gt; pending", "[*] --&gt; --&gt; pending", 1))
    assert broken.read_text() != text
    assert problems(rendered(broken), 1) != []


def md_outputs() -> dict[str, str]:
    """Each kind of ``--format md`` output: ours, a request's path, a user machine, its trace."""
    record = RequestTransferState("r1")
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        report = check_machine("docs_example:OrderFlow")
        return {
            "transfer machine": render("md"),
            "a request's path": render(
                "md",
                path=[
                    ["request_finished", "pending", "finishing", None],
                    ["transfer_finished", "finishing", "finished", "disk"],
                ],
                request=record.request_id,
            ),
            "user machine": draw("docs_example:OrderFlow").markdown(),
            "user machine, current state": draw("docs_example:OrderFlow", state="held").markdown(),
            "user machine, trace": draw(
                "docs_example:OrderFlow", path=report.result(NO_TRAP).counterexample
            ).markdown(),
        }
    finally:
        sys.path.remove(str(ROOT / "docs"))


def test_every_md_output_renders(tmp_path: Path) -> None:
    require_chromium()
    sources = [b for text in md_outputs().values() for b in mermaid_blocks(text)]
    assert len(sources) == 5
    result = rendered(mermaid_page(sources, tmp_path / "md.html"))
    assert problems(result, len(sources)) == []
    assert all(d["nodes"] >= 4 for d in result["diagrams"]), result["diagrams"]


@pytest.mark.parametrize(
    "breakage",
    [
        ("[*] --> ", "[*] --> --> "),  # a parse error
        ("stateDiagram-v2", "stateDiagram-v9"),  # an unknown diagram type
        ("  state ", "  state {{ "),  # an unbalanced block
    ],
    ids=["arrow", "type", "block"],
)
def test_a_broken_md_diagram_is_caught(tmp_path: Path, breakage: tuple[str, ...]) -> None:
    require_chromium()
    good = mermaid_blocks(md_outputs()["user machine"])[0]
    old, new = breakage[0], breakage[1]
    bad = good.replace(old, new, 1)
    assert bad != good
    result = rendered(mermaid_page([good, bad], tmp_path / "bad.html"))
    found = problems(result, 2)
    assert found != []
    assert result["diagrams"][0]["svg"]  # the good one still drew


def test_chromium_is_present_where_it_is_required() -> None:
    """CI (CI=true or MULTICONNECTOR_REQUIRE_CHROMIUM=1): the browser tests run, never skip."""
    if not REQUIRED:
        pytest.skip("Chromium is optional here (neither CI nor MULTICONNECTOR_REQUIRE_CHROMIUM)")
    assert chromium() is not None, "Chromium is missing: `make system` installs it"
    assert re.search(
        r"\d",
        subprocess.run(
            [chromium() or "", "--version"], check=False, capture_output=True, text=True
        ).stdout,
    )

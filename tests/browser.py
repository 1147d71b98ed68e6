"""Headless Chromium, to see diagrams render as a reader's browser renders them.

:func:`rendered` opens an HTML file with a probe script injected first in its ``<head>``: the
probe opens every shadow root (mkdocs-material draws each diagram into a closed one), records
script errors and unhandled rejections, and keeps writing what it sees into the DOM, which
``--dump-dom`` prints once the virtual time budget has run out. The network is cut off (every
host resolves to nothing), so a page that needs a CDN shows it.

Locally a missing Chromium skips the tests that need it; with ``MULTICONNECTOR_REQUIRE_CHROMIUM=1``
or ``CI=true`` it fails them (`make system` installs Debian's ``chromium``).
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
MERMAID_JS = ROOT / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
REQUIRED = (
    os.environ.get("MULTICONNECTOR_REQUIRE_CHROMIUM") == "1"
    or os.environ.get("CI", "").lower() == "true"
)
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--allow-file-access-from-files",
]
#: Virtual milliseconds a page gets to load its scripts and draw.
BUDGET_MS = 20_000

PROBE = """<script>
(() => {
  const attach = Element.prototype.attachShadow;
  Element.prototype.attachShadow = function (init) {
    return attach.call(this, Object.assign({}, init, { mode: "open" }));
  };
  const errors = [];
  addEventListener("error", (e) => errors.push("error: " + e.message));
  addEventListener("unhandledrejection", (e) =>
    errors.push("rejection: " + ((e.reason && (e.reason.message || e.reason.str)) || e.reason)));
  const report = () => {
    const diagrams = [...document.querySelectorAll(".mermaid")].map((el) => {
      const svg = (el.shadowRoot || el).querySelector("svg");
      return {
        tag: el.tagName.toLowerCase(),
        svg: !!svg,
        error: !!svg && (svg.getAttribute("aria-roledescription") === "error" ||
                         /Syntax error/.test(svg.textContent)),
        nodes: svg ? svg.querySelectorAll("g.node, g[id*='state-']").length : 0,
        text: svg ? "" : el.textContent.slice(0, 120),
      };
    });
    const strays = [...document.querySelectorAll("svg[aria-roledescription=error]")].length;
    let out = document.getElementById("__probe");
    if (!out) {
      out = document.createElement("script");
      out.type = "application/json";
      out.id = "__probe";
      document.documentElement.appendChild(out);
    }
    out.textContent = JSON.stringify({
      mermaid: typeof window.mermaid, diagrams, errors, strays,
    });
  };
  setInterval(report, 100);
})();
</script>"""


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def require_chromium() -> str:
    """The browser's path; skips locally and fails in CI when there is none (or no mermaid)."""
    found = chromium()
    reason = None
    if found is None:
        reason = "Chromium is missing: `make system` installs Debian's chromium"
    elif not MERMAID_JS.is_file():
        reason = "the mermaid library is missing: `make npm` installs it (package.json)"
    if reason is not None:
        if REQUIRED:
            pytest.fail(f"the browser test is required here (CI) but {reason}", pytrace=False)
        pytest.skip(reason)
    assert found is not None
    return found


def rendered(page: Path) -> dict[str, Any]:
    """Open ``page`` (a copy with the probe, beside it) and return what the probe saw."""
    browser = require_chromium()
    text = page.read_text(encoding="utf-8")
    probed = re.sub(r"<head[^>]*>", lambda m: m.group(0) + PROBE, text, count=1)
    assert probed != text, f"{page} has no <head>"
    copy = page.with_name(f".probe-{page.name}")
    copy.write_text(probed, encoding="utf-8")
    try:
        with tempfile.TemporaryDirectory() as profile:
            done = subprocess.run(
                [
                    browser,
                    *FLAGS,
                    f"--user-data-dir={profile}",
                    f"--virtual-time-budget={BUDGET_MS}",
                    "--dump-dom",
                    copy.as_uri(),
                ],
                check=False,
                capture_output=True,
                text=True,
                timeout=180,
            )
    finally:
        copy.unlink()
    assert done.returncode == 0, done.stderr[-2000:]
    found = re.search(
        r'<script type="application/json" id="__probe">(.*?)</script>', done.stdout, re.S
    )
    assert found, f"the probe did not report: {done.stdout[-1000:]}\n{done.stderr[-1000:]}"
    result: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return result


def mermaid_page(sources: list[str], target: Path) -> Path:
    """A page that draws each mermaid source with the npm mermaid library, as a code host does."""
    blocks = "\n".join(
        f'<pre class="mermaid" id="m{i}">{html.escape(s)}</pre>' for i, s in enumerate(sources)
    )
    target.write_text(
        f"""<!doctype html>
<html><head><meta charset="utf-8"><title>diagrams</title>
<script src="{MERMAID_JS.as_uri()}"></script></head>
<body>
{blocks}
<script>
mermaid.initialize({{ startOnLoad: false, securityLevel: "strict" }});
(async () => {{
  for (const el of document.querySelectorAll("pre.mermaid")) {{
    try {{
      const {{ svg }} = await mermaid.render("svg-" + el.id, el.textContent);
      el.innerHTML = svg;
    }} catch (e) {{
      Promise.reject(e);  // reported by the probe as an unhandled rejection; the next one runs
    }}
  }}
}})();
</script>
</body></html>
""",
        encoding="utf-8",
    )
    return target


def mermaid_blocks(markdown: str) -> list[str]:
    """The body of every ```mermaid fence in ``markdown``."""
    return re.findall(r"^```mermaid\n(.*?)^```", markdown, re.S | re.M)


def problems(result: dict[str, Any], expected: int) -> list[str]:
    """What went wrong in a probe's result, for ``expected`` diagrams (empty: all drew)."""
    out = list(result["errors"])
    diagrams = result["diagrams"]
    if len(diagrams) != expected:
        out.append(f"{len(diagrams)} diagrams on the page, expected {expected}")
    for i, d in enumerate(diagrams):
        if not d["svg"]:
            out.append(f"diagram {i} did not become an <svg>: {d['text']!r}")
        elif d["error"]:
            out.append(f"diagram {i} is mermaid's syntax-error picture")
    if result["strays"]:
        out.append(f"{result['strays']} mermaid error picture(s) on the page")
    return out

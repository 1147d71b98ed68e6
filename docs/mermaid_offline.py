"""A mkdocs hook: ship the mermaid library with the site, so diagrams render with no network.

mkdocs-material draws ``mermaid`` fences with the global ``mermaid`` when a page already has it,
and fetches the library from a CDN otherwise. ``extra_javascript`` in mkdocs.yml loads
``js/mermaid.min.js``; this hook copies that file into the built site from the npm package that
``make docs`` installs (package.json pins its version). Without it the build fails: a site that
shows raw mermaid source offline is a broken site.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

ROOT = Path(__file__).resolve().parent.parent
SOURCE = ROOT / "node_modules" / "mermaid" / "dist" / "mermaid.min.js"
TARGET = Path("js") / "mermaid.min.js"


def on_post_build(config: Any, **kwargs: Any) -> None:
    if not SOURCE.is_file():
        raise PluginError(
            f"{SOURCE.relative_to(ROOT)} is missing: run `make npm` (npm ci) first, "
            "so the site ships the mermaid library instead of fetching it"
        )
    target = Path(config["site_dir"]) / TARGET
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SOURCE, target)

"""The progress line a long search shows on stderr."""

from __future__ import annotations

import sys
import time
from typing import Any

from .report import PROGRESS_AFTER


class _Progress:
    """Shows the search's figures when it runs longer than a couple of seconds.

    Uses ``rich`` (the ``progress`` extra) on a terminal; plain lines on stderr otherwise, so
    CI logs stay readable. Never required.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.start = time.perf_counter()
        self.last = self.start
        self.live: Any = None
        self.plain = False

    def update(self, distinct: int, generated: int, depth: int, queued: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.start < PROGRESS_AFTER:
            return
        rate = distinct / (now - self.start)
        text = (
            f"depth {depth}, {distinct:,} distinct states, {generated:,} generated, "
            f"{queued:,} queued, {rate:,.0f} distinct states/s"
        )
        if self.live is None and not self.plain:
            self.live = self._rich()
            self.plain = self.live is None
        if self.live is not None:
            self.live.update(f"[bold]checking[/bold] {text}")
        elif now - self.last >= 5.0 or self.last == self.start:
            print(f"check: {text}", file=sys.stderr, flush=True)
            self.last = now

    @staticmethod
    def _rich() -> Any:
        if not sys.stderr.isatty():
            return None
        try:
            from rich.console import Console  # noqa: PLC0415 - optional, imported late
            from rich.status import Status  # noqa: PLC0415
        except ImportError:
            return None
        status = Status("checking", console=Console(stderr=True))
        status.start()
        return status

    def close(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

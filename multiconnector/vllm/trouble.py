"""A child's failure is that child's, never the server's: :class:`Trouble` counts and logs them.

vLLM calls some hooks once per request or once per step (matching tokens, allocating, building
metadata, each layer's load and save, the completions, the stats...). When a child raises in
one of them, or answers what cannot be true (a negative token count, more tokens than the
request has left, a load flag that is no ``bool``), the connector degrades that child for that
call (no hit, no metadata, a load reported as failed so that vLLM recomputes: docs/vllm.md,
"When a child fails") and records it here, under the child's name and the hook's. Nothing is
raised into vLLM's engine loop. Start-up and shutdown hooks are not per step: a child failing
there still raises (:class:`~multiconnector.ConnectorFailures`), so a server that cannot start
says why.

Each failure is logged at WARNING on the ``multiconnector`` logger (inside vLLM in vLLM's
format: :func:`adopt_vllm_logging`): the first of a child and hook with its traceback (none for
the adapter's own verdicts on an answer: their message says why), then at most one line a minute
with how many more there were. A failure that comes with every request (a load-only child
promising saves, a lookup past its patience) is so one line a minute, each one counted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from ..errors import MultiConnectorError

__all__ = ["OVERDUE_HOOKS", "WARN_SECONDS", "Trouble", "adopt_vllm_logging", "verdict"]

logger: Final = logging.getLogger("multiconnector")

#: At most one warning per child and hook in this many seconds (the first with its traceback,
#: unless it is the adapter's own :func:`verdict`).
WARN_SECONDS: Final = 60.0

#: Where this package's code lives: an error raised there is the adapter's own (:func:`verdict`).
_PACKAGE: Final = str(Path(__file__).resolve().parent.parent / "_")[:-1]  # ends with the separator

#: The pseudo-hooks under which a report owed for too long is counted, by kind of transfer: the
#: field of vLLM's ``KVConnectorOutput`` the child has not reported the request in.
OVERDUE_HOOKS: Final = {"save": "finished_sending_overdue", "load": "finished_recving_overdue"}


def verdict(exc: BaseException) -> bool:
    """Whether ``exc`` is the adapter's own verdict on a child's answer (a
    :class:`~multiconnector.MultiConnectorError` made or raised by this package: a load-only
    child's promised save, a lookup past its patience, a token count that cannot be true), not
    a child raising. Its message says it all: logged without a traceback, which would show only
    the adapter's own code."""
    if not isinstance(exc, MultiConnectorError):
        return False
    tb = exc.__traceback__
    if tb is None:  # made, never raised
        return True
    while tb.tb_next is not None:
        tb = tb.tb_next
    return str(Path(tb.tb_frame.f_code.co_filename).resolve()).startswith(_PACKAGE)


class Trouble:
    """Per child and hook, how many times the child failed there; rate-limited warnings."""

    __slots__ = ("_counts", "_unreported", "_warned")

    def __init__(self) -> None:
        self._counts: dict[str, dict[str, int]] = {}
        #: The failures since :meth:`take_unreported` last ran (the stats' share of them).
        self._unreported: dict[str, dict[str, int]] = {}
        #: Per (child, hook): when last warned about, and how many failures since.
        self._warned: dict[tuple[str, str], tuple[float, int]] = {}

    def record(self, hook: str, name: str, exc: BaseException, degraded: str) -> None:
        """Child ``name`` failed in ``hook`` with ``exc``; ``degraded`` says what became of it
        (for the log line: "counted as no hit", ...)."""
        quiet = self._count(hook, name)
        if quiet is None:
            return
        logger.warning(
            "child connector %r failed in %s: %s: %s; %s, and the server goes on%s",
            name,
            hook,
            type(exc).__name__,
            exc,
            degraded,
            quiet[1],
            exc_info=exc if quiet[0] and not verdict(exc) else None,
        )

    def overdue(self, kind: str, name: str, request_id: str, seconds: float, limit: float) -> None:
        """Child ``name`` has owed its ``kind`` report (``"save"`` or ``"load"``) of
        ``request_id`` for ``seconds``, past ``limit``: counted (once per request) under the hook
        ``finished_sending_overdue`` or ``finished_recving_overdue``, and warned about as a
        failure is (rate-limited). Its request stays held: KV a child may still be moving is
        never freed."""
        hook = OVERDUE_HOOKS[kind]
        quiet = self._count(hook, name)
        if quiet is None:
            return
        logger.warning(
            "child connector %r has not reported its %s of request %r for %.0f s "
            "(report_overdue_seconds=%g); the request's KV blocks stay held until it "
            "reports, and the server goes on%s",
            name,
            kind,
            request_id,
            seconds,
            limit,
            quiet[1],
        )

    def _count(self, hook: str, name: str) -> tuple[bool, str] | None:
        """Count one failure of ``name`` in ``hook``; ``None`` when it is not to be logged
        (warned about less than :data:`WARN_SECONDS` ago), else whether it is the first of this
        child and hook, and the note of how many were not logged since the last warning."""
        per = self._counts.get(name)
        if per is None:
            per = self._counts[name] = {}
        per[hook] = per.get(hook, 0) + 1
        new = self._unreported.get(name)
        if new is None:
            new = self._unreported[name] = {}
        new[hook] = new.get(hook, 0) + 1
        key = (name, hook)
        now = time.monotonic()
        last = self._warned.get(key)
        if last is not None and now - last[0] < WARN_SECONDS:
            self._warned[key] = (last[0], last[1] + 1)
            return None
        self._warned[key] = (now, 0)
        quiet = "" if last is None or not last[1] else f" ({last[1]} more since the last warning)"
        return last is None, quiet

    def record_all(
        self, hook: str, failures: Iterable[tuple[str, BaseException]], degraded: str
    ) -> None:
        """:meth:`record` for each ``(name, exc)`` of ``failures``."""
        for name, exc in failures:
            self.record(hook, name, exc, degraded)

    def counts(self) -> dict[str, dict[str, int]]:
        """Per child name, per hook, how many times it failed there (a copy)."""
        return {name: dict(per) for name, per in self._counts.items()}

    def take_unreported(self) -> dict[str, dict[str, int]]:
        """The failures recorded since the last call, per child and hook (for the stats vLLM
        collects each step); empty when there were none."""
        if not self._unreported:
            return {}
        taken, self._unreported = self._unreported, {}
        return taken


class _ToVllm(logging.Handler):
    """Hands a record to vLLM's ``vllm`` logger's handlers, so it reads as vLLM's lines do
    (process, level, time, file) and follows vLLM's logging configuration: unless the root
    logger has handlers of its own (an embedder configured logging), which then print it."""

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return  # propagated to the root's handlers: printed there, once
        logging.getLogger("vllm").handle(record)


def adopt_vllm_logging() -> None:
    """Inside vLLM, print the ``multiconnector`` logger's records through vLLM's handlers.

    Only when nobody gave that logger a handler of its own: an embedder's own logging
    configuration is left as it is. Its level is vLLM's unless one was set. Each record is
    printed once: by vLLM's handlers, or, when the root logger has handlers, by those.
    """
    ours = logging.getLogger("multiconnector")
    if ours.handlers:
        return
    ours.addHandler(_ToVllm())
    if ours.level == logging.NOTSET:
        ours.setLevel(logging.getLogger("vllm").getEffectiveLevel())

"""Which children may load one request, as the request says: :func:`load_children`.

A request's ``kv_transfer_params`` may hold :data:`LOAD_CHILDREN_KEY`, a list of child names:
only those children are asked to look the request up, only they may be chosen to load it and
only they may be parts of its split load (vLLM's tiering offload has ``kv_load_tiers`` for the
same need). The key restricts *loads* only. Saves cannot be restricted per request from here:
vLLM's contract calls ``request_finished`` once per request on every child, and a child's save
is its own decision there (and in the save hooks its own metadata drives), so a save refused by
the adapter would be one the child already started or promised. A child that should not save a
request reads the request's ``kv_transfer_params`` itself (every child sees them).

A value that is not a list or tuple of ``str``, or that names a child that is not configured to
load (unknown, or save-only), is that request's bad input: the request loads from no child (it
is recomputed, never loaded from a child its user did not mean), is counted once per loader
(``refused`` in :meth:`~multiconnector.vllm.MultiConnector.child_hits`) and logged once (at
most one line a minute, as a child's failures are), and the server goes on.

.. versionadded:: 0.1.0
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from typing import Any, Final

from .._validate import shown
from ..errors import InvalidArgumentError, InvalidValueError, MultiConnectorError

__all__ = ["LOAD_CHILDREN_KEY", "Refusals", "load_children"]

logger: Final = logging.getLogger("multiconnector")

#: The key of a request's ``kv_transfer_params`` naming the only children that may load it.
LOAD_CHILDREN_KEY: Final = "multiconnector_load_children"
#: At most one warning about bad keys in this many seconds (the others counted).
WARN_SECONDS: Final = 60.0


def load_children(request: Any, loaders: Collection[str]) -> frozenset[str] | None:
    """The children ``request``'s :data:`LOAD_CHILDREN_KEY` lets load it (``None``: the key is
    absent or ``None``, every child may). ``loaders``: the names of the children that may load.

    Raises :class:`InvalidArgumentError` when the value is not a list or tuple of ``str`` (a
    single string is refused: its characters are not names), :class:`InvalidValueError` when
    it names a child not in ``loaders``; each message names the request and the key."""
    params = getattr(request, "kv_transfer_params", None)
    if not params:
        return None
    value = params.get(LOAD_CHILDREN_KEY) if isinstance(params, dict) else None
    if value is None:
        return None
    where = f"request {request.request_id!r}: kv_transfer_params[{LOAD_CHILDREN_KEY!r}]"
    if not isinstance(value, list | tuple) or not all(isinstance(n, str) for n in value):
        raise InvalidArgumentError(f"{where}={shown(value)} must be a list of child names (str)")
    unknown = sorted(set(value) - set(loaders))
    if unknown:
        raise InvalidValueError(
            f"{where} names {unknown}, not children that may load; they are {sorted(loaders)}"
        )
    return frozenset(value)


class Refusals:
    """The requests whose key was bad: each logged (rate-limited) and counted."""

    __slots__ = ("_last", "_quiet", "count")

    def __init__(self) -> None:
        #: How many requests' keys were refused.
        self.count = 0
        self._last: float | None = None
        self._quiet = 0

    def refuse(self, error: MultiConnectorError) -> None:
        """One request's key refused for ``error``: counted; a WARNING line unless one was
        logged less than :data:`WARN_SECONDS` ago."""
        self.count += 1
        now = time.monotonic()
        if self._last is not None and now - self._last < WARN_SECONDS:
            self._quiet += 1
            return
        more = f" ({self._quiet} more since the last warning)" if self._quiet else ""
        self._last, self._quiet = now, 0
        logger.warning(
            "%s: %s; the request loads from no child (recomputed), and the server goes on%s",
            type(error).__name__,
            error,
            more,
        )

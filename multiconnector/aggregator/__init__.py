"""The aggregator: one request's transfer, fanned out to every connector, tracked by name.

Rules, in one place (docs/concepts.md explains them at length):

* **Ignore, don't crash.** A transfer report is applied only when its request is held, live, and
  awaits that name. Everything else is ignored with a typed :class:`Outcome`, counted per kind
  and per connector, and logged at debug level.
* **Nothing freed early.** A request reaches ``finished`` only when every name that committed to
  an asynchronous save reported, or was unregistered. Duplicate and phantom reports cannot
  shorten the wait: the awaited set holds names, not a count.
* **The unregister rule.** Unregistering a connector releases every request awaiting it: the name
  moves from ``awaiting`` to ``abandoned`` (its later reports are ignored as ``unregistered``) and
  a request with nothing left to await becomes ``finished``. A connector that is gone can never
  report, so waiting for it would strand the request forever; unregister a connector only once it
  no longer touches KV blocks (after its shutdown, say). ``abandoned`` tells the caller which
  saves were never confirmed.
* **No state outlives its request.** Terminal requests are held until :meth:`MultiConnector.take`
  hands them back, then dropped.
* **Atomic per request, no global lock.** Each request's transitions happen under one of a fixed
  set of striped locks chosen by the request id's hash. Connectors are never called under a lock,
  so a connector may call back into the aggregator.
"""

from __future__ import annotations

from typing import final

from ._books import OTHER_NAMES, Books
from .checking import Checking
from .lifecycle import Lifecycle
from .loading import Loading
from .queries import Queries
from .reports import Reports
from .saving import Saving

__all__ = ["OTHER_NAMES", "MultiConnector"]


# The bases in reverse: the API reference lists inherited methods base by base from the last
# one, so this reads there as lifecycle, saving, reports, loading, queries.
@final
class MultiConnector(Queries, Loading, Reports, Checking, Saving, Lifecycle, Books):
    """Fans each request out to the connectors of a :class:`ConnectorRegistry` and tracks it.

    >>> from multiconnector import ConnectorRegistry, MultiConnector
    >>> class Saver:
    ...     def request_finished(self, request_id, blocks):
    ...         return True, {"saved_by": "disk"}
    >>> mc = MultiConnector(ConnectorRegistry({"disk": Saver(), "broken": None}))
    >>> mc.begin("r1")
    >>> mc.request_finished("r1", [0, 1])
    (<Outcome.applied: 'applied'>, {'saved_by': 'disk'})
    >>> mc.transfer_finished("r1", "broken")        # a None slot: ignored, not a crash
    <Outcome.not_ready: 'not_ready'>
    >>> mc.transfer_finished("r1", "disk")
    <Outcome.applied: 'applied'>
    >>> [(r.request_id, r.state.value) for r in mc.take()]
    [('r1', 'finished')]
    >>> len(mc)
    0

    ``trace=True`` records each request's applied transitions in its ``history`` (off by default:
    then it costs one attribute test per transition). ``allow_equal_params`` is passed to
    :func:`merge_transfer_params`. ``stripes`` is the number of request locks, a power of two
    from 1 to 65 536.

    Every argument follows one rule per kind of input (docs/bad-input.md): a request id is a
    non-empty ``str`` (a subclass is made a plain ``str``), a connector name is a printable
    ``str`` of 1 to 128 characters without whitespace, ``,`` or ``=``, blocks are a sequence of
    ``int``. A bad one raises a typed error naming it, and nothing changes. After
    :meth:`shutdown`, calls that would do work raise :class:`ShutDownError`.

    .. versionadded:: 0.1.0
    """

    # Every attribute is declared by Books; each base adds the methods of one concept.
    __slots__ = ()

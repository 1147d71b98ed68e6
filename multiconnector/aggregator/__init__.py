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
* **Shutting down drains.** After :meth:`MultiConnector.shutdown` no new work is taken, but
  reports are still accepted (a connector flushing its saves from its own ``shutdown()``
  included), so every request can still be released: by its reports, or by unregistering a
  connector that will never report.
* **No state outlives its request.** Terminal requests are held until :meth:`MultiConnector.take`
  hands them back, then dropped.
* **Atomic per request, no global lock.** Each request's transitions happen under one of a fixed
  set of striped locks chosen by the request id's hash. Connectors are never called under a lock,
  so a connector may call back into the aggregator.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, final

from ..machine import RequestTransferState
from ..outcome import Outcome
from ..registry import Connector, ConnectorRegistry, Role
from ._books import OTHER_NAMES, Books
from .lifecycle import Lifecycle
from .loading import Loading
from .queries import Queries
from .reports import Reports
from .saving import Saving

__all__ = ["OTHER_NAMES", "MultiConnector"]


# The bases in reverse: the API reference lists inherited methods base by base from the last
# one, so this reads there as lifecycle, saving, reports, loading, queries.
@final
class MultiConnector(Queries, Loading, Reports, Saving, Lifecycle, Books):
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
    from 1 to 65 536. ``lookup`` is the policy
    :meth:`match_tokens` chooses a loader by (:class:`~multiconnector.Lookup`: ``first``, vLLM's
    rule, by default, or ``longest``).

    Every argument follows one rule per kind of input (docs/bad-input.md): a request id is a
    non-empty ``str`` (a subclass is made a plain ``str``), a connector name is a printable
    ``str`` of 1 to 128 characters without whitespace, ``,`` or ``=``, blocks are a sequence of
    ``int``. A bad one raises a typed error naming it, and nothing changes. After
    :meth:`shutdown`, calls that would start work raise :class:`ShutDownError`; reports are
    still accepted, so what is owed drains (see :meth:`shutdown` for the order).

    .. versionadded:: 0.1.0
    """

    # Every attribute is declared by Books; each base adds the methods of one concept.
    __slots__ = ()

    if TYPE_CHECKING:
        # The public methods' signatures, as the bases define them, declared here for type
        # checkers alone: a wrong call in a user's code is then reported against
        # "MultiConnector", not the base that happens to hold the method. Nothing of this runs;
        # tests/test_public_names.py checks it matches the bases.
        @property
        def registry(self) -> ConnectorRegistry: ...
        def register(
            self, name: str, connector: Connector | None, role: Role = Role.both
        ) -> None: ...
        def unregister(self, name: str) -> Connector | None: ...
        def begin(self, request_id: str) -> None: ...
        def cancel(self, request_id: str) -> Outcome: ...
        def take(self) -> list[RequestTransferState]: ...
        def shutdown(self) -> None: ...
        def request_finished(
            self, request_id: str, blocks: Sequence[int] = ()
        ) -> tuple[Outcome, dict[str, Any] | None]: ...
        def request_finished_by(
            self, request_id: str, savers: Iterable[str], *, allow_unregistered: bool = False
        ) -> Outcome: ...
        def transfer_finished(
            self, request_id: str, name: str, blocks: Sequence[int] = ()
        ) -> Outcome: ...
        def transfer_finished_many(
            self, name: str, request_ids: Iterable[str], blocks: Sequence[int] = ()
        ) -> list[Outcome]: ...
        def match_tokens(
            self, request_id: str, num_computed_tokens: int = 0, *, remaining: int | None = None
        ) -> int | None: ...
        def load_finished(self, request_id: str, name: str) -> Outcome: ...
        def choose_loader(
            self, request_id: str, name: str | None, *, parts: Sequence[str] = ()
        ) -> None: ...
        def get(self, request_id: str) -> RequestTransferState | None: ...
        def peek(self, request_id: str) -> RequestTransferState | None: ...
        def held(self) -> dict[str, int]: ...
        def oldest(
            self, count: int = 1, *, draining: bool = False
        ) -> list[RequestTransferState]: ...
        def request_ids(self) -> list[str]: ...
        def counts(self) -> dict[Outcome, int]: ...
        def connector_counts(self) -> dict[str, dict[Outcome, int]]: ...
        def stats(self) -> dict[str, Any]: ...


#: The methods and properties :class:`MultiConnector` offers, each defined in one of its bases.
PUBLIC: tuple[str, ...] = tuple(
    name
    for base in reversed(MultiConnector.__mro__[1:-1])
    for name in vars(base)
    if not name.startswith("_") or name in ("__init__", "__repr__", "__len__", "__contains__")
)


def _named_after_the_class() -> None:
    """Give each public function the qualified name ``MultiConnector.<name>``, so that Python's
    own errors (a missing argument, an unexpected keyword) and tracebacks name the class a
    caller uses, not the base that holds the function."""
    for name in PUBLIC:
        member = inspect.getattr_static(MultiConnector, name)
        function: Any = member.fget if isinstance(member, property) else member
        function.__qualname__ = f"MultiConnector.{name}"


_named_after_the_class()

"""A request's life around its transfers, and the aggregator's own: connectors registered and
unregistered, :meth:`~MultiConnector.begin`, :meth:`~MultiConnector.cancel`,
:meth:`~MultiConnector.take` and :meth:`~MultiConnector.shutdown`.
"""

from __future__ import annotations

from typing import Final

from .._validate import check_request_id
from ..errors import ConnectorFailures, DuplicateRequestError
from ..machine import DECISIONS, RequestTransferState
from ..outcome import Outcome
from ..registry import Connector, ConnectorRegistry, Role
from ..rule import decide
from ._books import _APPLIED, _NO_NAME, _TERMINAL, _UNKNOWN_REQUEST, Books

__all__ = ["Lifecycle"]

_ON_CANCEL: Final = DECISIONS["cancel"]


class Lifecycle(Books):
    """Registering connectors, beginning, cancelling and taking requests, shutting down."""

    __slots__ = ()

    @property
    def registry(self) -> ConnectorRegistry:
        """The registry; changing it directly is safe (unregistering applies the rule above)."""
        return self._registry

    def register(self, name: str, connector: Connector | None, role: Role = Role.both) -> None:
        """Same as ``self.registry.register(name, connector, role)``; refused after
        :meth:`shutdown`. ``role`` (a :class:`~multiconnector.Role`) says whether the connector
        only saves, only loads, or both."""
        if self._closed:
            self._shut("register")
        self._registry.register(name, connector, role)

    def unregister(self, name: str) -> Connector | None:
        """Unregister ``name``, releasing every request awaiting it (the unregister rule).

        Requests awaiting ``name`` stop awaiting it: the name moves to their ``abandoned``, and
        one with nothing left to await becomes ``finished``. Returns the connector. A save
        ``name`` reported before is never abandoned: after :meth:`shutdown`, let its last
        reports arrive first (see there).
        """
        return self._registry.unregister(name)

    def begin(self, request_id: str) -> None:
        """Start tracking ``request_id`` in ``pending``.

        Raises :class:`DuplicateRequestError` while the id is still held (live, or terminal and
        not yet taken): that would discard the first request's bookkeeping. Nothing changes then.
        """
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        if self._closed:
            self._shut("begin")
        record = RequestTransferState(request_id)
        if self._trace:
            record.history = []
        if self._requests.setdefault(request_id, record) is not record:
            raise DuplicateRequestError(f"request_id={request_id!r} is already held")

    def cancel(self, request_id: str) -> Outcome:
        """Cancel a live request: it becomes ``cancelled`` and never changes state again.

        Cancelling is the caller's decision to stop the request, not to stop waiting for the
        connectors that may still touch its blocks: a cancelled request is held, *draining*,
        while it awaits a save or its chosen loader's load (``in_flight``). Reports from the
        names it awaits are applied to the drain (:attr:`Outcome.drained`: it awaits one name
        less, stays ``cancelled``, no callback); unregistering an awaited connector releases it
        as for any request. :meth:`take` hands it back once nothing is in flight. Every other
        later event is ignored, and no connector is asked again.
        """
        if request_id.__class__ is not str or not request_id:
            request_id = check_request_id(request_id)
        index = hash(request_id) & self._mask
        lock = self._locks[index]
        lock.acquire()
        try:
            record = self._requests.get(request_id)
            if record is None:
                outcome = _UNKNOWN_REQUEST
            elif (dest := decide(_ON_CANCEL, record, None)) is None:
                outcome = _TERMINAL
            else:
                self._transition(record, "cancel", dest, None)
                outcome = _APPLIED
            self._count(index, outcome, _NO_NAME)
        finally:
            lock.release()
        if outcome is not _APPLIED:
            self._log_ignored("cancel", request_id, None, outcome)
        return outcome

    def take(self) -> list[RequestTransferState]:
        """Hand back every terminal request that is safe to free, and forget it.

        A record handed back is safe to free: no connector that promised a save for it, or was
        chosen to load it, still owes a report; each one reported or was unregistered (see
        ``abandoned``). That holds for ``finished`` and for ``cancelled`` records: a cancelled
        request is held while it drains (see :meth:`cancel`), and so is a finished one whose
        load is still in flight. Each request is handed back exactly once, in the order it
        became safe to free. :meth:`held` counts the draining ones; :meth:`oldest` finds those
        held longer than expected (a connector that never reports).
        """
        done = self._done
        if not done:
            return []
        taken: list[RequestTransferState] = []
        pop = done.popleft
        requests = self._requests
        try:
            while done:
                record = pop()
                # Queued once, when nothing is left in flight, and held until now: a held id
                # is never begun again (DuplicateRequestError), so this is its record.
                del requests[record.request_id]
                taken.append(record)
        except IndexError:  # another thread took the last ones between our test and our pop
            pass
        return taken

    def shutdown(self) -> None:
        """Take no new work, and call ``shutdown()`` on every ready connector that has one.

        Shutting down drains: a server follows this order (docs/concepts.md, "Shutting down").

        1. *Stop new work*: stop beginning requests and :meth:`cancel` those that will not
           finish. From ``shutdown()`` on, every call that would start work (begin or finish a
           request, look up or choose a loader, ask connectors for stats, register one) raises
           :class:`ShutDownError` and changes nothing.
        2. *Let owed reports arrive*: a connector may report its last saves and loads from
           inside its own ``shutdown()`` (flushing them) or later, from its threads. Reports
           (:meth:`transfer_finished`, :meth:`transfer_finished_many`, :meth:`load_finished`)
           are accepted after shutdown as before it, and so are :meth:`cancel`, :meth:`take`,
           :meth:`unregister` and reading.
        3. *Release*: free what :meth:`take` hands back; :meth:`unregister` a connector that will
           never report (its requests are released, its unconfirmed saves in ``abandoned``),
           and :meth:`take` again. :meth:`held` says what is still owed.

        No request is handed back while a connector still owes it a report, before or after
        shutdown. Every connector is attempted even when earlier ones raise; the failures are
        raised together as :class:`ConnectorFailures`, in registration order, and the
        aggregator is shut down either way. A second ``shutdown()`` does nothing: no connector
        is shut down twice.
        """
        if self._closed:
            return
        self._closed = True  # first: a connector being shut down is never asked again
        errors: list[Exception] = []
        failed: list[str] = []
        for entry in self._registry.ready_entries():
            shutdown = getattr(entry.connector, "shutdown", None)
            if shutdown is None:
                continue
            try:
                shutdown()
            except Exception as exc:
                errors.append(exc)
                failed.append(entry.name)
        if errors:
            raise ConnectorFailures(
                f"{len(errors)} connector(s) failed to shut down: {', '.join(failed)}",
                errors,
                failed=failed,
            )

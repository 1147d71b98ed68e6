"""What happened to an event: applied, or which of the ignore rules it fell under."""

from __future__ import annotations

import enum

__all__ = ["Outcome"]


class Outcome(enum.StrEnum):
    """The outcome of one event delivered to :class:`~multiconnector.MultiConnector`.

    :attr:`applied` changed the request's state machine; :attr:`drained` and :attr:`overtaken`
    changed only what a cancelled (or finished) request still awaits before it can be handed
    back; :attr:`early` keeps a report that came before the answer it needs, until it can be
    decided; :attr:`abandoned` (which no call returns) counts an unregistering. Every other
    member names the rule under which the event was ignored: no exception, no state change, one
    count under that member and the connector's name, one debug log line.
    Events that arrive late, twice, or from nowhere are normal in a distributed server, so
    ignoring them is not an error; a wrong argument *type* is, and raises instead.

    .. versionadded:: 0.1.0
    """

    applied = "applied"
    """The event changed the request's bookkeeping."""
    unknown_request = "unknown_request"
    """No request is held under this id (never begun, or already taken)."""
    terminal = "terminal"
    """The request is already ``finished`` or ``cancelled``: terminal states are absorbing."""
    duplicate = "duplicate"
    """This connector already reported this (or ``request_finished`` was already applied)."""
    phantom = "phantom"
    """A ready connector reported something it never committed to for this request."""
    unknown_connector = "unknown_connector"
    """No connector is registered under this name."""
    not_ready = "not_ready"
    """The name is registered with ``None``: a connector that is not ready."""
    unregistered = "unregistered"
    """The request awaited this connector (or chose it to load), but it was unregistered before
    it reported."""
    abandoned = "abandoned"
    """Counted, never returned: the connector was unregistered while the request awaited it, so
    the request stopped awaiting it (the unregister rule). Counted under the connector's name
    in :meth:`~multiconnector.MultiConnector.connector_counts`, apart from its reports."""

    drained = "drained"
    """A report (or load report) from a connector a terminal request still awaited: applied to
    its drain (it awaits one name less; its state is unchanged, no callback is made). The request
    is handed back by ``take()`` once nothing is left in flight."""
    overtaken = "overtaken"
    """``request_finished`` was overtaken by a ``cancel`` while it asked the connectors: the
    request stays ``cancelled`` and awaits every connector that promised a save (its drain)."""
    early = "early"
    """A report that came early: from a ready connector while a ``request_finished`` for the
    request is still asking the connectors (that connector's answer is not recorded yet: it
    reports from inside its own ``request_finished``, or from a thread it started there). The
    report is kept, not counted yet, and decided once the answers are recorded, as if it
    arrived right after them: applied (or drained) when the connector said it saves, else
    ignored under the rule it then falls under (``phantom``, most often). It is counted once,
    then, under that outcome; an applied one's ``on_finished`` is called by the thread that
    recorded the answers. A second report from the same connector while the first is kept is
    a ``duplicate``. The same for a load report from a ready connector while a
    ``match_tokens`` for the request still asks: decided once the loader is recorded (applied
    when it is the chosen loader, its ``on_load_finished`` called by that call).

    .. versionadded:: 0.1.0
    """

    @property
    def ignored(self) -> bool:
        """Whether the event was ignored (neither applied, drained, overtaken, early nor
        abandoned)."""
        return self not in _RECORDED


_RECORDED = frozenset(
    {Outcome.applied, Outcome.drained, Outcome.overtaken, Outcome.early, Outcome.abandoned}
)

"""``multiconnector check``: an exhaustive model check of the transfer machine, on the real code.

Hypothesis samples interleavings; this explores *every* state of a bounded scenario, the way TLC
does for a TLA+ specification, but it drives the real :class:`~multiconnector.MultiConnector`
rather than a second model that could drift from it. The scenario:

* connector names, each a scripted saver (its ``request_finished`` answer is chosen by the
  event: "request finished with every subset of savers"), a ``None`` slot, one whose calls
  raise, or another kind of :data:`~.scenario.KINDS` (a ``counted`` one is booked under two
  report names, as the vLLM adapter books a child reported on fewer workers: :mod:`.counted`);
  plus names never registered;
* request ids, each begun at most once;
* the default event alphabet (:data:`ALPHABET`): ``begin``; ``request_finished`` with every subset
  of the registered savers; ``transfer_finished`` for every (request, name), which covers
  duplicates, phantoms, ``None`` slots and unknown names; ``cancel``; ``unregister`` and
  ``register`` of every name; ``take``; ``transfer_finished_many``, a batch of two reports
  under a name every request of the batch awaits;
* the told path (:data:`TOLD_EVENTS`, in :data:`ALPHABET`): ``request_finished_by`` for every
  request with every subset of the ready savers (a counted connector's report names, as the
  vLLM adapter tells them), and with every name that cannot report besides;
* opt-in, the load side (:data:`LOAD_EVENTS`): ``match_tokens`` for every held request with
  every combination of the ready savers' token answers (0, 1 or ``None``), and
  ``load_finished`` for every (request, name).

A state is the canonical snapshot of what the aggregator shows: the registry's (name, ready)
list, each held request's record (state, awaiting, expected, abandoned), the order requests are
held in, and what :meth:`~multiconnector.MultiConnector.take` would hand back. Each request also
carries what the checker observed on its own, independently of the aggregator's bookkeeping:
which connectors promised an asynchronous save (they answered ``True`` when asked) and have not
yet reported or been unregistered, whether the caller cancelled it, and (load side) which
loader the token answers it scripted chose and whether that loader's completion was delivered
while the request was live. Request ids are
interchangeable, and so are connector names of one kind, so snapshots are put in a canonical
form under their renamings (symmetry reduction; ``symmetry=False`` turns it off). A settled
record (finished or cancelled, no call between its halves) keeps only the names it awaits: the
rest is read by no later event (``forget=False`` keeps it; docs/check.md, "Settled records").
States, events and the declared transitions come from :mod:`multiconnector.machine`.

The modules: :mod:`.scenario` (the connectors, the world, the events), :mod:`.snapshot` (the
state of a world), :mod:`.canonical` (its canonical form under symmetry), :mod:`.events` (the
events enabled in a state), :mod:`.counted` (the counted connectors), :mod:`.alike` (events that
would do what one applied did), :mod:`.fork` (a world copied), :mod:`.halves` (the checker's
seam: a call's two halves, the books read), :mod:`.properties` (what is
judged), :mod:`.breaker` (each child's health, ``health=True``), :mod:`.trace` (how it is
shown), :mod:`.run` (:func:`check_aggregator`) and :mod:`.cli`
(the command).

Properties (each PASS or FAIL, with a shortest counterexample):

``no exception``
    No event raises, except the :class:`~multiconnector.ConnectorFailures` a raising connector
    documents.
``terminal absorbing``
    A finished or cancelled request never changes again: not its state, not its bookkeeping.
``no early free``
    A request is ``finished`` (and handed back by ``take()`` as finished) only when every
    connector that promised a save reported it or was unregistered (the unregister rule);
    ``take()`` hands back only terminal requests, each once, as cancelled only if cancelled.
``no leak``
    A request handed back is no longer held; a terminal request is queued for ``take()``; no
    request vanishes without being handed back; once every begun request was handed back the
    aggregator holds nothing.
``load once`` (only with a load event in the alphabet)
    A ``load_finished`` is applied (its ``Outcome``, the connector's ``on_load_finished``)
    exactly when it is the first completion from the loader the latest decisive match chose,
    while the request is live and that loader was not unregistered since it was chosen: at most
    once per match, never from another name, never after terminal, never from an unregistered
    loader or a new connector registered under its name (``unregistered``, no callback); and
    the chosen loader's completion is not lost.
``right outcome``
    Every ``Outcome`` an event returns is the one the checker classifies by the documented rules
    from the record and the registry as they were before the event, and its own ledger.
``counters``
    ``counts()`` and ``connector_counts()`` grow by exactly the outcomes the events returned.
``callbacks``
    ``on_finished`` and ``on_load_finished`` are called once per applied report, and only then.
``params merged`` (only with ``params=True``: scripted savers answer params)
    ``request_finished`` returns the checker's reference merge, raises ``KeyClashError`` exactly
    when it clashes and only once the answers were applied, and changes no saver's dict.
``roles kept`` (only with a ``"store"`` or ``"loader"`` connector: one with a role)
    A save-only connector (``Role.save``) is never asked for matched tokens nor chosen to
    load; a load-only one (``Role.load``) is never awaited nor expected as a saver, whatever it
    answers.
``breaker kept`` (only with ``health=True``, ``--health``: :mod:`.breaker`)
    An open child is never asked to look up nor chosen to load (who was asked and chosen, as
    the checker saw it, against the book's records before the event), each child's health
    moves only by a declared (source, event, dest) of :data:`~multiconnector.health.HEALTH_TABLE`
    and only on its own event; ``no early free`` and ``no leak`` are judged with the health
    events interleaved as they are without.
``no trap``
    From every reachable state, events other than ``cancel`` can bring every live request to a
    terminal state (``cancel`` would rescue any trap, so it does not count).
``states reached`` / ``transitions fired``
    Every declared state is entered, every declared (source, event, dest) transition fires, and
    no undeclared one does.
"""

from __future__ import annotations

from .._explore import (
    EXIT_STATUS,
    CheckReport,
    Counterexample,
    PropertyResult,
    SearchConfig,
    TraceStep,
    TransitionCoverage,
    UnknownPropertyError,
    declared_transitions,
    explore,
)
from ..usermachine import validate
from .cli import run_cli
from .properties import (
    BREAKER_KEPT,
    CALLBACKS,
    COUNTERS,
    LOAD_ONCE,
    PARAMS_MERGED,
    PROPERTIES,
    RIGHT_OUTCOME,
    ROLES_KEPT,
    reachable_in,
)
from .run import check_aggregator
from .scenario import (
    ALPHABET,
    DEFAULT_CONNECTORS,
    EARLY_REPORTS,
    LOAD_EVENTS,
    PARAM_CHOICES,
    SPLIT_EVENTS,
    TOLD_EVENTS,
    independent,
)

__all__ = [
    "ALPHABET",
    "BREAKER_KEPT",
    "CALLBACKS",
    "COUNTERS",
    "DEFAULT_CONNECTORS",
    "EARLY_REPORTS",
    "EXIT_STATUS",
    "LOAD_EVENTS",
    "LOAD_ONCE",
    "PARAMS_MERGED",
    "PARAM_CHOICES",
    "PROPERTIES",
    "RIGHT_OUTCOME",
    "ROLES_KEPT",
    "SPLIT_EVENTS",
    "TOLD_EVENTS",
    "CheckReport",
    "Counterexample",
    "PropertyResult",
    "SearchConfig",
    "TraceStep",
    "TransitionCoverage",
    "UnknownPropertyError",
    "check_aggregator",
    "declared_transitions",
    "explore",
    "independent",
    "reachable_in",
    "run_cli",
    "validate",
]

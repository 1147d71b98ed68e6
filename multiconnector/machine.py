"""The request transfer state machine: declared once, here.

Every request the aggregator holds is a :class:`RequestTransferState` record whose ``state``
moves through::

    pending ──request_finished──▶ finishing ──transfer_finished / connector_gone (last)──▶ finished
       │   └──request_finished (no async saver)──────────────────────────────────────▶ finished
       └──────────────cancel──────────────▶ cancelled ◀──────────cancel──────────────┘
                                              ⟲ transfer_finished / connector_gone (the drain)

:data:`TRANSITIONS` is the single declaration, in the format of the ``transitions`` package. It is
read by three things that must never disagree:

* the runtime, through :data:`TABLE`, a plain dict compiled from the declaration at import time
  (firing an event on a ``transitions.Machine`` costs ~15 µs; a dict lookup costs ~50 ns);
* :func:`build_machine`, a real ``transitions.Machine`` used by the model checker, the diagram
  generator and the test that proves runtime and declaration agree on every (state, event) pair;
* the guards, which are methods of :class:`RequestTransferState` so that the compiled table and
  the ``transitions`` machine call the very same code.

Terminal states (``finished``, ``cancelled``) are absorbing: no transition leaves them. A
``cancelled`` request still *drains*: a report from a connector it awaits, or that connector's
unregistering, is applied to it without leaving ``cancelled`` (the two self-loops declared
below), so that :meth:`MultiConnector.take <multiconnector.MultiConnector.take>` hands it back
only once no connector may still touch its blocks (see :attr:`RequestTransferState.in_flight`).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from typing import Any, Final, NamedTuple, final

import attrs
from transitions import Machine

from ._table import build_machine_of, compile_table, decisions, events_of

__all__ = [
    "CALL_EVENTS",
    "DECISIONS",
    "EVENTS",
    "STATES",
    "TABLE",
    "TERMINAL",
    "TRANSITIONS",
    "Decision",
    "RequestTransferState",
    "State",
    "Step",
    "build_machine",
    "in_flight_of",
    "load_owed",
    "step",
]


class State(enum.StrEnum):
    """The four states of a request's transfer.

    Members are ``str``: ``State.finished == "finished"``.

    .. versionadded:: 0.1.0
    """

    pending = "pending"
    """Begun; the request has not finished generating."""
    finishing = "finishing"
    """Finished generating; waiting for every connector that saves asynchronously to report."""
    finished = "finished"
    """Every awaited connector reported (or was unregistered): its KV blocks may be freed."""
    cancelled = "cancelled"
    """Cancelled by the caller: it never changes state again, and it is held (draining) until
    every save it awaits and its load in flight are reported or their connectors unregistered."""


STATES: Final[tuple[State, ...]] = tuple(State)
TERMINAL: Final[frozenset[State]] = frozenset({State.finished, State.cancelled})

#: The declaration. Events are named after the aggregator's methods; ``connector_gone`` is fired
#: for each request still awaiting a connector when that connector is unregistered.
#: ``"="`` is the ``transitions`` spelling of "stay in the same state".
TRANSITIONS: Final[tuple[Mapping[str, Any], ...]] = (
    {"trigger": "request_finished", "source": "pending", "dest": "finishing",
     "conditions": "has_savers"},
    {"trigger": "request_finished", "source": "pending", "dest": "finished",
     "unless": "has_savers"},
    {"trigger": "transfer_finished", "source": "finishing", "dest": "finished",
     "conditions": "is_last"},
    {"trigger": "transfer_finished", "source": "finishing", "dest": "=",
     "unless": "is_last"},
    {"trigger": "connector_gone", "source": "finishing", "dest": "finished",
     "conditions": "is_last"},
    {"trigger": "connector_gone", "source": "finishing", "dest": "=",
     "unless": "is_last"},
    {"trigger": "cancel", "source": ["pending", "finishing"], "dest": "cancelled"},
    # The drain: a cancelled request awaiting a name is released from it, and stays cancelled.
    {"trigger": "transfer_finished", "source": "cancelled", "dest": "="},
    {"trigger": "connector_gone", "source": "cancelled", "dest": "="},
)  # fmt: skip

INITIAL: Final = State.pending


EVENTS: Final[tuple[str, ...]] = events_of(TRANSITIONS)

#: Which event each of the aggregator's calls can fire, beside the declaration it fires into
#: (the model checker reads it to know which transitions an alphabet of calls can reach). An
#: event is named after the call that fires it, but for three calls: ``request_finished_by``
#: (the told form) fires ``request_finished``; ``transfer_finished_many`` fires
#: ``transfer_finished``, once per report; ``unregister`` fires ``connector_gone``, once per
#: request awaiting the name. No other call fires one (``begin`` makes a record in
#: :data:`INITIAL`; a load report changes the record, not its state).
CALL_EVENTS: Final[Mapping[str, str]] = {
    "request_finished": "request_finished",
    "request_finished_by": "request_finished",
    "transfer_finished": "transfer_finished",
    "transfer_finished_many": "transfer_finished",
    "cancel": "cancel",
    "unregister": "connector_gone",
}


class Step(NamedTuple):
    """One applied transition in a request's opt-in history."""

    event: str
    source: State
    dest: State
    name: str | None
    """The connector the event concerned, when it concerned one."""


@final
@attrs.define(slots=True, eq=True, weakref_slot=False, repr=True)
class RequestTransferState:
    """The transfer bookkeeping of one request.

    One small slotted record per request, driven by the compiled table of the one shared
    declaration: no ``transitions.Machine`` and no ``add_model`` per request, which would cost tens
    of microseconds and kilobytes each.

    Records are owned by the aggregator while the request is held; :meth:`MultiConnector.take
    <multiconnector.MultiConnector.take>` hands terminal ones over, after which nothing refers
    to them. Read them, don't mutate them.

    Records compare by value: two records are equal when every field is (the request id, the
    state, the names awaited, expected and abandoned, the loader and the parts of a split load,
    the params and the history),
    so a snapshot of ``records()`` or ``take()`` compares with ``==``. A record changes as its
    request does, so it is not hashable (``hash(record)`` raises ``TypeError``): key a table by
    ``record.request_id``.

    .. versionadded:: 0.1.0
    """

    request_id: str
    state: State = State.pending
    #: Names still owing a "transfer finished" report, in registration order.
    awaiting: tuple[str, ...] = ()
    #: Names that said, at request finished, that they save asynchronously.
    expected: tuple[str, ...] = ()
    #: Awaited names whose connector was unregistered before reporting.
    abandoned: tuple[str, ...] = ()
    #: The connector chosen to load this request's KV, if any.
    loader: str | None = None
    #: Whether the chosen loader reported its load finished (applied, or drained once the
    #: request was terminal): true only then.
    loaded: bool = False
    #: Whether the chosen loader was unregistered: before it reported (its load is over,
    #: unreported; ``loaded`` stays false), or while the request was live. A load report under
    #: its name (even from a new connector) is then ignored as ``unregistered``.
    loader_gone: bool = False
    #: A split load's further loaders, in the order of their token ranges (the first range is
    #: ``loader``'s): each owes a load report of its own. Empty for a load from one connector.
    parts: tuple[str, ...] = ()
    #: Those of ``parts`` that have neither reported (applied, or drained once the request was
    #: terminal) nor been unregistered.
    parts_owed: tuple[str, ...] = ()
    #: The merged transfer params returned at request finished.
    params: dict[str, Any] | None = None
    #: Applied transitions, when the aggregator traces; ``None`` otherwise.
    history: list[Step] | None = None

    # Guards. They are read by name from TRANSITIONS, by the compiled table and by transitions.
    def has_savers(self, savers: tuple[str, ...]) -> bool:
        """Some connector said it saves asynchronously."""
        return len(savers) > 0

    def is_last(self, name: str) -> bool:
        """``name`` is the only name still awaited."""
        return self.awaiting == (name,)

    @property
    def reported(self) -> tuple[str, ...]:
        """Names that reported their transfer finished."""
        return tuple(n for n in self.expected if n not in self.awaiting and n not in self.abandoned)

    @property
    def in_flight(self) -> bool:
        """Whether a connector may still touch the request's blocks: it awaits a save, or its
        load is :attr:`loading`. A terminal request is handed back by ``take()`` only once this
        is false; until then it is *draining*."""
        return in_flight_of(
            self.awaiting, self.parts_owed, self.loader, self.loaded, self.loader_gone
        )

    @property
    def loading(self) -> bool:
        """Whether a loader still owes its report: the chosen loader has neither reported nor
        been unregistered (:func:`load_owed`), or a split load's further part is owed
        (:attr:`parts_owed`). Until then the request's load has not all arrived.

        .. versionadded:: 0.1.0
        """
        return bool(self.parts_owed) or load_owed(self.loader, self.loaded, self.loader_gone)

    @property
    def owed_loads(self) -> tuple[str, ...]:
        """The names that still owe a load report (:meth:`owes_load`): the loader, then a
        split load's :attr:`parts_owed`."""
        loader = self.loader
        if loader is not None and load_owed(loader, self.loaded, self.loader_gone):
            return (loader, *self.parts_owed)
        return self.parts_owed

    def owes_load(self, name: str) -> bool:
        """Whether connector ``name`` still owes a load report: it is the chosen loader and its
        load is owed (:func:`load_owed`), or one of a split load's :attr:`parts_owed`."""
        if name == self.loader:
            return load_owed(name, self.loaded, self.loader_gone)
        return name in self.parts_owed

    @property
    def terminal(self) -> bool:
        """Whether the request reached ``finished`` or ``cancelled``."""
        return self.state in TERMINAL


def load_owed(loader: str | None, loaded: bool, loader_gone: bool) -> bool:
    """Whether a request's load is still owed, from its record's ``loader``, ``loaded`` and
    ``loader_gone``: a loader was chosen, and it has neither reported (applied, or drained on a
    terminal request) nor been unregistered (its load is then over, unreported). Until then the
    loader may touch the request's blocks: :func:`in_flight_of` with no save awaited and no
    part owed, which spells it.

    Defined here, beside the record whose :attr:`~RequestTransferState.in_flight` reads it
    (this module is below :mod:`multiconnector.rule`, which cannot be imported here); every
    other side reads it as :func:`multiconnector.rule.load_owed`."""
    return in_flight_of((), (), loader, loaded, loader_gone)


def in_flight_of(
    awaiting: tuple[str, ...],
    parts_owed: tuple[str, ...],
    loader: str | None,
    loaded: bool,
    loader_gone: bool,
) -> bool:
    """:attr:`RequestTransferState.in_flight` from the fields it reads: a save is awaited, a
    split load's part is owed, or the load is (a loader was chosen, and it has neither reported
    nor been unregistered: :func:`load_owed`). The one spelling of both: the aggregator asks it
    of fields it is about to write (:func:`multiconnector.rule.safe_to_hand_back`). Spelled out
    here, not through :func:`load_owed`: "safe to hand back" is asked once per request that
    ends, and a second call costs the lifecycle about 2 % (``bench.ab_lifecycle``)."""
    return (
        bool(awaiting)
        or bool(parts_owed)
        or (loader is not None and not loaded and not loader_gone)
    )


Guard = Callable[[RequestTransferState, Any], bool]
#: A compiled transition: one guard (``None``: always), the value it must return, destination.
Compiled = tuple[Guard | None, bool, State]

#: ``TABLE[state][event]`` lists the candidate transitions in declaration order
#: (compiled by :func:`multiconnector._table.compile_table`, as the health machine is).
TABLE: Final[Mapping[State, Mapping[str, tuple[Compiled, ...]]]] = compile_table(
    TRANSITIONS, State, RequestTransferState
)


def step(record: RequestTransferState, event: str, arg: Any) -> State | None:
    """The state ``event`` leads ``record`` to, or ``None`` when no transition applies.

    Does not change ``record``: the aggregator applies the result together with its own
    bookkeeping, under the request's lock. The first candidate whose guards hold wins, exactly as
    in ``transitions``.
    """
    for guard, want, dest in TABLE[record.state].get(event, ()):
        if guard is None or guard(record, arg) is want:
            return dest
    return None


#: ``(guard, dest when it holds, dest otherwise)``; a ``None`` guard always holds, a ``None``
#: destination means "no transition". The hot path's form of a (state, event) entry of TABLE.
Decision = tuple[Guard | None, State | None, State | None]


#: ``DECISIONS[event][state]``: TABLE specialised per event, for the aggregator's hot path, which
#: evaluates ``yes if guard is None or guard(record, arg) else no`` instead of calling
#: :func:`step` (:func:`multiconnector.rule.decide`, the one place an entry is applied).
#: Derived from TABLE, so from TRANSITIONS, and complete: every (state, event) pair is there, or
#: the module does not load (:class:`InvalidMachineError` when some pair's candidates need a
#: walk). Guards return ``bool``.
DECISIONS: Final[Mapping[str, Mapping[State, Decision]]] = decisions(TABLE, EVENTS, STATES)


def build_machine(**kwargs: Any) -> Machine:
    """A ``transitions.Machine`` built from the declaration, with no model attached.

    Fire events on any object that has a ``state`` attribute and the guard methods (a
    :class:`RequestTransferState` does) with ``machine.events[event].trigger(obj, arg)``. Extra
    keyword arguments go to the machine class; pass ``machine_cls`` to pick one (a
    ``GraphMachine`` for diagrams, say), and ``model`` to attach one.

    A ``GraphMachine`` draws its models: built with no model, its ``get_graph()`` raises
    ``IndexError`` (``transitions`` reads ``models[0]``). Attach any object that takes
    attributes (drawing calls no guard): ``build_machine(machine_cls=GraphMachine,
    model=types.SimpleNamespace())``; a slotted :class:`RequestTransferState` cannot take the
    trigger methods ``transitions`` adds. Or draw with :func:`multiconnector.diagram.render`.
    """
    return build_machine_of(TRANSITIONS, STATES, INITIAL, **kwargs)

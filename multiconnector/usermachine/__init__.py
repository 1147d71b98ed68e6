"""Your own ``transitions`` state machine: load it, check it, validate it.

:func:`check_machine` explores any ``transitions`` machine with
:func:`~multiconnector.check.explore`
and reports, in the same :class:`~multiconnector.check.CheckReport` as ``multiconnector check``:

``no exception``
    Firing an event (guards and callbacks included, when they run) raises nothing.
``no deadlock``
    Every reachable state that is not final has an event that can fire.
``no overlapping guards``
    No reachable state has two transitions for one event, to different states, that can both
    fire (``transitions`` would silently take the first): with a model factory, whose guards
    both hold on that state's model; with free guards, whose guard names do not tell them
    apart (one name under ``conditions`` and ``unless`` does). See :mod:`.overlap`.
``final states final``
    No transition leaves a final state.
your invariants
    Each a predicate over the model, in the order given.
``no trap``
    From every reachable state some final state is still reachable.
``states reached`` / ``transitions fired``
    Every declared state is entered; every declared transition fires.

Guards are your code. With a model factory, the machine is explored on fresh models from it and
guards, callbacks and model data are real (a state is the model's state plus its data). Without
one, every guard is a free choice: each named condition may be true or false whenever an event
is fired, consistently within one firing, and transitions are taken in declaration order, first
match wins, as ``transitions`` does. The report's bounds say which was done. A trace shows
each state with its model's values after that step (``closed (failures=2)``).

Final states are those declared ``final`` (``{"name": "done", "final": True}``, a
``transitions`` ``State(final=True)``, or a ``"final"`` list in a declaration). A machine that
declares none has its states with no transition out taken as final, and the report says so.
``to_<state>`` auto transitions are left out: they would make every state reachable from every
other one.
"""

from __future__ import annotations

from .._explore import NO_EXCEPTION, NO_TRAP, STATES_REACHED, TRANSITIONS_FIRED
from ..errors import InvalidMachineError
from .analysis import (
    DEFAULT_MODEL_STATES,
    DETERMINISTIC,
    FINAL_IS_FINAL,
    NO_DEADLOCK,
    check_machine,
    problems,
    validate,
)
from .declaration import Candidate, Declared, declare, load
from .diagram import Diagram, draw, path_of

__all__ = [
    "DEFAULT_MODEL_STATES",
    "DETERMINISTIC",
    "FINAL_IS_FINAL",
    "NO_DEADLOCK",
    "NO_EXCEPTION",
    "NO_TRAP",
    "STATES_REACHED",
    "TRANSITIONS_FIRED",
    "Candidate",
    "Declared",
    "Diagram",
    "InvalidMachineError",
    "check_machine",
    "declare",
    "draw",
    "load",
    "path_of",
    "problems",
    "validate",
]

"""How a machine declared in the ``transitions`` format becomes a runtime table: shared by
:mod:`multiconnector.machine` (a request's transfer) and :mod:`multiconnector.health` (a
child's health), so that both machines are compiled, and refused, by the same rules.

A declaration is a sequence of ``transitions`` dicts (``trigger``, ``source``, ``dest``, at
most one guard in ``conditions`` or ``unless``, ``"="`` for "stay"). It is compiled into
``table[state][event]``: the candidate transitions in declaration order, each ``(guard, the
value it must return, destination)``, where a guard is the record class's method of that name
(so the compiled table and a ``transitions.Machine`` call the very same code). A
:func:`decision` is one (state, event) pair's candidates as one guard call, for hot paths.
:func:`build_machine_of` builds the real ``transitions.Machine`` of a declaration, for the
model checker, the diagrams and the tests.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from transitions import Machine

from .errors import InvalidMachineError

__all__ = [
    "as_list",
    "build_machine_of",
    "compile_table",
    "decision",
    "decisions",
    "events_of",
    "guard_of",
]

S = TypeVar("S", bound=enum.Enum)

#: A guard: a record class's method, called with the record and the event's argument.
Guard = Callable[[Any, Any], bool]
#: A compiled transition: one guard (``None``: always), the value it must return, destination.
Compiled = tuple[Guard | None, bool, S]
#: ``(guard, dest when it holds, dest otherwise)``; a ``None`` guard always holds, a ``None``
#: destination means "no transition".
Decision = tuple[Guard | None, S | None, S | None]


def as_list(value: Any) -> list[str]:
    """A declaration field (``None``, one name, or several) as a list of names."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def events_of(transitions: Iterable[Mapping[str, Any]]) -> tuple[str, ...]:
    """The declaration's triggers, each once, in declaration order."""
    seen: dict[str, None] = {}
    for t in transitions:
        seen.setdefault(t["trigger"], None)
    return tuple(seen)


def guard_of(
    record_cls: type[Any], conds: list[str], unless: list[str]
) -> tuple[Guard | None, bool]:
    """A transition's guard (``record_cls``'s method) and the value it must return: at most
    one guard per transition (the runtime's decisions call one), or the module does not load."""
    if not conds and not unless:
        return None, True
    if len(conds) + len(unless) > 1:
        raise InvalidMachineError(
            [f"a transition has several guards ({', '.join(conds + unless)}): declare one"]
        )
    name = (conds or unless)[0]
    guard: Guard = getattr(record_cls, name)
    return guard, bool(conds)


def compile_table(
    transitions: Iterable[Mapping[str, Any]], states: type[S], record_cls: type[Any]
) -> dict[S, dict[str, tuple[Compiled[S], ...]]]:
    """``table[state][event]``: the candidates of each (state, event) pair, in declaration
    order (the first whose guard holds wins, exactly as in ``transitions``)."""
    table: dict[S, dict[str, list[Compiled[S]]]] = {s: {} for s in states}
    for t in transitions:
        guard, want = guard_of(record_cls, as_list(t.get("conditions")), as_list(t.get("unless")))
        for source in (states(s) for s in as_list(t["source"])):
            dest = source if t["dest"] == "=" else states(t["dest"])
            table[source].setdefault(t["trigger"], []).append((guard, want, dest))
    return {s: {e: tuple(ts) for e, ts in events.items()} for s, events in table.items()}


def decision(candidates: tuple[Compiled[S], ...]) -> Decision[S] | None:
    """One guard call instead of a walk, when the candidates allow it; ``None`` when not."""
    if not candidates:
        return None, None, None
    guard, want, dest = candidates[0]
    if guard is None:
        return None, dest, None
    if len(candidates) == 1:
        return (guard, dest, None) if want else (guard, None, dest)
    other, other_want, other_dest = candidates[1]
    # The second candidate takes exactly the cases the first refuses: later ones never run.
    if other is None or (other is guard and other_want is not want):
        return (guard, dest, other_dest) if want else (guard, other_dest, dest)
    return None


def decisions(
    table: Mapping[S, Mapping[str, tuple[Compiled[S], ...]]],
    events: tuple[str, ...],
    states: Iterable[S],
) -> dict[str, dict[S, Decision[S]]]:
    """Every (state, event) pair's :func:`decision`; :class:`InvalidMachineError` (at import)
    when some pair's candidates need a walk."""
    found: dict[str, dict[S, Decision[S]]] = {event: {} for event in events}
    walks = []
    for event in events:
        for state in states:
            one = decision(table[state].get(event, ()))
            if one is None:
                walks.append(f"{event} from {state.value}: its candidates need more than one guard")
            else:
                found[event][state] = one
    if walks:
        raise InvalidMachineError(walks)
    return found


def build_machine_of(
    transitions: Iterable[Mapping[str, Any]],
    states: Iterable[enum.Enum],
    initial: enum.Enum,
    /,
    *,
    machine_cls: type[Machine] = Machine,
    model: Any = None,
    **kwargs: Any,
) -> Machine:
    """A ``machine_cls`` (a ``transitions.Machine`` by default) built from the declaration:
    ``states`` in order, ``initial``, no ``to_<state>`` events, invalid triggers raised, and
    ``model`` attached (none by default). Extra keyword arguments go to the machine class."""
    return machine_cls(
        model=model,
        states=[s.value for s in states],
        initial=initial.value,
        transitions=[dict(t) for t in transitions],
        auto_transitions=False,
        ignore_invalid_triggers=False,
        **kwargs,
    )

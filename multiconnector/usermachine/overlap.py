"""``no overlapping guards``: one event, two transitions to different states, both allowed at once.

``transitions`` tries an event's transitions in declaration order and takes the first whose
guards hold, so two that can both fire hide a decision: the second is silently never taken in
the states where both hold. Whether they can both hold is judged two ways:

* with a model factory, on what the guards *say*: in every explored state, each pair's guards
  run on that state's model, as ``transitions`` runs them; the pair overlaps only where both
  hold, and the counterexample ends in that state, its model's values shown;
* with free guards (no model factory), on the guards' *names*: two transitions overlap unless
  one requires a guard the other refuses (``conditions="x"`` and ``unless="x"``), since nothing
  else says two differently named guards cannot hold together.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from transitions.core import EventData

from .declaration import Candidate, Declared
from .values import values_text

__all__ = ["by_guards", "by_names", "overlap"]


def overlap(a: Candidate, b: Candidate) -> bool:
    """Whether some guard values let both ``a`` and ``b`` fire (a name required by one and
    refused by the other separates them; the same name required twice does not)."""
    if set(a.conditions) & set(a.unless) or set(b.conditions) & set(b.unless):
        return False
    return not (set(a.conditions) & set(b.unless) or set(a.unless) & set(b.conditions))


def _both(trigger: str, source: str, a: Candidate, b: Candidate) -> str:
    return (
        f"{trigger!r} in {source!r} can take both -> {a.dest}"
        + (f" [{a.guard_text}]" if a.guard_text else "")
        + f" and -> {b.dest}"
        + (f" [{b.guard_text}]" if b.guard_text else "")
    )


def _pairs(declared: Declared) -> dict[str, list[tuple[str, int, int]]]:
    """Per state: the ``(trigger, i, j)`` pairs of its candidates that lead to different states
    (``i``, ``j``: their places among the trigger's candidates there)."""
    pairs: dict[str, list[tuple[str, int, int]]] = {}
    for trigger in declared.triggers:
        for source in declared.states:
            group = declared.candidates(source, trigger)
            for (i, a), (j, b) in itertools.combinations(enumerate(group), 2):
                if a.dest != b.dest:
                    pairs.setdefault(source, []).append((trigger, i, j))
    return pairs


def by_names(declared: Declared) -> Callable[[Any], object]:
    """The property with free guards: per state, the pairs whose guard names can hold at once."""
    clashes: dict[str, list[str]] = {}
    for source, pairs in _pairs(declared).items():
        for trigger, i, j in pairs:
            group = declared.candidates(source, trigger)
            if overlap(group[i], group[j]):
                clashes.setdefault(source, []).append(
                    _both(trigger, source, group[i], group[j]) + " (transitions takes the first)"
                )

    def no_overlapping_guards(run: Any) -> object:
        """no event has two transitions, to different states, whose guards can hold at once"""
        found = clashes.get(run.state)
        return "; ".join(found) if found else None

    return no_overlapping_guards


def _holds(run: Any, trigger: str, index: int) -> bool:
    """Whether the guards of the ``index``-th transition of ``trigger`` out of ``run``'s state
    hold on its model, run as ``transitions`` runs them (no event arguments). A guard that
    raises counts as not holding: firing the event reports it, as ``no exception``."""
    machine = run.machine
    event = machine.events.get(trigger)
    candidates = event.transitions.get(run.state, ()) if event is not None else ()
    if index >= len(candidates):
        return False
    data = EventData(machine.get_state(run.state), event, machine, run.model, (), {})
    try:
        return all(c.check(data) for c in candidates[index].conditions)
    except Exception:  # the user's guard: reported as "no exception" when the event fires
        return False


def by_guards(declared: Declared) -> Callable[[Any], object]:
    """The property with real models: per explored state, the pairs whose guards both hold on
    its model."""
    pairs = _pairs(declared)

    def no_overlapping_guards(run: Any) -> object:
        """no event has two transitions, to different states, whose guards both hold in a state"""
        found = []
        for trigger, i, j in pairs.get(run.state, ()):
            if _holds(run, trigger, i) and _holds(run, trigger, j):
                group = declared.candidates(run.state, trigger)
                found.append(_both(trigger, run.state, group[i], group[j]))
        if not found:
            return None
        values = values_text(run.model, run.attribute)
        where = f" with {values}" if values else ""
        return "; ".join(found) + f": both guards hold here{where} (transitions takes the first)"

    return no_overlapping_guards

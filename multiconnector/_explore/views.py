"""The search by views: each actor's part of a state, explored once, instead of every combination.

With ``explore(views=...)`` the model's state is read as one *view* per actor (the request,
say): what that actor's future and verdicts depend on, the shared part included (the registry).
A state found is kept (expanded) only when one of its views is new, and from it only the events
of the actors whose view is new there, and the events of no actor (``actor(event) is None``),
are applied. Views, not combinations of them, are what the search then enumerates: two
requests with eight interchangeable names cost about what one request costs.

Why the verdicts are those of the whole search, under the assumption that actors interact only
through the events of no actor (the registry's, ``take``): an actor's event changes only that
actor's view, and an event of no actor changes each view by what that view holds alone. Then a
run of the whole model, projected on one actor, is a run of that actor's view; induction on its
length shows every view it passes is found no deeper than there, from a kept state that applies
the run's next event (or its renamed image, when views are canonical). So every view is found
at its depth and every (view, event) transition is applied and checked at least once, in some
context of the other actors: a property judged per actor on states and transitions reaches the
same verdict, with a counterexample no longer. ``no trap`` is judged on the graph of views
(``goal`` per view): with terminal states absorbing, every actor can reach its goal in turn
exactly when each view can reach a goal. What the assumption hides is a bug by which one actor's
events change another's view: found only in the contexts the search happens to keep.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Hashable, Iterable
from typing import Any

#: One actor's view of a state: (actor, its own part, its context, whether it is a goal for that
#: actor). The view's key is (own part, context); an actor's event may change only its own.
View = tuple[Hashable, Hashable, Hashable, bool]


class _Views:
    """The views found, the states kept for them, and the graph of views (for ``no trap``)."""

    def __init__(
        self,
        views: Callable[[Any], Iterable[View]],
        actor: Callable[[Any], Hashable | None],
        ways_out: Callable[[Any], bool] | None,
    ) -> None:
        self.read, self.actor, self.ways_out = views, actor, ways_out
        #: View key -> its number, in the order found (so breadth-first).
        self.ids: dict[Hashable, int] = {}
        #: Each view's first state (the kept state that found it), and whether it is a goal.
        self.first = array("i")
        self.goals = bytearray()
        #: Per kept state: each actor's view number and own part, and the actors whose view was
        #: new there.
        self.numbers: list[dict[Hashable, int]] = []
        self.owns: list[dict[Hashable, Hashable]] = []
        self.new: list[frozenset[Hashable]] = []
        #: The view graph's edges (ways out only).
        self.src = array("i")
        self.dst = array("i")
        #: Events not applied: another actor's, from a state kept for a view not theirs.
        self.skipped = 0

    def arrive(
        self, model: Any, sid: int, *, room: bool = True
    ) -> tuple[dict[Hashable, int], dict[Hashable, Hashable]] | None:
        """The view numbers and own parts of a state not kept before. It is kept when one of
        its views is new and ``room`` (no ``max_states`` bound reached): its new views are
        numbered as found by state ``sid`` (the number the state then gets). ``None``: it has a
        new view, and no room."""
        ids = self.ids
        seen = [
            (actor, (own, context), goal, ids.get((own, context)))
            for actor, own, context, goal in self.read(model)
        ]
        new = frozenset(actor for actor, _, _, number in seen if number is None)
        if new and not room:
            return None
        numbers: dict[Hashable, int] = {}
        owns = {actor: key[0] for actor, key, _, _ in seen}
        for actor, key, goal, known in seen:
            # (two actors may have the same new view: it is numbered by the first)
            number = known if known is not None else ids.get(key)
            if number is None:
                number = ids[key] = len(ids)
                self.first.append(sid)
                self.goals.append(1 if goal else 0)
            numbers[actor] = number
        if new:
            self.numbers.append(numbers)
            self.owns.append(owns)
            self.new.append(new)
        return numbers, owns

    def kept(self, numbers: dict[Hashable, int]) -> bool:
        """Whether :meth:`arrive` kept the state it gave ``numbers`` for."""
        return bool(self.numbers) and self.numbers[-1] is numbers

    def applies(self, sid: int, event: Any) -> bool:
        """Whether the kept state ``sid`` applies ``event`` (of no actor, or a new view's)."""
        who = self.actor(event)
        if who is None or who in self.new[sid]:
            return True
        self.skipped += 1
        return False

    def edge(
        self,
        sid: int,
        event: Any,
        found: tuple[dict[Hashable, int], dict[Hashable, Hashable]],
    ) -> str | None:
        """The view edges of ``event`` applied in kept state ``sid``, to a state of ``found``
        (its view numbers and own parts); a message when the event, an actor's, changed another
        actor's own part (the assumption broken,
        :data:`~multiconnector._explore.report.ACTORS_APART`)."""
        who = self.actor(event)
        here = self.numbers[sid]
        numbers, owns = found
        if who is not None:
            mine = self.owns[sid]
            moved = [a for a, own in mine.items() if a != who and owns.get(a) != own]
            if moved:
                return (
                    f"an event of {who!r} changed the view of {', '.join(map(repr, moved))}: "
                    "actors interact otherwise than through the events of no actor"
                )
        if self.ways_out is not None and not self.ways_out(event):
            return None
        for actor in self.new[sid]:
            if who is None or who == actor:
                source, target = here[actor], numbers.get(actor)
                if target is not None and target != source:
                    self.src.append(source)
                    self.dst.append(target)
        return None

    @property
    def edges(self) -> tuple[array[int], array[int]]:
        return self.src, self.dst

    def open_views(self, open_states: bytearray) -> bytearray:
        """1 for each view whose kept state a bound left not fully expanded."""
        opened = bytearray(len(self.ids))
        for sid, flag in enumerate(open_states):
            if flag:
                for actor in self.new[sid]:
                    opened[self.numbers[sid][actor]] = 1
        return opened

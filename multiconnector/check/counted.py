"""The counted connectors of the scenario: :class:`_Rank`, and the events they add.

A connector of kind :data:`~.scenario.COUNTED` stands for a vLLM child whose transfers are
reported on :data:`~.scenario.COUNTED_RANKS` workers only, booked as the vLLM adapter books one
(``multiconnector.vllm.counted``): it is registered on the aggregator under its report names,
``<name>@1`` and ``<name>@2`` (:func:`~.scenario.rank_names`), each a :class:`_Rank`. When it
saves (a ``request_finished`` event lists it among the savers), both answer that they save, so
the request awaits both names. When it loads, the load is the split load of its names
(``choose_loader(r, name@1, parts=[name@2])``, a ``split_load`` event). Its reports name no
rank: ``counted_save`` and ``counted_load`` events, "a counted report of a save (of a load) of
request r", each of which the world applies to the name
:func:`multiconnector.rule.counted_name` picks on the request's record, exactly as the adapter
does; the checker's ledger settles the name its own reference picks
(:func:`.reference.counted_rank`), and the properties compare the two.

The report names are registered once and never unregistered, as in the adapter: ``register``
and ``unregister`` leave a counted connector alone, and no ``transfer_finished`` or
``load_finished`` names one of its names directly (only its own reports do). Nor does a counted
report come while a ``request_finished`` or a ``match_tokens`` asks about its request: the
adapter's scheduler makes those calls and applies the reports on one thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

from .scenario import _PENDING, COUNTED_LOAD, COUNTED_SAVE, Event, _Pad

if TYPE_CHECKING:
    from .scenario import _World


class _Rank:
    """One report name of a counted connector: it answers ``request_finished`` as its
    connector does (it saves when the event lists that connector), and 0 tokens to a match (a
    counted connector's load is chosen by a ``split_load`` event, as the adapter chooses it);
    like the adapter's slots, it has no callbacks."""

    def __init__(self, name: str, owner: str, pad: _Pad) -> None:
        self.name, self.owner, self.pad = name, owner, pad

    def request_finished(self, request_id: str, blocks: Sequence[int]) -> tuple[bool, None]:
        saves = self.owner in self.pad.savers
        self.pad.asked.append((self.name, saves))
        return saves, None

    def get_num_new_matched_tokens(self, request_id: str, num_computed_tokens: int) -> int:
        if self.name in self.pad.bypassed:  # its health is open: not asked
            return 0
        self.pad.matched.append((self.name, 0))
        return 0

    def __repr__(self) -> str:
        return f"rank {self.name} of counted {self.owner}"


def counted_savers(world: _World) -> list[str]:
    """The counted connectors whose report names are all registered and ready: each a possible
    saver of a ``request_finished`` event."""
    ready = {n for n, on in world.registry if on}
    return [n for n, ranks in world.scenario.ranks.items() if ready.issuperset(ranks)]


def counted_events(world: _World, ids: Iterable[int]) -> list[Event]:
    """The counted connectors' events of the requests ``ids``: with ``transfer_finished`` in
    the alphabet, each one's save report; with ``load_finished``, its load report; with
    ``split_load``, its load chosen on a pending request (no call asking about it). A request
    a ``request_finished`` or a ``match_tokens`` asks about has none."""
    scenario = world.scenario
    if not scenario.ranks:
        return []
    alphabet = scenario.alphabet
    calm = [i for i in ids if not (world.requests[i].asking or world.requests[i].matching)]
    owners = counted_savers(world)
    out: list[Event] = []
    if "transfer_finished" in alphabet:
        out += [(COUNTED_SAVE, i, n) for i in calm for n in scenario.ranks]
    if "split_load" in alphabet:
        pending = [i for i in calm if (view := world.requests[i].view) and view[0] is _PENDING]
        out += [("split_load", i, *scenario.ranks[n]) for i in pending for n in owners]
    if "load_finished" in alphabet:
        out += [(COUNTED_LOAD, i, n) for i in calm for n in scenario.ranks]
    return out

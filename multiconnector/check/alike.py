"""Alike events: those that would do exactly what an event just applied did, from that state.

:func:`_alike` names them for :func:`~multiconnector._explore.explore` (``alike=``), which then
does not apply them from that state: the ``request_finished`` choices nobody was asked about,
and the images of the event under the renamings that map the state onto itself (found by
:mod:`.canonical`), listed without trying every permutation of the names.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

from .canonical import arrangements
from .events import _finishing
from .scenario import _PER_REQUEST, COUNTED_LOAD, COUNTED_SAVE, Event, _World


def _alike(world: _World, event: Event) -> tuple[Event, ...]:
    """The events that would have done what ``event`` just did from the same state.

    The ``request_finished`` events of one request differ only in what the scripted savers
    answer when asked (every subset of them saving). When nobody was asked (the call was
    refused, or no saver is ready), the subset was never read: the aggregator ran the same code
    on the same state, so every subset leads to the same state with the same verdicts.
    """
    scenario = world.scenario
    same: list[Event] = []
    if event[0] == "request_finished" and not scenario.pad.asked:
        same += _finishing(world, event[1])
    automorphisms, classes = world.fixed
    if automorphisms:
        # A renaming that maps the state onto itself maps ``event`` to an event that leads to
        # the renamed next state, whose canonical snapshot is the same, with renamed verdicts.
        position = {name: i for i, (name, _) in enumerate(world.registry)}
        # A counted connector saves at its first name's place (events._finishing).
        position.update((n, position.get(r[0], -1)) for n, r in scenario.ranks.items())
        chosen = _chosen_alike(event, classes, position) if not scenario.params else None
        for alike in _permuted(event, classes, position) if chosen is None else chosen:
            for perm, rename in automorphisms:
                if chosen is not None and not rename and _unmoved(perm):
                    same.append(alike)  # made as _events lists it: its own image
                    continue
                image = _image(alike, perm, rename, position)
                if image is not None:
                    same.append(image)
    return tuple(same)


def _unmoved(perm: tuple[int, ...]) -> bool:
    """Whether ``perm`` renumbers no request."""
    return all(i == p for i, p in enumerate(perm))


def _chosen_alike(
    event: Event, classes: Sequence[Sequence[str]], position: Mapping[str, int]
) -> list[Event] | None:
    """A finishing event without params (``request_finished``'s savers saving, or
    ``request_finished_by``'s savers told) and every event that chooses as many of each class's
    names, the others alike (``event`` first), in the form :func:`~.events._events` lists them:
    :func:`_permuted`'s events for these kinds, made by choosing names instead of arranging
    labels (the told events of eight interchangeable ranks made that the search's largest
    cost). ``None`` for another kind of event."""
    kind = event[0]
    if kind not in ("request_finished", "request_finished_by") or (
        kind == "request_finished" and len(event) > 3
    ):
        return None
    chosen = set(event[2])
    fixed = [n for n in event[2] if not any(n in c for c in classes)]
    ways = [itertools.combinations(c, sum(n in chosen for n in c)) for c in classes]
    out = [event]
    for choice in itertools.product(*ways):
        names = [*fixed, *(n for part in choice for n in part)]
        names.sort(key=lambda n: position.get(n, -1))
        alike = (kind, event[1], tuple(names), *event[3:])
        if alike != event:
            out.append(alike)
    return out


def _permuted(
    event: Event, classes: Sequence[Sequence[str]], position: Mapping[str, int]
) -> Iterator[Event]:
    """``event`` with its names permuted within ``classes`` in every way (``event`` first):
    every distinct event, made without trying every permutation.

    An event names a connector, or gives each of a set of savers a label (whether it saves and
    its params choice, or its token answer); permuting a class's names permutes the labels
    among them, so the events are the distinct arrangements of each class's labels."""
    yield event
    kind = event[0]
    if not classes or kind not in _RENAMED:
        return
    if kind in (
        "unregister",
        "register",
        "transfer_finished_many",
        "transfer_finished",
        "load_finished",
    ):
        at = 1 if kind in ("unregister", "register", "transfer_finished_many") else 2
        for members in classes:
            if event[at] in members:
                for other in members:
                    if other != event[at]:
                        yield (*event[:at], other, *event[at + 1 :])
        return
    # request_finished (the savers saving, and with params their choices) or match_tokens
    # (each ready saver's token answer): a label per name.
    labels: dict[str, Any] = {}
    if kind == "match_tokens":
        labels = dict(event[2])
    elif kind == "request_finished_by":  # the savers told (what follows them: unchanged)
        labels = {n: (True, None) for n in event[2]}
    else:
        choices = dict(event[3]) if len(event) > 3 else {}
        labels = {n: (True, choices.get(n)) for n in event[2]}
        labels.update({n: (False, c) for n, c in choices.items() if n not in labels})
    per_class = [
        [
            dict(zip(members, arranged, strict=True))
            for arranged in arrangements([labels.get(n, _UNLABELLED) for n in members])
        ]
        for members in classes
    ]
    for choice in itertools.product(*per_class):
        relabelled = dict(labels)
        for assigned in choice:
            for n, label in assigned.items():
                if label is _UNLABELLED:
                    relabelled.pop(n, None)
                else:
                    relabelled[n] = label
        if relabelled == labels:
            continue
        names = sorted(relabelled, key=lambda n: position.get(n, -1))
        if kind == "match_tokens":
            yield (kind, event[1], tuple((n, relabelled[n]) for n in names))
            continue
        saving = tuple(n for n in names if relabelled[n][0])
        if kind == "request_finished_by":
            yield (kind, event[1], saving, *event[3:])
        elif len(event) == 3:
            yield (kind, event[1], saving)
        else:
            chosen = tuple((n, relabelled[n][1]) for n in names if relabelled[n][1] is not None)
            yield (kind, event[1], saving, chosen)


#: The kinds of events that name connectors (the others are only renumbered).
_RENAMED: Final = frozenset(
    {
        "unregister",
        "register",
        "transfer_finished_many",
        "transfer_finished",
        "load_finished",
        "request_finished",
        "request_finished_by",
        "match_tokens",
    }
)
_UNLABELLED: Final = object()


def _image(
    event: Event, perm: tuple[int, ...], rename: Mapping[str, str], position: Mapping[str, int]
) -> Event | None:
    """``event`` with its request and connector names renamed, in the form :func:`_events`
    lists it (a set of names in registration order); ``None`` for a kind it does not know."""
    kind = event[0]
    if kind in ("unregister", "register"):
        return (kind, rename.get(event[1], event[1]))
    if kind == "take":
        return event
    if kind == "transfer_finished_many":  # (name, the batch's request indices, sorted)
        return (kind, rename.get(event[1], event[1]), tuple(sorted(perm[i] for i in event[2])))
    if kind not in _PER_REQUEST:
        return None
    i = perm[event[1]]
    if len(event) == 2:
        return (kind, i)
    if kind == "request_finished":
        names = sorted((rename.get(n, n) for n in event[2]), key=lambda n: position.get(n, -1))
        if len(event) == 3:
            return (kind, i, tuple(names))
        choices = sorted(
            ((rename.get(n, n), c) for n, c in event[3]), key=lambda nc: position.get(nc[0], -1)
        )
        return (kind, i, tuple(names), tuple(choices))
    if kind == "request_finished_by":  # a counted connector's report names: never renamed
        names = sorted((rename.get(n, n) for n in event[2]), key=lambda n: position.get(n, -1))
        return (kind, i, tuple(names), *event[3:])
    if kind in ("transfer_finished", "load_finished"):
        return (kind, i, rename.get(event[2], event[2]))
    if kind == "split_load":
        return (kind, i, rename.get(event[2], event[2]), rename.get(event[3], event[3]))
    if kind in (COUNTED_SAVE, COUNTED_LOAD):  # a counted connector is never renamed
        return (kind, i, event[2])
    if kind == "match_tokens":
        answers = sorted(
            ((rename.get(n, n), tokens) for n, tokens in event[2]),
            key=lambda answer: position.get(answer[0], -1),
        )
        return (kind, i, tuple(answers))
    return None

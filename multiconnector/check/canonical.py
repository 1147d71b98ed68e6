"""Symmetry reduction: the canonical form of a state under renamings of ids and same-kind names.

Request ids are interchangeable, and so are connector names of one kind (the ranks of one
connector, every scripted saver, the ``None`` slots, the raising ones). A state is stored as one
chosen renaming of itself, its *key*, the same for every renaming of it. Two ways compute it:

* :class:`Signatures` (the one used): sorts each kind's names by what they do in the state,
  enumerating only the orderings of request ids that tie; about ``n log n`` in the names.
* :class:`Enumerated` (the reference the tests compare it with): tries every renaming of the
  group and keeps the least, ``requests! x kind_1! x kind_2! ...`` of them per new state.

Both give a key that is a renaming of the state itself (so two states with one key are
symmetric: *sound*), and the same key for every renaming of a state (so symmetric states are
one: *complete*): see :class:`Signatures` for why. Both also give the renamings that map the
state onto itself, which :func:`~multiconnector.check.alike._alike` uses to spare the events
they map to one another.

Nothing here knows the world: a state is read as numbers (:class:`_Interner`), a request's part
as the tuple :func:`~multiconnector.check.snapshot._part` makes, the registry as a tagged tuple.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Final

#: A renaming: the new position of each request index, and the new name of each name (names
#: left out keep theirs).
Renaming = tuple[tuple[int, ...], Mapping[str, str]]
#: A raw state, in numbers: (registry, each request's part, held set, queued set).
Raw = tuple[int, tuple[int, ...], tuple[int, ...], tuple[int, ...]]
#: What a canonical form says of a state besides its key: renamings mapping it onto itself
#: (the identity included, or left out when there are none other), and classes of names any
#: permutation within which maps it onto itself too.
Fixed = tuple[tuple[Renaming, ...], tuple[tuple[str, ...], ...]]
NOTHING_FIXED: Final[Fixed] = ((), ())

#: The registry part's tag: names in registration order, or as a set.
IN_ORDER, AS_SET = "registry", "registered"


class _Interner:
    """Numbers the distinct request parts and registries, and their renamings, once each.

    Snapshots are then tuples of small ints: cheap to hash, compare and keep.
    """

    def __init__(self) -> None:
        self.ids: dict[Any, int] = {}
        #: The thing each number stands for.
        self.things: list[Any] = []
        #: The canonical key of each raw key met so far, and what maps it onto itself: most
        #: events lead to a state already seen, whose canonical form is then a dict look-up.
        self.canonical: dict[Raw, tuple[tuple[Any, ...], Fixed]] = {}
        #: The part number of each request's raw fields met so far (see ``snapshot._raw``).
        self.parts: dict[tuple[Any, ...], int] = {}
        #: (number, the new names of the names it mentions): the renamed thing's number.
        self.renamed: dict[tuple[int, tuple[str, ...]], int] = {}
        #: Part number: each name it mentions, with that name's roles in it.
        self.roles: dict[int, dict[str, tuple[Any, ...]]] = {}
        #: Registry number: the names it mentions, in order.
        self.names: dict[int, tuple[str, ...]] = {}
        #: Part number: the number of the part with every name replaced by its kind's token.
        self.blind: dict[int, int] = {}
        #: The key alone of each raw key met (``_Symmetry.key``) and not in ``canonical``.
        self.keys: dict[Raw, tuple[Any, ...]] = {}
        #: Raw key: each request's view of it (see ``snapshot._views``).
        self.views: dict[Raw, list[tuple[int, Any, Any, bool]]] = {}

    def number(self, thing: Any) -> int:
        found = self.ids.get(thing)
        if found is None:
            found = self.ids[thing] = len(self.ids)
            self.things.append(thing)
        return found

    def part_roles(self, number: int) -> dict[str, tuple[Any, ...]]:
        found = self.roles.get(number)
        if found is None:
            found = self.roles[number] = _roles(self.things[number])
        return found

    def rename_part(self, number: int, rename: Mapping[str, str]) -> int:
        mentioned = self.part_roles(number)
        if not rename or not mentioned:
            return number
        images = tuple(map(rename.get, mentioned, mentioned))
        found = self.renamed.get((number, images))
        if found is None:
            found = self.number(_rename_part(self.things[number], rename))
            self.renamed[number, images] = found
        return found

    def registry_names(self, number: int) -> tuple[str, ...]:
        found = self.names.get(number)
        if found is None:
            found = self.names[number] = tuple(n for n, _ in self.things[number][1])
        return found

    def rename_registry(self, number: int, rename: Mapping[str, str]) -> int:
        if not rename:
            return number
        names = self.registry_names(number)
        images = tuple(map(rename.get, names, names))
        found = self.renamed.get((number, images))
        if found is None:
            found = self.number(_rename_registry(self.things[number], rename))
            self.renamed[number, images] = found
        return found


# -- renaming the parts of a state ---------------------------------------------------------------


def _names_key(names: Iterable[str]) -> tuple[str, ...]:
    """A set of names as a key: sorted, each once (see ``snapshot._part``)."""
    return tuple(sorted(set(names)))


def _rename_part(part: Any, rename: Mapping[str, str]) -> Any:
    """A request's part (``snapshot._part``) with its names renamed (the rest unchanged)."""
    kind, phase, view, owed, cancelled, load, asking, early, matching, *params = part
    if early:
        early = _names_key(rename.get(n, n) for n in early)
    if matching is not None:
        decisive, chose, asked, chooser, current, unknown, kept, delivered = matching
        matching = (
            decisive,
            rename.get(chose, chose) if chose is not None else None,
            tuple(sorted((rename.get(n, n), on) for n, on in asked)),
            rename.get(chooser, chooser) if chooser is not None else None,
            current,
            unknown,
            _names_key(rename.get(n, n) for n in kept),
            _names_key(rename.get(n, n) for n in delivered),
        )
    if load is not None:  # (tag, names and flags): rename the names, keep the tag and flags
        load = (load[0], *(rename.get(x, x) if isinstance(x, str) else x for x in load[1:]))
    if asking:
        asking = tuple(
            tuple(sorted((rename.get(n, n), current) for n, current in one)) for one in asking
        )
    if params:  # the params choices of the calls asking (see _part)
        params = [tuple(tuple(sorted((rename.get(n, n), c) for n, c in one)) for one in params[0])]
    if view is not None:
        view = (
            view[0],
            _names_key(rename.get(n, n) for n in view[1]),
            _names_key(rename.get(n, n) for n in view[2]),
            _names_key(rename.get(n, n) for n in view[3]),
        )
    return (
        kind,
        phase,
        view,
        frozenset(rename.get(n, n) for n in owed),
        cancelled,
        load,
        asking,
        early,
        matching,
        *params,
    )


def _rename_registry(registry: Any, rename: Mapping[str, str]) -> Any:
    tag, names = registry
    renamed = tuple((rename.get(n, n), ready) for n, ready in names)
    return (tag, renamed if tag == IN_ORDER else tuple(sorted(renamed)))


def _roles(part: Any) -> dict[str, tuple[Any, ...]]:
    """Every name a request's part mentions, with where it stands in it: its *roles*.

    Complete: the part is determined by its nameless rest and the roles of its names (each
    field of :func:`_rename_part` that holds a name gives it a role here). So two names of one
    kind with the same roles in every part, and the same place in the registry, can be swapped
    without changing the state.
    """
    _, _, view, owed, _, load, asking, early, matching, *params = part
    roles: dict[str, list[Any]] = {}
    for n in early:
        roles.setdefault(n, []).append(("early",))
    if matching is not None:
        _, chose, asked, chooser, _, _, kept, delivered = matching
        if chose is not None:
            roles.setdefault(chose, []).append(("match chose",))
        if chooser is not None:
            roles.setdefault(chooser, []).append(("match chooser",))
        for n, on in asked:
            roles.setdefault(n, []).append(("match asked", on))
        for n in kept:
            roles.setdefault(n, []).append(("early load",))
        for n in delivered:
            roles.setdefault(n, []).append(("match delivered",))
    if view is not None:
        for tag, names in zip(("awaiting", "expected", "abandoned"), view[1:], strict=True):
            for n in names:
                roles.setdefault(n, []).append((tag,))
    for n in sorted(owed):
        roles.setdefault(n, []).append(("owed",))
    if load is not None:
        for j, x in enumerate(load[1:], 1):
            if isinstance(x, str):
                roles.setdefault(x, []).append(("load", load[0], j))
    for j, one in enumerate(asking):
        for n, current in one:
            roles.setdefault(n, []).append(("asking", j, current))
    if params:
        for j, one in enumerate(params[0]):
            for n, choice in one:
                roles.setdefault(n, []).append(("params", j, choice))
    return {n: tuple(r) for n, r in sorted(roles.items())}


# -- the group -----------------------------------------------------------------------------------


class _Symmetry:
    """The renamings of a scenario: every permutation of the request ids, times every
    permutation of each kind's names (``on=False``: the identity only)."""

    def __init__(self, kinds: Mapping[str, str | None], requests: int, *, on: bool) -> None:
        self.requests = requests
        self.on = on
        groups: dict[str | None, list[str]] = {}
        for name, kind in kinds.items():
            groups.setdefault(kind, []).append(name)
        #: Each kind's names, in the order given: the interchangeable ones (two or more).
        self.groups: tuple[tuple[str, ...], ...] = (
            tuple(tuple(g) for g in groups.values() if len(g) > 1) if on else ()
        )
        #: Each interchangeable name's kind token, for the nameless form of a part.
        self.token: dict[str, str] = {n: f"={k}" for k, g in enumerate(self.groups) for n in g}

    @property
    def size(self) -> int:
        """How many renamings the group has (the identity included)."""
        if not self.on:
            return 1
        return math.factorial(self.requests) * math.prod(
            math.factorial(len(g)) for g in self.groups
        )

    def canonical(self, numbers: _Interner, raw: Raw) -> tuple[tuple[Any, ...], Fixed]:
        """The key of ``raw``, and what maps it onto itself."""
        known = numbers.canonical.get(raw)
        if known is None:
            known = numbers.canonical[raw] = self._canonical(numbers, raw)
        return known

    def key(self, numbers: _Interner, raw: Raw) -> tuple[Any, ...]:
        """The key of ``raw`` alone: :meth:`canonical` without what maps it onto itself."""
        known = numbers.canonical.get(raw)
        if known is not None:
            return known[0]
        found = numbers.keys.get(raw)
        if found is None:
            found = numbers.keys[raw] = self._canonical(numbers, raw, fixed=False)[0]
        return found

    def _canonical(
        self, numbers: _Interner, raw: Raw, *, fixed: bool = True
    ) -> tuple[tuple[Any, ...], Fixed]:
        raise NotImplementedError  # pragma: no cover - each way of computing it says how


def _key(numbers: _Interner, raw: Raw, perm: Sequence[int], rename: Mapping[str, str]) -> Any:
    """``raw`` renamed: request ``i`` moved to position ``perm[i]``, names by ``rename``."""
    reg_id, part_ids, order, queue = raw
    moved = [0] * len(part_ids)
    for i, number in enumerate(part_ids):
        moved[perm[i]] = numbers.rename_part(number, rename)
    return (
        numbers.rename_registry(reg_id, rename),
        tuple(moved),
        tuple(sorted(perm[i] if i >= 0 else -1 for i in order)),
        tuple(sorted(perm[i] if i >= 0 else -1 for i in queue)),
    )


class Enumerated(_Symmetry):
    """The reference: every renaming of the group tried, the least kept.

    A true canonical form (the least over a whole orbit is the orbit's), at a cost of the
    group's size per new state: ``2 x 9! = 725,760`` renamings for two requests and nine savers.
    Kept for the tests, which compare :class:`Signatures` with it.
    """

    def __init__(self, kinds: Mapping[str, str | None], requests: int, *, on: bool) -> None:
        super().__init__(kinds, requests, on=on)
        renamings: list[dict[str, str]] = [{}]
        for group in self.groups:
            renamings = [
                {**base, **{a: b for a, b in zip(group, p, strict=True) if a != b}}
                for base in renamings
                for p in itertools.permutations(group)
            ]
        perms = itertools.permutations(range(requests)) if on else [tuple(range(requests))]
        self.renamings: tuple[Renaming, ...] = tuple(
            (perm, rename) for perm in perms for rename in renamings
        )

    def _canonical(
        self, numbers: _Interner, raw: Raw, *, fixed: bool = True
    ) -> tuple[tuple[Any, ...], Fixed]:
        del fixed  # found on the way: every renaming is tried
        best: tuple[Any, ...] | None = None
        onto: list[Renaming] = []
        unmoved = None
        for k, (perm, rename) in enumerate(self.renamings):
            key = _key(numbers, raw, perm, rename)
            if k == 0:
                unmoved = key  # the identity comes first
            elif key == unmoved:
                onto.append((perm, rename))  # this renaming maps the state onto itself
            if best is None or key < best:
                best = key
        assert best is not None
        return best, ((self.renamings[0], *onto) if onto else (), ())


class Signatures(_Symmetry):
    """The canonical form by signatures, without trying every renaming.

    For an ordering of the request ids, each interchangeable name gets a *signature*: its
    place in the registry, then its roles (:func:`_roles`) in each request's part, in that
    order. Each kind's names, sorted by signature, are renamed to that kind's names in their
    given order. Request ids are ordered by what does not depend on names (each part with
    every name replaced by its kind, whether the request is held, whether queued); only ids
    that tie there are tried in every order, and the least resulting renamed state is the key.

    Why it is a true canonical form (the same key for every renaming of a state), so the search
    finds exactly the states :class:`Enumerated` finds: renaming a state renames the orderings
    that are tried alongside it (what orders them does not depend on names), and for a given
    ordering of ids, a name's signature does not depend on what it is called, so the sorted
    signatures are the same; names with equal signatures can be swapped without changing the
    state (:func:`_roles` is complete), so how ties are broken does not matter either.

    Why it is sound (one key only for states that are renamings of one another), whatever
    the signatures: the key is the state itself renamed. The renamings that map the state onto
    itself come from the orderings that tie for the least key, and from swapping names with
    equal signatures, each such swap checked on the state before it is used.

    Cost per new state: ``t`` orderings of the ids (``t`` is the product of the factorials of
    the sizes of the tied sets of ids: 1 or 2 with two requests), each a sort of every kind's
    names, ``O(r n log n)`` for ``n`` names and ``r`` requests.
    """

    def _canonical(
        self, numbers: _Interner, raw: Raw, *, fixed: bool = True
    ) -> tuple[tuple[Any, ...], Fixed]:
        if not self.on:
            return raw, NOTHING_FIXED
        reg_id, part_ids, order, queue = raw
        held, queued = set(order), set(queue)
        blind = [self._blind(numbers, number) for number in part_ids]
        ids = sorted(range(len(part_ids)), key=lambda i: (blind[i], i in held, i in queued))
        ties = [
            list(same)
            for _, same in itertools.groupby(ids, key=lambda i: (blind[i], i in held, i in queued))
        ]
        registry = numbers.things[reg_id]
        place = {
            n: (0, p if registry[0] == IN_ORDER else 0, ready)
            for p, (n, ready) in enumerate(registry[1])
        }
        best: Any = None
        labelings: list[Renaming] = []
        signatures: dict[str, tuple[Any, ...]] = {}
        for ordering in _orderings(ties):
            perm = [0] * len(part_ids)
            for position, i in enumerate(ordering):
                perm[i] = position
            roles = [numbers.part_roles(part_ids[i]) for i in ordering]
            sig = {
                n: (place.get(n, (1,)), *(r.get(n, ()) for r in roles))
                for g in self.groups
                for n in g
            }
            rename: dict[str, str] = {}
            for g in self.groups:
                for old, new in zip(sorted(g, key=sig.__getitem__), g, strict=True):
                    if old != new:
                        rename[old] = new
            key = _key(numbers, raw, perm, rename)
            if best is None or key < best:
                best, labelings, signatures = key, [(tuple(perm), rename)], sig
            elif key == best:
                labelings.append((tuple(perm), rename))
        if not fixed:
            return best, NOTHING_FIXED
        return best, self._fixed(numbers, raw, labelings, signatures)

    def _blind(self, numbers: _Interner, number: int) -> int:
        found = numbers.blind.get(number)
        if found is None:
            found = numbers.blind[number] = numbers.number(
                _rename_part(numbers.things[number], self.token)
            )
        return found

    def _fixed(
        self,
        numbers: _Interner,
        raw: Raw,
        labelings: list[Renaming],
        signatures: Mapping[str, tuple[Any, ...]],
    ) -> Fixed:
        """The renamings mapping ``raw`` onto itself: each labeling that gives the key, undone
        by the first; and the classes of names with equal signatures (split where swapping
        two neighbours would change the state, which a complete signature never does)."""
        (perm0, rename0), *others = labelings
        back = {new: old for old, new in rename0.items()}
        undo = [0] * len(perm0)
        for i, position in enumerate(perm0):
            undo[position] = i
        automorphisms: list[Renaming] = []
        for perm, rename in others:
            names = {n for g in self.groups for n in g}
            composed = {}
            for n in names:
                image = back.get(rename.get(n, n), rename.get(n, n))
                if image != n:
                    composed[n] = image
            automorphisms.append((tuple(undo[perm[i]] for i in range(len(perm))), composed))
        identity = tuple(range(len(perm0)))
        classes: list[tuple[str, ...]] = []
        for g in self.groups:
            ordered = sorted(g, key=signatures.__getitem__)
            for _, same in itertools.groupby(ordered, key=signatures.__getitem__):
                classes += _symmetric(numbers, raw, tuple(same))
        if not automorphisms and not classes:
            return NOTHING_FIXED
        return ((identity, {}), *automorphisms), tuple(classes)


def _unmoved(numbers: _Interner, raw: Raw, rename: Mapping[str, str]) -> bool:
    """Whether renaming names by ``rename`` maps ``raw`` onto itself."""
    reg_id, part_ids, _, _ = raw
    return numbers.rename_registry(reg_id, rename) == reg_id and all(
        numbers.rename_part(number, rename) == number for number in part_ids
    )


def _symmetric(numbers: _Interner, raw: Raw, names: tuple[str, ...]) -> list[tuple[str, ...]]:
    """``names`` (equal signatures) as classes any permutation within which maps ``raw`` onto
    itself: checked on the state, a swap of the first two and a rotation of all (which
    generate every permutation); should either change it, split where swapping neighbours
    does (each class then a run of neighbours whose swaps do not)."""
    if len(names) < 2:
        return []
    swap = {names[0]: names[1], names[1]: names[0]}
    rotate = dict(zip(names, names[1:] + names[:1], strict=True))
    if _unmoved(numbers, raw, swap) and _unmoved(numbers, raw, rotate):
        return [names]
    classes: list[tuple[str, ...]] = []
    run = [names[0]]
    for n in names[1:]:
        if not _unmoved(numbers, raw, {run[-1]: n, n: run[-1]}):
            if len(run) > 1:
                classes.append(tuple(run))
            run = []
        run.append(n)
    if len(run) > 1:
        classes.append(tuple(run))
    return classes


def _orderings(ties: list[list[int]]) -> Iterator[list[int]]:
    """Every ordering of the ids that keeps the tied sets in their order."""
    for choice in itertools.product(*(itertools.permutations(t) for t in ties)):
        yield [i for group in choice for i in group]


def arrangements(labels: Sequence[Any]) -> Iterator[tuple[Any, ...]]:
    """Every distinct ordering of ``labels`` (hashable), each once."""
    counts: dict[Any, int] = {}
    for label in labels:
        counts[label] = counts.get(label, 0) + 1
    kinds = list(counts)
    out: list[Any] = [None] * len(labels)

    def fill(p: int) -> Iterator[tuple[Any, ...]]:
        if p == len(out):
            yield tuple(out)
            return
        for k in kinds:
            if counts[k]:
                counts[k] -= 1
                out[p] = k
                yield from fill(p + 1)
                counts[k] += 1

    yield from fill(0)

"""The public entry point: :func:`check_aggregator` builds the scenario and explores it."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs

from .._explore import (
    CheckReport,
    SearchConfig,
    explore,
    remaining_seconds,
)
from .._validate import bad_argument, check_bool, check_choice, check_name, shown
from ..aggregator import MultiConnector
from ..errors import InvalidArgumentError, InvalidValueError
from ..machine import build_machine
from .alike import _alike
from .apply import _apply
from .breaker import HEALTH_EVENTS, SETTINGS, BookFactory, quiet, real_book
from .canonical import Signatures, _Interner
from .counted import _Rank
from .events import _events, _events_of
from .fork import _fork
from .properties import (
    BREAKER_KEPT,
    CALLBACKS,
    COUNTERS,
    LOAD_ONCE,
    NO_EARLY_FREE,
    NO_LEAK,
    PARAMS_MERGED,
    RIGHT_OUTCOME,
    ROLES_KEPT,
    TERMINAL_ABSORBING,
    _breaker_kept,
    _callbacks,
    _counters,
    _fired,
    _load_once,
    _no_early_free,
    _no_leak,
    _no_live_request,
    _not_cancel,
    _params_merged,
    _right_outcome,
    _roles_kept,
    _terminal_absorbing,
    reachable_in,
)
from .scenario import (
    _KINDS,
    _LOADING,
    ALPHABET,
    COUNTED,
    DEFAULT_CONNECTORS,
    DEFAULT_UNKNOWN,
    EARLY_REPORTS,
    GARBAGE,
    KINDS,
    LOADER,
    MAX_CONNECTORS,
    MAX_REQUESTS,
    PARAM_CHOICES,
    RAISES,
    ROLES,
    SAVER,
    SAVING,
    STORE,
    _actor,
    _Garbage,
    _Loader,
    _Pad,
    _Raising,
    _Scenario,
    _Scripted,
    _Store,
    _World,
    rank_names,
)
from .snapshot import _snapshot, _views
from .trace import _annotate, _data, _describe, _label

# -- the public entry point ---------------------------------------------------------------------


def check_aggregator(
    connectors: Mapping[str, str | None] | None = None,
    *,
    requests: int = 2,
    unknown: Sequence[str] = DEFAULT_UNKNOWN,
    events: Collection[str] | None = None,
    factory: Callable[..., MultiConnector] = MultiConnector,
    symmetry: bool = True,
    max_states: int | None = None,
    max_depth: int | None = None,
    progress: bool = False,
    max_seconds: float | None = None,
    strict_coverage: bool = False,
    reduction: bool = True,
    params: bool = False,
    per_request: bool = False,
    early_reports: str = "savers",
    config: SearchConfig | None = None,
    forget: bool = True,
    health: bool = False,
    health_book: BookFactory = real_book,
) -> CheckReport:
    """Model-check the real aggregator on a bounded scenario: every reachable state, every event.

    ``connectors`` maps each name (your own: ranks of one connector are ``"pd@0"``, ``"pd@1"``)
    to its kind: ``"saver"`` (scripted; every subset of the savers is tried at
    ``request_finished``), ``"raises"`` (its calls raise), ``"garbage"`` (it answers a bare
    ``True``), ``"store"`` (a saver with ``Role.save``), ``"loader"`` (``Role.load``: it answers
    ``match_tokens``, promises a save never awaited), ``"counted"`` (as ``<name>@1``, ``@2``:
    docs/check.md) or ``None`` (not ready); a store or a loader adds :data:`ROLES_KEPT`. At
    most 16 connectors (``MAX_CONNECTORS``); default: :data:`DEFAULT_CONNECTORS`. ``unknown``
    names are never registered; their reports are events. ``requests`` request ids take part.
    ``events`` chooses the alphabet among :data:`ALPHABET` (the default) and
    :data:`LOAD_EVENTS`; with a load event, savers also answer ``match_tokens`` (0, 1 or
    ``None``, every combination) and the report adds :data:`LOAD_ONCE` after ``no leak``.
    ``factory(registry, trace=True, stripes=1)`` builds the aggregator (a subclass, or a
    ``functools.partial``). ``max_states``, ``max_depth``, ``max_seconds`` (default: none) and
    ``progress``, or a ``config`` (:class:`SearchConfig`), bound and show the search.

    Coverage (``states reached``, ``transitions fired``) fails only for what the configuration
    can reach (:func:`reachable_in`); ``strict_coverage=True`` requires every declared state and
    transition. ``reduction`` (default on) is partial-order reduction: events of different
    requests commute (:func:`independent`), so their interleavings are not all applied; the
    verdicts, states found and counterexamples' lengths are the same without it.

    ``params=True`` makes scripted savers answer transfer params: each ``request_finished``
    event also picks, for every ready saver, one of :data:`PARAM_CHOICES`, and the report adds
    :data:`PARAMS_MERGED`: the merged params equal the checker's reference merge (which follows
    ``allow_equal_params``), a ``KeyClashError`` is raised exactly when it says so, once the
    answers were applied, and no saver's dict is changed; after ``callbacks``.
    ``per_request=True`` checks each request's *view* (the registry and its own record) once,
    not every combination of the requests' states: two requests cost about what one costs, with
    the same verdicts and counterexample lengths while requests interact only through the
    registry, ``take()`` and batches (docs/check.md, "Requests apart"). ``early_reports``, one
    of :data:`EARLY_REPORTS`, chooses the reports explored while a ``request_finished`` still
    asks (:attr:`~multiconnector.Outcome.early`): ``"savers"`` (the default: of the save each
    saver asked promises), ``"all"`` (from every ready connector the request does not await) or
    ``"off"`` (docs/check.md, "Early reports"). ``forget=False``: docs/check.md, "Settled records".
    ``health=True``: each child's health machine too, and :data:`BREAKER_KEPT` (:mod:`.breaker`).

    Returns a :class:`CheckReport`: a result per name in :data:`PROPERTIES` (and as said above).

    .. versionadded:: 0.1.0
    """
    started = time.perf_counter()  # max_seconds counts the set-up too
    search = _search_config(config, max_states, max_depth, max_seconds, progress)
    kinds, alphabet = _kinds(connectors, unknown), _alphabet(events)
    switches = (symmetry, strict_coverage, reduction, params, per_request, forget, health)
    book = _check_switches(requests, factory, health_book, *switches, early_reports=early_reports)
    scenario, probe = _scenario(kinds, unknown, requests, alphabet, factory, symmetry, params, book)
    return _explore_scenario(
        attrs.evolve(scenario, early=early_reports, forget=forget),
        probe,
        search=attrs.evolve(search, max_seconds=remaining_seconds(search.max_seconds, started)),
        strict_coverage=strict_coverage,
        reduction=reduction,
        per_request=per_request,
        max_seconds=search.max_seconds,
    )


def _search_config(
    config: object,
    max_states: int | None,
    max_depth: int | None,
    max_seconds: float | None,
    progress: bool,
) -> SearchConfig:
    """The search's bounds: ``config``, or a :class:`SearchConfig` of the keywords (checked)."""
    if config is None:
        return SearchConfig(
            max_states=max_states, max_depth=max_depth, max_seconds=max_seconds, progress=progress
        )
    if not isinstance(config, SearchConfig):
        raise InvalidArgumentError(f"config={shown(config)} must be a SearchConfig or None")
    if (max_states, max_depth, max_seconds, progress) != (None, None, None, False):
        raise InvalidArgumentError(
            "give config or max_states, max_depth, max_seconds and progress, not both"
        )
    return config


def _check_switches(
    requests: object, factory: object, book: Any, *switches: object, early_reports: object
) -> BookFactory | None:
    """check_aggregator's count, factory and switches checked (in its signature's order), and
    ``book`` (its ``health_book``); returns the book factory when ``health`` (the last switch)
    is on, else ``None``."""
    if type(requests) is not int or not 1 <= requests <= MAX_REQUESTS:
        raise bad_argument(type(requests) is int)(
            f"requests={shown(requests)} must be an int from 1 to {MAX_REQUESTS}"
        )
    if not callable(factory):
        raise InvalidArgumentError(f"factory={shown(factory)} must be callable")
    if not callable(book):
        raise InvalidArgumentError(f"health_book={shown(book)} must be callable")
    names = (
        "symmetry",
        "strict_coverage",
        "reduction",
        "params",
        "per_request",
        "forget",
        "health",
    )
    for name, switch in zip(names, switches, strict=True):
        check_bool(switch, name)
    check_choice(early_reports, "early_reports", EARLY_REPORTS)
    health_on: BookFactory | None = book if switches[-1] else None
    return health_on


def _explore_scenario(
    scenario: _Scenario,
    probe: _World,
    *,
    search: SearchConfig,
    strict_coverage: bool,
    reduction: bool,
    per_request: bool = False,
    max_seconds: float | None = None,
) -> CheckReport:
    """:func:`explore` on the scenario, with the checker's properties, reductions and report
    (``search``: its bounds, ``max_seconds`` what is left of the budget the report shows as
    ``max_seconds``, the set-up having spent some)."""
    kinds, alphabet, params = scenario.kinds, scenario.alphabet, scenario.params
    bounds = _bounds(
        scenario,
        requests=len(scenario.ids),
        max_states=search.max_states,
        max_depth=search.max_depth,
        max_seconds=max_seconds,
        reduction=reduction,
        per_request=per_request,
    )
    factory_name = getattr(scenario.factory, "__qualname__", type(probe).__qualname__)
    search = attrs.evolve(
        search,
        actor=_actor if reduction or per_request else None,
        alike=_alike if reduction else None,
        views=_views if per_request else None,
        # (alike as the reduction says: with it off, every request_finished is listed)
        events_of=functools.partial(_events_of, alike=reduction) if per_request else None,
        fork=_fork,
        independent=None,
        bounds=bounds,
        title=f"multiconnector check: the transfer machine, on the real {factory_name}",
    )
    with quiet(scenario.health_book is not None):
        return explore(
            scenario.fresh,
            _events,
            _apply,
            _snapshot,
            _invariants(
                alphabet,
                params,
                roles=any(k in ROLES for k in kinds.values()),
                health=scenario.health_book is not None,
            ),
            goal=_no_live_request,
            ways_out=_not_cancel,
            machine=build_machine(),
            fired=_fired,
            describe=_describe,
            label=_label(probe),
            data=_data(scenario.ids),
            annotate=_annotate,
            expected=None if strict_coverage else reachable_in(kinds, alphabet),
            config=search,
        )


def _scenario(  # noqa: PLR0917 (check_aggregator calls it on one line: under 80 lines)
    kinds: dict[str, str | None],
    unknown: Sequence[str],
    requests: int,
    alphabet: frozenset[str],
    factory: Callable[..., MultiConnector],
    symmetry: bool,
    params: bool,
    book: BookFactory | None = None,
) -> tuple[_Scenario, _World]:
    """The scenario of checked arguments, and its first world (a probe of what ``factory``
    builds: a subclass with its own ``request_finished`` is driven whole, ``atomic``).

    Under health (``book``: what builds each world's
    :class:`~multiconnector.healthbook.HealthBook`, ``health_book(names, settings, clock=...,
    aggregator=...)``; the tests plant broken ones,
    given the aggregator as a wrong glue would use it), the health events join the alphabet
    and symmetry is off: each child's health is its own (:mod:`.breaker`)."""
    if book is not None:
        alphabet |= frozenset(HEALTH_EVENTS)
        symmetry = False
    pad = _Pad()
    scenario = _Scenario(
        names=tuple(kinds),
        kinds=kinds,
        unknown=tuple(unknown),
        ids=tuple(f"r{i}" for i in range(1, requests + 1)),
        alphabet=alphabet,
        factory=factory,
        pad=pad,
        connectors=_connectors(kinds, pad),
        # A counted connector's names are its own: never renamed (each its own kind).
        symmetry=_canonical_form(
            {n: f"{k} {n}" if k == COUNTED else k for n, k in kinds.items()}, requests, on=symmetry
        ),
        interner=_Interner(),
        registry_order=_registry_order(alphabet, params),
        params=params,
        batchers=tuple(n for n, k in kinds.items() if k in SAVING or k == GARBAGE),
        ranks={n: rank_names(n) for n, k in kinds.items() if k == COUNTED},
        health_book=book,
        health_settings=SETTINGS,
    )
    probe = scenario.fresh()
    allow_equal = getattr(probe.mc, "_allow_equal", False) is True
    atomic = type(probe.mc).request_finished is not MultiConnector.request_finished
    if atomic or allow_equal:
        scenario = attrs.evolve(scenario, atomic=atomic, allow_equal=allow_equal)
    return scenario, probe


def _kinds(
    connectors: Mapping[str, str | None] | None, unknown: Sequence[str]
) -> dict[str, str | None]:
    """``connectors`` checked (default: :data:`DEFAULT_CONNECTORS`) as a dict of name to kind,
    and ``unknown`` checked against it: never one of its names."""
    if connectors is None:
        connectors = DEFAULT_CONNECTORS
    if not isinstance(connectors, Mapping) or not connectors:
        raise bad_argument(isinstance(connectors, Mapping))(
            f"connectors={shown(connectors)} must be a non-empty Mapping of name to kind"
        )
    if len(connectors) > MAX_CONNECTORS:
        raise InvalidValueError(
            f"connectors={shown(connectors)} has {len(connectors)} connectors; a check takes at "
            f"most {MAX_CONNECTORS} (every subset of the savers is a request_finished event)"
        )
    kinds: dict[str, str | None] = {}
    for name, kind in connectors.items():
        check_name(name, "connectors key")
        if kind is not None and kind not in KINDS:
            raise bad_argument(isinstance(kind, str))(
                f"connectors[{name!r}]={shown(kind)} must be one of "
                f"{', '.join(repr(k) for k in KINDS)} or None"
            )
        kinds[name] = kind
    if isinstance(unknown, str) or not isinstance(unknown, Sequence):
        raise InvalidArgumentError(f"unknown={shown(unknown)} must be a sequence of names")
    for name in unknown:
        check_name(name, "unknown item")
        if name in kinds:
            raise InvalidValueError(f"unknown={shown(unknown)} names a connector: {name!r}")
    ranks = {rank: n for n, k in kinds.items() if k == COUNTED for rank in rank_names(n)}
    for name in (*kinds, *unknown):
        if name in ranks:
            raise InvalidValueError(
                f"{name!r} is a report name of counted connector {ranks[name]!r}: rename one"
            )
    return kinds


def _alphabet(events: Collection[str] | None) -> frozenset[str]:
    """``events`` checked: the kinds of events the scenario applies (default: :data:`ALPHABET`)."""
    if events is None:
        alphabet = frozenset(ALPHABET)
    else:
        if isinstance(events, str) or not isinstance(events, Collection):
            raise InvalidArgumentError(f"events={shown(events)} must be a collection of str")
        alphabet = frozenset(events)
        bad = sorted(str(e) for e in alphabet if e not in _KINDS)
        if bad:
            raise bad_argument(all(isinstance(e, str) for e in alphabet))(
                f"events={shown(events)} has unknown kinds {bad}; choose from {list(_KINDS)}"
            )
    return alphabet


def _connectors(kinds: Mapping[str, str | None], pad: _Pad) -> dict[str, Any]:
    """The connector each name registers, by its kind (``None`` for a not-ready slot)."""
    made: dict[str, Any] = {}
    for name, kind in kinds.items():
        made[name] = _Scripted(name, pad) if kind == SAVER else None
        if kind == RAISES:
            made[name] = _Raising(name, pad)
        elif kind == GARBAGE:
            made[name] = _Garbage(name, pad)
        elif kind == STORE:
            made[name] = _Store(name, pad)
        elif kind == LOADER:
            made[name] = _Loader(name, pad)
        elif kind == COUNTED:  # registered under its report names, not its own
            del made[name]
            made.update((rank, _Rank(rank, name, pad)) for rank in rank_names(name))
    return made


def _bounds(
    scenario: _Scenario,
    *,
    requests: int,
    max_states: int | None,
    max_depth: int | None,
    max_seconds: float | None,
    reduction: bool,
    per_request: bool = False,
) -> dict[str, Any]:
    """The scenario and the search's bounds, as the report shows them."""
    kinds, unknown, alphabet = scenario.kinds, scenario.unknown, scenario.alphabet
    shown_kinds = {
        SAVER: "saver",
        RAISES: "raises",
        GARBAGE: "garbage",
        STORE: "store: Role.save",
        LOADER: "loader: Role.load",
        None: "None slot",
    }
    counted = {n: f"counted: {', '.join(r)}" for n, r in scenario.ranks.items()}
    bounds = {
        "connectors": [f"{n} ({counted.get(n) or shown_kinds[k]})" for n, k in kinds.items()],
        "unknown names": list(unknown),
        "requests": requests,
        "events": [e for e in (*_KINDS, *HEALTH_EVENTS) if e in alphabet],
        "symmetry": f"{scenario.symmetry.size:,} renamings of request ids and same-kind names"
        if scenario.symmetry.size > 1
        else "off",
        "max states": max_states,  # None: unbounded
        "max depth": max_depth,
        "reduction": "sleep sets (events of different requests commute)" if reduction else "off",
        "settled records": "keep only what is read again (awaited names)"
        if scenario.forget
        else "keep every name",
    }
    if per_request:
        bounds["reduction"] = "each request's view once (requests interact only through the " + (
            "registry, take and batches)" + (", alike events" if reduction else "")
        )
    if not scenario.atomic:
        bounds["early reports"] = {
            "savers": "from the savers of the call asking",
            "all": "from every ready connector not awaited",
            "off": "off",
        }[scenario.early]
    if scenario.params:
        bounds["params"] = "every saver answers one of: " + ", ".join(str(c) for c in PARAM_CHOICES)
    if scenario.health_book is not None:
        bounds["health"] = (
            f"each child's: threshold {SETTINGS.threshold}, probes {SETTINGS.probes}, "
            f"cooldown {SETTINGS.cooldown_seconds:g} s then {SETTINGS.max_cooldown_seconds:g} s"
        )
    if max_seconds is not None:
        bounds["max seconds"] = max_seconds
    return bounds


def _invariants(
    alphabet: frozenset[str], params: bool, *, roles: bool = False, health: bool = False
) -> dict[str, Callable[[_World], object]]:
    """The properties judged on every state, in the report's order: :data:`LOAD_ONCE` with a
    load event in ``alphabet``, :data:`PARAMS_MERGED` with ``params``, :data:`ROLES_KEPT` with
    a connector that has a role (``roles``)."""
    invariants: dict[str, Callable[[_World], object]] = {
        TERMINAL_ABSORBING: _terminal_absorbing,
        NO_EARLY_FREE: _no_early_free,
        NO_LEAK: _no_leak,
    }
    if alphabet & _LOADING:
        invariants[LOAD_ONCE] = _load_once
    invariants[RIGHT_OUTCOME] = _right_outcome
    invariants[COUNTERS] = _counters
    invariants[CALLBACKS] = _callbacks
    if params:
        invariants[PARAMS_MERGED] = _params_merged
    if roles:
        invariants[ROLES_KEPT] = _roles_kept
    if health:
        invariants[BREAKER_KEPT] = _breaker_kept
    return invariants


#: How a state's canonical form is found (the tests swap in the reference, ``Enumerated``).
_canonical_form = Signatures


def _registry_order(alphabet: frozenset[str], params: bool) -> bool:
    """Whether the registry's order is part of the state: the load side reads it (the first
    connector with tokens loads), and params are merged in it."""
    return params or bool(alphabet & _LOADING)

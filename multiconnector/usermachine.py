"""Your own ``transitions`` state machine: load it, check it, validate it.

:func:`check_machine` explores any ``transitions`` machine with :func:`~multiconnector.check.explore`
and reports, in the same :class:`~multiconnector.check.CheckReport` as ``multiconnector check``:

``no exception``
    Firing an event (guards and callbacks included, when they run) raises nothing.
``no deadlock``
    Every reachable state that is not final has an event that can fire.
``no overlapping guards``
    No reachable state has two transitions for one event, to different states, whose named
    guards can hold together (``transitions`` would silently take the first).
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
match wins, as ``transitions`` does. The report's bounds say which was done.

Final states are those declared ``final`` (``{"name": "done", "final": True}``, a
``transitions`` ``State(final=True)``, or a ``"final"`` list in a declaration). A machine that
declares none has its states with no transition out taken as final, and the report says so.
``to_<state>`` auto transitions are left out: they would make every state reachable from every
other one.
"""

from __future__ import annotations

import enum
import functools
import importlib
import itertools
import os
import sys
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Final, final

import attrs
from transitions import Machine

from ._explore import (
    NO_EXCEPTION,
    NO_TRAP,
    STATES_REACHED,
    TRANSITIONS_FIRED,
    CheckReport,
    Counterexample,
    explore,
)
from ._validate import shown
from .errors import InvalidArgumentError, InvalidMachineError

__all__ = [
    "DETERMINISTIC",
    "FINAL_IS_FINAL",
    "NO_DEADLOCK",
    "NO_EXCEPTION",
    "NO_TRAP",
    "STATES_REACHED",
    "TRANSITIONS_FIRED",
    "Candidate",
    "Declared",
    "InvalidMachineError",
    "check_machine",
    "declare",
    "load",
    "validate",
]

NO_DEADLOCK: Final = "no deadlock"
DETERMINISTIC: Final = "no overlapping guards"
FINAL_IS_FINAL: Final = "final states final"

#: Keys a plain declaration may have.
DECLARATION_KEYS: Final = frozenset(
    {"states", "transitions", "initial", "final", "name", "auto_transitions", "model_attribute"}
)
#: Above this many named conditions in one (state, event) group, a candidate counts as
#: possible whenever its own guards are consistent (the exact search is 2**n).
_EXACT_GUARDS: Final = 12
#: The default bound on distinct states when real models are explored (their data may grow).
DEFAULT_MODEL_STATES: Final = 100_000


@final
@attrs.frozen(kw_only=True)
class Candidate:
    """One declared transition: taken on ``trigger`` in ``source`` when its guards hold.

    ``dest`` is ``source`` for an internal or ``"="`` transition. ``conditions`` must hold and
    ``unless`` must not; a callable guard is named by its qualified name.

    .. versionadded:: 0.1.0
    """

    trigger: str
    source: str
    dest: str
    internal: bool
    conditions: tuple[str, ...]
    unless: tuple[str, ...]
    #: The guards as given (names or callables), to rebuild a machine with them.
    raw_conditions: tuple[Any, ...] = attrs.field(eq=False, repr=False)
    raw_unless: tuple[Any, ...] = attrs.field(eq=False, repr=False)

    @property
    def triple(self) -> tuple[str, str, str]:
        return (self.source, self.trigger, self.dest)

    @property
    def guard_text(self) -> str:
        """``ok, !late``: the guards as ``transitions`` draws them."""
        return ", ".join([*self.conditions, *(f"!{g}" for g in self.unless)])

    def as_transition(self) -> dict[str, Any]:
        """The ``transitions`` dict that declares this transition alone."""
        out: dict[str, Any] = {
            "trigger": self.trigger,
            "source": self.source,
            "dest": None if self.internal else self.dest,
        }
        if self.raw_conditions:
            out["conditions"] = list(self.raw_conditions)
        if self.raw_unless:
            out["unless"] = list(self.raw_unless)
        return out


@final
@attrs.frozen(kw_only=True)
class Declared:
    """A machine's declaration, read from any form :func:`declare` accepts.

    .. versionadded:: 0.1.0
    """

    states: tuple[str, ...]
    initial: str
    final: frozenset[str]
    #: Whether the machine declared its final states (``False``: taken as the sinks).
    final_declared: bool
    transitions: tuple[Candidate, ...]
    model_attribute: str = "state"
    name: str = ""
    #: Whether ``to_<state>`` auto transitions were left out.
    skipped_auto: bool = False

    def candidates(self, source: str, trigger: str) -> tuple[Candidate, ...]:
        """The transitions for ``trigger`` in ``source``, in the order ``transitions`` tries them."""
        return tuple(t for t in self.transitions if t.source == source and t.trigger == trigger)

    @property
    def triggers(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.trigger for t in self.transitions))

    def build(self, machine_cls: type[Machine] = Machine, **kwargs: Any) -> Machine:
        """A fresh ``transitions`` machine of this declaration, with no model and no callbacks."""
        return machine_cls(
            model=None,
            states=[{"name": s, "final": s in self.final} for s in self.states],
            initial=self.initial,
            transitions=[t.as_transition() for t in self.transitions],
            auto_transitions=False,
            **kwargs,
        )


# -- loading -------------------------------------------------------------------------------------


def load(spec: str, argument: str = "spec") -> Any:
    """The object ``MODULE:ATTR`` names (``ATTR`` may be dotted).

    The current directory is searched first, as ``python -m`` does, so a module beside you
    imports. Raises :class:`~multiconnector.InvalidArgumentError` naming ``argument`` when the
    spec is malformed, the module cannot be imported or has no such attribute.

    .. versionadded:: 0.1.0
    """
    if not isinstance(spec, str):
        raise InvalidArgumentError(f"{argument}={shown(spec)} must be a str MODULE:ATTR")
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise InvalidArgumentError(
            f"{argument}={spec!r} must be MODULE:ATTR, such as mypackage.flows:OrderFlow"
        )
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise InvalidArgumentError(
            f"{argument}={spec!r}: no module named {exc.name!r} (run from the directory that "
            "holds it, or put it on PYTHONPATH)"
        ) from None
    except Exception as exc:
        raise InvalidArgumentError(
            f"{argument}={spec!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidArgumentError(
                f"{argument}={spec!r}: {type(obj).__name__} {getattr(obj, '__name__', '?')!r} "
                f"has no attribute {part!r}"
            ) from None
    return obj


# -- reading a declaration -----------------------------------------------------------------------


def _name(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return str(value.name)
    return str(value)


def _guard_name(func: Any) -> str:
    if isinstance(func, str):
        return func
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    return f"{name}@{id(func):x}" if "<lambda>" in name else str(name)


def _owned_machine(obj: Any) -> Machine | None:
    """A ``transitions`` machine that ``obj`` is, or holds as an attribute and is a model of."""
    if isinstance(obj, Machine):
        return obj
    try:
        values = list(vars(obj).values())
    except TypeError:
        return None
    for value in values:
        if isinstance(value, Machine) and any(m is obj for m in value.models):
            return value
    return None


def _problems_of_declaration(decl: Mapping[str, Any]) -> list[str]:
    """What makes a plain declaration unbuildable, every problem at once."""
    problems: list[str] = []
    unknown = sorted(str(k) for k in decl if k not in DECLARATION_KEYS)
    if unknown:
        problems.append(f"unknown keys {unknown}; a declaration has {sorted(DECLARATION_KEYS)}")
    states = decl.get("states")
    names: list[str] = []
    if isinstance(states, str) or not isinstance(states, Sequence) or not states:
        problems.append(f"'states' must be a non-empty list, not {shown(states)}")
    else:
        for i, s in enumerate(states):
            if isinstance(s, Mapping) and isinstance(s.get("name"), str) and s["name"]:
                names.append(s["name"])
            elif isinstance(s, str) and s:
                names.append(s)
            else:
                problems.append(f"states[{i}]={shown(s)} must be a name or a dict with a 'name'")
        for s in sorted({n for n in names if names.count(n) > 1}):
            problems.append(f"state {s!r} is declared more than once")
    known = set(names)
    initial = decl.get("initial")
    if not isinstance(initial, str) or not initial:
        problems.append(f"'initial' must name a state, not {shown(initial)}")
    elif known and initial not in known:
        problems.append(f"initial state {initial!r} is not a declared state")
    final = decl.get("final", ())
    finals = [final] if isinstance(final, str) else final
    if not isinstance(finals, Sequence | frozenset | set):
        problems.append(f"'final' must be a list of states, not {shown(final)}")
    else:
        for s in finals:
            if s not in known:
                problems.append(f"final state {s!r} is not a declared state")
    transitions = decl.get("transitions", ())
    if isinstance(transitions, str) or not isinstance(transitions, Sequence):
        problems.append(f"'transitions' must be a list, not {shown(transitions)}")
        return problems
    for i, t in enumerate(transitions):
        if isinstance(t, Mapping):
            trigger, source, dest = t.get("trigger"), t.get("source"), t.get("dest")
        elif isinstance(t, Sequence) and not isinstance(t, str) and len(t) >= 3:
            trigger, source, dest = t[0], t[1], t[2]
        else:
            problems.append(
                f"transitions[{i}]={shown(t)} must be a dict (trigger, source, dest) "
                "or a [trigger, source, dest] list"
            )
            continue
        if not isinstance(trigger, str) or not trigger:
            problems.append(f"transitions[{i}] has no trigger name: {shown(trigger)}")
        sources = [source] if isinstance(source, str) else source
        if not isinstance(sources, Sequence) or not sources:
            problems.append(f"transitions[{i}] source={shown(source)} must name states")
            sources = []
        for s in sources:
            if s != "*" and s not in known:
                problems.append(f"transitions[{i}] source {s!r} is not a declared state")
        if dest is not None and dest != "=" and dest not in known:
            problems.append(f"transitions[{i}] dest {dest!r} is not a declared state")
    return problems


def _from_declaration(decl: Mapping[str, Any]) -> Machine:
    problems = _problems_of_declaration(decl)
    if problems:
        raise InvalidMachineError(problems)
    final = decl.get("final", ())
    finals = {final} if isinstance(final, str) else set(final)
    states = [
        {**s, "final": bool(s.get("final")) or s["name"] in finals}
        if isinstance(s, Mapping)
        else {"name": s, "final": s in finals}
        for s in decl["states"]
    ]
    try:
        return Machine(
            model=None,
            states=states,
            initial=decl["initial"],
            transitions=[dict(t) if isinstance(t, Mapping) else list(t) for t in decl.get("transitions", ())],
            auto_transitions=bool(decl.get("auto_transitions", False)),
            model_attribute=str(decl.get("model_attribute", "state")),
            name=str(decl.get("name", "")),
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise InvalidMachineError([f"transitions refused the declaration: {exc}"]) from None


def _read(machine: Machine) -> Declared:
    initial = machine.initial
    if initial is None:
        raise InvalidMachineError(["the machine has no initial state"])
    states = tuple(_name(s) for s in machine.states)
    declared_final = frozenset(n for n, s in machine.states.items() if getattr(s, "final", False))
    auto = bool(getattr(machine, "auto_transitions", False))
    autos = {f"to_{s}" for s in states} if auto else set()
    found: list[Candidate] = []
    for trigger, event in machine.events.items():
        if trigger in autos:
            continue
        for source, candidates in event.transitions.items():
            for t in candidates:
                conds = [c.func for c in t.conditions if c.target]
                unless = [c.func for c in t.conditions if not c.target]
                found.append(
                    Candidate(
                        trigger=str(trigger),
                        source=_name(source),
                        dest=_name(t.dest) if t.dest is not None else _name(source),
                        internal=t.dest is None,
                        conditions=tuple(_guard_name(c) for c in conds),
                        unless=tuple(_guard_name(c) for c in unless),
                        raw_conditions=tuple(conds),
                        raw_unless=tuple(unless),
                    )
                )
    final_declared = bool(declared_final)
    finals = declared_final
    if not final_declared:
        leaving = {t.source for t in found if t.dest != t.source}
        finals = frozenset(s for s in states if s not in leaving)
    return Declared(
        states=states,
        initial=_name(initial),
        final=finals,
        final_declared=final_declared,
        transitions=tuple(found),
        model_attribute=str(getattr(machine, "model_attribute", "state")),
        name=str(getattr(machine, "name", "") or "").strip(": "),
        skipped_auto=auto,
    )


def _resolve(obj: Any) -> tuple[Machine, Callable[[], Any] | None]:
    """The machine ``obj`` stands for, and the model factory it is, when it is one."""
    if isinstance(obj, Machine):
        return obj, None
    if isinstance(obj, Mapping):
        return _from_declaration(obj), None
    if callable(obj):
        try:
            made = obj()
        except TypeError as exc:
            raise InvalidArgumentError(
                f"machine={shown(obj)} must be callable with no arguments: {exc}"
            ) from None
        machine = _owned_machine(made)
        if machine is None:
            if isinstance(made, Mapping):
                return _from_declaration(made), None
            raise InvalidArgumentError(
                f"machine={shown(obj)} made {shown(made)}, which is neither a transitions "
                "Machine, an object holding one that it is a model of, nor a declaration"
            )
        owns_model = any(m is made or m is machine for m in machine.models) or (
            made is machine and bool(machine.models)
        )
        return machine, (obj if owns_model else None)
    raise InvalidArgumentError(
        f"machine={shown(obj)} must be a transitions Machine, a machine class or factory, "
        "or a declaration dict (states, transitions, initial, final)"
    )


def declare(machine: Any) -> Declared:
    """The :class:`Declared` form of ``machine``: any form :func:`check_machine` accepts.

    .. versionadded:: 0.1.0
    """
    if isinstance(machine, Declared):
        return machine
    if isinstance(machine, str):
        machine = load(machine, "machine")
    return _read(_resolve(machine)[0])


# -- the free-guard model ------------------------------------------------------------------------


def _possible(group: Sequence[Candidate]) -> list[tuple[Candidate, dict[str, bool]]]:
    """The candidates that can fire when guards are free, with one assignment that fires each.

    ``transitions`` tries candidates in order and takes the first whose guards hold, so a
    candidate fires when its guards hold and every earlier candidate's do not.
    """
    names = sorted({g for t in group for g in (*t.conditions, *t.unless)})
    out: list[tuple[Candidate, dict[str, bool]]] = []
    if len(names) > _EXACT_GUARDS:
        for t in group:
            if not set(t.conditions) & set(t.unless):
                out.append((t, {**dict.fromkeys(t.conditions, True), **dict.fromkeys(t.unless, False)}))
        return out

    def holds(t: Candidate, values: Mapping[str, bool]) -> bool:
        return all(values[g] for g in t.conditions) and not any(values[g] for g in t.unless)

    for i, t in enumerate(group):
        for bits in itertools.product((True, False), repeat=len(names)):
            values = dict(zip(names, bits, strict=True))
            if holds(t, values) and not any(holds(u, values) for u in group[:i]):
                own = {g: values[g] for g in (*t.conditions, *t.unless)}
                out.append((t, own))
                break
    return out


def _overlap(a: Candidate, b: Candidate) -> bool:
    """Whether some guard values let both ``a`` and ``b`` fire (a name required by one and
    refused by the other separates them; the same name required twice does not)."""
    if set(a.conditions) & set(a.unless) or set(b.conditions) & set(b.unless):
        return False
    return not (set(a.conditions) & set(b.unless) or set(a.unless) & set(b.conditions))


@attrs.define(slots=True)
class _FreeModel:
    """What a user invariant sees without a model factory: only the state."""

    state: str

    def __repr__(self) -> str:
        return f"<model in state {self.state!r}>"


@attrs.define(slots=True, eq=False)
class _Run:
    """One explored model: the user's (or a free one), its machine, the last transition fired."""

    model: Any
    machine: Machine | None
    attribute: str
    last: tuple[str, str, str] | None = None

    @property
    def state(self) -> str:
        return _name(getattr(self.model, self.attribute))


#: A bare machine's own attributes, left out of a machine-as-model's snapshot.
@functools.cache
def _machine_keys() -> frozenset[str]:
    return frozenset(vars(Machine(model=None, states=["a"], initial="a")))


def _freeze(value: Any) -> Hashable:
    if isinstance(value, Mapping):
        return tuple(sorted(((repr(k), _freeze(v)) for k, v in value.items())))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, set | frozenset):
        return frozenset(_freeze(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return value  # type: ignore[no-any-return]


def _model_data(model: Any, attribute: str) -> Hashable:
    """The model's own data: its attributes, less callables, machines and machine internals."""
    try:
        items = vars(model).items()
    except TypeError:
        return ()
    skip = _machine_keys() if isinstance(model, Machine) else frozenset()
    return tuple(
        sorted(
            (k, _freeze(v))
            for k, v in items
            if k != attribute
            and k not in skip
            and not callable(v)
            and not isinstance(v, Machine)
            and not k.startswith("__")
        )
    )


# -- the check -----------------------------------------------------------------------------------


def _invariant_list(invariants: Any) -> dict[str, Callable[[Any], object]]:
    if invariants is None:
        return {}
    if isinstance(invariants, Mapping):
        items = list(invariants.items())
    elif isinstance(invariants, Iterable) and not isinstance(invariants, str):
        items = [(getattr(f, "__name__", repr(f)), f) for f in invariants]
    else:
        raise InvalidArgumentError(
            f"invariants={shown(invariants)} must map names to predicates, or list predicates"
        )
    out: dict[str, Callable[[Any], object]] = {}
    for name, fn in items:
        if not isinstance(name, str) or not name or not callable(fn):
            raise InvalidArgumentError(
                f"invariants item {shown(name)}: {shown(fn)} must be a name and a callable"
            )
        out[name] = fn
    return out


def _user_check(fn: Callable[[Any], object]) -> Callable[[_Run], object]:
    """``fn`` over the user's model; an exception it raises is a violation, not a crash."""

    def check(run: _Run) -> object:
        try:
            return fn(run.model)
        except AssertionError:
            raise
        except Exception as exc:
            return f"the invariant raised {type(exc).__name__}: {exc}"

    check.__doc__ = getattr(fn, "__doc__", None)
    return check


def check_machine(
    machine: Any,
    *,
    model: Callable[[], Any] | None = None,
    free_guards: bool = False,
    invariants: Mapping[str, Callable[[Any], object]] | Iterable[Callable[[Any], object]] | None = None,
    snapshot: Callable[[Any], Hashable] | None = None,
    max_states: int | None = None,
    max_depth: int | None = None,
    progress: bool = False,
    name: str | None = None,
) -> CheckReport:
    """Explore a ``transitions`` machine of your own and check it (see the module's doc).

    ``machine`` is a ``transitions.Machine``, a machine class or a factory of machines (or of
    objects holding one they are a model of), a plain declaration dict (``states``,
    ``transitions``, ``initial``, ``final``), or a ``"MODULE:ATTR"`` string naming one.
    ``model`` is a factory of fresh models: guards and callbacks then run for real. A machine
    class or factory whose machines have a model is its own factory. ``free_guards`` ignores
    both and treats guards as free choices. ``invariants`` maps names to predicates over the
    model (or lists predicates, named after them): each returns ``None``/``True`` when it holds,
    ``False`` or a message when not. ``snapshot(model)`` replaces the default identity of a
    model's state (its state and its data attributes). ``max_states`` defaults to
    :data:`DEFAULT_MODEL_STATES` with real models and to no bound with free guards.

    Returns a :class:`~multiconnector.check.CheckReport`; :func:`validate` raises instead.

    .. versionadded:: 0.1.0
    """
    label_name = name
    if isinstance(machine, str):
        label_name = label_name or machine
        machine = load(machine, "machine")
    if not isinstance(free_guards, bool):
        raise InvalidArgumentError(f"free_guards={shown(free_guards)} must be a bool")
    if model is not None and not callable(model):
        raise InvalidArgumentError(f"model={shown(model)} must be a callable making a model")
    if snapshot is not None and not callable(snapshot):
        raise InvalidArgumentError(f"snapshot={shown(snapshot)} must be callable")
    checks = _invariant_list(invariants)
    built, own_factory = _resolve(machine)
    declared = _read(built)
    factory = None if free_guards else (model if model is not None else own_factory)
    label_name = label_name or declared.name or getattr(machine, "__qualname__", "") or "a machine"
    if factory is not None:
        scenario: _Scenario = _ModelScenario(declared, factory, snapshot)
        guards = (
            "your code: explored on fresh models from "
            + getattr(factory, "__qualname__", repr(factory))
        )
        if max_states is None:
            max_states = DEFAULT_MODEL_STATES
    else:
        scenario = _FreeScenario(declared)
        guards = "free choices (no model factory): each named guard may be true or false"
    finals = ", ".join(s for s in declared.states if s in declared.final) or "none"
    if not declared.final_declared:
        finals = f"none declared; taken as the states with no way out: {finals}"
    bounds: dict[str, Any] = {
        "machine": label_name,
        "guards": guards,
        "final states": finals,
        "max states": max_states if max_states is not None else "unbounded",
        "max depth": max_depth if max_depth is not None else "unbounded",
    }
    if declared.skipped_auto:
        bounds["auto transitions"] = "to_<state> left out"
    invariant_checks: dict[str, Callable[[_Run], object]] = {
        NO_DEADLOCK: scenario.no_deadlock,
        DETERMINISTIC: _deterministic(declared),
        FINAL_IS_FINAL: _final_is_final(declared),
    }
    for key, fn in checks.items():
        if key in invariant_checks or key in (NO_EXCEPTION, NO_TRAP, STATES_REACHED, TRANSITIONS_FIRED):
            raise InvalidArgumentError(f"invariants: {key!r} is the name of a built-in property")
        invariant_checks[key] = _user_check(fn)
    finals_set = declared.final

    def is_final(run: _Run) -> bool:
        return run.state in finals_set

    is_final.__doc__ = f"a final state: {', '.join(sorted(finals_set)) or 'none'}"
    return explore(
        scenario.initial,
        scenario.events,
        scenario.apply,
        scenario.snapshot,
        invariant_checks,
        goal=is_final if finals_set else None,
        machine=declared.build(),
        fired=_fired,
        describe=lambda run: run.state,
        label=scenario.label,
        data=scenario.data,
        annotate=scenario.annotate,
        max_states=max_states,
        max_depth=max_depth,
        progress=progress,
        bounds=bounds,
        title=f"multiconnector check: the machine {label_name}",
    )


def _fired(run: _Run) -> list[tuple[str, str, str]]:
    return [run.last] if run.last is not None else []


def _deterministic(declared: Declared) -> Callable[[_Run], object]:
    """Per state: the pairs of transitions one event could take at once."""
    clashes: dict[str, list[str]] = {}
    for trigger in declared.triggers:
        for source in declared.states:
            group = declared.candidates(source, trigger)
            for a, b in itertools.combinations(group, 2):
                if a.dest != b.dest and _overlap(a, b):
                    clashes.setdefault(source, []).append(
                        f"{trigger!r} in {source!r} can take both -> {a.dest}"
                        + (f" [{a.guard_text}]" if a.guard_text else "")
                        + f" and -> {b.dest}"
                        + (f" [{b.guard_text}]" if b.guard_text else "")
                        + " (transitions takes the first)"
                    )

    def no_overlapping_guards(run: _Run) -> object:
        """no event has two transitions, to different states, whose guards can hold at once"""
        found = clashes.get(run.state)
        return "; ".join(found) if found else None

    return no_overlapping_guards


def _final_is_final(declared: Declared) -> Callable[[_Run], object]:
    leaving: dict[str, list[str]] = {}
    for t in declared.transitions:
        if t.source in declared.final and declared.final_declared:
            leaving.setdefault(t.source, []).append(f"{t.trigger} -> {t.dest}")

    def final_states_final(run: _Run) -> object:
        """no transition leaves a final state"""
        found = leaving.get(run.state)
        return f"final state {run.state!r} has transitions out: {', '.join(found)}" if found else None

    return final_states_final


class _Scenario:
    declared: Declared

    def initial(self) -> _Run:
        raise NotImplementedError

    def events(self, run: _Run) -> list[Any]:
        raise NotImplementedError

    def apply(self, run: _Run, event: Any) -> None:
        raise NotImplementedError

    def snapshot(self, run: _Run) -> Hashable:
        raise NotImplementedError

    def no_deadlock(self, run: _Run) -> object:
        raise NotImplementedError

    def label(self, event: Any) -> str:
        raise NotImplementedError

    def data(self, event: Any) -> Any:
        raise NotImplementedError

    def annotate(self, run: _Run) -> Mapping[str, Any]:
        return {}


class _FreeScenario(_Scenario):
    """Guards are free choices; the state is the whole model."""

    def __init__(self, declared: Declared) -> None:
        self.declared = declared
        #: state -> [(trigger, candidate index in its group, dest, own guard values)]
        self.moves: dict[str, list[tuple[str, int, str, dict[str, bool]]]] = {}
        for source in declared.states:
            moves = self.moves.setdefault(source, [])
            for trigger in declared.triggers:
                group = declared.candidates(source, trigger)
                for t, values in _possible(group):
                    moves.append((trigger, group.index(t), t.dest, values))

    def initial(self) -> _Run:
        return _Run(_FreeModel(self.declared.initial), None, "state")

    def events(self, run: _Run) -> list[Any]:
        source = run.state
        return [(source, trigger, i) for trigger, i, _, _ in self.moves[source]]

    def apply(self, run: _Run, event: Any) -> None:
        source, trigger, index = event
        t = self.declared.candidates(source, trigger)[index]
        run.model.state = t.dest
        run.last = t.triple

    def snapshot(self, run: _Run) -> Hashable:
        return run.state

    def no_deadlock(self, run: _Run) -> object:
        """every reachable state that is not final has an event that can fire"""
        if run.state in self.declared.final or self.moves[run.state]:
            return None
        return f"no event can fire in {run.state!r}, which is not final"

    def _move(self, event: Any) -> tuple[Candidate, dict[str, bool]]:
        source, trigger, index = event
        t = self.declared.candidates(source, trigger)[index]
        values = next(v for tr, i, _, v in self.moves[source] if tr == trigger and i == index)
        return t, values

    def label(self, event: Any) -> str:
        t, values = self._move(event)
        guards = ", ".join(g if v else f"!{g}" for g, v in values.items())
        return f"{t.trigger} [{guards}]" if guards else t.trigger

    def data(self, event: Any) -> Any:
        t, values = self._move(event)
        return {"trigger": t.trigger, "source": t.source, "dest": t.dest, "guards": values}


class _ModelScenario(_Scenario):
    """Fresh models from the user's factory; guards and callbacks run for real."""

    def __init__(
        self,
        declared: Declared,
        factory: Callable[[], Any],
        snapshot: Callable[[Any], Hashable] | None,
    ) -> None:
        self.declared = declared
        self.factory = factory
        self.user_snapshot = snapshot
        self.shared: Machine | None = None  # for plain models: one machine, one model at a time
        self.previous: Any = None
        self.autos = frozenset(f"to_{s}" for s in declared.states)

    def initial(self) -> _Run:
        made = self.factory()
        machine = _owned_machine(made)
        model = made
        if machine is not None and made is machine:
            model = machine.models[0] if machine.models else None
            if model is None:
                raise InvalidArgumentError(
                    f"model={shown(self.factory)} made a machine with no model attached"
                )
        if machine is None:
            if self.shared is None:
                self.shared = self.declared.build()
            if self.previous is not None:
                self.shared.remove_model(self.previous)
            self.shared.add_model(made)
            self.previous = made
            machine = self.shared
        attribute = str(getattr(machine, "model_attribute", "state"))
        return _Run(model, machine, attribute)

    def events(self, run: _Run) -> list[Any]:
        assert run.machine is not None
        declared = {t.trigger for t in self.declared.transitions if t.source == run.state}
        return [t for t in run.machine.events if t in declared]

    def apply(self, run: _Run, event: Any) -> None:
        assert run.machine is not None
        source = run.state
        run.last = None
        if run.machine.events[event].trigger(run.model):
            run.last = (source, str(event), run.state)

    def snapshot(self, run: _Run) -> Hashable:
        if self.user_snapshot is not None:
            return (run.state, self.user_snapshot(run.model))
        return (run.state, _model_data(run.model, run.attribute))

    def no_deadlock(self, run: _Run) -> object:
        """every reachable state that is not final has an event that can fire"""
        if run.state in self.declared.final:
            return None
        for trigger in self.events(run):
            may = getattr(run.model, f"may_{trigger}", None)
            if may is None or may():
                return None
        return f"no event can fire in {run.state!r}, which is not final"

    def label(self, event: Any) -> str:
        return str(event)

    def data(self, event: Any) -> Any:
        return str(event)

    def annotate(self, run: _Run) -> Mapping[str, Any]:
        return {"model": repr(_model_data(run.model, run.attribute))}


# -- validation ----------------------------------------------------------------------------------


def problems(report: CheckReport) -> list[str]:
    """One line per failed property of ``report``, with its shortest trace."""
    out: list[str] = []
    for p in report.failures:
        line = f"{p.name}: {p.message}"
        trace = p.counterexample
        if trace is not None:
            line += f" (shortest trace from {trace.initial}: {_trace_text(trace)})"
        out.append(line)
    return out


def _trace_text(trace: Counterexample) -> str:
    if not trace.steps:
        return "the initial state"
    return ", ".join(f"{s.event} -> {s.state}" for s in trace.steps)


def validate(
    machine: Any,
    *,
    model: Callable[[], Any] | None = None,
    free_guards: bool = False,
    invariants: Mapping[str, Callable[[Any], object]] | Iterable[Callable[[Any], object]] | None = None,
    max_states: int | None = None,
    max_depth: int | None = None,
) -> CheckReport:
    """Check ``machine`` (as :func:`check_machine` does) and raise if anything is wrong.

    Meant for import time or a test. Raises :class:`~multiconnector.errors.InvalidMachineError`
    listing every problem: each failed property with its shortest trace, or every reason a plain
    declaration cannot be built. Returns the passing report.

    >>> validate({"states": ["a", "b"], "initial": "a", "final": ["b"],
    ...           "transitions": [["go", "a", "b"]]}).ok
    True
    >>> validate({"states": ["a", "b", "c"], "initial": "a", "final": ["b"],
    ...           "transitions": [["go", "a", "b"], ["stop", "b", "a"]]})
    Traceback (most recent call last):
    ...
    multiconnector.errors.InvalidMachineError: 3 problems in the machine:
      - final states final: final state 'b' has transitions out: stop -> a (shortest trace from a: go -> b)
      - states reached: never entered: c
      - transitions fired: ...

    .. versionadded:: 0.1.0
    """
    report = check_machine(
        machine,
        model=model,
        free_guards=free_guards,
        invariants=invariants,
        max_states=max_states,
        max_depth=max_depth,
    )
    if not report.ok:
        raise InvalidMachineError(problems(report), report)
    return report


# -- the command ---------------------------------------------------------------------------------

#: The aggregator scenario's options, which mean nothing for a machine of your own.
_AGGREGATOR_OPTIONS: Final = ("connectors", "unknown", "requests", "events", "load", "no_symmetry")


def add_check_arguments(parser: Any) -> None:
    """The ``--machine`` options of ``multiconnector check``."""
    group = parser.add_argument_group(
        "your own machine",
        "check a transitions machine of your own instead of the transfer machine",
    )
    group.add_argument(
        "--machine",
        metavar="MODULE:ATTR",
        help="a transitions Machine, a machine class or factory, or a declaration dict "
        "(states, transitions, initial, final); the current directory is importable",
    )
    group.add_argument(
        "--model",
        metavar="MODULE:ATTR",
        help="a factory of fresh models: guards and callbacks run for real (default: a "
        "machine class or factory whose machines have a model; otherwise guards are free)",
    )
    group.add_argument(
        "--free-guards",
        action="store_true",
        help="treat every named guard as a free choice, even with a model factory",
    )
    group.add_argument(
        "--invariant",
        metavar="MODULE:ATTR",
        action="append",
        default=[],
        help="a predicate over the model that must hold in every reachable state (repeatable)",
    )


def run_check_cli(args: Any, parser: Any) -> int:
    """``multiconnector check --machine``: 0 PASS, 1 a property FAILs, 2 bad input."""
    import json  # noqa: PLC0415 - the command's only

    if args.machine is None:
        parser.print_usage(sys.stderr)
        print(
            "multiconnector check: error: --model, --free-guards and --invariant need --machine",
            file=sys.stderr,
        )
        return 2
    given = [o for o in _AGGREGATOR_OPTIONS if getattr(args, o) != parser.get_default(o)]
    if given:
        parser.print_usage(sys.stderr)
        print(
            "multiconnector check: error: "
            + ", ".join("--" + o.replace("_", "-") for o in given)
            + " applies to the transfer machine, not to --machine",
            file=sys.stderr,
        )
        return 2
    try:
        model = load(args.model, "--model") if args.model is not None else None
        invariants = {spec.rpartition(":")[2]: load(spec, "--invariant") for spec in args.invariant}
        report = check_machine(
            load(args.machine, "--machine"),
            name=args.machine,
            model=model,
            free_guards=args.free_guards,
            invariants=invariants,
            max_states=args.max_states,
            max_depth=args.max_depth,
            progress=not args.no_progress,
        )
    except (InvalidArgumentError, InvalidMachineError) as exc:
        where = "" if isinstance(exc, InvalidArgumentError) else f"--machine {args.machine}: "
        text = str(exc).replace("\n  - ", "; ")
        print(f"multiconnector check: error: {where}{text}", file=sys.stderr)
        return 2
    print(report.to_text())
    if args.json is not None:
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        except OSError as exc:
            print(f"multiconnector check: error: cannot write --json: {exc}", file=sys.stderr)
            return 2
        print(f"report written to {args.json}")
    return 0 if report.ok else 1

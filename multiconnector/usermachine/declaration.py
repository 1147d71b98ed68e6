"""A machine's declaration, read from a ``transitions`` Machine, a class or factory, or a dict."""

from __future__ import annotations

import enum
import importlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, final

import attrs
from transitions import Machine

from .._validate import shown
from ..errors import InvalidArgumentError, InvalidMachineError, InvalidValueError

__all__ = ["DECLARATION_KEYS", "Candidate", "Declared", "declare", "load", "resolve"]

#: Keys a plain declaration may have.
DECLARATION_KEYS: Final = frozenset(
    {"states", "transitions", "initial", "final", "name", "auto_transitions", "model_attribute"}
)


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
        """The transitions for ``trigger`` in ``source``, in the order ``transitions`` tries."""
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
        raise InvalidValueError(
            f"{argument}={spec!r} must be MODULE:ATTR, such as mypackage.flows:OrderFlow"
        )
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise InvalidValueError(
            f"{argument}={spec!r}: no module named {exc.name!r} (run from the directory that "
            "holds it, or put it on PYTHONPATH)"
        ) from None
    except (Exception, SystemExit) as exc:  # a module that exits while imported fails too
        raise InvalidArgumentError(
            f"{argument}={spec!r}: importing {module_name!r} raised {type(exc).__name__}: {exc}"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise InvalidValueError(
                f"{argument}={spec!r}: {type(obj).__name__} {getattr(obj, '__name__', '?')!r} "
                f"has no attribute {part!r}"
            ) from None
    return obj


# -- reading a declaration -----------------------------------------------------------------------


def machine_name(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return str(value.name)
    return str(value)


def _guard_name(func: Any) -> str:
    if isinstance(func, str):
        return func
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or repr(func)
    return f"{name}@{id(func):x}" if "<lambda>" in name else str(name)


def owned_machine(obj: Any) -> Machine | None:
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
            if not isinstance(s, str):
                problems.append(f"'final' item {shown(s)} must be a state name")
            elif s not in known:
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
            if not isinstance(s, str):
                problems.append(f"transitions[{i}] source {shown(s)} must be a state name")
            elif s != "*" and s not in known:
                problems.append(f"transitions[{i}] source {s!r} is not a declared state")
        if dest is not None and not isinstance(dest, str):
            problems.append(f"transitions[{i}] dest {shown(dest)} must be a state name or None")
        elif dest is not None and dest != "=" and dest not in known:
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
            transitions=[
                dict(t) if isinstance(t, Mapping) else list(t) for t in decl.get("transitions", ())
            ],
            auto_transitions=bool(decl.get("auto_transitions", False)),
            model_attribute=str(decl.get("model_attribute", "state")),
            name=str(decl.get("name", "")),
        )
    except (ValueError, TypeError, AttributeError) as exc:
        raise InvalidMachineError([f"transitions refused the declaration: {exc}"]) from None


def read(machine: Machine) -> Declared:
    initial = machine.initial
    if initial is None:
        raise InvalidMachineError(["the machine has no initial state"])
    states = tuple(machine_name(s) for s in machine.states)
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
                        source=machine_name(source),
                        dest=machine_name(t.dest) if t.dest is not None else machine_name(source),
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
        initial=machine_name(initial),
        final=finals,
        final_declared=final_declared,
        transitions=tuple(found),
        model_attribute=str(getattr(machine, "model_attribute", "state")),
        name=str(getattr(machine, "name", "") or "").strip(": "),
        skipped_auto=auto,
    )


def resolve(obj: Any) -> tuple[Machine, Callable[[], Any] | None]:
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
        except Exception as exc:  # the user's code: its error, named, is the machine's problem
            raise InvalidArgumentError(
                f"machine={shown(obj)} raised {type(exc).__name__} when called: {exc}"
            ) from None
        machine = owned_machine(made)
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
    return read(resolve(machine)[0])

"""The check of a machine of your own: its scenarios (free guards, real models), its properties."""

from __future__ import annotations

import copy
import gc
import itertools
import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Final

import attrs
from transitions import Machine

from .._explore import (
    NO_EXCEPTION,
    NO_TRAP,
    STATES_REACHED,
    TRANSITIONS_FIRED,
    CheckReport,
    Counterexample,
    SearchConfig,
    explore,
    remaining_seconds,
)
from .._validate import bad_argument, shown
from ..errors import InvalidArgumentError, InvalidMachineError
from .declaration import Candidate, Declared, load, machine_name, owned_machine, read, resolve
from .overlap import by_guards, by_names
from .values import data_items, model_data, shown_state, values_text

__all__ = [
    "DEFAULT_MODEL_STATES",
    "DETERMINISTIC",
    "FINAL_IS_FINAL",
    "NO_DEADLOCK",
    "check_machine",
    "problems",
    "validate",
]

NO_DEADLOCK: Final = "no deadlock"
DETERMINISTIC: Final = "no overlapping guards"
FINAL_IS_FINAL: Final = "final states final"
#: Above this many named conditions in one (state, event) group, a candidate counts as
#: possible whenever its own guards are consistent (the exact search is 2**n).
_EXACT_GUARDS: Final = 12
#: The default bound on distinct states when real models are explored (their data may grow).
DEFAULT_MODEL_STATES: Final = 100_000
#: The most models kept for states found and not yet expanded (each a machine of its own, a
#: few kilobytes, when the model holds one); past it, a state's model is rebuilt by replay.
_KEEP_MODELS: Final = 20_000
#: Collect the young objects' cycles once per this many copies of a model (plus one: a mask).
#: A model holding its machine is a cycle: a copy the search drops is freed only by the
#: collector, which the search pauses; a few thousand piled up take a second to free at once.
_COLLECT_EVERY: Final = (1 << 10) - 1


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
                out.append(
                    (t, {**dict.fromkeys(t.conditions, True), **dict.fromkeys(t.unless, False)})
                )
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
        return machine_name(getattr(self.model, self.attribute))


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
            raise bad_argument(isinstance(name, str) and callable(fn))(
                f"invariants item {shown(name)}: {shown(fn)} must be a name and a callable"
            )
        out[name] = fn
    return out


def _user_check(fn: Callable[[Any], object]) -> Callable[[_Run], object]:
    """``fn`` over the user's model; an exception it raises is a violation, not a crash."""

    def check(run: _Run) -> object:
        try:
            result = fn(run.model)
        except AssertionError:
            raise
        except Exception as exc:
            return f"the invariant raised {type(exc).__name__}: {exc}"
        if result is False:  # said here, not by its docstring again (the report's heading)
            values = values_text(run.model, run.attribute)
            return f"it returned False in {run.state!r}" + (f" with {values}" if values else "")
        return result

    check.__doc__ = getattr(fn, "__doc__", None)
    return check


def check_machine(
    machine: Any,
    *,
    model: Callable[[], Any] | None = None,
    free_guards: bool = False,
    invariants: Mapping[str, Callable[[Any], object]]
    | Iterable[Callable[[Any], object]]
    | None = None,
    snapshot: Callable[[Any], Hashable] | None = None,
    max_states: int | None = None,
    max_depth: int | None = None,
    max_seconds: float | None = None,
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
    ``max_seconds`` is a wall-time budget, the set-up (importing, building the machine)
    included: the search stops cleanly when it runs out and the verdict is ``INCONCLUSIVE``
    unless a property failed.

    A state's model is a copy of the model it was found with (a fresh model from the factory,
    given a deep copy of the data attributes and the state), so the search costs time linear in
    the states; a model whose copy's snapshot differs from its own (data outside its
    ``__dict__``, a copy that fails) is rebuilt by replaying its events from a fresh one.

    Returns a :class:`~multiconnector.check.CheckReport`; :func:`validate` raises instead.

    .. versionadded:: 0.1.0
    """
    started = time.perf_counter()
    label_name = name
    if isinstance(machine, str):
        label_name = label_name or machine
        machine = load(machine, "machine")
    _check_options(free_guards, model, snapshot)
    checks = _invariant_list(invariants)
    built, own_factory = resolve(machine)
    declared = read(built)
    factory = None if free_guards else (model if model is not None else own_factory)
    label_name = label_name or declared.name or getattr(machine, "__qualname__", "") or "a machine"
    scenario, guards = _scenario(declared, factory, snapshot, built)
    if factory is not None and max_states is None:
        max_states = DEFAULT_MODEL_STATES
    bounds = SearchConfig(
        max_states=max_states, max_depth=max_depth, max_seconds=max_seconds, progress=progress
    )
    return explore(
        scenario.initial,
        scenario.events,
        scenario.apply,
        scenario.snapshot,
        _invariant_checks(scenario, declared, checks),
        goal=_final_goal(declared),
        machine=declared.build(),
        fired=_fired,
        describe=_shown,
        label=scenario.label,
        data=scenario.data,
        annotate=scenario.annotate,
        config=_search(
            bounds, scenario, declared, label_name=label_name, guards=guards, started=started
        ),
    )


def _search(
    bounds: SearchConfig,
    scenario: _Scenario,
    declared: Declared,
    *,
    label_name: str,
    guards: str,
    started: float,
) -> SearchConfig:
    """The search :func:`check_machine` runs: ``bounds``, what is left of its ``max_seconds``
    since ``started``, the copies of ``scenario``'s models, and the report's heading."""
    return attrs.evolve(
        bounds,
        fork=scenario.fork,
        keep_models=_KEEP_MODELS,
        max_seconds=remaining_seconds(bounds.max_seconds, started),
        bounds=_bounds(
            declared,
            label_name,
            guards,
            max_states=bounds.max_states,
            max_depth=bounds.max_depth,
            max_seconds=bounds.max_seconds,
        ),
        title=f"multiconnector check: the machine {label_name}",
    )


def _scenario(
    declared: Declared,
    factory: Callable[[], Any] | None,
    snapshot: Callable[[Any], Hashable] | None,
    built: Machine,
) -> tuple[_Scenario, str]:
    """What :func:`check_machine` explores: real models from ``factory``, or free guards
    (``factory`` ``None``); and how the report shows the guards."""
    if factory is None:
        guards = "free choices (no model factory): each named guard may be true or false"
        return _FreeScenario(declared), guards
    shown_factory = getattr(factory, "__qualname__", repr(factory))
    guards = f"your code: explored on fresh models from {shown_factory}"
    return _ModelScenario(declared, factory, snapshot, built), guards


def _check_options(free_guards: Any, model: Any, snapshot: Any) -> None:
    if not isinstance(free_guards, bool):
        raise InvalidArgumentError(f"free_guards={shown(free_guards)} must be a bool")
    if model is not None and not callable(model):
        raise InvalidArgumentError(f"model={shown(model)} must be a callable making a model")
    if snapshot is not None and not callable(snapshot):
        raise InvalidArgumentError(f"snapshot={shown(snapshot)} must be callable")


def _bounds(
    declared: Declared,
    label: str,
    guards: str,
    *,
    max_states: int | None,
    max_depth: int | None,
    max_seconds: float | None,
) -> dict[str, Any]:
    """What the report says was explored, and how (a bound not set is ``None``, shown as
    unbounded)."""
    finals = ", ".join(s for s in declared.states if s in declared.final)
    if not declared.final_declared:
        finals = "none declared; taken as the states with no way out: " + (
            finals or "none, so no trap check"
        )
    bounds: dict[str, Any] = {
        "machine": label,
        "guards": guards,
        "final states": finals,
        "max states": max_states,
        "max depth": max_depth,
    }
    if max_seconds is not None:
        bounds["max seconds"] = max_seconds
    if declared.skipped_auto:
        bounds["auto transitions"] = "to_<state> left out"
    return bounds


def _invariant_checks(
    scenario: _Scenario, declared: Declared, checks: Mapping[str, Callable[[Any], object]]
) -> dict[str, Callable[[_Run], object]]:
    """The built-in invariants, then the user's (whose names must not be a built-in's)."""
    invariant_checks: dict[str, Callable[[_Run], object]] = {
        NO_DEADLOCK: scenario.no_deadlock,
        DETERMINISTIC: by_names(declared)
        if isinstance(scenario, _FreeScenario)
        else by_guards(declared),
        FINAL_IS_FINAL: _final_is_final(declared),
    }
    for key, fn in checks.items():
        if key in invariant_checks or key in (
            NO_EXCEPTION,
            NO_TRAP,
            STATES_REACHED,
            TRANSITIONS_FIRED,
        ):
            raise InvalidArgumentError(f"invariants: {key!r} is the name of a built-in property")
        invariant_checks[key] = _user_check(fn)
    return invariant_checks


def _final_goal(declared: Declared) -> Callable[[_Run], bool] | None:
    """The goal every run must be able to reach: a final state (none: no trap check)."""
    finals_set = declared.final
    if not finals_set:
        return None

    def is_final(run: _Run) -> bool:
        return run.state in finals_set

    is_final.__doc__ = f"a final state: {', '.join(sorted(finals_set))}"
    return is_final


def _shown(run: _Run) -> str:
    """A state of a trace: its name and its model's values (``closed (failures=3)``)."""
    return shown_state(run.state, run.model, run.attribute)


def _fired(run: _Run) -> list[tuple[str, str, str]]:
    return [run.last] if run.last is not None else []


def _final_is_final(declared: Declared) -> Callable[[_Run], object]:
    leaving: dict[str, list[str]] = {}
    for t in declared.transitions:
        if t.source in declared.final and declared.final_declared:
            leaving.setdefault(t.source, []).append(f"{t.trigger} -> {t.dest}")

    def final_states_final(run: _Run) -> object:
        """no transition leaves a final state"""
        found = leaving.get(run.state)
        return (
            f"final state {run.state!r} has transitions out: {', '.join(found)}" if found else None
        )

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

    def fork(self, run: _Run) -> _Run | None:
        """An independent copy of ``run`` (``None``: replay its events instead)."""
        return None


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

    def fork(self, run: _Run) -> _Run:
        return _Run(_FreeModel(run.state), None, "state", run.last)

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
        machine: Machine,
    ) -> None:
        self.declared = declared
        self.factory = factory
        self.user_snapshot = snapshot
        # Plain models are attached to the given machine (callbacks included), one at a time.
        self.shared = machine
        self.previous: Any = None
        #: Whether models are copied (:meth:`fork`); off after the first copy that failed.
        self.forking = True
        self.copies = 0
        self.collecting = gc.isenabled()

    def initial(self) -> _Run:
        """A fresh model from the factory, on its own machine or attached to the given one.

        The factory is the caller's argument: when it raises, or makes something that cannot
        be a model, :class:`~multiconnector.InvalidArgumentError` says so (the search stops).
        """
        try:
            made = self.factory()
        except Exception as exc:
            raise InvalidArgumentError(
                f"model={shown(self.factory)} raised {type(exc).__name__} when called: {exc}"
            ) from None
        machine = owned_machine(made)
        model = made
        if machine is not None and made is machine:
            model = machine.models[0] if machine.models else None
            if model is None:
                raise InvalidArgumentError(
                    f"model={shown(self.factory)} made a machine with no model attached"
                )
        if machine is None:
            if made is None:  # transitions would take it for "no model" and attach nothing
                raise InvalidArgumentError(f"model={shown(self.factory)} made None, not a model")
            if self.previous is not None:
                self.shared.remove_model(self.previous)
                self.previous = None
            try:
                self.shared.add_model(made)
            except Exception as exc:  # an int, a str: transitions cannot give it triggers
                raise InvalidArgumentError(
                    f"model={shown(self.factory)} made {shown(made)}, which cannot be a model: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
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
        return (run.state, model_data(run.model, run.attribute))

    def fork(self, run: _Run) -> _Run | None:
        """A fresh model given a deep copy of ``run``'s data and its state; ``None`` (and no
        copies from then on) when the copy fails or its snapshot is not ``run``'s."""
        if not self.forking:
            return None
        self.copies += 1
        if self.collecting and self.copies & _COLLECT_EVERY == 0:
            gc.collect(0)  # the copies dropped since the last time (the search paused it)
        items = data_items(run.model, run.attribute)
        copied = None if items is None else self._copied(run, items)
        if copied is None or self.snapshot(copied) != self.snapshot(run):
            self.forking = False
            return None
        return copied

    def _copied(self, run: _Run, items: list[tuple[str, Any]]) -> _Run | None:
        fresh = self.initial()
        if fresh.machine is None or fresh.attribute != run.attribute:
            return None
        # What refers back to the model or its machine refers to the copy's.
        memo: dict[int, Any] = {id(run.model): fresh.model, id(run.machine): fresh.machine}
        try:
            for key, value in items:
                setattr(fresh.model, key, copy.deepcopy(value, memo))
            fresh.machine.set_state(run.state, model=fresh.model)
        except Exception:  # a lock, a handle: replay instead
            return None
        fresh.last = run.last
        return fresh

    def no_deadlock(self, run: _Run) -> object:
        """every reachable state that is not final has an event that can fire"""
        if run.state in self.declared.final:
            return None
        for trigger in self.events(run):
            may = getattr(run.model, f"may_{trigger}", None)
            try:
                if may is None or may():
                    return None
            except Exception:  # its guard raised (or is missing): not a deadlock
                # Applying the event runs the same guard: the exception is reported there, as
                # the property "no exception" (the event's exception, with its trace).
                return None
        return f"no event can fire in {run.state!r}, which is not final"

    def label(self, event: Any) -> str:
        return str(event)

    def data(self, event: Any) -> Any:
        return str(event)

    def annotate(self, run: _Run) -> Mapping[str, Any]:
        return {"model": repr(model_data(run.model, run.attribute))}


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
    invariants: Mapping[str, Callable[[Any], object]]
    | Iterable[Callable[[Any], object]]
    | None = None,
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
    multiconnector.errors.InvalidMachineError: 2 problems in the machine:
      - final states final: final state 'b' has transitions out: stop -> a (shortest trace ...
      - states reached: never entered: c

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

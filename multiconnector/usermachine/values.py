"""A model's own data: what a state is made of besides its name, and how a trace shows it."""

from __future__ import annotations

import functools
from collections.abc import Hashable, Mapping
from typing import Any, Final

from transitions import Machine

__all__ = ["data_items", "model_data", "shown_state", "state_name", "values_text"]

#: The longest model values shown in a trace step or a message, in characters.
_MAX_VALUES: Final = 200


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


def data_items(model: Any, attribute: str) -> list[tuple[str, Any]] | None:
    """The model's own data attributes, less callables, machines and machine internals
    (``None``: the model has no ``__dict__``)."""
    try:
        items = vars(model).items()
    except TypeError:
        return None
    skip = _machine_keys() if isinstance(model, Machine) else frozenset()
    return [
        (k, v)
        for k, v in items
        if k != attribute
        and k not in skip
        and not callable(v)
        and not isinstance(v, Machine)
        and not k.startswith("__")
    ]


def model_data(model: Any, attribute: str) -> Hashable:
    """The model's own data, frozen: what a state is made of besides its name."""
    items = data_items(model, attribute)
    return () if items is None else tuple(sorted((k, _freeze(v)) for k, v in items))


def values_text(model: Any, attribute: str) -> str:
    """``failures=3, name='x'``: the model's data attributes (its state, callables and machines
    left out), sorted by name, cut at :data:`_MAX_VALUES` characters; ``""`` when it has none."""
    items = data_items(model, attribute)
    if not items:
        return ""
    text = ", ".join(f"{k}={v!r}" for k, v in sorted(items, key=lambda kv: kv[0]))
    return text if len(text) <= _MAX_VALUES else text[: _MAX_VALUES - 3] + "..."


def shown_state(state: str, model: Any, attribute: str) -> str:
    """A state as a trace shows it: ``closed (failures=3)``, its name then its model's values
    (the name alone when the model has none). :func:`state_name` reads the name back."""
    values = values_text(model, attribute)
    return f"{state} ({values})" if values else state


def state_name(text: str, states: tuple[str, ...]) -> str:
    """The state a trace's ``text`` (:func:`shown_state`) is about: ``text`` itself when it is
    one of ``states``, else the longest of ``states`` it starts with followed by ``" ("``;
    ``text`` unchanged when none fits (the caller refuses it)."""
    if text in states:
        return text
    for state in sorted(states, key=len, reverse=True):
        if text.startswith(state + " (") and text.endswith(")"):
            return state
    return text

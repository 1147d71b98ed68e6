"""Merging the transfer params of several connectors: a pure function.

vLLM first refused params from more than one connector, then merged them by adopting the first
connector's dict and ``update()``-ing it in place: that connector's own dict changed under it.
:func:`merge_transfer_params` never mutates or returns an input mapping, reports every clash at
once, and runs in time linear in the number of keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ._validate import check_name, name_problem, shown
from .errors import DuplicateConnectorError, InvalidArgumentError, InvalidParamsError, KeyClashError

__all__ = ["merge_transfer_params"]


def _equal(a: Any, b: Any, key: str, names: list[str]) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception as exc:  # values whose == raises or is ambiguous (arrays, say)
        raise InvalidParamsError(
            f"params key={key!r} from {', '.join(names)}: allow_equal cannot compare its values "
            f"({type(exc).__name__}: {exc})"
        ) from exc


def merge_transfer_params(
    contributions: Iterable[tuple[str, Mapping[str, Any] | None]],
    *,
    allow_equal: bool = False,
) -> dict[str, Any] | None:
    """Merge each connector's transfer params into one new dict.

    ``contributions`` is ``(connector name, params)`` pairs in connector order. ``None`` params
    contribute nothing; an empty mapping contributes an empty dict. The result is ``None`` when
    nothing contributed, otherwise a new dict whose keys come in connector order, then each
    connector's own order. Inputs are never mutated, and no input mapping is returned (values are
    shared, not copied).

    A key supplied by two or more connectors raises :class:`KeyClashError` after every
    contribution was read, naming all clashing keys and their connectors. With
    ``allow_equal=True``, a key supplied again with an equal value is not a clash; values whose
    ``==`` raises (or gives something with no truth value, as arrays do) raise
    :class:`InvalidParamsError` naming the key and its connectors.

    >>> merge_transfer_params([("cache", {"hits": 3}), ("pd", {"remote": "h:1"}), ("x", None)])
    {'hits': 3, 'remote': 'h:1'}

    .. versionadded:: 0.1.0
    """
    if not isinstance(allow_equal, bool):
        raise InvalidArgumentError(f"allow_equal={shown(allow_equal)} must be a bool")
    kind = contributions.__class__
    if (kind is not list and kind is not tuple) and (  # a list or a tuple is an iterable
        isinstance(contributions, str | bytes | Mapping) or not isinstance(contributions, Iterable)
    ):
        raise InvalidArgumentError(
            f"contributions={shown(contributions)} must be an iterable of (name, params) pairs"
        )
    merged: dict[str, Any] | None = None
    owner: dict[str, str] = {}
    suppliers: dict[str, list[str]] = {}  # only keys supplied more than once
    differing: set[str] = set()
    names: set[str] = set()
    for index, item in enumerate(contributions):
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidArgumentError(
                f"contributions[{index}]={shown(item)} must be a (name, params) tuple"
            )
        name, params = item
        if name.__class__ is not str or name_problem(name) is not None:
            name = check_name(name, f"contributions[{index}][0]")
        if name in names:
            raise DuplicateConnectorError(f"connector name={name!r} contributes twice")
        names.add(name)
        if params is None:
            continue
        if params.__class__ is not dict and not isinstance(params, Mapping):
            raise InvalidParamsError(
                f"params of connector {name!r}={shown(params)} must be a Mapping or None"
            )
        if merged is None:
            merged = {}
        for key, value in params.items():
            if type(key) is not str and not isinstance(key, str):
                raise InvalidParamsError(
                    f"params of connector {name!r} have key={shown(key)}; keys must be str"
                )
            first = owner.get(key)
            if first is None:
                owner[key] = name
                merged[key] = value
                continue
            supplied = suppliers.get(key)
            if supplied is None:
                suppliers[key] = supplied = [first]
            supplied.append(name)
            if not (allow_equal and _equal(merged[key], value, key, supplied)):
                differing.add(key)
    if differing:
        # In merged order, so the message is deterministic.
        assert merged is not None
        raise KeyClashError({k: tuple(suppliers[k]) for k in merged if k in differing})
    return merged

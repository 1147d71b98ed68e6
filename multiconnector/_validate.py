"""One rule per kind of input, shared by every public call: ``name=value!r must be ...``.

The rules (docs/bad-input.md lists every call's bad inputs and what each gets):

* **request id**: a non-empty ``str``; a ``str`` subclass (numpy's ``str_``, say) is accepted
  everywhere and made a plain ``str``.
* **connector name**: a ``str`` (a subclass is made a plain ``str``) of 1 to :data:`MAX_NAME_LENGTH`
  characters, every one printable and none whitespace, and none of :data:`NAME_SEPARATORS` (the
  command line's list separators). ``"pd@0"`` is a name; ``" "``, ``"a b"``, ``"a\\n"``,
  ``"a,b"`` and ``"a=b"`` are not.
* **blocks**: a sequence (not a ``str``, ``bytes`` or mapping) of ``int`` block ids, each
  ``>= 0`` (an object with ``__index__``, numpy's integers say, counts; a ``bool`` does not).
  A ``range`` is checked in O(1), whatever its length.
* **stripes**: a power of two from 1 to :data:`MAX_STRIPES`.
* **connector**: an instance, not a class.

A bad argument of the wrong type raises :class:`InvalidArgumentError` (a ``TypeError``); one of
the right type whose value is out of range, empty, negative or not among the choices raises
:class:`InvalidValueError` (also a ``ValueError``): :func:`bad_argument` picks between them.
"""

from __future__ import annotations

import operator
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, Final, NoReturn

from .errors import InvalidArgumentError, InvalidNameError, InvalidValueError

#: The longest connector name, in characters.
MAX_NAME_LENGTH: Final = 128
#: Characters a connector name may not contain: the command line splits lists on them.
NAME_SEPARATORS: Final = ",="
#: The most lock stripes an aggregator takes (each costs a lock and two small dicts).
MAX_STRIPES: Final = 1 << 16


def _shown(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} (type {type(value).__name__})"


def shown(value: Any) -> str:
    return _shown(value)


def name_problem(value: str) -> str | None:
    """Why the ``str`` ``value`` is not a connector name, or ``None`` when it is one."""
    if not value:
        return "must be a non-empty str"
    if len(value) > MAX_NAME_LENGTH:
        return f"must be at most {MAX_NAME_LENGTH} characters long, not {len(value):,}"
    # isprintable() is false for every whitespace character but the ASCII space.
    if not value.isprintable() or " " in value:
        return "must be printable, with no whitespace"
    if "," in value or "=" in value:  # NAME_SEPARATORS
        return f"must not contain any of {' '.join(NAME_SEPARATORS)}"
    return None


def check_name(value: Any, argument: str = "name") -> str:
    """``value`` as a plain ``str`` if it is a connector name; :class:`InvalidNameError` if not."""
    if isinstance(value, str):
        problem = name_problem(value)
        if problem is None:
            return value if type(value) is str else str(value)
        raise InvalidNameError(f"{argument}={_shown(value)} {problem}")
    raise InvalidNameError(f"{argument}={_shown(value)} must be a non-empty str")


def bad_request_id(value: Any, argument: str = "request_id") -> NoReturn:
    error = InvalidValueError if isinstance(value, str) else InvalidArgumentError
    raise error(f"{argument}={_shown(value)} must be a non-empty str")


def check_request_id(value: Any, argument: str = "request_id") -> str:
    """``value`` as a plain ``str`` if it is a request id; :class:`InvalidArgumentError` if not."""
    if isinstance(value, str) and value:
        return value if type(value) is str else str(value)
    bad_request_id(value, argument)


def check_request_ids(value: Any, argument: str = "request_ids") -> Collection[str]:
    """``value`` as a collection of plain-``str`` request ids: a list, tuple, set or frozenset of
    plain ``str`` as it is, any other iterable copied into a list, str subclasses made plain;
    :class:`InvalidArgumentError` for a ``str``, something not iterable, or an item that is not a
    request id."""
    ids = value
    kind = ids.__class__
    if kind is not set and kind is not frozenset and kind is not list and kind is not tuple:
        if isinstance(ids, str | bytes) or not isinstance(ids, Iterable):
            raise InvalidArgumentError(
                f"{argument}={_shown(ids)} must be an iterable of request ids (str)"
            )
        ids = list(ids)
    for request_id in ids:
        if request_id.__class__ is not str or not request_id:
            return [check_request_id(i, f"an item of {argument}") for i in ids]
    return ids  # type: ignore[no-any-return]


def check_blocks(value: Any, argument: str = "blocks") -> Sequence[int]:
    """``value`` if it is a sequence of block ids; :class:`InvalidArgumentError` otherwise.

    The hot paths call this only for what is not a list or tuple, and :func:`check_block_ids`
    for the ids of a non-empty list or tuple.
    """
    if type(value) is range:  # its ids are ints: only the smallest is checked, in O(1)
        if value and min(value[0], value[-1]) < 0:
            step = value.step
            first = 0 if value.start < 0 else value.start // -step + 1  # step < 0 here
            _negative(argument, first, value[first])
        return value
    if (type(value) is not list and type(value) is not tuple) and (
        not isinstance(value, Sequence) or isinstance(value, str | bytes | Mapping)
    ):
        raise InvalidArgumentError(f"{argument}={_shown(value)} must be a sequence of block ids")
    check_block_ids(value, argument)
    return value


def check_block_ids(value: Sequence[Any], argument: str = "blocks") -> None:
    """Raise :class:`InvalidArgumentError` unless every item of ``value`` is an int block id,
    :class:`InvalidValueError` for a negative one."""
    # A plain loop: about 5x cheaper than set(map(type, value)) for 1 id, 1.3x for 128 (timeit,
    # best of 7, CPython 3.11).
    for item in value:
        if item.__class__ is not int or item < 0:
            break
    else:
        return
    for index, item in enumerate(value):
        if type(item) is not int and (
            isinstance(item, bool) or not hasattr(type(item), "__index__")
        ):
            raise InvalidArgumentError(
                f"{argument}[{index}]={_shown(item)} must be an int (a block id)"
            )
        if operator.index(item) < 0:
            _negative(argument, index, item)


def _negative(argument: str, index: int, item: Any) -> NoReturn:
    raise InvalidValueError(f"{argument}[{index}]={_shown(item)} must be >= 0 (a block id)")


def check_int(value: Any, argument: str, *, minimum: int = 0, maximum: int | None = None) -> int:
    if (
        isinstance(value, int)
        and not isinstance(value, bool)
        and value >= minimum
        and (maximum is None or value <= maximum)
    ):
        return int(value)
    upper = "" if maximum is None else f" and <= {maximum:,}"
    error = InvalidValueError if is_int(value) else InvalidArgumentError
    raise error(f"{argument}={_shown(value)} must be an int >= {minimum}{upper}")


def is_int(value: Any) -> bool:
    """An ``int`` that is not a ``bool``: an argument of the right type for a count."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_stripes(value: Any, argument: str = "stripes") -> int:
    """A power of two from 1 to :data:`MAX_STRIPES`."""
    stripes = check_int(value, argument, minimum=1, maximum=MAX_STRIPES)
    if stripes & (stripes - 1):
        raise InvalidValueError(f"{argument}={stripes!r} must be a power of two")
    return stripes


def check_connector(value: Any, argument: str = "connector") -> None:
    """Raise :class:`InvalidArgumentError` for a class given where an instance is expected."""
    if isinstance(value, type):
        raise InvalidArgumentError(
            f"{argument}={_shown(value)} is a class; register an instance of it"
        )


def bad_argument(right_type: bool) -> type[InvalidArgumentError]:
    """The error of a bad argument: :class:`InvalidValueError` when it has the right type (its
    value is out of range, empty or not a choice), :class:`InvalidArgumentError` otherwise."""
    return InvalidValueError if right_type else InvalidArgumentError


def check_choice(value: Any, argument: str, choices: Collection[str]) -> str:
    """``value`` if it is one of the ``str`` ``choices``; else a bad argument naming them."""
    if isinstance(value, str) and value in choices:
        return value
    raise bad_argument(isinstance(value, str))(
        f"{argument}={_shown(value)} must be one of {', '.join(choices)}"
    )


def check_bool(value: Any, argument: str) -> bool:
    if isinstance(value, bool):
        return value
    raise InvalidArgumentError(f"{argument}={_shown(value)} must be a bool")


def check_seconds(value: Any, argument: str, *, positive: bool = False) -> float:
    """A finite number of seconds, ``>= 0`` (``> 0`` when ``positive``), as a ``float``."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise InvalidArgumentError(f"{argument}={_shown(value)} must be a number of seconds")
    seconds = float(value)
    if not (seconds > 0 if positive else seconds >= 0) or seconds == float("inf"):
        bound = "> 0" if positive else ">= 0"
        raise InvalidValueError(f"{argument}={_shown(value)} must be finite and {bound}")
    return seconds

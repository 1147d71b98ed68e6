"""Small argument checks shared by the public calls. Messages read ``name=value!r must be ...``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NoReturn

from .errors import InvalidArgumentError, InvalidNameError


def _shown(value: Any) -> str:
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{text} (type {type(value).__name__})"


def check_name(value: Any, argument: str = "name") -> str:
    """``value`` if it is a non-empty ``str``; :class:`InvalidNameError` otherwise."""
    if type(value) is str and value:
        return value
    if isinstance(value, str) and value:
        return str(value)
    raise InvalidNameError(f"{argument}={_shown(value)} must be a non-empty str")


def bad_request_id(value: Any, argument: str = "request_id") -> NoReturn:
    raise InvalidArgumentError(f"{argument}={_shown(value)} must be a non-empty str")


def check_request_id(value: Any, argument: str = "request_id") -> str:
    if type(value) is str and value:
        return value
    if isinstance(value, str) and value:
        return str(value)
    bad_request_id(value, argument)


def bad_name(value: Any, argument: str = "name") -> NoReturn:
    """Raise for a connector name of the wrong type (an ``int`` index, say)."""
    check_name(value, argument)
    raise AssertionError("unreachable")  # pragma: no cover


def check_blocks(value: Any, argument: str = "blocks") -> Sequence[int]:
    """``value`` if it is a sequence (of block ids); :class:`InvalidArgumentError` otherwise."""
    if type(value) is list or type(value) is tuple:
        return value
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return value
    raise InvalidArgumentError(f"{argument}={_shown(value)} must be a sequence of block ids")


def check_int(value: Any, argument: str, *, minimum: int = 0) -> int:
    if type(value) is int and value >= minimum:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= minimum:
        return int(value)
    raise InvalidArgumentError(f"{argument}={_shown(value)} must be an int >= {minimum}")


def check_bool(value: Any, argument: str) -> bool:
    if isinstance(value, bool):
        return value
    raise InvalidArgumentError(f"{argument}={_shown(value)} must be a bool")


def shown(value: Any) -> str:
    return _shown(value)

"""The exceptions multiconnector raises.

Every error derives from :class:`MultiConnectorError`, and each also derives from the builtin a
caller would naturally catch, so ``except KeyError`` and ``except MultiConnectorError`` both work::

    Exception
    └── MultiConnectorError
        ├── InvalidNameError            (also TypeError)    a name that is not a non-empty str
        ├── InvalidArgumentError        (also TypeError)    any other argument of the wrong type
        │   └── InvalidParamsError                          params that are not a Mapping or None
        ├── UnknownConnectorError       (also KeyError)     no connector registered under a name
        ├── UnknownRequestError         (also KeyError)     no request held under an id
        ├── DuplicateConnectorError     (also ValueError)   a name registered twice
        ├── DuplicateRequestError       (also ValueError)   a request id begun while still held
        ├── KeyClashError               (also ValueError)   a params key from two connectors
        └── ConnectorFailures           (also ExceptionGroup) connectors raised during a fan-out

Events that arrive late, twice, for unknown requests or from unknown connectors are *not*
errors: they are ignored and reported as an :class:`~multiconnector.Outcome`. Errors are kept
for programming mistakes (a wrong argument type) and for failures the caller must see.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ConnectorFailures",
    "DuplicateConnectorError",
    "DuplicateRequestError",
    "InvalidAnswerError",
    "InvalidArgumentError",
    "InvalidNameError",
    "InvalidParamsError",
    "KeyClashError",
    "MultiConnectorError",
    "UnknownConnectorError",
    "UnknownRequestError",
]


class MultiConnectorError(Exception):
    """Root of every error raised by multiconnector.

    .. versionadded:: 0.1.0
    """


class InvalidNameError(MultiConnectorError, TypeError):
    """A connector name that is not a non-empty ``str``.

    It is a :class:`TypeError` even for ``""``: a name is an identifier, and an empty one is as
    unusable as an ``int`` would be.
    """


class InvalidArgumentError(MultiConnectorError, TypeError):
    """An argument of the wrong type (say an ``int`` index where a name is expected)."""


class InvalidAnswerError(InvalidArgumentError):
    """A connector's ``request_finished`` answered something that is not a
    ``(saves: bool, params: Mapping | None)`` pair: ``True``, ``None``, a 1- or 3-tuple, a list,
    a non-bool ``saves``, params that are not a Mapping.

    The aggregator awaits that connector anyway (it may have started a save: no block is freed
    early) and drops its params. ``connector`` is its name, ``answer`` what it answered.

    .. versionadded:: 0.1.0
    """

    def __init__(self, message: str, *, connector: str, answer: Any) -> None:
        super().__init__(message)
        self.connector = connector
        self.answer = answer


class InvalidParamsError(InvalidArgumentError):
    """Transfer params that are neither a Mapping nor ``None``, or that have a non-``str`` key."""


class _PlainKeyError(KeyError):
    # KeyError.__str__ shows the repr of its argument; our messages are sentences.
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownConnectorError(MultiConnectorError, _PlainKeyError):
    """No connector is registered under this name."""


class UnknownRequestError(MultiConnectorError, _PlainKeyError):
    """No request is held under this id."""


class DuplicateConnectorError(MultiConnectorError, ValueError):
    """A connector name is already registered (or given twice in one call)."""


class DuplicateRequestError(MultiConnectorError, ValueError):
    """A request id was begun while the aggregator still holds it.

    A request is held from :meth:`~multiconnector.MultiConnector.begin` until
    :meth:`~multiconnector.MultiConnector.take` hands it back; beginning it again in between
    would silently discard the first one's bookkeeping.
    """


class KeyClashError(MultiConnectorError, ValueError):
    """Two or more connectors supplied the same transfer-params key.

    ``clashes`` maps each clashing key to the names of the connectors that supplied it, in
    connector order. The message names all of them, in a deterministic order.

    .. versionadded:: 0.1.0
    """

    clashes: Mapping[str, tuple[str, ...]]

    def __init__(self, clashes: Mapping[str, tuple[str, ...]]) -> None:
        self.clashes = dict(clashes)
        parts = [f"{key!r} from {', '.join(names)}" for key, names in self.clashes.items()]
        noun = "key" if len(parts) == 1 else "keys"
        super().__init__(
            f"transfer params clash: {len(parts)} {noun} supplied by more than one connector: "
            + "; ".join(parts)
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.clashes,))


class ConnectorFailures(MultiConnectorError, ExceptionGroup):
    """One or more connectors raised while being called in a fan-out.

    Every connector was still called, and bookkeeping was brought to a consistent state, before
    this was raised. ``failed`` names the connectors in the order of ``exceptions``; ``result``
    holds what the call would have returned, when it had a result.

    .. versionadded:: 0.1.0
    """

    failed: tuple[str, ...]
    result: Any

    def __new__(
        cls,
        message: str,
        exceptions: Sequence[Exception],
        *,
        failed: Sequence[str] = (),
        result: Any = None,
    ) -> ConnectorFailures:
        self = super().__new__(cls, message, exceptions)
        self.failed = tuple(failed)
        self.result = result
        return self

    def __init__(
        self,
        message: str,
        exceptions: Sequence[Exception],
        *,
        failed: Sequence[str] = (),
        result: Any = None,
    ) -> None:
        super().__init__(message, exceptions)

    def derive(self, excs: Sequence[Exception]) -> ConnectorFailures:  # type: ignore[override]
        return ConnectorFailures(self.message, excs, failed=self.failed, result=self.result)

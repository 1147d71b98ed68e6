"""The exceptions multiconnector raises.

Every error derives from :class:`MultiConnectorError`, and each also derives from the builtin a
caller would naturally catch, so ``except KeyError`` and ``except MultiConnectorError`` both work.
A bad argument's error is a :class:`TypeError` when its type is wrong and also a
:class:`ValueError` when its type is right and its value is not (``stripes=-1``,
``begin("")``): ``except ValueError`` catches an out-of-range value, and
``except InvalidArgumentError`` (or ``TypeError``, as before) still catches every bad argument::

    Exception
    └── MultiConnectorError
        ├── InvalidNameError            (also TypeError)    a str that is not a connector name
        ├── InvalidArgumentError        (also TypeError)    any other argument of the wrong type
        │   ├── InvalidValueError       (also ValueError)   the right type, out of range
        │   ├── InvalidParamsError                          params that are not a Mapping or None
        │   └── InvalidAnswerError                          a connector's answer that is no pair
        ├── UnknownConnectorError       (also KeyError)     no connector registered under a name
        ├── UnknownRequestError         (also KeyError)     no request held under an id
        ├── UnknownPropertyError        (also KeyError)     no property of that name in a report
        ├── DuplicateConnectorError     (also ValueError)   a name registered twice
        ├── DuplicateRequestError       (also ValueError)   a request id begun while still held
        ├── KeyClashError               (also ValueError)   a params key from two connectors
        ├── RoleError                   (also ValueError)   an answer its connector's role forbids
        ├── InvalidMachineError         (also ValueError)   a state machine that fails validation
        ├── NondeterminismError         (also RuntimeError) a model check's replay that diverged
        ├── ShutDownError               (also RuntimeError) work asked of a shut-down aggregator
        ├── GraphvizMissingError        (also RuntimeError) SVG asked for, Graphviz's dot absent
        ├── InvalidJSONError            (also ValueError)   a JSON file an option names is not JSON
        ├── ConnectorFailures           (also ExceptionGroup) connectors raised during a fan-out
        │   (below: the vLLM adapter's, in multiconnector.vllm.errors)
        ├── ChildAnswerError            (also ValueError)   a child's start-up answer unusable
        ├── ChildClassError             (also ValueError)   a child connector's class not found
        ├── ChildStartError             (also RuntimeError) a child connector's constructor raised
        ├── ChildrenConflictError       (also ValueError)   children's answers that do not combine
        ├── HMAUnsupportedError         (also ValueError)   the HMA on, a child without support
        ├── LookupPatienceError         (also TimeoutError) a child looking up past its patience
        ├── MetadataMismatchError       (also ValueError)   metadata not naming exactly the children
        ├── SlowLookupError             (also TimeoutError) a child's lookup slower than its bound
        ├── UncomposedHookError         (also RuntimeError) a newer vLLM's hook ours cannot compose
        └── WrongRoleError              (also RuntimeError) a call the connector's role never gets

Every class above ``ChildAnswerError`` is defined here;
:class:`UnknownPropertyError` is also importable from :mod:`multiconnector.check`, with the
check's report. ``tests/test_errors.py`` holds this tree to the classes that exist.

Events that arrive late, twice, for unknown requests or from unknown connectors are *not*
errors: they are ignored and reported as an :class:`~multiconnector.Outcome`. Errors are kept
for programming mistakes (a wrong argument type) and for failures the caller must see.

An error raised *after* the bookkeeping was updated (a params clash, params that are not a
mapping, a connector's callback that raised) carries ``result``: what the call would have
returned, so the caller learns the outcome that was applied. An error raised before anything
changed has ``result`` ``None``. docs/bad-input.md lists every call's bad inputs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "ConnectorFailures",
    "DuplicateConnectorError",
    "DuplicateRequestError",
    "GraphvizMissingError",
    "InvalidAnswerError",
    "InvalidArgumentError",
    "InvalidJSONError",
    "InvalidMachineError",
    "InvalidNameError",
    "InvalidParamsError",
    "InvalidValueError",
    "KeyClashError",
    "MultiConnectorError",
    "NondeterminismError",
    "RoleError",
    "ShutDownError",
    "UnknownConnectorError",
    "UnknownPropertyError",
    "UnknownRequestError",
]


class MultiConnectorError(Exception):
    """Root of every error raised by multiconnector.

    .. versionadded:: 0.1.0
    """


class InvalidNameError(MultiConnectorError, TypeError):
    """A connector name that breaks the name rule: not a ``str``, empty, longer than 128
    characters, with whitespace or an unprintable character, or with ``,`` or ``=`` (the command
    line's separators).

    It is a :class:`TypeError` even for ``""``: a name is an identifier, and an unusable one is as
    unusable as an ``int`` would be.
    """


class InvalidArgumentError(MultiConnectorError, TypeError):
    """An argument of the wrong type (say an ``int`` index where a name is expected); the base
    of every bad argument's error but a name's."""


class InvalidValueError(InvalidArgumentError, ValueError):
    """An argument of the right type whose value is out of range: ``stripes=-1`` or ``3``,
    an empty request id, ``max_states=0``, a rate above 1.

    A :class:`ValueError`, and still an :class:`InvalidArgumentError` (so a ``TypeError``) for
    code that catches every bad argument.

    .. versionadded:: 0.1.0
    """


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
    """Transfer params that are neither a Mapping nor ``None``, or that have a non-``str`` key,
    or (with ``allow_equal``) a key supplied twice with values that cannot be compared.

    ``result`` is what :meth:`~multiconnector.MultiConnector.request_finished` applied (its
    ``(outcome, None)``) when it raised this after updating the request; ``None`` otherwise.
    """

    result: Any = None


class _PlainKeyError(KeyError):
    # KeyError.__str__ shows the repr of its argument; our messages are sentences.
    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownConnectorError(MultiConnectorError, _PlainKeyError):
    """No connector is registered under this name."""


class UnknownRequestError(MultiConnectorError, _PlainKeyError):
    """No request is held under this id."""


class UnknownPropertyError(MultiConnectorError, _PlainKeyError):
    """:meth:`~multiconnector.check.CheckReport.result` was asked for a property the report
    does not have.

    .. versionadded:: 0.1.0
    """


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

    ``result`` is what :meth:`~multiconnector.MultiConnector.request_finished` applied (its
    ``(outcome, None)``) when it raised this after updating the request; ``None`` otherwise.

    .. versionadded:: 0.1.0
    """

    clashes: Mapping[str, tuple[str, ...]]
    result: Any = None

    def __init__(self, clashes: Mapping[str, tuple[str, ...]]) -> None:
        self.clashes = dict(clashes)
        parts = [f"{key!r} from {', '.join(names)}" for key, names in self.clashes.items()]
        noun = "key" if len(parts) == 1 else "keys"
        super().__init__(
            f"transfer params clash: {len(parts)} {noun} supplied by more than one connector: "
            + "; ".join(parts)
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.clashes,), {"result": self.result})


class RoleError(MultiConnectorError, ValueError):
    """A connector answered what its registered role rules out: one registered with
    ``role=Role.load`` answered ``request_finished`` with anything but ``(False, params)``,
    promising (or maybe promising) an asynchronous save.

    A load-only connector is never a saver, so it is not awaited: it counts as not saving, as a
    connector that raised would, and its params are dropped. The other connectors are still
    asked and the request updated from their answers; this error is raised afterwards inside
    :class:`ConnectorFailures`, whose ``result`` is the outcome applied. ``connector`` is its
    name, ``answer`` what it answered.

    Not to be confused with the vLLM adapter's ``WrongRoleError``, which is about vLLM's
    scheduler and worker roles.

    .. versionadded:: 0.1.0
    """

    def __init__(self, message: str, *, connector: str, answer: Any) -> None:
        super().__init__(message)
        self.connector = connector
        self.answer = answer

    def __reduce__(self) -> tuple[Any, ...]:
        return (_role_error, (str(self), self.connector, self.answer))


def _role_error(message: str, connector: str, answer: Any) -> RoleError:
    return RoleError(message, connector=connector, answer=answer)


class ShutDownError(MultiConnectorError, RuntimeError):
    """The aggregator was shut down: it refuses new work, and nothing changes.

    After :meth:`~multiconnector.MultiConnector.shutdown`, every call that would begin or finish
    a request, look up or choose its loader, ask a connector, or register one raises this. The
    calls that drain what is held still work: reports (a connector's last saves and loads),
    cancelling, unregistering, taking and reading; a second ``shutdown()`` does nothing. The
    message says what to do (the order: :meth:`~multiconnector.MultiConnector.shutdown`).
    """


class GraphvizMissingError(MultiConnectorError, RuntimeError):
    """An SVG was asked for and Graphviz's ``dot`` program, which draws it, is not on ``PATH``.

    The other formats (``mermaid``, ``dot``, ``md``) are text and need nothing more. A
    :class:`RuntimeError`, as the ``graphviz`` package's own error for a missing ``dot`` is.

    .. versionadded:: 0.1.0
    """


class InvalidJSONError(MultiConnectorError, ValueError):
    """A JSON document an option names (``diagram --path``) is not JSON: not UTF-8, malformed,
    or nested too deeply to read. The message says which, and where.

    .. versionadded:: 0.1.0
    """


class InvalidMachineError(MultiConnectorError, ValueError):
    """A state machine that cannot be built, or that fails a check: every problem, listed.

    ``problems`` holds one line per problem; ``report`` is the
    :class:`~multiconnector.check.CheckReport` the problems came from (``None`` when the
    declaration could not even be built).

    .. versionadded:: 0.1.0
    """

    problems: tuple[str, ...]
    report: Any

    def __init__(self, problems: Sequence[str], report: Any = None) -> None:
        self.problems = tuple(problems)
        self.report = report
        noun = "problem" if len(self.problems) == 1 else "problems"
        super().__init__(
            f"{len(self.problems)} {noun} in the machine:"
            + "".join(f"\n  - {p}" for p in self.problems)
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.problems, self.report))


class NondeterminismError(MultiConnectorError, RuntimeError):
    """Replaying a path did not lead to the same snapshot: the model is not deterministic.

    Raised by the model checks (:func:`multiconnector.check.check_aggregator`, a user machine's
    check) when a model behaves differently on the same events.

    .. versionadded:: 0.1.0
    """


class ConnectorFailures(MultiConnectorError, ExceptionGroup):
    """One or more connectors raised while being called in a fan-out.

    Every connector was still called, and bookkeeping was brought to a consistent state, before
    this was raised. ``failed`` names the connectors in the order of ``exceptions``; ``result``
    holds what the call would have returned, when it had a result. The message names every
    connector of ``failed`` (a message that does not is completed: ``(connectors: a, b)``).

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
        self = super().__new__(cls, _naming(message, failed), exceptions)
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
        super().__init__(_naming(message, failed), exceptions)

    def derive(self, excs: Sequence[Exception]) -> ConnectorFailures:  # type: ignore[override]
        """The group :meth:`split` and :meth:`subgroup` build from part of ``exceptions``:
        ``failed`` names only the connectors whose exceptions it keeps."""
        # split() hands over the exceptions kept, each the original or, for a nested group
        # partly kept, a new group of some of its leaves: owned by the original holding them.
        named = list(zip(self.exceptions, self.failed, strict=False))  # a clash has no name
        failed = []
        for exc in excs:
            for original, name in named:
                if exc is original or (
                    isinstance(exc, BaseExceptionGroup)
                    and isinstance(original, BaseExceptionGroup)
                    and any(leaf is _first_leaf(exc) for leaf in _leaves(original))
                ):
                    failed.append(name)
                    break
        return ConnectorFailures(self.message, excs, failed=failed, result=self.result)


#: How :func:`_naming` completes a message.
_COMPLETED = re.compile(r" \(connectors?: ([^()]*)\)$")


def _naming(message: str, failed: Sequence[str]) -> str:
    """``message``, completed with the names of ``failed`` unless it names them already: ending
    in their list (``...: a, b``) or naming each as ``connector 'a'``."""
    names = [str(name) for name in dict.fromkeys(failed)]
    listed = (": " + ", ".join(names), ": " + ", ".join(map(str, failed)))
    if not names or message.endswith(listed):
        return message
    if all(f"connector {name!r}" in message for name in names):
        return message
    completed = _COMPLETED.search(message)  # a part of a group completed before (derive)
    if completed is not None and set(names) <= set(completed.group(1).split(", ")):
        return message
    noun = "connector" if len(names) == 1 else "connectors"
    return f"{message} ({noun}: {', '.join(names)})"


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions in ``exc``, its nested groups opened (``exc`` alone if not a group)."""
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]


def _first_leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc

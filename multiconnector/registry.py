"""Connectors addressed by name.

vLLM's ``MultiConnector`` keeps its connectors in a list and refers to them by position, so a
completion for index 3 of a two-element list, or for a slot that holds ``None`` because that
connector failed to start, crashes the server. Here every connector has a unique name, and a name
may be registered with ``None``: known, but not ready. Nothing is ever looked up by position.

Each registration has a :class:`Role`: a connector that only saves is never asked to load, and
one that only loads is never awaited for a save.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import inspect
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, final, runtime_checkable

import attrs

from ._validate import check_connector, check_name, shown
from .errors import (
    ConnectorFailures,
    DuplicateConnectorError,
    InvalidArgumentError,
    InvalidValueError,
    UnknownConnectorError,
)
from .rule import finish_answer

__all__ = ["Connector", "ConnectorRegistry", "Role"]


class Role(enum.StrEnum):
    """What a registered connector does for a request: save its KV, load it, or both.

    The aggregator holds a connector to its role instead of trusting each answer: a ``save``
    connector is never asked ``get_num_new_matched_tokens`` (so it is never chosen to load, and
    its ``on_load_finished`` is never called), and a ``load`` connector is never awaited for a
    save (its ``on_finished`` is never called; a ``request_finished`` answer promising a save is
    a :class:`~multiconnector.RoleError`). A store that cannot serve a hit, or a loader that
    cannot take a save, then cannot make a request wait on it by mistake.

    >>> Role("save") is Role.save
    True

    .. versionadded:: 0.1.0
    """

    save = "save"
    """Only saves: never asked for matched tokens, never a loader."""
    load = "load"
    """Only loads: never a saver, never awaited by a finishing request."""
    both = "both"
    """Saves and loads, as its answers say: the default."""


@runtime_checkable
class Connector(Protocol):
    """What the aggregator needs of a connector. Only :meth:`request_finished` is required.

    Optional methods, used when present (looked up once, at registration):

    * ``get_num_new_matched_tokens(request_id, num_computed_tokens) -> int | None``: how many
      tokens this connector can load for the request (``None``: not known yet);
    * ``on_finished(request_id, blocks) -> None``: called once its transfer report was applied;
    * ``on_load_finished(request_id) -> None``: called once its load report was applied;
    * ``get_stats() -> Any``: anything; reported under the connector's registration name;
    * ``shutdown() -> None``: called by :meth:`MultiConnector.shutdown`.

    A connector may report (``transfer_finished``, ``load_finished``) from any thread at any
    time, even from inside its own ``request_finished`` or ``get_num_new_matched_tokens``, or
    from a thread it starts there, before the aggregator recorded its answer: such a report is
    :attr:`~multiconnector.Outcome.early`, kept and decided once the answer is recorded.
    Connectors are never called under an aggregator lock, so they may call back into it.

    .. versionadded:: 0.1.0
    """

    def request_finished(
        self, request_id: str, blocks: Sequence[int]
    ) -> tuple[bool, Mapping[str, Any] | None]:
        """Whether this connector saves the request's KV asynchronously, and its params.

        Returning ``True`` is a promise: the connector will report
        :meth:`MultiConnector.transfer_finished` for this request, under its name, after this
        call has returned. Until then the request's blocks are not released.
        """
        ...


_Optional = Callable[..., Any] | None
#: The methods a connector may leave out (see :class:`Connector`); one it has must be callable.
_OPTIONAL_METHODS = (
    "get_num_new_matched_tokens",
    "on_finished",
    "on_load_finished",
    "get_stats",
    "shutdown",
)


def _check_optional(connector: Any) -> None:
    """Refuse ``connector`` when it has one of :data:`_OPTIONAL_METHODS` that is not callable
    (``on_finished = 5``, say): it would be skipped without a word where it should be called.
    ``None`` counts as leaving it out."""
    for attr in _OPTIONAL_METHODS:
        found = getattr(connector, attr, None)
        if found is not None and not callable(found):
            raise InvalidArgumentError(
                f"connector.{attr}={shown(found)} must be callable (or absent): "
                f"connector={shown(connector)}"
            )


_ROLE_VALUES = frozenset(role.value for role in Role)


def check_role(value: Any, argument: str = "role") -> Role:
    """``value`` if it is a :class:`Role`; :class:`InvalidArgumentError` if not (a ``str`` too:
    ``Role("save")`` spells it)."""
    if value.__class__ is Role:
        return value
    hint = f" (Role({value!r}))" if isinstance(value, str) and value in _ROLE_VALUES else ""
    raise InvalidArgumentError(
        f"{argument}={shown(value)} must be a multiconnector.Role: Role.save, Role.load or "
        f"Role.both{hint}"
    )


def _never_saves(name: str, request_finished: Callable[..., Any]) -> Callable[..., Any]:
    """``request_finished`` of the load-only connector ``name``: its answer when it is
    ``(False, params)``, else the :class:`RoleError` of :func:`~multiconnector.rule.finish_answer`,
    so that it counts as not saving, as a connector that raised does (it is never awaited, its
    params are dropped)."""

    def load_only_request_finished(request_id: str, blocks: Sequence[int]) -> Any:
        answer = request_finished(request_id, blocks)
        error = finish_answer(name, answer, load_only=True)[2]
        if error is not None:
            raise error
        return answer

    return load_only_request_finished


@final
@attrs.frozen(slots=True, eq=False, weakref_slot=False)
class Entry:
    """One registration: a name, the connector (``None``: not ready), its resolved methods, its
    role.

    The methods are those the role allows: a ``save`` connector's load methods are ``None`` (it
    is never asked to load) and so is a ``load`` connector's ``on_finished``, whose
    ``request_finished`` is wrapped to refuse a promised save (see :class:`Role`). The
    aggregator reads these, never the connector, so the role is decided here alone.

    A new object for every registration, so that ``entry is registry.entry(name)`` tells whether
    a name still refers to the same registration (unregistering and registering a name again
    gives a new one).
    """

    name: str
    connector: Connector | None
    request_finished: _Optional = None
    get_num_new_matched_tokens: _Optional = None
    on_finished: _Optional = None
    on_load_finished: _Optional = None
    role: Role = Role.both

    @classmethod
    def of(cls, name: str, connector: Connector | None, role: Role = Role.both) -> Entry:
        if connector is None:
            return cls(name, None, role=role)

        def method(attr: str) -> _Optional:
            found = getattr(connector, attr, None)
            return found if callable(found) else None

        request_finished = method("request_finished")
        loads = role is not Role.save
        saves = role is not Role.load
        if not saves and request_finished is not None:
            request_finished = _never_saves(name, request_finished)
        return cls(
            name,
            connector,
            request_finished,
            method("get_num_new_matched_tokens") if loads else None,
            method("on_finished") if saves else None,
            method("on_load_finished") if loads else None,
            role,
        )


Listener = Callable[[Entry], None]


def _same(listener: Listener) -> Listener:
    return listener


@final
class ConnectorRegistry:
    """Connectors under unique, non-empty string names, in registration order.

    A name may map to ``None``: a connector that is known but not ready (it failed to start, say).
    Such a name is never asked anything, never awaited, and reports under it are ignored.

    Registering and unregistering are thread-safe and may happen while requests are in flight.
    Readers never lock: every change publishes a new immutable snapshot.

    Several workers or ranks of one connector are simply several names (``"pd@0"``, ``"pd@1"``):
    each is awaited and reports on its own.

    ``roles`` gives some names a :class:`Role` other than :attr:`Role.both`.

    >>> registry = ConnectorRegistry({"cache": None, "disk": None}, roles={"disk": Role.save})
    >>> registry.names()
    ('cache', 'disk')
    >>> registry.role("disk"), registry.role("cache")
    (<Role.save: 'save'>, <Role.both: 'both'>)

    .. versionadded:: 0.1.0
    """

    __slots__ = ("__weakref__", "_entries", "_listeners", "_lock", "_ready")

    def __init__(
        self,
        connectors: Mapping[str, Connector | None] | Iterable[tuple[str, Connector | None]] = (),
        *,
        roles: Mapping[str, Role] | None = None,
    ) -> None:
        self._lock = threading.RLock()
        self._entries: dict[str, Entry] = {}
        self._ready: tuple[Entry, ...] = ()
        self._listeners: tuple[Callable[[], Listener | None], ...] = ()
        if isinstance(connectors, Mapping):
            items: list[Any] = list(connectors.items())
        elif isinstance(connectors, Iterable) and not isinstance(connectors, str | bytes):
            items = list(connectors)
        else:
            raise InvalidArgumentError(
                f"connectors={shown(connectors)} must be a Mapping or an iterable of "
                "(name, connector) pairs"
            )
        for index, item in enumerate(items):
            if not isinstance(item, tuple) or len(item) != 2:
                raise InvalidArgumentError(
                    f"connectors[{index}]={shown(item)} must be a (name, connector) pair"
                )
        given = self._check_roles(roles, [name for name, _ in items])
        for name, connector in items:
            self.register(name, connector, given.get(name, Role.both))

    @staticmethod
    def _check_roles(roles: Any, names: list[Any]) -> Mapping[Any, Role]:
        """``roles`` checked against the connectors' ``names``, before anything is registered."""
        if roles is None:
            return {}
        if not isinstance(roles, Mapping):
            raise InvalidArgumentError(
                f"roles={shown(roles)} must be a Mapping of connector names to Role, or None"
            )
        known = set()
        for name in names:
            with contextlib.suppress(TypeError):  # an unhashable name: register() refuses it
                known.add(name)
        for name, role in roles.items():
            if name not in known:
                raise InvalidValueError(
                    f"roles={shown(roles)} names {shown(name)}, which is not among the "
                    "connectors' names"
                )
            check_role(role, f"roles[{name!r}]")
        return roles

    # -- changes -------------------------------------------------------------------------------

    def register(self, name: str, connector: Connector | None, role: Role = Role.both) -> None:
        """Register ``connector`` under ``name`` with ``role``; ``None`` registers it as not
        ready.

        Raises :class:`InvalidNameError` for a name that breaks the name rule (a printable
        ``str`` of 1 to 128 characters, no whitespace, no ``,`` or ``=``),
        :class:`DuplicateConnectorError` if the name is taken, and
        :class:`~multiconnector.errors.InvalidArgumentError` for a class instead of an instance,
        an object with no callable ``request_finished``, one whose optional method (``on_finished``,
        say) is there but not callable, or a ``role`` that is not a :class:`Role`. Nothing
        changes when it raises.
        """
        name = check_name(name)
        check_connector(connector)
        if role.__class__ is not Role:
            check_role(role)
        entry = Entry.of(name, connector, role)
        if connector is not None and entry.request_finished is None:
            raise InvalidArgumentError(
                f"connector={shown(connector)} must have a callable request_finished"
            )
        if connector is not None:
            _check_optional(connector)
        with self._lock:
            if name in self._entries:
                raise DuplicateConnectorError(f"name={name!r} is already registered")
            entries = dict(self._entries)
            entries[name] = entry
            self._publish(entries)

    def unregister(self, name: str) -> Connector | None:
        """Remove ``name`` and return its connector (``None`` if it was not ready).

        Requests awaiting this name stop awaiting it (see :meth:`MultiConnector.unregister
        <multiconnector.MultiConnector.unregister>` for the rule); its later reports are ignored.
        Raises :class:`UnknownConnectorError` if ``name`` is not registered. When a listener
        raises, :class:`ConnectorFailures` is raised after every listener ran, with the
        unregistered connector as its ``result``.
        """
        name = check_name(name)
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                raise UnknownConnectorError(f"name={name!r} is not registered")
            entries = dict(self._entries)
            del entries[name]
            self._publish(entries)
            errors: list[Exception] = []
            for ref in self._listeners:
                listener = ref()
                if listener is None:
                    continue
                try:
                    listener(entry)
                except Exception as exc:  # every listener is told, whatever the others do
                    errors.append(exc)
            self._listeners = tuple(ref for ref in self._listeners if ref() is not None)
        if errors:
            raise ConnectorFailures(
                f"{len(errors)} listener(s) failed after unregistering {name!r}",
                errors,
                result=entry.connector,
            )
        return entry.connector

    def _publish(self, entries: dict[str, Entry]) -> None:
        self._entries = entries
        self._ready = tuple(e for e in entries.values() if e.connector is not None)

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(entry)`` after each unregistration, under the registry's lock.

        The aggregator uses this so that a connector unregistered directly on the registry still
        releases the requests awaiting it. A bound method is held weakly: subscribing does not
        keep its object alive, and a collected one is dropped. Every listener is called even when
        one raises; the failures are raised together afterwards.
        """
        if not callable(listener):
            raise InvalidArgumentError(f"listener={shown(listener)} must be callable")
        ref: Callable[[], Listener | None]
        if inspect.ismethod(listener):
            ref = weakref.WeakMethod(listener)
        else:
            ref = functools.partial(_same, listener)
        with self._lock:
            self._listeners = (*self._listeners, ref)

    def _copy(self, listener: Listener) -> ConnectorRegistry | None:
        """A registry with this one's registrations and ``listener`` as its only listener, for
        the model checker's copies of a world (:mod:`multiconnector.check.fork`); ``None`` when
        this one has another listener than its aggregator's. The published entries are shared:
        every change replaces them, none changes them."""
        if len(self._listeners) != 1:
            return None
        new = object.__new__(ConnectorRegistry)
        new._lock = threading.RLock()
        new._entries, new._ready = self._entries, self._ready
        # What subscribe() stores for a bound method, without its checks and lock round.
        new._listeners = (weakref.WeakMethod(listener),)
        return new

    # -- reading -------------------------------------------------------------------------------

    @property
    def entries(self) -> Mapping[str, Entry]:
        """Every registration by name, in registration order: a snapshot, read without a lock.

        Every change publishes a new mapping and none changes a published one, so a snapshot
        read once stays what it was, and ``registry.entries is snapshot`` says whether the
        registry changed since.
        """
        return self._entries

    def entry(self, name: str) -> Entry | None:
        """The current registration of ``name``, or ``None``. Never raises."""
        return self._entries.get(name)

    def role(self, name: str) -> Role:
        """The :class:`Role` ``name`` was registered with; :class:`UnknownConnectorError` if it
        is not registered."""
        name = check_name(name)
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownConnectorError(f"name={name!r} is not registered")
        return entry.role

    def ready_entries(self) -> tuple[Entry, ...]:
        """Registrations whose connector is not ``None``, in registration order."""
        return self._ready

    def names(self) -> tuple[str, ...]:
        """Every registered name, ready or not, in registration order."""
        return tuple(self._entries)

    def ready(self) -> tuple[str, ...]:
        """Names whose connector is not ``None``, in registration order."""
        return tuple(e.name for e in self._ready)

    def get(self, name: str, default: Connector | None = None) -> Connector | None:
        entry = self._entries.get(name)
        return default if entry is None else entry.connector

    def __getitem__(self, name: str) -> Connector | None:
        name = check_name(name)
        entry = self._entries.get(name)
        if entry is None:
            raise UnknownConnectorError(f"name={name!r} is not registered")
        return entry.connector

    def __contains__(self, name: object) -> bool:
        """Whether ``name`` is registered; ``False`` for anything that is not a ``str``."""
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def items(self) -> tuple[tuple[str, Connector | None], ...]:
        return tuple((e.name, e.connector) for e in self._entries.values())

    def __repr__(self) -> str:
        inner = ", ".join(
            f"{e.name!r}: {'None' if e.connector is None else type(e.connector).__name__}"
            for e in self._entries.values()
        )
        return f"ConnectorRegistry({{{inner}}})"

"""The adapter's own errors (the core's are in :mod:`multiconnector.errors`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import MultiConnectorError

__all__ = [
    "ChildAnswerError",
    "ChildClassError",
    "ChildStartError",
    "ChildrenConflictError",
    "HMAUnsupportedError",
    "LookupPatienceError",
    "MetadataMismatchError",
    "SlowLookupError",
    "UncomposedHookError",
    "WrongRoleError",
]


class ChildClassError(MultiConnectorError, ValueError):
    """A child connector's class cannot be found: vLLM's factory does not know its
    ``kv_connector``, or its ``kv_connector_module_path`` does not import or lacks it.

    vLLM's own message (``Unsupported connector type ...``) names the class, not which child of
    the configuration asked for it: this names the child too. ``name`` is the child's name; the
    factory's exception is the ``__cause__``. A ``ValueError``, as vLLM's is.

    .. versionadded:: 0.1.0
    """

    def __init__(self, name: str, kv_connector: str, module_path: str | None, cause: Exception):
        self.name = name
        self.kv_connector = kv_connector
        self.module_path = module_path
        where = f", kv_connector_module_path={module_path!r}" if module_path else ""
        super().__init__(
            f"child connector {name!r} (kv_connector={kv_connector!r}{where}) cannot be "
            f"loaded: {type(cause).__name__}: {cause}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.kv_connector, self.module_path, self.__cause__))


class ChildAnswerError(MultiConnectorError, ValueError):
    """A child's answer to a question vLLM asks before it starts, which the composition cannot
    answer safely without: the child raised, or answered what is not of the question's kind.

    ``kv_cache_access`` decides how vLLM allocates the KV cache every child reads: an answer
    guessed for a child could drop the access it needs (a NIXL child that cannot register the
    cache) or ask for two that exclude each other, so the server does not start, and this names
    the child and the question. ``name`` is the child's name, ``hook`` the question; the child's
    own exception, if it raised, is the ``__cause__``. A ``ValueError``, as vLLM's config
    errors are.

    .. versionadded:: 0.1.0
    """

    def __init__(self, name: str, hook: str, problem: str) -> None:
        self.name = name
        self.hook = hook
        self.problem = problem
        super().__init__(f"child connector {name!r}: {hook}: {problem}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.name, self.hook, self.problem))


class ChildStartError(MultiConnectorError, RuntimeError):
    """A child connector's constructor raised.

    The children built before it were shut down first (a half-built set would leak their
    threads, sockets and pinned memory). ``name`` is the child that failed, ``started`` the
    names shut down, ``shutdown_failures`` the exceptions their shutdowns raised, by name. The
    constructor's exception is the ``__cause__``.

    .. versionadded:: 0.1.0
    """

    def __init__(
        self,
        name: str,
        kv_connector: str,
        started: Sequence[str] = (),
        shutdown_failures: Mapping[str, BaseException] | None = None,
    ) -> None:
        self.name = name
        self.kv_connector = kv_connector
        self.started = tuple(started)
        self.shutdown_failures = dict(shutdown_failures or {})
        message = f"child connector {name!r} (kv_connector={kv_connector!r}) failed to start"
        if self.started:
            message += f"; the {len(self.started)} started before it were shut down: " + ", ".join(
                map(repr, self.started)
            )
        if self.shutdown_failures:
            message += "; shutting down " + ", ".join(
                f"{n!r} raised {e!r}" for n, e in self.shutdown_failures.items()
            )
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            type(self),
            (self.name, self.kv_connector, self.started, self.shutdown_failures),
        )


class LookupPatienceError(MultiConnectorError, TimeoutError):
    """Under the ``longest`` lookup policy, a child answered a request's lookup ``None`` ("ask
    me again") more times in a row than ``lookup_patience_steps``: that child's failure, counted
    under ``get_num_new_matched_tokens`` in ``child_failures()`` and logged once per request;
    the lookup goes on without it.

    .. versionadded:: 0.1.0
    """


class SlowLookupError(MultiConnectorError, TimeoutError):
    """A child answered a lookup (``get_num_new_matched_tokens``) slower than the health
    machine's ``slow_lookup_seconds``: its answer is taken (Python cannot interrupt a call),
    and the delay is that child's failure, counted under ``get_num_new_matched_tokens`` in
    ``child_failures()``, logged, and fed to its health machine.

    .. versionadded:: 0.1.0
    """


class MetadataMismatchError(MultiConnectorError, ValueError):
    """Connector metadata does not name exactly this connector's children.

    The scheduler and the workers were configured with different children. vLLM's
    ``MultiConnector`` pairs children and metadata by position with ``zip``, which silently drops
    the surplus; here a mismatch is an error that names the missing and unexpected children.

    .. versionadded:: 0.1.0
    """


class HMAUnsupportedError(MultiConnectorError, ValueError):
    """The hybrid memory allocator (HMA) is enabled, but a child does not support it.

    vLLM's own ``MultiConnector`` asserts the same condition (``all_children_support_hma``);
    here the error names the children without ``SupportsHMA``. Either disable HMA
    (``--disable-hybrid-kv-cache-manager``) or configure only children that support it.

    .. versionadded:: 0.1.0
    """


class ChildrenConflictError(MultiConnectorError, ValueError):
    """The children's answers to a question with one answer cannot be combined.

    Two children that require different KV cache layouts (as vLLM resolves them: ``"HND"`` and
    ``"LBHNC"`` are one layout), two that each provide a KV cache memory pool, or two that
    answer one transfer-results field a later vLLM added with values that do not merge. The
    message names the children per answer. A ``ValueError``, as vLLM's own class raises for the
    first two.

    .. versionadded:: 0.1.0
    """


class UncomposedHookError(MultiConnectorError, RuntimeError):
    """vLLM's connector base class has a public hook ours neither composes nor lists as safe to
    inherit (a vLLM newer than the tested range), and vLLM's own ``MultiConnector``'s
    composition of it, which ours would use, reads books of vLLM's class that ours does not keep.

    Raised at construction, naming the hook and what it reads, rather than when vLLM first calls
    it mid-serving: docs/vllm.md, "Hooks of a newer vLLM". ``hooks`` maps each such hook to the
    attributes it reads.

    .. versionadded:: 0.1.0
    """

    def __init__(self, version: str, tested: str, hooks: Mapping[str, Sequence[str]]) -> None:
        self.version = version
        self.tested = tested
        self.hooks = {hook: tuple(names) for hook, names in hooks.items()}
        listed = "; ".join(f"{hook} (reads {', '.join(names)})" for hook, names in hooks.items())
        super().__init__(
            f"vLLM {version} (tested: {tested}) has connector hooks this MultiConnector does "
            f"not compose, whose composition in vLLM's own MultiConnector reads books ours does "
            f"not keep: {listed}; use a multiconnector release that supports vLLM {version}, or "
            "vLLM's own MultiConnector (remove kv_connector_module_path)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.version, self.tested, self.hooks))


class WrongRoleError(MultiConnectorError, RuntimeError):
    """A call that the connector's role never receives (a worker asked who saves a request).

    .. versionadded:: 0.1.0
    """

"""Which children a hook vLLM calls every step or every layer calls: :class:`Fanout`.

vLLM calls ``save_kv_layer`` and ``wait_for_layer_load`` once per attention layer of every step,
and ``get_finished``, ``take_events``, the stats and a few more once per step; its
``MultiConnector`` calls every child each time. Most children leave some of these hooks as the
base class's no-op (a P/D transport does not wait per layer; a cache that saves in
``wait_for_save`` does not save per layer): calling them does nothing but cost the call.

A :class:`Fanout` is built with the children and lists, per hook, the children to call: every
child whose class overrides the hook with something that does more than answer what the hook's
caller does not use (``None`` from a hook whose answer is dropped or left out, ``()`` from
``take_events``, ``(None, None)`` from ``get_finished``). What a function does is read from its
code, once: ``def f(...): pass`` and ``return None`` are no-ops, anything else is not (a
generator, a decorated or built-in callable, an attribute set on the child itself, a class that
answers through ``__getattr__`` or reads every attribute through its own ``__getattribute__``,
as vLLM's own test wrappers do: all called). docs/vllm.md, "Which children a hook calls".

The lists are fixed when the children are (construction, or ``_connectors`` assigned): a method
put on a child object afterwards, for a hook its class leaves a no-op, is not called.
"""

from __future__ import annotations

import dis
import inspect
import types
from collections.abc import Mapping, Sequence
from typing import Any, Final

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from ..registry import Role

__all__ = ["HOOKS", "Fanout", "calls", "does_nothing"]

#: The hooks a :class:`Fanout` lists children for, with the answers that mean "nothing" for
#: each: an answer the adapter drops (or never reads) and which costs nothing to go without.
HOOKS: Final[dict[str, tuple[Any, ...]]] = {
    "start_load_kv": (None,),
    "wait_for_layer_load": (None,),
    "save_kv_layer": (None,),
    "wait_for_save": (None,),
    "finish_forward": (None,),
    "get_finished": ((None, None),),
    "get_transfer_results": (),  # the base class's asks get_finished: see calls()
    "get_block_ids_with_load_errors": (),  # the base class's answers a new empty set
    "build_connector_worker_meta": (None,),
    "get_kv_connector_stats": (None,),
    "get_kv_connector_kv_cache_events": (None,),
    "update_connector_output": (None,),
    "handle_preemptions": (None,),
    "on_new_request": (None,),
    "take_events": ((),),
}

_BOTH: Final = Role.both
#: The hooks a child of a role is not called for: a save-only child never loads, so it does not
#: wait per layer for a load; a load-only child never saves, so it saves no layer and awaits no
#: save. (``start_load_kv`` stays for every role: a P/D sender starts its side of a transfer
#: there.)
_NOT_FOR: Final[dict[Role, frozenset[str]]] = {
    Role.save: frozenset({"wait_for_layer_load"}),
    Role.load: frozenset({"save_kv_layer", "wait_for_save"}),
}

#: Instructions that do nothing at run time (the interpreter's bookkeeping).
_QUIET: Final = frozenset({"RESUME", "NOP", "CACHE", "EXTENDED_ARG"})
#: Code flags of functions whose call does not run their body.
_DEFERRED: Final = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_NOT_CONSTANT: Final = object()
_PLAIN_LOOKUP: Final = object.__dict__["__getattribute__"]


def answered_constant(function: Any) -> Any:
    """The constant ``function`` returns when that is all it does (its body ``pass``, a
    docstring, or ``return <constant>``); otherwise a sentinel no answer equals."""
    if not isinstance(function, types.FunctionType):
        return _NOT_CONSTANT
    code = function.__code__
    if code.co_flags & _DEFERRED:
        return _NOT_CONSTANT
    ops = [(op.opname, op.argval) for op in dis.get_instructions(code) if op.opname not in _QUIET]
    if len(ops) == 1 and ops[0][0] == "RETURN_CONST":  # Python 3.12 and later
        return ops[0][1]
    if len(ops) == 2 and ops[0][0] == "LOAD_CONST" and ops[1][0] == "RETURN_VALUE":
        return ops[0][1]
    return _NOT_CONSTANT


def does_nothing(function: Any, hook: str) -> bool:
    """Whether calling ``function`` for ``hook`` only answers one of the hook's "nothing"
    answers (:data:`HOOKS`)."""
    answer = answered_constant(function)
    return answer is not _NOT_CONSTANT and any(
        answer == nothing and type(answer) is type(nothing) for nothing in HOOKS[hook]
    )


def calls(child: Any, hook: str) -> bool:
    """Whether ``hook`` must be called on ``child``: not when its class's method (the base
    class's default included) is known to do nothing."""
    if hook in getattr(child, "__dict__", ()):
        return True
    if inspect.getattr_static(type(child), "__getattribute__") is not _PLAIN_LOOKUP:
        return True  # every attribute read goes through the class's own code (a wrapper)
    function = inspect.getattr_static(type(child), hook, None)
    if not isinstance(function, types.FunctionType):
        return True  # a mock, a proxy, a built-in, a descriptor: asked
    base = KVConnectorBase_V1.__dict__.get(hook)
    if function is base and hook == "get_transfer_results":
        return calls(child, "get_finished")
    if function is base and hook == "get_block_ids_with_load_errors":
        return False
    return not does_nothing(function, hook)


class Fanout:
    """Per hook of :data:`HOOKS`, the ``(name, child)`` pairs to call, in configuration order."""

    __slots__ = tuple(HOOKS)

    start_load_kv: tuple[tuple[str, Any], ...]
    wait_for_layer_load: tuple[tuple[str, Any], ...]
    save_kv_layer: tuple[tuple[str, Any], ...]
    wait_for_save: tuple[tuple[str, Any], ...]
    finish_forward: tuple[tuple[str, Any], ...]
    get_finished: tuple[tuple[str, Any], ...]
    get_transfer_results: tuple[tuple[str, Any], ...]
    get_block_ids_with_load_errors: tuple[tuple[str, Any], ...]
    build_connector_worker_meta: tuple[tuple[str, Any], ...]
    get_kv_connector_stats: tuple[tuple[str, Any], ...]
    get_kv_connector_kv_cache_events: tuple[tuple[str, Any], ...]
    update_connector_output: tuple[tuple[str, Any], ...]
    handle_preemptions: tuple[tuple[str, Any], ...]
    on_new_request: tuple[tuple[str, Any], ...]
    take_events: tuple[tuple[str, Any], ...]

    def __init__(
        self, items: Sequence[tuple[str, Any]], roles: Mapping[str, Role] | None = None
    ) -> None:
        roles = roles or {}
        for hook in HOOKS:
            setattr(
                self,
                hook,
                tuple(
                    (name, c)
                    for name, c in items
                    if calls(c, hook) and hook not in _NOT_FOR.get(roles.get(name, _BOTH), ())
                ),
            )

    def of(self, hook: str) -> tuple[str, ...]:
        """The names of the children ``hook`` calls."""
        pairs: tuple[tuple[str, Any], ...] = getattr(self, hook)
        return tuple(name for name, _ in pairs)

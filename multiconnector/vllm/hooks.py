"""Every public hook of vLLM's connector base class, decided in one place, and the rule for a hook
a newer vLLM adds that nobody decided on.

vLLM adds hooks to ``KVConnectorBase_V1`` in most releases (0.33 three, 0.34 three), and its own
``MultiConnector`` composes each over its children. A class that composes them method by method,
as ours does, would answer a new hook with the base class's default, silently: 0.34's
``kv_cache_access`` default (``IN_PROCESS``) would drop a NIXL child's ``REGISTERS``, and vLLM
would lay the KV cache out so that NIXL cannot register it. So:

* :data:`COMPOSED` (how ours composes each) and :data:`INHERITED` (why the base's is right for
  ours) list every public hook of the tested vLLMs; ``tests/adapter/test_vllm_dropin.py`` fails
  naming any public hook of the installed base class that is in neither (:func:`undecided`).
* A hook in neither (a vLLM newer than :data:`TESTED`) gets, when our class is defined, vLLM's
  own ``MultiConnector``'s composition of it, which runs over ``_connectors`` (our children in
  configuration order); where vLLM's class has none, the base's default stays, as vLLM's class
  has it (:func:`adopt`). Either way ours answers as the configuration without our line did.
* When a connector is built, one WARNING names the installed vLLM, the tested range and every
  such hook, and how each is answered (also for a vLLM outside the range without one); if
  vLLM's composition of one reads what ours does not have (vLLM's class's private books), the
  connector refuses to start, naming the hook, rather than crash when vLLM first calls it
  (:func:`check_adopted`, :class:`~multiconnector.vllm.errors.UncomposedHookError`).
"""

from __future__ import annotations

import dis
import inspect
import logging
import re
from collections.abc import Iterable, Mapping
from types import CodeType
from typing import Any, Final

from .errors import UncomposedHookError

__all__ = [
    "ADOPTED_ATTR",
    "BASES",
    "COMPOSED",
    "INHERITED",
    "TESTED",
    "THEIRS",
    "adopt",
    "check_adopted",
    "in_tested_range",
    "public",
    "reads",
    "tested_range",
    "undecided",
]

logger: Final = logging.getLogger("multiconnector")

#: The oldest and the newest vLLM (major, minor) this adapter is tested with.
TESTED: Final = ((0, 32), (0, 34))

#: How ours answers a hook it adopted: vLLM's ``MultiConnector``'s composition, or the base's
#: default (vLLM's class has no composition of it either).
THEIRS: Final = "vLLM's MultiConnector's composition, over the children in configuration order"
BASES: Final = "the base class's default, as vLLM's MultiConnector has it"

#: The class attribute holding what :func:`adopt` gave a class: ``{hook: THEIRS | BASES}``.
ADOPTED_ATTR: Final = "_adopted_hooks"


def _each(hooks: Iterable[str], how: str) -> dict[str, str]:
    return dict.fromkeys(hooks, how)


#: The public hooks of vLLM's ``KVConnectorBase_V1`` and ``SupportsHMA`` (0.32 to 0.34) that
#: ``multiconnector.vllm.MultiConnector`` composes over its children itself, and how
#: (docs/vllm.md, "Every method, side by side"). A hook missing from the installed base class
#: (one a later vLLM added) is simply never called there.
COMPOSED: Final[Mapping[str, str]] = {
    **_each(
        (
            "bind_gpu_block_pool",
            "clear_connector_metadata",
            "finish_forward",
            "register_kv_caches",
            "reset_capture_state",
            "restore_kv_caches",
            "set_host_xfer_buffer_ops",
            "unregister_kv_caches",
        ),
        "every child, in order; failures raised together at start-up, absorbed per step",
    ),
    **_each(
        ("save_kv_layer", "start_load_kv", "wait_for_layer_load", "wait_for_save"),
        "the children that implement it (Fanout); a child's failure is that child's",
    ),
    **_each(
        (
            "bind_connector_metadata",
            "build_connector_meta",
            "build_connector_worker_meta",
            "get_handshake_metadata",
            "handle_preemptions",
            "set_xfer_handshake_metadata",
            "set_xfer_handshake_metadata_pp_aware",
        ),
        "each child its own part, by name",
    ),
    **_each(
        (
            "bind_kv_cache_manager",
            "get_block_ids_with_load_errors",
            "get_external_cache_hit_sources",
            "get_finished",
            "get_loaded_kv_cache_group_ids",
            "get_num_new_matched_tokens",
            "get_transfer_results",
            "on_new_request",
            "register_finished_partial_tail",
            "request_finished",
            "request_finished_all_groups",
            "update_connector_output",
            "update_state_after_alloc",
        ),
        "through the role's books: one loader, every saver awaited by name",
    ),
    **_each(
        ("get_kv_connector_kv_cache_events", "get_kv_connector_stats", "take_events"),
        "every child's, by name; a child's bad answer dropped for the step and counted",
    ),
    **_each(
        ("build_kv_connector_stats", "build_prom_metrics"),
        "per child name, with each child's class",
    ),
    "get_finished_count": "None; each child's own count kept by name",
    "get_mem_pool_context": "at most one child's; several are a ChildrenConflictError",
    "get_required_kvcache_layout": "the children's one layout, as vLLM resolves layout names",
    "has_pending_block_frees": "any child (a child that raises counts as no)",
    "has_pending_push_work": "any child (a child that raises counts as no)",
    "kv_cache_access": "every child's flags, OR-ed; a child that raises or answers what is no "
    "flags stops the start (ChildAnswerError)",
    "may_load_async": "any child that may load (not save-only); a child that raises or answers "
    "no bool: counted, and the base's default (the P/D flag) stands for it",
    "requires_kv_delivery": "any child",
    "requires_piecewise_for_cudagraph": "any child",
    "reset_cache": "every child reset (not False); a child that raises did not",
    "shutdown": "every child, even after failures; all raised together",
    "supports_divergent_local_hybrid_hits": "every child",
    "supports_lookahead_block_hashes": "every child; a child that raises or answers no bool "
    "turns lookahead hashing off (logged)",
    "supports_sleep_mode": "every child (a child without it: the 0.33 base's True)",
}

#: The public members of the base class ours inherits on purpose, and why that is right.
INHERITED: Final[Mapping[str, str]] = {
    "role": "a property of the base's own state, set by the base constructor",
    "has_connector_metadata": (
        "reads the base's own slot, which bind_connector_metadata sets through super()"
    ),
}


def public(*classes: type[Any]) -> set[str]:
    """The public names of ``classes`` (their own and inherited)."""
    return {name for cls in classes for name in dir(cls) if not name.startswith("_")}


def undecided(*classes: type[Any]) -> list[str]:
    """The public hooks of ``classes`` (vLLM's base class, ``SupportsHMA``) that are neither in
    :data:`COMPOSED` nor in :data:`INHERITED`, sorted: the day this is not empty, a vLLM added a
    hook nobody decided on."""
    return sorted(public(*classes) - COMPOSED.keys() - INHERITED.keys())


def adopt(ours: type[Any], bases: Iterable[type[Any]], theirs: type[Any]) -> dict[str, str]:
    """Give ``ours`` ``theirs``' composition of every :func:`undecided` hook of ``bases`` that
    ``theirs`` composes (an attribute of its own, not the base's); leave the base's default for
    the others. Returns, and keeps on ``ours`` (:data:`ADOPTED_ATTR`), ``{hook: THEIRS | BASES}``.
    """
    bases = tuple(bases)
    adopted: dict[str, str] = {}
    for hook in undecided(*bases):
        found = _static(theirs, hook)
        if found is not None and all(found is not _static(base, hook) for base in bases):
            setattr(ours, hook, found)
            adopted[hook] = THEIRS
        else:
            adopted[hook] = BASES
    setattr(ours, ADOPTED_ATTR, adopted)
    return adopted


def reads(member: Any) -> set[str]:
    """The attributes a function (a method, classmethod, staticmethod or property's getter)
    reads off its first argument (``self`` or ``cls``), nested functions and comprehensions
    included."""
    function = member
    if isinstance(member, classmethod | staticmethod):
        function = member.__func__
    elif isinstance(member, property):
        function = member.fget
    code = getattr(function, "__code__", None)
    if not isinstance(code, CodeType) or not code.co_varnames:
        return set()
    return _reads(code, code.co_varnames[0])


def _reads(code: CodeType, first: str) -> set[str]:
    found: set[str] = set()
    previous: dis.Instruction | None = None
    for instruction in dis.get_instructions(code):
        if (
            instruction.opname in ("LOAD_ATTR", "LOAD_METHOD")
            and previous is not None
            and previous.opname in ("LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE")
            and previous.argval == first
            and not str(instruction.argval).startswith("__")
        ):
            found.add(str(instruction.argval))
        previous = instruction
    for constant in code.co_consts:
        if isinstance(constant, CodeType):
            found |= _reads(constant, first)
    return found


def in_tested_range(version: str) -> bool:
    """Whether vLLM ``version`` (``"0.34.0"``, ``"0.35.0rc1"``) is within :data:`TESTED`."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        return False
    release = (int(match[1]), int(match[2]))
    return TESTED[0] <= release <= TESTED[1]


def tested_range() -> str:
    """:data:`TESTED` as people write it: ``"0.32-0.34"``."""
    (a, b), (c, d) = TESTED
    return f"{a}.{b}-{c}.{d}"


def check_adopted(instance: Any, version: str) -> None:
    """At construction, under vLLM ``version``: refuse to start if a hook ``instance``'s class
    adopted reads what ``instance`` has not (:class:`UncomposedHookError`); otherwise, when any
    hook was adopted or ``version`` is outside :data:`TESTED`, one WARNING saying so."""
    adopted: Mapping[str, str] = getattr(type(instance), ADOPTED_ATTR, {})
    lacking: dict[str, list[str]] = {}
    for hook, how in adopted.items():
        if how == THEIRS:
            missing = sorted(
                name for name in reads(_static(type(instance), hook)) if not _has(instance, name)
            )
            if missing:
                lacking[hook] = missing
    if lacking:
        raise UncomposedHookError(version, tested_range(), lacking)
    if adopted or not in_tested_range(version):
        hooks = "; ".join(f"{hook}: {how}" for hook, how in adopted.items()) or "none"
        logger.warning(
            "multiconnector: vLLM %s is %s the tested range %s; connector hooks this "
            "MultiConnector does not compose itself: %s (docs/vllm.md, 'Hooks of a newer vLLM')",
            version,
            "within" if in_tested_range(version) else "outside",
            tested_range(),
            hooks,
        )


def _has(owner: Any, name: str) -> bool:
    """Whether ``owner`` has an attribute ``name`` (without running a descriptor)."""
    try:
        inspect.getattr_static(owner, name)
    except AttributeError:
        return False
    return True


def _static(owner: Any, name: str) -> Any:
    """``owner``'s attribute ``name`` without running a descriptor, or ``None``."""
    try:
        return inspect.getattr_static(owner, name)
    except AttributeError:
        return None

"""The class-level queries vLLM asks the connector's class before any connector exists.

vLLM reads these from the configuration alone, while it resolves its config, so there is no
connector to count a child's failure on: each answer is composed from the children's classes
(as vLLM's own ``MultiConnector`` composes them) and, where a child fails, either takes the
answer that is always safe (``False`` for an optional feature) or stops the start naming the
child (where no guess is safe: the KV cache's layout and how it is accessed). The
:class:`~multiconnector.vllm.connector.MultiConnector` classmethods of the same names answer
with these.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from vllm.config.cache import _layout_from_name
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

from .._validate import shown
from ..errors import MultiConnectorError
from .config import ChildSpec, child_specs, specs_of
from .errors import ChildAnswerError, ChildrenConflictError
from .wire import NamedPromMetrics

__all__ = [
    "kv_cache_access",
    "prom_metrics",
    "required_kvcache_layout",
    "requires_piecewise_for_cudagraph",
    "supports_lookahead_block_hashes",
    "supports_sleep_mode",
]

logger: Final = logging.getLogger("multiconnector")


def supports_sleep_mode(kv_transfer_config: Any) -> bool:
    """Whether every child supports sleep mode. A child class without the method (vLLM 0.32
    had none) answers the base class's default of the version that added it (0.33): ``True``."""
    return all(
        getattr(spec.connector_class(), "supports_sleep_mode", _sleeps)(spec.config)
        for spec in specs_of(kv_transfer_config)
    )


def kv_cache_access(kv_transfer_config: Any) -> Any:
    """Every child's ``KVCacheAccess`` flags, OR-ed (vLLM 0.34's composition), each asked as
    vLLM's factory asks a connector configured alone (so an LMCache class that predates the
    hook reads ``LEGACY_IPC``, as vLLM reads it); whatever the child's role (a save-only child
    reads the cache too).

    vLLM lays the KV cache out from this answer before anything starts, and no guess is safe
    for a child that cannot say: too little access, and NIXL cannot register the cache; too
    much, and flags that exclude each other (``LEGACY_IPC`` turns the extensible KV cache off,
    ``EXPORTS_FD`` requires it) stop vLLM. So a child that raises, or answers what is no flags,
    stops the start with a :class:`~multiconnector.vllm.errors.ChildAnswerError` naming it.
    A configuration ours refuses answers no flags (:func:`_children`).
    """
    from vllm.config.kv_transfer import KVCacheAccess  # noqa: PLC0415 (added in vLLM 0.34)

    access = KVCacheAccess.IN_PROCESS
    for spec, _ in _children(kv_transfer_config):
        try:
            answer = KVConnectorFactory.kv_cache_access(spec.config)
        except Exception as exc:
            raise ChildAnswerError(
                spec.name, "kv_cache_access", f"raised {type(exc).__name__}: {exc}"
            ) from exc
        access |= _access_flags(spec.name, answer, KVCacheAccess)
    return access


def supports_lookahead_block_hashes(kv_transfer_config: Any) -> bool:
    """Whether every child supports lookahead block hashes (vLLM 0.34's composition).

    ``False`` is the base class's default and always safe (vLLM hashes without looking ahead,
    as for any connector that does not say): a child that raises, or answers what is not a
    ``bool``, makes the answer ``False``, logged at WARNING naming it.
    """
    children = _children(kv_transfer_config)
    if not children:
        return False
    for spec, child_cls in children:
        try:
            answer = child_cls.supports_lookahead_block_hashes(spec.config)
        except Exception:
            logger.warning(
                "child connector %r raised in supports_lookahead_block_hashes: lookahead block "
                "hashing off (the base class's default)",
                spec.name,
                exc_info=True,
            )
            return False
        if not isinstance(answer, bool):
            logger.warning(
                "child connector %r answered supports_lookahead_block_hashes with %s, not a "
                "bool: lookahead block hashing off (the base class's default)",
                spec.name,
                shown(answer),
            )
            return False
        if not answer:
            return False
    return True


def _children(kv_transfer_config: Any) -> list[tuple[ChildSpec, type[Any]]]:
    """The children and their classes; none when the configuration is one ours refuses when
    built (its error names the key or the child).

    vLLM 0.34 asks the two hooks above while it validates its config, where its validator would
    turn our typed error into its own ``ValidationError``: such a configuration gets the base
    class's answer (no flags; no lookahead), never acted on (no connector is built from it),
    and our error when vLLM builds the connector, as on vLLM 0.32 and 0.33.
    """
    try:
        return [(spec, spec.connector_class()) for spec in specs_of(kv_transfer_config)]
    except MultiConnectorError:
        return []


def requires_piecewise_for_cudagraph(extra_config: dict[str, Any]) -> bool:
    """Whether any child requires piecewise CUDA graphs."""
    return any(
        spec.connector_class().requires_piecewise_for_cudagraph(
            spec.config.kv_connector_extra_config
        )
        for spec in child_specs(extra_config)
    )


def required_kvcache_layout(vllm_config: Any) -> str | None:
    """The children's one required layout, compared as vLLM resolves layout names (so ``"HND"``
    and ``"LBHNC"`` agree); the first child's name for it is returned. Several layouts are a
    :class:`~multiconnector.vllm.errors.ChildrenConflictError` naming the children per layout."""
    layouts: dict[Any, list[tuple[str, str]]] = {}
    for spec in specs_of(vllm_config.kv_transfer_config):
        layout = spec.connector_class().get_required_kvcache_layout(spec.vllm_config(vllm_config))
        if layout is not None:
            layouts.setdefault(_resolved_layout(layout), []).append((layout, spec.name))
    if len(layouts) > 1:
        raise ChildrenConflictError(
            f"KV cache layout mismatch: found {len(layouts)} different layouts; "
            "child connectors require different KV cache layouts: "
            + "; ".join(
                f"{named[0][0]} by {', '.join(name for _, name in named)}"
                for named in layouts.values()
            )
        )
    return next((named[0][0] for named in layouts.values()), None)


def _resolved_layout(name: str) -> Any:
    """The KV cache layout ``name`` stands for, as vLLM 0.33 resolves it (``"HND"`` is
    ``"LBHNC"``); a name vLLM does not know stands for itself (vLLM refuses it later)."""
    try:
        return _layout_from_name(name)
    except (ValueError, TypeError):
        return name


def _access_flags(name: str, answer: Any, flags: type[Any]) -> Any:
    """Child ``name``'s ``kv_cache_access`` answer as ``flags`` (``KVCacheAccess``): an int is
    taken, as vLLM's ``|`` takes it, when every bit of it is a flag vLLM names."""
    if isinstance(answer, flags):
        return answer
    known = 0
    for flag in flags:
        known |= int(flag)
    if isinstance(answer, int) and not isinstance(answer, bool) and 0 <= answer == answer & known:
        return flags(answer)
    raise ChildAnswerError(
        name, "kv_cache_access", f"answered {shown(answer)}; must be {flags.__name__} flags"
    )


def _sleeps(kv_transfer_config: Any) -> bool:
    """vLLM 0.33's ``KVConnectorBase_V1.supports_sleep_mode`` default, for a child without it."""
    return True


def prom_metrics(
    vllm_config: Any,
    metric_types: Any,
    labelnames: list[str],
    per_engine_labelvalues: dict[int, list[object]],
) -> NamedPromMetrics:
    """Each child's Prometheus metrics (its class's ``build_prom_metrics``), by name."""
    # One set of metrics per build_prom_metrics (Prometheus refuses a metric twice): classes
    # that share it (vLLM's NixlPullConnector and NixlPushConnector) share its metrics.
    per_class: dict[Any, Any] = {}
    by_name: dict[str, Any] = {}
    for spec in specs_of(vllm_config.kv_transfer_config):
        child_cls = spec.connector_class()
        key = getattr(child_cls.build_prom_metrics, "__func__", child_cls)
        if key not in per_class:
            per_class[key] = child_cls.build_prom_metrics(
                spec.vllm_config(vllm_config),
                metric_types,
                labelnames,
                per_engine_labelvalues,
            )
        if per_class[key] is not None:
            by_name[spec.name] = per_class[key]
    return NamedPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues, by_name)

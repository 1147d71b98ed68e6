"""A drop-in for vLLM's ``MultiConnector``: the same configuration, plus one line.

A vLLM ``MultiConnector`` configuration switches to this one by adding
``kv_connector_module_path``; nothing else changes::

    KVTransferConfig(
        kv_connector="MultiConnector",
        kv_connector_module_path="multiconnector.vllm",   # the one added line
        kv_role="kv_both",
        kv_connector_extra_config={"connectors": [
            {"kv_connector": "NixlConnector", "kv_role": "kv_both"},
            {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
             "kv_connector_extra_config": {"shared_storage_path": "local_storage"}},
        ]},
    )

vLLM's factory prefers a module path to its own registry, so it loads :class:`MultiConnector`
from here; every check vLLM makes on the string ``"MultiConnector"`` (``has_connector``, the
HMA check over the children, the NIXL settings, ...) still reads the children. A child is named
after its ``kv_connector`` (``NixlConnector``, a second one ``NixlConnector#2``), or explicitly
with ``kv_connector_extra_config["multiconnector_name"]`` (:mod:`multiconnector.vllm.config`).

What changes against vLLM's own ``MultiConnector`` (docs/vllm.md has the full table):

* Everything that crosses a process boundary is keyed by child name, never by position: connector
  metadata (so a missing child is an error, not a silent ``zip`` truncation), worker metadata,
  handshake metadata, stats (two children of one class no longer collide, and stats rebuild
  from their own payload without a factory registration).
* The scheduler sends workers the *names* of the children that committed an asynchronous save of
  each finished request. A worker reports the request finished sending only when every one of
  those names has reported; duplicate and phantom reports are ignored and counted
  (:meth:`MultiConnector.connector_counts`), so they cannot free blocks early.
* A worker passes on one load completion per load, from the child chosen to load; duplicate,
  late and phantom load completions are ignored (vLLM's scheduler asserts on them). A request
  with a load and saves in flight reaches vLLM's scheduler as one completion, after all of them.
* KV cache events are kept per child (:class:`NamedKVEvents`): each child gets back its own.
* A child that reports on fewer workers than all (``get_finished_count()``) is counted by name
  on the scheduler, so no request is stranded on the workers it never reports on.
* Transfer params are merged by :func:`~multiconnector.merge_transfer_params` into a new dict;
  no child's dict is modified. A key two children supply is the later child's failure: the
  params are dropped, the clash counted under that child and logged, and the saves already
  committed are still awaited.
* A child that raises, or answers what cannot be true, in a hook vLLM calls per request or per
  step is that child's failure: the other children are still called, and it is degraded for
  that call, counted (:meth:`MultiConnector.child_failures`) and logged, never raised into
  vLLM's engine loop. Hooks of start-up and shutdown (``register_kv_caches``,
  ``bind_kv_cache_manager``, the handshakes, ``shutdown``, ...) call every child, then raise
  all failures together as :class:`~multiconnector.ConnectorFailures` (an
  ``ExceptionGroup``): a server that cannot start says why.
* A child whose constructor raises has the children built before it shut down, then
  :class:`ChildStartError` names it.

The bookkeeping is :class:`multiconnector.MultiConnector`'s (the core aggregator, a different
class of the same name), told rather than asked: the scheduler's part asks its children itself
and tells its core books the loader it chose (``choose_loader``) and the savers of each finished
request (``request_finished_by``), which they await until the workers report them
(:attr:`MultiConnector.saving` lists them meanwhile); on each worker one tracks the load each
request awaits, and the core's :class:`~multiconnector.ledger.SaveLedger` the saves each
finished request awaits (the core's report rule for a finishing request).

The subpackage is layered: :mod:`~multiconnector.vllm.config` (the children's configuration),
:mod:`~multiconnector.vllm.wire` (what crosses processes), :mod:`~multiconnector.vllm.fanout`
(which children each hook calls), :mod:`~multiconnector.vllm.children` (the children and how
a hook calls them), :mod:`~multiconnector.vllm.scheduler` and
:mod:`~multiconnector.vllm.worker` (each role's part, with only its own books) and
:mod:`~multiconnector.vllm.connector` (the class vLLM loads, which hands each hook to the part
of its role), on top of the core, which never imports it.

.. versionadded:: 0.1.0
"""

from __future__ import annotations

try:  # the vllm extra: without it, say how to install it, not just which module is missing
    import msgspec  # noqa: F401
    import vllm  # noqa: F401
except ModuleNotFoundError as _missing:
    raise ModuleNotFoundError(
        f"multiconnector.vllm needs the vllm extra ({_missing}): "
        "install vLLM 0.32-0.34 beside it (from a checkout of multiconnector: "
        "pip install '.[vllm]', the multiconnector[vllm] extra)",
        name=_missing.name,
    ) from None

from ..ledger import SaveLedger
from .choice import LOAD_CHILDREN_KEY
from .config import (
    CHILDREN_KEY,
    FALLBACK_KEY,
    HEALTH_KEY,
    HIT_METRICS_KEY,
    LOOKUP_KEY,
    NAME_KEY,
    PATIENCE_KEY,
    ROLE_KEY,
    SPLIT_KEY,
    ChildSpec,
    child_specs,
    default_name,
)
from .connector import MultiConnector
from .errors import (
    ChildAnswerError,
    ChildClassError,
    ChildrenConflictError,
    ChildStartError,
    HMAUnsupportedError,
    LookupPatienceError,
    MetadataMismatchError,
    SlowLookupError,
    UncomposedHookError,
    WrongRoleError,
)
from .trouble import adopt_vllm_logging
from .wire import (
    NamedEvents,
    NamedHandshakeMetadata,
    NamedKVEvents,
    NamedMultiConnectorMetadata,
    NamedMultiConnectorStats,
    NamedMultiConnectorWorkerMetadata,
    NamedPromMetrics,
    msgspec_dec_hook,
    msgspec_enc_hook,
)

__all__ = [
    "CHILDREN_KEY",
    "FALLBACK_KEY",
    "HEALTH_KEY",
    "HIT_METRICS_KEY",
    "LOAD_CHILDREN_KEY",
    "LOOKUP_KEY",
    "NAME_KEY",
    "PATIENCE_KEY",
    "ROLE_KEY",
    "SPLIT_KEY",
    "ChildAnswerError",
    "ChildClassError",
    "ChildSpec",
    "ChildStartError",
    "ChildrenConflictError",
    "HMAUnsupportedError",
    "LookupPatienceError",
    "MetadataMismatchError",
    "MultiConnector",
    "NamedEvents",
    "NamedHandshakeMetadata",
    "NamedKVEvents",
    "NamedMultiConnectorMetadata",
    "NamedMultiConnectorStats",
    "NamedMultiConnectorWorkerMetadata",
    "NamedPromMetrics",
    "SaveLedger",
    "SlowLookupError",
    "UncomposedHookError",
    "WrongRoleError",
    "child_specs",
    "default_name",
    "msgspec_dec_hook",
    "msgspec_enc_hook",
]

adopt_vllm_logging()  # our warnings inside vLLM read as vLLM's (trouble.adopt_vllm_logging)

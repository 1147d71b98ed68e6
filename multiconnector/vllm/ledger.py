"""A worker's saves: :class:`SaveLedger`, now the core's (:mod:`multiconnector.ledger`).

Kept so that ``multiconnector.vllm.SaveLedger`` and ``multiconnector.vllm.ledger.SaveLedger``
stay importable: it is the same class, on the core's transfer report rule
(:func:`multiconnector.rule.transfer_report`), tested without vLLM in ``tests/test_ledger.py``.
"""

from __future__ import annotations

from ..ledger import SaveLedger

__all__ = ["SaveLedger"]

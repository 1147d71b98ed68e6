"""The tiers of the engine tests that compose :mod:`block_children` children: the prompts' shape
and one child's configuration, shared by ``test_engine_lookup.py``, ``test_engine_split.py``
and ``test_engine_health.py`` (the reference tokens they compare with are ``conftest.py``'s
``plain``).

Imports no vLLM: the main environment collects this folder and has no engine.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

#: 100 prompt tokens: 3 full blocks of 32 can be loaded (the last token is always computed).
PROMPT_TOKENS = 100
BLOCKS = 3


def block_child(storage: Path, label: str, **extra: Any) -> dict[str, Any]:
    """One ``block_children.BlockStoreConnector`` child over ``storage``, named (and counted)
    ``label``; ``extra``: more of its ``kv_connector_extra_config`` (``max_blocks``,
    ``fail_loads``, ``never_knows``, ``multiconnector_role``, ...)."""
    return {
        "kv_connector": "BlockStoreConnector",
        "kv_connector_module_path": "bench.block_children",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "shared_storage_path": str(storage),
            "label": label,
            "multiconnector_name": label,
            **extra,
        },
    }

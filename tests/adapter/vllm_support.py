"""Whether vLLM can be imported, and what to do when it cannot.

Locally a missing vLLM skips its tests with the reason; with ``MULTICONNECTOR_REQUIRE_VLLM=1``
(CI sets it) it fails them, so a broken install can never pass as a green run of nothing.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

REQUIRED = os.environ.get("MULTICONNECTOR_REQUIRE_VLLM") == "1"


def missing_reason() -> str | None:
    """Why vLLM cannot be used here, or ``None`` when it can."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError) as exc:
        return f"vLLM cannot be imported ({exc!r})"
    # A folder named vllm on sys.path, without vLLM installed, is found as a namespace package:
    # that has no origin, and is not vLLM.
    if spec is None or spec.origin is None:
        return (
            "vLLM is not installed: install the pinned CPU-only extra with `make vllm` "
            "(requirements/vllm.txt, then requirements/vllm-nodeps.txt with --no-deps)"
        )
    return None


def require_vllm() -> None:
    """Skip (locally) or fail (``MULTICONNECTOR_REQUIRE_VLLM=1``) the calling test module."""
    reason = missing_reason()
    if reason is None:
        return
    if REQUIRED:
        pytest.fail(f"MULTICONNECTOR_REQUIRE_VLLM=1 but {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)

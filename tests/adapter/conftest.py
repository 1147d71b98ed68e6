"""The vLLM tests: no network (a local model folder), and this folder importable by name.

vLLM loads the scripted children through ``kv_connector_module_path="vllm_children"``, so this
folder must be on ``sys.path`` whatever pytest's import mode.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

# The model config is a local folder; never ask a model hub for anything.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from vllm_support import missing_reason  # noqa: E402

if missing_reason() is None:
    # torch and vLLM warn about their own deprecations while importing; warnings are errors in
    # this project's tests, and those are not ours to fix. Import them once, quietly.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import vllm_children  # noqa: F401
        from vllm.distributed.kv_transfer.kv_connector.v1 import (  # noqa: F401
            example_connector,
            multi_connector,
        )
        from vllm_harness import write_model

        import multiconnector.vllm  # noqa: F401


@pytest.fixture
def quiet() -> Iterator[None]:
    """No log records below ERROR while a test runs (for tests that build thousands of
    connectors or report thousands of ignored events)."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


@pytest.fixture(scope="session")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local model folder: only a tiny OPT config.json (2 layers, hidden size 64)."""
    return write_model(tmp_path_factory.mktemp("tiny-opt"))

"""The engine tests: a real vLLM engine (the CPU build, ``.venv-engine``) runs the tiny model.

The engine, the tiny model and the children are ``bench.engine_harness`` and
``bench.engine_children``, shared with the engine row of ``make bench``; ``python -m pytest`` from
the repository's root makes them importable (``engine_environment`` sets ``PYTHONPATH`` for the
processes the engine spawns).

``bench.block_children`` (the per-block child of ``test_engine_lookup.py`` and the others, shared
with ``make bench``'s tiered row) is loaded by vLLM through its module path. This folder is put on
``sys.path`` whatever pytest's import mode (``block_tiers``).

Without a vLLM whose engine runs here the tests skip, with the reason; with
``MULTICONNECTOR_REQUIRE_ENGINE=1`` (``make test`` sets it for this step) they fail instead, so
a broken engine environment never passes as a green run of nothing.
"""

# vLLM is imported inside functions: the main environment collects this folder and has no engine.
# ruff: noqa: PLC0415

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import pytest

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)

REQUIRED = os.environ.get("MULTICONNECTOR_REQUIRE_ENGINE") == "1"


def _missing() -> str | None:
    """Why no vLLM engine can run here, or ``None``."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from vllm import LLM  # noqa: F401
            from vllm.platforms import current_platform
    except Exception as exc:  # any import failure: this environment has no engine
        return f"no vLLM engine in this environment ({exc!r}); `make engine` builds .venv-engine"
    if not current_platform.is_cpu():
        return (
            f"the engine tests run on vLLM's CPU build; this vLLM's platform is {current_platform}"
        )
    return None


@pytest.fixture(scope="session")
def engine_ready() -> None:
    """Skip (locally) or fail (``MULTICONNECTOR_REQUIRE_ENGINE=1``) without an engine."""
    reason = _missing()
    if reason is None:
        return
    if REQUIRED:
        pytest.fail(f"MULTICONNECTOR_REQUIRE_ENGINE=1 but {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_model(engine_ready: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random Llama, written once per session (no download)."""
    from bench.engine_harness import write_tiny_llama

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def plain(tiny_model: Path, request: pytest.FixtureRequest) -> list[list[int]]:
    """The reference: the greedy tokens of the test module's ``PROMPTS`` (``OUTPUT_TOKENS``
    each) from an engine with no connector, in-process."""
    from bench import engine_harness as h

    prompts, output_tokens = request.module.PROMPTS, request.module.OUTPUT_TOKENS
    h.engine_environment(in_process=True)
    llm = h.make_llm(tiny_model, None)
    try:
        assert h.engine_core(llm).scheduler.connector is None
        tokens: list[list[int]] = h.tokens(h.generate(llm, prompts, output_tokens))
    finally:
        h.shut(llm)
    assert all(len(t) == output_tokens for t in tokens)
    assert len({tuple(t) for t in tokens}) == len(prompts)  # not one constant answer
    return tokens

"""Split loads inside a real vLLM engine (issue #35): one prompt's prefix read from two tiers.

``short`` (first in the configuration) keeps one block of each prompt, ``long`` all three, both
``block_children.BlockStoreConnector`` children, which load token ranges. With
``split_loads: true`` and vLLM's ``first`` rule, ``short`` loads block 0 and ``long`` the blocks
after it: the whole prefix is loaded, not ``short``'s one block, and the generated tokens are
those of an engine with no connector (a block loaded into the wrong place would change them).
When ``long``'s reads fail, its part is recomputed from its first block on: ``short``'s block
stands. The rules themselves, and every order of the parts' completions, failures and aborts,
are tested under vLLM's real ``Scheduler`` in ``tests/adapter/test_vllm_split.py``.
"""

# vLLM is imported inside functions: the main environment collects this folder and has no engine.
# ruff: noqa: PLC0415

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
from block_tiers import BLOCKS, PROMPT_TOKENS, block_child

import bench.engine_harness as h

pytestmark = [
    pytest.mark.engine,
    pytest.mark.timeout(300),
    # vLLM and torch warn about their own deprecations: not ours to fix.
    pytest.mark.filterwarnings("ignore"),
]

PROMPTS = h.prompts(4, PROMPT_TOKENS, seed=53)
OUTPUT_TOKENS = 12


def _config(tmp_path: Path, *, split: bool, fail_long: bool = False) -> dict[str, Any]:
    children = [
        block_child(tmp_path / "short", "short", max_blocks=1),
        block_child(tmp_path / "long", "long", fail_loads=fail_long),
    ]
    config = h.multi_config(children)
    config["kv_connector_extra_config"]["split_loads"] = split
    config["kv_load_failure_policy"] = "recompute"
    return config


def _run(tiny_model: Path, config: dict[str, Any], *, passes: int) -> tuple[list[Any], Any]:
    """``passes`` generations of PROMPTS (the prefix cache emptied between them); the last
    one's outputs and the scheduler connector's per-child hits."""
    import bench.block_children as bc

    bc.reset()
    llm = h.make_llm(tiny_model, config)
    try:
        for i in range(passes):
            if i:
                assert llm.reset_prefix_cache()
                bc.reset()
            outputs = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        hits = h.engine_core(llm).scheduler.connector.child_hits()
    finally:
        h.shut(llm)
    return outputs, hits


def test_a_split_load_reads_each_tier_its_part_and_generates_the_same_tokens(
    tiny_model: Path, tmp_path: Path, plain: list[list[int]]
) -> None:
    import bench.block_children as bc

    h.engine_environment(in_process=True)
    size, count = h.BLOCK_SIZE, len(PROMPTS)
    unsplit, _ = _run(tiny_model, _config(tmp_path, split=False), passes=2)
    assert h.cached(unsplit) == [size] * count  # vLLM's first hit: short's one block
    assert h.tokens(unsplit) == plain

    split, hits = _run(tiny_model, _config(tmp_path, split=True), passes=1)
    assert h.cached(split) == [BLOCKS * size] * count  # the whole prefix, from two tiers
    assert h.tokens(split) == plain
    assert bc.CALLS["short"]["loaded_blocks"] == count
    assert bc.CALLS["long"]["loaded_blocks"] == count * (BLOCKS - 1)
    assert bc.CALLS["short"]["update_state_after_alloc_range"] == count
    assert bc.CALLS["long"]["update_state_after_alloc_range"] == count
    assert hits["short"]["tokens_chosen"] == count * size
    assert hits["long"]["tokens_chosen"] == count * (BLOCKS - 1) * size


#: vLLM's log line when it recomputes what failed loads were to fill.
RECOVERED = re.compile(
    r"Recovered from KV load failure: (\d+) request\(s\) rescheduled \((\d+) tokens"
)


def test_a_failed_part_is_recomputed_from_its_first_block_and_the_tokens_stay(
    tiny_model: Path, tmp_path: Path, plain: list[list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    """vLLM says how many tokens it recomputes ("tokens affected"): long's two blocks of each
    prompt, not short's block before them (``num_cached_tokens`` is counted when the request
    is scheduled, before any load ran, so it cannot tell)."""
    import bench.block_children as bc

    h.engine_environment(in_process=True)
    size, count = h.BLOCK_SIZE, len(PROMPTS)
    _run(tiny_model, _config(tmp_path, split=True), passes=1)  # both tiers store the prompts
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        failing, _ = _run(tiny_model, _config(tmp_path, split=True, fail_long=True), passes=1)
    recovered = [RECOVERED.search(r.getMessage()) for r in caplog.records]
    found = [(int(m[1]), int(m[2])) for m in recovered if m is not None]
    assert bc.CALLS["long"]["failed_loads"] >= 1
    assert bc.CALLS["long"]["loaded_blocks"] == 0
    assert bc.CALLS["short"]["loaded_blocks"] == count
    # short's block stands; long's part, from its first block on, is computed again.
    assert sum(n for n, _ in found) == count
    assert sum(tokens for _, tokens in found) == count * (BLOCKS - 1) * size
    assert h.tokens(failing) == plain

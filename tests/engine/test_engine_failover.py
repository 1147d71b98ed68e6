"""``load_fallback: failover`` in a real vLLM engine: two tiers hold every prompt's blocks; the
first answers its lookups but raises when told to load (a store that cannot take a load). The
second loads them instead, in the same step: every prompt's tokens are those of an engine with
no connector, every block loaded, none recomputed, under vLLM's default
``kv_load_failure_policy``, ``fail``, which would fail those requests otherwise. Under our
default, ``recompute`` (and vLLM's ``recompute``), the same engine recomputes them."""

# vLLM is imported inside functions: the main environment collects this folder and has no engine.
# ruff: noqa: PLC0415

from __future__ import annotations

from pathlib import Path

import pytest
from block_tiers import BLOCKS, PROMPT_TOKENS, block_child

import bench.engine_harness as h

pytestmark = [
    pytest.mark.engine,
    pytest.mark.timeout(300),
    # vLLM and torch warn about their own deprecations: not ours to fix.
    pytest.mark.filterwarnings("ignore"),
]

PROMPTS = h.prompts(4, PROMPT_TOKENS, seed=51)
OUTPUT_TOKENS = 12


@pytest.mark.parametrize(
    ("fallback", "policy"),
    [("failover", "fail"), ("recompute", "recompute"), ("recompute", "fail")],
)
def test_a_tier_that_cannot_take_a_load_hands_it_to_the_next(
    tiny_model: Path, tmp_path: Path, plain: list[list[int]], fallback: str, policy: str
) -> None:
    import bench.block_children as bc

    count, size = len(PROMPTS), h.BLOCK_SIZE
    config = h.multi_config(
        [block_child(tmp_path / "first", "first"), block_child(tmp_path / "second", "second")]
    )
    config["kv_connector_extra_config"]["load_fallback"] = fallback
    config["kv_load_failure_policy"] = policy  # vLLM's default: "fail"
    h.engine_environment(in_process=True)
    bc.reset()
    llm = h.make_llm(tiny_model, config)
    connector = h.engine_core(llm).scheduler.connector
    try:
        saved = h.tokens(h.generate(llm, PROMPTS, OUTPUT_TOKENS))  # both tiers save
        assert llm.reset_prefix_cache()
        bc.NO_ALLOC.add("first")
        out = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
    finally:
        h.shut(llm)
    assert saved == plain
    if policy == "fail" and fallback == "recompute":  # vLLM fails each request whose load failed
        assert h.tokens(out) == [[]] * count
    else:
        assert h.tokens(out) == plain
    hits = connector.child_hits()
    assert connector.child_failures() == {"first": {"update_state_after_alloc": count}}
    assert bc.CALLS["first"]["loaded_blocks"] == 0
    if fallback == "failover":
        assert hits["second"]["chosen"] == count
        assert bc.CALLS["second"]["loaded_blocks"] == count * BLOCKS
        assert h.cached(out) == [BLOCKS * size] * count
    else:
        assert hits["second"].get("chosen", 0) == 0
        assert bc.CALLS["second"]["loaded_blocks"] == 0

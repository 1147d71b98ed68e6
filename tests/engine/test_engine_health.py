"""A dead tier in a real vLLM engine (issue 48): with ``health`` set, a child whose lookups all
fail is bypassed after the threshold (asked no more, counted ``skipped``), every prompt's
tokens are those of an engine with no connector, and once its store is back it is probed after
the cooldown and readmitted: it loads again, and the tokens are still the same. The scheduler's
health book runs on a clock the test moves (the engine is in-process); nothing sleeps."""

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

PROMPTS = h.prompts(4, PROMPT_TOKENS, seed=48)
OUTPUT_TOKENS = 12
HEALTH = {"threshold": 2, "cooldown_seconds": 5, "probes": 1}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_dead_tier_is_bypassed_then_readmitted(
    tiny_model: Path, tmp_path: Path, plain: list[list[int]]
) -> None:
    import bench.block_children as bc

    count, size = len(PROMPTS), h.BLOCK_SIZE
    config = h.multi_config(
        [block_child(tmp_path / "dead", "dead"), block_child(tmp_path / "live", "live")]
    )
    config["kv_connector_extra_config"]["health"] = HEALTH
    h.engine_environment(in_process=True)
    bc.reset()
    bc.DOWN.add("dead")
    llm = h.make_llm(tiny_model, config)
    connector = h.engine_core(llm).scheduler.connector
    clock = Clock()
    connector._scheduler.health.clock = clock
    passes = []
    try:
        for step in ("down", "down again", "back", "readmitted"):
            if step == "back":
                bc.DOWN.discard("dead")
                clock.now += HEALTH["cooldown_seconds"]
            out = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
            passes.append(
                (
                    step,
                    h.tokens(out),
                    h.cached(out),
                    dict(connector.child_health()),
                    connector.child_hits(),
                )
            )
            assert llm.reset_prefix_cache()
    finally:
        h.shut(llm)
    for step, tokens, _, _, _ in passes:
        assert tokens == plain, step
    (_, _, cached1, health1, hits1), (_, _, cached2, health2, hits2) = passes[:2]
    # Down: asked until the threshold, then bypassed; the live tier saved every block.
    assert health1 == {"dead": "open", "live": "closed"}
    assert bc.CALLS["dead"]["get_num_new_matched_tokens"] >= HEALTH["threshold"]
    assert hits1["dead"]["asked"] == HEALTH["threshold"]
    assert hits1["dead"]["skipped"] == count - HEALTH["threshold"]
    assert cached1 == [0] * count
    # Still down: not asked; the live tier loads every prompt's blocks.
    assert health2["dead"] == "open" and hits2["dead"]["asked"] == HEALTH["threshold"]
    assert hits2["dead"]["skipped"] == 2 * count - HEALTH["threshold"]
    assert cached2 == [BLOCKS * size] * count
    assert hits2["live"]["chosen"] == count
    # Back, past the cooldown: half-open after the next step, probed, closed; it loads again.
    (_, _, _, health3, _), (_, _, cached4, health4, hits4) = passes[2:]
    assert health3["dead"] in {"half_open", "closed"}
    assert health4["dead"] == "closed"
    assert hits4["dead"].get("chosen", 0) >= 1  # readmitted: first in order, it loads
    assert cached4 == [BLOCKS * size] * count
    assert connector.child_failures()["dead"] == {"get_num_new_matched_tokens": HEALTH["threshold"]}

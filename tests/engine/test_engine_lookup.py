"""Which child loads, and a save-only child, inside a real vLLM engine (issue #35).

The adapter's lookup rules and roles are tested under vLLM's real ``Scheduler`` with scripted
children (``tests/adapter/test_vllm_lookup.py``, ``test_vllm_roles.py``); here the tiny model
runs, and the KV cache a child loads must be the right one, or the generated tokens differ from a
run with no connector at all. The children are ``block_children.BlockStoreConnector``: they keep
KV per block, so two of them can hold prefixes of different lengths of one prompt (vLLM's
``ExampleConnector`` answers a whole prompt or nothing). Each engine is in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the test reads the scheduler's connector
(``child_hits()``) and the children's own counters (``block_children.CALLS``) in its process.
The last test holds a bug these runs found (fixed): the per-child lookup counts reached vLLM's
Prometheus metrics for the first step that had any, never after.
"""

# vLLM is imported inside functions: the main environment collects this folder and has no engine.
# ruff: noqa: PLC0415

from __future__ import annotations

from collections import Counter
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

PROMPTS = h.prompts(4, PROMPT_TOKENS, seed=35)
OUTPUT_TOKENS = 12
#: The shorter child keeps one block of each prompt; the longer one all three.
SHORT_BLOCKS = 1


def _hits(llm: Any) -> dict[str, dict[str, int]]:
    """The scheduler's connector's ``child_hits()`` (a count that is 0 is absent)."""
    hits: dict[str, dict[str, int]] = h.engine_core(llm).scheduler.connector.child_hits()
    return hits


def _since(
    after: dict[str, dict[str, int]], before: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """Per child, the counts that grew from ``before`` to ``after`` (and by how much)."""
    grown: dict[str, dict[str, int]] = {}
    for child, counts in after.items():
        for count, value in counts.items():
            delta = value - before.get(child, {}).get(count, 0)
            if delta:
                grown.setdefault(child, {})[count] = delta
    return grown


def test_longest_loads_the_second_childs_longer_prefix(
    tiny_model: Path, tmp_path: Path, plain: list[list[int]]
) -> None:
    """Two per-block children, ``short`` first in the configuration (it keeps one block of each
    prompt) and ``long`` second (all three). Under the default ``first``, both are asked and
    ``short``'s 32 tokens are loaded, though ``long`` offers 96; a second engine over the same
    storage with ``lookup: longest`` loads ``long``'s 96. Both engines generate the tokens of
    an engine with no connector: the blocks each child loaded are the prompt's own."""
    import bench.block_children as bc

    size = h.BLOCK_SIZE
    count = len(PROMPTS)
    short, long = tmp_path / "short", tmp_path / "long"
    children = [block_child(short, "short", max_blocks=SHORT_BLOCKS), block_child(long, "long")]

    h.engine_environment(in_process=True)
    bc.reset()
    llm = h.make_llm(tiny_model, h.multi_config(children))
    try:
        out1 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        assert h.cached(out1) == [0] * count
        assert (bc.held_blocks(short), bc.held_blocks(long)) == (count, count * BLOCKS)
        saved = _hits(llm)
        assert llm.reset_prefix_cache()
        out2 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        first = _since(_hits(llm), saved)
        first_cached = h.cached(out2)
        assert h.tokens(out1) == plain
        assert h.tokens(out2) == plain
    finally:
        h.shut(llm)
    first_calls = {label: Counter(calls) for label, calls in bc.CALLS.items()}
    assert first_cached == [SHORT_BLOCKS * size] * count
    # As vLLM's class does, every child is asked; the first with a hit loads, a longer one
    # after it is not chosen.
    assert first == {
        "short": {
            "asked": count,
            "hits": count,
            "tokens_offered": count * SHORT_BLOCKS * size,
            "chosen": count,
            "tokens_chosen": count * SHORT_BLOCKS * size,
        },
        "long": {"asked": count, "hits": count, "tokens_offered": count * BLOCKS * size},
    }
    assert first_calls["short"]["loaded_blocks"] == count * SHORT_BLOCKS
    assert first_calls["long"]["loaded_blocks"] == 0

    config = h.multi_config(children)
    config["kv_connector_extra_config"]["lookup"] = "longest"
    bc.reset()
    llm = h.make_llm(tiny_model, config)
    try:
        out3 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        longest = _hits(llm)
        longest_cached = h.cached(out3)
        assert h.tokens(out3) == plain
    finally:
        h.shut(llm)
    assert longest_cached == [BLOCKS * size] * count
    assert longest == {
        "short": {"asked": count, "hits": count, "tokens_offered": count * SHORT_BLOCKS * size},
        "long": {
            "asked": count,
            "hits": count,
            "tokens_offered": count * BLOCKS * size,
            "chosen": count,
            "tokens_chosen": count * BLOCKS * size,
        },
    }
    assert bc.CALLS["long"]["loaded_blocks"] == count * BLOCKS
    assert bc.CALLS["short"]["loaded_blocks"] == 0
    assert sum(longest_cached) > sum(first_cached)


@pytest.mark.parametrize("lookup", [None, "longest"])
def test_save_only_child_saves_never_loads_sees_every_finish(
    tiny_model: Path, tmp_path: Path, plain: list[list[int]], lookup: str | None
) -> None:
    """``saver`` (``multiconnector_role: save``, first in the configuration) and ``loader``, both
    per-block children holding every block of each prompt. Under ``first`` (the default, None)
    the saver would be the one to load were it asked, under ``longest`` a tie goes to it: it is
    never asked, never loads (nor waits for a layer's load), yet saves, is told of every
    allocation, and sees ``request_finished`` exactly once per request. With the loader's
    storage gone, nothing is loaded although the saver holds it all; every pass generates the
    tokens of an engine with no connector."""
    import bench.block_children as bc

    size = h.BLOCK_SIZE
    count = len(PROMPTS)
    saver, loader = tmp_path / "saver", tmp_path / "loader"
    children = [
        block_child(saver, "saver", multiconnector_role="save"),
        block_child(loader, "loader"),
    ]

    config = h.multi_config(children)
    if lookup is not None:
        config["kv_connector_extra_config"]["lookup"] = lookup
    h.engine_environment(in_process=True)
    bc.reset()
    llm = h.make_llm(tiny_model, config)
    try:
        out1 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        assert h.cached(out1) == [0] * count
        assert (bc.held_blocks(saver), bc.held_blocks(loader)) == (count * BLOCKS,) * 2
        before = _hits(llm)

        assert llm.reset_prefix_cache()
        out2 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        assert h.cached(out2) == [BLOCKS * size] * count
        assert _since(_hits(llm), before) == {
            "loader": {
                "asked": count,
                "hits": count,
                "tokens_offered": count * BLOCKS * size,
                "chosen": count,
                "tokens_chosen": count * BLOCKS * size,
            }
        }
        assert bc.CALLS["loader"]["loaded_blocks"] == count * BLOCKS

        h.wipe(loader)
        assert llm.reset_prefix_cache()
        out3 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        assert h.cached(out3) == [0] * count  # the saver holds every block, and serves none
        assert bc.held_blocks(saver) == count * BLOCKS
        assert bc.held_blocks(loader) == count * BLOCKS  # saved again
        hits = _hits(llm)
        outputs = [*out1, *out2, *out3]
        for run in (out1, out2, out3):
            assert h.tokens(run) == plain
    finally:
        h.shut(llm)

    calls = bc.CALLS["saver"]
    assert "saver" not in hits
    assert bc.ANSWERS["saver"] == []
    assert calls["get_num_new_matched_tokens"] == 0
    assert calls["loaded_blocks"] == 0
    assert calls["update_state_after_alloc.external"] == 0
    assert calls["wait_for_layer_load"] == 0
    assert bc.CALLS["loader"]["wait_for_layer_load"] > 0  # the hook is called in this engine
    # Told of every allocation, and of every step's load start, as the loader is.
    assert calls["update_state_after_alloc"] == len(outputs)
    assert calls["start_load_kv"] == bc.CALLS["loader"]["start_load_kv"] > 0
    assert calls["stored_blocks"] == count * BLOCKS  # pass 1; then it held them all
    ids = [output.request_id for output in outputs]
    assert len(set(ids)) == len(outputs)
    for label in ("saver", "loader"):
        # The scheduler's ids are the user's with a suffix vLLM adds.
        finished = Counter(request_id.rsplit("-", 1)[0] for request_id in bc.FINISHED[label])
        assert finished == Counter(ids), label  # each request, exactly once


PATIENCE = 3


def test_a_child_that_never_knows_holds_no_request_past_its_patience(
    tiny_model: Path, tmp_path: Path, plain: list[list[int]]
) -> None:
    """Under ``longest``, ``stuck`` (first in the configuration) answers every lookup
    ``None``. Each request waits for it ``lookup_patience_steps`` (3) steps, then the lookup
    goes on without it: ``long``'s 96 tokens are loaded, stuck is asked 4 times a request (its
    patience, and the answer past it) and never again, the tokens are those of an engine with
    no connector, and the scheduler counts each give-up once under stuck's name."""
    import bench.block_children as bc

    count = len(PROMPTS)
    long = tmp_path / "long"
    children = [
        block_child(tmp_path / "stuck", "stuck", never_knows=True),
        block_child(long, "long"),
    ]
    config = h.multi_config(children)
    config["kv_connector_extra_config"].update(lookup="longest", lookup_patience_steps=PATIENCE)
    h.engine_environment(in_process=True)
    bc.reset()
    llm = h.make_llm(tiny_model, config)
    try:
        out1 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        assert bc.held_blocks(long) == count * BLOCKS
        assert llm.reset_prefix_cache()
        out2 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        failures = h.engine_core(llm).scheduler.connector.child_failures()
    finally:
        h.shut(llm)
    assert h.tokens(out1) == plain and h.tokens(out2) == plain
    assert h.cached(out2) == [BLOCKS * h.BLOCK_SIZE] * count
    assert bc.CALLS["stuck"]["get_num_new_matched_tokens"] == 2 * count * (PATIENCE + 1)
    assert bc.CALLS["long"]["loaded_blocks"] == count * BLOCKS
    assert sum(failures["stuck"].values()) == 2 * count
    assert failures["stuck"] == {"get_num_new_matched_tokens": 2 * count}


def _lookup_metrics(llm: Any) -> dict[str, dict[str, int]]:
    """``vllm:multiconnector_child_lookups`` per child and count, as vLLM's Prometheus logger
    recorded it (``LLM.get_metrics``): the shape of ``child_hits()``."""
    found: dict[str, dict[str, int]] = {}
    for metric in llm.get_metrics():
        if metric.name == "vllm:multiconnector_child_lookups":
            child, count = metric.labels["child"], metric.labels["count"]
            found.setdefault(child, {})[count] = int(metric.value)
    return found


def test_hit_counts_reach_prometheus_on_every_step(tiny_model: Path, tmp_path: Path) -> None:
    """With ``child_hit_metrics: true`` and vLLM's stats on, Prometheus's
    ``vllm:multiconnector_child_lookups{child, count}`` adds up to the scheduler's
    ``child_hits()`` totals, over two passes: the first saves (every child asked, none hits), the
    second loads ``long``'s 96 tokens under ``lookup: longest``. Each step's new counts ride in
    that step's stats, so none may be lost between steps."""
    import bench.block_children as bc

    count = len(PROMPTS)
    children = [
        block_child(tmp_path / "short", "short", max_blocks=SHORT_BLOCKS),
        block_child(tmp_path / "long", "long"),
    ]
    config = h.multi_config(children)
    config["kv_connector_extra_config"].update(lookup="longest", child_hit_metrics=True)
    h.engine_environment(in_process=True)
    bc.reset()
    llm = h.make_llm(tiny_model, config, disable_log_stats=False)
    try:
        out1 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        assert h.cached(out1) == [0] * count
        assert llm.reset_prefix_cache()
        out2 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        assert h.cached(out2) == [BLOCKS * h.BLOCK_SIZE] * count
        hits = _hits(llm)
        metrics = _lookup_metrics(llm)
    finally:
        h.shut(llm)
    assert hits["long"]["tokens_chosen"] == count * BLOCKS * h.BLOCK_SIZE
    assert hits["short"]["asked"] == hits["long"]["asked"] == 2 * count
    assert metrics == hits

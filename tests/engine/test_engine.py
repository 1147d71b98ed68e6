"""The adapter inside a real vLLM engine: the tiny model runs, KV is saved and loaded through it.

Each test starts a fresh engine (``bench/engine_harness.py``) on the CPU build of vLLM, with
``multiconnector.vllm.MultiConnector`` loaded as users load it (the one added line), over children
built on vLLM's ``ExampleConnector`` (``bench/engine_children.py``). ``make test`` runs them in
``.venv-engine`` (marker ``engine``); the main suite deselects them.
"""

# vLLM is imported inside functions: the main environment collects this folder and has no engine.
# ruff: noqa: PLC0415

from __future__ import annotations

import filecmp
from pathlib import Path
from typing import Any

import pytest

import bench.engine_harness as h

pytestmark = [
    pytest.mark.engine,
    pytest.mark.timeout(300),
    # vLLM and torch warn about their own deprecations: not ours to fix.
    pytest.mark.filterwarnings("ignore"),
]

#: 100 prompt tokens: the first 96 (3 blocks of 32) are what ExampleConnector saves and loads.
PROMPT_TOKENS = 100
LOADED = 96
PROMPTS = h.prompts(6, PROMPT_TOKENS, seed=24)
OUTPUT_TOKENS = 12


def _two_children(tmp: Path, cls: str = "RecordingExampleConnector") -> tuple[Any, Path, Path]:
    """Our transfer config over two ExampleConnector children, named first and second."""
    records = tmp / "records"
    records.mkdir()
    first, second = tmp / "first", tmp / "second"
    children = [
        h.example_child(first, "first", records, cls, multiconnector_name="first"),
        h.example_child(second, "second", records, cls, multiconnector_name="second"),
    ]
    return h.multi_config(children), first, second


def _saved(storage: Path) -> int:
    """How many prompts a child's storage holds (one folder each, one file per layer)."""
    folders = [p for p in storage.rglob("*") if p.is_dir() and any(p.glob("*.safetensors"))]
    for folder in folders:
        assert len(list(folder.glob("*.safetensors"))) == 2, folder  # both layers
    return len(folders)


def _drained(llm: Any) -> dict[str, int]:
    """Per child, the synchronous loads the scheduler's connector let go (``drained``)."""
    from multiconnector import Outcome

    counts = h.engine_core(llm).scheduler.connector.connector_counts()
    return {name: per[Outcome.drained] for name, per in counts.items() if Outcome.drained in per}


def test_tokens_identical_without_connector_with_vllms_and_ours(
    tiny_model: Path, tmp_path: Path
) -> None:
    """Greedy tokens: no connector, vLLM's MultiConnector and ours agree; both classes save the
    same bytes through their two children."""
    h.engine_environment(in_process=True)
    runs: dict[str, list[list[int]]] = {}
    storages: dict[str, Path] = {}
    for label, ours in (("none", None), ("vllm", False), ("ours", True)):
        transfer = None
        if ours is not None:
            storages[label] = tmp_path / label
            transfer = h.multi_config(
                [
                    h.example_child(storages[label] / "a", "a", cls="ExampleConnector"),
                    h.example_child(storages[label] / "b", "b", cls="ExampleConnector"),
                ],
                ours=ours,
            )
            # vLLM's own class, loaded from vLLM, with its own children: no module path.
            for child in transfer["kv_connector_extra_config"]["connectors"]:
                child.pop("kv_connector_module_path")
        llm = h.make_llm(tiny_model, transfer)
        try:
            connector = h.engine_core(llm).scheduler.connector
            module = type(connector).__module__ if connector is not None else None
            expected = {
                "none": None,
                "vllm": "vllm.distributed.kv_transfer.kv_connector.v1.multi_connector",
                "ours": "multiconnector.vllm.connector",
            }[label]
            assert module == expected
            runs[label] = h.tokens(h.generate(llm, PROMPTS, OUTPUT_TOKENS))
        finally:
            h.shut(llm)
    assert all(len(t) == OUTPUT_TOKENS for t in runs["none"])
    assert len({tuple(t) for t in runs["none"]}) == len(PROMPTS)  # not one constant answer
    assert runs["vllm"] == runs["none"]
    assert runs["ours"] == runs["none"]
    for child in ("a", "b"):
        assert _saved(storages["ours"] / child) == len(PROMPTS)
        compared = filecmp.dircmp(storages["vllm"] / child, storages["ours"] / child)
        assert sorted(compared.common_dirs) == sorted(compared.left_list)
        assert compared.left_only == compared.right_only == []
        for folder in compared.common_dirs:
            sub = compared.subdirs[folder]
            match, mismatch, errors = filecmp.cmpfiles(
                sub.left, sub.right, sub.common_files, shallow=False
            )
            assert (len(match), mismatch, errors) == (2, [], [])


def _save_then_load(
    llm: Any, first: Path, second: Path, records: Path, *, ranks: int = 1, drain: bool = False
) -> list[list[int]]:
    """Pass 1 saves through both children; pass 2 (prefix cache reset) loads from the first;
    pass 3 (first's storage gone) loads from the second. Returns pass 1's tokens. With
    ``ranks`` workers, each saves and loads its own share. With ``drain`` (an in-process
    scheduler, a child that saves late), the engine steps until the late saves reported before
    each reset: the prefix cache cannot be reset while blocks are held."""
    count = len(PROMPTS)
    out1 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
    assert h.cached(out1) == [0] * count
    assert (_saved(first), _saved(second)) == (count * ranks, count * ranks)
    assert h.loads(records) == {}

    if drain:
        _drain(llm)
    assert llm.reset_prefix_cache()
    out2 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
    assert h.cached(out2) == [LOADED] * count
    assert h.tokens(out2) == h.tokens(out1)
    assert _by_child(h.loads(records)) == {"first": count * ranks}

    h.wipe(first)
    if drain:
        _drain(llm)
    assert llm.reset_prefix_cache()
    out3 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
    assert h.cached(out3) == [LOADED] * count
    assert h.tokens(out3) == h.tokens(out1)
    assert _by_child(h.loads(records)) == {"first": count * ranks, "second": count * ranks}
    return h.tokens(out1)


def _by_child(loads: dict[str, int]) -> dict[str, int]:
    """Load records summed over the ranks of each child (labels ``<child>.rank<r>``)."""
    totals: dict[str, int] = {}
    for label, n in loads.items():
        child = label.split(".")[0]
        totals[child] = totals.get(child, 0) + n
    return totals


def test_save_then_load_first_child_then_second(tiny_model: Path, tmp_path: Path) -> None:
    """In one process: both children save; the first loads; without its storage, the second.
    The scheduler's connector_counts() names the child each load came from."""
    h.engine_environment(in_process=True)
    transfer, first, second = _two_children(tmp_path)
    llm = h.make_llm(tiny_model, transfer)
    try:
        count = len(PROMPTS)
        out1 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        assert _drained(llm) == {}
        assert llm.reset_prefix_cache()
        out2 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        assert h.cached(out2) == [LOADED] * count
        assert h.tokens(out2) == h.tokens(out1)
        assert _drained(llm) == {"first": count}
        assert h.loads(tmp_path / "records") == {"first": count}
        h.wipe(first)
        assert llm.reset_prefix_cache()
        out3 = h.generate(llm, PROMPTS, OUTPUT_TOKENS)
        assert h.cached(out3) == [LOADED] * count
        assert h.tokens(out3) == h.tokens(out1)
        assert _drained(llm) == {"first": count, "second": count}
        assert h.loads(tmp_path / "records") == {"first": count, "second": count}
        assert _saved(second) == count
    finally:
        h.shut(llm)


def test_separate_processes_save_then_load(tiny_model: Path, tmp_path: Path) -> None:
    """The default engine: scheduler and worker in separate processes, so the connector
    metadata crosses a process boundary as users run it; the same saves and loads."""
    h.engine_environment(in_process=False)
    transfer, first, second = _two_children(tmp_path)
    llm = h.make_llm(tiny_model, transfer)
    try:
        _save_then_load(llm, first, second, tmp_path / "records")
    finally:
        h.shut(llm)


def test_two_workers_tensor_parallel(tiny_model: Path, tmp_path: Path) -> None:
    """tensor_parallel_size=2: two real workers; vLLM's output aggregator combines their reports
    (a third child saves asynchronously, so finished_sending must come from both). The children
    keep one folder per rank (vLLM's ExampleConnector is not tensor-parallel safe)."""
    h.engine_environment(in_process=True, workers=2)
    records = tmp_path / "records"
    records.mkdir()
    first, second = tmp_path / "first", tmp_path / "second"
    transfer = h.multi_config(
        [
            h.example_child(first, "first", records, "RankedExampleConnector"),
            h.example_child(second, "second", records, "RankedExampleConnector"),
            h.example_child(
                tmp_path / "late",
                "late",
                None,
                "DelayedSaveConnector",
                save_delay_steps=2,
                disk=False,
            ),
        ]
    )
    llm = h.make_llm(tiny_model, transfer, workers=2)
    try:
        tokens = _save_then_load(llm, first, second, records, ranks=2, drain=True)
        for rank in ("rank0", "rank1"):
            assert _saved(second / rank) == len(PROMPTS)
        assert set(h.loads(records)) == {
            "first.rank0",
            "first.rank1",
            "second.rank0",
            "second.rank1",
        }
        assert len({tuple(t) for t in tokens}) == len(PROMPTS)
        scheduler = h.engine_core(llm).scheduler
        _drain(llm)
        assert scheduler.requests == {}
        assert scheduler.connector.saving == {}
    finally:
        h.shut(llm)


def _drain(llm: Any, limit: int = 50) -> int:
    """Step the engine until the scheduler holds no request (late saves reported); the steps."""
    core = h.engine_core(llm)
    for step in range(limit):
        if not core.scheduler.requests:
            return step
        llm.llm_engine.step()
    raise AssertionError(
        f"requests still held after {limit} steps: {list(core.scheduler.requests)}"
    )


def test_aborts_while_saving(tiny_model: Path, tmp_path: Path) -> None:
    """Two children save asynchronously, reporting 2 and 5 steps after a request finished.
    Requests are aborted mid-generation, and after finishing while their saves are in flight:
    no crash, no request's blocks freed before both savers reported, nothing held after."""
    from vllm import SamplingParams
    from vllm.distributed.kv_transfer import get_kv_transfer_group
    from vllm.inputs import TokensPrompt

    from bench import engine_children
    from multiconnector.vllm import MultiConnector

    h.engine_environment(in_process=True)
    labels = ("fast", "slow")
    transfer = h.multi_config(
        [
            h.example_child(
                tmp_path / label,
                label,
                None,
                "DelayedSaveConnector",
                save_delay_steps=delay,
                disk=False,
                multiconnector_name=label,
            )
            for label, delay in zip(labels, (2, 5), strict=True)
        ]
    )
    llm = h.make_llm(tiny_model, transfer)
    try:
        core = h.engine_core(llm)
        scheduler = core.scheduler
        worker = get_kv_transfer_group()
        assert isinstance(scheduler.connector, MultiConnector)
        assert isinstance(worker, MultiConnector)
        reported = {label: engine_children.REPORTED[label] for label in labels}
        freed: dict[str, list[str]] = {}
        free = scheduler._free_request_blocks

        def observed(request: Any) -> None:
            # Called when the scheduler lets the request's blocks go: every saver must have
            # reported it by now (the worker's reports of this step came in before).
            request_id = request.request_id
            freed[request_id] = [label for label in labels if request_id not in reported[label]]
            free(request)

        scheduler._free_request_blocks = observed

        engine = llm.llm_engine
        params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        short = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
        ids = {}
        for i, prompt in enumerate(h.prompts(8, 64, seed=4)):
            ids[f"r{i}"] = engine.add_request(
                f"r{i}", TokensPrompt(prompt_token_ids=prompt), short if i < 4 else params
            )
        finished: set[str] = set()
        for _ in range(3):
            finished |= {o.request_id for o in engine.step() if o.finished}
        # r6 and r7 are mid-generation: abort them.
        assert not {"r6", "r7"} & finished
        engine.abort_request(["r6", "r7"])
        for _ in range(3):
            finished |= {o.request_id for o in engine.step() if o.finished}
        # r0..r3 finished (4 tokens) and wait for their saves: abort them anyway, through the
        # front end and straight at the engine core (its ids), while the saves are in flight.
        assert {"r0", "r1", "r2", "r3"} <= finished
        in_flight = [ids[r] for r in ("r0", "r1", "r2", "r3") if ids[r] in scheduler.requests]
        assert in_flight, "the late savers should still hold some finished request"
        assert set(in_flight) <= set(scheduler.connector.saving)
        engine.abort_request(["r0", "r1", "r2", "r3"])
        core.abort_requests(in_flight)
        while engine.has_unfinished_requests():
            engine.step()
        _drain(llm)

        assert set(freed) == set(ids.values())
        early = {request_id: late for request_id, late in freed.items() if late}
        assert early == {}, f"blocks freed before these savers reported: {early}"
        for label in labels:
            assert set(reported[label]) == set(ids.values())
        # Nothing held anywhere once every saver reported.
        assert scheduler.requests == {}
        assert scheduler.connector.saving == {}
        assert len(scheduler.connector.tracker) == 0
        assert worker.ledger.held() == {}
        assert len(worker.ledger) == 0
        assert scheduler.kv_cache_manager.block_pool.get_usage() == 0.0
    finally:
        h.shut(llm)

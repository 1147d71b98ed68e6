"""A child's bad answer or exception is that child's failure, never the server's.

Under vLLM's real ``Scheduler``: for every hook vLLM calls per request or per step, a child that
answers what cannot be true or raises is degraded for that call (no hit, no metadata, its load
reported failed so that vLLM recomputes), counted under its name and hook
(``child_failures()``), and nothing reaches vLLM's engine loop; where vLLM's own class serves,
ours serves the same. docs/vllm.md, "When a child fails", has the table these tests hold.
"""

from __future__ import annotations

import logging
import pickle
import random
import time
from pathlib import Path
from typing import Any

import pytest
from vllm_support import require_vllm

require_vllm()
pytestmark = pytest.mark.vllm

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.engine import FinishReason  # noqa: E402
from vllm.v1.outputs import KVConnectorOutput  # noqa: E402
from vllm_children import ANSWERS, STORED, Script, child, script  # noqa: E402
from vllm_harness import BLOCK, Engine, make_config, make_connector, make_request  # noqa: E402

from bench.scheduler_parts import runner_output  # noqa: E402
from multiconnector.errors import InvalidArgumentError, InvalidValueError  # noqa: E402


def odd(name: str, made: Script) -> dict[str, Any]:
    return child(name, made, kv_connector="OddConnector")


class FullEngine(Engine):
    """:class:`Engine`, with the worker's per-layer loads and saves and its load errors, in the
    order vLLM's model runner calls them."""

    def step(self, token: int = 7) -> Any:
        scheduler_output = self.scheduler.schedule()
        self.scheduled.append(dict(scheduler_output.num_scheduled_tokens))
        shipped = pickle.loads(pickle.dumps(scheduler_output))
        worker = self.worker
        assert worker is not None
        worker.bind_connector_metadata(shipped.kv_connector_metadata)
        worker.start_load_kv(None)
        for layer in ("layer.0", "layer.1"):
            worker.wait_for_layer_load(layer)
            worker.save_kv_layer(layer, None, None)
        worker.wait_for_save()
        results = worker.get_transfer_results(shipped.finished_req_ids)
        kv_output = KVConnectorOutput(
            finished_sending=results.finished_sending or None,
            finished_recving=results.finished_recving or None,
            failed_recving=results.failed_recving,
            invalid_block_ids=worker.get_block_ids_with_load_errors(),
            kv_connector_worker_meta=worker.build_connector_worker_meta(),
        )
        worker.get_kv_connector_stats()
        worker.clear_connector_metadata()
        engine_outputs = self.scheduler.update_from_output(
            scheduler_output, runner_output(scheduler_output, kv_output, token)
        )
        self.scheduler.connector.take_events()
        self.scheduler.connector.get_kv_connector_stats()
        for outputs in engine_outputs.values():
            for output in outputs.outputs:
                if output.finish_reason is not None:
                    self.outputs[output.request_id] = output
        return engine_outputs


def computed_for(engine: Engine, request_id: str) -> int:
    """How many tokens vLLM scheduled ``request_id`` to compute, over every step."""
    return sum(step.get(request_id, 0) for step in engine.scheduled)


def drive(engine: Engine, request_ids: list[str], steps: int = 30) -> None:
    for _ in range(steps):
        engine.step()
        if all(r in engine.outputs for r in request_ids):
            return


@pytest.fixture(autouse=True)
def _forget() -> Any:
    yield
    ANSWERS.clear()
    STORED.clear()


# -- the served crash: a negative count, under both classes --------------------------------------


@pytest.mark.parametrize("ours", [True, False], ids=["ours", "vllm"])
def test_a_negative_count_after_a_prefix_cache_hit_is_no_hit(model: Path, ours: bool) -> None:
    # ExampleConnector stored 2 blocks of the prompt; vLLM's prefix cache then holds 3 of a
    # request with the same prompt and one token more: the child answers 32 - 48 = -16. vLLM's
    # class takes only a child with more than 0 tokens and serves; so does ours (it dies before).
    a = script()
    STORED[a.label] = 2 * BLOCK
    engine = FullEngine(make_config(model, [odd("a", a)], ours=ours))
    engine.add(make_request("r1", num_tokens=3 * BLOCK + 1))
    drive(engine, ["r1"])
    # make_request's prompt depends on the id's length only: r2's starts with r1's.
    again = make_request("r2", num_tokens=3 * BLOCK + 2)
    engine.add(again)
    drive(engine, ["r2"])
    assert "r2" in engine.outputs
    asked = [c for c in a.names("get_num_new_matched_tokens") if c[1] == "r2"]
    assert asked and asked[-1][2] == 3 * BLOCK  # the prefix cache's 3 blocks
    assert computed_for(engine, "r2") == 2  # 48 from vLLM's own prefix cache, nothing external
    assert [c[2] for c in a.names("update_state_after_alloc") if c[1] == "r2"] == [0]
    if ours:
        assert engine.connector.child_failures() == {"a": {"get_num_new_matched_tokens": 1}}


@pytest.mark.parametrize("ours", [True, False], ids=["ours", "vllm"])
@pytest.mark.parametrize("load_async", [False, True], ids=["sync", "async"])
def test_a_hit_on_every_token_is_served_when_vllm_can_serve_it(
    model: Path, ours: bool, load_async: bool
) -> None:
    """A child holding the whole prompt: loaded asynchronously, vLLM recomputes its last token
    once it arrived; loaded within the step, vLLM's scheduler has no token left to compute and
    asserts (the engine dies, under vLLM's class). Ours counts that answer as the child's
    failure, no hit, and the request is computed."""
    a = script(tokens=40, load_async=load_async)
    engine = FullEngine(make_config(model, [child("a", a)], ours=ours))
    engine.add(make_request("r1", num_tokens=40, max_tokens=2))
    if not ours and not load_async:
        with pytest.raises(AssertionError):
            drive(engine, ["r1"])
        return
    for step in range(30):
        engine.step()
        if step == 0 and load_async:
            a.recving.add("r1")
        if "r1" in engine.outputs:
            break
    assert "r1" in engine.outputs
    if ours:
        told = [c[2] for c in a.names("update_state_after_alloc")]
        assert told[0] == (40 if load_async else 0)
        failures = {} if load_async else {"a": {"get_num_new_matched_tokens": 1}}
        assert engine.connector.child_failures() == failures


# -- every bad answer to get_num_new_matched_tokens ----------------------------------------------


@pytest.mark.parametrize(
    "answer",
    [
        (-1, False),
        (10**6, False),  # more tokens than the request has left
        (40, False),  # every token, within the step: vLLM's scheduler has none to compute
        ("16", False),
        (16.0, False),
        (True, False),
        (16, "yes"),  # a load flag that is no bool
        (16,),
        [16, False],
        None,
        RuntimeError("lookup service down"),
    ],
    ids=repr,
)
def test_a_bad_match_answer_is_no_hit_and_the_next_child_loads(model: Path, answer: Any) -> None:
    a, b = script(), script(tokens=BLOCK)
    if isinstance(answer, Exception):
        a.raise_in["get_num_new_matched_tokens"] = answer
    else:
        ANSWERS[a.label] = answer
    engine = FullEngine(make_config(model, [odd("a", a), child("b", b)]))
    engine.add(make_request("r1", num_tokens=40))
    drive(engine, ["r1"])
    assert "r1" in engine.outputs
    assert [c[2] for c in a.names("update_state_after_alloc")] == [0]
    assert [c[2] for c in b.names("update_state_after_alloc")] == [BLOCK]  # b loads
    assert computed_for(engine, "r1") == 40 - BLOCK
    assert engine.connector.child_failures() == {"a": {"get_num_new_matched_tokens": 1}}
    assert len(engine.connector.tracker) == 0


def test_none_forever_holds_the_request_as_vllms_class_does(model: Path) -> None:
    # "Ask me again" is an answer vLLM's contract allows: the request waits, and is scheduled
    # as soon as the child answers. Not a failure.
    a = script(tokens=None)
    engine = FullEngine(make_config(model, [child("a", a)]))
    engine.add(make_request("r1", num_tokens=40))
    for _ in range(5):
        engine.step()
    assert "r1" not in engine.outputs and computed_for(engine, "r1") == 0
    a.tokens = 0
    drive(engine, ["r1"])
    assert "r1" in engine.outputs
    assert engine.connector.child_failures() == {}


# -- a loader that fails: its load reported failed, recomputed by vLLM ---------------------------

LOAD_HOOKS = [
    ("scheduler", "update_state_after_alloc"),
    ("scheduler", "build_connector_meta"),
    ("worker", "bind_connector_metadata"),
    ("worker", "start_load_kv"),
    ("worker", "wait_for_layer_load"),
]


@pytest.mark.parametrize("policy", ["recompute", "fail"])
@pytest.mark.parametrize("load_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(("side", "hook"), LOAD_HOOKS)
def test_a_loader_that_fails_has_its_load_reported_failed(
    model: Path, side: str, hook: str, load_async: bool, policy: str
) -> None:
    # The failed load reaches vLLM as vLLM's own load failure (a failed receive, or the
    # blocks it was to fill as load errors); vLLM's kv_load_failure_policy decides: recompute
    # them, or fail that request alone (vLLM's default). vLLM's class would crash the engine.
    a, b = script(tokens=2 * BLOCK, load_async=load_async), script()
    a.raise_in[hook] = OSError(f"{hook}: no such file")
    config = make_config(model, [child("a", a), child("b", b)])
    config.kv_transfer_config.kv_load_failure_policy = policy
    engine = FullEngine(config)
    engine.add(make_request("r1", num_tokens=40))
    drive(engine, ["r1"])
    assert "r1" in engine.outputs  # finished: served, or failed alone
    if policy == "recompute":
        # vLLM recomputed what the failed load was to fill: the whole prompt (after the 8
        # tokens of the step a synchronous load came with), and a is not asked again for r1.
        assert computed_for(engine, "r1") == 40 if load_async else 40 - 2 * BLOCK + 40
        assert engine.outputs["r1"].finish_reason == FinishReason.LENGTH
        assert len([c for c in a.names("get_num_new_matched_tokens") if c[1] == "r1"]) == 1
    else:
        assert engine.outputs["r1"].finish_reason == FinishReason.ERROR
    engine.add(make_request("r2", num_tokens=40))  # and the server goes on
    a.raise_in.clear()
    a.tokens = 0
    drive(engine, ["r2"])
    assert engine.outputs["r2"].finish_reason == FinishReason.LENGTH
    connector = engine.connector if side == "scheduler" else engine.worker
    assert connector.child_failures()["a"][hook] >= 1
    assert "b" not in connector.child_failures()
    assert len(engine.connector.tracker) == 0
    assert engine.scheduler.requests == {}


def test_a_loader_that_fails_on_a_later_request_leaves_an_earlier_load_alone(model: Path) -> None:
    a = script(tokens=2 * BLOCK)
    engine = FullEngine(make_config(model, [child("a", a)]))
    engine.add(make_request("r1", num_tokens=40))
    drive(engine, ["r1"])
    assert computed_for(engine, "r1") == 40 - 2 * BLOCK  # loaded: 2 blocks not recomputed
    assert engine.worker.child_failures() == {}


# -- every other per-step hook: the child's failure is counted, the request served ---------------

OTHER_HOOKS = [
    ("scheduler", "on_new_request"),
    ("scheduler", "update_connector_output"),
    ("scheduler", "take_events"),
    ("worker", "save_kv_layer"),
    ("worker", "wait_for_save"),
    ("worker", "get_transfer_results"),
    ("worker", "clear_connector_metadata"),
]


@pytest.mark.parametrize(("side", "hook"), OTHER_HOOKS)
def test_a_child_failing_in_a_per_step_hook_is_counted_and_the_request_served(
    model: Path, side: str, hook: str
) -> None:
    a, b = script(saves=True), script(saves=True)
    a.raise_in[hook] = RuntimeError(f"{hook} broke")
    engine = FullEngine(make_config(model, [child("a", a), child("b", b)]))
    engine.add(make_request("r1", num_tokens=40))
    drive(engine, ["r1"])
    assert "r1" in engine.outputs
    assert engine.held("r1")  # both saves owed
    b.sending.add("r1")
    engine.step()
    assert engine.held("r1")  # a still owes its report: nothing freed under its save
    a.raise_in.clear()
    a.sending.add("r1")
    engine.step()
    assert not engine.held("r1")
    connector = engine.connector if side == "scheduler" else engine.worker
    assert connector.child_failures()["a"][hook] >= 1
    assert "b" not in connector.child_failures()


@pytest.mark.parametrize("answer", ["raises", "a string", 1.5, True])
def test_a_bad_finished_count_is_the_childs_failure_and_its_reports_awaited_everywhere(
    model: Path, answer: Any
) -> None:
    # vLLM's own tests give a MagicMock child: its get_finished_count() answers a MagicMock.
    a, b = script(saves=True), script(saves=True)
    if answer == "raises":
        a.raise_in["get_finished_count"] = RuntimeError("count broke")
    else:
        a.finished_count = answer
    engine = FullEngine(make_config(model, [child("a", a), child("b", b)]))
    assert engine.connector.get_finished_count() is None
    engine.add(make_request("r1", num_tokens=40))
    drive(engine, ["r1"])
    assert "r1" in engine.outputs
    b.sending.add("r1")
    engine.step()
    assert engine.held("r1")  # a's save still owed, on every worker
    a.sending.add("r1")
    engine.step()
    assert not engine.held("r1")
    assert engine.connector.finished_counts == {}
    assert engine.connector.child_failures() == {"a": {"get_finished_count": 1}}


def test_a_child_raising_in_request_finished_is_not_awaited(model: Path) -> None:
    # A child that raised made no promise (the core's rule): the request is not held for it.
    a, b = script(saves=True), script()
    a.raise_in["request_finished"] = RuntimeError("a")
    engine = FullEngine(make_config(model, [child("a", a), child("b", b)]))
    engine.add(make_request("r1", num_tokens=40))
    drive(engine, ["r1"])
    engine.step()
    assert not engine.held("r1")
    assert engine.connector.child_failures() == {"a": {"request_finished": 1}}


@pytest.mark.parametrize("other_saver", [True, False], ids=["beside-a-saver", "alone"])
def test_a_tail_saver_that_raises_in_request_finished_is_still_awaited(
    model: Path, other_saver: bool
) -> None:
    # vLLM offers a finishing request's partial tail before request_finished; a child answering
    # True "accepts responsibility for the sources and the request's blocks must remain alive
    # until get_finished()" (vLLM's base class). Raising in request_finished afterwards does not
    # take that promise back: its tail save is awaited, beside another saver's or alone.
    tail = script(tail=True, raise_in={"request_finished": RuntimeError("tail is broken")})
    disk = script(saves=other_saver)
    e = Engine(make_config(model, [child("tail", tail), child("disk", disk)]))
    # vLLM finalizes a partial tail on a hybrid model (none on this tiny OPT): its KV cache
    # manager answers one here, and the rest is vLLM's own _connector_finished.
    e.scheduler.kv_cache_manager.finalize_partial_tail_offloads = lambda request: [(0, 1, 8)]
    e.add(make_request("r", num_tokens=40, max_tokens=2))
    for _ in range(6):
        e.step()
        if "r" in e.outputs:
            break
    assert "r" in e.outputs
    assert tail.names("register_finished_partial_tail") == [("register_finished_partial_tail", "r")]
    assert tail.names("request_finished") == [("request_finished", "r")]  # it raised there
    assert e.connector.child_failures() == {"tail": {"request_finished": 1}}
    assert e.held("r")
    if other_saver:
        disk.sending.add("r")  # the other saver reports; "tail" still writes its partial tail
    e.step()
    e.step()
    assert e.held("r"), "blocks freed while the child that took the partial tail owes its save"
    tail.sending.add("r")
    e.step()
    e.step()
    assert not e.held("r")
    assert len(e.connector.tracker) == 0 and len(e.worker.ledger) == 0


# -- a child that never reports: counted and warned about, its request still held ---------------

OVERDUE = 0.05  # report_overdue_seconds in these tests


def _stats_taken(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The worker's stats objects, as vLLM collects them each step (FullEngine drops them)."""
    taken: list[Any] = []
    collect = engine.worker.get_kv_connector_stats

    def recording() -> Any:
        found = collect()
        taken.append(found)
        return found

    monkeypatch.setattr(engine.worker, "get_kv_connector_stats", recording)
    return taken


def test_a_saver_that_never_reports_is_counted_and_warned_once_per_request(
    model: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    a, b = script(saves=True), script(saves=True)
    config = make_config(
        model, [child("a", a), child("b", b)], extra={"report_overdue_seconds": OVERDUE}
    )
    engine = FullEngine(config)
    stats = _stats_taken(engine, monkeypatch)
    for request_id in ("r1", "r2"):
        engine.add(make_request(request_id, num_tokens=40))
    drive(engine, ["r1", "r2"])
    b.sending.update({"r1", "r2"})  # b reports; a never does
    engine.step()
    assert engine.worker.child_failures() == {}  # not overdue yet
    time.sleep(OVERDUE * 2)
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        for _ in range(3):
            engine.step()
    # once per request, under a alone (b reported), however many steps pass
    assert engine.worker.child_failures() == {"a": {"finished_sending_overdue": 2}}
    counts = [found.counts for found in stats if found is not None and found.counts]
    assert counts == [{"a": {"failed.finished_sending_overdue": 2}}]
    warned = [r.getMessage() for r in caplog.records if "has not reported" in r.getMessage()]
    assert len(warned) == 1, warned  # rate-limited: one line a minute per child
    assert "'a'" in warned[0] and "save" in warned[0] and "stay held" in warned[0]
    # nothing freed under a save a may still be making
    assert engine.held("r1") and engine.held("r2")
    a.sending.update({"r1", "r2"})
    engine.step()
    assert not engine.held("r1") and not engine.held("r2")
    assert engine.worker.child_failures() == {"a": {"finished_sending_overdue": 2}}


def test_a_saver_that_reports_in_time_is_never_overdue(model: Path) -> None:
    a = script(saves=True)
    engine = FullEngine(make_config(model, [child("a", a)], extra={"report_overdue_seconds": 30}))
    engine.add(make_request("r1", num_tokens=40))
    drive(engine, ["r1"])
    a.sending.add("r1")
    engine.step()
    assert not engine.held("r1")
    assert len(engine.worker.ledger) == 0
    assert engine.worker.child_failures() == {}


def test_a_loader_that_never_reports_is_counted_and_the_request_waits(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    a = script(tokens=2 * BLOCK, load_async=True)
    engine = FullEngine(
        make_config(model, [child("a", a)], extra={"report_overdue_seconds": OVERDUE})
    )
    engine.add(make_request("r1", num_tokens=40))
    engine.step()
    time.sleep(OVERDUE * 2)
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        for _ in range(3):
            engine.step()
    assert engine.connector.child_failures() == {"a": {"finished_recving_overdue": 1}}
    assert any("its load of request 'r1'" in r.getMessage() for r in caplog.records)
    assert "r1" not in engine.outputs and computed_for(engine, "r1") == 0  # vLLM waits for it
    a.recving.add("r1")
    drive(engine, ["r1"])
    assert "r1" in engine.outputs
    assert computed_for(engine, "r1") == 40 - 2 * BLOCK  # loaded, not recomputed
    assert engine.connector.child_failures() == {"a": {"finished_recving_overdue": 1}}
    assert engine.scheduler.requests == {}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (0, InvalidValueError),
        (-1.0, InvalidValueError),
        (float("nan"), InvalidValueError),
        ("60", InvalidArgumentError),
        (True, InvalidArgumentError),
    ],
)
def test_report_overdue_seconds_is_checked_before_any_child_starts(
    model: Path, value: Any, error: type[Exception]
) -> None:
    a = script(saves=True)
    with pytest.raises(error, match="report_overdue_seconds"):
        make_connector(
            make_config(model, [child("a", a)], extra={"report_overdue_seconds": value}),
            KVConnectorRole.SCHEDULER,
        )
    assert a.instances == []


# -- children failing at random steps: the server never sees it ----------------------------------

RANDOM_HOOKS = [
    "get_num_new_matched_tokens",
    "request_finished",
    *(hook for _, hook in LOAD_HOOKS + OTHER_HOOKS),
]


@pytest.mark.parametrize("seed", range(12))
def test_children_failing_at_random_steps_never_reach_vllm(model: Path, seed: int) -> None:
    """Two children, each answering garbage or raising in random hooks at random steps, over
    requests that load and save: every request is served, and once the children stop failing
    and report what they owe, nothing is held by vLLM or by our books."""
    rng = random.Random(seed)
    a = script(tokens=BLOCK, load_async=rng.random() < 0.5, saves=True)
    b = script(tokens=2 * BLOCK, saves=rng.random() < 0.5)
    scripts = (a, b)
    engine = FullEngine(make_config(model, [odd("a", a), odd("b", b)]))
    ids = [f"r{i}" for i in range(6)]
    for request_id in ids:
        engine.add(make_request(request_id, num_tokens=rng.randrange(20, 60)))
    for _ in range(40):
        for made in scripts:
            made.raise_in.clear()
            ANSWERS.pop(made.label, None)
            for hook in rng.sample(RANDOM_HOOKS, 2):
                if rng.random() < 0.3:
                    made.raise_in[hook] = RuntimeError(f"{made.label} {hook}")
            if rng.random() < 0.2:
                ANSWERS[made.label] = rng.choice([(-5, False), (10**5, True), ("x", 1), 7])
        _report_owed(engine, scripts)
        engine.step()
    for made in scripts:
        made.raise_in.clear()
        ANSWERS.pop(made.label, None)
    for _ in range(40):
        _report_owed(engine, scripts)
        engine.step()
        if not engine.scheduler.requests:
            break
    assert set(engine.outputs) == set(ids)
    assert engine.scheduler.requests == {}
    assert len(engine.connector.tracker) == 0
    assert engine.connector.saving == {}
    assert len(engine.worker.ledger) == 0
    failures = {**engine.connector.child_failures(), **engine.worker.child_failures()}
    assert failures  # the seeds make children fail; each counted under its name
    assert set(failures) <= {"a", "b"}


def _report_owed(engine: Engine, scripts: tuple[Script, ...]) -> None:
    """Each script's children report the saves and loads vLLM waits for (a real child would
    report them when done)."""
    saving = engine.connector.saving
    for made in scripts:
        name = "a" if made is scripts[0] else "b"
        made.sending.update(r for r, names in saving.items() if name in names)
        loads = engine.worker.load_tracker
        for request_id in loads.request_ids():
            record = loads.peek(request_id)
            if record is not None and record.loader == name and not record.loaded:
                made.recving.add(request_id)

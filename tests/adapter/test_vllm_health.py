"""Each child's health machine under vLLM's real Scheduler (``kv_connector_extra_config
['health']``): a failing child is bypassed after the threshold, probed after its cooldown and
readmitted after enough probes, on a clock the test moves by hand; what it owes when it opens
(a load in flight, a save) is still awaited, and every request is still scheduled, finished
and freed once."""

from __future__ import annotations

from vllm_support import require_vllm

require_vllm()

import json  # noqa: E402
from collections import deque  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402
from prometheus_client import REGISTRY, Counter, Gauge, Histogram  # noqa: E402
from vllm.v1.metrics.prometheus import unregister_vllm_metrics  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402
from vllm_children import Script, child, script  # noqa: E402
from vllm_harness import Engine, make_config, make_request  # noqa: E402

from multiconnector import InvalidArgumentError, InvalidValueError  # noqa: E402
from multiconnector.health import Health  # noqa: E402
from multiconnector.vllm import HEALTH_KEY, LOOKUP_KEY, SPLIT_KEY, MultiConnector  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(300)]

BOUNDS = {"threshold": 3, "window_seconds": 60, "cooldown_seconds": 5, "probes": 2}
LOOKUP = "get_num_new_matched_tokens"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def engine(
    model: Path, *scripts: Script, bounds: Any = BOUNDS, **extra: Any
) -> tuple[Engine, Clock]:
    children = [child(f"c{i}", made) for i, made in enumerate(scripts)]
    e = Engine(make_config(model, children, extra={HEALTH_KEY: bounds, **extra}))
    clock = Clock()
    e.connector._scheduler.health.clock = clock
    return e, clock


def rid(i: int) -> str:
    """Request ids of different lengths: different prompts (no local prefix-cache hits)."""
    return "r" + "x" * i


def run(e: Engine, *ids: str, steps: int = 3) -> None:
    for request_id in ids:
        e.add(make_request(request_id, num_tokens=40, max_tokens=2))
        e.step()
    for _ in range(steps):
        e.step()


def asked(made: Script) -> int:
    return len(made.names(LOOKUP))


@pytest.mark.parametrize("policy", ["first", "longest"])
def test_a_child_failing_every_lookup_is_asked_no_more_after_the_threshold(
    model: Path, policy: str
) -> None:
    dead, live = script(tokens=16, raise_in={LOOKUP: RuntimeError("store down")}), script(tokens=16)
    e, _ = engine(model, dead, live, **{LOOKUP_KEY: policy})
    run(e, *(rid(i) for i in range(8)))
    assert asked(dead) == 3  # the threshold; then bypassed
    assert asked(live) == 8
    assert e.connector.child_health() == {"c0": Health.open, "c1": Health.closed}
    assert e.connector.child_failures()["c0"] == {LOOKUP: 3}
    hits = e.connector.child_hits()
    assert hits["c0"]["asked"] == 3 and hits["c0"]["skipped"] == 5
    assert hits["c1"]["chosen"] == 8  # the lookup went on with the others
    assert sorted(e.outputs) == sorted(rid(i) for i in range(8))  # every request finished
    assert len(e.connector.tracker) == 0
    # Its per-step hooks and request_finished are still called (vLLM's contract).
    assert len(dead.names("request_finished")) == 8
    assert dead.names("build_connector_meta") == live.names("build_connector_meta")


def test_a_recovered_child_is_readmitted_within_cooldown_and_probes(model: Path) -> None:
    dead, live = script(tokens=16, raise_in={LOOKUP: RuntimeError("store down")}), script()
    e, clock = engine(model, dead, live)
    run(e, rid(0), rid(1), rid(2))
    assert e.connector.child_health()["c0"] is Health.open
    dead.raise_in.clear()  # the store is back
    clock.now += 4.9
    run(e, rid(3))
    assert asked(dead) == 3 and e.connector.child_health()["c0"] is Health.open
    clock.now += 0.1  # the cooldown is over: the next step's tick makes it half-open
    e.step()
    assert e.connector.child_health()["c0"] is Health.half_open
    run(e, rid(4))
    assert e.connector.child_health()["c0"] is Health.half_open  # one probe of two
    run(e, rid(5))
    assert e.connector.child_health()["c0"] is Health.closed  # readmitted
    assert asked(dead) == 5
    assert e.connector.child_hits()["c0"]["chosen"] == 2  # the probes' hits loaded
    moves = e.connector._scheduler.health.moves()
    assert moves == {"c0": {"closed_to_open": 1, "open_to_half_open": 1, "half_open_to_closed": 1}}


def test_a_failed_probe_opens_it_again_for_longer(model: Path) -> None:
    dead = script(tokens=16, raise_in={LOOKUP: RuntimeError("store down")})
    e, clock = engine(model, dead, script())
    run(e, rid(0), rid(1), rid(2))
    clock.now += 5
    e.step()
    run(e, rid(3))  # the probe fails
    health = e.connector._scheduler.health
    assert health.snapshot()["c0"] is Health.open and health.record("c0").cooldown == 10
    clock.now += 9
    run(e, rid(4))
    assert asked(dead) == 4 and health.snapshot()["c0"] is Health.open
    assert sorted(e.outputs) == sorted(rid(i) for i in range(5))


def test_a_slow_lookup_is_taken_and_counted_a_failure(model: Path) -> None:
    slow = script(tokens=16)
    e, clock = engine(model, slow, script(), bounds={**BOUNDS, "slow_lookup_seconds": 0.5})
    original = type(slow.instances[0]).get_num_new_matched_tokens

    def late(self: Any, request: Any, num_computed_tokens: int) -> Any:
        clock.now += 1.0  # the call takes a second
        return original(self, request, num_computed_tokens)

    slow.instances[0].get_num_new_matched_tokens = late.__get__(slow.instances[0])
    run(e, rid(0), rid(1), rid(2), rid(3))
    hits = e.connector.child_hits()["c0"]
    assert hits["chosen"] == 3 and hits["skipped"] == 1  # the slow answers were taken
    assert e.connector.child_failures()["c0"] == {LOOKUP: 3}
    assert e.connector.child_health()["c0"] is Health.open
    assert sorted(e.outputs) == sorted(rid(i) for i in range(4))


def test_opening_mid_load_and_mid_save_drops_nothing_owed(model: Path) -> None:
    """The child opens while it owes a load in flight and a save: both are still awaited and
    delivered once; the saved request is freed only once its save is reported."""
    owing, other = script(tokens=16, load_async=True, saves=True), script()
    e, _ = engine(model, owing, other)
    e.add(make_request("saved", num_tokens=40, max_tokens=1))
    e.step()
    loading = e.add(make_request("loading", num_tokens=41, max_tokens=2))
    e.step()
    assert loading.status is RequestStatus.WAITING_FOR_REMOTE_KVS
    owing.recving.add("saved")  # the first one's load
    for _ in range(3):
        e.step()
    assert "saved" in e.outputs and e.held("saved")  # its save is owed
    owing.raise_in[LOOKUP] = RuntimeError("store down")
    run(e, rid(1), rid(2), rid(3), steps=1)
    assert e.connector.child_health()["c0"] is Health.open
    assert e.held("saved") and e.held("loading")
    assert e.connector.saving["saved"] == ("c0",)
    # What it owed arrives: the load completes once, the save frees its request.
    owing.recving.add("loading")
    owing.sending.add("saved")
    for _ in range(4):
        e.step()
    assert not e.held("saved")
    assert "loading" in e.outputs and e.scheduled.count({"loading": 1}) <= 1
    assert e.connector.child_hits()["c0"]["loads_completed"] == 2
    owing.sending.update({"loading", *(rid(i) for i in (1, 2, 3))})  # every save it took
    for _ in range(2):
        e.step()
    assert not any(e.held(r) for r in ("loading", rid(1), rid(2), rid(3)))
    assert len(e.connector.tracker) == 0


def test_an_open_child_is_no_part_of_a_split_load(model: Path) -> None:
    first = script(holds=16)
    dead = script(holds=32, raise_in={LOOKUP: RuntimeError("store down")})
    third = script(holds=32)
    children = [child("c0", first, "RangeConnector"), child("c1", dead, "RangeConnector"),
                child("c2", third, "RangeConnector")]  # fmt: skip
    e = Engine(make_config(model, children, extra={HEALTH_KEY: BOUNDS, SPLIT_KEY: True}))
    run(e, *(rid(i) for i in range(6)))
    assert e.connector.child_health()["c1"] is Health.open
    assert asked(dead) == 3  # asked for the second part until it opened; then no more
    assert e.connector.child_hits()["c2"]["chosen"] == 6  # each load's second part
    assert sorted(e.outputs) == sorted(rid(i) for i in range(6))


def test_no_health_key_is_no_health_machine(model: Path) -> None:
    dead = script(tokens=16, raise_in={LOOKUP: RuntimeError("store down")})
    e = Engine(make_config(model, [child("c0", dead), child("c1", script())]))
    run(e, *(rid(i) for i in range(6)))
    assert asked(dead) == 6  # asked every time, as before
    assert e.connector.child_health() == {}
    assert "skipped" not in e.connector.child_hits()["c0"]


@pytest.mark.parametrize(
    ("bounds", "error", "named"),
    [
        ([1], InvalidArgumentError, "['health']=[1]"),
        ({"threshhold": 3}, InvalidValueError, "unknown key(s) ['threshhold']"),
        ({"threshold": 0}, InvalidValueError, "['health']['threshold']=0"),
        ({"threshold": "5"}, InvalidArgumentError, "['health']['threshold']='5'"),
        ({"probes": True}, InvalidArgumentError, "['health']['probes']=True"),
        ({"window_seconds": 0}, InvalidValueError, "['health']['window_seconds']=0"),
        ({"cooldown_seconds": float("inf")}, InvalidValueError, "['health']['cooldown_seconds']"),
        ({"slow_lookup_seconds": -1}, InvalidValueError, "['health']['slow_lookup_seconds']=-1"),
        ({"count": "lookup"}, InvalidArgumentError, "['health']['count']='lookup'"),
        (
            {"count": [1]},
            InvalidArgumentError,
            "['health']['count']=[1] (type list) must be a list",
        ),
        ({"count": ["lookups"]}, InvalidValueError, "unknown: ['lookups']"),
        ({"count": []}, InvalidValueError, "['health']['count']=[] (type list) must name one"),
        (
            {"cooldown_seconds": 50, "max_cooldown_seconds": 20},
            InvalidValueError,
            "['health']['max_cooldown_seconds']=20 must be >=",
        ),
        ({"failure_rate": 0}, InvalidValueError, "['health']['failure_rate']=0 (type int) must"),
        ({"failure_rate": 1.5}, InvalidValueError, "['health']['failure_rate']=1.5"),
        ({"failure_rate": float("nan")}, InvalidValueError, "['health']['failure_rate']=nan"),
        ({"failure_rate": "0.5"}, InvalidArgumentError, "['health']['failure_rate']='0.5'"),
        ({"failure_rate": True}, InvalidArgumentError, "['health']['failure_rate']=True"),
        (
            {"failure_rate": 0.5, "min_calls": 0},
            InvalidValueError,
            "['health']['min_calls']=0 (type int) must be an int >= 1",
        ),
        (
            {"failure_rate": 0.5, "min_calls": 2.5},
            InvalidArgumentError,
            "['health']['min_calls']=2.5",
        ),
        (
            {"threshold": 3, "failure_rate": 0.5},
            InvalidValueError,
            "['health']['threshold']=3 (type int) and kv_connector_extra_config['health']"
            "['failure_rate']=0.5 (type float) are two trip rules",
        ),
        (
            {"min_calls": 4},
            InvalidValueError,
            "['health']['min_calls']=4 (type int) is read only with "
            "kv_connector_extra_config['health']['failure_rate']",
        ),
        (
            {"min_calls": 4, "failure_rate": None},
            InvalidValueError,
            "['health']['min_calls']=4 (type int) is read only with",
        ),
    ],
)
def test_bad_health_bounds_are_refused_before_any_child_starts(
    model: Path, bounds: Any, error: type[Exception], named: str
) -> None:
    made = script()
    with pytest.raises(error) as raised:
        Engine(make_config(model, [child("c0", made)], extra={HEALTH_KEY: bounds}))
    assert named in str(raised.value)
    assert "kv_connector_extra_config['health']" in str(raised.value)
    assert made.instances == []


#: The rate rule's bounds: BOUNDS with ``failure_rate`` (given by each test) for ``threshold``.
RATE = {"window_seconds": 60, "cooldown_seconds": 5, "probes": 2, "min_calls": 4}


def failing_every_second_lookup(made: Script) -> None:
    """``made``'s first child answers its 1st, 3rd, 5th, ... lookups and raises in the
    others (a store that drops half its calls)."""
    instance = made.instances[0]
    original = type(instance).get_num_new_matched_tokens

    def flaky(self: Any, request: Any, num_computed_tokens: int) -> Any:
        if asked(made) % 2:  # (this call not yet recorded: the next is an even one)
            self.script.calls.append((LOOKUP, request.request_id, num_computed_tokens))
            raise RuntimeError("store dropped the call")
        return original(self, request, num_computed_tokens)

    instance.get_num_new_matched_tokens = flaky.__get__(instance)


@pytest.mark.parametrize(("rate", "opens"), [(0.4, True), (0.5, True), (0.6, False)])
def test_a_child_failing_half_its_lookups_opens_only_under_a_rate_at_most_a_half(
    model: Path, caplog: pytest.LogCaptureFixture, rate: float, opens: bool
) -> None:
    """``failure_rate``: a child failing every second lookup opens at its 4th call (2 of 4,
    ``min_calls`` 4) when the rate is 0.4 or 0.5, and is asked for every request at 0.6 (half
    is below it), every request served."""
    flaky = script(tokens=16)
    e, _ = engine(model, flaky, script(tokens=16), bounds={**RATE, "failure_rate": rate})
    failing_every_second_lookup(flaky)
    with caplog.at_level("WARNING", logger="multiconnector"):
        run(e, *(rid(i) for i in range(10)))
    health = e.connector.child_health()["c0"]
    failures = e.connector.child_failures()["c0"][LOOKUP]
    hits = e.connector.child_hits()["c0"]
    if opens:
        assert health is Health.open and asked(flaky) == 4 and failures == 2
        assert hits["skipped"] == 6
        opened = [r.getMessage() for r in caplog.records if "-> open" in r.getMessage()]
        assert len(opened) == 1
        assert f"(2 of 4 calls failed within 60 s (failure_rate={rate:g}))" in opened[0]
    else:
        assert health is Health.closed and asked(flaky) == 10 and failures == 5
        assert "skipped" not in hits and hits["chosen"] == 5  # its answers loaded
        # Each answer in time is in its window (the window of 60 s holds every call).
        record = e.connector._scheduler.health.record("c0")
        assert (len(record.failures), len(record.answers)) == (5, 5)
    assert sorted(e.outputs) == sorted(rid(i) for i in range(10))
    assert len(e.connector.tracker) == 0


def test_under_the_count_rule_no_closed_childs_answer_is_told(model: Path) -> None:
    """Without ``failure_rate`` the lookups of a closed child tell its book nothing (the hot
    path pays for no window of answers): only ``threshold`` failures open it."""
    flaky = script(tokens=16)
    e, _ = engine(model, flaky, script(tokens=16))
    failing_every_second_lookup(flaky)
    run(e, *(rid(i) for i in range(10)))
    book = e.connector._scheduler.health
    assert not book.rated and book.record("c0").answers == deque()
    assert e.connector.child_health()["c0"] is Health.open
    assert asked(flaky) == 6  # the 3rd failure is its 6th lookup


def test_loads_reported_failed_open_a_child(model: Path) -> None:
    """A load the workers report failed is its loader's failure: three of them open it; the
    requests are recomputed by vLLM, and later ones are not looked up in it."""
    pd = script(tokens=32, load_async=True)
    e, _ = engine(model, pd, script())
    failing = [rid(i) for i in range(3)]
    for request_id in failing:
        e.add(make_request(request_id, num_tokens=40, max_tokens=1))
    e.step()
    pd.recving.update(failing)
    pd.failed.update(failing)
    e.step()
    assert e.connector.child_hits()["c0"]["loads_failed"] == 3
    assert e.connector.child_health()["c0"] is Health.open
    assert e.connector.child_failures().get("c0") is None  # no hook raised: only loads failed
    run(e, rid(3), rid(4))
    assert asked(pd) == 3
    assert sorted(e.outputs) == sorted(rid(i) for i in range(5))
    assert len(e.connector.tracker) == 0


def test_the_stats_payload_carries_each_transition_and_the_state(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    dead = script(tokens=16, raise_in={LOOKUP: RuntimeError("store down")})
    e, clock = engine(model, dead, script())
    payloads = []
    with caplog.at_level("INFO", logger="multiconnector"):
        for i in range(4):
            e.add(make_request(rid(i), num_tokens=40, max_tokens=1))
            payloads.append(collected(e.step()))
        clock.now += 5
        payloads.append(collected(e.step()))  # its tick: half-open
    # vLLM's scheduler collected each step's stats: the payloads its front end gets, summed
    summed: dict[str, int] = {}
    for payload in payloads:
        for key, n in payload.get("c0", {}).get("counts", {}).items():
            summed[key] = summed.get(key, 0) + n
    assert summed["health.closed_to_open"] == 1
    assert summed["failed.get_num_new_matched_tokens"] == 3
    assert summed["health.open"] >= 1  # one per step it was open
    assert summed["health.open_to_half_open"] == 1 and summed["health.half_open"] == 1
    later = e.connector.get_kv_connector_stats()  # the next step: only its state
    assert later.counts["c0"] == {"health.half_open": 1}
    moves = [r.getMessage() for r in caplog.records if " health " in r.getMessage()]
    assert len(moves) == 2  # one line per transition
    assert "'c0' health closed -> open" in moves[0] and "open -> half_open" in moves[1]


def collected(outputs: Any) -> dict[str, Any]:
    """The stats payload vLLM's scheduler collected in one step (empty when none)."""
    stats = next(iter(outputs.values())).scheduler_stats if outputs else None
    if stats is None or stats.kv_connector_stats is None:
        return {}
    return dict(json.loads(json.dumps(stats.kv_connector_stats)))


def test_a_load_report_overdue_is_a_failure_and_still_awaited(model: Path) -> None:
    """A loader owing a load's report past ``report_overdue_seconds`` fails its health machine
    (with ``threshold: 1`` it opens); the request still waits for that load, which completes
    once when it comes."""
    slow = script(tokens=16, load_async=True)
    e, _ = engine(
        model, slow, script(), bounds={**BOUNDS, "threshold": 1}, report_overdue_seconds=30
    )
    loading = e.add(make_request("loading", num_tokens=40, max_tokens=2))
    e.step()
    reported = e.connector._scheduler.reported
    reported.load_since["loading"] -= 60  # sent a minute ago (instead of sleeping)
    e.step()
    assert e.connector.child_failures() == {"c0": {"finished_recving_overdue": 1}}
    assert e.connector.child_health()["c0"] is Health.open
    assert loading.status is RequestStatus.WAITING_FOR_REMOTE_KVS and e.held("loading")
    slow.recving.add("loading")
    for _ in range(3):
        e.step()
    assert "loading" in e.outputs and len(e.connector.tracker) == 0
    assert e.connector.child_hits()["c0"]["loads_completed"] == 1


HOOKS = [("build_connector_meta", "step"), ("request_finished", "save"), ("on_new_request", "step")]


@pytest.mark.parametrize(("hook", "kind"), HOOKS)
def test_a_child_failing_only_one_scheduler_hook_is_not_bypassed_by_default(
    model: Path, hook: str, kind: str
) -> None:
    """By default the breaker counts what it gates, lookups and loads (``health.count``):
    a child failing only ``hook`` (counted and logged as its failure there) stays closed and
    is asked to look up and chosen to load as before."""
    broken = script(tokens=16, raise_in={hook: RuntimeError(f"{hook} broke")})
    e, _ = engine(model, broken, script(tokens=16))
    run(e, *(rid(i) for i in range(6)))
    assert e.connector.child_health()["c0"] is Health.closed
    assert e.connector.child_failures()["c0"][hook] >= BOUNDS["threshold"]
    hits = e.connector.child_hits()["c0"]
    assert asked(broken) == 6 and "skipped" not in hits and hits["chosen"] == 6
    assert sorted(e.outputs) == sorted(rid(i) for i in range(6))


@pytest.mark.parametrize(("hook", "kind"), HOOKS)
def test_a_child_failing_only_one_scheduler_hook_opens_when_its_kind_counts(
    model: Path, hook: str, kind: str
) -> None:
    """With ``health.count`` naming ``hook``'s kind, a child failing only there opens after
    the threshold, is then not looked up, and is still called in ``hook`` (vLLM's contract),
    every request served."""
    broken = script(tokens=16, raise_in={hook: RuntimeError(f"{hook} broke")})
    e, _ = engine(model, broken, script(tokens=16), bounds={**BOUNDS, "count": ["lookup", kind]})
    run(e, *(rid(i) for i in range(6)))
    assert e.connector.child_health()["c0"] is Health.open
    assert e.connector.child_failures()["c0"][hook] >= BOUNDS["threshold"]
    assert asked(broken) < 6 and e.connector.child_hits()["c0"]["skipped"] >= 1
    called = len(broken.names(hook))
    run(e, rid(6), steps=2)
    assert len(broken.names(hook)) > called  # still called there
    assert sorted(e.outputs) == sorted(rid(i) for i in range(7))


def test_a_child_failing_only_lookups_stays_closed_when_lookups_do_not_count(
    model: Path,
) -> None:
    dead = script(tokens=16, raise_in={LOOKUP: RuntimeError("store down")})
    e, _ = engine(model, dead, script(tokens=16), bounds={**BOUNDS, "count": ("load", "step")})
    run(e, *(rid(i) for i in range(6)))
    assert e.connector.child_health()["c0"] is Health.closed
    assert asked(dead) == 6 and e.connector.child_failures()["c0"] == {LOOKUP: 6}


def test_prometheus_shows_each_childs_state_and_transitions(model: Path) -> None:
    """Each step's payload, as vLLM records it: the state gauge (0 closed, 1 half-open, 2 open)
    of every child from the start, and a counter of each transition."""
    dead = script(tokens=16, raise_in={LOOKUP: RuntimeError("store down")})
    e, clock = engine(model, dead, script())
    unregister_vllm_metrics()
    metrics = MultiConnector.build_prom_metrics(
        e.config, {Gauge: Gauge, Counter: Counter, Histogram: Histogram}, ["engine"], {0: ["0"]}
    )
    sample = REGISTRY.get_sample_value

    def state(name: str) -> float | None:
        return sample("vllm:multiconnector_child_health", {"engine": "0", "child": name})

    def moved(name: str, transition: str) -> float | None:
        labels = {"engine": "0", "child": name, "transition": transition}
        return sample("vllm:multiconnector_child_health_transitions_total", labels)

    def step() -> None:
        metrics.observe(collected(e.step()))

    assert (state("c0"), state("c1")) == (0, 0)
    for i in range(3):
        e.add(make_request(rid(i), num_tokens=40, max_tokens=1))
        step()
    assert state("c0") == 2 and moved("c0", "closed_to_open") == 1
    dead.raise_in.clear()
    clock.now += 5
    step()
    assert state("c0") == 1 and moved("c0", "open_to_half_open") == 1
    for i in (3, 4):
        e.add(make_request(rid(i), num_tokens=40, max_tokens=1))
        step()
    step()
    assert state("c0") == 0 and moved("c0", "half_open_to_closed") == 1
    assert state("c1") == 0 and moved("c1", "closed_to_open") is None

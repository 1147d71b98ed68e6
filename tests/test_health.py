"""A child's health machine and its book: the one declaration, read by the runtime's table and
by ``transitions`` alike; the book's windows, cooldowns, backoff and probes on a hand-driven
clock (nothing here sleeps)."""

from __future__ import annotations

import logging
import threading
from collections import deque
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transitions import Machine

from multiconnector import health as health_module
from multiconnector._table import compile_table
from multiconnector.diagram import HEALTH_MACHINE, run_cli
from multiconnector.errors import InvalidMachineError
from multiconnector.health import (
    HEALTH_EVENTS,
    HEALTH_STATES,
    HEALTH_TABLE,
    HEALTH_TRANSITIONS,
    ChildHealth,
    Health,
    build_health_machine,
    health_step,
)
from multiconnector.healthbook import HealthBook, HealthSettings
from multiconnector.rule import (
    DEFAULT_FAILURE_KINDS,
    FAILURE_KINDS,
    failure_counts,
    failure_kind,
    may_look_up,
    next_cooldown,
    slow_lookup,
)
from multiconnector.usermachine import check_machine
from tests.browser import mermaid_blocks, mermaid_page, problems, rendered, require_chromium

SETTINGS = HealthSettings(
    threshold=3, window_seconds=10.0, cooldown_seconds=5.0, max_cooldown_seconds=20.0, probes=2
)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def book(*names: str, **bounds: Any) -> tuple[HealthBook, Clock]:
    clock = Clock()
    made = HealthBook(
        names or ("a", "b"), HealthSettings(**{**attrs_of(SETTINGS), **bounds}), clock=clock
    )
    return made, clock


def attrs_of(s: HealthSettings) -> dict[str, Any]:
    return {
        "threshold": s.threshold,
        "window_seconds": s.window_seconds,
        "cooldown_seconds": s.cooldown_seconds,
        "max_cooldown_seconds": s.max_cooldown_seconds,
        "probes": s.probes,
        "slow_lookup_seconds": s.slow_lookup_seconds,
    }


# -- the declaration -----------------------------------------------------------------------------


def test_every_event_is_declared_from_every_state() -> None:
    """Any sequence of failures, successes and ticks is defined: no (state, event) pair is
    left to an error."""
    assert HEALTH_EVENTS == ("failure", "cooled", "probe_ok")
    for state in HEALTH_STATES:
        for event in HEALTH_EVENTS:
            assert HEALTH_TABLE[state][event], (state, event)


def test_the_transitions_machine_is_the_declaration() -> None:
    machine = build_health_machine()
    assert list(machine.states) == [s.value for s in HEALTH_STATES]
    assert machine.initial == "closed"
    assert set(machine.events) == set(HEALTH_EVENTS)
    declared = {
        (t["trigger"], src, t["dest"])
        for t in HEALTH_TRANSITIONS
        for src in ([t["source"]] if isinstance(t["source"], str) else t["source"])
    }
    built = {
        (event, src, tr.dest or src)
        for event, ev in machine.events.items()
        for src, trs in ev.transitions.items()
        for tr in trs
    }
    assert {(e, s, s if d == "=" else d) for e, s, d in declared} == built


def test_the_table_built_again_is_the_table_and_undeclared_events_lead_nowhere() -> None:
    # HEALTH_TABLE is built at import; built again inside a test, a mutation of the build shows.
    assert health_module._compile() == HEALTH_TABLE
    for state in HEALTH_STATES:
        assert health_step(ChildHealth(name="c", state=state), "unknown", 0.0) is None


def test_build_health_machine_takes_a_machine_class_a_model_and_its_arguments() -> None:
    class Recording(Machine):
        pass

    class Model:
        pass

    model: Any = Model()
    built = build_health_machine(machine_cls=Recording, model=model, name="health")
    assert type(built) is Recording and built.name == "health: "
    assert built.models == [model] and model.state == "closed"
    with pytest.raises(AttributeError, match="Do not know event"):  # invalid, not ignored
        model.trigger("unknown")


#: One machine for every record, no model attached (fired on any object with a ``state``).
MACHINE: Machine = build_health_machine()


def _fired(record: ChildHealth, event: str, now: float) -> str:
    """``event`` on a copy of ``record`` through a real ``transitions`` machine."""

    class Model:
        pass

    model: Any = Model()
    for field in (
        "threshold",
        "failure_rate",
        "min_calls",
        "probes",
        "failures",
        "answers",
        "opened_at",
        "cooldown",
        "successes",
    ):
        setattr(model, field, getattr(record, field))
    for guard in ("tripped", "cooldown_over", "probes_done"):
        setattr(model, guard, getattr(ChildHealth, guard).__get__(model))
    model.state = record.state.value
    MACHINE.events[event].trigger(model, now)
    return str(model.state)


records = st.builds(
    ChildHealth,
    name=st.just("c"),
    state=st.sampled_from(HEALTH_STATES),
    threshold=st.integers(1, 4),
    failure_rate=st.none() | st.sampled_from([0.25, 0.5, 1.0]),
    min_calls=st.integers(1, 6),
    probes=st.integers(1, 3),
    failures=st.lists(st.floats(0, 50), max_size=5),
    answers=st.lists(st.floats(0, 50), max_size=5),
    opened_at=st.floats(0, 50),
    cooldown=st.floats(0, 30),
    successes=st.integers(0, 4),
)


@settings(max_examples=300, deadline=None)
@given(records, st.sampled_from(HEALTH_EVENTS), st.floats(0, 100))
def test_the_runtime_table_and_transitions_agree_on_every_pair(
    record: ChildHealth, event: str, now: float
) -> None:
    dest = health_step(record, event, now)
    assert dest is not None
    assert _fired(record, event, now) == dest.value


def test_a_declaration_with_two_guards_on_a_transition_is_refused() -> None:
    bad = [{"trigger": "failure", "source": "closed", "dest": "open",
            "conditions": ["tripped", "probes_done"]}]  # fmt: skip
    with pytest.raises(InvalidMachineError, match="several guards"):
        compile_table(bad, Health, ChildHealth)


# -- the decisions (rule.py) ---------------------------------------------------------------------


def test_only_an_open_child_is_not_asked_to_look_up() -> None:
    assert [may_look_up(s) for s in HEALTH_STATES] == [True, False, True]


@pytest.mark.parametrize(
    ("seconds", "bound", "slow"),
    [(0.5, None, False), (0.5, 1.0, False), (1.0, 1.0, False), (1.01, 1.0, True)],
)
def test_a_lookup_is_slow_only_past_its_bound(
    seconds: float, bound: float | None, slow: bool
) -> None:
    assert slow_lookup(seconds, bound) is slow


def test_the_cooldown_doubles_after_a_failed_probe_up_to_its_bound() -> None:
    assert next_cooldown(40.0, base=5.0, most=20.0, probe_failed=False) == 5.0
    assert next_cooldown(5.0, base=5.0, most=20.0, probe_failed=True) == 10.0
    assert next_cooldown(15.0, base=5.0, most=20.0, probe_failed=True) == 20.0


# -- the book ------------------------------------------------------------------------------------


def test_failures_within_the_window_open_a_child_and_only_then() -> None:
    health, clock = book()
    assert health.failed("a") is Health.closed
    clock.now += 11  # the first failure leaves the window
    assert health.failed("a") is Health.closed
    assert health.failed("a") is Health.closed
    assert health.bypassed == frozenset()
    assert health.failed("a") is Health.open
    assert health.bypassed == {"a"} and health.probing == frozenset()
    assert health.snapshot() == {"a": Health.open, "b": Health.closed}
    assert health.failed("nobody") is None  # a name that is no child's: ignored


@pytest.mark.parametrize(
    ("hook", "kind"),
    [
        ("get_num_new_matched_tokens", "lookup"),
        ("may_load_async", "lookup"),
        ("finished_recving", "load"),
        ("update_state_after_alloc", "load"),
        ("get_block_ids_with_load_errors", "load"),
        ("finished_recving_overdue", "overdue"),
        ("request_finished", "save"),
        ("register_finished_partial_tail", "save"),
        ("build_connector_meta", "step"),
        ("get_kv_connector_stats", "step"),
    ],
)
def test_only_failures_of_the_counted_kinds_feed_the_machine(hook: str, kind: str) -> None:
    assert failure_kind(hook) == kind and kind in FAILURE_KINDS
    assert failure_counts(hook, DEFAULT_FAILURE_KINDS) is (kind in {"lookup", "load", "overdue"})
    assert failure_counts(None, frozenset({"step"}))  # told the book directly: always
    for counted in (frozenset({kind}), frozenset(FAILURE_KINDS) - {kind}):
        health, _ = book(threshold=1, count=counted)
        assert health.failed("a", hook=hook) is (Health.open if kind in counted else Health.closed)
    assert HealthSettings().count == DEFAULT_FAILURE_KINDS


def test_a_failure_not_counted_neither_fills_the_window_nor_fails_a_probe() -> None:
    health, clock = book(threshold=2)
    assert health.failed("a", hook="request_finished") is Health.closed
    assert health.record("a").failures == deque()  # not in the window
    health.failed("a", hook="get_num_new_matched_tokens")
    assert health.failed("a", hook="build_connector_meta") is Health.closed
    assert health.failed("a", hook="finished_recving") is Health.open
    clock.now += health.record("a").cooldown
    health.tick()
    assert health.failed("a", hook="request_finished") is Health.half_open  # no probe failed
    assert health.failed("a", hook="finished_recving_overdue") is Health.open


def test_an_open_child_is_probed_after_its_cooldown_and_closed_by_enough_probes() -> None:
    health, clock = book()
    for _ in range(3):
        health.failed("a")
    clock.now += 4.9
    health.tick()
    assert health.record("a").state is Health.open
    assert health.answered("a") is Health.open  # an open child's success changes nothing
    clock.now += 0.1
    health.tick()
    assert health.bypassed == frozenset() and health.probing == {"a"}
    assert health.answered("a") is Health.half_open
    assert health.answered("a") is Health.closed
    assert health.probing == frozenset()
    assert health.moves() == {
        "a": {"closed_to_open": 1, "open_to_half_open": 1, "half_open_to_closed": 1}
    }


def test_a_failed_probe_opens_it_again_for_twice_as_long_up_to_the_bound() -> None:
    health, clock = book()
    for _ in range(3):
        health.failed("a")
    cooldowns = []
    for _ in range(4):
        cooldowns.append(health.record("a").cooldown)
        clock.now += health.record("a").cooldown
        health.tick()
        assert health.record("a").state is Health.half_open
        health.answered("a")  # one success of two: still probing
        assert health.failed("a") is Health.open
    assert cooldowns == [5.0, 10.0, 20.0, 20.0]
    # Closed again, the next opening starts from the first cooldown.
    clock.now += 20
    health.tick()
    health.answered("a")
    health.answered("a")
    for _ in range(3):
        health.failed("a")
    assert health.record("a").cooldown == 5.0


# -- the rate rule (failure_rate, min_calls) ----------------------------------------------------

#: The rate rule's bounds in these tests (``threshold`` unread under it).
RATE: dict[str, Any] = {"failure_rate": 0.5, "min_calls": 4}


def test_the_rate_rule_trips_at_exactly_the_rate_and_not_below() -> None:
    health, _ = book(**RATE)
    for _ in range(3):
        health.answered("a")
    health.failed("a")
    health.failed("a")  # 2 of 5: 0.4
    assert health.record("a").state is Health.closed
    assert health.failed("a") is Health.open  # 3 of 6: exactly 0.5
    assert health.record("a").failures == deque() and health.record("a").answers == deque()
    # Another child: 2 of 4 is 0.5 as well.
    health.answered("b")
    health.answered("b")
    health.failed("b")
    assert health.failed("b") is Health.open


def test_the_rate_rule_waits_for_min_calls() -> None:
    """Every call failed, but fewer than ``min_calls`` of them: not yet judged (the count rule's
    ``threshold`` of 3 is not read)."""
    health, _ = book(**RATE)
    for _ in range(3):
        assert health.failed("a") is Health.closed
    assert health.failed("a") is Health.open


@pytest.mark.parametrize(("rate", "calls"), [(0.5, 10), (0.28, 25), (0.55, 100), (1.0, 10)])
def test_the_rate_is_compared_exactly(rate: float, calls: int) -> None:
    """``k`` failures of ``calls`` trip ``k / calls`` exactly, whatever its binary rounding
    (0.28 times 25 is 7.000000000000001 in floats; 7 / 25 is 0.28)."""
    k = round(rate * calls)
    health, _ = book(failure_rate=rate, min_calls=calls)
    for _ in range(calls - k):
        health.answered("a")
    for _ in range(k - 1):
        health.failed("a")
    assert health.record("a").state is Health.closed
    assert health.failed("a") is Health.open
    # One more answer before the last failure: k of calls + 1, below the rate.
    health, _ = book(failure_rate=rate, min_calls=calls)
    for _ in range(calls + 1 - k):
        health.answered("a")
    for _ in range(k):
        health.failed("a")
    assert health.record("a").state is Health.closed


def test_the_rate_rules_window_forgets_old_calls() -> None:
    health, clock = book(**RATE)  # a window of 10 s
    for _ in range(6):
        health.answered("a")
    clock.now += 5
    health.failed("a")
    health.failed("a")
    health.failed("a")  # 3 of 9
    assert health.record("a").state is Health.closed
    clock.now += 5  # the answers leave the window (a call exactly 10 s old is out)
    assert health.failed("a") is Health.open  # 4 of 4
    assert health.record("a").cooldown == 5.0


def test_old_failures_leave_the_rate_rules_window_too() -> None:
    health, clock = book(**RATE)
    for _ in range(3):
        health.failed("a")
    clock.now += 10.5
    assert health.failed("a") is Health.closed  # 1 call in the window, fewer than min_calls
    assert list(health.record("a").failures) == [clock.now]


def test_without_the_rate_rule_answers_are_not_kept() -> None:
    """The count rule keeps no answers (the adapter does not even tell a closed child's,
    :attr:`HealthBook.rated`): a child failing one lookup in two opens at ``threshold``."""
    health, _ = book()
    assert not health.rated and book(**RATE)[0].rated
    for _ in range(2):
        health.answered("a")
        health.failed("a")
    assert health.record("a").answers == deque()
    health.answered("a")
    assert health.failed("a") is Health.open  # 3 failures, whatever was answered


def test_probes_under_the_rate_rule_are_probes_not_calls() -> None:
    """Half-open, an answer is a probe (``probes`` close it); closed again, its window starts
    empty."""
    health, clock = book(**RATE)
    for _ in range(4):
        health.failed("a")
    clock.now += 5
    health.tick()
    assert health.answered("a") is Health.half_open
    assert health.record("a").answers == deque()
    assert health.answered("a") is Health.closed
    health.failed("a")
    health.answered("a")
    assert len(health.record("a").failures) == 1 and len(health.record("a").answers) == 1


def test_the_log_line_says_which_rule_tripped(caplog: pytest.LogCaptureFixture) -> None:
    health, _ = book(**RATE)
    with caplog.at_level(logging.WARNING, logger="multiconnector"):
        for _ in range(3):
            health.answered("a")
            health.failed("a")
    (line,) = [r.getMessage() for r in caplog.records if r.name == "multiconnector"]
    assert "'a' health closed -> open (2 of 4 calls failed within 10 s (failure_rate=0.5))" in line


def test_the_stats_take_transitions_once_and_say_who_is_not_closed_each_time() -> None:
    health, clock = book()
    assert health.take_unreported() == {}
    for _ in range(3):
        health.failed("b")
    assert health.take_unreported() == {"b": {"closed_to_open": 1, "open": 1}}
    assert health.take_unreported() == {"b": {"open": 1}}  # one more step open
    clock.now += 5
    health.tick()
    assert health.take_unreported() == {"b": {"open_to_half_open": 1, "half_open": 1}}


def test_each_transition_is_one_log_line(caplog: pytest.LogCaptureFixture) -> None:
    health, clock = book()
    with caplog.at_level(logging.INFO, logger="multiconnector"):
        for _ in range(5):
            health.failed("a")
        clock.now += 5
        health.tick()
        health.tick()
        health.answered("a")
        health.answered("a")
    lines = [r.getMessage() for r in caplog.records if r.name == "multiconnector"]
    assert len(lines) == 3, lines
    assert "'a' health closed -> open (3 failure(s) within 10 s)" in lines[0]
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO", "INFO"]
    assert "open -> half_open" in lines[1] and "half_open -> closed" in lines[2]


events = st.lists(
    st.tuples(st.sampled_from(["failed", "answered", "tick"]), st.sampled_from(["a", "b"]),
              st.floats(0, 30)),
    max_size=60,
)  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(events)
def test_any_sequence_keeps_to_the_declared_states_and_transitions(
    sequence: list[tuple[str, str, float]],
) -> None:
    health, clock = book()
    declared = {
        (src, t["dest"] if t["dest"] != "=" else src)
        for t in HEALTH_TRANSITIONS
        for src in ([t["source"]] if isinstance(t["source"], str) else t["source"])
    }
    for what, name, later in sequence:
        before, after = fire(health, clock, what, name, later)
        for child in ("a", "b"):
            assert after[child] in HEALTH_STATES
            assert (before[child].value, after[child].value) in declared
            if before[child] is not after[child]:
                assert child == name or what == "tick"
        assert health.bypassed == {n for n, s in after.items() if s is Health.open}
        assert health.probing == {n for n, s in after.items() if s is Health.half_open}
        for child in ("a", "b"):
            cooldown = health.record(child).cooldown
            assert cooldown == 0 or 5.0 <= cooldown <= 20.0


@settings(max_examples=200, deadline=None)
@given(events, st.sampled_from([0.25, 0.5, 0.75, 1.0]), st.integers(1, 5))
def test_the_rate_rule_opens_a_closed_child_as_a_plain_recount_says(
    sequence: list[tuple[str, str, float]], rate: float, min_calls: int
) -> None:
    """Against a recount of each closed child's calls since it last closed: a failure opens
    it exactly when the window (10 s) holds ``min_calls`` calls or more and the failed share
    reaches the rate."""
    health, clock = book(failure_rate=rate, min_calls=min_calls)
    calls: dict[str, list[tuple[float, bool]]] = {"a": [], "b": []}
    for what, name, later in sequence:
        before, after = fire(health, clock, what, name, later)
        if what != "tick" and before[name] is Health.closed:
            calls[name].append((clock.now, what == "failed"))
            window = [failed for t, failed in calls[name] if t > clock.now - 10.0]
            trips = (
                what == "failed" and len(window) >= min_calls and sum(window) / len(window) >= rate
            )
            assert (after[name] is Health.open) is trips, (window, rate, min_calls)
        for child in ("a", "b"):
            if after[child] is not Health.closed:
                calls[child] = []
                assert not health.record(child).failures and not health.record(child).answers


def test_the_book_is_safe_from_several_threads() -> None:
    health, _ = book(threshold=1000, window_seconds=1000.0)
    threads = [
        threading.Thread(target=lambda: [health.failed("a") for _ in range(200)]) for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(health.record("a").failures) == 800


# -- the diagram ---------------------------------------------------------------------------------


def test_the_diagram_is_drawn_from_the_one_declaration(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--health"]) == 0
    drawn = capsys.readouterr().out
    assert 'title: "child health"' in drawn
    arrows = {
        line.strip().split(":")[0]
        for line in drawn.splitlines()
        if "-->" in line and "[*]" not in line
    }
    declared = {
        f"{src} --> {src if t['dest'] == '=' else t['dest']}"
        for t in HEALTH_TRANSITIONS
        for src in ([t["source"]] if isinstance(t["source"], str) else t["source"])
    }
    assert arrows == declared
    assert "closed --> open: failure [tripped]" in drawn
    assert "half_open --> closed: probe_ok [probes_done]" in drawn


def test_health_and_another_machine_are_refused_together(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run_cli(["--health", "--machine", "x:y"]) == 2
    assert capsys.readouterr().err == (
        "multiconnector diagram: error: --health draws a machine of its own, not --machine\n"
    )


def test_the_diagram_renders_in_a_real_browser(tmp_path: Path) -> None:
    """The ``--format md`` page of ``diagram --health`` drawn by headless Chromium with the
    real mermaid library, as the transfer machine's are (tests/test_browser.py)."""
    require_chromium()
    out = tmp_path / "health.md"
    assert run_cli(["--health", "--format", "md", "-o", str(out)]) == 0
    sources = mermaid_blocks(out.read_text(encoding="utf-8"))
    assert len(sources) == 1
    result = rendered(mermaid_page(sources, tmp_path / "health.html"))
    assert problems(result, 1) == []
    assert result["diagrams"][0]["nodes"] >= 3


def test_the_generic_checker_passes_the_one_declaration() -> None:
    """``multiconnector check --machine multiconnector.health:build_health_machine``: with its
    guards as free choices, no event's guards overlap, no state deadlocks, every state is
    entered and every declared transition fires."""
    report = check_machine(HEALTH_MACHINE)
    assert report.ok and report.finished
    assert all(p.passed for p in report.properties)
    assert set(report.states_reached) == {s.value for s in HEALTH_STATES}


def test_the_docs_page_shows_what_the_declaration_draws(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/health.md's diagram is ``diagram --health``'s, line for line (its title and styles
    left out): regenerate it when the declaration changes."""
    page = Path(__file__).resolve().parents[1] / "docs" / "health.md"
    (shown,) = mermaid_blocks(page.read_text(encoding="utf-8"))
    assert run_cli(["--health", "--format", "mermaid"]) == 0
    drawn = capsys.readouterr().out

    def edges(text: str) -> list[str]:
        return [line.strip() for line in text.splitlines() if "-->" in line]

    assert edges(shown) == edges(drawn)
    assert edges(shown)


def fire(
    health: HealthBook, clock: Any, what: str, name: str, later: float
) -> tuple[dict[str, Health], dict[str, Health]]:
    """``later`` seconds on, the book's ``what`` (``tick``, or a method taking ``name``);
    each child's state before and after."""
    clock.now += later
    before = health.snapshot()
    if what == "tick":
        health.tick()
    else:
        getattr(health, what)(name)
    return before, health.snapshot()

"""Arbitrary interleavings of every event, checked step by step against a small reference model."""

from __future__ import annotations

import attrs
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from multiconnector import (
    ConnectorRegistry,
    DuplicateRequestError,
    MultiConnector,
    Outcome,
    RequestTransferState,
    State,
)
from tests.connectors import Scripted

REQUESTS = ("r0", "r1", "r2")
NAMES = ("a", "b", "c", "dead")
REPORTERS = (*NAMES, "ghost")


@attrs.define
class Ref:
    """The reference model of one request: plain sets, no machine."""

    state: str = "pending"
    awaiting: list[str] = attrs.Factory(list)
    expected: list[str] = attrs.Factory(list)
    abandoned: list[str] = attrs.Factory(list)


class AggregatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.connectors: dict[str, Scripted | None] = {
            "a": Scripted(),
            "b": Scripted(),
            "dead": None,
        }
        self.mc = MultiConnector(ConnectorRegistry(self.connectors), trace=True)
        self.held: dict[str, Ref] = {}
        self.done: list[str] = []  # terminal, in order, not yet taken

    # -- model helpers ---------------------------------------------------------------------------

    def finish(self, rid: str, state: str) -> None:
        self.held[rid].state = state
        self.done.append(rid)

    def expect_report(self, rid: str, name: str) -> Outcome:
        ref = self.held.get(rid)
        if ref is None:
            return Outcome.unknown_request
        if ref.state == "cancelled" and name in ref.awaiting:  # the drain
            ref.awaiting.remove(name)
            if not ref.awaiting:
                self.done.append(rid)
            return Outcome.drained
        if ref.state in ("finished", "cancelled"):
            return Outcome.terminal
        if name in ref.awaiting:
            ref.awaiting.remove(name)
            if not ref.awaiting:
                self.finish(rid, "finished")
            return Outcome.applied
        if name in ref.abandoned:
            return Outcome.unregistered
        if name in ref.expected:
            return Outcome.duplicate
        if name not in self.connectors:
            return Outcome.unknown_connector
        return Outcome.not_ready if self.connectors[name] is None else Outcome.phantom

    # -- rules -----------------------------------------------------------------------------------

    # One rule draws the action each step. With one rule per action, Hypothesis' swarm testing
    # disables random subsets of rules per run, and runs that cannot begin a request, or cannot
    # report, waste most of the budget.
    ACTIONS = (
        "begin", "begin", "finish_a_request", "finish_a_request", "report", "report", "report",
        "cancel", "register", "unregister", "take",
    )  # fmt: skip

    @rule(data=st.data())
    def act(self, data: st.DataObject) -> None:
        action = data.draw(st.sampled_from(self.ACTIONS), label="action")
        if action == "begin":
            self.begin(data.draw(st.sampled_from(REQUESTS), label="rid"))
        elif action == "register":
            name = data.draw(st.sampled_from(NAMES), label="name")
            self.register(name, data.draw(st.booleans(), label="ready"))
        elif action == "unregister":
            if self.connectors:
                self.unregister(data.draw(st.sampled_from(sorted(self.connectors)), label="name"))
        elif action == "take":
            self.take()
        else:
            getattr(self, action)(data)

    def begin(self, rid: str) -> None:
        if rid in self.held:
            with pytest.raises(DuplicateRequestError):
                self.mc.begin(rid)
        else:
            self.mc.begin(rid)
            self.held[rid] = Ref()

    def some_request(
        self, data: st.DataObject, state: str | None = None, *, awaiting: bool = False
    ) -> str:
        """Mostly a held request (in ``state``, or awaiting a name, when given), sometimes any
        id at all."""
        held = sorted(
            r
            for r, ref in self.held.items()
            if (state is None or ref.state == state) and (not awaiting or ref.awaiting)
        )
        if held and data.draw(st.integers(0, 7), label="aim") > 0:
            return data.draw(st.sampled_from(held), label="rid")
        return data.draw(st.sampled_from(REQUESTS), label="rid")

    def finish_a_request(self, data: st.DataObject) -> None:
        rid = self.some_request(data, "pending")
        savers = data.draw(st.sets(st.sampled_from(NAMES)), label="savers")
        self.request_finished(rid, savers)

    def request_finished(self, rid: str, savers: set[str]) -> None:
        for name, connector in self.connectors.items():
            if connector is not None:
                connector.saves = name in savers
        outcome, _ = self.mc.request_finished(rid, [1])
        ref = self.held.get(rid)
        if ref is None:
            assert outcome is Outcome.unknown_request
        elif ref.state != "pending":
            assert outcome is (Outcome.duplicate if ref.state == "finishing" else Outcome.terminal)
        else:
            assert outcome is Outcome.applied
            ready = [n for n, c in self.connectors.items() if c is not None and n in savers]
            ref.awaiting, ref.expected = list(ready), list(ready)
            if ready:
                ref.state = "finishing"
            else:
                self.finish(rid, "finished")

    def transfer_finished(self, rid: str, name: str) -> None:
        expected = self.expect_report(rid, name)
        assert self.mc.transfer_finished(rid, name, [1]) is expected

    def report(self, data: st.DataObject) -> None:
        """Most interesting reports concern a request that awaits something: aim for them."""
        rid = self.some_request(data, awaiting=True)  # finishing, or cancelled and draining
        ref = self.held.get(rid)
        if ref is not None and ref.expected and data.draw(st.integers(0, 2), label="aim name"):
            name = data.draw(st.sampled_from(ref.expected), label="name")
        else:
            name = data.draw(st.sampled_from(REPORTERS), label="name")
        self.transfer_finished(rid, name)

    def cancel(self, data: st.DataObject) -> None:
        rid = self.some_request(data)
        ref = self.held.get(rid)
        outcome = self.mc.cancel(rid)
        if ref is None:
            assert outcome is Outcome.unknown_request
        elif ref.state in ("finished", "cancelled"):
            assert outcome is Outcome.terminal
        else:
            assert outcome is Outcome.applied
            ref.state = "cancelled"
            if not ref.awaiting:  # else it drains first
                self.done.append(rid)

    def register(self, name: str, ready: bool) -> None:
        if name in self.connectors:
            return
        connector = Scripted() if ready else None
        self.mc.register(name, connector)
        self.connectors[name] = connector

    def unregister(self, name: str) -> None:
        self.mc.unregister(name)
        del self.connectors[name]
        for rid, ref in self.held.items():
            if ref.state in ("finishing", "cancelled") and name in ref.awaiting:
                ref.awaiting.remove(name)
                ref.abandoned.append(name)
                if not ref.awaiting:
                    if ref.state == "cancelled":
                        self.done.append(rid)
                    else:
                        self.finish(rid, "finished")

    def take(self) -> None:
        taken = self.mc.take()
        assert [r.request_id for r in taken] == self.done
        for record in taken:
            ref = self.held.pop(record.request_id)
            assert record.state == ref.state
            check_complete(record)
        self.done = []

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def matches_the_model(self) -> None:
        assert sorted(self.mc.request_ids()) == sorted(self.held)
        for rid, ref in self.held.items():
            record = self.mc.get(rid)
            assert record is not None
            assert record.state == ref.state
            assert list(record.awaiting) == ref.awaiting
            assert list(record.expected) == ref.expected
            assert list(record.abandoned) == ref.abandoned

    @invariant()
    def terminal_states_are_absorbing(self) -> None:
        for rid in self.held:
            record = self.mc.get(rid)
            assert record is not None
            history = record.history or []
            # Nothing leaves a terminal state; a cancelled one only drains (and stays).
            assert all(
                s.source not in (State.finished, State.cancelled) or s.dest is s.source
                for s in history
            )

    @invariant()
    def nothing_left_once_everything_was_taken(self) -> None:
        if not self.held:
            assert len(self.mc) == 0 and self.mc.take() == []


def check_complete(record: RequestTransferState) -> None:
    """handed back ⇒ nothing awaited: every awaited name reported (or was unregistered)."""
    assert record.awaiting == ()
    if record.state is State.finished:
        assert set(record.expected) == set(record.reported) | set(record.abandoned)


AggregatorMachine.TestCase.settings = settings(
    settings(), stateful_step_count=50, max_examples=settings().max_examples
)
# 100 programs of up to 50 steps: a few seconds, more than the default time limit on a busy host.
TestAggregator = pytest.mark.timeout(120)(AggregatorMachine.TestCase)


def test_reference_model_can_fail() -> None:
    """The model comparison catches a wrong outcome: a duplicate reported as applied."""
    machine = AggregatorMachine()
    machine.mc.begin("r0")
    machine.held["r0"] = Ref()
    machine.request_finished("r0", {"a", "b"})
    machine.transfer_finished("r0", "a")
    machine.held["r0"].awaiting.append("a")  # the model now (wrongly) still awaits "a"
    with pytest.raises(AssertionError):
        machine.matches_the_model()
